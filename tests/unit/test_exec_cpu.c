/* The CPU backend (daemon/exec/exec_cpu.c) driven directly, with ops of the test's own and a
 * blob reader that reads nothing: which jobs its crash guard blames for a crash, and how it
 * reports a batch the watchdog gave up on before it started, and what a cancel does to a job
 * run, running or not reached, and to a batch not started, and how a job that does not stop
 * at its time limit gives its worker's place back, and what its bound on working memory lets in.
 * No timing: a job that must stay
 * running blocks on a pipe until the test releases it. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/exec/executor.h"
#include "daemon/util/crash_guard.h"

/* ------------------------------------------------------------------ the test's ops */

static const op_call_t *crash_call; /* the call whose run crashes the process */
static int started_fd[2];           /* a blocking run writes a byte here when it starts... */
static int release_fd[2];           /* ...and returns once it reads one from here */

static int run_maybe_crash(const op_call_t *call, const void *const *in, void *const *out,
                           op_error_t *err)
{
    (void)in, (void)out, (void)err;
    if (call == crash_call) {
        volatile char *volatile nowhere = NULL;
        *nowhere = 1; /* a real invalid write, as an op that overruns its memory makes */
    }
    return 0;
}

static int run_block(const op_call_t *call, const void *const *in, void *const *out,
                     op_error_t *err)
{
    (void)call, (void)in, (void)out, (void)err;
    char c = 1;
    ck_assert_int_eq(write(started_fd[1], &c, 1), 1);
    ck_assert_int_eq(read(release_fd[0], &c, 1), 1);
    return 0;
}

/* Runs until its caller cancels it, as a long op checks between chunks of its work. */
static int run_until_cancelled(const op_call_t *call, const void *const *in, void *const *out,
                               op_error_t *err)
{
    (void)in, (void)out;
    char c = 1;
    ck_assert_int_eq(write(started_fd[1], &c, 1), 1);
    while (!op_call_cancelled(call))
        usleep(1000);
    return op_error_cancelled(err);
}

static const op_def_t crash_op = {.name = "test_maybe_crash", .run_cpu = run_maybe_crash};
static const op_def_t until_cancelled_op = {.name = "test_until_cancelled",
                                            .run_cpu = run_until_cancelled};
static const op_def_t block_op = {.name = "test_block", .run_cpu = run_block};

/* ---------------------------------------------------- a blob reader that reads nothing */

static int rd_open(void *ctx, void **ret_rd)
{
    (void)ctx;
    *ret_rd = &started_fd; /* any non-NULL reader: the test's jobs have no stored input */
    return 0;
}

static void rd_close(void *rd)
{
    (void)rd;
}

static const exec_blob_reader_t no_blobs = {.open = rd_open, .close = rd_close};

/* ------------------------------------------------------------------ batches and reports */

static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static exec_batch_t *reported[8];
static int n_reported;

static void on_done(exec_batch_t *batch, void *ud)
{
    (void)ud;
    pthread_mutex_lock(&done_lock);
    reported[n_reported++] = batch;
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&done_lock);
}

/* Waits until n batches were reported in all. */
static void wait_reported(int n)
{
    pthread_mutex_lock(&done_lock);
    while (n_reported < n)
        pthread_cond_wait(&done_cond, &done_lock);
    pthread_mutex_unlock(&done_lock);
}

static executor_t *cpu_new(int threads)
{
    config_t cfg;
    config_defaults(&cfg);
    cfg.cpu_threads = threads;
    executor_t *ex = NULL;
    ck_assert_int_eq(exec_cpu_new(&cfg, &no_blobs, &ex), 0);
    ex->done = on_done;
    return ex;
}

/* A batch of n new jobs of op, with ids of their own. */
static exec_batch_t *batch_new(const op_def_t *op, int n)
{
    exec_batch_t *b = calloc(1, sizeof *b);
    b->jobs = calloc((size_t)n, sizeof *b->jobs);
    b->n = n;
    for (int i = 0; i < n; i++) {
        b->jobs[i] = job_new();
        b->jobs[i]->call.op = op;
        id_new('j', b->jobs[i]->id);
    }
    return b;
}

static void batch_free(exec_batch_t *b)
{
    for (int i = 0; i < b->n; i++)
        job_free(b->jobs[i]);
    free(b->jobs);
    free(b);
}

/* ------------------------------------------------------------------------- tests */

