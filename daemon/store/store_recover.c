/* Recovery after a restart: running jobs go back to the queue (or fail past their attempts),
 * and every queued job is handed back to the caller, oldest first. */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

static int recover_states(shard_t *sh, int max_attempts)
{
    char requeue[160], fail[512];
    int64_t now = now_us();
    snprintf(requeue, sizeof requeue,
             "UPDATE jobs SET state = 'queued' WHERE " STORE_LIVE " AND state = 'running' "
             "AND attempts < %d",
             max_attempts);
    snprintf(fail, sizeof fail,
             "UPDATE jobs SET state = 'failed', finished_us = %" PRId64 ", "
             "error_code = 'daemon_restarted', "
             "error_message = printf('the daemon restarted while the job was running, "
             "after %%d attempt(s) (the limit is %d)', attempts) "
             "WHERE " STORE_LIVE " AND state = 'running'",
             now, max_attempts);
    int r = store_raise_sync(sh);
    if (r == 0) r = store_exec(&sh->conn, "BEGIN IMMEDIATE");
    if (r < 0) {
        store_lower_sync(sh);
        return r;
    }
    r = store_exec(&sh->conn, requeue);
    int requeued = sqlite3_changes(sh->conn.db);
    /* The jobs failed next, which the re-queue left running, count in the usage rollup. */
    if (r == 0)
        r = store_usage_note_failing(
            sh, "id IN (SELECT id FROM jobs INDEXED BY jobs_running WHERE state = 'running')", now);
    if (r == 0) r = store_exec(&sh->conn, fail);
    int failed = sqlite3_changes(sh->conn.db);
    if (r == 0) r = store_exec(&sh->conn, "COMMIT");
    if (r < 0 && !sqlite3_get_autocommit(sh->conn.db)) store_exec(&sh->conn, "ROLLBACK");
    store_lower_sync(sh);
    if (r < 0) return r;
    if (requeued || failed)
        log_info("store: recovery: %d running job(s) re-queued, %d failed after too many "
                 "attempts",
                 requeued, failed);
    return 0;
}

int store_recover_crashed(store_t *st, const char *id, const char *code, const char *message,
                          bool *ret_failed)
{
    if (st->in_txn)
        return log_error_errno(-EBUSY, "store: store_recover_crashed inside a transaction");
    shard_t *sh = store_shard_of(st, id);
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(sh->conn.db,
                           "UPDATE jobs SET state = 'failed', finished_us = ?, error_code = ?, "
                           "error_message = ? WHERE id = ? AND " STORE_LIVE,
                           -1, &stmt, NULL) != SQLITE_OK)
        return store_sql_error(&sh->conn, "failing a crashed job");
    int64_t now = now_us();
    sqlite3_bind_int64(stmt, 1, now);
    store_bind_text(stmt, 2, code, false);
    store_bind_text(stmt, 3, message, false);
    store_bind_text(stmt, 4, id, false);
    char *where = sqlite3_mprintf("id = %Q", id);
    /* Durable like the rest of recovery: the list that names the job is emptied next. The
     * rollup's line and the job's end are one transaction. */
    int r = where ? store_raise_sync(sh) : -ENOMEM;
    if (r == 0) r = store_exec(&sh->conn, "BEGIN IMMEDIATE");
    if (r == 0) r = store_usage_note_failing(sh, where, now);
    if (r == 0 && sqlite3_step(stmt) != SQLITE_DONE)
        r = store_sql_error(&sh->conn, "failing a crashed job");
    bool failed = r == 0 && sqlite3_changes(sh->conn.db) > 0;
    if (r == 0) r = store_exec(&sh->conn, "COMMIT");
    if (r < 0 && !sqlite3_get_autocommit(sh->conn.db)) store_exec(&sh->conn, "ROLLBACK");
    sqlite3_free(where);
    sqlite3_finalize(stmt);
    if (where) store_lower_sync(sh);
    if (r < 0) return r;
    *ret_failed = failed;
    return 0;
}

/* ------------------------------------------------------- queued jobs, compactly */

/* One shard's queued jobs, oldest first, as a cursor. */
typedef struct queued_cursor {
    shard_t *sh;
    sqlite3_stmt *stmt;
    bool has_row;
} queued_cursor_t;

