/* Transactions and writes. A store transaction is one SQLite transaction per shard it writes
 * to, each begun at that shard's first write. Every write runs inside a savepoint (but a write
 * of one statement inside a transaction, which SQLite undoes by itself), so that a failed write
 * undoes only its own rows whether or not the caller has a transaction open; blob files a
 * failed write created are removed at once. */
#include "store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

/* With sync_full, raises synchronous to FULL for a durable commit. SQLite takes the level only
 * outside a transaction, and re-prepares the PRAGMA each time it runs: so the rare durable
 * transactions switch, and the job path's relaxed ones do not. */
int store_raise_sync(shard_t *sh)
{
    if (!sh->st->sync_full) return 0;
    int r = store_stmt_run(&sh->conn, STMT_SYNC_FULL, "raising synchronous to FULL");
    sh->raised = r == 0;
    return r;
}

void store_lower_sync(shard_t *sh)
{
    if (sh->raised) store_stmt_run(&sh->conn, STMT_SYNC_NORMAL, "lowering synchronous to NORMAL");
    sh->raised = false;
}

static int begin(shard_t *sh, bool relaxed)
{
    if (sh->in_txn)
        return log_error_errno(-EBUSY, "store: store_begin with a transaction already open");
    if (atomic_load(&sh->st->damaged)) return -EUCLEAN; /* said once, when found */
    int r = relaxed ? 0 : store_raise_sync(sh);
    /* IMMEDIATE takes the write lock now, so that no write inside can fail on a lock upgrade. */
    if (r == 0) r = store_stmt_run(&sh->conn, STMT_BEGIN_IMMEDIATE, "BEGIN IMMEDIATE");
    if (r < 0) {
        store_lower_sync(sh);
        return r;
    }
    sh->in_txn = true;
    sh->relaxed = relaxed && sh->st->sync_full;
    sh->txn_row_bytes = 0;
    return 0;
}

/* Begins the shard's part of the store's open transaction, at its first write: the shards a
 * transaction leaves alone cost it nothing. */
int store_touch(shard_t *sh)
{
    if (sh->aborted) return -EIO;
    return sh->st->in_txn && !sh->in_txn ? begin(sh, sh->st->relaxed) : 0;
}

static int store_begin_txn(store_t *st, bool relaxed)
{
    if (st->in_txn)
        return log_error_errno(-EBUSY, "store: store_begin with a transaction already open");
    st->in_txn = true;
    st->relaxed = relaxed;
    return 0;
}

int store_begin(store_t *st)
{
    return store_begin_txn(st, false);
}

int store_begin_relaxed(store_t *st)
{
    return store_begin_txn(st, true);
}

static void txn_end(shard_t *sh, bool committed)
{
    for (size_t i = 0; !committed && i < sh->n_placed; i++) {
        free(sh->placed[i]->blob);
        sh->placed[i]->blob = NULL;
    }
    sh->n_placed = 0;
    sh->txn_refs.n = 0; /* written by the commit, or gone with the rollback */
    sh->txn_usage.n = 0;
    sh->write_has_usage = false;
    sh->in_txn = false;
    sh->relaxed = false;
    sh->aborted = false;
    store_lower_sync(sh);
}

int store_shard_commit(shard_t *sh)
{
    /* The segment bytes its rows name reach the disk first, relaxed or not: then WAL frames
     * that survive a power loss never name bytes that did not. */
    int r = sh->aborted ? -EIO : store_segment_sync(&sh->segment);
    if (r == 0) r = store_refs_write(sh, &sh->txn_refs);
    if (r == 0) r = store_usage_write(sh);
    if (r == 0) r = store_stmt_run(&sh->conn, STMT_COMMIT, "COMMIT");
    store_space_note(sh, r);
    if (r == 0) {
        /* Files whose rows a relaxed commit deleted stay until a durable one: a power loss
         * may bring those rows back. */
        if (sh->relaxed)
            sh->n_unlink_committed = sh->unlink.n;
        else
            store_unlink_pending(sh);
        txn_end(sh, true);
    } else if (sqlite3_get_autocommit(sh->conn.db)) {
        /* SQLite rolled the transaction back itself: nothing is left to commit or undo. */
        sh->unlink.n = sh->n_unlink_committed;
        txn_end(sh, false);
    }
    return r;
}

static int shard_rollback(shard_t *sh)
{
    /* A failed commit may have ended the transaction already (SQLite rolled it back). */
    if (!sh->in_txn) return 0;
    sh->unlink.n = sh->n_unlink_committed; /* the open transaction's rows are back */
    int r = sqlite3_get_autocommit(sh->conn.db)
                ? 0
                : store_stmt_run(&sh->conn, STMT_ROLLBACK, "ROLLBACK");
    txn_end(sh, false);
    return r;
}

/* Commits the shards' parts: side by side after writes that ran so, else one after the
 * other. SQLite has no commit across files in WAL mode: should one fail, the others may have
 * committed theirs (one after the other: those before it; those after it are rolled back),
 * which store_committed_shards tells. */
