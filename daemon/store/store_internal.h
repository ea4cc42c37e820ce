/* Private to the files of daemon/store/; nothing outside it includes this. The store's rooms:
 *
 *   store_shards.c     open and close, the shards' files and threads, deferred writes
 *   store_schema.c     the schema and its migrations
 *   store_txn.c        transactions, savepoints around each write, commit and rollback
 *   store_jobs.c       job inserts and updates (the state transitions)
 *   store_placement.c  where tensor bytes go (row, segment, file), checks before a write
 *   store_refs.c       which blob files rows name, and removing the files none does
 *   store_recover.c    recovery after a restart
 *   store_retention.c  deleting finished jobs past the cutoff
 *   store_trim.c       the bound on the store's bytes: expiring outputs early, and measuring
 *   store_checkpoint.c WAL checkpoints, on the writer or on a thread of their own
 *   store_buffers.c    buffer inserts, deletes, resident bytes
 *   store_read.c       readers: jobs, buffers, blobs, usage, on any thread
 *   store_conn.c       a SQLite connection, its statement cache, binding helpers
 *   store_tensors.c    a job's tensor records inside its row
 *   store_blob.c       blob files, locators, upload streams, the orphan sweep
 *   store_segment.c    segment files: many small tensors appended to one file
 *   store_sync.c       the WAL sync thread (declared in store.h)
 *   store_lock.c       the state directory's lock (declared in store.h)
 *   store_check.c      the checks at open that refuse a damaged store
 */
#pragma once

#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "daemon/job/job.h"
#include "daemon/util/vec.h"
#include "store.h"

/* --- shards (store_shards.c) --- */

#define STORE_MAX_SHARDS 16

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

/* After store_commit: the shards whose part of the transaction is committed, bit k for shard k;
 * every bit when it succeeded. A failed commit may have committed some shards (SQLite has no
 * commit across WAL files): what the transaction wrote in those stays, and the caller settles
 * it as committed. */
unsigned store_committed_shards(const store_t *st);
/* Below this many deferred writes, store_flush runs them on the caller's thread: waking the
 * shards' threads costs more than the writes. */
#define STORE_PARALLEL_MIN_WRITES 64

#define STORE_SCHEMA_VERSION 12
/* The final states as a condition. An OR chain, not an IN list: SQLite builds an ephemeral
 * table for every IN list it evaluates. */
#define STORE_FINAL_STATES "(state = 'succeeded' OR state = 'failed' OR state = 'cancelled')"
/* The conditions of the partial indexes jobs_live, jobs_ended and jobs_finished, in the one
 * spelling that the indexes and the queries that should use them share:
 * SQLite matches a query to a partial index by the text of its terms. finished_us is set
 * exactly when a job is in a final state. */
#define STORE_LIVE "finished_us = 0"
#define STORE_ENDED "finished_us > 0"
#define STORE_DB_NAME "gpujobd.db"
#define STORE_BUSY_TIMEOUT_MS 5000
/* The reserve file in the state directory: given up when a delete finds the disk full, so that
 * space can always be freed through the API (store_space.c); tried again every so often. */
#define STORE_RESERVE_NAME "reserve"
/* STATE_DIR/clean-shutdown: written by store_close once every shard closed cleanly, taken
 * (removed) by store_open, so that PRAGMA quick_check runs only after a crash. */
#define STORE_CLEAN_NAME "clean-shutdown"
#define STORE_RESERVE_BYTES (1024 * 1024)
#define STORE_RESERVE_RETRY_US (10 * 1000000LL)

