/* The scheduler against a real store and a fake executor that the test drives by hand: which
 * batches it is handed, in which order, and how jobs end. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/util/config.h"
#include "daemon/util/id.h"
#include "daemon/sched/sched_internal.h" /* QUEUED_IN_MEMORY */
#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"

/* ------------------------------------------------------------------ fake executor */

typedef struct fake_exec {
    executor_t base;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* Set by the test while the loop reads them. */
    atomic_int slots;        /* batches it accepts before the test completes some */
    atomic_int turn_down;    /* submits to answer -EAGAIN although slots are free */
    atomic_int device0_free; /* free slots device 0 reports to pinned jobs; -1: as any */
    exec_batch_t *got[4096]; /* every batch handed over, in order */
    int n_got, n_done;
    exec_batch_t *abandoned; /* the last batch the watchdog gave up on */
    int n_abandoned;
    exec_batch_t *cancel_batch; /* the last cancel's batch and job */
    job_t *cancel_job;
} fake_exec_t;

static int fake_submit(executor_t *base, exec_batch_t *b)
{
    fake_exec_t *f = (fake_exec_t *)base;
    pthread_mutex_lock(&f->lock);
    int r = -EAGAIN;
    if (f->turn_down > 0)
        f->turn_down--;
    else if (f->n_got - f->n_done < f->slots) {
        exec_batch_started(b, mono_us()); /* the fake runs a batch as soon as it takes it */
        f->got[f->n_got++] = b;
        pthread_cond_broadcast(&f->cond);
        r = 0;
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

static int fake_free_slots(executor_t *base, int device)
{
    fake_exec_t *f = (fake_exec_t *)base;
    pthread_mutex_lock(&f->lock);
    int n = f->slots - (f->n_got - f->n_done);
    if (device == 0 && f->device0_free >= 0 && f->device0_free < n) n = f->device0_free;
    pthread_mutex_unlock(&f->lock);
    return n > 0 ? n : 0;
}

static json_t *fake_describe(executor_t *base)
{
    return json_pack("{s:s}", "name", "fake");
}

static void fake_destroy(executor_t *base, int timeout_ms) {}

/* Remembers the batch the watchdog gave up on; like a stuck worker, it reports the batch only
 * when the test completes it. */
static void fake_abandon(executor_t *base, exec_batch_t *b)
{
    fake_exec_t *f = (fake_exec_t *)base;
    pthread_mutex_lock(&f->lock);
    f->abandoned = b;
    f->n_abandoned++;
    pthread_mutex_unlock(&f->lock);
}

/* Remembers the cancel's batch and job, and says it stopped the job (it reports the batch only
 * when the test completes it). */
static exec_cancel_t fake_cancel(executor_t *base, exec_batch_t *b, job_t *job)
{
    fake_exec_t *f = (fake_exec_t *)base;
    pthread_mutex_lock(&f->lock);
    f->cancel_batch = b;
    f->cancel_job = job;
    pthread_mutex_unlock(&f->lock);
    return EXEC_CANCEL_STOPPED;
}

static const executor_ops_t fake_ops = {
    .name = "fake",
    .submit = fake_submit,
    .free_slots = fake_free_slots,
    .describe = fake_describe,
    .destroy = fake_destroy,
    .abandon = fake_abandon,
    .cancel = fake_cancel,
};

/* Waits until the executor holds at least n batches in total. */
static void fake_wait_batches(fake_exec_t *f, int n)
{
    pthread_mutex_lock(&f->lock);
    for (int i = 0; f->n_got < n && i < 500; i++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&f->cond, &f->lock, &ts);
    }
    pthread_mutex_unlock(&f->lock);
}

/* Waits until the batches handed over hold at least n jobs in total; returns that total. */
static int fake_wait_jobs(fake_exec_t *f, int n)
{
    int total = 0;
    for (int tries = 0; tries < 500; tries++) {
        pthread_mutex_lock(&f->lock);
        total = 0;
        for (int i = 0; i < f->n_got; i++)
            total += f->got[i]->n;
        int seen = f->n_got;
        pthread_mutex_unlock(&f->lock);
        if (total >= n) break;
        fake_wait_batches(f, seen + 1);
    }
    return total;
}

/* Completes batch i: every job succeeds with zero-filled outputs. */
static void fake_complete(fake_exec_t *f, int i)
{
    exec_batch_t *b = f->got[i];
    for (int k = 0; k < b->n; k++) {
        job_t *job = b->jobs[k];
        for (int j = 0; j < job->call.n_out; j++) {
            job_tensor_t *t = &job->out[j];
            snprintf(t->name, sizeof t->name, "%s", job->call.out_names[j]);
            t->desc = job->call.out[j];
            t->nbytes = tensor_desc_bytes(&t->desc);
            t->data = calloc(1, t->nbytes ? t->nbytes : 1);
        }
        job->batch_size = b->n;
    }
    pthread_mutex_lock(&f->lock);
    f->n_done++;
    pthread_mutex_unlock(&f->lock);
    f->base.done(b, f->base.done_ud);
}

/* Hands batch i back as a device reset would: interrupted jobs carry the reset's error. */
static void fake_give_back(fake_exec_t *f, int i, exec_retry_t retry)
{
    exec_batch_t *b = f->got[i];
    b->retry = retry;
    for (int k = 0; k < b->n && retry == EXEC_RETRY_INTERRUPTED; k++)
        job_set_error(b->jobs[k], "device_reset", "CUDA: an illegal memory access (test)");
    pthread_mutex_lock(&f->lock);
    f->n_done++;
    pthread_mutex_unlock(&f->lock);
    f->base.done(b, f->base.done_ud);
}

/* ------------------------------------------------------------------ fixtures */

static char state_dir[] = "/tmp/gj-sched-XXXXXX";
static config_t cfg;
static store_t *st;
static sched_t *sched;
static fake_exec_t *fake;

/* The store's shards, and its inline_blob_bytes unless 0, for the next setup. */
static int setup_shards = 1;
static uint64_t setup_inline_bytes = 0;

/* Installs the policy of cfg as it stands now: the scheduler reads per-user limits from its
 * policy, built from cfg when it was made, not from cfg itself. */
static void policy_apply(void)
{
    policy_t *p = NULL;
    ck_assert_int_eq(policy_new(&cfg, &p), 0);
    sched_set_policy(sched, p);
}

/* sync_full: accepted jobs are made durable by the commit syncer, their answers wait for it. */
static void setup(bool sync_full)
{
    strcpy(state_dir, "/tmp/gj-sched-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(state_dir));
    config_defaults(&cfg);
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s", state_dir);
    cfg.sync_full = sync_full;
    cfg.shards = setup_shards;
    if (setup_inline_bytes) cfg.inline_blob_bytes = setup_inline_bytes;
    cfg.max_delay_us = 0;
    ck_assert_int_eq(store_open(&cfg, &st), 0);
    ck_assert_int_eq(sched_new(&cfg, st, &sched), 0);
    fake = calloc(1, sizeof *fake);
    fake->base.ops = &fake_ops;
    fake->device0_free = -1;
    pthread_mutex_init(&fake->lock, NULL);
    pthread_cond_init(&fake->cond, NULL);
    sched_set_executor(sched, &fake->base);
}

static void teardown(void)
{
    /* Finish whatever is still in the executor, taking no more, so the stop does not wait. */
    fake->slots = 0;
    for (int i = fake->n_done; i < fake->n_got; i++)
        fake_complete(fake, i);
    sched_stop(sched);
    sched_free(sched);
    store_close(st);
    free(fake);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", state_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* ------------------------------------------------------------------ helpers */

typedef struct reply_box {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int err;
    char ids[64][ID_SIZE];
    job_state_t states[64];
    size_t n;
    bool replayed;
    bool gated;           /* given while its job's end was being committed (end_gate) */
    int batches_started;  /* the fake executor's batches when the answer came */
    char cancel[16];      /* sched_result_t.cancel, "" when none */
    char reasons[64][16]; /* job_t.waiting_reason of each job answered */
    long positions[64];
} reply_box_t;

static void on_reply(void *token, const sched_result_t *res)
{
    reply_box_t *b = token;
    pthread_mutex_lock(&b->lock);
    b->err = res->err;
    b->n = res->n_jobs;
    b->replayed = res->replayed;
    b->gated = res->end_gate != NULL;
    snprintf(b->cancel, sizeof b->cancel, "%s", res->cancel ? res->cancel : "");
    pthread_mutex_lock(&fake->lock);
    b->batches_started = fake->n_got;
    pthread_mutex_unlock(&fake->lock);
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

static void box_init(reply_box_t *b)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
}

static void box_wait(reply_box_t *b)
{
    pthread_mutex_lock(&b->lock);
    while (!b->done)
        pthread_cond_wait(&b->cond, &b->lock);
    pthread_mutex_unlock(&b->lock);
}

/* A validated `add` job on f32 vectors of n elements. */
static job_t *add_job(const char *owner, int n, int priority)
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

/* The files under the store's blobs directory. */
static int blob_files(void)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "find %s/blobs -type f 2>/dev/null | wc -l", state_dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int n = -1;
    ck_assert_int_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* Submits jobs (taking them) and waits for the answer, in box. */
static void submit_any(reply_box_t *box, job_t **jobs, size_t n)
{
    job_t **arr = calloc(n, sizeof *arr);
    memcpy(arr, jobs, n * sizeof *arr);
    box_init(box);
    sched_submit(sched, arr, n, on_reply, box);
    box_wait(box);
}

/* Submits jobs (taking them) and waits for the commit; returns the ids in box. */
static void submit(reply_box_t *box, job_t **jobs, size_t n)
{
    submit_any(box, jobs, n);
    ck_assert_int_eq(box->err, 0);
}

/* Submits n `add` jobs of owner on vectors of size elements, in one array; ids in box. */
static void submit_many(reply_box_t *box, const char *owner, int n, int size)
{
    job_t **jobs = calloc((size_t)n, sizeof *jobs);
    for (int i = 0; i < n; i++)
        jobs[i] = add_job(owner, size, 0);
    submit(box, jobs, (size_t)n);
    free(jobs);
}

/* The state of owner's job id as a wait of timeout_ms answers it. */
static job_state_t waited_state(const char *owner, const char *id, int timeout_ms)
{
    reply_box_t w;
    box_init(&w);
    sched_wait(sched, owner, id, timeout_ms, on_reply, &w);
    box_wait(&w);
    ck_assert_int_eq(w.err, 0);
    return w.states[0];
}

/* The state of owner's job id once it has ended (waiting up to 5 s). */
static job_state_t ended_state(const char *owner, const char *id)
{
    return waited_state(owner, id, 5000);
}

static job_state_t stored_state(const char *id)
{
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(rd, id, &job), 0);
    job_state_t s = job->state;
    job_free(job);
    store_reader_close(rd);
    return s;
}

/* ------------------------------------------------------------------ tests */

START_TEST(test_watchdog_bound_grows_with_the_batch_cost_and_never_falls_below_the_minimum)
{
    config_t c;
    config_defaults(&c);
    c.watchdog_min_ms = 500;
    c.watchdog_cost_factor = 10;
    job_t *small = add_job("alice", 10, 0);
    /* 1e9 bytes at 1 GB/s and 1e11 flops at 100 GFLOP/s: 2 s, ten times over. */
    job_t *big = add_job("alice", 10, 0);
    big->call.cost.bytes = 1e9;
    big->call.cost.flops = 1e11;
    job_t *jobs[] = {small, big, big};
    ck_assert_int_eq(sched_watchdog_bound_ms(&c, jobs, 1), 500);
    ck_assert_int_eq(sched_watchdog_bound_ms(&c, jobs + 1, 1), 20000);
    ck_assert_int_eq(sched_watchdog_bound_ms(&c, jobs + 1, 2), 40000);
    big->call.cost.flops = 1e300; /* a cost no run could reach is capped, not overflowed */
    ck_assert_int_gt(sched_watchdog_bound_ms(&c, jobs + 1, 2), 40000);
    c.watchdog_min_ms = 0;
    ck_assert_int_eq(sched_watchdog_bound_ms(&c, jobs + 1, 1), 0);
    job_free(small);
    job_free(big);
}
END_TEST

/* The batch the fake has been told to abandon, waiting up to 10 s for it. */
static exec_batch_t *fake_wait_abandoned(fake_exec_t *f)
{
    for (int i = 0; i < 1000; i++) {
        pthread_mutex_lock(&f->lock);
        exec_batch_t *b = f->abandoned;
        pthread_mutex_unlock(&f->lock);
        if (b) return b;
        usleep(10 * 1000);
    }
    return NULL;
}

START_TEST(test_watchdog_fails_a_stuck_batch_and_ignores_its_late_result)
{
    fake->slots = 1;
    job_t *job = add_job("alice", 10, 0);
    reply_box_t box;
    submit(&box, &job, 1);
    fake_wait_batches(fake, 1);
    /* The fake never completes it: the watchdog gives up on it, the job fails with the bound
     * named, and the executor is asked to recover. */
    reply_box_t w;
    box_init(&w);
    sched_wait(sched, "alice", box.ids[0], 10000, on_reply, &w);
    box_wait(&w);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_eq(w.states[0], JOB_FAILED);
    ck_assert_int_eq(stored_state(box.ids[0]), JOB_FAILED);
    exec_batch_t *stuck = fake_wait_abandoned(fake);
    ck_assert_ptr_eq(stuck, fake->got[0]);
    ck_assert_int_eq(fake->n_abandoned, 1);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, box.ids[0], &stored), 0);
    ck_assert_str_eq(stored->error_code, "watchdog_timeout");
    ck_assert_ptr_nonnull(strstr(stored->error_message, "100 ms"));
    job_free(stored);
    sched_stats_t stats;
    sched_get_stats(sched, &stats);
    ck_assert_int_eq(stats.watchdog_expired_total, 1);
    ck_assert_int_eq(stats.stuck_batches, 1);

    /* The stuck batch comes back at last, as if it had succeeded: its result is dropped. */
    fake_complete(fake, 0);
    for (int i = 0; i < 1000 && stats.stuck_batches > 0; i++) {
        usleep(10 * 1000);
        sched_get_stats(sched, &stats);
    }
    ck_assert_int_eq(stats.stuck_batches, 0);
    ck_assert_int_eq(stats.watchdog_expired_total, 1);
    ck_assert_int_eq(stored_state(box.ids[0]), JOB_FAILED);
    ck_assert_int_eq(store_job_get(rd, box.ids[0], &stored), 0);
    ck_assert_str_eq(stored->error_code, "watchdog_timeout");
    job_free(stored);
    store_reader_close(rd);
}
END_TEST

