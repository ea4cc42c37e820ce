/* The durable store: every job and buffer. What a caller gets, not how the engine gets it: the
 * engine (SQLite in WAL mode under the state directory, its jobs spread over [store] shards
 * database files so that their writes run side by side: store_internal.h) decides where a
 * job's row goes (store_jobs_place), reports what each commit kept (store_commit_result), says
 * when a commit is durable (store_when_durable) and keeps its own files in shape.
 *
 * Threads: the store_t (the writer) belongs to the scheduler's loop thread alone. Any other
 * thread reads through a store_reader_t of its own, opened on the store (store_reader_open),
 * which sees the writer's commits. store_blob_write() may be called from any thread.
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

/* Embedded in what waits for its commits to be durable. done runs on the store's durability
 * thread once every commit made before store_when_durable is durable (err 0), or could not be
 * made so (a negative errno); the wait is the caller's again then. */
typedef struct store_durable_wait {
    struct store_durable_wait *next; /* the store's */
    void (*done)(struct store_durable_wait *w, int err);
    /* Which of the store's commits it waits for: the store's to set (0, as zeroed: all). */
    unsigned scope;
} store_durable_wait_t;

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
 * commit of the scheduler uses them. Without begin, each write commits by itself. A commit
 * that fails may have kept part of the transaction (SQLite has no commit across its shards'
 * files): store_commit_result says which rows it kept, and the caller settles those as
 * committed. */
int store_begin(store_t *st);
/* A transaction whose commit need not survive a power loss, only a crash of the process: its
 * WAL frames are written but not fsync'd ([store] sync_full then holds for the others, whose
 * fsync takes these frames along). For what the daemon can do again (a job's start or end,
 * which a power loss at worst makes run once more), or makes durable later: the acceptance of
 * jobs, synced by the WAL sync thread before they are answered (store_when_durable). Segment bytes
 * are still synced first. */
int store_begin_relaxed(store_t *st);
/* Runs deferred writes first (store_flush). */
int store_commit(store_t *st);
/* What a transaction kept, as store_commit_result reports it after its commit, for the
 * caller to ask about each row the transaction wrote, as long as it needs to. Zeroed: nothing
 * was kept (the transaction failed before its commit). Its fields are the store's. */
typedef struct store_commit_result {
    unsigned kept;
    int parts;
} store_commit_result_t;
/* After store_commit, whether it succeeded or not: what it kept, into *ret. */
void store_commit_result(const store_t *st, store_commit_result_t *ret);
/* Whether the transaction kept what it wrote of job id (its row, placed as store_jobs_place
 * placed it). When w is given, narrows the commits w waits for (store_when_durable) to those
 * that job's row needs. */
bool store_job_committed(const store_commit_result_t *c, const char *id, store_durable_wait_t *w);
/* The same for the buffers the transaction wrote (they are kept or lost together). */
bool store_buffers_committed(const store_commit_result_t *c, store_durable_wait_t *w);
/* A new job id (id_new's, prefix 'j'), where the rows of jobs that store_jobs_place does not
 * move go: those with an idempotency key, whose uniqueness is checked there. Any thread. */
void store_job_id_new(const store_t *st, char ret_id[ID_SIZE]);
/* The jobs of one submission: their rows go where one commit keeps or loses them together. */
typedef struct store_job_group {
    job_t *const *jobs;
    size_t n;
} store_job_group_t;
/* Inside a transaction, before the rows of new jobs are written: chooses where the rows of
 * each group go, so that the groups' writes run side by side when there are many (SQLite: a
 * round of few jobs in one shard, the next round's in the next, so that it commits and syncs
 * one file; a round of many spread over the shards). A group whose first job has an
 * idempotency key stays where store_job_id_new put it. May change the jobs' ids (made by
 * store_job_id_new): the caller copies them to wherever it showed them. */