/* Every cached statement, by purpose. The SQL texts live in store_conn.c. */
typedef enum store_stmt_id {
    STMT_JOB_INSERT,
    STMT_JOB_UPDATE,
    STMT_JOB_START,
    STMT_JOB_STATE,
    STMT_JOB_GET,
    STMT_JOB_FIND_IDEMPOTENT,
    STMT_JOB_TENSORS,
    STMT_JOB_BYTES,
    STMT_JOB_BYTES_INSERT,
    STMT_BUFFER_INSERT,
    STMT_BUFFER_GET,
    STMT_BUFFER_DATA,
    STMT_BUFFER_DELETE,
    STMT_BUFFER_FILE,
    STMT_USAGE_STATES,
    STMT_USAGE_TIMES,
    STMT_USAGE_BUFFERS,
    STMT_USAGE_ADD,
    STMT_USAGE_ROLLUP,
    STMT_GC_SELECT,
    STMT_GC_DELETE,
    STMT_GC_DELETE_BYTES,
    STMT_TRIM_NEXT,
    STMT_TRIM_EXPIRE,
    STMT_TRIM_DELETE_OUTPUT_BYTES,
    STMT_FILE_REFERENCED,
    STMT_REFS_ADD,
    STMT_REFS_DROP,
    STMT_SETTING_GET,
    STMT_SETTING_SET,
    STMT_SAVEPOINT,
    STMT_RELEASE,
    STMT_ROLLBACK_TO,
    STMT_BEGIN,
    STMT_BEGIN_IMMEDIATE,
    STMT_COMMIT,
    STMT_ROLLBACK,
    STMT_SYNC_NORMAL,
    STMT_SYNC_FULL,
    /* store_jobs_list: one statement per combination of filters (owner, state, op, after,
     * live), so that each can use its index; STMT_LIST_FIRST + bitmask. */
    STMT_LIST_FIRST,
    STMT_COUNT = STMT_LIST_FIRST + 32
} store_stmt_id_t;

#define STORE_LIST_BY_OWNER 1
#define STORE_LIST_BY_STATE 2
#define STORE_LIST_BY_OP 4
#define STORE_LIST_AFTER 8
/* With BY_STATE: the state is one before the end (jobs_live serves it), else jobs_ended does. */
#define STORE_LIST_LIVE 16

/* One SQLite connection (the writer's or a reader's) with its prepared statements. */
typedef struct store_conn {
    sqlite3 *db;
    sqlite3_stmt *stmts[STMT_COUNT];
    char db_path[PATH_MAX];
    char blobs_dir[PATH_MAX];
} store_conn_t;

/* The path of shard's database file under state_dir (STORE_DB_NAME for shard 0,
 * "gpujobd-<shard>.db" for the others). */
int store_db_path(const char *state_dir, int shard, char path[PATH_MAX]);
/* Opens the database file of shard (STORE_DB_NAME for shard 0, "gpujobd-<shard>.db" for the
 * others) under state_dir with flags, and sets busy_timeout on it. -ENOENT when it does not
 * exist and flags do not create it. */
int store_conn_open(store_conn_t *conn, const char *state_dir, int shard, int flags);
/* 0, or -EIO (logged) when SQLite could not close it cleanly. */
int store_conn_close(store_conn_t *conn);
/* The cached statement, prepared on first use; reset and unbound, ready to bind. NULL after
 * logging on failure. */
sqlite3_stmt *store_stmt(store_conn_t *conn, store_stmt_id_t id);
/* Logs SQLite's message for the connection once and returns -EIO (-EEXIST for a uniqueness
 * violation, so that callers can tell an idempotency conflict apart). */
int store_sql_error(store_conn_t *conn, const char *what);
/* The schema version (PRAGMA user_version); -EPROTO, logged, when it is newer than this
 * build's. */
int store_user_version(store_conn_t *conn, int *ret);
/* A value of the settings table: *ret is 0 when name has none. */
int store_setting_get(store_conn_t *conn, const char *name, int *ret);
int store_setting_set(store_conn_t *conn, const char *name, int value);
/* Runs SQL without results (pragmas, schema changes). */
int store_exec(store_conn_t *conn, const char *sql);
/* Runs a cached statement without results (BEGIN, COMMIT, savepoints): 0, or the error of
 * store_sql_error() naming what. */
int store_stmt_run(store_conn_t *conn, store_stmt_id_t id, const char *what);
/* Binds a C string, or NULL for NULL or "" when empty_is_null. */
int store_bind_text(sqlite3_stmt *stmt, int col, const char *s, bool empty_is_null);
/* Binds the owners of a usage query as the range col, col + 1 (store_conn.c's usage
 * statements): owner alone, or every owner for NULL. */
void store_bind_owners(sqlite3_stmt *stmt, int col, const char *owner);
/* Copies a text column into dst (truncating to size, always NUL-terminated). */
void store_column_copy(sqlite3_stmt *stmt, int col, char *dst, size_t size);

/* Shapes in rows are compact JSON arrays, "[2,3]" ("[]" for a scalar). */
void store_shape_format(const tensor_desc_t *d, char *buf, size_t size);
int store_shape_parse(const char *text, tensor_desc_t *d);

/* --- blobs (store_blob.c) --- */

#define STORE_BLOB_NAME_LEN 32 /* hex digits of a file blob's random name */
#define STORE_LOCATOR_SIZE 96

