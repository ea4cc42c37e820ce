/* The usage rollup and the fair-share state: what outlives the jobs. usage_daily sums the
 * jobs that ended by owner, day (UTC) and op; each job's end adds to it in the same write that
 * records the end, so that the two never disagree, and retention, which deletes jobs, never
 * touches it. Every shard keeps the rollup of its own jobs (a job's end writes its own shard
 * alone) and reads sum the shards. fair_share, in shard 0, keeps the scheduler's decayed usage
 * per owner across restarts. */
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "daemon/util/vec.h"
#include "store_internal.h"

/* The bytes of a job's inputs, and of its outputs when it succeeded. */
static void job_bytes_moved(const job_t *job, int64_t *ret_in, int64_t *ret_out)
{
    int64_t in = 0, out = 0;
    for (int j = 0; j < OP_MAX_TENSORS; j++)
        if (job->call.has_in[j] || job->in[j].name[0]) in += (int64_t)job->in[j].nbytes;
    for (int j = 0; job->state == JOB_SUCCEEDED && j < job->call.n_out && j < OP_MAX_TENSORS; j++)
        out += (int64_t)job->out[j].nbytes;
    *ret_in = in;
    *ret_out = out;
}

int store_usage_note_end(shard_t *sh, const job_t *job, int64_t started_us, int64_t finished_us)
{
    const char *op = job_op_name(job);
    if (!job->owner[0] || !op)
        return log_error_errno(-EINVAL, "store: %s: an ended job without owner or op", job->id);
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_USAGE_ADD);
    if (!stmt) return -EIO;
    int64_t in, out;
    job_bytes_moved(job, &in, &out);
    store_bind_text(stmt, 1, job->owner, false);
    sqlite3_bind_int64(stmt, 2, finished_us / STORE_USAGE_DAY_US);
    store_bind_text(stmt, 3, op, false);
    sqlite3_bind_int(stmt, 4, job->state == JOB_SUCCEEDED);
    sqlite3_bind_int(stmt, 5, job->state == JOB_FAILED);
    sqlite3_bind_int(stmt, 6, job->state == JOB_CANCELLED);
    /* The run time that the job's answer shows (run_ms): from its start to its end. */
    sqlite3_bind_int64(stmt, 7,
                       started_us > 0 && finished_us >= started_us ? finished_us - started_us : 0);
    sqlite3_bind_int64(stmt, 8, job->gpu_ns);
    sqlite3_bind_int64(stmt, 9, in);
    sqlite3_bind_int64(stmt, 10, out);
    int r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(&sh->conn, "adding to usage");
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    return r;
}

int store_usage_note_failing(shard_t *sh, const char *where, int64_t finished_us)
{
    char *sql = sqlite3_mprintf(
        "INSERT INTO usage_daily (owner, day, op, jobs, succeeded, failed, cancelled, run_us, "
        "gpu_ns, bytes_in, bytes_out) "
        "SELECT owner, %lld, op, count(*), 0, count(*), 0, "
        "  sum(CASE WHEN started_us > 0 AND started_us <= %lld THEN %lld - started_us "
        "    ELSE 0 END), sum(gpu_ns), 0, 0 "
        "FROM jobs WHERE " STORE_LIVE " AND (%s) GROUP BY owner, op "
        "ON CONFLICT (owner, day, op) DO UPDATE SET jobs = jobs + excluded.jobs, "
        "failed = failed + excluded.failed, run_us = run_us + excluded.run_us, "
        "gpu_ns = gpu_ns + excluded.gpu_ns",
        (long long)(finished_us / STORE_USAGE_DAY_US), (long long)finished_us,
        (long long)finished_us, where);
    if (!sql) return -ENOMEM;
    int r = store_exec(&sh->conn, sql);
    sqlite3_free(sql);
    return r;
}

/* --- fair share --- */

int store_fair_share_save(store_t *st, const store_fair_share_t *users, size_t n)
{
    if (st->in_txn) return log_error_errno(-EBUSY, "store: fair share saved inside a transaction");
    /* A store found damaged takes no more writes (said once, when found); the usage since the
     * last save is what a stop would lose anyway. */
    if (atomic_load(&st->damaged)) return 0;
    store_conn_t *conn = &st->shards[0].conn;
    sqlite3_stmt *stmt = NULL;
    int r = store_exec(conn, "BEGIN IMMEDIATE");
    if (r == 0) r = store_exec(conn, "DELETE FROM fair_share");
    if (r == 0 && sqlite3_prepare_v2(conn->db,
                                     "INSERT INTO fair_share (owner, usage_us, at_us) "
                                     "VALUES (?1, ?2, ?3)",
                                     -1, &stmt, NULL) != SQLITE_OK)
        r = store_sql_error(conn, "saving fair share");
    for (size_t i = 0; r == 0 && i < n; i++) {
        store_bind_text(stmt, 1, users[i].owner, false);
        sqlite3_bind_double(stmt, 2, users[i].usage_us);
        sqlite3_bind_int64(stmt, 3, users[i].at_us);
        if (sqlite3_step(stmt) != SQLITE_DONE) r = store_sql_error(conn, "saving fair share");
        sqlite3_reset(stmt);
    }
    sqlite3_finalize(stmt);
    if (r == 0) r = store_exec(conn, "COMMIT");
    if (r < 0 && !sqlite3_get_autocommit(conn->db)) store_exec(conn, "ROLLBACK");
    return r;
}

int store_fair_share_load(store_t *st, store_fair_share_t **ret, size_t *ret_n)
{
    store_conn_t *conn = &st->shards[0].conn;
    sqlite3_stmt *stmt = NULL;
    store_fair_share_t *a = NULL;
    size_t n = 0, cap = 0;
    int r = 0, rc;
    if (sqlite3_prepare_v2(conn->db, "SELECT owner, usage_us, at_us FROM fair_share", -1, &stmt,
                           NULL) != SQLITE_OK)
        return store_sql_error(conn, "loading fair share");
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        if ((r = vec_grow((void **)&a, &cap, n + 1, sizeof *a, 16)) < 0) break;
        store_column_copy(stmt, 0, a[n].owner, sizeof a[n].owner);
        a[n].usage_us = sqlite3_column_double(stmt, 1);
        a[n].at_us = sqlite3_column_int64(stmt, 2);
        n++;
    }
    if (r == 0 && rc != SQLITE_DONE) r = store_sql_error(conn, "loading fair share");
    sqlite3_finalize(stmt);
    if (r < 0) {
        free(a);
        return r;
    }
    *ret = a;
    *ret_n = n;
    return 0;
}
