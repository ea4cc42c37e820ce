/* Makes the store's relaxed commits durable on a thread of its own.
 *
 * The scheduler commits a group of accepted jobs without an fsync (store_begin_relaxed), starts
 * them, and hands this thread an item per request to answer: the thread fdatasyncs the SQLite
 * WAL files (one per shard of the store) and then answers them itself, so that neither the
 * jobs nor the loop wait for the disk. One fdatasync makes every commit written before it
 * durable (fsync works on the file, whichever descriptor names it), so one sync of each file
 * serves all the items queued while the one before it ran. Segment bytes are synced by the commit
 * itself (store_commit), before any WAL frame that names them is written.
 *
 * A failed sync sticks: after a failed fdatasync the kernel may have dropped the dirty pages
 * it could not write, and a later success would not bring them back.
 *
 * The thread also keeps the WAL short: it runs the store's checkpointer after answering a
 * round of items, and when asked (commit_sync_checkpoint_soon), so that copying the WAL back
 * (and its fsync) happens beside the job path rather than inside one of the loop's commits. */
#pragma once

#include "store.h"

typedef struct commit_sync commit_sync_t;

/* Embedded in what waits for a sync. done runs on the sync thread once every commit made
 * before commit_sync_request is durable (err 0), or could not be made so (a negative errno). */
typedef struct commit_sync_item {
    struct commit_sync_item *next;
    void (*done)(struct commit_sync_item *item, int err);
    /* The WAL files whose sync it waits for: bit k for the k-th of commit_sync_start's; 0 for
     * all. */
    unsigned wals;
} commit_sync_item_t;

/* Syncs the n_wals WAL files (the store's shards', store_wal_paths). cp (borrowed; NULL for
 * none) must outlive the syncer. */
int commit_sync_start(const char *const *wal_paths, int n_wals, store_checkpointer_t *cp,
                      commit_sync_t **ret);
/* Queues item (its done and wals set) behind the next sync, of the files its wals name and
 * those of the items queued with it. Items are done in the order they came. */
void commit_sync_request(commit_sync_t *cs, commit_sync_item_t *item);
/* Has the thread run its checkpointer soon, with items to sync or not: the commits of jobs'
 * starts and ends answer no one, but grow the WAL too. Any thread. */
void commit_sync_checkpoint_soon(commit_sync_t *cs);
/* 0, or the negative errno of the first sync that failed (it sticks). Any thread. */
int commit_sync_error(commit_sync_t *cs);
/* Syncs for and finishes the items queued, joins the thread and frees it. Accepts NULL. */
void commit_sync_free(commit_sync_t *cs);
