/* The scheduler (daemon/sched/scheduler.h) against a real store and a fake executor that the test
 * drives by hand: a job's calls: cancel (queued or running), what other users see, deadlines,
 * waits that time out, idempotent resubmission, submissions after the stop, the per-user
 * limits on queued jobs and resident buffers, the charge of a job cancelled while it runs and
 * the GPU-time budget that charge spends. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"
#include "support/run_suite.h"
#include "support/sched_test.h"

START_TEST(test_cancel_queued_job_never_runs)
{
    sched_test_fake->slots = 0;
    job_t *job = sched_test_add_job("alice", 10, 0);
    sched_test_box_t box;
    sched_test_submit(&box, &job, 1);
    sched_test_box_t c;
    sched_test_box_init(&c);
    sched_cancel(sched_test_sched, "alice", box.ids[0], sched_test_on_reply, &c);
    sched_test_box_wait(&c);
    ck_assert_int_eq(c.err, 0);
    ck_assert_int_eq(c.states[0], JOB_CANCELLED);
    ck_assert_str_eq(c.cancel, "dequeued");
    sched_test_fake->slots = 4;
    job_t *other = sched_test_add_job("alice", 10, 0);
    sched_test_box_t b2;
    sched_test_submit(&b2, &other, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    for (int i = 0; i < sched_test_fake->n_got; i++)
        for (int k = 0; k < sched_test_fake->got[i]->n; k++)
            ck_assert_str_ne(sched_test_fake->got[i]->jobs[k]->id, box.ids[0]);
    ck_assert_int_eq(sched_test_stored_state(box.ids[0]), JOB_CANCELLED);

    /* A second cancel finds the job final. */
    sched_test_box_init(&c);
    sched_cancel(sched_test_sched, "alice", box.ids[0], sched_test_on_reply, &c);
    sched_test_box_wait(&c);
    ck_assert_int_eq(c.err, -EBUSY);
}
END_TEST

/* The cancel of a running job is durable and answered at once, with what the executor's hook
 * says it did; the hook gets the job and the batch that holds it; the batch's late result is
 * dropped for that job and kept for its batch-mate. */
START_TEST(test_cancel_running_job_asks_the_executor_and_keeps_its_batch_mates)
{
    sched_test_fake->slots = 1;
    job_t *jobs[2] = {sched_test_add_job("alice", 10, 0), sched_test_add_job("alice", 10, 0)};
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 2);
    ck_assert_int_eq(fake_exec_wait_jobs(sched_test_fake, 2), 2);
    ck_assert_int_eq(sched_test_fake->n_got, 1);
    sched_test_box_t c;
    sched_test_box_init(&c);
    sched_cancel(sched_test_sched, "alice", box.ids[1], sched_test_on_reply, &c);
    sched_test_box_wait(&c);
    ck_assert_int_eq(c.err, 0);
    ck_assert_int_eq(c.states[0], JOB_CANCELLED);
    ck_assert_str_eq(c.cancel, "stopped");
    ck_assert_int_eq(sched_test_stored_state(box.ids[1]), JOB_CANCELLED);
    pthread_mutex_lock(&sched_test_fake->lock);
    ck_assert_ptr_eq(sched_test_fake->cancel_batch, sched_test_fake->got[0]);
    ck_assert_str_eq(sched_test_fake->cancel_job->id, box.ids[1]);
    pthread_mutex_unlock(&sched_test_fake->lock);

    fake_exec_complete(sched_test_fake, 0);
    sched_test_box_t w;
    sched_test_box_init(&w);
    sched_wait(sched_test_sched, "alice", box.ids[0], 10000, sched_test_on_reply, &w);
    sched_test_box_wait(&w);
    ck_assert_int_eq(w.states[0], JOB_SUCCEEDED);
    ck_assert_int_eq(sched_test_stored_state(box.ids[0]), JOB_SUCCEEDED);
    ck_assert_int_eq(sched_test_stored_state(box.ids[1]), JOB_CANCELLED);
}
END_TEST

/* The device time stored for job id (its record's gpu_ns), and owner's in the usage rollup. */
static int64_t stored_gpu_ns(const char *id)
{
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(rd, id, &job), 0);
    int64_t ns = job->gpu_ns;
    job_free(job);
    store_reader_close(rd);
    return ns;
}

static int64_t rollup_gpu_ns(const char *owner)
{
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    store_usage_query_t q = {.owner = owner, .since_day = 0, .until_day = 1000000, .max_rows = 100};
    store_usage_row_t *rows = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_usage_rollup(rd, &q, &rows, &n), 0);
    int64_t ns = 0;
    for (size_t i = 0; i < n; i++)
        ns += rows[i].gpu_ns;
    free(rows);
    store_reader_close(rd);
    return ns;
}