START_TEST(test_jobs_with_equal_batch_keys_go_out_as_one_batch)
{
    fake->slots = 0; /* hold everything queued while the jobs arrive */
    job_t *jobs[10];
    for (int i = 0; i < 10; i++)
        jobs[i] = add_job("alice", 100 + i, 0);
    reply_box_t box;
    submit(&box, jobs, 10);
    ck_assert_int_eq(box.n, 10);

    char first_ids[10][ID_SIZE];
    for (int i = 0; i < 10; i++)
        strcpy(first_ids[i], box.ids[i]);

    /* Opening one slot: the next dispatch (a new submission wakes it, unless a timer of the loop
     * got there first) takes all ten, same key, in one batch, with the new job if it is queued
     * by then. */
    fake->slots = 1;
    job_t *more = add_job("alice", 7, 0);
    submit(&box, &more, 1);
    fake_wait_batches(fake, 1);
    ck_assert_int_eq(fake->n_got, 1);
    ck_assert_int_ge(fake->got[0]->n, 10);
    for (int i = 0; i < 10; i++) {
        bool found = false;
        for (int k = 0; k < fake->got[0]->n; k++)
            found |= strcmp(fake->got[0]->jobs[k]->id, first_ids[i]) == 0;
        ck_assert_msg(found, "job %d of the ten is not in the batch", i);
    }
    fake_complete(fake, 0);

    ck_assert_int_eq(ended_state("alice", first_ids[0]), JOB_SUCCEEDED);
    ck_assert_int_eq(stored_state(first_ids[0]), JOB_SUCCEEDED);
}
END_TEST

START_TEST(test_max_batch_caps_batch_size)
{
    cfg.max_batch = 4;
    fake->slots = 0;
    job_t *jobs[10];
    for (int i = 0; i < 10; i++)
        jobs[i] = add_job("alice", 10, 0);
    reply_box_t box;
    submit(&box, jobs, 10);
    fake->slots = 8;
    /* Bob's job wakes the dispatcher, unless a batch timer got there first; either way all
     * eleven jobs go out, in at least three batches and none over four. */
    job_t *more = add_job("bob", 3, 0);
    submit(&box, &more, 1);
    ck_assert_int_eq(fake_wait_jobs(fake, 11), 11);
    ck_assert_int_ge(fake->n_got, 3);
    for (int i = 0; i < fake->n_got; i++)
        ck_assert_int_le(fake->got[i]->n, 4);
}
END_TEST

START_TEST(test_fair_share_serves_a_small_user_before_a_big_backlog_drains)
{
    cfg.max_batch = 1; /* one job per batch makes the order of service visible */
    fake->slots = 0;
    job_t *jobs[50];
    for (int i = 0; i < 50; i++)
        jobs[i] = add_job("big", 1000, 0);
    reply_box_t box;
    submit(&box, jobs, 50);
    fake->slots = 1;
    job_t *small = add_job("small", 1000, 0);
    submit(&box, &small, 1);
    char small_id[ID_SIZE];
    strcpy(small_id, box.ids[0]);

    /* Run batches one at a time; the small user's job must come within the first few. */
    int position = -1;
    for (int i = 0; i < 10 && position < 0; i++) {
        fake_wait_batches(fake, i + 1);
        ck_assert_int_eq(fake->n_got, i + 1);
        if (strcmp(fake->got[i]->jobs[0]->id, small_id) == 0) position = i;
        fake_complete(fake, i);
    }
    ck_assert_int_ge(position, 0);
    ck_assert_int_le(position, 2);
}
END_TEST

/* Restarts the scheduler on its store, whose fair-share state is first set to users[0..n),
 * with a half-life of 100 s; the fake executor takes nothing until the test says. */
static void restart_with_fair_share(const store_fair_share_t *users, size_t n)
{
    sched_stop(sched);
    sched_free(sched);
    ck_assert_int_eq(store_fair_share_save(st, users, n), 0);
    cfg.fair_share_half_life_s = 100;
    ck_assert_int_eq(sched_new(&cfg, st, &sched), 0);
    fake->n_got = fake->n_done = 0;
    fake->slots = 0;
    sched_set_executor(sched, &fake->base);
    ck_assert_int_eq(sched_start(sched), 0);
}

START_TEST(test_fair_share_usage_survives_a_restart_decayed_over_the_downtime)
{
    /* Saved one half-life ago: restored at half; saved forty ago: as good as new, dropped. */
    int64_t now = now_us();
    store_fair_share_t users[] = {{"heavy", 8e6, now - 100 * 1000000LL},
                                  {"forgotten", 8e6, now - 4000 * 1000000LL}};
    restart_with_fair_share(users, 2);
    sched_stop(sched); /* saves what it restored, decayed to now */
    store_fair_share_t *saved = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_fair_share_load(st, &saved, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(saved[0].owner, "heavy");
    /* At most half, less only by the few moments the restart itself took. */
    ck_assert_double_le(saved[0].usage_us, 4e6);
    ck_assert_double_gt(saved[0].usage_us, 3.9e6);
    ck_assert_int_ge(saved[0].at_us, now);
    free(saved);
}
END_TEST

START_TEST(test_a_user_heavy_before_a_restart_is_served_after_a_light_one)
{
    cfg.max_batch = 1;
    store_fair_share_t users[] = {{"heavy", 8e6, now_us()}};
    restart_with_fair_share(users, 1);
    /* heavy's jobs come first; with no usage remembered, they would also go out first. */
    job_t *jobs[3] = {add_job("heavy", 1000, 0), add_job("heavy", 1000, 0),
                      add_job("heavy", 1000, 0)};
    reply_box_t box;
    submit(&box, jobs, 3);
    fake->slots = 1; /* the next commit dispatches, with both users' jobs queued */
    job_t *light = add_job("light", 1000, 0);
    submit(&box, &light, 1);
    fake_wait_batches(fake, 1);
    ck_assert_int_ge(fake->n_got, 1);
    ck_assert_str_eq(fake->got[0]->jobs[0]->owner, "light");
}
END_TEST

/* Two backlogged users of weights 3 and 1 ([user.alice] weight = 3) share one slot: over a
 * window of 80 jobs, alice gets three times bob's device time, to within one job's charge.
 * Fair share charges each job the wall time its batch held the slot, which a loaded machine
 * stretches at random; so the test holds the scheduler to what it charged, not to a count of
 * jobs: picking the user with the least usage per unit of weight each time keeps
 * |alice's usage / 3 - bob's usage| at most the largest single charge (per unit of weight),
 * whatever the charges were. The usage is the scheduler's own, as it saves it at its stop (a
 * year's half-life: undecayed over the test); each job's charge is at most its row's run time
 * (its start is recorded before the batch is handed over, its end at the charge). */
START_TEST(test_fair_share_gives_a_user_of_weight_3_three_times_the_share)
{
    char err[256];
    ck_assert_int_eq(config_set(&cfg, "user.alice", "weight", "3", err, sizeof err), 0);
    policy_apply();
    cfg.fair_share_half_life_s = 31536000;
    cfg.max_batch = 1;
    fake->slots = 0;
    enum { EACH = 100, WINDOW = 80 };
    job_t *a[EACH], *b[EACH];
    for (int i = 0; i < EACH; i++) {
        a[i] = add_job("alice", 16, 0);
        b[i] = add_job("bob", 16, 0);
    }
    reply_box_t box;
    submit(&box, a, EACH);
    fake->slots = 1; /* bob's submission wakes the dispatch with both queues full */
    submit(&box, b, EACH);
    int done[2] = {0, 0}; /* alice, bob */
    static char ids[WINDOW][ID_SIZE];
    bool by_alice[WINDOW];
    for (int i = 0; i < WINDOW; i++) {
        fake_wait_batches(fake, i + 1);
        ck_assert_int_eq(fake->n_got, i + 1);
        usleep(5000);
        const job_t *job = fake->got[i]->jobs[0];
        snprintf(ids[i], sizeof ids[i], "%s", job->id);
        by_alice[i] = strcmp(job->owner, "alice") == 0;
        done[by_alice[i] ? 0 : 1]++;
        if (i == WINDOW - 1) fake->slots = 0; /* the window's last job starts no other */
        fake_complete(fake, i);
    }
    sched_stop(sched); /* charges the window's last job, and saves every user's usage */

    double usage[2] = {0, 0}, most = 0; /* alice's / 3, bob's; the largest charge, likewise */
    store_fair_share_t *saved = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_fair_share_load(st, &saved, &n), 0);
    for (size_t i = 0; i < n; i++)
        usage[strcmp(saved[i].owner, "alice") == 0 ? 0 : 1] = saved[i].usage_us;
    free(saved);
    usage[0] /= 3;
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    for (int i = 0; i < WINDOW; i++) {
        job_t *job = NULL;
        ck_assert_int_eq(store_job_get(rd, ids[i], &job), 0);
        ck_assert_int_eq(job->state, JOB_SUCCEEDED);
        double charge = (double)(job->finished_us - job->started_us) / (by_alice[i] ? 3 : 1);
        if (charge > most) most = charge;
        job_free(job);
    }
    store_reader_close(rd);
    fprintf(stderr,
            "weight 3 vs 1: alice %d jobs, %.0f us / 3; bob %d jobs, %.0f us; "
            "largest charge %.0f us\n",
            done[0], usage[0], done[1], usage[1], most);
    ck_assert_msg(usage[0] > 0 && usage[1] > 0, "alice's usage %.0f us / 3, bob's %.0f us",
                  usage[0], usage[1]);
    double gap = usage[0] > usage[1] ? usage[0] - usage[1] : usage[1] - usage[0];
    ck_assert_msg(gap <= most + 1,
                  "alice's usage / 3 %.0f us and bob's %.0f us differ by more than the largest "
                  "charge, %.0f us",
                  usage[0], usage[1], most);
}
END_TEST