/* A blob file's name under blobs/: "ab/<32 hex digits>". */
typedef char blob_file_t[4 + STORE_BLOB_NAME_LEN];

/* A growable list of blob files. */
typedef struct blob_files {
    blob_file_t *a;
    size_t n, cap;
} blob_files_t;

/* Appends file, unless it is the list's last already: 0, or -ENOMEM. */
int store_files_add(blob_files_t *l, const char *file);

typedef enum store_locator_kind {
    STORE_LOCATOR_FILE,   /* "file:ab/ab0123..." under blobs/, or "file:ab/ab0123...@OFFSET"
                             for a tensor inside a segment file */
    STORE_LOCATOR_TENSOR, /* "row:jobs/<job id>/<in|out>/<slot>": bytes in the job's row */
    STORE_LOCATOR_BUFFER, /* "row:buffers/<buffer id>" */
} store_locator_kind_t;

typedef struct store_locator {
    store_locator_kind_t kind;
    char file[4 + STORE_BLOB_NAME_LEN]; /* "ab/<name>" for FILE */
    uint64_t offset;                    /* FILE: where the bytes start in it */
    char id[ID_SIZE];                   /* job or buffer id for rows */
    bool output;                        /* TENSOR: role "out" */
    int slot;                           /* TENSOR */
} store_locator_t;

/* Copies src into dst of size bytes, cut to fit: snprintf's "%s" without its formatting cost,
 * which the loop would pay several times per job. */
void store_copy_str(char *dst, size_t size, const char *src);
/* Whether id is 1 to ID_SIZE - 1 characters of [0-9a-zA-Z_-]. Ids end up in locators and
 * URLs: those the store writes come from id_new (or, in old state directories,
 * any such id), and the check keeps a corrupted row's id harmless. */
bool store_id_ok(const char *id);
/* Parses a locator strictly (so that a corrupted row can never name a path outside blobs/).
 * 0 or -EINVAL. */
int store_locator_parse(const char *blob, store_locator_t *ret);
/* A malloc'd locator string; NULL when out of memory. */
char *store_locator_file(const char *file, uint64_t offset);
char *store_locator_tensor(const char *job_id, bool output, int slot);
char *store_locator_buffer(const char *buffer_id);
/* The locator of an output whose bytes store_trim expired (store_blob_expired). */
#define STORE_LOCATOR_EXPIRED "expired:"

/* Creates a new empty file under blobs_dir with a random name *ret_file ("ab/<name>", at
 * *ret_path), its directory entry fsync'd; *ret_fd is open for writing. */
int store_blob_file_create(const char *blobs_dir, char ret_file[4 + STORE_BLOB_NAME_LEN],
                           char ret_path[PATH_MAX + 64], int *ret_fd);
/* fsync()s the directory at path, so that the entries made in it survive a crash. 0 or a
 * negative errno. */
int store_fsync_dir(const char *path);
/* pwrite()s all of data at offset. 0 or a negative errno. */
int store_write_all(int fd, const void *data, uint64_t nbytes, uint64_t offset);
/* Whether a buffer row or job tensors name file: the count in blob_refs plus pending (the
 * writer's open transaction's changes not written yet). */
int store_blob_file_referenced(store_conn_t *conn, const char *file, int64_t pending, bool *ret);
/* Writes nbytes to a new fsync'd file under blobs_dir; *ret_file is its "ab/<name>". */
int store_blob_file_write(const char *blobs_dir, const void *data, uint64_t nbytes,
                          char ret_file[4 + STORE_BLOB_NAME_LEN]);
/* Reads nbytes at offset of a blob file into a new malloc'd block. */
int store_blob_file_read(const char *blobs_dir, const char *file, uint64_t offset, uint64_t nbytes,
                         void **ret_data);
/* Reads n bytes at `at` within the nbytes at offset of a blob file into dst. */
int store_blob_file_read_at(const char *blobs_dir, const char *file, uint64_t offset,
                            uint64_t nbytes, uint64_t at, void *dst, size_t n);
/* Removes a blob file; a missing one is not an error (it was already collected). */
void store_blob_file_remove(const char *blobs_dir, const char *file);
/* Removes every file under blobs/ that no row of the n shards' connections names: left by a
 * crash between a blob's write and the commit of its row (an upload, a job's outputs), or by a
 * rolled-back transaction. Run at open, before any thread of this process can write a blob and
 * under the state directory's lock, so nothing is being written. *ret_removed: how many. */
