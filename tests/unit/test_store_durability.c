/* The durable store's commits (daemon/store/store.h): a failed write inside a transaction undoes
 * only its own rows and files, a relaxed commit keeps deleted files until a durable one, the
 * checkpoint truncates the WAL, and a committed job survives kill -9. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/store/store.h"
#include "support/run_suite.h"
#include "support/store_test.h"

START_TEST(test_failed_insert_in_a_transaction_undoes_only_its_own_rows)
{
    store_test_t f;
    store_test_setup(&f);
    job_t *a = store_test_make_job(&store_test_op, "alice", now_us());
    snprintf(a->idempotency_key, sizeof a->idempotency_key, "k");
    job_t *b = store_test_make_job(&store_test_op, "alice", now_us());
    snprintf(b->idempotency_key, sizeof b->idempotency_key, "k");
    b->call.has_in[1] = true;
    store_test_tensor_set(&b->in[1], "y", 8, 1);
    b->call.in[1] = b->in[1].desc;

    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, a), 0);
    ck_assert_int_eq(store_job_insert(f.st, b), -EEXIST);
    ck_assert_int_eq(store_commit(f.st), 0);

    job_t *got = store_test_get_job(&f, a->id);
    job_free(got);
    sqlite3 *db;
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", f.dir);
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *stmt;
    ck_assert_int_eq(
        sqlite3_prepare_v2(db, "SELECT count(*), count(inputs) FROM jobs", -1, &stmt, NULL),
        SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
    ck_assert_int_eq(sqlite3_column_int(stmt, 0), 1); /* a, with its tensor; not b */
    ck_assert_int_eq(sqlite3_column_int(stmt, 1), 1);
    sqlite3_finalize(stmt);
    sqlite3_close(db);

    /* A rolled-back transaction leaves nothing. */
    job_t *c = store_test_make_job(&store_test_op, "alice", now_us());
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, c), 0);
    ck_assert_int_eq(store_rollback(f.st), 0);
    job_t *none = NULL;
    ck_assert_int_eq(store_job_get(f.rd, c->id, &none), -ENOENT);
    job_free(c);
    job_free(b);
    job_free(a);
    store_test_teardown(&f);
}
END_TEST

/* Inside a transaction a write of one statement has no savepoint of its own: a refused insert
 * or update still leaves no row, no file and no file count behind, and the transaction's
 * other writes commit. */
START_TEST(test_failed_writes_in_a_transaction_leave_no_rows_files_or_counts)
{
    store_test_t f;
    store_test_setup_inline(&f, 16); /* every tensor in a file: no job_bytes rows */
    job_t *a = store_test_make_job(&store_test_op, "alice", now_us());
    snprintf(a->idempotency_key, sizeof a->idempotency_key, "k");
    job_t *b = store_test_make_job(&store_test_op, "alice", now_us());
    snprintf(b->idempotency_key, sizeof b->idempotency_key, "k");
    job_t *c = store_test_make_job(&store_test_op, "alice", now_us());
    for (int i = 0; i < 2; i++) {
        job_t *job = i ? c : b;
        /* Written already, as sched_submit does: the row only names the file, and counts it. */
        job_tensor_t *x = &job->in[0];
        ck_assert_int_eq(store_blob_write(f.st, x->data, x->nbytes, &x->blob), 0);
    }

    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, a), 0);
    ck_assert_int_eq(store_job_insert(f.st, b), -EEXIST);
    a->state = JOB_SUCCEEDED; /* a is queued: refused */
    ck_assert_int_eq(store_job_update(f.st, a), -EBUSY);
    ck_assert_int_eq(store_job_insert(f.st, c), 0);
    ck_assert_int_eq(store_commit(f.st), 0);

    ck_assert_int_eq(store_test_db_int(&f, "SELECT count(*) FROM jobs"), 2);
    job_t *got = store_test_get_job(&f, a->id);
    ck_assert_int_eq(got->state, JOB_QUEUED);
    job_free(got);
    ck_assert_int_eq(store_test_db_int(&f, "SELECT count(*) FROM blob_refs"),
                     2); /* a's file, c's */
    ck_assert_int_eq(store_test_db_int(&f, "SELECT sum(refs) FROM blob_refs"), 2);
    store_blob_discard(f.st, b->in[0].blob); /* what its refused submitter does */
    ck_assert_int_eq(store_test_count_blob_files(&f), 2);
    job_free(c);
    job_free(b);
    job_free(a);
    store_test_teardown(&f);
}
END_TEST

