/* The usage rollup and the fair-share state: what outlives the jobs. usage_daily sums the
 * jobs that ended by owner, day (UTC) and op; each job's end adds to it in the same write that
 * records the end, or, inside a transaction, in its commit (one statement per row for all its
 * ends), so that the two never disagree, and retention, which deletes jobs, never touches it. Every
 * shard keeps the rollup of its own jobs (a job's end writes its own shard alone) and reads sum the
 * shards. fair_share, in shard 0, keeps the scheduler's decayed usage per owner across restarts. */
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

/* Fills d with what job, just ended, adds to its row of the rollup; -EINVAL when it has no
 * owner or op. */
static int usage_delta_of(const job_t *job, int64_t started_us, int64_t finished_us,
                          usage_delta_t *d)
{
    const char *op = job_op_name(job);
    if (!job->owner[0] || !op)
        return log_error_errno(-EINVAL, "store: %s: an ended job without owner or op", job->id);
    snprintf(d->owner, sizeof d->owner, "%s", job->owner);
    snprintf(d->op, sizeof d->op, "%s", op);
    d->day = finished_us / STORE_USAGE_DAY_US;
    d->jobs = 1;
    d->succeeded = job->state == JOB_SUCCEEDED;
    d->failed = job->state == JOB_FAILED;
    d->cancelled = job->state == JOB_CANCELLED;
    /* The run time that the job's answer shows (run_ms): from its start to its end. */
    d->run_us = started_us > 0 && finished_us >= started_us ? finished_us - started_us : 0;
    d->gpu_ns = job->gpu_ns;
    job_bytes_moved(job, &d->bytes_in, &d->bytes_out);
    return 0;
}

/* Adds d to its row of the rollup, in the shard's open write or transaction. */
static int usage_write_delta(shard_t *sh, const usage_delta_t *d)
{
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_USAGE_ADD);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, d->owner, false);
    sqlite3_bind_int64(stmt, 2, d->day);
    store_bind_text(stmt, 3, d->op, false);
    sqlite3_bind_int64(stmt, 4, d->succeeded);
    sqlite3_bind_int64(stmt, 5, d->failed);
    sqlite3_bind_int64(stmt, 6, d->cancelled);
    sqlite3_bind_int64(stmt, 7, d->run_us);
    sqlite3_bind_int64(stmt, 8, d->gpu_ns);
    sqlite3_bind_int64(stmt, 9, d->bytes_in);
    sqlite3_bind_int64(stmt, 10, d->bytes_out);
    sqlite3_bind_int64(stmt, 11, d->jobs);
    int r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(&sh->conn, "adding to usage");
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    return r;
}

int store_usage_note_end(shard_t *sh, const job_t *job, int64_t started_us, int64_t finished_us)
{
    usage_delta_t d;
    int r = usage_delta_of(job, started_us, finished_us, &d);
    return r < 0 ? r : usage_write_delta(sh, &d);
}

int store_usage_prepare(shard_t *sh, const job_t *job)
{
    sh->write_has_usage = false;
    if (!job->owner[0] || !job_op_name(job))
        return log_error_errno(-EINVAL, "store: %s: an ended job without owner or op", job->id);
    int r = vec_grow((void **)&sh->txn_usage.a, &sh->txn_usage.cap, sh->txn_usage.n + 1,
                     sizeof *sh->txn_usage.a, 8);
    return r < 0 ? -ENOMEM : 0;
}

void store_usage_collect(shard_t *sh, const job_t *job, int64_t started_us, int64_t finished_us)
{
    /* store_usage_prepare checked what could make this fail. */
    sh->write_has_usage = usage_delta_of(job, started_us, finished_us, &sh->write_usage) == 0;
}

void store_usage_keep(shard_t *sh)
{
    if (!sh->write_has_usage) return;
    sh->write_has_usage = false;
    const usage_delta_t *d = &sh->write_usage;
    usage_deltas_t *t = &sh->txn_usage;
    /* A transaction's ends share a handful of rows: the last one matches most often. */
    for (size_t i = t->n; i-- > 0;) {
        usage_delta_t *a = &t->a[i];
        if (a->day != d->day || strcmp(a->owner, d->owner) != 0 || strcmp(a->op, d->op) != 0)
            continue;
        a->jobs += d->jobs;
        a->succeeded += d->succeeded;
        a->failed += d->failed;
        a->cancelled += d->cancelled;
        a->run_us += d->run_us;
        a->gpu_ns += d->gpu_ns;
        a->bytes_in += d->bytes_in;
        a->bytes_out += d->bytes_out;
        return;
    }
    t->a[t->n++] = *d; /* room made by store_usage_prepare */
}

int store_usage_write(shard_t *sh)
{
    int r = 0;
    for (size_t i = 0; i < sh->txn_usage.n && r == 0; i++)
        r = usage_write_delta(sh, &sh->txn_usage.a[i]);
    if (r == 0) sh->txn_usage.n = 0;
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

int store_job_charge(store_t *st, const store_charge_t *c)
{
    if (st->in_txn) return log_error_errno(-EBUSY, "store: a job charged inside a transaction");
    if (atomic_load(&st->damaged)) return -EUCLEAN; /* said once, when found */
    shard_t *sh = store_shard_of(st, c->id);
    usage_delta_t d = {.day = c->finished_us / STORE_USAGE_DAY_US, .gpu_ns = c->delta_ns};
    snprintf(d.owner, sizeof d.owner, "%s", c->owner);
    snprintf(d.op, sizeof d.op, "%s", c->op);
    int r = store_exec(&sh->conn, "BEGIN IMMEDIATE");
    if (r == 0) r = usage_write_delta(sh, &d);
    sqlite3_stmt *stmt = NULL;
    if (r == 0 &&
        sqlite3_prepare_v2(sh->conn.db,
                           "UPDATE jobs SET gpu_ns = gpu_ns + ?2 WHERE id = ?1 AND " STORE_ENDED,
                           -1, &stmt, NULL) != SQLITE_OK)
        r = store_sql_error(&sh->conn, "charging a job");
    if (r == 0) {
        store_bind_text(stmt, 1, c->id, false);
        sqlite3_bind_int64(stmt, 2, c->delta_ns);
        if (sqlite3_step(stmt) != SQLITE_DONE) r = store_sql_error(&sh->conn, "charging a job");
    }
    sqlite3_finalize(stmt);
    if (r == 0) r = store_exec(&sh->conn, "COMMIT");
    if (r < 0 && !sqlite3_get_autocommit(sh->conn.db)) store_exec(&sh->conn, "ROLLBACK");
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
