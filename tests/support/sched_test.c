/* The scheduler suites' shared fixture (sched_test.h). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/sched_test.h"

char sched_test_dir[] = "/tmp/gj-sched-XXXXXX";
config_t sched_test_cfg;
store_t *sched_test_store;
sched_t *sched_test_sched;
fake_exec_t *sched_test_fake;
int sched_test_next_shards = 1;
uint64_t sched_test_next_inline_bytes = 0;

void sched_test_policy_apply(void)
{
    policy_t *p = NULL;
    ck_assert_int_eq(policy_new(&sched_test_cfg, &p), 0);
    sched_set_policy(sched_test_sched, p);
}

void sched_test_setup(bool sync_full)
{
    strcpy(sched_test_dir, "/tmp/gj-sched-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(sched_test_dir));
    config_defaults(&sched_test_cfg);
    snprintf(sched_test_cfg.state_dir, sizeof sched_test_cfg.state_dir, "%s", sched_test_dir);
    sched_test_cfg.sync_full = sync_full;
    sched_test_cfg.shards = sched_test_next_shards;
    if (sched_test_next_inline_bytes)
        sched_test_cfg.inline_blob_bytes = sched_test_next_inline_bytes;
    sched_test_cfg.max_delay_us = 0;
    ck_assert_int_eq(store_open(&sched_test_cfg, &sched_test_store), 0);
    ck_assert_int_eq(sched_new(&sched_test_cfg, sched_test_store, &sched_test_sched), 0);
    sched_test_fake = fake_exec_new();
    sched_set_executor(sched_test_sched, &sched_test_fake->base);
}

void sched_test_teardown(void)
{
    /* Finish whatever is still in the executor, taking no more, so the stop does not wait. */
    sched_test_fake->slots = 0;
    for (int i = sched_test_fake->n_done; i < sched_test_fake->n_got; i++)
        fake_exec_complete(sched_test_fake, i);
    sched_stop(sched_test_sched);
    sched_free(sched_test_sched);
    store_close(sched_test_store);
    free(sched_test_fake);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", sched_test_dir);
    ck_assert_int_eq(system(cmd), 0);
}

void sched_test_on_reply(void *token, const sched_result_t *res)
{
    sched_test_box_t *b = token;
    pthread_mutex_lock(&b->lock);
    b->err = res->err;
    b->n = res->n_jobs;
    b->replayed = res->replayed;
    b->gated = res->end_gate != NULL;
    snprintf(b->cancel, sizeof b->cancel, "%s", res->cancel ? res->cancel : "");
    snprintf(b->limit, sizeof b->limit, "%s", res->limit ? res->limit : "");
    b->reset_at_us = res->reset_at_us;
    pthread_mutex_lock(&sched_test_fake->lock);
    b->batches_started = sched_test_fake->n_got;
    pthread_mutex_unlock(&sched_test_fake->lock);
    for (size_t i = 0; i < res->n_jobs && i < 64; i++) {
        snprintf(b->ids[i], ID_SIZE, "%s", res->jobs[i]->id);
        b->states[i] = res->jobs[i]->state;
        snprintf(b->reasons[i], sizeof b->reasons[i], "%s", res->jobs[i]->waiting_reason);
        b->positions[i] = res->jobs[i]->waiting_position;
    }
    b->done = true;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

void sched_test_box_init(sched_test_box_t *b)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
}

void sched_test_box_wait(sched_test_box_t *b)
{
    pthread_mutex_lock(&b->lock);
    while (!b->done)
        pthread_cond_wait(&b->cond, &b->lock);
    pthread_mutex_unlock(&b->lock);
}

job_t *sched_test_add_job(const char *owner, int n, int priority)
{
    const op_def_t *op = op_find("add");
    ck_assert_ptr_nonnull(op);
    job_t *job = job_new();
    snprintf(job->owner, sizeof job->owner, "%s", owner);
    job->priority = priority;
    job->call.op = op;
    job->params_json = strdup("{}");
    for (int j = 0; j < 2; j++) {
        job_tensor_t *t = &job->in[j];
        snprintf(t->name, sizeof t->name, "%s", op->input_names[j]);
        t->desc = (tensor_desc_t){DTYPE_F32, 1, {n}};
        t->nbytes = tensor_desc_bytes(&t->desc);
        t->data = calloc(1, t->nbytes);
        job->call.in[j] = t->desc;
        job->call.has_in[j] = true;
    }
    op_error_t err;
    ck_assert_int_eq(op->validate(NULL, &job->call, &err), 0);
    return job;
}

int sched_test_blob_files(void)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "find %s/blobs -type f 2>/dev/null | wc -l", sched_test_dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int n = -1;
    ck_assert_int_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

void sched_test_submit_any(sched_test_box_t *box, job_t **jobs, size_t n)
{
    job_t **arr = calloc(n, sizeof *arr);
    memcpy(arr, jobs, n * sizeof *arr);
    sched_test_box_init(box);
    sched_submit(sched_test_sched, arr, n, sched_test_on_reply, box);
    sched_test_box_wait(box);
}

void sched_test_submit(sched_test_box_t *box, job_t **jobs, size_t n)
{
    sched_test_submit_any(box, jobs, n);
    ck_assert_int_eq(box->err, 0);
}

void sched_test_submit_many(sched_test_box_t *box, const char *owner, int n, int size)
{
    job_t **jobs = calloc((size_t)n, sizeof *jobs);
    for (int i = 0; i < n; i++)
        jobs[i] = sched_test_add_job(owner, size, 0);
    sched_test_submit(box, jobs, (size_t)n);
    free(jobs);
}

job_state_t sched_test_waited_state(const char *owner, const char *id, int timeout_ms)
{
    sched_test_box_t w;
    sched_test_box_init(&w);
    sched_wait(sched_test_sched, owner, id, timeout_ms, sched_test_on_reply, &w);
    sched_test_box_wait(&w);
    ck_assert_int_eq(w.err, 0);
    return w.states[0];
}

job_state_t sched_test_ended_state(const char *owner, const char *id)
{
    return sched_test_waited_state(owner, id, 5000);
}

job_state_t sched_test_stored_state(const char *id)
{
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(rd, id, &job), 0);
    job_state_t s = job->state;
    job_free(job);
    store_reader_close(rd);
    return s;
}

job_t *sched_test_lone_job(const char *owner, int n)
{
    job_t *job = sched_test_add_job(owner, n, 0);
    job->call.batch_key[0] = '\0';
    return job;
}

off_t sched_test_wal_limit(const char *name, struct rlimit *saved)
{
    char wal[PATH_MAX];
    snprintf(wal, sizeof wal, "%s/%s", sched_test_dir, name);
    struct stat ws;
    ck_assert_int_eq(stat(wal, &ws), 0);
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, saved), 0);
    struct rlimit lim = {.rlim_cur = (rlim_t)ws.st_size, .rlim_max = saved->rlim_max};
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    return ws.st_size;
}

void sched_test_wal_limit_lift(const struct rlimit *saved)
{
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, saved), 0);
    signal(SIGXFSZ, SIG_DFL);
}

void sched_test_start(void)
{
    sched_test_setup(false);
    ck_assert_int_eq(sched_start(sched_test_sched), 0);
}

void sched_test_start_durable(void)
{
    sched_test_setup(true);
    ck_assert_int_eq(sched_start(sched_test_sched), 0);
}

TCase *sched_test_tcase(const char *name, void (*setup)(void))
{
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, setup, sched_test_teardown);
    tcase_set_timeout(tc, 30);
    return tc;
}