START_TEST(test_a_crash_blames_only_the_job_that_ran_not_its_batch)
{
#ifdef GPUJOB_SANITIZE
    fprintf(stderr, "skipped: under ASan+UBSan the sanitizers, not a fatal signal, end the "
                    "process that crashes, so there is nothing for the crash guard to see\n");
    return;
#endif
    char dir[] = "/tmp/gj-exec-cpu-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    exec_batch_t *b = batch_new(&crash_op, 4);
    crash_call = &b->jobs[2]->call;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* The child runs the batch: its third job takes the process down. */
        if (crash_guard_install(dir) < 0) _exit(2);
        executor_t *ex = cpu_new(1);
        if (ex->ops->submit(ex, b) < 0) _exit(3);
        for (;;)
            pause();
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
                  "the child did not die of its crash (status %d)", status);

    /* Only the job that crashed is listed: the two before it finished, the one after it
     * never ran, and all three run again after a restart. */
    ck_assert_int_eq(crash_guard_install(dir), 0);
    crash_guard_victim_t *v = NULL;
    size_t n = 0;
    ck_assert_int_eq(crash_guard_take(&v, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(v[0].id, b->jobs[2]->id);
    ck_assert_int_eq(v[0].signo, SIGSEGV);
    free(v);
    ck_assert_int_eq(crash_guard_clear(), 0);
    batch_free(b);
}
END_TEST

START_TEST(test_an_abandoned_batch_that_never_started_fails_with_the_watchdog_error)
{
    ck_assert_int_eq(pipe(started_fd), 0);
    ck_assert_int_eq(pipe(release_fd), 0);
    executor_t *ex = cpu_new(1);
    /* The only worker is stuck in the first batch; the second waits in the executor. */
    exec_batch_t *stuck = batch_new(&block_op, 1);
    ck_assert_int_eq(ex->ops->submit(ex, stuck), 0);
    char c;
    ck_assert_int_eq(read(started_fd[0], &c, 1), 1);
    exec_batch_t *waiting = batch_new(&block_op, 2);
    ck_assert_int_eq(ex->ops->submit(ex, waiting), 0);

    /* Given up on, the waiting batch is reported at once, never run, each job failed. */
    ex->ops->abandon(ex, waiting);
    wait_reported(1);
    ck_assert_ptr_eq(reported[0], waiting);
    for (int i = 0; i < waiting->n; i++) {
        ck_assert_str_eq(waiting->jobs[i]->error_code, "watchdog_timeout");
        ck_assert_int_gt(strlen(waiting->jobs[i]->error_message), 0);
    }

    /* The stuck batch, released, ends as it ran. */
    c = 1;
    ck_assert_int_eq(write(release_fd[1], &c, 1), 1);
    wait_reported(2);
    ck_assert_ptr_eq(reported[1], stuck);
    ck_assert_str_eq(stuck->jobs[0]->error_code, "");
    ex->ops->destroy(ex, 10000);
    batch_free(waiting);
    batch_free(stuck);
}
END_TEST

/* A batch of four runs its jobs in turn. With the second running, a cancel of the first (run
 * already) is dropped, of the third (not reached) dequeued, of the second stopped: its op sees
 * the flag and returns, the third is skipped, and the fourth, not cancelled, runs and keeps its
 * result. The worker then reports the batch and is free: a next batch runs on it. */
START_TEST(test_a_cancelled_running_job_stops_and_its_batch_mates_keep_their_results)
{
    ck_assert_int_eq(pipe(started_fd), 0);
    executor_t *ex = cpu_new(1);
    exec_batch_t *b = batch_new(&crash_op, 4);
    b->jobs[1]->call.op = &until_cancelled_op;
    ck_assert_int_eq(ex->ops->submit(ex, b), 0);
    char c;
    ck_assert_int_eq(read(started_fd[0], &c, 1), 1);

    ck_assert_int_eq(ex->ops->cancel(ex, b, b->jobs[0]), EXEC_CANCEL_DROPPED);
    ck_assert_int_eq(ex->ops->cancel(ex, b, b->jobs[2]), EXEC_CANCEL_DEQUEUED);
    ck_assert_int_eq(ex->ops->cancel(ex, b, b->jobs[1]), EXEC_CANCEL_STOPPED);
    wait_reported(1);
    ck_assert_ptr_eq(reported[0], b);
    ck_assert_str_eq(b->jobs[0]->error_code, "");
    ck_assert_str_eq(b->jobs[1]->error_code, "cancelled");
    ck_assert_str_eq(b->jobs[2]->error_code, "cancelled");
    ck_assert_str_eq(b->jobs[3]->error_code, "");

    exec_batch_t *next = batch_new(&crash_op, 1);
    ck_assert_int_eq(ex->ops->submit(ex, next), 0);
    wait_reported(2);
    ck_assert_ptr_eq(reported[1], next);
    ck_assert_str_eq(next->jobs[0]->error_code, "");
    ex->ops->destroy(ex, 10000);
    batch_free(next);
    batch_free(b);
}
END_TEST

/* A batch waiting in the executor behind a busy worker keeps its place while any of its jobs
 * is left; once all are cancelled it is reported at once, never run. */
START_TEST(test_a_waiting_batch_whose_jobs_are_all_cancelled_is_reported_at_once)
{
    ck_assert_int_eq(pipe(started_fd), 0);
    ck_assert_int_eq(pipe(release_fd), 0);
    executor_t *ex = cpu_new(1);
    exec_batch_t *busy = batch_new(&block_op, 1);
    ck_assert_int_eq(ex->ops->submit(ex, busy), 0);
    char c;
    ck_assert_int_eq(read(started_fd[0], &c, 1), 1);
    exec_batch_t *waiting = batch_new(&block_op, 2);
    ck_assert_int_eq(ex->ops->submit(ex, waiting), 0);

    ck_assert_int_eq(ex->ops->cancel(ex, waiting, waiting->jobs[0]), EXEC_CANCEL_DEQUEUED);
    pthread_mutex_lock(&done_lock);
    ck_assert_int_eq(n_reported, 0);
    pthread_mutex_unlock(&done_lock);
    ck_assert_int_eq(ex->ops->cancel(ex, waiting, waiting->jobs[1]), EXEC_CANCEL_DEQUEUED);
    wait_reported(1);
    ck_assert_ptr_eq(reported[0], waiting);
    for (int i = 0; i < waiting->n; i++)
        ck_assert_str_eq(waiting->jobs[i]->error_code, "cancelled");

    c = 1;
    ck_assert_int_eq(write(release_fd[1], &c, 1), 1);
    wait_reported(2);
    ck_assert_ptr_eq(reported[1], busy);
    ck_assert_str_eq(busy->jobs[0]->error_code, "");
    ex->ops->destroy(ex, 10000);
    batch_free(waiting);
    batch_free(busy);
}
END_TEST

/* A job stopped at its time limit whose op never looks at its flag (it blocks) keeps its worker:
 * stop_overdue then gets the worker's place back, a replacement runs the next batch while the
 * job is still stuck, and the stuck worker, once the job returns, runs the rest of its batch
 * and reports it. A job that did stop is left alone. */
START_TEST(test_a_job_that_does_not_stop_at_its_limit_loses_its_worker_to_a_replacement)
{
    ck_assert_int_eq(pipe(started_fd), 0);
    ck_assert_int_eq(pipe(release_fd), 0);
    executor_t *ex = cpu_new(1);
    exec_batch_t *b = batch_new(&block_op, 2);
    b->jobs[1]->call.op = &crash_op;
    ck_assert_int_eq(ex->ops->submit(ex, b), 0);
    char c;
    ck_assert_int_eq(read(started_fd[0], &c, 1), 1);
    ck_assert_int_gt(exec_job_run_started(b->jobs[0]), 0);
    ck_assert_int_eq(exec_job_run_started(b->jobs[1]), 0);
    ck_assert_int_eq(ex->ops->free_slots(ex, -1), 0);

    ck_assert_int_eq(ex->ops->cancel(ex, b, b->jobs[0]), EXEC_CANCEL_STOPPED);
    ck_assert(ex->ops->stop_overdue(ex, b, b->jobs[0]));
    ck_assert_int_eq(ex->ops->free_slots(ex, -1), 1);
    exec_batch_t *next = batch_new(&crash_op, 1);
    ck_assert_int_eq(ex->ops->submit(ex, next), 0);
    wait_reported(1);
    ck_assert_ptr_eq(reported[0], next);
    ck_assert_str_eq(next->jobs[0]->error_code, "");

    c = 1;
    ck_assert_int_eq(write(release_fd[1], &c, 1), 1);
    wait_reported(2);
    ck_assert_ptr_eq(reported[1], b);
    ck_assert_str_eq(b->jobs[1]->error_code, "");
    ck_assert_int_gt(exec_job_run_ended(b->jobs[1]), 0);

    /* A job that stops at its flag keeps its worker's place. */
    exec_batch_t *stops = batch_new(&until_cancelled_op, 1);
    ck_assert_int_eq(ex->ops->submit(ex, stops), 0);
    ck_assert_int_eq(read(started_fd[0], &c, 1), 1);
    ck_assert_int_eq(ex->ops->cancel(ex, stops, stops->jobs[0]), EXEC_CANCEL_STOPPED);
    wait_reported(3);
    ck_assert(!ex->ops->stop_overdue(ex, stops, stops->jobs[0]));
    ex->ops->destroy(ex, 10000);
    batch_free(stops);
    batch_free(next);
    batch_free(b);
}
END_TEST

/* A CPU backend with a working-memory bound of cap bytes. */
static executor_t *cpu_new_capped(int threads, uint64_t cap)
{
    config_t cfg;
    config_defaults(&cfg);
    cfg.cpu_threads = threads;
    cfg.cpu_memory_cap = cap;
    executor_t *ex = NULL;
    ck_assert_int_eq(exec_cpu_new(&cfg, &no_blobs, &ex), 0);
    ex->done = on_done;
    return ex;
}

static const op_def_t sized_op = {.name = "test_sized", .n_inputs = 1, .run_cpu = run_maybe_crash};

/* A batch of n jobs of sized_op, each with an input of 100 f32 in memory: 512 bytes each once
 * aligned. */
static exec_batch_t *sized_batch_new(int n)
{
    exec_batch_t *b = batch_new(&sized_op, n);
    for (int i = 0; i < n; i++) {
        job_t *job = b->jobs[i];
        job->call.has_in[0] = true;
        job->call.in[0] = (tensor_desc_t){.dtype = DTYPE_F32, .ndim = 1, .shape = {100}};
        job->in[0].nbytes = 400;
        job->in[0].data = calloc(100, sizeof(float));
    }
    return b;
}

/* With 1 KiB of working memory: two jobs of 512 bytes fit, a third waits until one of them is
 * given back (unfit) or reported, a batch of three never fits (and fails if handed over all the
 * same), and a bound of 0 lets anything in. */
START_TEST(test_working_memory_lets_in_what_fits_and_gives_it_back_at_the_report)
{
    executor_t *ex = cpu_new_capped(1, 1024);
    uint64_t largest = 0;
    const char *key = NULL;
    ck_assert_uint_eq(ex->ops->memory_pool(ex, &largest, &key), 1024);
    ck_assert_uint_eq(largest, 1024);
    ck_assert_str_eq(key, "scheduler.cpu_memory_cap");
    exec_batch_t *a = sized_batch_new(1), *b = sized_batch_new(1), *c = sized_batch_new(1);
    ck_assert_uint_eq(exec_batch_device_bytes(a), 512);
    ck_assert_int_eq(ex->ops->fit(ex, a), 0);
    ck_assert(a->held && a->held_bytes == 512);
    ck_assert_int_eq(ex->ops->fit(ex, b), 0);
    ck_assert_int_eq(ex->ops->fit(ex, c), -ENOSPC);
    ex->ops->unfit(ex, b);
    ck_assert(!b->held);
    ck_assert_int_eq(ex->ops->fit(ex, c), 0);
    ck_assert_int_eq(ex->ops->fit(ex, b), -ENOSPC);
    /* a runs and is reported: its memory comes back. */
    ck_assert_int_eq(ex->ops->submit(ex, a), 0);
    wait_reported(1);
    ck_assert_str_eq(a->jobs[0]->error_code, "");
    ck_assert_int_eq(ex->ops->fit(ex, b), 0);
    ex->ops->unfit(ex, b);
    ex->ops->unfit(ex, c);

    exec_batch_t *three = sized_batch_new(3);
    ck_assert_int_eq(ex->ops->fit(ex, three), -E2BIG);
    ck_assert_int_eq(ex->ops->submit(ex, three), 0);
    wait_reported(2);
    ck_assert_ptr_eq(reported[1], three);
    for (int i = 0; i < 3; i++)
        ck_assert_str_eq(three->jobs[i]->error_code, "exceeds_device_memory");
    ex->ops->destroy(ex, 10000);

    ex = cpu_new_capped(1, 0);
    ck_assert_uint_eq(ex->ops->memory_pool(ex, &largest, &key), 0);
    exec_batch_t *any = sized_batch_new(3);
    ck_assert_int_eq(ex->ops->fit(ex, any), 0);
    ck_assert(!any->held);
    ex->ops->destroy(ex, 10000);
    batch_free(any);
    batch_free(three);
    batch_free(a);
    batch_free(b);
    batch_free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("exec_cpu");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_a_crash_blames_only_the_job_that_ran_not_its_batch);
    tcase_add_test(tc, test_an_abandoned_batch_that_never_started_fails_with_the_watchdog_error);
    tcase_add_test(tc, test_a_cancelled_running_job_stops_and_its_batch_mates_keep_their_results);
    tcase_add_test(tc, test_a_waiting_batch_whose_jobs_are_all_cancelled_is_reported_at_once);
    tcase_add_test(tc,
                   test_a_job_that_does_not_stop_at_its_limit_loses_its_worker_to_a_replacement);
    tcase_add_test(tc, test_working_memory_lets_in_what_fits_and_gives_it_back_at_the_report);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
