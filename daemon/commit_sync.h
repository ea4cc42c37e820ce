/* Makes the store's relaxed commits durable on a thread of its own.
 *
 * The scheduler commits a group of accepted jobs without an fsync (store_begin_relaxed), asks
 * this thread for a sync, and goes on: the jobs run while the disk syncs, and their 201s go
 * out once it is done. One fdatasync of the SQLite WAL file makes every commit written before
 * it durable (fsync works on the file, whichever descriptor names it), so a sync serves all
 * the requests made while the one before it ran. Segment bytes are synced by the commit
 * itself (store_commit), before any WAL frame that names them is written.
 *
 * A failed sync sticks: after a failed fdatasync the kernel may have dropped the dirty pages
 * it could not write, and a later success would not bring them back. */
#pragma once

#include <stdint.h>

typedef struct commit_sync commit_sync_t;

/* Starts the thread. notify(ud) runs on it after each sync, to wake the caller's loop. */
int commit_sync_start(const char *wal_path, void (*notify)(void *ud), void *ud,
                      commit_sync_t **ret);
/* Asks for a sync of everything committed so far. Returns its ticket: commits made before the
 * call are durable once commit_sync_done() reaches it. One thread (the loop) only. */
uint64_t commit_sync_request(commit_sync_t *cs);
/* The highest ticket synced. *ret_err: 0, or the negative errno of the first failed sync (the
 * tickets it covered and every later one are not durable). Any thread. */
uint64_t commit_sync_done(commit_sync_t *cs, int *ret_err);
/* Finishes the syncs asked for and joins the thread (commit_sync_done stays valid). */
void commit_sync_stop(commit_sync_t *cs);
/* Stops it if needed, then frees it. Accepts NULL. */
void commit_sync_free(commit_sync_t *cs);