/* What a queued job says of its wait, as the loop answers for it (sched_wait, no timeout). */
typedef struct waiting_box {
    reply_box_t box;
    char reason[16], limit[112];
    long position;
    job_state_t state;
} waiting_box_t;

static void on_waiting_reply(void *token, const sched_result_t *res)
{
    waiting_box_t *w = token;
    if (res->n_jobs == 1) {
        snprintf(w->reason, sizeof w->reason, "%s", res->jobs[0]->waiting_reason);
        snprintf(w->limit, sizeof w->limit, "%s", res->jobs[0]->waiting_limit);
        w->position = res->jobs[0]->waiting_position;
        w->state = res->jobs[0]->state;
    }
    on_reply(&w->box, res);
}

static void ask_waiting(waiting_box_t *w, const char *id)
{
    memset(w, 0, sizeof *w);
    box_init(&w->box);
    sched_wait(sched, NULL, id, 0, on_waiting_reply, w);
    box_wait(&w->box);
    ck_assert_int_eq(w->box.err, 0);
}

/* User A queues 5,000 jobs, then B submits 10: B's last job says it waits for fair share at a
 * position that shrinks as jobs run, and B's jobs all run before A's queue drains. */
START_TEST(test_a_small_user_waits_for_fair_share_at_a_shrinking_position)
{
    enum { BIG = 5000, SMALL = 10 };
    cfg.max_batch = 1;
    fake->slots = 0;
    reply_box_t box;
    submit_many(&box, "a", BIG, 16);
    fake->slots = 1;
    job_t *small[SMALL];
    for (int i = 0; i < SMALL; i++)
        small[i] = add_job("b", 16, 0);
    submit(&box, small, SMALL);
    char last[ID_SIZE];
    snprintf(last, sizeof last, "%s", box.ids[SMALL - 1]);

    waiting_box_t w;
    ask_waiting(&w, last);
    ck_assert_int_eq(w.state, JOB_QUEUED);
    ck_assert_str_eq(w.reason, "fair_share");
    ck_assert_int_ge(w.position, SMALL - 1); /* its own 9, and some of a's between */
    ck_assert_int_le(w.position, 2 * SMALL + 1);
    long before = w.position;
    int ran = 0, b_done = 0;
    for (; b_done < SMALL && ran < 6 * SMALL; ran++) {
        fake_wait_batches(fake, ran + 1);
        ck_assert_int_eq(fake->n_got, ran + 1);
        b_done += strcmp(fake->got[ran]->jobs[0]->owner, "b") == 0;
        /* Fair share charges a batch's wall time: each job holds the slot 5 ms, so that the
         * test's own latency on a loaded machine is a small part of every charge. */
        usleep(5000);
        fake_complete(fake, ran);
        if (b_done == SMALL) break;
        ask_waiting(&w, last);
        if (w.state != JOB_QUEUED) continue;
        ck_assert_msg(w.position <= before, "position grew from %ld to %ld", before, w.position);
        before = w.position;
    }
    ck_assert_int_eq(b_done, SMALL);
    /* Alternating would take 2 × SMALL; a's 5,000 are nowhere near drained. */
    ck_assert_int_lt(ran + 1, 4 * SMALL);
    ck_assert_int_lt(before, SMALL); /* and the position came down on the way */
}
END_TEST

/* A user at its running limit: its queued job names the limit that holds it. */
START_TEST(test_a_job_held_by_its_users_running_limit_names_the_limit)
{
    char err[256];
    ck_assert_int_eq(config_set(&cfg, "user.alice", "max_running", "1", err, sizeof err), 0);
    policy_apply();
    cfg.max_batch = 1;
    fake->slots = 4;
    job_t *jobs[2] = {add_job("alice", 16, 0), add_job("alice", 16, 0)};
    reply_box_t box;
    submit(&box, jobs, 2);
    fake_wait_batches(fake, 1);
    waiting_box_t w;
    ask_waiting(&w, box.ids[1]);
    ck_assert_int_eq(w.state, JOB_QUEUED);
    ck_assert_str_eq(w.reason, "user_limit");
    ck_assert_str_eq(w.limit, "user.alice.max_running");
    ck_assert_int_eq(w.position, 0);
}
END_TEST

/* A submission's answer says why each of its jobs that did not start waits, and where. */
START_TEST(test_a_submissions_answer_says_why_its_queued_jobs_wait)
{
    cfg.max_batch = 1;
    fake->slots = 0;
    job_t *jobs[3] = {add_job("alice", 16, 0), add_job("alice", 16, 0), add_job("alice", 16, 0)};
    reply_box_t box;
    submit(&box, jobs, 3);
    ck_assert_int_eq(box.n, 3);
    for (long i = 0; i < 3; i++) {
        ck_assert_int_eq(box.states[i], JOB_QUEUED);
        ck_assert_str_eq(box.reasons[i], "devices_busy");
        ck_assert_int_eq(box.positions[i], i);
    }
}
END_TEST

/* A list explained in one message says of each queued job what a wait for that job alone
 * says, in whatever order the list has them; a job the loop does not hold is left as read. */
START_TEST(test_jobs_explained_together_agree_with_each_explained_alone)
{
    enum { A = 20, B = 5, N = A + B + 1 };
    cfg.max_batch = 1;
    fake->slots = 0;
    job_t *a[A], *b[B];
    for (int i = 0; i < A; i++)
        a[i] = add_job("alice", 16, i % 3);
    for (int i = 0; i < B; i++)
        b[i] = add_job("bob", 16, 0);
    reply_box_t box_a, box_b;
    submit(&box_a, a, A);
    submit(&box_b, b, B);
    job_t *copies[N];
    for (int i = 0; i < N; i++) {
        copies[i] = job_new();
        copies[i]->state = JOB_QUEUED;
        const char *id = i < A ? box_a.ids[A - 1 - i] : i < A + B ? box_b.ids[i - A] : NULL;
        if (id)
            snprintf(copies[i]->id, sizeof copies[i]->id, "%s", id);
        else
            id_new('j', copies[i]->id); /* not the loop's */
    }
    reply_box_t box;
    box_init(&box);
    sched_explain_jobs(sched, copies, N, on_reply, &box);
    box_wait(&box);
    ck_assert_int_eq(box.err, 0);
    ck_assert_int_eq(box.n, N);
    for (int i = 0; i < N - 1; i++) {
        waiting_box_t w;
        ask_waiting(&w, copies[i]->id);
        ck_assert_str_eq(copies[i]->waiting_reason, w.reason);
        ck_assert_int_eq(copies[i]->waiting_position, w.position);
    }
    ck_assert_str_eq(copies[N - 1]->waiting_reason, "");
    for (int i = 0; i < N; i++)
        job_free(copies[i]);
}
END_TEST

START_TEST(test_batches_given_back_by_a_device_reset_run_again_while_attempts_remain)
{
    cfg.max_batch = 1;
    cfg.max_attempts = 2;
    fake->slots = 2;
    job_t *a = add_job("alice", 10, 0), *b = add_job("alice", 11, 0);
    reply_box_t box_a, box_b;
    submit(&box_a, &a, 1);
    submit(&box_b, &b, 1);
    fake_wait_batches(fake, 2);
    bool a_first = fake->got[0]->jobs[0] == a;
    ck_assert_int_eq(a->attempts, 1);
    ck_assert_int_eq(b->attempts, 1);

    /* The device resets: a was running on it, b had not reached it. Both run again; only a's
     * attempt counts. */
    fake_give_back(fake, a_first ? 0 : 1, EXEC_RETRY_INTERRUPTED);
    fake_give_back(fake, a_first ? 1 : 0, EXEC_RETRY_UNSTARTED);
    fake_wait_batches(fake, 4);
    ck_assert_int_eq(fake->n_got, 4);
    int again_a = fake->got[2]->jobs[0] == a ? 2 : 3;
    ck_assert_ptr_eq(fake->got[again_a]->jobs[0], a);
    ck_assert_ptr_eq(fake->got[5 - again_a]->jobs[0], b);
    ck_assert_int_eq(a->attempts, 2);
    ck_assert_int_eq(b->attempts, 1);
    ck_assert_str_eq(a->error_code, "");
    ck_assert_int_eq(stored_state(box_a.ids[0]), JOB_RUNNING);

    /* Interrupted again, a is out of attempts: it fails with the reset's error. b succeeds. */
    fake_give_back(fake, again_a, EXEC_RETRY_INTERRUPTED);
    fake_complete(fake, 5 - again_a);
    ck_assert_int_eq(ended_state("alice", box_a.ids[0]), JOB_FAILED);
    ck_assert_int_eq(ended_state("alice", box_b.ids[0]), JOB_SUCCEEDED);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, box_a.ids[0], &stored), 0);
    ck_assert_str_eq(stored->error_code, "device_reset");
    ck_assert_int_eq(stored->attempts, 2);
    job_free(stored);
    store_reader_close(rd);
}
END_TEST

