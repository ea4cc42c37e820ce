/* The durable store's per-owner accounting (daemon/store/store.h): the usage rollup that follows
 * job ends and outlives retention, the usage counts per owner, and the fair-share state kept
 * across a reopen. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/store.h"
#include "support/run_suite.h"
#include "support/store_test.h"

/* The usage rollup of (owner, day, op) is written with each job's end and sums what the jobs
 * recorded: with one shard and with four (each job's end writes its shard's rollup; reads sum
 * them). A refused change adds nothing. Then retention and the store's bound delete every job,
 * and the rollup stays as it was. */
static void assert_rollup(store_test_t *f, const char *owner, int64_t jobs, int64_t succeeded,
                          int64_t run_us, int64_t gpu_ns, int64_t bytes_out)
{
    store_usage_query_t q = {
        .owner = owner, .since_day = 0, .until_day = INT64_MAX / 2, .max_rows = 100};
    store_usage_row_t *rows = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_usage_rollup(f->rd, &q, &rows, &n), 0);
    store_usage_row_t sum = {.jobs = 0};
    for (size_t i = 0; i < n; i++) {
        if (owner) ck_assert_str_eq(rows[i].owner, owner);
        ck_assert_str_eq(rows[i].op, store_test_op.name);
        sum.jobs += rows[i].jobs;
        sum.succeeded += rows[i].succeeded;
        sum.run_us += rows[i].run_us;
        sum.gpu_ns += rows[i].gpu_ns;
        sum.bytes_out += rows[i].bytes_out;
    }
    /* One row per owner: the jobs ended within the same day, whichever shard they are in. */
    ck_assert_uint_eq(n, owner ? 1 : 2);
    ck_assert_int_eq(sum.jobs, jobs);
    ck_assert_int_eq(sum.succeeded, succeeded);
    ck_assert_int_eq(sum.run_us, run_us);
    ck_assert_int_eq(sum.gpu_ns, gpu_ns);
    ck_assert_int_eq(sum.bytes_out, bytes_out);
    free(rows);
}