void store_jobs_place(store_t *st, const store_job_group_t *groups, size_t n);
/* Inside a transaction of a store of several shards: the job writes that follow
 * (store_job_insert of a job whose id is set, store_job_update) are only queued, and return 0,
 * until store_flush runs them, each shard's on a thread of its own. The jobs must stay as they
 * are until then, but for their state: a write takes the one the job has when it is asked for.
 * Does nothing with one shard. */
void store_defer_writes(store_t *st);
/* Runs the deferred writes and stops deferring. Each write that failed is passed to failed (if
 * not NULL), on the caller's thread, with the state it wrote and its error: failed returns the
 * error to report, or 0 when it dealt with it. Returns the first error reported (without
 * failed: the first). */
int store_flush(store_t *st, int (*failed)(job_t *job, job_state_t written, int err, void *ud),
                void *ud);
/* Undoes the open transaction; after a failed store_commit, whatever it left open. */
int store_rollback(store_t *st);

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

/* Device time charged to a job after its end: what a job ended while its launch went on
 * (cancelled, failed by the watchdog) is charged once the launch returns. The caller names the
 * job's line of the usage rollup itself (its owner, op and end), since the job's row may be
 * gone by then. */
typedef struct store_charge {
    char id[ID_SIZE];
    char owner[OWNER_SIZE];
    char op[JOB_OP_NAME_SIZE];
    int64_t finished_us; /* the job's end, as its record says: the rollup's day */
    int64_t delta_ns;    /* either sign */
} store_charge_t;
/* Adds c->delta_ns to the device time of job c->id, if it is still stored and has ended, and
 * to its line of the usage rollup in any case (the rollup outlives the job's row), in one
 * transaction: on an error neither has it, and the same charge may be tried again. Loop
 * thread, outside a transaction. */
int store_job_charge(store_t *st, const store_charge_t *c);

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

/* --- durability ---
 *
 * A commit of a transaction opened with store_begin is durable (with [store] sync_full) when
 * store_commit returns. One opened with store_begin_relaxed survives a crash of the process
 * at once, and a power loss once the store says so: after store_durability_start,
 * store_when_durable hands a wait to the store, which calls its done, on a thread of its own,
 * once every commit made before is durable, so that neither the jobs nor the loop wait for
 * the disk. The store also keeps its files in shape on its own meanwhile (SQLite: it copies
 * its WALs back into the databases). */

/* Starts the thread that makes relaxed commits durable, when the store has one to start
 * (SQLite: with [store] sync_full); from then on store_durable_later says so. Loop thread,
 * outside a transaction. 0, or a negative errno, logged. */
int store_durability_start(store_t *st);
/* Makes durable and finishes the waits handed over, and stops that thread; then
 * store_durable_later is false again. The store's thread alone calls done meanwhile. No-op
 * when none runs; store_close does it too. */
void store_durability_stop(store_t *st);
/* Whether relaxed commits become durable later, when store_when_durable says: false when no
 * such thread runs (the commits that need durability use store_begin then). Any thread. */
bool store_durable_later(const store_t *st);
/* Queues w (its done set, its scope as zeroed or set by the store) behind the commits made so
 * far. Waits are done in the order they came. Only while store_durable_later. */
void store_when_durable(store_t *st, store_durable_wait_t *w);
/* 0, or the negative errno of the first time the store could not make its commits durable:
 * it sticks (after a failed fdatasync the kernel may have dropped the pages it could not
 * write, and a later success would not bring them back). Any thread. */
int store_durable_error(store_t *st);
/* The store's upkeep that no thread of its own does (SQLite: a WAL checkpoint on the writer's
 * connection when no checkpointer thread runs): the caller runs it every
 * store_upkeep_interval_ms. Loop thread, outside a transaction. */
int store_upkeep(store_t *st);
/* How often store_upkeep is due, in ms ([store] checkpoint_interval_s). */
uint64_t store_upkeep_interval_ms(const store_t *st);