START_TEST(test_batches_keep_each_user_within_the_running_limit)
{
    cfg.max_running_per_user = 2;
    policy_apply();
    cfg.max_batch = 16;
    fake->slots = 0;
    job_t *jobs[8];
    for (int i = 0; i < 8; i++)
        jobs[i] = add_job(i < 5 ? "alice" : "bob", 10, 0);
    reply_box_t box;
    submit(&box, jobs, 5);
    submit(&box, jobs + 5, 3);
    fake->slots = 8;
    job_t *wake = add_job("carol", 10, 0);
    submit(&box, &wake, 1);

    /* Five jobs go out, however the batches are cut: two of alice's five, two of bob's three,
     * carol's one; the others wait for a running job of theirs to end. */
    ck_assert_int_eq(fake_wait_jobs(fake, 5), 5);
    usleep(50000);
    int alice = 0, bob = 0, carol = 0;
    pthread_mutex_lock(&fake->lock);
    for (int i = 0; i < fake->n_got; i++)
        for (int k = 0; k < fake->got[i]->n; k++) {
            const char *owner = fake->got[i]->jobs[k]->owner;
            alice += strcmp(owner, "alice") == 0;
            bob += strcmp(owner, "bob") == 0;
            carol += strcmp(owner, "carol") == 0;
        }
    pthread_mutex_unlock(&fake->lock);
    ck_assert_int_eq(alice, 2);
    ck_assert_int_eq(bob, 2);
    ck_assert_int_eq(carol, 1);
}
END_TEST

START_TEST(test_a_job_pinned_to_a_full_device_waits_and_holds_back_nothing)
{
    fake->slots = 4;
    fake->device0_free = 0;
    job_t *pinned = add_job("alice", 10, 0);
    pinned->device = 0;
    reply_box_t box;
    submit(&box, &pinned, 1);
    usleep(100000);
    ck_assert_int_eq(fake->n_got, 0);
    ck_assert_int_eq(stored_state(box.ids[0]), JOB_QUEUED);

    /* Other work goes on meanwhile: alice's own later, lower-priority job (her pinned one
     * holds back none of her others), and bob's. */
    job_t *mine = add_job("alice", 12, -5);
    reply_box_t box_mine;
    submit(&box_mine, &mine, 1);
    fake_wait_batches(fake, 1);
    ck_assert_str_eq(fake->got[0]->jobs[0]->id, box_mine.ids[0]);
    job_t *other = add_job("bob", 11, 0);
    reply_box_t box2;
    submit(&box2, &other, 1);
    fake_wait_batches(fake, 2);
    ck_assert_str_eq(fake->got[1]->jobs[0]->id, box2.ids[0]);
    ck_assert_int_eq(stored_state(box.ids[0]), JOB_QUEUED);

    /* Once device 0 has room, the next dispatch takes the pinned job. */
    pthread_mutex_lock(&fake->lock);
    fake->device0_free = 1;
    pthread_mutex_unlock(&fake->lock);
    fake_complete(fake, 0);
    fake_wait_batches(fake, 3);
    ck_assert_int_eq(fake->n_got, 3);
    ck_assert_str_eq(fake->got[2]->jobs[0]->id, box.ids[0]);
}
END_TEST

/* The user's other jobs go around a job waiting for its device only while one running slot
 * stays free for it: at max_running_per_user 2, one of them runs, and the waiting job comes
 * next once its device has room. */
START_TEST(test_jobs_going_around_a_waiting_one_leave_it_a_running_slot)
{
    cfg.max_running_per_user = 2;
    policy_apply();
    cfg.max_batch = 1;
    fake->slots = 4;
    fake->device0_free = 0;
    job_t *pinned = add_job("alice", 10, 0);
    pinned->device = 0;
    job_t *later[2] = {add_job("alice", 11, -5), add_job("alice", 12, -5)};
    reply_box_t box, box_later[2];
    submit(&box, &pinned, 1);
    for (int i = 0; i < 2; i++)
        submit(&box_later[i], &later[i], 1);
    fake_wait_batches(fake, 1);
    usleep(100000);
    ck_assert_int_eq(fake->n_got, 1);
    ck_assert_str_eq(fake->got[0]->jobs[0]->id, box_later[0].ids[0]);

    pthread_mutex_lock(&fake->lock);
    fake->device0_free = 1;
    pthread_mutex_unlock(&fake->lock);
    fake_complete(fake, 0);
    fake_wait_batches(fake, 2);
    ck_assert_str_eq(fake->got[1]->jobs[0]->id, box.ids[0]);
}
END_TEST

START_TEST(test_priority_orders_one_users_queue)
{
    cfg.max_batch = 1;
    fake->slots = 0;
    job_t *low = add_job("alice", 10, -5);
    job_t *high = add_job("alice", 11, 50);
    reply_box_t box_low, box_high;
    submit(&box_low, &low, 1);
    submit(&box_high, &high, 1);
    fake->slots = 1;
    job_t *wake = add_job("alice", 12, 0);
    reply_box_t box;
    submit(&box, &wake, 1);
    fake_wait_batches(fake, 1);
    ck_assert_str_eq(fake->got[0]->jobs[0]->id, box_high.ids[0]);
}
END_TEST

START_TEST(test_cancel_queued_job_never_runs)
{
    fake->slots = 0;
    job_t *job = add_job("alice", 10, 0);
    reply_box_t box;
    submit(&box, &job, 1);
    reply_box_t c;
    box_init(&c);
    sched_cancel(sched, "alice", box.ids[0], on_reply, &c);
    box_wait(&c);
    ck_assert_int_eq(c.err, 0);
    ck_assert_int_eq(c.states[0], JOB_CANCELLED);
    ck_assert_str_eq(c.cancel, "dequeued");
    fake->slots = 4;
    job_t *other = add_job("alice", 10, 0);
    reply_box_t b2;
    submit(&b2, &other, 1);
    fake_wait_batches(fake, 1);
    for (int i = 0; i < fake->n_got; i++)
        for (int k = 0; k < fake->got[i]->n; k++)
            ck_assert_str_ne(fake->got[i]->jobs[k]->id, box.ids[0]);
    ck_assert_int_eq(stored_state(box.ids[0]), JOB_CANCELLED);

    /* A second cancel finds the job final. */
    box_init(&c);
    sched_cancel(sched, "alice", box.ids[0], on_reply, &c);
    box_wait(&c);
    ck_assert_int_eq(c.err, -EBUSY);
}
END_TEST

/* The cancel of a running job is durable and answered at once, with what the executor's hook
 * says it did; the hook gets the job and the batch that holds it; the batch's late result is
 * dropped for that job and kept for its batch-mate. */
START_TEST(test_cancel_running_job_asks_the_executor_and_keeps_its_batch_mates)
{
    fake->slots = 1;
    job_t *jobs[2] = {add_job("alice", 10, 0), add_job("alice", 10, 0)};
    reply_box_t box;
    submit(&box, jobs, 2);
    ck_assert_int_eq(fake_wait_jobs(fake, 2), 2);
    ck_assert_int_eq(fake->n_got, 1);
    reply_box_t c;
    box_init(&c);
    sched_cancel(sched, "alice", box.ids[1], on_reply, &c);
    box_wait(&c);
    ck_assert_int_eq(c.err, 0);
    ck_assert_int_eq(c.states[0], JOB_CANCELLED);
    ck_assert_str_eq(c.cancel, "stopped");
    ck_assert_int_eq(stored_state(box.ids[1]), JOB_CANCELLED);
    pthread_mutex_lock(&fake->lock);
    ck_assert_ptr_eq(fake->cancel_batch, fake->got[0]);
    ck_assert_str_eq(fake->cancel_job->id, box.ids[1]);
    pthread_mutex_unlock(&fake->lock);

    fake_complete(fake, 0);
    reply_box_t w;
    box_init(&w);
    sched_wait(sched, "alice", box.ids[0], 10000, on_reply, &w);
    box_wait(&w);
    ck_assert_int_eq(w.states[0], JOB_SUCCEEDED);
    ck_assert_int_eq(stored_state(box.ids[0]), JOB_SUCCEEDED);
    ck_assert_int_eq(stored_state(box.ids[1]), JOB_CANCELLED);
}
END_TEST

START_TEST(test_other_users_cannot_see_or_cancel_a_job)
{
    fake->slots = 0;
    job_t *job = add_job("alice", 10, 0);
    reply_box_t box;
    submit(&box, &job, 1);
    reply_box_t c;
    box_init(&c);
    sched_cancel(sched, "mallory", box.ids[0], on_reply, &c);
    box_wait(&c);
    ck_assert_int_eq(c.err, -ENOENT);
    box_init(&c);
    sched_wait(sched, "mallory", box.ids[0], 0, on_reply, &c);
    box_wait(&c);
    ck_assert_int_eq(c.err, -ENOENT);
    ck_assert_int_eq(stored_state(box.ids[0]), JOB_QUEUED);
}
END_TEST

START_TEST(test_deadline_fails_a_job_left_queued)
{
    fake->slots = 0;
    job_t *job = add_job("alice", 10, 0);
    job->deadline_us = now_us() + 50 * 1000;
    reply_box_t box;
    submit(&box, &job, 1);
    ck_assert_int_eq(ended_state("alice", box.ids[0]), JOB_FAILED);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, box.ids[0], &stored), 0);
    ck_assert_str_eq(stored->error_code, "deadline_exceeded");
    job_free(stored);
    store_reader_close(rd);
}
END_TEST

START_TEST(test_wait_times_out_with_the_current_state)
{
    fake->slots = 0;
    job_t *job = add_job("alice", 10, 0);
    reply_box_t box;
    submit(&box, &job, 1);
    reply_box_t w;
    box_init(&w);
    int64_t t0 = now_us();
    sched_wait(sched, "alice", box.ids[0], 100, on_reply, &w);
    box_wait(&w);
    ck_assert_int_ge(now_us() - t0, 90 * 1000);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_eq(w.states[0], JOB_QUEUED);
}
END_TEST

