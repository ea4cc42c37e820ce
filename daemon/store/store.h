/* The durable store: every job and buffer, in SQLite (WAL mode) under the state directory.
 *
 * Shards: the jobs are spread over [store] shards database files (STATE_DIR/gpujobd.db, then
 * gpujobd-1.db ...), each with the whole schema, so that their writes can run side by side. A
 * job's id names its shard (store_id_shard); buffers live in shard 0. A transaction spans the
 * shards its writes touch. The count is fixed when the state directory is created.
 *
 * Threads: the store_t (the write connection) belongs to the scheduler's loop thread alone.
 * Any other thread reads through a store_reader_t of its own (a read-only connection; WAL lets
 * readers run beside the writer). store_blob_write() may be called from any thread.
 *
 * Tensor bytes up to cfg->inline_blob_bytes live in SQLite rows; larger ones in files under
 * STATE_DIR/blobs/, written and fsync'd before the row that names them is committed. A
 * tensor's or buffer's `blob` field is the store's locator for its bytes: opaque elsewhere.
 *
 * State transitions are enforced here and nowhere else: queued -> running | cancelled | failed,
 * running -> succeeded | failed | cancelled | queued (re-queue after a restart or a device
 * fault). Any other change is refused with -EBUSY and leaves the row as it was. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "daemon/util/config.h"
#include "daemon/job/job.h"

typedef struct store store_t;
typedef struct store_reader store_reader_t;

#define STORE_MAX_SHARDS 16

/* Takes the state directory's exclusive lock (STATE_DIR/gpujobd.lock, created with the
 * directory if need be) for the process's life, before store_open: a second daemon on the
 * same directory gets -EBUSY, logged with the directory and the holder's pid, having touched
 * nothing. *ret_fd is the lock's descriptor (close-on-exec); closing it releases the lock. A
 * lock handed over by store_lock_keep_across_exec before an exec in place is adopted rather
 * than taken. Call before any thread exists: it reads and clears the environment. */
int store_lock_state_dir(const char *state_dir, int *ret_fd);
/* Just before the daemon executes itself again (restart.h): keeps the lock's descriptor open
 * across the exec and names it in the environment for store_lock_state_dir to adopt, so that
 * the lock is never free meanwhile. */
int store_lock_keep_across_exec(int fd);

/* Opens (creating if needed) the shards' database files and STATE_DIR/blobs/, migrating the
 * schema to the current version. */
int store_open(const config_t *cfg, store_t **ret);
void store_close(store_t *st);
/* Whether the state directory's disk counts as full: less free than the reserve file's size
 * (STATE_DIR/reserve, which the store gives up so that a delete can commit on a full disk), or
 * the last commit failed for want of room and no space was freed since. When full, reason
 * (size bytes) says why. Any thread. */
bool store_disk_full(store_t *st, char *reason, size_t size);
/* Whether the store was found damaged (a database page SQLite cannot read, found by the
 * integrity check that runs after an unclean stop once the daemon is ready, store_check.c):
 * every write is refused from then on (-EUCLEAN). When damaged, reason (size bytes) names the
 * file and the finding. Any thread. */
bool store_damaged(store_t *st, char *reason, size_t size);
/* Room for store_damaged's reason: the file and SQLite's first finding. */
#define STORE_DAMAGE_SIZE 512

/* How many shards the store has: a power of two, at most STORE_MAX_SHARDS. */
int store_shards(const store_t *st);
/* The shard of a job id among n_shards (a power of two): the low bits of its last character,
 * whose hex digit is random in the ids id_new makes. */
static inline int store_id_shard(const char *id, int n_shards)
{
    size_t len = strnlen(id, ID_SIZE);
    unsigned char c = len ? (unsigned char)id[len - 1] : 0;
    unsigned v = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                 : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                                        : c;
    return (int)(v & (unsigned)(n_shards - 1));
}
/* Sets the last hex digit of an id made by id_new so that its shard among n_shards is
 * shard. */
