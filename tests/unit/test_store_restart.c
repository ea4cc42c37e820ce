/* What the durable store (daemon/store/store.h) does when it opens an existing state directory:
 * the schema migrated from older versions or a newer one refused, and the jobs a crash left
 * running requeued or failed. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/store/store.h"
#include "daemon/store/store_internal.h" /* STORE_SCHEMA_VERSION, STORE_FINAL_STATES */
#include "support/run_suite.h"
#include "support/store_test.h"

typedef struct recovered {
    job_t *jobs[16];
    int n;
} recovered_t;

static void collect(job_t *job, void *ud)
{
    recovered_t *rec = ud;
    ck_assert_int_lt(rec->n, 16);
    rec->jobs[rec->n++] = job;
}

/* A job the crash guard names fails whether its row says running or still queued (a batch is
 * launched before the commit that records its start); a final job keeps its end. */
START_TEST(test_recover_crashed_fails_a_named_job_that_is_not_final)
{
    store_test_t f;
    store_test_setup(&f);
    char queued[ID_SIZE], running[ID_SIZE], done[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", 1000, queued);
    store_test_insert_small(&f, &store_test_op, "alice", 2000, running);
    ck_assert_int_eq(store_test_set_state(&f, running, JOB_RUNNING), 0);
    store_test_insert_small(&f, &store_test_op, "alice", 3000, done);
    ck_assert_int_eq(store_test_set_state(&f, done, JOB_RUNNING), 0);
    ck_assert_int_eq(store_test_set_state(&f, done, JOB_SUCCEEDED), 0);
    store_test_reopen(&f);
    const char *ids[] = {queued, running, done};
    const bool expect_failed[] = {true, true, false};
    for (int i = 0; i < 3; i++) {
        bool failed = !expect_failed[i];
        ck_assert_int_eq(
            store_recover_crashed(f.st, ids[i], "worker_crashed", "it crashed", &failed), 0);
        ck_assert_int_eq(failed, expect_failed[i]);
        job_t *job = store_test_get_job(&f, ids[i]);
        ck_assert_int_eq(job->state, expect_failed[i] ? JOB_FAILED : JOB_SUCCEEDED);
        if (expect_failed[i]) ck_assert_str_eq(job->error_code, "worker_crashed");
        job_free(job);
    }
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_recover_requeues_running_fails_past_max_attempts_and_returns_queued_oldest_first)
{
    store_test_t f;
    store_test_setup(&f);
    const int max_attempts = 3;
    char queued_new[ID_SIZE], queued_old[ID_SIZE], running_retry[ID_SIZE], running_spent[ID_SIZE],
        done[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", 3000, queued_new);
    store_test_insert_small(&f, &store_test_op, "alice", 1000, queued_old);

    /* A running job that may run again, with a buffer-referenced input. */
    job_t *job = store_test_make_job(&store_test_op, "alice", 2000);
    job->call.has_in[2] = true;
    snprintf(job->in[2].name, sizeof job->in[2].name, "w");
    snprintf(job->in[2].buffer_id, ID_SIZE, "b0123456789abcdef01234567");
    job->in[2].desc = job->in[0].desc;
    job->in[2].nbytes = job->in[0].nbytes;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    memcpy(running_retry, job->id, ID_SIZE);
    job_free(job);
    ck_assert_int_eq(store_test_set_state(&f, running_retry, JOB_RUNNING), 0); /* attempts 1 */

    store_test_insert_small(&f, &store_test_op, "alice", 500, running_spent);
    for (int i = 0; i < max_attempts; i++) { /* attempts reach max_attempts */
        ck_assert_int_eq(store_test_set_state(&f, running_spent, JOB_RUNNING), 0);
        if (i + 1 < max_attempts)
            ck_assert_int_eq(store_test_set_state(&f, running_spent, JOB_QUEUED), 0);
    }
    store_test_insert_small(&f, &store_test_op, "alice", 100, done);
    ck_assert_int_eq(store_test_set_state(&f, done, JOB_RUNNING), 0);
    ck_assert_int_eq(store_test_set_state(&f, done, JOB_SUCCEEDED), 0);

    /* A restart: the store is closed (the process died) and opened again. */
    store_test_reopen(&f);
    recovered_t rec = {.n = 0};
    store_test_recover_jobs(&f, max_attempts, collect, &rec);

    ck_assert_int_eq(rec.n, 3);
    ck_assert_str_eq(rec.jobs[0]->id, queued_old);
    ck_assert_str_eq(rec.jobs[1]->id, running_retry);
    ck_assert_str_eq(rec.jobs[2]->id, queued_new);
    for (int i = 0; i < rec.n; i++) {
        ck_assert_int_eq(rec.jobs[i]->state, JOB_QUEUED);
        ck_assert_str_eq(rec.jobs[i]->call.op->name, "test_store_op");
        ck_assert_int_eq(strncmp(rec.jobs[i]->in[0].blob, "row:jobs/", 9), 0);
        ck_assert_ptr_null(rec.jobs[i]->in[0].data);
    }
    ck_assert_int_eq(rec.jobs[1]->attempts, 1); /* runs started; the next start counts */
    ck_assert(rec.jobs[1]->call.has_in[2]);
    ck_assert_str_eq(rec.jobs[1]->in[2].buffer_id, "b0123456789abcdef01234567");
    ck_assert_ptr_null(rec.jobs[1]->in[2].blob);
    char expected[32];
    store_test_fill_bytes(expected, sizeof expected,
                          2000); /* store_test_make_job's bytes for created_us 2000 */
    store_test_assert_blob_bytes(&f, rec.jobs[1]->in[0].blob, expected, sizeof expected);

    job_t *spent = store_test_get_job(&f, running_spent);
    ck_assert_int_eq(spent->state, JOB_FAILED);
    ck_assert_str_eq(spent->error_code, "daemon_restarted");
    ck_assert_ptr_nonnull(strstr(spent->error_message, "3 attempt"));
    ck_assert_int_gt(spent->finished_us, 0);
    job_t *finished = store_test_get_job(&f, done);
    ck_assert_int_eq(finished->state, JOB_SUCCEEDED);
    job_free(spent);
    job_free(finished);
    for (int i = 0; i < rec.n; i++)
        job_free(rec.jobs[i]);
    store_test_teardown(&f);
}
END_TEST

static int db_user_version(const char *path)
{
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *stmt;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &stmt, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
    int v = sqlite3_column_int(stmt, 0);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return v;
}

START_TEST(test_open_migrates_an_empty_file_to_the_current_schema)
{
    char dir[] = "/tmp/test_store.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", dir);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0640);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(db_user_version(path), 0);

    config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.shards = 1;
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s", dir);
    cfg.inline_blob_bytes = STORE_TEST_INLINE_LIMIT;
    store_t *st = NULL;
    ck_assert_int_eq(store_open(&cfg, &st), 0);
    store_close(st);
    ck_assert_int_eq(db_user_version(path), STORE_SCHEMA_VERSION);

    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    const char *tables[] = {"jobs", "blob_refs", "buffers"};
    for (int i = 0; i < 3; i++) {
        sqlite3_stmt *stmt;
        ck_assert_int_eq(sqlite3_prepare_v2(db,
                                            "SELECT count(*) FROM sqlite_schema WHERE "
                                            "type = 'table' AND name = ?1",
                                            -1, &stmt, NULL),
                         SQLITE_OK);
        sqlite3_bind_text(stmt, 1, tables[i], -1, SQLITE_STATIC);
        ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
        ck_assert_int_eq(sqlite3_column_int(stmt, 0), 1);
        sqlite3_finalize(stmt);
    }
    sqlite3_stmt *stmt;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
    ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 0), "wal");
    sqlite3_finalize(stmt);
    sqlite3_close(db);

    /* Opening again finds the schema current and changes nothing. */
    ck_assert_int_eq(store_open(&cfg, &st), 0);
    store_close(st);
    ck_assert_int_eq(db_user_version(path), STORE_SCHEMA_VERSION);
    store_test_remove_tree(dir);
}
END_TEST