START_TEST(test_usage_rollup_follows_job_ends_and_outlives_retention)
{
    static const int shard_counts[] = {1, 4};
    store_test_t f;
    store_test_setup_shards(&f, 1 << 20, shard_counts[_i]);
    /* Noon of one day: every end below falls on it. */
    int64_t day = now_us() / (86400 * INT64_C(1000000));
    int64_t noon = day * 86400 * INT64_C(1000000) + 43200 * INT64_C(1000000);
    int64_t run_us[2] = {0}, gpu_ns[2] = {0}, jobs[2] = {0}, ok[2] = {0}, out_bytes[2] = {0};
    const char *owners[2] = {"alice", "bob"};
    for (int i = 0; i < 24; i++) {
        int o = i % 3 == 0; /* a third bob's */
        char id[ID_SIZE];
        store_test_insert_small(&f, &store_test_op, owners[o], noon - 5000, id);
        ck_assert_int_eq(store_test_set_state(&f, id, JOB_RUNNING), 0);
        job_t *job = store_test_get_job(&f, id);
        ck_assert_int_eq(job_resolve_op(job), 0);
        job->started_us = noon + i;
        job->finished_us = noon + i + 100 * (i + 1);
        job->gpu_ns = 7000 * (i + 1);
        job->state = i % 4 == 3 ? JOB_FAILED : JOB_SUCCEEDED;
        if (job->state == JOB_SUCCEEDED) {
            job->call.n_out = 1;
            job->call.out_names[0] = "out";
            store_test_tensor_set(&job->out[0], "out", 4, 1);
            out_bytes[o] += 16;
            ok[o]++;
        }
        ck_assert_int_eq(store_job_update(f.st, job), 0);
        /* A refused change leaves the rollup alone. */
        job->state = JOB_CANCELLED;
        ck_assert_int_eq(store_job_update(f.st, job), -EBUSY);
        jobs[o]++;
        run_us[o] += 100 * (i + 1);
        gpu_ns[o] += 7000 * (i + 1);
        job_free(job);
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int o = 0; o < 2; o++)
            assert_rollup(&f, owners[o], jobs[o], ok[o], run_us[o], gpu_ns[o], out_bytes[o]);
        assert_rollup(&f, NULL, jobs[0] + jobs[1], ok[0] + ok[1], run_us[0] + run_us[1],
                      gpu_ns[0] + gpu_ns[1], out_bytes[0] + out_bytes[1]);
        store_usage_t u;
        ck_assert_int_eq(store_usage_get(f.rd, "alice", &u), 0);
        ck_assert_int_eq(u.jobs_by_state[JOB_SUCCEEDED], ok[0]);
        ck_assert_int_eq(u.gpu_ns, gpu_ns[0]);
        if (pass == 1) break;
        /* The store's bound expires outputs and deletes jobs; retention deletes the rest. */
        store_trim_stats_t ts;
        ck_assert_int_eq(store_trim(f.st, 1, INT64_MAX, &ts), 0);
        ck_assert_int_gt(ts.deleted_jobs + ts.expired_jobs, 0);
        int deleted = 0;
        ck_assert_int_eq(store_gc(f.st, INT64_MAX, &deleted), 0);
        ck_assert_int_eq(store_test_db_int(&f, "SELECT count(*) FROM jobs"), 0);
        store_test_reopen(&f);
    }
    /* A range that leaves the day out has no rows. */
    store_usage_query_t q = {
        .owner = NULL, .since_day = day + 1, .until_day = day + 9, .max_rows = 100};
    store_usage_row_t *rows = NULL;
    size_t n = 5;
    ck_assert_int_eq(store_usage_rollup(f.rd, &q, &rows, &n), 0);
    ck_assert_uint_eq(n, 0);
    free(rows);
    /* Past max_rows: -E2BIG, nothing handed back. */
    q = (store_usage_query_t){.since_day = day, .until_day = day, .max_rows = 1};
    ck_assert_int_eq(store_usage_rollup(f.rd, &q, &rows, &n), -E2BIG);
    store_test_teardown(&f);
}
END_TEST

/* A running job of owner's, read back to be ended at finished_us. */
static job_t *running_job(store_test_t *f, const char *owner, int64_t started_us)
{
    char id[ID_SIZE];
    store_test_insert_small(f, &store_test_op, owner, started_us - 5000, id);
    ck_assert_int_eq(store_test_set_state(f, id, JOB_RUNNING), 0);
    job_t *job = store_test_get_job(f, id);
    ck_assert_int_eq(job_resolve_op(job), 0);
    job->started_us = started_us;
    return job;
}

/* Ends recorded inside a transaction add to the rollup when it commits, summed per owner, day
 * and op, and not at all when it is rolled back (their rows say running again), then or at the
 * next commit; a change the
 * transaction refuses adds nothing. With one shard and with four, whose commits each write
 * their own jobs' sums. */