/* Makes SQLite refuse a job row that names tensors in files (inputs at insert, outputs at an
 * update), as a disk or constraint failure would once those files are written. */
static void inject_row_failure(store_test_t *f)
{
    store_test_db_exec(
        f, "CREATE TRIGGER fail_insert BEFORE INSERT ON jobs WHEN NEW.inputs IS NOT NULL "
           "BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
           "CREATE TRIGGER fail_update BEFORE UPDATE ON jobs WHEN NEW.outputs IS NOT NULL "
           "BEGIN SELECT RAISE(ABORT, 'injected failure'); END");
}

START_TEST(test_failed_write_removes_the_files_it_wrote_and_its_rows)
{
    store_test_t f;
    store_test_setup(&f);
    char queued[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), queued);
    ck_assert_int_eq(store_test_set_state(&f, queued, JOB_RUNNING), 0);
    inject_row_failure(&f);

    /* Slots 1 and 2 go to files before the row fails. */
    job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
    for (int j = 1; j < 3; j++) {
        job->call.has_in[j] = true;
        store_test_tensor_set(&job->in[j], store_test_inputs[j], 4096, (unsigned)j);
        job->call.in[j] = job->in[j].desc;
    }
    ck_assert_int_eq(store_job_insert(f.st, job), -EIO);
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);
    for (int j = 0; j < 3; j++)
        ck_assert_ptr_null(job->in[j].blob);
    store_list_query_t q = {.state = -1, .limit = 10};
    job_t **jobs;
    size_t n;
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), 0);
    ck_assert_uint_eq(n, 1); /* only the job inserted before */
    job_free(jobs[0]);
    free(jobs);

    /* The same for outputs: the job stays running, with no outputs and no files. */
    job_t *running = store_test_get_job(&f, queued);
    running->state = JOB_SUCCEEDED;
    running->call.n_out = 3;
    for (int j = 0; j < 3; j++) {
        running->call.out_names[j] = store_test_inputs[j];
        store_test_tensor_set(&running->out[j], store_test_inputs[j], 4096, (unsigned)j);
    }
    ck_assert_int_eq(store_job_update(f.st, running), -EIO);
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);
    ck_assert_int_eq(store_test_db_int(&f, "SELECT count(*) FROM blob_refs"),
                     0); /* no file counted */
    job_t *after = store_test_get_job(&f, queued);
    ck_assert_int_eq(after->state, JOB_RUNNING);
    ck_assert_ptr_null(after->out[0].blob);
    ck_assert_ptr_null(after->out[1].blob);
    job_free(after);
    job_free(running);
    job_free(job);
    store_test_teardown(&f);
}
END_TEST

/* A relaxed transaction (a job's start or end) commits like any other, but files whose rows it
 * deleted wait for the next durable commit: a power loss could bring those rows back. */