START_TEST(test_idempotent_resubmission_returns_the_first_job)
{
    fake->slots = 0;
    job_t *a = add_job("alice", 10, 0);
    strcpy(a->idempotency_key, "key-1");
    reply_box_t first;
    submit(&first, &a, 1);
    ck_assert(!first.replayed);
    job_t *b = add_job("alice", 10, 0);
    strcpy(b->idempotency_key, "key-1");
    reply_box_t second;
    submit(&second, &b, 1);
    ck_assert(second.replayed);
    ck_assert_str_eq(second.ids[0], first.ids[0]);
    /* The same key from another user is another job. */
    job_t *c = add_job("bob", 10, 0);
    strcpy(c->idempotency_key, "key-1");
    reply_box_t third;
    submit(&third, &c, 1);
    ck_assert(!third.replayed);
    ck_assert_str_ne(third.ids[0], first.ids[0]);
}
END_TEST

START_TEST(test_queued_jobs_survive_a_stop_and_run_after_restart)
{
    fake->slots = 0;
    job_t *jobs[5];
    for (int i = 0; i < 5; i++)
        jobs[i] = add_job("alice", 10, 0);
    reply_box_t box;
    submit(&box, jobs, 5);
    sched_stop(sched);
    sched_free(sched);

    ck_assert_int_eq(sched_new(&cfg, st, &sched), 0);
    fake->n_got = fake->n_done = 0;
    fake->slots = 4;
    sched_set_executor(sched, &fake->base);
    ck_assert_int_eq(sched_start(sched), 0);
    fake_wait_batches(fake, 1);
    ck_assert_int_ge(fake->n_got, 1);
    int total = 0;
    for (int i = 0; i < fake->n_got; i++)
        total += fake->got[i]->n;
    ck_assert_int_eq(total, 5);
}
END_TEST

/* Past QUEUED_IN_MEMORY queued jobs the loop keeps only their entries and reads each job back
 * from the store when it is answered for, cancelled, failed by its deadline or started: each
 * of those works on a job kept in the store alone, and every job runs, in its queue's order,
 * whole (its op resolved, its inputs described). */
START_TEST(test_a_long_queue_keeps_its_jobs_in_the_store_until_they_start)
{
    enum { N = QUEUED_IN_MEMORY + 200 };
    fake->slots = 0;
    reply_box_t box;
    submit_many(&box, "alice", N, 10);
    job_t *late[3];
    reply_box_t late_box[3];
    for (int i = 0; i < 3; i++) {
        late[i] = add_job("alice", 10, 0);
        if (i == 0) late[i]->deadline_us = now_us() + 50 * 1000;
        submit(&late_box[i], &late[i], 1);
    }
    /* A deadline passes on a stowed job. */
    ck_assert_int_eq(ended_state("alice", late_box[0].ids[0]), JOB_FAILED);
    /* A stowed job is cancelled. */
    reply_box_t c;
    box_init(&c);
    sched_cancel(sched, "alice", late_box[1].ids[0], on_reply, &c);
    box_wait(&c);
    ck_assert_int_eq(c.err, 0);
    ck_assert_int_eq(c.states[0], JOB_CANCELLED);
    ck_assert_str_eq(c.cancel, "dequeued");
    /* A stowed job is answered for as it stands, with why it waits. */
    reply_box_t w;
    box_init(&w);
    sched_wait(sched, "alice", late_box[2].ids[0], 0, on_reply, &w);
    box_wait(&w);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_eq(w.states[0], JOB_QUEUED);
    ck_assert_str_eq(w.reasons[0], "devices_busy");
    ck_assert_int_eq(w.positions[0], N);

    fake->slots = 4096;
    job_t *wake = add_job("alice", 10, 0);
    reply_box_t wake_box;
    submit(&wake_box, &wake, 1);
    /* Batches are completed as they come: the user's running limit holds back the rest. */
    int seen = 0;
    for (int b = 0; seen < N + 2; b++) {
        fake_wait_batches(fake, b + 1);
        ck_assert_int_gt(fake->n_got, b);
        const exec_batch_t *batch = fake->got[b];
        for (int k = 0; k < batch->n; k++, seen++) {
            const job_t *job = batch->jobs[k];
            ck_assert_ptr_eq(job->call.op, op_find("add"));
            ck_assert_int_eq(job->in[0].desc.shape[0], 10);
            ck_assert(job->in[0].data || job->in[0].blob);
            ck_assert_str_ne(job->id, late_box[0].ids[0]);
            ck_assert_str_ne(job->id, late_box[1].ids[0]);
            if (seen < 64) ck_assert_str_eq(job->id, box.ids[seen]);
        }
        fake_complete(fake, b);
    }
    ck_assert_int_eq(seen, N + 2);
}
END_TEST

START_TEST(test_submissions_after_stop_answer_shutdown)
{
    sched_stop(sched);
    job_t *job = add_job("alice", 10, 0);
    reply_box_t box;
    submit_any(&box, &job, 1);
    ck_assert_int_eq(box.err, -ESHUTDOWN);
}
END_TEST

START_TEST(test_a_batch_the_executor_turns_down_goes_back_to_its_queue)
{
    fake->slots = 1;
    fake->turn_down = 1; /* as a device worker does when the pinned device is full */
    job_t *job = add_job("alice", 10, 0);
    job->device = 0;
    reply_box_t box;
    submit(&box, &job, 1);
    /* Turned down: queued again, in the store too, not failed. */
    for (int i = 0; i < 100 && fake->turn_down > 0; i++)
        usleep(10 * 1000);
    ck_assert_int_eq(fake->turn_down, 0);
    ck_assert_int_eq(fake->n_got, 0);
    usleep(20 * 1000);
    ck_assert_int_eq(stored_state(box.ids[0]), JOB_QUEUED);

    /* The next dispatch (a new submission wakes it) hands it over, as its first attempt. */
    job_t *other = add_job("alice", 11, 0);
    other->device = 0;
    reply_box_t b2;
    submit(&b2, &other, 1);
    fake_wait_batches(fake, 1);
    ck_assert_int_eq(fake->n_got, 1);
    bool found = false;
    for (int k = 0; k < fake->got[0]->n; k++)
        if (strcmp(fake->got[0]->jobs[k]->id, box.ids[0]) == 0) {
            found = true;
            ck_assert_int_eq(fake->got[0]->jobs[k]->attempts, 1);
        }
    ck_assert(found);
    fake_complete(fake, 0);
    ck_assert_int_eq(ended_state("alice", box.ids[0]), JOB_SUCCEEDED);
}
END_TEST

START_TEST(test_queued_limit_counts_submissions_waiting_for_their_commit)
{
    fake->slots = 0;
    /* Both submissions arrive within one commit window: the second must see the first. */
    reply_box_t a, b;
    box_init(&a);
    box_init(&b);
    job_t **first = calloc(3, sizeof *first);
    job_t **second = calloc(3, sizeof *second);
    for (int i = 0; i < 3; i++) {
        first[i] = add_job("alice", 10, 0);
        /* 192 KiB of small inputs, written to a file of their own as it is submitted. */
        second[i] = add_job("alice", 8192, 0);
    }
    sched_submit(sched, first, 3, on_reply, &a);
    sched_submit(sched, second, 3, on_reply, &b);
    box_wait(&a);
    box_wait(&b);
    ck_assert_int_eq(a.err, 0);
    ck_assert_int_eq(b.err, -EAGAIN);
    /* The refused jobs' file goes with them. */
    ck_assert_int_eq(blob_files(), 0);
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
    reply_box_t boxes[4];
    buffer_t *bufs[4] = {small_buffer("alice", true), small_buffer("alice", true),
                         small_buffer("alice", false), small_buffer("bob", true)};
    for (int i = 0; i < 4; i++) {
        box_init(&boxes[i]);
        sched_buffer_put(sched, bufs[i], on_reply, &boxes[i]);
    }
    for (int i = 0; i < 4; i++)
        box_wait(&boxes[i]);
    ck_assert_int_eq(boxes[0].err, 0);
    ck_assert_int_eq(boxes[1].err, -EDQUOT);
    ck_assert_int_eq(boxes[2].err, 0); /* not resident: not counted */
    ck_assert_int_eq(boxes[3].err, 0); /* bob's own quota */
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    store_usage_t usage;
    ck_assert_int_eq(store_usage_get(rd, "alice", &usage), 0);
    ck_assert_int_eq(usage.resident_bytes, 64);
    ck_assert_int_eq(usage.buffers, 2);
    store_reader_close(rd);
}
END_TEST

START_TEST(test_a_durable_submission_starts_running_before_it_is_answered)
{
    fake->slots = 4;
    job_t *jobs[3] = {add_job("alice", 10, 0), add_job("alice", 10, 0), add_job("bob", 10, 0)};
    reply_box_t box;
    submit(&box, jobs, 3);
    /* The commit's sync runs on its own thread; the jobs went out before it was done. Without
     * sync_full the answer comes first, and the dispatch after it. */
    ck_assert_int_ge(box.batches_started, 1);
    ck_assert_int_eq(box.n, 3);
    for (size_t i = 0; i < box.n; i++) {
        ck_assert_int_eq(box.states[i], JOB_QUEUED); /* as accepted, whatever came since */
        ck_assert_int_eq(stored_state(box.ids[i]), JOB_RUNNING);
    }
}
END_TEST

START_TEST(test_a_failed_sync_fails_its_answer_and_refuses_what_follows)
{
    fake->slots = 4;
    /* SQLite goes on with its open descriptor; the syncer cannot reach the file any more. */
    char wal[PATH_MAX];
    snprintf(wal, sizeof wal, "%s/gpujobd.db-wal", state_dir);
    ck_assert_int_eq(unlink(wal), 0);
    job_t *job = add_job("alice", 10, 0);
    reply_box_t first;
    submit_any(&first, &job, 1);
    ck_assert_int_eq(first.err, -EIO);
    ck_assert_int_eq(fake->n_got, 1); /* committed: it runs all the same */

    job = add_job("alice", 10, 0);
    reply_box_t second;
    submit_any(&second, &job, 1);
    ck_assert_int_eq(second.err, -EIO);
    ck_assert_int_eq(fake->n_got, 1); /* refused before its commit */
    sched_stats_t stats;
    sched_get_stats(sched, &stats);
    ck_assert(stats.store_failed);
}
END_TEST

START_TEST(test_without_sync_full_a_submission_starts_before_its_commit_is_answered)
{
    fake->slots = 4;
    job_t *job = add_job("alice", 10, 0);
    reply_box_t box;
    submit(&box, &job, 1);
    /* The job went out inside the commit's transaction, its start recorded with it. */
    ck_assert_int_eq(box.batches_started, 1);
    ck_assert_int_eq(box.states[0], JOB_QUEUED);
    ck_assert_int_eq(stored_state(box.ids[0]), JOB_RUNNING);
}
END_TEST