static inline void store_id_assign_shard(char *id, int n_shards, int shard)
{
    static const char hex[] = "0123456789abcdef";
    size_t len = strnlen(id, ID_SIZE);
    if (!len) return;
    unsigned mask = (unsigned)(n_shards - 1);
    unsigned v = ((unsigned)store_id_shard(id, 16) & ~mask) | ((unsigned)shard & mask);
    id[len - 1] = hex[v & 15];
}

/* Persists tensor bytes that are too large for a row: writes them to a new file under
 * blobs/ (fsync'd) and returns its locator in *ret_blob (malloc'd). Any thread. For data of
 * at most inline_blob_bytes it does nothing and sets *ret_blob = NULL: the row keeps them. */
int store_blob_write(store_t *st, const void *data, uint64_t nbytes, char **ret_blob);
/* Writes the small tensors of many jobs (an array submission's inputs, or with outputs a
 * finished batch's outputs, but for failed jobs) to one new file, each at its own offset, when
 * together they would weigh on the loop thread's group commit (past 64 KiB): the thread that
 * has them writes and syncs them, in parallel with others, and the rows only name them. Sets
 * each such tensor's blob; below the threshold, nothing. Any thread. */
int store_blob_pack(store_t *st, job_t *const *jobs, size_t n, bool outputs);
/* Inside a transaction, before the writes of n jobs: when their small tensors (inputs, or
 * outputs as store_blob_pack takes them) are more than the transaction keeps in rows, appends
 * them all to the loop's segment now and has it synced on another thread while the rows are
 * written; the commit then waits for that sync rather than making it after them. Sets each
 * such tensor's blob; otherwise, nothing. Should the transaction not commit, its rollback
 * frees and clears those blobs again: the jobs must outlive it. Loop thread. */
int store_jobs_place_small(store_t *st, job_t *const *jobs, size_t n, bool outputs);
/* Removes a file store_blob_write made for a row that will never be written. Any thread. A
 * tensor in a file shared with others (store_blob_pack's, the loop's segments): the file goes
 * when no row names it at the end of the open transaction, or now outside one; loop thread
 * only. */
void store_blob_discard(store_t *st, const char *blob);

/* A large upload written to a blob file of its own as its bytes arrive: it never sits whole in
 * memory, and the disk writes it back while the rest comes in, so that little is left for the
 * sync at its end. Any thread; one writer per stream. */
typedef struct store_blob_stream store_blob_stream_t;
/* Creates the stream's file under cfg's state directory. */
int store_blob_stream_open(const config_t *cfg, store_blob_stream_t **ret);
/* Appends n bytes. */
int store_blob_stream_write(store_blob_stream_t *bs, const void *data, size_t n);
/* Makes the bytes durable and sets *ret_blob to their locator (malloc'd), which a row may then
 * name as it would store_blob_write's; the stream is gone, and on failure its file too. */
int store_blob_stream_finish(store_blob_stream_t *bs, char **ret_blob);
/* Removes the stream's file and frees it; NULL is a no-op. */
void store_blob_stream_abort(store_blob_stream_t *bs);

/* Transactions (loop thread). Writes between begin and commit are one transaction; the group
 * commit of the scheduler uses them. Without begin, each write commits by itself. A
 * transaction is one per shard it writes to: a commit that fails in one shard may have
 * committed others (store_committed_shards). */
int store_begin(store_t *st);
/* A transaction whose commit need not survive a power loss, only a crash of the process: its
 * WAL frames are written but not fsync'd ([store] sync_full then holds for the others, whose
 * fsync takes these frames along). For what the daemon can do again (a job's start or end,
 * which a power loss at worst makes run once more), or makes durable later: the acceptance of
 * jobs, synced by the WAL sync thread before they are answered (store_sync_request). Segment bytes
 * are still synced first. */
int store_begin_relaxed(store_t *st);
/* Runs deferred writes first (store_flush). */
int store_commit(store_t *st);
/* After store_commit: the shards whose part of the transaction is committed, bit k for shard k;
 * every bit when it succeeded. A failed commit may have committed some shards (SQLite has no
 * commit across WAL files): what the transaction wrote in those stays, and the caller settles
 * it as committed. */
