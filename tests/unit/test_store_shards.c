/* The durable store on several shards (daemon/store/store.h): each job where its id says, files
 * two shards name, deferred writes, recovery across shards, the shard count kept, and a shard
 * whose transaction SQLite rolled back. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/store/store.h"
#include "daemon/store/store_internal.h" /* the shards, which these tests place jobs in */
#include "support/run_suite.h"
#include "support/store_test.h"

/* --- shards --- */

/* A new job whose id names shard k of n. */
static job_t *make_job_in(const op_def_t *op, int64_t created_us, int k, int n)
{
    job_t *job = store_test_make_job(op, "alice", created_us);
    id_new('j', job->id);
    store_id_assign_shard(job->id, n, k);
    ck_assert_int_eq(store_id_shard(job->id, n), k);
    return job;
}

/* The ids of the jobs in shard k's file, how many in *n. */
static void shard_ids(store_test_t *f, int k, char ids[][ID_SIZE], int cap, int *n)
{
    char path[128];
    if (k == 0)
        snprintf(path, sizeof path, "%s/gpujobd.db", f->dir);
    else
        snprintf(path, sizeof path, "%s/gpujobd-%d.db", f->dir, k);
    sqlite3 *db;
    sqlite3_stmt *stmt;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT id FROM jobs ORDER BY id", -1, &stmt, NULL),
                     SQLITE_OK);
    *n = 0;
    while (sqlite3_step(stmt) == SQLITE_ROW) {
        ck_assert_int_lt(*n, cap);
        snprintf(ids[(*n)++], ID_SIZE, "%s", (const char *)sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
}

static char recovered[16][ID_SIZE];

static int n_recovered;

static void collect_recovered(job_t *job, void *ud)
{
    (void)ud;
    ck_assert_int_lt(n_recovered, 16);
    snprintf(recovered[n_recovered++], ID_SIZE, "%s", job->id);
    job_free(job);
}

typedef struct queued_rows {
    store_queued_t rows[16];
    char keys[16][OP_BATCH_KEY_LEN];
    int n;
} queued_rows_t;

static void collect_queued(const store_queued_t *q, void *ud)
{
    queued_rows_t *l = ud;
    ck_assert_int_lt(l->n, 16);
    l->rows[l->n] = *q;
    snprintf(l->keys[l->n], sizeof l->keys[l->n], "%s", q->batch_key);
    l->rows[l->n].batch_key = l->keys[l->n];
    l->n++;
}

/* Recovery for the scheduler lists queued jobs from their columns alone, oldest first across
 * shards, with the batch key and cost the insert stored; a row from before those columns
 * (NULL) is read whole and resolved instead; running jobs are re-queued. */
START_TEST(test_recover_queued_lists_compact_rows_oldest_first_across_shards)
{
    store_test_t f;
    store_test_setup_shards(&f, STORE_TEST_INLINE_LIMIT, 4);
    enum { N = 6 };
    char ids[N][ID_SIZE];
    for (int i = 0; i < N; i++) {
        job_t *job = make_job_in(&store_test_op, 1000 + (N - i) * 10, i % 4, 4);
        snprintf(job->call.batch_key, sizeof job->call.batch_key, "key%d", i % 2);
        job->call.cost = (op_cost_t){.bytes = 100.0 * i, .flops = 7.0 * i};
        job->device = i == 1 ? 0 : -1;
        ck_assert_int_eq(store_job_insert(f.st, job), 0);
        memcpy(ids[i], job->id, ID_SIZE);
        job_free(job);
    }
    ck_assert_int_eq(store_test_set_state(&f, ids[2], JOB_RUNNING), 0); /* re-queued by recovery */
    ck_assert_int_eq(store_test_set_state(&f, ids[3], JOB_RUNNING), 0);
    ck_assert_int_eq(store_test_set_state(&f, ids[3], JOB_SUCCEEDED), 0); /* not listed */
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE jobs SET batch_key = NULL WHERE id = '%s'", ids[4]);
    store_test_db_exec(&f, sql); /* job 4 is in shard 4 % 4 = 0, shard 0's file */
    store_test_reopen(&f);

    queued_rows_t l = {.n = 0};
    ck_assert_int_eq(store_recover_queued(f.st, 3, job_resolve_op, collect_queued, &l), 0);
    ck_assert_int_eq(l.n, N - 1);
    int expect[] = {5, 4, 2, 1, 0}; /* created 1010, 1020, 1040, 1050, 1060 */
    for (int k = 0; k < l.n; k++) {
        int i = expect[k];
        ck_assert_str_eq(l.rows[k].id, ids[i]);
        ck_assert_str_eq(l.rows[k].owner, "alice");
        ck_assert_int_eq(l.rows[k].priority, 3);
        ck_assert_int_eq(l.rows[k].device, i == 1 ? 0 : -1);
        ck_assert_int_eq(l.rows[k].created_us, 1000 + (N - i) * 10);
        ck_assert_int_eq(l.rows[k].deadline_us, 123456789);
        if (i ==
            4) { /* resolved: store_test_op is not in the table, so its stand-in never batches */
            ck_assert_str_eq(l.rows[k].batch_key, "");
            continue;
        }
        char key[8];
        snprintf(key, sizeof key, "key%d", i % 2);
        ck_assert_str_eq(l.rows[k].batch_key, key);
        ck_assert_double_eq(l.rows[k].cost.bytes, 100.0 * i);
        ck_assert_double_eq(l.rows[k].cost.flops, 7.0 * i);
    }
    job_t *job = store_test_get_job(&f, ids[2]);
    ck_assert_int_eq(job->state, JOB_QUEUED);
    job_free(job);
    store_test_teardown(&f);
}
END_TEST

/* Four shards: each job's row is in the file its id names, one transaction spans the shards it
 * writes, and every read (by id, listing, usage, recovery, retention) sees all of them. */
START_TEST(test_a_sharded_store_keeps_each_job_where_its_id_says_and_reads_them_all)
{
    store_test_t f;
    store_test_setup_shards(&f, STORE_TEST_INLINE_LIMIT, 4);
    ck_assert_int_eq(store_shards(f.st), 4);
    enum { N = 8 };
    char ids[N][ID_SIZE];
    /* Created in the order 7, 6, ..., 0: recovery hands them back oldest first, across
     * shards. */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    for (int i = 0; i < N; i++) {
        job_t *job = make_job_in(&store_test_op, 1000 + (N - i) * 10, i % 4, 4);
        ck_assert_int_eq(store_job_insert(f.st, job), 0);
        memcpy(ids[i], job->id, ID_SIZE);
        job_free(job);
    }
    ck_assert_int_eq(store_commit(f.st), 0);
    for (int k = 0; k < 4; k++) {
        char in[N][ID_SIZE];
        int n = 0;
        shard_ids(&f, k, in, N, &n);
        ck_assert_int_eq(n, 2);
        for (int j = 0; j < n; j++)
            ck_assert_int_eq(store_id_shard(in[j], 4), k);
    }
    for (int i = 0; i < N; i++) {
        job_t *job = store_test_get_job(&f, ids[i]);
        ck_assert_str_eq(job->id, ids[i]);
        job_free(job);
    }
    char listed[N + 1][ID_SIZE];
    store_list_query_t all = {.state = -1, .limit = 3};
    ck_assert_uint_eq(store_test_list_all(&f, all, listed, N + 1), N); /* in id order, by pages */

    /* Jobs of three shards end; one of them started in the transaction that ends it. */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(store_test_set_state(&f, ids[i], JOB_RUNNING), 0);
        ck_assert_int_eq(store_test_set_state(&f, ids[i], JOB_SUCCEEDED), 0);
    }
    store_list_query_t done = {.state = JOB_SUCCEEDED, .limit = 2};
    ck_assert_uint_eq(store_test_list_all(&f, done, listed, N + 1), 3);
    store_usage_t u;
    ck_assert_int_eq(store_usage_get(f.rd, "alice", &u), 0);
    ck_assert_int_eq(u.jobs_by_state[JOB_SUCCEEDED], 3);
    ck_assert_int_eq(u.jobs_by_state[JOB_QUEUED], N - 3);

    /* A rolled-back transaction leaves no row in any shard it wrote. */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    char gone[2][ID_SIZE];
    for (int i = 0; i < 2; i++) {
        job_t *job = make_job_in(&store_test_op, 5000, i + 1, 4);
        ck_assert_int_eq(store_job_insert(f.st, job), 0);
        memcpy(gone[i], job->id, ID_SIZE);
        job_free(job);
    }
    ck_assert_int_eq(store_rollback(f.st), 0);
    job_t *none = NULL;
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(store_job_get(f.rd, gone[i], &none), -ENOENT);

    /* A restart: a running job of shard 3 is queued again, and the queued jobs come back
     * oldest first, whichever shard holds them. */
    ck_assert_int_eq(store_test_set_state(&f, ids[3], JOB_RUNNING), 0);
    store_test_reopen(&f);
    n_recovered = 0;
    store_test_recover_jobs(&f, 3, collect_recovered, NULL);
    ck_assert_int_eq(n_recovered, N - 3);
    for (int i = 0; i < n_recovered; i++)
        ck_assert_str_eq(recovered[i], ids[N - 1 - i]);

    /* Retention reaches every shard. */
    int deleted = 0;
    ck_assert_int_eq(store_gc(f.st, now_us() + 1000000, &deleted), 0);
    ck_assert_int_eq(deleted, 3);
    ck_assert_uint_eq(store_test_list_all(&f, all, listed, N + 1), N - 3);
    store_test_teardown(&f);
}
END_TEST