int store_blob_sweep_orphans(store_conn_t *const *conns, int n, int *ret_removed);

/* The bytes of blob files this process has written (files, segments, uploads) less those it
 * removed: store_bytes moves its measure of blobs/ by it between walks. One count per process,
 * which holds one store (the state directory's lock); a walk corrects what it misses. */
void store_blob_bytes_moved(int64_t delta);
int64_t store_blob_bytes_net(void);

/* --- checks at open (store_check.c): a damaged store is refused, -EUCLEAN, logged --- */

/* Before a shard's file is opened: refuses a database file that is empty, or (unless
 * missing_ok) missing, while blob files exist. A WAL with whole commits past a damaged frame
 * is copied into quarantine/ first and *ret_dropped set: SQLite opens without those commits,
 * whose blob files must then stay for a recovery by hand. */
int store_check_before_open(const char *db_path, const char *blobs_dir, bool missing_ok,
                            bool *ret_dropped);
/* Whether blobs_dir holds any file in its fan-out directories. */
bool store_blobs_present(const char *blobs_dir);
/* PRAGMA quick_check of an open shard's schema, before anything reads it; refuses one that
 * cannot be read or fails it. */
int store_check_schema(store_conn_t *conn);
/* Starts the whole check of every shard (PRAGMA quick_check) on a thread of its own, which
 * notes a finding with store_note_damage, once recovery has read what it needs (the end of
 * store_recover_queued); store_check_stop interrupts and joins it (accepts a check never
 * started). */
int store_check_start(store_t *st);
void store_check_stop(store_t *st);
/* Marks the store damaged, found in db_path, and logs that once at error level: every write is
 * refused from then on. Any thread. */
void store_note_damage(store_t *st, const char *db_path, const char *found);
/* The integrity check's thread runs at this nice value, behind the loop and the workers. */
#define STORE_CHECK_NICE 10
/* Takes the clean-shutdown marker of state_dir: *ret_clean says whether the previous run
 * closed the store cleanly (store_close, also before an exec restart), and the marker is gone,
 * durably, when it returns 0, so that a crash of this run is never taken for a clean end. */
int store_clean_marker_take(const char *state_dir, bool *ret_clean);
/* Writes the marker, synced; after every shard closed cleanly. Logs a failure. */
void store_clean_marker_write(const char *state_dir);

/* --- segment files (store_segment.c) --- */

/* Tensors of at least this many bytes (and at most inline_blob_bytes) are appended to the
 * active segment instead of their rows; smaller ones cost less in the row. */
#define STORE_SEGMENT_MIN_BYTES 512
/* The first this many bytes of a transaction's small tensors stay in rows: a commit of one or a
 * few tiny jobs then syncs the WAL alone, not a segment too (an fsync less per commit; the
 * only one for a job's relaxed end). Past it, a large group commit uses the segment. */
#define STORE_TXN_ROW_BYTES (64 * 1024)

typedef struct store_segment {
    int fd; /* -1 when no segment is active */
    char file[4 + STORE_BLOB_NAME_LEN];
    uint64_t size;
    /* Appended bytes not yet written, from file offset buf_off (a multiple of the block
     * size) to size: the file gets whole blocks (store_segment.c says why). */
    unsigned char *buf;
    uint64_t buf_off;
    bool dirty;  /* appended to since the last sync */
    bool failed; /* a sync failed: the transaction cannot commit; abandoned at its end */
    /* A sync made by another thread meanwhile (store_segment_sync_begin), of the bytes up to
     * sync_size; the syncer is started by the first. */
    struct segment_syncer *syncer;
    bool sync_pending;
    uint64_t sync_size;
} store_segment_t;

void store_segment_init(store_segment_t *seg);
/* Appends nbytes to the active segment (starting one, or a new one when it is full, adding
 * the full one to retired: whether a row names it is known when the transaction ends) and
 * returns where they went. The caller's commit must store_segment_sync() first. */
int store_segment_append(store_segment_t *seg, const char *blobs_dir, blob_files_t *retired,
                         const void *data, uint64_t nbytes, blob_file_t ret_file,
                         uint64_t *ret_offset);
/* fdatasync()s what was appended since the last sync (waiting for one begun before, which
 * then only leaves what was appended since); once one failed, -EIO until the transaction
 * ends. */
int store_segment_sync(store_segment_t *seg);
/* Writes out what was appended and has the syncer thread fdatasync() it while the caller goes
 * on; store_segment_sync() then waits for that. Without a syncer it does nothing, and the next
 * store_segment_sync() makes the whole sync. */