unsigned store_committed_shards(const store_t *st);
/* Inside a transaction of a store of several shards: the job writes that follow
 * (store_job_insert of a job whose id is set, store_job_update) are only queued, and return 0,
 * until store_flush runs them, each shard's on a thread of its own. The jobs must stay as they
 * are until then, but for their state: a write takes the one the job has when it is asked for.
 * Does nothing with one shard. */
void store_defer_writes(store_t *st);
/* Below this many deferred writes, store_flush runs them on the caller's thread: waking the
 * shards' threads costs more than the writes. */
#define STORE_PARALLEL_MIN_WRITES 64
/* Runs the deferred writes and stops deferring. Each write that failed is passed to failed (if
 * not NULL), on the caller's thread, with the state it wrote and its error: failed returns the
 * error to report, or 0 when it dealt with it. Returns the first error reported (without
 * failed: the first). */
int store_flush(store_t *st, int (*failed)(job_t *job, job_state_t written, int err, void *ud),
                void *ud);
/* Undoes the open transaction; after a failed store_commit, whatever it left open. */
int store_rollback(store_t *st);
/* The shards' WAL files, whose fdatasync makes every commit written before it durable
 * (the WAL sync thread, store_sync_start): how many, in ret; 0 when [store] sync_full is off, which
 * leaves all commits relaxed. */
int store_wal_paths(const store_t *st, const char *ret[STORE_MAX_SHARDS]);

/* Checkpoints (copying the WAL back into the database file, and syncing that) off the
 * writer's thread. By default a commit that leaves the WAL past 1000 pages checkpoints inside
 * itself, on the writer's thread: the p99 of a tiny job. Once a checkpointer is open the
 * writer only counts the WAL's pages, and the checkpointer's thread copies it back. Open and
 * close it while the writer is idle (the writer checkpoints itself again once it is closed). */
typedef struct store_checkpointer store_checkpointer_t;
/* due(arg) runs on the writer's thread after each commit that leaves the WAL past 1000 pages:
 * time for store_checkpointer_run. */
int store_checkpointer_open(store_t *st, const config_t *cfg, void (*due)(void *arg), void *arg,
                            store_checkpointer_t **ret);
/* A PASSIVE checkpoint, which never waits for the writer or readers, when the writer's commits
 * have left the WAL between 1000 and 4000 pages; else nothing. (Under a steady stream of
 * commits such a checkpoint never reaches the WAL's end, which SQLite needs to start the WAL
 * over: past 4000 pages the writer finishes the copy itself.) On one thread at a time. */
int store_checkpointer_run(store_checkpointer_t *cp);
void store_checkpointer_close(store_checkpointer_t *cp); /* accepts NULL */

/* Inserts a new job with its input tensors (descriptors, and bytes for in-memory tensors:
 * inline in the row when small, else the blob the caller got from store_blob_write, set in the
 * tensor's blob field). The job is queued, or running when it started in the transaction that
 * takes it in (started_us set, attempts and batch_size as its start made them). On success
 * each persisted tensor's blob is set. -EEXIST when an (owner, idempotency_key) pair is
 * already taken. Of the job it reads only what is set before it runs, and writes only the
 * inputs' blob and empty names (and the id and creation time when they were unset): a job
 * whose inputs are in memory and named may be running on another thread meanwhile. */
int store_job_insert(store_t *st, job_t *job);

/* Applies job->state as the new state, checking the transition from the stored state; writes
 * the timestamps, attempts, run_device, gpu_ns, batch_size and error fields, and on success
 * the outputs (descriptors and bytes, as for inputs). -EBUSY for an illegal transition,
 * -ENOENT for an unknown id. */
int store_job_update(store_t *st, const job_t *job);

/* A queued job as store_recover_queued lists it: what a scheduler needs to queue it, without
 * its params or tensors. */
typedef struct store_queued {
    char id[ID_SIZE];
    char owner[OWNER_SIZE];
    int priority;
    int device;
    int64_t created_us;
    int64_t deadline_us;
    const char *batch_key; /* its call's; "" never batches; valid during the callback */
    op_cost_t cost;
} store_queued_t;