START_TEST(test_a_relaxed_commit_keeps_deleted_files_until_a_durable_one)
{
    store_test_t f;
    store_test_setup(&f);
    buffer_t *buf = buffer_new();
    snprintf(buf->owner, OWNER_SIZE, "alice");
    buf->desc = (tensor_desc_t){.dtype = DTYPE_I32, .ndim = 1, .shape = {100000}};
    buf->nbytes = 400000;
    buf->data = malloc(buf->nbytes);
    store_test_fill_bytes(buf->data, buf->nbytes, 7);
    ck_assert_int_eq(store_buffer_insert(f.st, buf), 0);
    ck_assert_int_eq(strncmp(buf->blob, "file:", 5), 0);

    /* Rolled back: row and file stay. */
    buffer_t *got = NULL;
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    ck_assert_int_eq(store_buffer_delete(f.st, "alice", buf->id), 0);
    ck_assert_int_eq(store_rollback(f.st), 0);
    ck_assert_int_eq(store_buffer_get(f.rd, buf->id, &got), 0);
    buffer_free(got);
    ck_assert(store_test_blob_file_exists(&f, buf->blob));

    /* Committed relaxed: the row is gone for readers, the file stays. */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    ck_assert_int_eq(store_buffer_delete(f.st, "alice", buf->id), 0);
    ck_assert_int_eq(store_commit(f.st), 0);
    ck_assert_int_eq(store_buffer_get(f.rd, buf->id, &got), -ENOENT);
    ck_assert(store_test_blob_file_exists(&f, buf->blob));

    /* A later transaction rolled back keeps it too; the next durable commit removes it. */
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_rollback(f.st), 0);
    ck_assert(store_test_blob_file_exists(&f, buf->blob));
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_commit(f.st), 0);
    ck_assert(!store_test_blob_file_exists(&f, buf->blob));
    buffer_free(buf);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_committed_job_survives_kill_9_and_uncommitted_one_does_not)
{
    store_test_t f;
    store_test_setup(&f);
    store_reader_close(f.rd);
    store_close(f.st);
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        store_t *st;
        char ids[2][ID_SIZE];
        if (store_open(&f.cfg, &st) < 0) _exit(1);
        job_t *committed = store_test_make_job(&store_test_op, "alice", now_us());
        committed->call.has_in[1] = true;
        store_test_tensor_set(&committed->in[1], "y", 4096, 8);
        committed->call.in[1] = committed->in[1].desc;
        if (store_begin(st) < 0 || store_job_insert(st, committed) < 0 || store_commit(st) < 0)
            _exit(2);
        job_t *pending = store_test_make_job(&store_test_op, "alice", now_us());
        if (store_begin(st) < 0 || store_job_insert(st, pending) < 0) _exit(3);
        memcpy(ids[0], committed->id, ID_SIZE);
        memcpy(ids[1], pending->id, ID_SIZE);
        if (write(pipefd[1], ids, sizeof ids) != sizeof ids) _exit(4);
        _exit(0); /* no close, no commit: as a kill -9 leaves it */
    }
    close(pipefd[1]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    char ids[2][ID_SIZE];
    ck_assert_int_eq(read(pipefd[0], ids, sizeof ids), sizeof ids);
    close(pipefd[0]);

    ck_assert_int_eq(store_open(&f.cfg, &f.st), 0);
    ck_assert_int_eq(store_reader_open(f.st, &f.rd), 0);
    job_t *got = store_test_get_job(&f, ids[0]);
    ck_assert_int_eq(got->state, JOB_QUEUED);
    void *expected = malloc(4096 * 4);
    store_test_fill_bytes(expected, 4096 * 4, 8);
    store_test_assert_blob_bytes(&f, got->in[1].blob, expected, 4096 * 4);
    free(expected);
    job_free(got);
    job_t *none = NULL;
    ck_assert_int_eq(store_job_get(f.rd, ids[1], &none), -ENOENT);
    store_test_teardown(&f);
}
END_TEST

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

START_TEST(test_checkpoint_truncates_the_wal_and_does_not_wait_for_a_reader)
{
    store_test_t f;
    store_test_setup(&f);
    char id[ID_SIZE];
    for (int i = 0; i < 50; i++)
        store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
    char wal[128];
    snprintf(wal, sizeof wal, "%s/gpujobd.db-wal", f.dir);
    struct stat sb;
    ck_assert_int_eq(stat(wal, &sb), 0);
    ck_assert_int_gt(sb.st_size, 0);
    ck_assert_int_eq(store_upkeep(f.st), 0);
    ck_assert_int_eq(stat(wal, &sb), 0);
    ck_assert_int_eq(sb.st_size, 0);

    /* A reader in the middle of a read transaction: TRUNCATE would have to wait for it. */
    for (int i = 0; i < 50; i++)
        store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
    sqlite3 *db;
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", f.dir);
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "BEGIN; SELECT count(*) FROM jobs;", NULL, NULL, NULL),
                     SQLITE_OK);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(store_upkeep(f.st), 0);
    ck_assert_double_lt(seconds_since(&t0), 1.0);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(db);
    store_test_teardown(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_durability");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_failed_insert_in_a_transaction_undoes_only_its_own_rows);
    tcase_add_test(tc, test_failed_writes_in_a_transaction_leave_no_rows_files_or_counts);
    tcase_add_test(tc, test_failed_write_removes_the_files_it_wrote_and_its_rows);
    tcase_add_test(tc, test_a_relaxed_commit_keeps_deleted_files_until_a_durable_one);
    tcase_add_test(tc, test_committed_job_survives_kill_9_and_uncommitted_one_does_not);
    tcase_add_test(tc, test_checkpoint_truncates_the_wal_and_does_not_wait_for_a_reader);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