/* Jobs without a key are inserted after the cut, already running; a keyed one is inserted
 * before it (its key may name a stored job) and its start recorded after. Either way the row
 * says running once, with the start's attempt; a replay of the key goes nowhere. */
START_TEST(test_keyed_and_plain_jobs_started_in_their_round_are_stored_running)
{
    fake->slots = 4;
    job_t *jobs[2] = {add_job("alice", 10, 0), add_job("alice", 10, 0)};
    strcpy(jobs[0]->idempotency_key, "key-1");
    reply_box_t box;
    submit(&box, jobs, 2);
    ck_assert_int_ge(box.batches_started, 1);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    for (int i = 0; i < 2; i++) {
        job_t *stored = NULL;
        ck_assert_int_eq(store_job_get(rd, box.ids[i], &stored), 0);
        ck_assert_int_eq(stored->state, JOB_RUNNING);
        ck_assert_int_eq(stored->attempts, 1);
        ck_assert_int_ge(stored->started_us, stored->created_us);
        ck_assert_int_ge(stored->batch_size, 1);
        job_free(stored);
    }
    store_reader_close(rd);

    pthread_mutex_lock(&fake->lock);
    int went_out = fake->n_got;
    pthread_mutex_unlock(&fake->lock);
    job_t *again = add_job("alice", 10, 0);
    strcpy(again->idempotency_key, "key-1");
    reply_box_t replay;
    submit(&replay, &again, 1);
    ck_assert(replay.replayed);
    ck_assert_str_eq(replay.ids[0], box.ids[0]);
    pthread_mutex_lock(&fake->lock);
    ck_assert_int_eq(fake->n_got, went_out);
    pthread_mutex_unlock(&fake->lock);
}
END_TEST

/* A job of owner on n elements that goes out in a batch of its own. */
static job_t *lone_job(const char *owner, int n)
{
    job_t *job = add_job(owner, n, 0);
    job->call.batch_key[0] = '\0';
    return job;
}

static size_t stored_jobs(void)
{
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    store_list_query_t q = {.state = -1, .limit = 1000};
    job_t **jobs = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_jobs_list(rd, &q, &jobs, &n), 0);
    for (size_t i = 0; i < n; i++)
        job_free(jobs[i]);
    free(jobs);
    store_reader_close(rd);
    return n;
}

/* No file may grow past the size of the WAL named name now (a soft limit, until
 * wal_limit_lift): the next commit cannot append to that WAL. Returns that size. */
static off_t wal_limit(const char *name, struct rlimit *saved)
{
    char wal[PATH_MAX];
    snprintf(wal, sizeof wal, "%s/%s", state_dir, name);
    struct stat ws;
    ck_assert_int_eq(stat(wal, &ws), 0);
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, saved), 0);
    struct rlimit lim = {.rlim_cur = (rlim_t)ws.st_size, .rlim_max = saved->rlim_max};
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    return ws.st_size;
}

static void wal_limit_lift(const struct rlimit *saved)
{
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, saved), 0);
    signal(SIGXFSZ, SIG_DFL);
}

START_TEST(test_a_failed_commit_takes_back_the_jobs_it_started)
{
    fake->slots = 0;
    job_t *older = lone_job("alice", 10);
    reply_box_t first;
    submit(&first, &older, 1);

    /* The next commit cannot append to the WAL, after its jobs have gone out. */
    struct rlimit saved;
    off_t wal_size = wal_limit("gpujobd.db-wal", &saved);
    fake->slots = 2;
    /* Inputs past store.inline_blob_bytes go to files of their own (which the limit lets
     * through), and a job that went out reads them still. */
    enum { LARGE = 20000 };
    ck_assert_int_gt(wal_size, LARGE * 4);
    ck_assert_int_gt(LARGE * 4, cfg.inline_blob_bytes);
    ck_assert_int_eq(blob_files(), 0);
    job_t *jobs[2] = {lone_job("alice", LARGE), lone_job("bob", LARGE)};
    reply_box_t failed;
    submit_any(&failed, jobs, 2);
    wal_limit_lift(&saved);
    ck_assert_int_eq(failed.err, -EIO);

    /* Out went alice's older job and bob's new one; alice's new one left the queue. */
    ck_assert_int_eq(failed.batches_started, 2);
    ck_assert_str_eq(fake->got[0]->jobs[0]->id, first.ids[0]);
    sched_stats_t stats;
    sched_get_stats(sched, &stats);
    ck_assert_int_eq(stats.queued, 0);
    ck_assert_int_eq(stats.running, 2);
    ck_assert_int_eq(stats.submitted_total, 1);
    ck_assert_int_eq(blob_files(), 2); /* bob's, until his launch returns */

    /* Both end: the older job as any other, bob's with its result thrown away. */
    fake_complete(fake, 0);
    fake_complete(fake, 1);
    ck_assert_int_eq(ended_state("alice", first.ids[0]), JOB_SUCCEEDED);
    for (int i = 0; i < 100 && stats.running > 0; i++) {
        usleep(10 * 1000);
        sched_get_stats(sched, &stats);
    }
    ck_assert_int_eq(stats.running, 0);
    ck_assert_int_eq(stats.succeeded_total, 1);
    ck_assert_int_eq(stored_state(first.ids[0]), JOB_SUCCEEDED);
    ck_assert_uint_eq(stored_jobs(), 1);
    ck_assert_int_eq(blob_files(), 0);

    /* Nothing of the failed submission is left to go out. */
    job_t *next = lone_job("carol", 10);
    reply_box_t last;
    submit(&last, &next, 1);
    fake_wait_batches(fake, 3);
    usleep(20 * 1000);
    ck_assert_int_eq(fake->n_got, 3);
    ck_assert_str_eq(fake->got[2]->jobs[0]->id, last.ids[0]);
}
END_TEST

/* Posts a waited submission of job (taken), answered in box (box_wait). */
static void submit_waited_post(reply_box_t *box, job_t *job, int wait_ms)
{
    job_t **arr = calloc(1, sizeof *arr);
    arr[0] = job;
    box_init(box);
    sched_submit_waited(sched, arr, 1, wait_ms, on_reply, box);
}

/* A wait of 0 ms on owner's job id: once answered, the loop has ended every wake before the
 * one that took it. The state the loop answered with. */
static job_state_t loop_round_trip(const char *owner, const char *id)
{
    return waited_state(owner, id, 0);
}

/* A waited job goes out before its row is written, in the same wake of the loop: once that
 * wake is over, the store holds it, running, for whoever reads it while it runs. Its answer
 * carries its success, handed over while its end was being committed (with the gate that
 * holds it back until then); once that wake is over, the store says succeeded too, with the
 * output. */
START_TEST(test_a_waited_jobs_row_exists_while_it_runs_and_holds_its_end_after_the_answer)
{
    fake->slots = 1;
    reply_box_t box;
    submit_waited_post(&box, lone_job("alice", 10), 5000);
    fake_wait_batches(fake, 1);
    ck_assert_int_eq(fake->n_got, 1);
    char id[ID_SIZE];
    snprintf(id, sizeof id, "%s", fake->got[0]->jobs[0]->id);
    ck_assert_int_eq(loop_round_trip("alice", id), JOB_RUNNING);
    ck_assert_int_eq(stored_state(id), JOB_RUNNING);
    pthread_mutex_lock(&box.lock);
    ck_assert(!box.done);
    pthread_mutex_unlock(&box.lock);

    fake_complete(fake, 0);
    box_wait(&box);
    ck_assert_int_eq(box.err, 0);
    ck_assert_str_eq(box.ids[0], id);
    ck_assert_int_eq(box.states[0], JOB_SUCCEEDED);
    ck_assert(box.gated);
    ck_assert_int_eq(loop_round_trip("alice", id), JOB_SUCCEEDED);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(rd, id, &job), 0);
    ck_assert_int_eq(job->state, JOB_SUCCEEDED);
    ck_assert_uint_eq(job->out[0].nbytes, 10 * sizeof(float));
    void *bytes = NULL;
    ck_assert_int_eq(store_blob_read(rd, job->out[0].blob, job->out[0].nbytes, &bytes), 0);
    free(bytes);
    job_free(job);
    store_reader_close(rd);
    sched_stats_t stats;
    sched_get_stats(sched, &stats);
    ck_assert_int_eq(stats.succeeded_total, 1); /* counted once, at its early answer */
}
END_TEST

/* A waited job whose group commit fails after it went out is answered with the error, not
 * its result; its result is thrown away when its launch returns and it leaves no row. */
START_TEST(test_a_waited_job_whose_commit_fails_after_it_went_out_leaves_nothing)
{
    fake->slots = 2;
    job_t *older = lone_job("alice", 10);
    reply_box_t first;
    submit(&first, &older, 1);
    fake_wait_batches(fake, 1);
    fake_complete(fake, 0);
    ck_assert_int_eq(ended_state("alice", first.ids[0]), JOB_SUCCEEDED);

    struct rlimit saved;
    wal_limit("gpujobd.db-wal", &saved);
    reply_box_t box;
    submit_waited_post(&box, lone_job("bob", 10), 5000);
    box_wait(&box);
    wal_limit_lift(&saved);
    ck_assert_int_eq(box.err, -EIO);
    fake_wait_batches(fake, 2);
    ck_assert_int_eq(fake->n_got, 2);
    fake_complete(fake, 1);
    sched_stats_t stats;
    sched_get_stats(sched, &stats);
    for (int i = 0; i < 100 && stats.running > 0; i++) {
        usleep(10 * 1000);
        sched_get_stats(sched, &stats);
    }
    ck_assert_int_eq(stats.running, 0);
    ck_assert_int_eq(stats.succeeded_total, 1);
    ck_assert_uint_eq(stored_jobs(), 1);
}
END_TEST

/* The job of box b ends succeeded, and its row says so, with the one start it had. */
static void assert_ended_once(const reply_box_t *b)
{
    ck_assert_int_eq(ended_state("bob", b->ids[0]), JOB_SUCCEEDED);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, b->ids[0], &stored), 0);
    ck_assert_int_eq(stored->state, JOB_SUCCEEDED);
    ck_assert_int_eq(stored->attempts, 1);
    ck_assert_int_ge(stored->started_us, stored->created_us);
    job_free(stored);
    store_reader_close(rd);
}

/* A completion's ends and the starts it lets out are one transaction, and the new batch goes
 * out before its commit: when that commit fails, the job still runs, and its end records the
 * start that was lost. */