int store_segment_sync_begin(store_segment_t *seg);
/* After a commit or rollback: retires a segment whose sync failed. */
void store_segment_txn_end(store_segment_t *seg, blob_files_t *retired);
/* True for the segment still being appended to, which no collection may remove. */
bool store_segment_is_active(const store_segment_t *seg, const char *file);
void store_segment_close(store_segment_t *seg, blob_files_t *retired);
/* Writes a whole segment at once, into a new file (fdatasync'd, as store_blob_file_write's):
 * the n pieces data[i] of nbytes[i] bytes each, behind the header, at ret_offsets[i]. Any
 * thread. */
int store_segment_write(const char *blobs_dir, const void *const *data, const uint64_t *nbytes,
                        size_t n, blob_file_t ret_file, uint64_t *ret_offsets);

/* --- a job's tensors in its row (store_tensors.c) --- */

typedef enum store_where {
    STORE_IN_ROW,    /* the bytes follow the record */
    STORE_IN_FILE,   /* a blob file of their own (offset 0) or a segment */
    STORE_IN_BUFFER, /* an uploaded buffer, by id */
    STORE_EXPIRED,   /* an output whose bytes store_trim dropped: the descriptor alone */
} store_where_t;

/* One tensor's record: its descriptor and where its bytes are. */
typedef struct store_tensor_rec {
    int slot;
    store_where_t where;
    char name[32];
    tensor_desc_t desc;
    uint64_t nbytes;
    const void *data;                   /* IN_ROW, to append: the bytes */
    uint64_t at;                        /* IN_ROW: where they start in the job's bytes */
    char file[4 + STORE_BLOB_NAME_LEN]; /* IN_FILE */
    uint64_t offset;                    /* IN_FILE */
    char buffer_id[ID_SIZE];            /* IN_BUFFER */
} store_tensor_rec_t;

/* A growable byte string; p is malloc'd. */
typedef struct store_bytes {
    unsigned char *p;
    size_t len, cap;
} store_bytes_t;

/* Appends rec's record to b, and for a tensor kept in the database its bytes to data (the
 * job's job_bytes row; setting rec->at).
 * -EINVAL for a record that cannot be written, -ENOMEM. */
int store_tensors_append(store_bytes_t *b, store_bytes_t *data, store_tensor_rec_t *rec);
/* Decodes the record at *pos of a column's len bytes into *ret and moves *pos past it: 1, or 0
 * at the end, or -EIO for malformed bytes. */
int store_tensors_next(const void *bytes, size_t len, size_t *pos, store_tensor_rec_t *ret);

/* --- jobs read back (store_read.c) --- */

/* Reads job id through conn (the writer's or a reader's connection of its shard), as
 * store_job_get hands it back. -ENOENT when missing. */
int store_job_read(store_conn_t *conn, const char *id, job_t **ret);

/* --- the writer: store_t and its shards --- */

/* Changes to blob_refs, the count of job tensors naming each file, not written yet. */
typedef struct ref_delta {
    blob_file_t file;
    int64_t n;
} ref_delta_t;

typedef struct ref_deltas {
    ref_delta_t *a;
    size_t n, cap;
} ref_deltas_t;

/* What jobs that ended add to one row of the usage rollup (owner, day, op): one job's, or
 * the sum of an open transaction's (store_usage.c). */
typedef struct usage_delta {
    char owner[OWNER_SIZE];
    char op[JOB_OP_NAME_SIZE];
    int64_t day;
    int64_t jobs, succeeded, failed, cancelled, run_us, gpu_ns, bytes_in, bytes_out;
} usage_delta_t;

typedef struct usage_deltas {
    usage_delta_t *a;
    size_t n, cap;
} usage_deltas_t;

/* What a shard's thread is woken for: its deferred writes, or its part of a commit. */
typedef enum shard_task { TASK_WRITES, TASK_COMMIT } shard_task_t;

/* A write asked for while the store defers them (store_defer_writes). */
typedef enum deferred_kind { DEFER_INSERT, DEFER_UPDATE } deferred_kind_t;

typedef struct deferred {
    job_t *job;
    deferred_kind_t kind;
    job_state_t state; /* the job's when its write was asked for */
    int result;
} deferred_t;

/* One database file of the store and what its writes keep between statements: the store's
 * jobs are spread over its shards by id (store_id_shard), each a SQLite file of its own with
 * the whole schema; buffers live in shard 0. Files under blobs/ are shared: a job tensor in any
 * shard may name one, and one goes only when no shard names it. */