/* A file of outputs that jobs of two shards name (a batch's, written whole) stays while
 * either names it, through retention and the sweep at open. */
START_TEST(test_a_file_two_shards_name_goes_only_when_neither_does)
{
    store_test_t f;
    store_test_setup_shards(&f, 65536, 4);
    job_t *jobs[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = make_job_in(&store_test_op, 1000, i + 1, 4);
        ck_assert_int_eq(store_job_insert(f.st, jobs[i]), 0);
        jobs[i]->state = JOB_RUNNING;
        jobs[i]->attempts = 1;
        ck_assert_int_eq(store_job_update(f.st, jobs[i]), 0);
        jobs[i]->call.n_out = 1;
        jobs[i]->call.out_names[0] = "out";
        store_test_tensor_set(&jobs[i]->out[0], "out", 10000, 40 + i); /* 40,000 bytes each */
    }
    ck_assert_int_eq(store_blob_pack(f.st, jobs, 2, true), 0);
    ck_assert_ptr_nonnull(jobs[0]->out[0].blob);
    char *file = strdup(jobs[0]->out[0].blob);
    ck_assert_int_eq(strncmp(file, jobs[1]->out[0].blob, 40), 0); /* the same file */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    for (int i = 0; i < 2; i++) {
        jobs[i]->state = JOB_SUCCEEDED;
        jobs[i]->finished_us = i == 0 ? 2000 : now_us();
        ck_assert_int_eq(store_job_update(f.st, jobs[i]), 0);
    }
    ck_assert_int_eq(store_commit(f.st), 0);

    int deleted = 0;
    ck_assert_int_eq(store_gc(f.st, 3000, &deleted), 0); /* the first job only */
    ck_assert_int_eq(deleted, 1);
    ck_assert(store_test_blob_file_exists(&f, file));
    store_test_reopen(&f);
    ck_assert(store_test_blob_file_exists(&f, file));
    job_t *kept = store_test_get_job(&f, jobs[1]->id);
    float expected[10000];
    store_test_fill_bytes(expected, sizeof expected, 41);
    store_test_assert_blob_bytes(&f, kept->out[0].blob, expected, sizeof expected);
    job_free(kept);
    ck_assert_int_eq(store_gc(f.st, now_us() + 1000000, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(!store_test_blob_file_exists(&f, file));
    free(file);
    for (int i = 0; i < 2; i++)
        job_free(jobs[i]);
    store_test_teardown(&f);
}
END_TEST

static int n_failed_writes;

static job_state_t failed_written;

static int failed_err;

static int note_failed_write(job_t *job, job_state_t written, int err, void *ud)
{
    (void)job;
    (void)ud;
    n_failed_writes++;
    failed_written = written;
    failed_err = err;
    return 0;
}

/* Deferred writes run when flushed, on the shards side by side: each job's row in its shard,
 * each write with the state its job had when it was asked for, and a write that fails reported
 * on its own. */
START_TEST(test_deferred_writes_run_by_the_shards_when_flushed)
{
    store_test_t f;
    store_test_setup_shards(&f, STORE_TEST_INLINE_LIMIT, 4);
    enum { N = 100 };
    job_t *jobs[N];
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    store_defer_writes(f.st);
    for (int i = 0; i < N; i++) {
        jobs[i] = make_job_in(&store_test_op, 1000 + i, i % 4, 4);
        ck_assert_int_eq(store_job_insert(f.st, jobs[i]), 0);
        jobs[i]->state = JOB_RUNNING;
        jobs[i]->attempts = 1;
        ck_assert_int_eq(store_job_update(f.st, jobs[i]), 0);
        jobs[i]->state = JOB_SUCCEEDED; /* after the ask: not what is written */
    }
    job_t *unknown = make_job_in(&store_test_op, 1000, 2, 4);
    unknown->state = JOB_CANCELLED;
    ck_assert_int_eq(store_job_update(f.st, unknown), 0);
    job_t *none = NULL;
    ck_assert_int_eq(store_job_get(f.rd, jobs[0]->id, &none), -ENOENT); /* not yet written */
    n_failed_writes = 0;
    ck_assert_int_eq(store_flush(f.st, note_failed_write, NULL), 0);
    ck_assert_int_eq(n_failed_writes, 1);
    ck_assert_int_eq(failed_written, JOB_CANCELLED);
    ck_assert_int_eq(failed_err, -ENOENT);
    ck_assert_int_eq(jobs[0]->state, JOB_SUCCEEDED); /* the caller's state, given back */
    ck_assert_int_eq(store_commit(f.st), 0);
    char listed[N + 1][ID_SIZE];
    store_list_query_t running = {.state = JOB_RUNNING, .limit = 40};
    ck_assert_uint_eq(store_test_list_all(&f, running, listed, N + 1), N);
    for (int k = 0; k < 4; k++) {
        char in[N][ID_SIZE];
        int n = 0;
        shard_ids(&f, k, in, N, &n);
        ck_assert_int_eq(n, N / 4);
    }

    /* Without a callback the first failure is the flush's; the commit then fails too. */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    store_defer_writes(f.st);
    ck_assert_int_eq(store_job_update(f.st, unknown), 0);
    ck_assert_int_eq(store_commit(f.st), -ENOENT);
    ck_assert_int_eq(store_rollback(f.st), 0);
    job_free(unknown);
    for (int i = 0; i < N; i++)
        job_free(jobs[i]);
    store_test_teardown(&f);
}
END_TEST

static void shard_path(const store_test_t *f, int k, char *path, size_t size)
{
    snprintf(path, size, "%s/gpujobd-%d.db", f->dir, k);
}

/* The shard count is the store's from its creation on; a shard file that is missing or in
 * another's place stops the open. */
START_TEST(test_a_store_keeps_its_shard_count_and_refuses_a_missing_or_swapped_shard)
{
    store_test_t f;
    store_test_setup_shards(&f, STORE_TEST_INLINE_LIMIT, 4);
    job_t *job = make_job_in(&store_test_op, 1000, 3, 4);
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    f.cfg.shards = 1; /* a count configured later changes nothing */
    store_test_reopen(&f);
    ck_assert_int_eq(store_shards(f.st), 4);
    job_free(store_test_get_job(&f, job->id));
    job_free(job);
    store_reader_close(f.rd);
    store_close(f.st);

    char one[128], two[128], moved[128];
    shard_path(&f, 1, one, sizeof one);
    shard_path(&f, 2, two, sizeof two);
    snprintf(moved, sizeof moved, "%s/moved.db", f.dir);
    ck_assert_int_eq(rename(two, moved), 0);
    store_t *st = NULL;
    ck_assert_int_eq(store_open(&f.cfg, &st), -ENOENT);
    ck_assert_int_eq(access(two, F_OK), -1); /* not made anew */
    ck_assert_int_eq(rename(one, two), 0);
    ck_assert_int_eq(rename(moved, one), 0);
    ck_assert_int_eq(store_open(&f.cfg, &st), -EPROTO);
    ck_assert_ptr_null(st);
    f.st = NULL;
    f.rd = NULL;
    store_test_teardown(&f);

    /* A store of one shard stays one. */
    store_test_setup(&f);
    f.cfg.shards = 4;
    store_test_reopen(&f);
    ck_assert_int_eq(store_shards(f.st), 1);
    shard_path(&f, 1, one, sizeof one);
    ck_assert_int_eq(access(one, F_OK), -1);
    store_test_teardown(&f);
}
END_TEST

/* Inserts a job whose id names shard k of 2, created at created_us; returns what the insert
 * returned, the id in ret_id. */
static int insert_in_shard(store_test_t *f, int k, int64_t created_us, char ret_id[ID_SIZE])
{
    job_t *job = make_job_in(&store_test_op, created_us, k, 2);
    int r = store_job_insert(f->st, job);
    memcpy(ret_id, job->id, ID_SIZE);
    job_free(job);
    return r;
}

static void assert_stored(store_test_t *f, const char *id, bool stored)
{
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(f->rd, id, &job), stored ? 0 : -ENOENT);
    job_free(job);
}

/* A write that makes SQLite roll back a shard's whole transaction (RAISE(ROLLBACK) here; an
 * I/O error or a full disk in a statement does the same) takes that shard's earlier writes
 * with it, and the shard refuses the rest of the transaction: writes after it would otherwise
 * each commit on their own. The other shard commits its part; the next transaction writes the
 * shard again. Both with writes made at once and with deferred ones run by the shards'
 * threads. */
START_TEST(test_a_shard_that_sqlite_rolled_back_refuses_the_rest_of_its_transaction)
{
    enum { POISON = 666 };
    store_test_t f;
    store_test_setup_shards(&f, STORE_TEST_INLINE_LIMIT, 2);
    char path[128], sql[256];
    shard_path(&f, 1, path, sizeof path);
    snprintf(sql, sizeof sql,
             "CREATE TRIGGER roll_back BEFORE INSERT ON jobs WHEN NEW.created_us = %d "
             "BEGIN SELECT RAISE(ROLLBACK, 'injected rollback'); END",
             POISON);
    store_test_exec_at(path, sql);

    char kept0[ID_SIZE], lost1[ID_SIZE], poison[ID_SIZE], refused1[ID_SIZE], kept0b[ID_SIZE];
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    ck_assert_int_eq(insert_in_shard(&f, 0, 1000, kept0), 0);
    ck_assert_int_eq(insert_in_shard(&f, 1, 1000, lost1), 0);
    ck_assert_int_lt(insert_in_shard(&f, 1, POISON, poison), 0);
    ck_assert_int_eq(insert_in_shard(&f, 1, 1000, refused1), -EIO);
    ck_assert_int_eq(insert_in_shard(&f, 0, 1000, kept0b), 0);
    ck_assert_int_eq(store_commit(f.st), -EIO);
    ck_assert_uint_eq(store_committed_shards(f.st), 1u << 0);
    store_commit_result_t kept;
    store_commit_result(f.st, &kept);
    ck_assert(store_job_committed(&kept, kept0, NULL));
    ck_assert(store_job_committed(&kept, kept0b, NULL));
    ck_assert(!store_job_committed(&kept, lost1, NULL));
    ck_assert(!store_job_committed(&kept, poison, NULL));
    ck_assert(!store_job_committed(&kept, refused1, NULL));
    ck_assert(store_buffers_committed(&kept, NULL));
    ck_assert_int_eq(store_rollback(f.st), 0);
    assert_stored(&f, kept0, true);
    assert_stored(&f, kept0b, true);
    assert_stored(&f, lost1, false);
    assert_stored(&f, poison, false);
    assert_stored(&f, refused1, false);

    char again[ID_SIZE];
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    ck_assert_int_eq(insert_in_shard(&f, 1, 1000, again), 0);
    ck_assert_int_eq(store_commit(f.st), 0);
    assert_stored(&f, again, true);

    /* Deferred: enough writes for the shards' threads. Every write of shard 1 from the poison
     * on is reported failed; shard 0's all stand. */
    enum { N = 80, POISON_AT = 41 }; /* an odd index: shard 1 */
    job_t *jobs[N];
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    store_defer_writes(f.st);
    for (int i = 0; i < N; i++) {
        jobs[i] = make_job_in(&store_test_op, i == POISON_AT ? POISON : 2000 + i, i % 2, 2);
        ck_assert_int_eq(store_job_insert(f.st, jobs[i]), 0);
    }
    n_failed_writes = 0;
    ck_assert_int_eq(store_flush(f.st, note_failed_write, NULL), 0);
    ck_assert_int_eq(n_failed_writes, (N - POISON_AT + 1) / 2);
    ck_assert_int_eq(failed_err, -EIO);
    ck_assert_int_eq(store_commit(f.st), -EIO);
    ck_assert_uint_eq(store_committed_shards(f.st), 1u << 0);
    store_commit_result(f.st, &kept);
    ck_assert_int_eq(store_rollback(f.st), 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(store_job_committed(&kept, jobs[i]->id, NULL), i % 2 == 0);
        assert_stored(&f, jobs[i]->id, i % 2 == 0);
        job_free(jobs[i]);
    }
    store_test_teardown(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_shards");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_recover_queued_lists_compact_rows_oldest_first_across_shards);
    tcase_add_test(tc, test_a_sharded_store_keeps_each_job_where_its_id_says_and_reads_them_all);
    tcase_add_test(tc, test_a_file_two_shards_name_goes_only_when_neither_does);
    tcase_add_test(tc, test_deferred_writes_run_by_the_shards_when_flushed);
    tcase_add_test(tc, test_a_store_keeps_its_shard_count_and_refuses_a_missing_or_swapped_shard);
    tcase_add_test(tc, test_a_shard_that_sqlite_rolled_back_refuses_the_rest_of_its_transaction);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
