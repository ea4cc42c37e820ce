/* WAL checkpoints: store_checkpoint on the writer's connection, and the checkpointer, which
 * copies the WAL back into the database file on another thread while the writer only counts
 * its pages. */
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

/* WAL pages past which a checkpointer copies the WAL back: SQLite's autocheckpoint default;
 * and past which the writer finishes the copy instead (note_wal_pages). The WAL file is cut
 * back to about the second when it starts over (journal_size_limit). */
#define STORE_CHECKPOINT_PAGES 1000
#define STORE_WRITER_CHECKPOINT_PAGES (4 * STORE_CHECKPOINT_PAGES)
/* Past this the writer waits for the checkpointer's pass to end and then checkpoints: on a
 * machine so loaded that a pass outlasts thousands of commits, the WAL stays bounded. */
#define STORE_WAL_HARD_PAGES (2 * STORE_WRITER_CHECKPOINT_PAGES)

struct store_checkpointer {
    store_t *st;
    store_conn_t conns[STORE_MAX_SHARDS];
};

static int shard_checkpoint(shard_t *sh)
{
    int log_frames = 0, done_frames = 0;
    /* TRUNCATE must wait for readers; the loop thread must not, so try it without waiting
     * and fall back to a PASSIVE checkpoint of what no reader still needs. */
    sqlite3_busy_timeout(sh->conn.db, 0);
    int rc = sqlite3_wal_checkpoint_v2(sh->conn.db, NULL, SQLITE_CHECKPOINT_TRUNCATE, &log_frames,
                                       &done_frames);
    if (rc == SQLITE_BUSY)
        rc = sqlite3_wal_checkpoint_v2(sh->conn.db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log_frames,
                                       &done_frames);
    sqlite3_busy_timeout(sh->conn.db, STORE_BUSY_TIMEOUT_MS);
    if (rc != SQLITE_OK) return store_sql_error(&sh->conn, "checkpointing the WAL");
    log_debug("store: checkpoint of shard %d: %d of %d WAL frames written back", sh->index,
              done_frames, log_frames);
    return 0;
}

int store_checkpoint(store_t *st)
{
    if (st->in_txn) return log_error_errno(-EBUSY, "store: store_checkpoint inside a transaction");
    int r = 0;
    for (int k = 0; k < st->n_shards; k++) {
        int e = shard_checkpoint(&st->shards[k]);
        if (r == 0) r = e;
    }
    return r;
}

/* A shard writer's WAL hook once a checkpointer runs: it counts, and calls for the
 * checkpointer. SQLite starts the WAL over only after a checkpoint that reached its last frame,
 * which under a steady stream of commits the checkpointer's never does: past
 * STORE_WRITER_CHECKPOINT_PAGES the checkpointer stops, and the writer finishes the copy
 * itself, between two of its transactions as SQLite's autocheckpoint would (most of it copied
 * already). It does not wait for the checkpointer's pass, unless the WAL reached
 * STORE_WAL_HARD_PAGES: while that runs, the next commit tries again. */
static int note_wal_pages(void *arg, sqlite3 *db, const char *name, int pages)
{
    shard_t *sh = arg;
    atomic_store_explicit(&sh->wal_pages, pages, memory_order_relaxed);
    if (pages >= STORE_WAL_HARD_PAGES) {
        pthread_mutex_lock(&sh->checkpoint_lock);
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_unlock(&sh->checkpoint_lock);
    } else if (pages >= STORE_WRITER_CHECKPOINT_PAGES) {
        if (pthread_mutex_trylock(&sh->checkpoint_lock) == 0) {
            sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
            pthread_mutex_unlock(&sh->checkpoint_lock);
        }
    } else if (pages >= STORE_CHECKPOINT_PAGES) {
        sh->st->checkpoint_due(sh->st->checkpoint_arg);
    }
    return SQLITE_OK;
}

int store_checkpointer_open(store_t *st, void (*due)(void *arg), void *arg,
                            store_checkpointer_t **ret)
{
    store_checkpointer_t *cp = calloc(1, sizeof *cp);
    if (!cp) return -ENOMEM;
    cp->st = st;
    /* Without a limit the WAL file would keep the size of its longest run for good. */
    char limit[64];
    snprintf(limit, sizeof limit, "PRAGMA journal_size_limit = %d",
             STORE_WRITER_CHECKPOINT_PAGES * 4096);
    int r = 0;
    for (int k = 0; k < st->n_shards && r == 0; k++) {
        r = store_conn_open(&cp->conns[k], st->state_dir, k,
                            SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX);
        /* A connection finds the WAL when it first reads the database; until then a checkpoint
         * has nothing to copy. */
        if (r == 0) r = store_exec(&cp->conns[k], "SELECT count(*) FROM sqlite_master");
        if (r == 0) r = store_exec(&st->shards[k].conn, limit);
    }
    if (r < 0) {
        for (int k = 0; k < st->n_shards; k++)
            store_conn_close(&cp->conns[k]);
        free(cp);
        return r;
    }
    st->checkpoint_due = due;
    st->checkpoint_arg = arg;
    for (int k = 0; k < st->n_shards; k++) /* replaces the autocheckpoint */
        sqlite3_wal_hook(st->shards[k].conn.db, note_wal_pages, &st->shards[k]);
    *ret = cp;
    return 0;
}

int store_checkpointer_run(store_checkpointer_t *cp)
{
    int r = 0;
    for (int k = 0; k < cp->st->n_shards; k++) {
        shard_t *sh = &cp->st->shards[k];
        int pages = atomic_load_explicit(&sh->wal_pages, memory_order_relaxed);
        if (pages < STORE_CHECKPOINT_PAGES || pages >= STORE_WRITER_CHECKPOINT_PAGES) continue;
        int log_frames = 0, done_frames = 0;
        pthread_mutex_lock(&sh->checkpoint_lock);
        int rc = sqlite3_wal_checkpoint_v2(cp->conns[k].db, NULL, SQLITE_CHECKPOINT_PASSIVE,
                                           &log_frames, &done_frames);
        pthread_mutex_unlock(&sh->checkpoint_lock);
        if (rc == SQLITE_BUSY) continue; /* a lock the writer held for a moment: next time */
        if (rc != SQLITE_OK) {
            if (r == 0) r = store_sql_error(&cp->conns[k], "checkpointing the WAL");
            continue;
        }
        log_debug("store: checkpoint of shard %d: %d of %d WAL frames written back", k, done_frames,
                  log_frames);
    }
    return r;
}

void store_checkpointer_close(store_checkpointer_t *cp)
{
    if (!cp) return;
    for (int k = 0; k < cp->st->n_shards; k++) {
        sqlite3_wal_autocheckpoint(cp->st->shards[k].conn.db, STORE_CHECKPOINT_PAGES);
        store_conn_close(&cp->conns[k]);
    }
    free(cp);
}