/* After a restart: ephemeral buffers' rows go (their bytes died with the process); jobs left
 * `running` go back to `queued` (their next start counts the next attempt: attempts counts
 * runs started), or to `failed` with error code "daemon_restarted" once attempts reach
 * max_attempts. Then cb for every queued job (oldest first, across shards) from the columns
 * that describe it for queueing, with no job loaded: a scheduler reads a job back when it
 * starts. Jobs stored before those columns existed are read and resolved (job_resolve_op) to
 * find their batch key and cost; an error of resolve ends the recovery with that error. */
int store_recover_queued(store_t *st, int max_attempts, int (*resolve)(job_t *job),
                         void (*cb)(const store_queued_t *q, void *ud), void *ud);

/* Before store_recover_queued, after a crash: fails job id with code and message when it is
 * not final yet (its run took the process down: crash_guard.h), durably. Queued counts too: a
 * batch goes to the executor before the commit that records its start, so a job can crash the
 * process while its row still says queued. *ret_failed says whether it did; an unknown or final job
 * is left alone. */
int store_recover_crashed(store_t *st, const char *id, const char *code, const char *message,
                          bool *ret_failed);

/* Deletes finished jobs (and their tensors and blob files) that finished before cutoff_us.
 * *ret_deleted: how many jobs. */
int store_gc(store_t *st, int64_t cutoff_us, int *ret_deleted);
/* The store's bound ([store] max_bytes). What counts against it is what deleting rows and files
 * can give back: the database files' pages in use (the free pages left by deletes are reused
 * before a file grows) and the files under blobs/. The WALs come on top: deletes add to them,
 * and checkpoints empty them. */
typedef struct store_trim_stats {
    uint64_t bytes;         /* counted against the bound after the trim */
    uint64_t expired_bytes; /* tensor bytes dropped by this trim: outputs, inputs of deleted jobs */
    int64_t expired_jobs;   /* jobs whose outputs this trim expired */
    int64_t deleted_jobs;   /* finished jobs this trim deleted whole */
    bool more; /* the pass stopped at its budget while the store is still over: call again */
} store_trim_stats_t;
/* Jobs one pass of store_trim goes through at most, as the scheduler calls it; a pass also
 * stops after STORE_TRIM_PASS_US of work, so that the loop thread is never held long, but not
 * before it has gone through one batch of jobs, so that every pass makes progress. */
#define STORE_TRIM_PASS_JOBS 1024
#define STORE_TRIM_PASS_US 20000
/* The bytes counted against the bound: the database files' pages in use (three pragmas per
 * shard) and blobs/'s bytes, kept up to date as blob files are written and removed; blobs/ is
 * walked only at the first call and every few minutes after, to correct what the count
 * missed (files written by hand, or by another process). */
int store_bytes(store_t *st, uint64_t *ret);
/* When the store holds more than max_bytes (0: no bound), brings it back under 15/16 of it (the
 * slack keeps a store at its bound from trimming at every check): the outputs of the oldest
 * finished jobs first (their records stay, marked expired: store_blob_expired), then, while
 * still over, the oldest finished jobs whole. Queued and running jobs, buffers and the files
 * they name are never touched; they alone can keep the store over its bound. One call is a
 * pass bounded by max_jobs jobs and STORE_TRIM_PASS_US: ret->more says the next pass goes on
 * where it stopped. Loop thread, outside a transaction. *ret says what it found and did, also
 * on max_bytes 0. */
int store_trim(store_t *st, uint64_t max_bytes, int64_t max_jobs, store_trim_stats_t *ret);
/* Whether a tensor's locator is that of an output store_trim expired: its descriptor stays,
 * its bytes are gone (store_blob_read answers -ENODATA). */
bool store_blob_expired(const char *blob);

/* PRAGMA wal_checkpoint(TRUNCATE) when no reader is in the way, else PASSIVE. */
int store_checkpoint(store_t *st);