/* Schema version 1 as it shipped (store_schema.c keeps it as the first migration), with rows
 * of a finished job whose tensors are in a row, in a file of their own and in a buffer. */
static const char schema_v1_with_rows[] =
    "CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, op TEXT NOT NULL, params TEXT,"
    "  priority INTEGER NOT NULL, device INTEGER NOT NULL, deadline_us INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN "
    "    ('queued', 'running', 'succeeded', 'failed', 'cancelled')),"
    "  attempts INTEGER NOT NULL DEFAULT 0, created_us INTEGER NOT NULL,"
    "  started_us INTEGER NOT NULL DEFAULT 0, finished_us INTEGER NOT NULL DEFAULT 0,"
    "  run_device INTEGER NOT NULL DEFAULT -1, gpu_ns INTEGER NOT NULL DEFAULT 0,"
    "  batch_size INTEGER NOT NULL DEFAULT 0, error_code TEXT NOT NULL DEFAULT '',"
    "  error_message TEXT NOT NULL DEFAULT '', idempotency_key TEXT) WITHOUT ROWID;"
    "CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner, idempotency_key)"
    "  WHERE idempotency_key IS NOT NULL;"
    "CREATE INDEX jobs_owner_id ON jobs (owner, id);"
    "CREATE INDEX jobs_state ON jobs (state, created_us, id);"
    "CREATE INDEX jobs_finished ON jobs (finished_us)"
    "  WHERE state IN ('succeeded', 'failed', 'cancelled');"
    "CREATE TABLE tensors (job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    "  role TEXT NOT NULL CHECK (role IN ('in', 'out')), slot INTEGER NOT NULL,"
    "  name TEXT NOT NULL, dtype TEXT NOT NULL, shape TEXT NOT NULL, nbytes INTEGER NOT NULL,"
    "  buffer_id TEXT, data BLOB, file TEXT, PRIMARY KEY (job_id, role, slot));"
    "CREATE INDEX tensors_file ON tensors (file) WHERE file IS NOT NULL;"
    "CREATE TABLE buffers (id TEXT PRIMARY KEY, owner TEXT NOT NULL, dtype TEXT NOT NULL,"
    "  shape TEXT NOT NULL, nbytes INTEGER NOT NULL, resident INTEGER NOT NULL,"
    "  created_us INTEGER NOT NULL, data BLOB, file TEXT);"
    "CREATE INDEX buffers_owner ON buffers (owner);"
    "CREATE INDEX buffers_file ON buffers (file) WHERE file IS NOT NULL;"
    "INSERT INTO jobs (id, owner, op, params, priority, device, deadline_us, state, attempts,"
    "  created_us, started_us, finished_us) VALUES ('j1', 'alice', 'test_store_op', '{}', 0, -1,"
    "  0, 'succeeded', 1, 1000, 2000, 3000);"
    "INSERT INTO tensors VALUES ('j1', 'in', 0, 'x', 'f32', '[2]', 8, NULL, x'0000803f00000040',"
    "  NULL);"
    "INSERT INTO tensors VALUES ('j1', 'in', 1, 'y', 'f32', '[1]', 4, NULL, NULL,"
    "  'ab/ab000000000000000000000000000001');"
    "INSERT INTO tensors VALUES ('j1', 'in', 2, 'w', 'f32', '[4]', 16, 'b1', NULL, NULL);"
    "INSERT INTO tensors VALUES ('j1', 'out', 0, 'out', 'f32', '[1]', 4, NULL, x'00004040', NULL);"
    "INSERT INTO buffers VALUES ('b1', 'alice', 'f32', '[4]', 16, 1, 500, zeroblob(16), NULL);"
    "PRAGMA user_version = 1";