/* Submits a lone job of alice and cancels it after it has run 50 ms: its submission in box,
 * the cancel's reply in c. */
static void cancel_after_50_ms(sched_test_box_t *box, sched_test_box_t *c)
{
    job_t *job = sched_test_lone_job("alice", 10);
    sched_test_submit(box, &job, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    usleep(50 * 1000);
    sched_test_box_init(c);
    sched_cancel(sched_test_sched, "alice", box->ids[0], sched_test_on_reply, c);
    sched_test_box_wait(c);
}

/* A job cancelled after running 50 ms is charged at least that in its record and the rollup at
 * once; when its launch returns, 50 ms later, it is charged what the launch measured, in both.
 * That spends alice's budget of 0.00001 GPU-hours (36 ms) a day: her next submission is
 * refused naming the key, until the next UTC midnight; bob's is not. */
START_TEST(test_a_job_cancelled_while_running_is_charged_and_spends_its_users_budget)
{
    char err[256];
    ck_assert_int_eq(
        config_set(&sched_test_cfg, "user.alice", "gpu_hours_per_day", "0.00001", err, sizeof err),
        0);
    sched_test_policy_apply();
    sched_test_fake->slots = 1;
    sched_test_box_t box, c;
    cancel_after_50_ms(&box, &c);
    ck_assert_int_eq(c.states[0], JOB_CANCELLED);
    int64_t at_cancel = stored_gpu_ns(box.ids[0]);
    ck_assert_int_ge(at_cancel, INT64_C(50000000));
    ck_assert_int_eq(rollup_gpu_ns("alice"), at_cancel);

    usleep(50 * 1000);
    fake_exec_complete(sched_test_fake, 0); /* measures about 100 ms */
    int64_t charged = at_cancel;
    for (int i = 0; i < 500 && charged == at_cancel; i++) {
        usleep(10 * 1000);
        charged = stored_gpu_ns(box.ids[0]);
    }
    ck_assert_int_ge(charged, INT64_C(100000000));
    ck_assert_int_eq(rollup_gpu_ns("alice"), charged);

    job_t *more = sched_test_lone_job("alice", 10);
    sched_test_box_t refused;
    sched_test_submit_any(&refused, &more, 1);
    ck_assert_int_eq(refused.err, -EAGAIN);
    ck_assert_str_eq(refused.limit, "user.alice.gpu_hours_per_day");
    int64_t day_us = INT64_C(86400000000);
    ck_assert_int_eq(refused.reset_at_us, (now_us() / day_us + 1) * day_us);
    job_t *bobs = sched_test_lone_job("bob", 10);
    sched_test_submit(&box, &bobs, 1);
}
END_TEST

/* The store refuses the late charge of a job cancelled while running (its WAL cannot grow when
 * the launch returns): the charge is kept, and the next round of ends writes it, so that the
 * record and the rollup get what fair share and the budgets were charged. */
START_TEST(test_a_late_charge_the_store_refused_is_written_later)
{
    sched_test_fake->slots = 2;
    sched_test_box_t box, c;
    cancel_after_50_ms(&box, &c);
    char id[ID_SIZE];
    snprintf(id, sizeof id, "%s", box.ids[0]);
    int64_t at_cancel = stored_gpu_ns(id);
    ck_assert_int_eq(rollup_gpu_ns("alice"), at_cancel);

    usleep(50 * 1000);
    struct rlimit saved;
    sched_test_wal_limit("gpujobd.db-wal", &saved);
    fake_exec_complete(sched_test_fake, 0); /* measures about 100 ms */
    sched_stats_t stats;
    sched_get_stats(sched_test_sched, &stats);
    for (int i = 0; i < 500 && stats.running > 0; i++) {
        usleep(10 * 1000);
        sched_get_stats(sched_test_sched, &stats);
    }
    ck_assert_int_eq(stats.running, 0);
    /* A message after the batch's end: answered once the loop is done with that end. */
    sched_test_box_t w;
    sched_test_box_init(&w);
    sched_wait(sched_test_sched, "alice", id, 0, sched_test_on_reply, &w);
    sched_test_box_wait(&w);
    sched_test_wal_limit_lift(&saved);
    ck_assert_int_eq(stored_gpu_ns(id), at_cancel);
    ck_assert_int_eq(rollup_gpu_ns("alice"), at_cancel);

    /* The next round of ends (bob's job) writes it. */
    job_t *bobs = sched_test_lone_job("bob", 10);
    sched_test_submit(&box, &bobs, 1);
    fake_exec_wait_batches(sched_test_fake, 2);
    fake_exec_complete(sched_test_fake, 1);
    ck_assert_int_eq(sched_test_waited_state("bob", box.ids[0], 10000), JOB_SUCCEEDED);
    int64_t charged = stored_gpu_ns(id);
    ck_assert_int_ge(charged, INT64_C(100000000));
    ck_assert_int_eq(rollup_gpu_ns("alice"), charged);
}
END_TEST

/* A user's share of device memory, as the API's door and the loop both take it: percent of the
 * pool rounded down, without overflow on the largest pool, none for 0 %. */
START_TEST(test_a_users_memory_share_is_exact_for_any_pool)
{
    ck_assert_uint_eq(sched_memory_share(UINT64_MAX, 100), UINT64_MAX);
    ck_assert_uint_eq(sched_memory_share(UINT64_MAX, 50), UINT64_MAX / 2);
    ck_assert_uint_eq(sched_memory_share(199, 50), 99);
    ck_assert_uint_eq(sched_memory_share(80ULL << 30, 25), 20ULL << 30);
    ck_assert_uint_eq(sched_memory_share(80ULL << 30, 0), 0);
    ck_assert_uint_eq(sched_memory_share(0, 50), 0);
}
END_TEST

START_TEST(test_other_users_cannot_see_or_cancel_a_job)
{
    sched_test_fake->slots = 0;
    job_t *job = sched_test_add_job("alice", 10, 0);
    sched_test_box_t box;
    sched_test_submit(&box, &job, 1);
    sched_test_box_t c;
    sched_test_box_init(&c);
    sched_cancel(sched_test_sched, "mallory", box.ids[0], sched_test_on_reply, &c);
    sched_test_box_wait(&c);
    ck_assert_int_eq(c.err, -ENOENT);
    sched_test_box_init(&c);
    sched_wait(sched_test_sched, "mallory", box.ids[0], 0, sched_test_on_reply, &c);
    sched_test_box_wait(&c);
    ck_assert_int_eq(c.err, -ENOENT);
    ck_assert_int_eq(sched_test_stored_state(box.ids[0]), JOB_QUEUED);
}
END_TEST

START_TEST(test_deadline_fails_a_job_left_queued)
{
    sched_test_fake->slots = 0;
    job_t *job = sched_test_add_job("alice", 10, 0);
    job->deadline_us = now_us() + 50 * 1000;
    sched_test_box_t box;
    sched_test_submit(&box, &job, 1);
    ck_assert_int_eq(sched_test_ended_state("alice", box.ids[0]), JOB_FAILED);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, box.ids[0], &stored), 0);
    ck_assert_str_eq(stored->error_code, "deadline_exceeded");
    job_free(stored);
    store_reader_close(rd);
}
END_TEST