int store_buffer_insert(store_t *st, buffer_t *buf); /* sets buf->blob */
/* Bytes of owner's buffers, all of them and the resident ones (the quotas of max_stored_bytes
 * and max_resident_bytes, daemon/util/policy.h): a sum over the owner's rows, by its index. */
int store_buffer_bytes(store_t *st, const char *owner, uint64_t *ret_stored,
                       uint64_t *ret_resident);
/* -ENOENT when missing or not owned by owner (owner NULL: any). */
int store_buffer_delete(store_t *st, const char *owner, const char *id);
/* Deletes the rows of ephemeral buffers (durable = 0), whose bytes lived only in the memory of
 * a daemon that is gone: called once at start, before recovery hands queued jobs back, so that
 * a job naming one fails as for any deleted buffer. */
int store_buffers_forget_ephemeral(store_t *st);

/* --- reads: any thread, each with its own reader --- */
/* A reader on st, for the calling thread alone: it sees every commit made before it reads,
 * beside the writer. Any thread may open one while st is open; close them before st. */
int store_reader_open(store_t *st, store_reader_t **ret);
void store_reader_close(store_reader_t *rd);

/* A job as stored: its op by name (job->op_name, call.op NULL: job_resolve_op makes the call
 * when the caller needs one), its tensors' descriptors and locators, no bytes. -ENOENT when
 * missing. */
int store_job_get(store_reader_t *rd, const char *id, job_t **ret);
/* The job id an (owner, idempotency key) pair created, or -ENOENT. */
int store_job_find_idempotent(store_reader_t *rd, const char *owner, const char *key,
                              char ret_id[ID_SIZE]);

typedef struct store_list_query {
    const char *owner; /* NULL: every owner (admins) */
    int state;         /* a job_state_t, or -1 for any */
    const char *op;    /* NULL for any */
    const char *after; /* cursor: ids strictly greater; NULL from the start */
    int limit;         /* 1..1000 */
} store_list_query_t;
/* Jobs in id order, as store_job_get hands them; *ret_jobs is a malloc'd array of n owned
 * jobs. */
int store_jobs_list(store_reader_t *rd, const store_list_query_t *q, job_t ***ret_jobs,
                    size_t *ret_n);

/* Reads a tensor's or buffer's bytes by locator into a new malloc'd block. */
int store_blob_read(store_reader_t *rd, const char *blob, uint64_t nbytes, void **ret_data);
/* Reads n bytes at offset of a blob's nbytes into dst: a large blob a piece at a time. */
int store_blob_read_at(store_reader_t *rd, const char *blob, uint64_t nbytes, uint64_t offset,
                       void *dst, size_t n);

int store_buffer_get(store_reader_t *rd, const char *id, buffer_t **ret);

/* What an owner holds and has used: the live jobs counted from the jobs, the ended ones and
 * their times from the usage rollup (which outlives retention), the buffers from theirs. Its
 * cost grows with the owner's live jobs, buffers and rollup rows, never with the jobs kept. */
typedef struct store_usage {
    char owner[OWNER_SIZE];
    int64_t jobs_by_state[JOB_STATE_COUNT];
    int64_t run_us; /* sum over ended jobs */
    int64_t gpu_ns;
    int64_t buffers, buffer_bytes; /* buffer_bytes: of the durable (stored) buffers */
    int64_t resident_bytes;        /* of buffers kept in device memory, ephemeral ones included */
    int64_t ephemeral_bytes;       /* of ephemeral buffers, which are never stored */
} store_usage_t;
/* owner NULL: every owner together (ret->owner "*"). */
int store_usage_get(store_reader_t *rd, const char *owner, store_usage_t *ret);

/* The usage rollup: per owner, day (UTC) and op, the jobs that ended that day, added in the
 * write that records each end, so that it always equals the sums over the jobs it counts; it
 * outlives retention and the store's bound, which delete jobs, not these rows. */