START_TEST(test_a_start_lost_with_a_completions_commit_is_recorded_at_its_end)
{
    fake->slots = 1;
    job_t *first = lone_job("alice", 10), *second = lone_job("bob", 10);
    reply_box_t a, b;
    submit(&a, &first, 1);
    submit(&b, &second, 1);
    fake_wait_batches(fake, 1);
    ck_assert_int_eq(stored_state(b.ids[0]), JOB_QUEUED);

    /* No commit can succeed until the limit is lifted. */
    struct rlimit saved;
    wal_limit("gpujobd.db-wal", &saved);
    fake_complete(fake, 0);
    ended_state("alice", a.ids[0]); /* answered once the completion has been handled */
    wal_limit_lift(&saved);

    pthread_mutex_lock(&fake->lock);
    ck_assert_int_eq(fake->n_got, 2);
    ck_assert_str_eq(fake->got[1]->jobs[0]->id, b.ids[0]);
    pthread_mutex_unlock(&fake->lock);
    ck_assert_int_eq(stored_state(b.ids[0]), JOB_QUEUED);
    fake_complete(fake, 1);
    assert_ended_once(&b);
}
END_TEST

/* When a completion's transaction fails before its cut (here its outputs cannot be written to
 * the segment), the jobs waiting for the freed slot go out in a transaction of their own, not
 * failed for want of a recorded start. */
START_TEST(test_queued_jobs_go_out_after_a_completion_whose_outputs_cannot_be_placed)
{
    fake->slots = 1;
    /* 16 jobs of one batch with 64 KiB outputs each: 1 MiB, which the size limit below keeps
     * out of every file. */
    enum { N = 16, ELEMS = 16384 };
    job_t *jobs[N];
    for (int i = 0; i < N; i++)
        jobs[i] = add_job("alice", ELEMS, 0);
    job_t *second = lone_job("bob", 10);
    reply_box_t a, b;
    submit(&a, jobs, N);
    submit(&b, &second, 1);
    fake_wait_batches(fake, 1);
    pthread_mutex_lock(&fake->lock);
    ck_assert_int_eq(fake->got[0]->n, N);
    pthread_mutex_unlock(&fake->lock);

    struct rlimit saved;
    ck_assert_int_lt(wal_limit("gpujobd.db-wal", &saved), N * ELEMS * 4);
    fake_complete(fake, 0);
    ended_state("alice", a.ids[0]); /* answered once the completion has been handled */
    fake_wait_batches(fake, 2);
    wal_limit_lift(&saved);

    pthread_mutex_lock(&fake->lock);
    ck_assert_int_eq(fake->n_got, 2);
    ck_assert_str_eq(fake->got[1]->jobs[0]->id, b.ids[0]);
    pthread_mutex_unlock(&fake->lock);
    fake_complete(fake, 1);
    assert_ended_once(&b);
}
END_TEST

/* When the store refuses a success's row (here a trigger, as a constraint or a full disk would
 * in the end's own statement), the job ends failed with the reason, its output file goes, and
 * the failure is what the store keeps, while the round's other writes stand: a job that starts
 * in it is stored running. On one shard the refusal is the end's write's own; on two, the end
 * is one of the round's deferred writes and the refusal comes back through store_flush. */
START_TEST(test_a_success_the_store_refuses_ends_failed_without_its_outputs)
{
    fake->slots = 1;
    enum { ELEMS = 20000 }; /* 80 KB tensors: files of their own */
    job_t *job = add_job("alice", ELEMS, 0);
    reply_box_t a, b;
    submit(&a, &job, 1);
    fake_wait_batches(fake, 1);
    ck_assert_int_eq(blob_files(), 2); /* the inputs */
    job_t *next = lone_job("bob", 4);  /* waits for a's slot: starts in the round that ends a */
    submit(&b, &next, 1);

    const char *sql = "CREATE TRIGGER refuse_success BEFORE UPDATE ON jobs "
                      "WHEN NEW.state = 'succeeded' "
                      "BEGIN SELECT RAISE(ABORT, 'injected refusal'); END";
    char path[PATH_MAX];
    int k = store_id_shard(a.ids[0], store_shards(st));
    if (k == 0)
        snprintf(path, sizeof path, "%s/gpujobd.db", state_dir);
    else
        snprintf(path, sizeof path, "%s/gpujobd-%d.db", state_dir, k);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    fake_complete(fake, 0);
    ck_assert_int_eq(ended_state("alice", a.ids[0]), JOB_FAILED);
    ck_assert_int_eq(blob_files(), 2); /* the output's file went */
    fake_wait_batches(fake, 2);
    ck_assert_int_eq(stored_state(b.ids[0]), JOB_RUNNING);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, a.ids[0], &stored), 0);
    ck_assert_int_eq(job_resolve_op(stored), 0);
    ck_assert_int_eq(stored->state, JOB_FAILED);
    ck_assert_str_eq(stored->error_code, "store_failed");
    ck_assert_int_eq(stored->call.n_out, 1);
    ck_assert_ptr_null(stored->out[0].blob);
    job_free(stored);
    store_reader_close(rd);
}
END_TEST

/* The shards of the ids in a box's answer, as a mask. */
static unsigned answer_shards(const reply_box_t *b)
{
    unsigned mask = 0;
    for (size_t i = 0; i < b->n; i++)
        mask |= 1u << store_id_shard(b->ids[i], 4);
    return mask;
}

/* On a store of four shards (the fixture's, whose group commit waits 200 ms for company): the
 * submissions of a round of few jobs go to one shard, those of a round of many to different
 * ones, and every job is found where its id says. */
START_TEST(test_a_round_of_few_jobs_goes_to_one_shard_and_a_round_of_many_is_spread)
{
    enum { FEW = 3, MANY = 4, BIG = 40 };
    reply_box_t few[FEW], many[MANY];
    for (int i = 0; i < FEW; i++) {
        job_t **jobs = calloc(2, sizeof *jobs);
        jobs[0] = add_job("alice", 4, 0);
        jobs[1] = add_job("alice", 4, 0);
        box_init(&few[i]);
        sched_submit(sched, jobs, 2, on_reply, &few[i]);
    }
    unsigned mask = 0;
    for (int i = 0; i < FEW; i++) {
        box_wait(&few[i]);
        ck_assert_int_eq(few[i].err, 0);
        mask |= answer_shards(&few[i]);
    }
    ck_assert_int_eq(__builtin_popcount(mask), 1);

    for (int i = 0; i < MANY; i++) {
        job_t **jobs = calloc(BIG, sizeof *jobs);
        for (int j = 0; j < BIG; j++)
            jobs[j] = add_job("bob", 4, 0);
        box_init(&many[i]);
        sched_submit(sched, jobs, BIG, on_reply, &many[i]);
    }
    mask = 0;
    for (int i = 0; i < MANY; i++) {
        box_wait(&many[i]);
        ck_assert_int_eq(many[i].err, 0);
        ck_assert_uint_eq(many[i].n, BIG);
        unsigned one = answer_shards(&many[i]);
        ck_assert_int_eq(__builtin_popcount(one), 1); /* a submission stays in one shard */
        mask |= one;
    }
    ck_assert_uint_eq(mask, 0xf);
    for (int i = 0; i < MANY; i++) /* found through the shard its id names */
        ck_assert_int_ne(stored_state(many[i].ids[BIG - 1]), JOB_FAILED);
}
END_TEST

static off_t state_file_size(const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", state_dir, name);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    return sb.st_size;
}

/* Fills shard 1's WAL past shard 0's (rounds of few jobs take turns: the first went to shard 0,
 * this one goes to 1), so that a limit at its size stops shard 1's next commit and not shard
 * 0's. first is one of its jobs; box gets the answer. */
static void grow_shard_one(reply_box_t *box, job_t *first)
{
    job_t *many[61];
    many[0] = first;
    for (int i = 1; i < 61; i++)
        many[i] = lone_job("filler", 100);
    submit(box, many, 61);
    ck_assert_int_eq(store_id_shard(box->ids[0], 2), 1);
    ck_assert_int_gt(state_file_size("gpujobd-1.db-wal"),
                     state_file_size("gpujobd.db-wal") + 16384);
}

/* Two shards (the fixture's, with a 1 s group commit and inputs of over 1 KiB in files of
 * their own). A group commit that fails in shard 1 keeps what shard 0 committed: its
 * submission is answered as accepted and queued, with its input file, and only shard 1's
 * fails. */
START_TEST(test_a_commit_that_fails_in_one_shard_keeps_what_another_committed)
{
    fake->slots = 0;
    reply_box_t r0, r1;
    job_t *tiny = lone_job("alice", 4);
    submit(&r0, &tiny, 1);
    ck_assert_int_eq(store_id_shard(r0.ids[0], 2), 0);
    grow_shard_one(&r1, lone_job("filler", 100));

    /* One round: a keyed job (shard 0) with an 8 KiB input, and an array of 64 that goes to the
     * shard with fewer of the round's jobs, 1. */
    job_t **keyed = calloc(1, sizeof *keyed);
    keyed[0] = lone_job("bob", 2048);
    snprintf(keyed[0]->idempotency_key, sizeof keyed[0]->idempotency_key, "k1");
    job_t **array = calloc(64, sizeof *array);
    for (int i = 0; i < 64; i++)
        array[i] = lone_job("carol", 4);
    reply_box_t a, b;
    box_init(&a);
    box_init(&b);
    struct rlimit saved;
    wal_limit("gpujobd-1.db-wal", &saved);
    sched_submit(sched, keyed, 1, on_reply, &a);
    sched_submit(sched, array, 64, on_reply, &b);
    box_wait(&a);
    box_wait(&b);
    wal_limit_lift(&saved);
    ck_assert_int_eq(a.err, 0);
    ck_assert_int_eq(store_id_shard(a.ids[0], 2), 0);
    ck_assert_int_eq(b.err, -EIO);
    ck_assert_int_eq(stored_state(a.ids[0]), JOB_QUEUED);

    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), 0);
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(rd, a.ids[0], &job), 0);
    void *data = NULL;
    ck_assert_int_eq(store_blob_read(rd, job->in[0].blob, job->in[0].nbytes, &data), 0);
    free(data);
    job_free(job);
    store_list_query_t q = {.owner = "carol", .state = -1, .limit = 100};
    job_t **rows = NULL;
    size_t n = 9;
    ck_assert_int_eq(store_jobs_list(rd, &q, &rows, &n), 0);
    ck_assert_uint_eq(n, 0);
    free(rows);
    store_reader_close(rd);
}
END_TEST

/* A round of ends that commits in shard 0 and fails in shard 1: the end shard 0 committed is
 * the one its waiter hears, not recorded again; the end shard 1 refused takes the file of its
 * job's output along (the jobs' 1,600-byte tensors are files of their own). */