START_TEST(test_usage_rollup_sums_a_transactions_ends_and_drops_a_rolled_back_ones)
{
    static const int shard_counts[] = {1, 4};
    store_test_t f;
    store_test_setup_shards(&f, 1 << 20, shard_counts[_i]);
    int64_t day = now_us() / (86400 * INT64_C(1000000));
    int64_t noon = day * 86400 * INT64_C(1000000) + 43200 * INT64_C(1000000);
    const char *owners[2] = {"alice", "bob"};
    int64_t jobs[2] = {0}, run_us[2] = {0}, gpu_ns[2] = {0};
    /* The commit after the rollback would show sums the rollback left behind. */
    for (int round = 0; round < 3; round++) {
        bool commit = round != 1;
        job_t *ended[12];
        for (int i = 0; i < 12; i++)
            ended[i] = running_job(&f, owners[i % 3 == 0], noon + i);
        ck_assert_int_eq(store_begin_relaxed(f.st), 0);
        for (int i = 0; i < 12; i++) {
            int o = i % 3 == 0;
            job_t *job = ended[i];
            job->finished_us = noon + i + 10 * (i + 1);
            job->gpu_ns = 300 * (i + 1);
            job->state = JOB_FAILED;
            ck_assert_int_eq(store_job_update(f.st, job), 0);
            job->state = JOB_CANCELLED;
            ck_assert_int_eq(store_job_update(f.st, job), -EBUSY);
            if (!commit) continue;
            jobs[o]++;
            run_us[o] += 10 * (i + 1);
            gpu_ns[o] += 300 * (i + 1);
        }
        if (commit)
            ck_assert_int_eq(store_commit(f.st), 0);
        else
            ck_assert_int_eq(store_rollback(f.st), 0);
        for (int i = 0; i < 12; i++) {
            job_t *back = store_test_get_job(&f, ended[i]->id);
            ck_assert_int_eq(back->state, commit ? JOB_FAILED : JOB_RUNNING);
            job_free(back);
            job_free(ended[i]);
        }
        for (int o = 0; o < 2; o++)
            assert_rollup(&f, owners[o], jobs[o], 0, run_us[o], gpu_ns[o], 0);
    }
    store_test_teardown(&f);
}
END_TEST

/* The fair-share state saved is the state loaded, across a store_test_reopen, and a save replaces
 * it. */
/* A charge after a job's end (store_job_charge) reaches its record and its line of the rollup;
 * once retention took the job's row, its line of the rollup still gets it. */