START_TEST(test_open_migrates_version_1_rows_to_the_current_schema)
{
    store_test_t f;
    snprintf(f.dir, sizeof f.dir, "/tmp/test_store.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f.dir));
    memset(&f.cfg, 0, sizeof f.cfg);
    f.cfg.shards = 1;
    snprintf(f.cfg.state_dir, sizeof f.cfg.state_dir, "%s", f.dir);
    f.cfg.inline_blob_bytes = STORE_TEST_INLINE_LIMIT;
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", f.dir);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, schema_v1_with_rows, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    snprintf(path, sizeof path, "%s/blobs", f.dir);
    ck_assert_int_eq(mkdir(path, 0750), 0);
    snprintf(path, sizeof path, "%s/blobs/ab", f.dir);
    ck_assert_int_eq(mkdir(path, 0750), 0);
    const float y = 7.0f;
    snprintf(path, sizeof path, "%s/blobs/ab/ab000000000000000000000000000001", f.dir);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0640);
    ck_assert_int_eq(write(fd, &y, sizeof y), (ssize_t)sizeof y);
    close(fd);

    ck_assert_int_eq(store_open(&f.cfg, &f.st), 0);
    ck_assert_int_eq(store_reader_open(f.st, &f.rd), 0);
    snprintf(path, sizeof path, "%s/gpujobd.db", f.dir);
    ck_assert_int_eq(db_user_version(path), STORE_SCHEMA_VERSION);
    ck_assert_int_eq(
        store_test_db_int(&f, "SELECT count(*) FROM sqlite_schema WHERE name = 'tensors'"), 0);
    ck_assert_int_eq(
        store_test_db_int(
            &f, "SELECT refs FROM blob_refs WHERE file = 'ab/ab000000000000000000000000000001'"),
        1);
    buffer_t *got = NULL;
    ck_assert_int_eq(store_buffer_get(f.rd, "b1", &got), 0);
    ck_assert(got->resident);
    ck_assert_int_eq(got->device, -1);
    buffer_free(got);

    /* Every tensor kept its descriptor and where its bytes are; the file survived the sweep at
     * open, as a row names it. */
    job_t *job = store_test_get_job(&f, "j1");
    ck_assert_int_eq(job->state, JOB_SUCCEEDED);
    ck_assert(job->call.has_in[0] && job->call.has_in[1] && job->call.has_in[2]);
    const float x[2] = {1.0f, 2.0f}, out = 3.0f;
    ck_assert_str_eq(job->in[0].name, "x");
    ck_assert_int_eq(job->in[0].desc.shape[0], 2);
    store_test_assert_blob_bytes(&f, job->in[0].blob, x, sizeof x);
    ck_assert(store_test_blob_file_exists(&f, job->in[1].blob));
    store_test_assert_blob_bytes(&f, job->in[1].blob, &y, sizeof y);
    ck_assert_str_eq(job->in[2].buffer_id, "b1");
    ck_assert_ptr_null(job->in[2].blob);
    ck_assert_str_eq(job->out[0].name, "out");
    store_test_assert_blob_bytes(&f, job->out[0].blob, &out, sizeof out);

    /* Deleting the job takes its file, its count and its bytes (inputs', outputs') with it. */
    ck_assert_int_eq(store_test_db_int(&f, "SELECT count(*) FROM job_bytes WHERE job_id = 'j1'"),
                     2);
    int deleted = 0;
    ck_assert_int_eq(store_gc(f.st, now_us(), &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(!store_test_blob_file_exists(&f, job->in[1].blob));
    ck_assert_int_eq(store_test_db_int(&f, "SELECT count(*) FROM blob_refs"), 0);
    ck_assert_int_eq(store_test_db_int(&f, "SELECT count(*) FROM job_bytes"), 0);
    job_free(job);
    store_test_teardown(&f);
}
END_TEST

/* Schema version 6 indexes jobs by finish time, which only ended jobs have. A version-5
 * database, with an ended job a past version left without one and a running one with one,
 * comes out of the migration with the new indexes, the finish times made right, and its jobs
 * found by recovery, by state and by retention as before. */
START_TEST(test_open_migrates_version_5_state_indexes_to_finish_time_ones)
{
    store_test_t f;
    store_test_setup(&f);
    char queued[ID_SIZE], running[ID_SIZE], ended[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", 1000, queued);
    store_test_insert_small(&f, &store_test_op, "alice", 2000, running);
    ck_assert_int_eq(store_test_set_state(&f, running, JOB_RUNNING), 0);
    store_test_insert_small(&f, &store_test_op, "alice", 3000, ended);
    ck_assert_int_eq(store_test_set_state(&f, ended, JOB_RUNNING), 0);
    ck_assert_int_eq(store_test_set_state(&f, ended, JOB_SUCCEEDED), 0);
    store_reader_close(f.rd);
    store_close(f.st);
    char sql[1536];
    snprintf(sql, sizeof sql,
             "DROP INDEX jobs_live; DROP INDEX jobs_ended; DROP INDEX jobs_finished;"
             "DROP INDEX jobs_idempotency; ALTER TABLE jobs DROP COLUMN idempotency_index;"
             "CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner, idempotency_key)"
             "  WHERE idempotency_key IS NOT NULL;"
             "CREATE INDEX jobs_state ON jobs (state, created_us, id);"
             "CREATE INDEX jobs_finished ON jobs (finished_us) WHERE " STORE_FINAL_STATES ";"
             "UPDATE jobs SET finished_us = 0, started_us = 3500 WHERE id = '%s';"
             "UPDATE jobs SET finished_us = 777 WHERE id = '%s';"
             "DROP TABLE settings; ALTER TABLE jobs DROP COLUMN batch_ns;"
             "DROP TABLE usage_daily; DROP TABLE fair_share;"
             "ALTER TABLE buffers DROP COLUMN durable;"
             "DROP INDEX jobs_queued; DROP INDEX jobs_running;"
             "ALTER TABLE jobs DROP COLUMN batch_key; ALTER TABLE jobs DROP COLUMN cost_bytes;"
             "ALTER TABLE jobs DROP COLUMN cost_flops; ALTER TABLE jobs DROP COLUMN time_limit_ms;"
             "PRAGMA user_version = 5",
             ended, running);
    store_test_db_exec(&f, sql);

    ck_assert_int_eq(store_open(&f.cfg, &f.st), 0);
    ck_assert_int_eq(store_reader_open(f.st, &f.rd), 0);
    ck_assert_int_eq(store_test_db_int(&f, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
    ck_assert_int_eq(
        store_test_db_int(&f, "SELECT count(*) FROM sqlite_schema WHERE name = 'jobs_state'"), 0);
    ck_assert_int_eq(
        store_test_db_int(
            &f, "SELECT count(*) FROM sqlite_schema WHERE "
                "(name = 'jobs_live' AND sql LIKE '%(owner, id) WHERE finished_us = 0') "
                "OR (name = 'jobs_ended' AND sql LIKE '%(state, id) WHERE finished_us > 0') "
                "OR (name = 'jobs_finished' AND sql LIKE '%WHERE finished_us > 0')"),
        3);
    job_t *got = store_test_get_job(&f, ended);
    ck_assert_int_eq(got->finished_us, 3500); /* its start: the latest time it has */
    job_free(got);
    got = store_test_get_job(&f, running);
    ck_assert_int_eq(got->finished_us, 0);
    job_free(got);
    store_test_assert_listed_by_state(&f, JOB_QUEUED, queued);
    store_test_assert_listed_by_state(&f, JOB_RUNNING, running);
    store_test_assert_listed_by_state(&f, JOB_SUCCEEDED, ended);

    recovered_t rec = {.n = 0};
    store_test_recover_jobs(&f, 3, collect, &rec);
    ck_assert_int_eq(rec.n, 2);
    ck_assert_str_eq(rec.jobs[0]->id, queued);
    ck_assert_str_eq(rec.jobs[1]->id, running);
    for (int i = 0; i < rec.n; i++)
        job_free(rec.jobs[i]);

    int deleted = 0;
    ck_assert_int_eq(store_gc(f.st, 4000, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert_int_eq(store_job_get(f.rd, ended, &got), -ENOENT);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_open_refuses_a_database_from_a_newer_version)
{
    char dir[] = "/tmp/test_store.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", dir);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.shards = 1;
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s", dir);
    store_t *st = NULL;
    ck_assert_int_eq(store_open(&cfg, &st), -EPROTO);
    ck_assert_ptr_null(st);
    ck_assert_int_eq(db_user_version(path), 99);
    store_test_remove_tree(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_restart");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(
        tc, test_recover_requeues_running_fails_past_max_attempts_and_returns_queued_oldest_first);
    tcase_add_test(tc, test_recover_crashed_fails_a_named_job_that_is_not_final);
    tcase_add_test(tc, test_open_migrates_an_empty_file_to_the_current_schema);
    tcase_add_test(tc, test_open_migrates_version_1_rows_to_the_current_schema);
    tcase_add_test(tc, test_open_migrates_version_5_state_indexes_to_finish_time_ones);
    tcase_add_test(tc, test_open_refuses_a_database_from_a_newer_version);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