START_TEST(test_an_end_committed_in_one_shard_is_answered_as_stored)
{
    fake->slots = 0;
    reply_box_t r0, r1, r2;
    job_t *a = add_job("alice", 400, 0);
    submit(&r0, &a, 1);
    ck_assert_int_eq(store_id_shard(r0.ids[0], 2), 0);
    grow_shard_one(&r1, add_job("alice", 400, 0)); /* the same batch key as a */
    fake->slots = 1;
    job_t *z = lone_job("zed", 4);
    submit(&r2, &z, 1); /* the next dispatch sends a and its twin in shard 1 together */
    fake_wait_batches(fake, 1);
    ck_assert_int_eq(fake->got[0]->n, 2);
    ck_assert_int_eq(blob_files(), 4); /* the two jobs' inputs */

    reply_box_t wa;
    box_init(&wa);
    sched_wait(sched, "alice", r0.ids[0], 5000, on_reply, &wa);
    struct rlimit saved;
    wal_limit("gpujobd-1.db-wal", &saved);
    fake_complete(fake, 0);
    box_wait(&wa);
    wal_limit_lift(&saved);
    ck_assert_int_eq(wa.err, 0);
    ck_assert_int_eq(wa.states[0], JOB_SUCCEEDED);
    ck_assert_int_eq(stored_state(r0.ids[0]), JOB_SUCCEEDED);
    ck_assert_int_eq(blob_files(), 5); /* and a's output */
}
END_TEST

static void start_sched_limited(void)
{
    setup(false);
    cfg.max_queued_per_user = 5;
    cfg.max_resident_bytes_per_user = 100;
    cfg.commit_delay_us = 200 * 1000;
    policy_apply();
    ck_assert_int_eq(sched_start(sched), 0);
}

/* The per-user gauges of /metrics: users with jobs, most queued first, then by name, at most
 * SCHED_USER_GAUGES_MAX of them, while users_with_jobs counts them all, the one whose job
 * runs included. */
START_TEST(test_user_gauges_keep_the_users_with_most_queued_up_to_the_cap)
{
    cfg.max_batch = 1;
    fake->slots = 1;
    reply_box_t box;
    submit_many(&box, "runner", 1, 10);
    ck_assert_int_eq(fake_wait_jobs(fake, 1), 1);
    submit_many(&box, "heavy", 5, 10);
    submit_many(&box, "middle", 3, 10);
    for (int i = 0; i < SCHED_USER_GAUGES_MAX; i++) {
        char owner[16];
        snprintf(owner, sizeof owner, "u%03d", i);
        submit_many(&box, owner, 1, 10);
    }
    const long users = SCHED_USER_GAUGES_MAX + 3;
    sched_user_gauge_t rows[SCHED_USER_GAUGES_MAX + 1];
    long seen = 0;
    int n = 0;
    /* The loop publishes every SCHED_USER_GAUGES_MS: wait for a reading with every user. */
    for (int i = 0; i < 500 && seen != users; i++) {
        usleep(10 * 1000);
        n = sched_get_user_gauges(sched, rows, SCHED_USER_GAUGES_MAX + 1, &seen);
    }
    ck_assert_int_eq(seen, users);
    ck_assert_int_eq(n, SCHED_USER_GAUGES_MAX);
    ck_assert_str_eq(rows[0].user, "heavy");
    ck_assert_int_eq(rows[0].queued, 5);
    ck_assert_int_eq(rows[0].running, 0);
    ck_assert_str_eq(rows[1].user, "middle");
    ck_assert_int_eq(rows[1].queued, 3);
    ck_assert_str_eq(rows[2].user, "u000");
    ck_assert_str_eq(rows[SCHED_USER_GAUGES_MAX - 1].user, "u097");
    ck_assert_int_eq(rows[SCHED_USER_GAUGES_MAX - 1].queued, 1);
    for (int i = 0; i < n; i++)
        ck_assert_str_ne(rows[i].user, "runner"); /* running only: past the cap */
    /* A caller's smaller array gets the first rows. */
    ck_assert_int_eq(sched_get_user_gauges(sched, rows, 2, &seen), 2);
    ck_assert_str_eq(rows[1].user, "middle");
}
END_TEST

static void start_sched(void)
{
    setup(false);
    ck_assert_int_eq(sched_start(sched), 0);
}

static void start_sched_two_shards(void)
{
    setup_shards = 2;
    setup_inline_bytes = 1024;
    setup(false);
    setup_shards = 1;
    setup_inline_bytes = 0;
    cfg.commit_delay_us = 1000 * 1000; /* so that a test's submissions share a round */
    ck_assert_int_eq(sched_start(sched), 0);
}

static void start_sched_sharded(void)
{
    setup_shards = 4;
    setup(true);
    setup_shards = 1;
    cfg.commit_delay_us = 200 * 1000;
    ck_assert_int_eq(sched_start(sched), 0);
}

/* A watchdog that gives up on a batch after 100 ms (jobs of the tests cost next to nothing). */
static void start_sched_watchdog(void)
{
    setup(false);
    cfg.watchdog_min_ms = 100;
    ck_assert_int_eq(sched_start(sched), 0);
}

static void start_sched_durable(void)
{
    setup(true);
    ck_assert_int_eq(sched_start(sched), 0);
}

int main(void)
{
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("sched");
    tcase_add_checked_fixture(tc, start_sched, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_jobs_with_equal_batch_keys_go_out_as_one_batch);
    tcase_add_test(tc, test_max_batch_caps_batch_size);
    tcase_add_test(tc, test_fair_share_serves_a_small_user_before_a_big_backlog_drains);
    tcase_add_test(tc, test_fair_share_usage_survives_a_restart_decayed_over_the_downtime);
    tcase_add_test(tc, test_a_user_heavy_before_a_restart_is_served_after_a_light_one);
    tcase_add_test(tc, test_fair_share_gives_a_user_of_weight_3_three_times_the_share);
    tcase_add_test(tc, test_a_small_user_waits_for_fair_share_at_a_shrinking_position);
    tcase_add_test(tc, test_a_job_held_by_its_users_running_limit_names_the_limit);
    tcase_add_test(tc, test_batches_given_back_by_a_device_reset_run_again_while_attempts_remain);
    tcase_add_test(tc, test_batches_keep_each_user_within_the_running_limit);
    tcase_add_test(tc, test_a_job_pinned_to_a_full_device_waits_and_holds_back_nothing);
    tcase_add_test(tc, test_jobs_going_around_a_waiting_one_leave_it_a_running_slot);
    tcase_add_test(tc, test_a_submissions_answer_says_why_its_queued_jobs_wait);
    tcase_add_test(tc, test_jobs_explained_together_agree_with_each_explained_alone);
    tcase_add_test(tc, test_priority_orders_one_users_queue);
    tcase_add_test(tc, test_cancel_queued_job_never_runs);
    tcase_add_test(tc, test_cancel_running_job_asks_the_executor_and_keeps_its_batch_mates);
    tcase_add_test(tc, test_other_users_cannot_see_or_cancel_a_job);
    tcase_add_test(tc, test_deadline_fails_a_job_left_queued);
    tcase_add_test(tc, test_wait_times_out_with_the_current_state);
    tcase_add_test(tc, test_idempotent_resubmission_returns_the_first_job);
    tcase_add_test(tc, test_queued_jobs_survive_a_stop_and_run_after_restart);
    tcase_add_test(tc, test_submissions_after_stop_answer_shutdown);
    tcase_add_test(tc, test_a_long_queue_keeps_its_jobs_in_the_store_until_they_start);
    tcase_add_test(tc, test_a_batch_the_executor_turns_down_goes_back_to_its_queue);
    tcase_add_test(tc, test_without_sync_full_a_submission_starts_before_its_commit_is_answered);
    tcase_add_test(tc, test_keyed_and_plain_jobs_started_in_their_round_are_stored_running);
    tcase_add_test(tc, test_a_failed_commit_takes_back_the_jobs_it_started);
    tcase_add_test(tc, test_a_start_lost_with_a_completions_commit_is_recorded_at_its_end);
    tcase_add_test(tc, test_queued_jobs_go_out_after_a_completion_whose_outputs_cannot_be_placed);
    tcase_add_test(tc, test_a_success_the_store_refuses_ends_failed_without_its_outputs);
    tcase_add_test(tc, test_user_gauges_keep_the_users_with_most_queued_up_to_the_cap);
    suite_add_tcase(s, tc);
    /* The daemon's default: answers wait for the commit syncer. */
    TCase *durable = tcase_create("durable");
    tcase_add_checked_fixture(durable, start_sched_durable, teardown);
    tcase_set_timeout(durable, 30);
    tcase_add_test(durable, test_a_durable_submission_starts_running_before_it_is_answered);
    tcase_add_test(durable, test_a_failed_sync_fails_its_answer_and_refuses_what_follows);
    tcase_add_test(durable, test_jobs_with_equal_batch_keys_go_out_as_one_batch);
    tcase_add_test(durable, test_idempotent_resubmission_returns_the_first_job);
    tcase_add_test(durable, test_queued_jobs_survive_a_stop_and_run_after_restart);
    tcase_add_test(durable, test_submissions_after_stop_answer_shutdown);
    tcase_add_test(durable, test_a_batch_the_executor_turns_down_goes_back_to_its_queue);
    tcase_add_test(durable, test_cancel_queued_job_never_runs);
    tcase_add_test(durable,
                   test_a_waited_jobs_row_exists_while_it_runs_and_holds_its_end_after_the_answer);
    tcase_add_test(durable, test_a_waited_job_whose_commit_fails_after_it_went_out_leaves_nothing);
    suite_add_tcase(s, durable);
    TCase *watchdog = tcase_create("watchdog");
    tcase_add_checked_fixture(watchdog, start_sched_watchdog, teardown);
    tcase_set_timeout(watchdog, 30);
    tcase_add_test(watchdog,
                   test_watchdog_bound_grows_with_the_batch_cost_and_never_falls_below_the_minimum);
    tcase_add_test(watchdog, test_watchdog_fails_a_stuck_batch_and_ignores_its_late_result);
    suite_add_tcase(s, watchdog);
    TCase *limited = tcase_create("limits");
    tcase_add_checked_fixture(limited, start_sched_limited, teardown);
    tcase_set_timeout(limited, 30);
    tcase_add_test(limited, test_queued_limit_counts_submissions_waiting_for_their_commit);
    tcase_add_test(limited, test_resident_buffers_of_one_commit_add_up_against_the_quota);
    suite_add_tcase(s, limited);
    TCase *sharded = tcase_create("sharded");
    tcase_add_checked_fixture(sharded, start_sched_sharded, teardown);
    tcase_set_timeout(sharded, 30);
    tcase_add_test(sharded,
                   test_a_round_of_few_jobs_goes_to_one_shard_and_a_round_of_many_is_spread);
    suite_add_tcase(s, sharded);
    TCase *two = tcase_create("two shards");
    tcase_add_checked_fixture(two, start_sched_two_shards, teardown);
    tcase_set_timeout(two, 30);
    tcase_add_test(two, test_a_commit_that_fails_in_one_shard_keeps_what_another_committed);
    tcase_add_test(two, test_an_end_committed_in_one_shard_is_answered_as_stored);
    tcase_add_test(two, test_a_success_the_store_refuses_ends_failed_without_its_outputs);
    suite_add_tcase(s, two);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