START_TEST(test_wait_times_out_with_the_current_state)
{
    sched_test_fake->slots = 0;
    job_t *job = sched_test_add_job("alice", 10, 0);
    sched_test_box_t box;
    sched_test_submit(&box, &job, 1);
    sched_test_box_t w;
    sched_test_box_init(&w);
    int64_t t0 = now_us();
    sched_wait(sched_test_sched, "alice", box.ids[0], 100, sched_test_on_reply, &w);
    sched_test_box_wait(&w);
    ck_assert_int_ge(now_us() - t0, 90 * 1000);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_eq(w.states[0], JOB_QUEUED);
}
END_TEST

START_TEST(test_idempotent_resubmission_returns_the_first_job)
{
    sched_test_fake->slots = 0;
    job_t *a = sched_test_add_job("alice", 10, 0);
    strcpy(a->idempotency_key, "key-1");
    sched_test_box_t first;
    sched_test_submit(&first, &a, 1);
    ck_assert(!first.replayed);
    job_t *b = sched_test_add_job("alice", 10, 0);
    strcpy(b->idempotency_key, "key-1");
    sched_test_box_t second;
    sched_test_submit(&second, &b, 1);
    ck_assert(second.replayed);
    ck_assert_str_eq(second.ids[0], first.ids[0]);
    /* The same key from another user is another job. */
    job_t *c = sched_test_add_job("bob", 10, 0);
    strcpy(c->idempotency_key, "key-1");
    sched_test_box_t third;
    sched_test_submit(&third, &c, 1);
    ck_assert(!third.replayed);
    ck_assert_str_ne(third.ids[0], first.ids[0]);
}
END_TEST

START_TEST(test_submissions_after_stop_answer_shutdown)
{
    sched_stop(sched_test_sched);
    job_t *job = sched_test_add_job("alice", 10, 0);
    sched_test_box_t box;
    sched_test_submit_any(&box, &job, 1);
    ck_assert_int_eq(box.err, -ESHUTDOWN);
}
END_TEST