/* Steps c to its next row; 0 (c->has_row says whether there is one) or the store's error. */
static int queued_cursor_step(queued_cursor_t *c)
{
    int rc = sqlite3_step(c->stmt);
    c->has_row = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) return 0;
    return store_sql_error(&c->sh->conn, "listing queued jobs");
}

static int queued_cursor_open(shard_t *sh, queued_cursor_t *c)
{
    c->sh = sh;
    if (sqlite3_prepare_v2(sh->conn.db,
                           "SELECT id, owner, priority, device, created_us, deadline_us, "
                           "batch_key, cost_bytes, cost_flops FROM jobs INDEXED BY jobs_queued "
                           "WHERE state = 'queued' ORDER BY created_us, id",
                           -1, &c->stmt, NULL) != SQLITE_OK)
        return store_sql_error(&sh->conn, "listing queued jobs");
    return queued_cursor_step(c);
}

/* Whether cursor a's row comes before b's: older, then by id, in the order recovery hands them
 * over. */
static bool queued_cursor_before(const queued_cursor_t *a, const queued_cursor_t *b)
{
    int64_t ta = sqlite3_column_int64(a->stmt, 4), tb = sqlite3_column_int64(b->stmt, 4);
    if (ta != tb) return ta < tb;
    return strcmp((const char *)sqlite3_column_text(a->stmt, 0),
                  (const char *)sqlite3_column_text(b->stmt, 0)) < 0;
}

/* Hands c's row to cb. A row from before the batch_key column is read whole and resolved for
 * its batch key and cost. */
static int queued_cursor_emit(queued_cursor_t *c, int (*resolve)(job_t *job),
                              void (*cb)(const store_queued_t *q, void *ud), void *ud)
{
    sqlite3_stmt *row = c->stmt;
    store_queued_t q = {.priority = sqlite3_column_int(row, 2),
                        .device = sqlite3_column_int(row, 3),
                        .created_us = sqlite3_column_int64(row, 4),
                        .deadline_us = sqlite3_column_int64(row, 5),
                        .batch_key = (const char *)sqlite3_column_text(row, 6),
                        .cost = {sqlite3_column_double(row, 7), sqlite3_column_double(row, 8)}};
    store_column_copy(row, 0, q.id, sizeof q.id);
    store_column_copy(row, 1, q.owner, sizeof q.owner);
    if (q.batch_key) {
        cb(&q, ud);
        return 0;
    }
    job_t *job;
    int r = store_job_read(&c->sh->conn, q.id, &job);
    if (r == 0 && resolve && (r = resolve(job)) < 0) job_free(job);
    if (r < 0) return r;
    q.batch_key = job->call.batch_key;
    q.cost = job->call.cost;
    cb(&q, ud);
    job_free(job);
    return 0;
}

int store_recover_queued(store_t *st, int max_attempts, int (*resolve)(job_t *job),
                         void (*cb)(const store_queued_t *q, void *ud), void *ud)
{
    if (st->in_txn)
        return log_error_errno(-EBUSY, "store: store_recover_queued inside a transaction");
    queued_cursor_t cur[STORE_MAX_SHARDS] = {{0}};
    int r = store_buffers_forget_ephemeral(st);
    for (int k = 0; k < st->n_shards && r == 0; k++)
        r = recover_states(&st->shards[k], max_attempts);
    for (int k = 0; k < st->n_shards && r == 0; k++)
        r = queued_cursor_open(&st->shards[k], &cur[k]);
    /* Oldest first across the shards: each shard's rows come sorted, and are merged. */
    size_t n = 0;
    while (r == 0) {
        queued_cursor_t *next = NULL;
        for (int k = 0; k < st->n_shards; k++)
            if (cur[k].has_row && (!next || queued_cursor_before(&cur[k], next))) next = &cur[k];
        if (!next) break;
        r = queued_cursor_emit(next, resolve, cb, ud);
        if (r == 0) r = queued_cursor_step(next);
        n++;
    }
    for (int k = 0; k < st->n_shards; k++)
        sqlite3_finalize(cur[k].stmt);
    if (r == 0 && n > 0) log_info("store: recovery: %zu queued job(s) handed back", n);
    /* What recovery reads was checked as it was read: the rest is checked while serving. */
    if (r == 0) r = store_check_start(st);
    return r;
}