typedef struct shard {
    store_t *st; /* the store it belongs to */
    int index;
    /* Writes deferred to the next store_flush, in the order they were asked for; and the
     * thread that runs them then (shards but 0), woken by go (guarded by the store's lock). */
    struct {
        deferred_t *a;
        size_t n, cap;
    } deferred;
    pthread_t thread;
    bool has_thread;
    pthread_cond_t wake;
    bool go;
    shard_task_t task; /* what go asks for */
    int commit_result; /* of a TASK_COMMIT */
    store_conn_t conn;
    store_segment_t segment; /* where small tensors' bytes go (store_segment.c) */
    bool in_txn;
    bool relaxed; /* the open transaction began with store_begin_relaxed (with sync_full) */
    bool raised;  /* synchronous is FULL for the open transaction or write (store_raise_sync) */
    bool write_savepoint; /* the open write has a savepoint (store_write_begin) */
    /* SQLite rolled the open transaction back by itself after an error: nothing more is
     * written in it (a write would commit on its own), and it cannot commit. */
    bool aborted;
    uint64_t txn_row_bytes; /* small tensors' bytes the open transaction put in rows */
    /* blob_refs changes: the open write's, and the open transaction's (its writes' that were
     * kept), which its commit writes, one statement per file rather than one per tensor. */
    ref_deltas_t write_refs, txn_refs;
    /* The usage rollup's changes by the ends the open transaction recorded: its commit writes
     * them, one statement per owner, day and op rather than one per job; and the open write's
     * end, added to them once the write is kept. */
    usage_deltas_t txn_usage;
    usage_delta_t write_usage;
    bool write_has_usage;
    /* The records of the tensors of the job being written, and its job_bytes row's bytes. */
    store_bytes_t cols, data;
    /* Files whose rows were deleted: removed at the next durable commit. The first
     * n_unlink_committed were deleted by relaxed transactions already committed; the rest by
     * the open transaction. */
    blob_files_t unlink;
    size_t n_unlink_committed;
    /* Shared files (segments, and segments written whole by other threads) that may have lost
     * their last row in the open transaction, or never had one: at its end, those that no row
     * of any shard names go. */
    blob_files_t maybe_unused;
    /* Tensors store_jobs_place_small named in the open transaction: should it not commit, their
     * locators go (a retry writes them again, to a segment that syncs). */
    job_tensor_t **placed;
    size_t n_placed, cap_placed;
    /* Pages in the WAL after the last commit, once a checkpointer copies it back elsewhere
     * (store_checkpointer_open); read by that checkpointer's thread. */
    atomic_int wal_pages;
    /* Held by whoever checkpoints, the checkpointer or the writer: SQLite lets one at a time,
     * and refuses the other rather than have it wait. */
    pthread_mutex_t checkpoint_lock;
    /* store_trim has expired the outputs of every finished job up to this (finished_us, id),
     * in that order: where its next pass starts. */
    int64_t trim_us;
    char trim_id[ID_SIZE];
} shard_t;

struct store {
    int n_shards;
    bool in_txn;
    bool relaxed;
    bool deferring;      /* job writes wait for store_flush (store_defer_writes) */
    bool parallel_txn;   /* the open transaction's writes ran side by side: so does its commit */
    unsigned committed;  /* the shards whose part the last store_commit committed */
    unsigned next_shard; /* for the next round of few jobs (store_jobs_place) */
    /* The shards' threads: lock guards their go flags, running (how many still run) and
     * stopping. */
    bool threads_ready;
    pthread_mutex_t lock;
    pthread_cond_t all_done;
    int running;
    bool stopping;
    uint64_t inline_blob_bytes;
    bool sync_full; /* durable commits are fsync'd ([store] sync_full) */
    char blobs_dir[PATH_MAX];
    char state_dir[PATH_MAX];
    char reserve_path[PATH_MAX];
    bool opened; /* store_open succeeded: a clean close may write the clean-shutdown marker */
    /* blobs/ as last walked by store_bytes (store_trim.c): its bytes, the process's count of
     * blob bytes (store_blob_bytes_net) then, and when (monotonic, 0: never). */
    uint64_t blobs_walked;
    int64_t blobs_net_at_walk;
    int64_t blobs_walk_us;
    atomic_bool reserve_present;
    int64_t reserve_retry_us; /* no new reserve before; shard 0's writer only */
    /* The last commit failed with ENOSPC (nospc), with nospc_free bytes free then. */
    atomic_bool nospc;
    _Atomic uint64_t nospc_free;
    void (*checkpoint_due)(void *arg);
    void *checkpoint_arg;
    /* What makes relaxed commits durable (store_durability_start): the WAL sync thread, and
     * the checkpointer it runs; NULL when none runs. */
    struct store_sync *syncer;
    struct store_checkpointer *checkpointer;
    uint64_t upkeep_ms; /* [store] checkpoint_interval_s, in ms */
    /* The integrity check after an unclean stop (store_check.c): its thread, and check_lock
     * guarding check_db (the connection it reads with, for an interrupt), check_stop and
     * damage (what it found, once damaged is set). */
    bool check_due;   /* the previous run stopped uncleanly: recovery starts the check */
    bool wal_dropped; /* a shard's WAL lost whole commits at open (kept in quarantine/) */
    pthread_t check_thread;
    bool check_started;
    atomic_bool check_passed;
    pthread_mutex_t check_lock;
    sqlite3 *check_db;
    bool check_stop;
    atomic_bool damaged;
    char damage[STORE_DAMAGE_SIZE];
    shard_t shards[STORE_MAX_SHARDS];
};