START_TEST(test_queued_limit_counts_submissions_waiting_for_their_commit)
{
    sched_test_fake->slots = 0;
    /* Both submissions arrive within one commit window: the second must see the first. */
    sched_test_box_t a, b;
    sched_test_box_init(&a);
    sched_test_box_init(&b);
    job_t **first = calloc(3, sizeof *first);
    job_t **second = calloc(3, sizeof *second);
    for (int i = 0; i < 3; i++) {
        first[i] = sched_test_add_job("alice", 10, 0);
        /* 192 KiB of small inputs, written to a file of their own as it is submitted. */
        second[i] = sched_test_add_job("alice", 8192, 0);
    }
    sched_submit(sched_test_sched, first, 3, sched_test_on_reply, &a);
    sched_submit(sched_test_sched, second, 3, sched_test_on_reply, &b);
    sched_test_box_wait(&a);
    sched_test_box_wait(&b);
    ck_assert_int_eq(a.err, 0);
    ck_assert_int_eq(b.err, -EAGAIN);
    /* The refused jobs' file goes with them. */
    ck_assert_int_eq(sched_test_blob_files(), 0);
}
END_TEST

/* A buffer of 64 bytes of owner, resident or not. */
static buffer_t *small_buffer(const char *owner, bool resident)
{
    buffer_t *buf = buffer_new();
    snprintf(buf->owner, sizeof buf->owner, "%s", owner);
    buf->desc = (tensor_desc_t){DTYPE_F32, 1, {16}};
    buf->nbytes = 64;
    buf->data = calloc(1, 64);
    buf->resident = resident;
    return buf;
}

START_TEST(test_resident_buffers_of_one_commit_add_up_against_the_quota)
{
    /* Within one commit window (200 ms here) neither upload is stored yet when the other
     * arrives: only the commit can see that together they pass alice's 100 bytes. */
    sched_test_box_t boxes[4];
    buffer_t *bufs[4] = {small_buffer("alice", true), small_buffer("alice", true),
                         small_buffer("alice", false), small_buffer("bob", true)};
    for (int i = 0; i < 4; i++) {
        sched_test_box_init(&boxes[i]);
        sched_buffer_put(sched_test_sched, bufs[i], sched_test_on_reply, &boxes[i]);
    }
    for (int i = 0; i < 4; i++)
        sched_test_box_wait(&boxes[i]);
    ck_assert_int_eq(boxes[0].err, 0);
    ck_assert_int_eq(boxes[1].err, -EDQUOT);
    ck_assert_int_eq(boxes[2].err, 0); /* not resident: not counted */
    ck_assert_int_eq(boxes[3].err, 0); /* bob's own quota */
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    store_usage_t usage;
    ck_assert_int_eq(store_usage_get(rd, "alice", &usage), 0);
    ck_assert_int_eq(usage.resident_bytes, 64);
    ck_assert_int_eq(usage.buffers, 2);
    store_reader_close(rd);
}
END_TEST

static void start_sched_limited(void)
{
    sched_test_setup(false);
    sched_test_cfg.max_queued_per_user = 5;
    sched_test_cfg.max_resident_bytes_per_user = 100;
    sched_test_cfg.commit_delay_us = 200 * 1000;
    sched_test_policy_apply();
    ck_assert_int_eq(sched_start(sched_test_sched), 0);
}

int main(void)
{
    Suite *s = suite_create("sched_jobs");
    TCase *tc = sched_test_tcase("sched", sched_test_start);
    tcase_add_test(tc, test_cancel_queued_job_never_runs);
    tcase_add_test(tc, test_cancel_running_job_asks_the_executor_and_keeps_its_batch_mates);
    tcase_add_test(tc, test_other_users_cannot_see_or_cancel_a_job);
    tcase_add_test(tc, test_a_job_cancelled_while_running_is_charged_and_spends_its_users_budget);
    tcase_add_test(tc, test_a_late_charge_the_store_refused_is_written_later);
    tcase_add_test(tc, test_a_users_memory_share_is_exact_for_any_pool);
    tcase_add_test(tc, test_deadline_fails_a_job_left_queued);
    tcase_add_test(tc, test_wait_times_out_with_the_current_state);
    tcase_add_test(tc, test_idempotent_resubmission_returns_the_first_job);
    tcase_add_test(tc, test_submissions_after_stop_answer_shutdown);
    suite_add_tcase(s, tc);
    TCase *durable = sched_test_tcase("durable", sched_test_start_durable);
    tcase_add_test(durable, test_idempotent_resubmission_returns_the_first_job);
    tcase_add_test(durable, test_submissions_after_stop_answer_shutdown);
    tcase_add_test(durable, test_cancel_queued_job_never_runs);
    suite_add_tcase(s, durable);
    TCase *limited = sched_test_tcase("limits", start_sched_limited);
    tcase_add_test(limited, test_queued_limit_counts_submissions_waiting_for_their_commit);
    tcase_add_test(limited, test_resident_buffers_of_one_commit_add_up_against_the_quota);
    suite_add_tcase(s, limited);
    return run_suite(s);
}