START_TEST(test_a_late_charge_reaches_the_rollup_also_once_the_job_is_gone)
{
    static const int shard_counts[] = {1, 4};
    store_test_t f;
    store_test_setup_shards(&f, 1 << 20, shard_counts[_i]);
    int64_t day = now_us() / (86400 * INT64_C(1000000));
    int64_t noon = day * 86400 * INT64_C(1000000) + 43200 * INT64_C(1000000);
    job_t *job = running_job(&f, "alice", noon);
    job->finished_us = noon + 1000;
    job->gpu_ns = 7000;
    job->state = JOB_CANCELLED;
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    store_charge_t c = {.finished_us = job->finished_us, .delta_ns = 3000};
    snprintf(c.id, sizeof c.id, "%s", job->id);
    snprintf(c.owner, sizeof c.owner, "%s", job->owner);
    snprintf(c.op, sizeof c.op, "%s", store_test_op.name);
    ck_assert_int_eq(store_job_charge(f.st, &c), 0);
    assert_rollup(&f, "alice", 1, 0, 1000, 10000, 0);
    job_t *stored = store_test_get_job(&f, job->id);
    ck_assert_int_eq(stored->gpu_ns, 10000);
    job_free(stored);
    int deleted = 0;
    ck_assert_int_eq(store_gc(f.st, INT64_MAX, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    c.delta_ns = 5000;
    ck_assert_int_eq(store_job_charge(f.st, &c), 0);
    assert_rollup(&f, "alice", 1, 0, 1000, 15000, 0);
    job_free(job);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_fair_share_state_survives_reopen)
{
    store_test_t f;
    store_test_setup(&f);
    store_fair_share_t in[2] = {{"alice", 1.5e6, 1000}, {"bob", 250.25, 2000}};
    ck_assert_int_eq(store_fair_share_save(f.st, in, 2), 0);
    store_test_reopen(&f);
    store_fair_share_t *out = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_fair_share_load(f.st, &out, &n), 0);
    ck_assert_uint_eq(n, 2);
    for (size_t i = 0; i < n; i++) {
        int k = strcmp(out[i].owner, "bob") == 0;
        ck_assert_str_eq(out[i].owner, in[k].owner);
        ck_assert(out[i].usage_us == in[k].usage_us);
        ck_assert_int_eq(out[i].at_us, in[k].at_us);
    }
    free(out);
    ck_assert_int_eq(store_fair_share_save(f.st, in + 1, 1), 0);
    ck_assert_int_eq(store_fair_share_load(f.st, &out, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(out[0].owner, "bob");
    free(out);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_usage_counts_states_and_sums_times_and_buffers_per_owner)
{
    store_test_t f;
    store_test_setup(&f);
    char id[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), id); /* queued */
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
    ck_assert_int_eq(store_test_set_state(&f, id, JOB_RUNNING), 0);
    int64_t run_us = 0, gpu_ns = 0;
    for (int i = 0; i < 3; i++) {
        store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
        job_t *job = store_test_get_job(&f, id);
        job->state = JOB_RUNNING;
        job->started_us = 1000000 * (i + 1);
        ck_assert_int_eq(store_job_update(f.st, job), 0);
        job->state = i == 2 ? JOB_FAILED : JOB_SUCCEEDED;
        job->finished_us = job->started_us + 1000 * (i + 1);
        job->gpu_ns = 500 * (i + 1);
        if (i < 2) {
            job->call.n_out = 1;
            job->call.out_names[0] = "out";
            store_test_tensor_set(&job->out[0], "out", 1, 1);
        }
        ck_assert_int_eq(store_job_update(f.st, job), 0);
        run_us += 1000 * (i + 1);
        gpu_ns += 500 * (i + 1);
        job_free(job);
    }
    store_test_insert_small(&f, &store_test_op, "bob", now_us(), id);
    ck_assert_int_eq(store_test_set_state(&f, id, JOB_CANCELLED), 0);
    buffer_t *buf = buffer_new();
    snprintf(buf->owner, OWNER_SIZE, "alice");
    buf->desc = (tensor_desc_t){.dtype = DTYPE_I8, .ndim = 1, .shape = {1000}};
    buf->nbytes = 1000;
    buf->data = calloc(1, 1000);
    ck_assert_int_eq(store_buffer_insert(f.st, buf), 0);

    store_usage_t u;
    ck_assert_int_eq(store_usage_get(f.rd, "alice", &u), 0);
    ck_assert_str_eq(u.owner, "alice");
    ck_assert_int_eq(u.jobs_by_state[JOB_QUEUED], 1);
    ck_assert_int_eq(u.jobs_by_state[JOB_RUNNING], 1);
    ck_assert_int_eq(u.jobs_by_state[JOB_SUCCEEDED], 2);
    ck_assert_int_eq(u.jobs_by_state[JOB_FAILED], 1);
    ck_assert_int_eq(u.jobs_by_state[JOB_CANCELLED], 0);
    ck_assert_int_eq(u.run_us, run_us);
    ck_assert_int_eq(u.gpu_ns, gpu_ns);
    ck_assert_int_eq(u.buffers, 1);
    ck_assert_int_eq(u.buffer_bytes, 1000);
    ck_assert_int_eq(store_usage_get(f.rd, "bob", &u), 0);
    ck_assert_int_eq(u.jobs_by_state[JOB_CANCELLED], 1);
    ck_assert_int_eq(u.jobs_by_state[JOB_QUEUED], 0);
    ck_assert_int_eq(u.buffers, 0);
    buffer_free(buf);
    store_test_teardown(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_usage");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_usage_rollup_follows_job_ends_and_outlives_retention, 0, 2);
    tcase_add_loop_test(tc, test_usage_rollup_sums_a_transactions_ends_and_drops_a_rolled_back_ones,
                        0, 2);
    tcase_add_loop_test(tc, test_a_late_charge_reaches_the_rollup_also_once_the_job_is_gone, 0, 2);
    tcase_add_test(tc, test_fair_share_state_survives_reopen);
    tcase_add_test(tc, test_usage_counts_states_and_sums_times_and_buffers_per_owner);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