/* Creates the reserve file (store_space.c); a failure is logged, and only costs deletes their
 * room on a full disk. */
void store_space_open(store_t *st);
/* Removes the reserve file; true when that freed its room (it was there). */
bool store_space_release(store_t *st);
/* Notes the result r of a commit of sh: whether the disk is full (-ENOSPC), and after a
 * success, makes the reserve file again when it went and there is room. */
void store_space_note(shard_t *sh, int r);

/* The shard that job id lives in (store_shards.c). */
shard_t *store_shard_of(store_t *st, const char *id);
/* Queues a job write while the store defers them (store_defer_writes). */
int store_defer(shard_t *sh, job_t *job, deferred_kind_t kind);
/* Runs task on each shard whose wants[k] is set: side by side when parallel, else in turn. */
void store_run_on_shards(store_t *st, shard_task_t task, const bool *wants, bool parallel);

/* Brings a shard's database file to STORE_SCHEMA_VERSION (store_schema.c). */
int store_migrate(store_conn_t *conn);

/* --- the usage rollup (store_usage.c) --- */

/* The day (UTC, days since the epoch) of a time in µs since the epoch. */
#define STORE_USAGE_DAY_US INT64_C(86400000000)
/* Adds a job that has just taken its final state (job->state, finishing at finished_us after
 * starting at started_us, 0 for never) to its owner's, day's and op's row of the usage
 * rollup, in the shard's open write: the rollup changes with the job's row or not at all. */
int store_usage_note_end(shard_t *sh, const job_t *job, int64_t started_us, int64_t finished_us);
/* The same inside the shard's open transaction, without a statement: store_usage_prepare
 * (before the job's row changes: the owner and op are checked and room is made, so that nothing
 * can fail after it) and store_usage_collect note the end in the open write, store_usage_keep
 * adds it to the transaction once the write is kept, and the commit writes the sums
 * (store_usage_write), so that the rollup still changes with the rows or not at all. */
int store_usage_prepare(shard_t *sh, const job_t *job);
void store_usage_collect(shard_t *sh, const job_t *job, int64_t started_us, int64_t finished_us);
void store_usage_keep(shard_t *sh);
int store_usage_write(shard_t *sh);
/* Adds the live jobs of sh that match where (an SQL condition on jobs) to the rollup as failed
 * at finished_us, before a statement of recovery fails them: recovery ends jobs without
 * reading them. In the caller's transaction. */
int store_usage_note_failing(shard_t *sh, const char *where, int64_t finished_us);

/* --- retention (store_retention.c) --- */

/* The files a job tensor column's records (bytes, len) name: each noted as one reference less
 * in sh->write_refs, and added to files the first time the write drops it. *ret_bytes: the
 * bytes of the records' tensors kept by the store (in rows or files), not counting expired
 * outputs or buffers. A malformed column is logged, and its files left for the sweep at the
 * next open. */
int store_drop_tensors(shard_t *sh, const char *job_id, const void *bytes, size_t len,
                       blob_files_t *files, uint64_t *ret_bytes);
/* Deletes the finished jobs ids[0..n) of sh with their tensors (counting their bytes, as
 * store_drop_tensors, into *ret_bytes), in the open write; the files they alone named are
 * added to files. */