int store_commit(store_t *st)
{
    st->committed = 0;
    if (!st->in_txn) return log_error_errno(-EINVAL, "store: store_commit without store_begin");
    int r = store_flush(st, NULL, NULL);
    bool wants[STORE_MAX_SHARDS];
    for (int k = 0; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        /* A durable commit takes along the files that relaxed ones deleted rows of. */
        if (!st->relaxed && sh->n_unlink_committed > 0 && r == 0) r = store_touch(sh);
        wants[k] = sh->in_txn;
    }
    if (r == 0 && st->parallel_txn) {
        store_run_on_shards(st, TASK_COMMIT, wants, true);
        for (int k = 0; k < st->n_shards; k++) {
            if (!wants[k]) continue;
            if (r == 0) r = st->shards[k].commit_result;
            if (st->shards[k].commit_result == 0) st->committed |= 1u << k;
        }
    } else {
        for (int k = 0; k < st->n_shards; k++) {
            if (!wants[k]) continue;
            shard_t *sh = &st->shards[k];
            if (r == 0) {
                r = store_shard_commit(sh);
                if (r == 0) st->committed |= 1u << k;
            } else {
                shard_rollback(sh);
            }
        }
    }
    if (r < 0 && st->committed)
        log_error("store: a commit failed after %d shard(s) had committed their part",
                  __builtin_popcount(st->committed));
    /* After a failed commit the store's transaction stays open for store_rollback. */
    if (r == 0) {
        st->committed = ~0u;
        st->in_txn = st->relaxed = st->parallel_txn = false;
        store_files_settle(st);
    }
    return r;
}

unsigned store_committed_shards(const store_t *st)
{
    return st->committed;
}

int store_rollback(store_t *st)
{
    if (!st->in_txn) return 0;
    st->deferring = false;
    for (int k = 0; k < st->n_shards; k++)
        st->shards[k].deferred.n = 0;
    int r = 0;
    for (int k = 0; k < st->n_shards; k++) {
        int e = shard_rollback(&st->shards[k]);
        if (r == 0) r = e;
    }
    st->in_txn = st->relaxed = st->parallel_txn = false;
    store_files_settle(st);
    return r;
}

int store_wal_paths(const store_t *st, const char *ret[STORE_MAX_SHARDS])
{
    if (!st->sync_full) return 0;
    for (int k = 0; k < st->n_shards; k++)
        ret[k] = sqlite3_filename_wal(sqlite3_db_filename(st->shards[k].conn.db, "main"));
    return st->n_shards;
}

/* --- one write: a savepoint around it, unless it is one statement in a transaction --- */

/* Empties what a write collects (its tensors' records and file counts) before it places
 * them. */
void store_write_reset(shard_t *sh)
{
    sh->write_refs.n = 0;
    sh->cols.len = sh->data.len = 0;
}

/* SQLite rolled back the shard's open transaction after an error in one of its writes. */
static void abort_txn(shard_t *sh)
{
    log_error("store: SQLite rolled back the whole open transaction of shard %d after an error",
              sh->index);
    sh->aborted = true;
}

/* Outside a transaction the write commits by itself, durably. A write of one statement inside
 * a transaction (one_statement, its file counts all noted already) needs no savepoint: SQLite
 * undoes a failed statement by itself, and room for the counts is made here, so that nothing
 * can fail once the statement ran: a savepoint would cost the loop two more statements per job. */
int store_write_begin(shard_t *sh, bool one_statement)
{
    sh->write_savepoint = !sh->in_txn || !one_statement;
    if (!sh->in_txn && atomic_load(&sh->st->damaged)) return -EUCLEAN; /* said once, when found */
    if (!sh->write_savepoint) return store_refs_reserve(&sh->txn_refs, sh->write_refs.n);
    int r = sh->in_txn ? 0 : store_raise_sync(sh);
    if (r == 0) r = store_stmt_run(&sh->conn, STMT_SAVEPOINT, "starting a write");
    if (r < 0 && !sh->in_txn) store_lower_sync(sh);
    return r;
}

/* Ends a write begun by store_write_begin: keeps it when r is 0 (committing it when no caller's
 * transaction is open), else undoes it. Returns r, or the error of the release. */
int store_write_end(shard_t *sh, int r)
{
    if (!sh->write_savepoint) {
        if (r == 0)
            store_refs_merge(&sh->txn_refs, &sh->write_refs);
        else if (sqlite3_get_autocommit(sh->conn.db))
            abort_txn(sh);
        return r;
    }
    /* Outside a transaction the release commits: the segment bytes and the file counts go
     * first, as in store_commit. Inside one, the counts join the transaction's (room made
     * first, so that nothing can fail once the write is kept). */
    if (r == 0 && !sh->in_txn) r = store_segment_sync(&sh->segment);
    if (r == 0)
        r = sh->in_txn ? store_refs_reserve(&sh->txn_refs, sh->write_refs.n)
                       : store_refs_write(sh, &sh->write_refs);
    if (r == 0) r = store_stmt_run(&sh->conn, STMT_RELEASE, "committing a write");
    if (!sh->in_txn) store_space_note(sh, r);
    if (r == 0) {
        if (sh->in_txn) store_refs_merge(&sh->txn_refs, &sh->write_refs);
        if (!sh->in_txn) {
            store_lower_sync(sh);
            store_files_settle(sh->st);
        }
        return 0;
    }
    if (!sqlite3_get_autocommit(sh->conn.db)) {
        store_stmt_run(&sh->conn, STMT_ROLLBACK_TO, "undoing a failed write");
        store_stmt_run(&sh->conn, STMT_RELEASE, "undoing a failed write");
        if (!sh->in_txn && !sqlite3_get_autocommit(sh->conn.db)) store_exec(&sh->conn, "ROLLBACK");
    } else if (sh->in_txn) {
        abort_txn(sh);
    }
    if (!sh->in_txn) {
        store_lower_sync(sh);
        store_files_settle(sh->st);
    }
    return r;
}