typedef struct store_usage_row {
    char owner[OWNER_SIZE];
    int64_t day; /* UTC, days since the epoch */
    char op[JOB_OP_NAME_SIZE];
    int64_t jobs, succeeded, failed, cancelled;
    int64_t run_us;              /* from each job's start to its end */
    int64_t gpu_ns;              /* the jobs' shares of their batches' device time */
    int64_t bytes_in, bytes_out; /* inputs, and outputs of the jobs that succeeded */
} store_usage_row_t;
typedef struct store_usage_query {
    const char *owner;            /* NULL: every owner */
    int64_t since_day, until_day; /* inclusive */
    size_t max_rows;              /* more rows than this: -E2BIG */
} store_usage_query_t;
/* The rollup's rows that the query selects, summed over the shards, ordered by owner, day
 * and op: *ret_rows a malloc'd array of *ret_n (NULL and 0 when none). */
int store_usage_rollup(store_reader_t *rd, const store_usage_query_t *q,
                       store_usage_row_t **ret_rows, size_t *ret_n);

/* The scheduler's fair-share state: each owner's decayed usage (µs of device time) as of
 * at_us (wall clock), kept across restarts. */
typedef struct store_fair_share {
    char owner[OWNER_SIZE];
    double usage_us;
    int64_t at_us;
} store_fair_share_t;
/* Replaces the stored state with users[0..n), durably (loop thread, outside a transaction). */
int store_fair_share_save(store_t *st, const store_fair_share_t *users, size_t n);
/* The stored state: *ret a malloc'd array of *ret_n (NULL and 0 when none). */
int store_fair_share_load(store_t *st, store_fair_share_t **ret, size_t *ret_n);

/* --- the WAL sync thread (store_sync.c): makes relaxed commits durable ---
 *
 * The scheduler commits a group of accepted jobs without an fsync (store_begin_relaxed), starts
 * them, and hands this thread an item per request to answer: the thread fdatasyncs the SQLite
 * WAL files (one per shard of the store) and then answers them itself, so that neither the
 * jobs nor the loop wait for the disk. One fdatasync makes every commit written before it
 * durable (fsync works on the file, whichever descriptor names it), so one sync of each file
 * serves all the items queued while the one before it ran. Segment bytes are synced by the
 * commit itself (store_commit), before any WAL frame that names them is written.
 *
 * A failed sync sticks: after a failed fdatasync the kernel may have dropped the dirty pages
 * it could not write, and a later success would not bring them back.
 *
 * The thread also keeps the WAL short: it runs the store's checkpointer after answering a
 * round of items, and when asked (store_sync_checkpoint_soon), so that copying the WAL back
 * (and its fsync) happens beside the job path rather than inside one of the loop's commits. */

typedef struct store_sync store_sync_t;

/* Embedded in what waits for a sync. done runs on the sync thread once every commit made
 * before store_sync_request is durable (err 0), or could not be made so (a negative errno). */
typedef struct store_sync_item {
    struct store_sync_item *next;
    void (*done)(struct store_sync_item *item, int err);
    /* The WAL files whose sync it waits for: bit k for the k-th of store_sync_start's; 0 for
     * all. */
    unsigned wals;
} store_sync_item_t;

/* Syncs the n_wals WAL files (the store's shards', store_wal_paths). cp (borrowed; NULL for
 * none) must outlive the syncer. */
int store_sync_start(const char *const *wal_paths, int n_wals, store_checkpointer_t *cp,
                     store_sync_t **ret);
/* Queues item (its done and wals set) behind the next sync, of the files its wals name and
 * those of the items queued with it. Items are done in the order they came. */
void store_sync_request(store_sync_t *sy, store_sync_item_t *item);
/* Has the thread run its checkpointer soon, with items to sync or not: the commits of jobs'
 * starts and ends answer no one, but grow the WAL too. Any thread. */
void store_sync_checkpoint_soon(store_sync_t *sy);
/* 0, or the negative errno of the first sync that failed (it sticks). Any thread. */
int store_sync_error(store_sync_t *sy);
/* Syncs for and finishes the items queued, joins the thread and frees it. Accepts NULL. */
void store_sync_free(store_sync_t *sy);