int store_delete_jobs(shard_t *sh, char (*ids)[ID_SIZE], int n, blob_files_t *files,
                      uint64_t *ret_bytes);
/* After the write that dropped files committed: removes those no row names any more. */
void store_remove_unused(shard_t *sh, blob_files_t *files);

/* --- transactions and writes (store_txn.c) --- */

/* With sync_full, synchronous = FULL around a durable commit; store_lower_sync undoes it. */
int store_raise_sync(shard_t *sh);
void store_lower_sync(shard_t *sh);
/* Begins the shard's part of the store's open transaction at its first write. */
int store_touch(shard_t *sh);
/* Commits the shard's part of the open transaction: segment bytes, file counts, COMMIT. */
int store_shard_commit(shard_t *sh);
/* A write: reset what it collects, begin (a savepoint, unless one statement inside a
 * transaction), and end it, keeping it when r is 0 and undoing it otherwise. */
void store_write_reset(shard_t *sh);
int store_write_begin(shard_t *sh, bool one_statement);
int store_write_end(shard_t *sh, int r);

/* --- jobs (store_jobs.c) --- */

int store_shard_job_insert(shard_t *sh, job_t *job, const char *id);
int store_shard_job_update(shard_t *sh, const job_t *job);
/* Writes a job's inputs' (output 0) or outputs' bytes kept in the database, if it has any. */
int store_job_bytes_insert(store_conn_t *conn, const char *job_id, int output,
                           const store_bytes_t *b);
/* Binds b's bytes to col, NULL when there are none (store_conn.c). */
void store_bind_bytes(sqlite3_stmt *stmt, int col, const store_bytes_t *b);

/* --- where bytes go (store_placement.c) --- */

/* Files written by one call, removed if the call fails. */
typedef struct written_files {
    blob_file_t files[2 * OP_MAX_TENSORS];
    int n;
} written_files_t;

void store_written_remove(shard_t *sh, const written_files_t *w);
/* Checks a tensor's descriptor, byte count and the source of its bytes; group and name make
 * its path in the message ("inputs", "x": inputs.x). */
int store_check_tensor(const char *owner_id, const char *group, const char *name,
                       const job_tensor_t *t);
/* Decides where a tensor's bytes go and says so in rec (where, data, file, offset). */
int store_place_bytes(shard_t *sh, bool segments, const void *data, uint64_t nbytes,
                      const char *blob, written_files_t *written, store_tensor_rec_t *rec);
/* Places a job's tensor and appends its record to sh->cols; *ret_blob is its new locator. */
int store_place_tensor(shard_t *sh, const char *job_id, bool output, int slot, const char *name,
                       const job_tensor_t *t, written_files_t *written, char **ret_blob);

/* --- which files rows name (store_refs.c) --- */

int store_refs_reserve(ref_deltas_t *d, size_t more);
void store_refs_merge(ref_deltas_t *into, const ref_deltas_t *from);
int store_refs_note(ref_deltas_t *d, const char *file, int64_t n);
int store_refs_write(shard_t *sh, ref_deltas_t *d);
bool store_file_in_use(store_t *st, const char *file);
void store_files_settle(store_t *st);
void store_unlink_pending(shard_t *sh);
int store_unlink_after_commit(shard_t *sh, const blob_file_t *files, size_t n);

/* --- durability and WAL checkpoints (store_durable.c, store_checkpoint.c, store_sync.c) --- */

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
int store_checkpointer_open(store_t *st, void (*due)(void *arg), void *arg,
                            store_checkpointer_t **ret);
/* A PASSIVE checkpoint, which never waits for the writer or readers, when the writer's commits
 * have left the WAL between 1000 and 4000 pages; else nothing. (Under a steady stream of
 * commits such a checkpoint never reaches the WAL's end, which SQLite needs to start the WAL
 * over: past 4000 pages the writer finishes the copy itself.) On one thread at a time. */
int store_checkpointer_run(store_checkpointer_t *cp);
void store_checkpointer_close(store_checkpointer_t *cp); /* accepts NULL */

/* PRAGMA wal_checkpoint(TRUNCATE) when no reader is in the way, else PASSIVE. */
int store_checkpoint(store_t *st);

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
/* What waits for a sync: its scope is the WAL files whose sync it waits for, bit k for the
 * k-th of store_sync_start's; 0 for all. */
typedef store_durable_wait_t store_sync_item_t;

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
