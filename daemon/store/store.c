/* The durable store on SQLite: the write connection (the scheduler's loop thread), its schema
 * and migrations, transactions, and every write. Reads are in store_read.c, blob files and
 * locators in store_blob.c, the connection helpers in store_conn.c.
 *
 * Every write runs inside a savepoint, so that a failed write undoes only its own rows whether
 * or not the caller has a transaction open; blob files a failed write created are removed at
 * once. Files that become unreferenced by a commit (gc, buffer deletion) are removed only once
 * that commit is done; files left behind by a crash or by a rolled-back transaction are swept
 * at the next open. */
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>

#include "daemon/util/log.h"
#include "store_internal.h"

#define GC_BATCH 256

/* Changes to blob_refs, the count of job tensors naming each file, not written yet. */
typedef struct ref_delta {
    blob_file_t file;
    int64_t n;
} ref_delta_t;

typedef struct ref_deltas {
    ref_delta_t *a;
    size_t n, cap;
} ref_deltas_t;

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
    bool relaxed;         /* the open transaction began with store_begin_relaxed (with sync_full) */
    bool raised;          /* synchronous is FULL for the open transaction or write (raise_sync) */
    bool write_savepoint; /* the open write has a savepoint (write_begin) */
    /* SQLite rolled the open transaction back by itself after an error: nothing more is
     * written in it (a write would commit on its own), and it cannot commit. */
    bool aborted;
    uint64_t txn_row_bytes; /* small tensors' bytes the open transaction put in rows */
    /* blob_refs changes: the open write's, and the open transaction's (its writes' that were
     * kept), which its commit writes, one statement per file rather than one per tensor. */
    ref_deltas_t write_refs, txn_refs;
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
} shard_t;

struct store {
    int n_shards;
    bool in_txn;
    bool relaxed;
    bool deferring;     /* job writes wait for store_flush (store_defer_writes) */
    bool parallel_txn;  /* the open transaction's writes ran side by side: so does its commit */
    unsigned committed; /* the shards whose part the last store_commit committed */
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
    void (*checkpoint_due)(void *arg);
    void *checkpoint_arg;
    shard_t shards[STORE_MAX_SHARDS];
};

/* WAL pages past which a checkpointer copies the WAL back: SQLite's autocheckpoint default;
 * and past which the writer finishes the copy instead (note_wal_pages). The WAL file is cut
 * back to about the second when it starts over (journal_size_limit). */
#define STORE_CHECKPOINT_PAGES 1000
#define STORE_WRITER_CHECKPOINT_PAGES (4 * STORE_CHECKPOINT_PAGES)

struct store_checkpointer {
    store_t *st;
    store_conn_t conns[STORE_MAX_SHARDS];
};

/* Schema migrations, in order. Version N is applied to a database at version N - 1, in one
 * transaction that also sets user_version = N: its SQL, then its conversion in C if it has
 * one. A new version is one more entry. */
static const struct {
    int version;
    const char *sql;
} migrations[] = {
    {1, "CREATE TABLE jobs ("
        "  id TEXT PRIMARY KEY,"
        "  owner TEXT NOT NULL,"
        "  op TEXT NOT NULL,"
        "  params TEXT,"
        "  priority INTEGER NOT NULL,"
        "  device INTEGER NOT NULL,"
        "  deadline_us INTEGER NOT NULL,"
        "  state TEXT NOT NULL CHECK (state IN "
        "    ('queued', 'running', 'succeeded', 'failed', 'cancelled')),"
        "  attempts INTEGER NOT NULL DEFAULT 0,"
        "  created_us INTEGER NOT NULL,"
        "  started_us INTEGER NOT NULL DEFAULT 0,"
        "  finished_us INTEGER NOT NULL DEFAULT 0,"
        "  run_device INTEGER NOT NULL DEFAULT -1,"
        "  gpu_ns INTEGER NOT NULL DEFAULT 0,"
        "  batch_size INTEGER NOT NULL DEFAULT 0,"
        "  error_code TEXT NOT NULL DEFAULT '',"
        "  error_message TEXT NOT NULL DEFAULT '',"
        "  idempotency_key TEXT"
        ") WITHOUT ROWID;"
        "CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner, idempotency_key)"
        "  WHERE idempotency_key IS NOT NULL;"
        "CREATE INDEX jobs_owner_id ON jobs (owner, id);"
        "CREATE INDEX jobs_state ON jobs (state, created_us, id);"
        "CREATE INDEX jobs_finished ON jobs (finished_us)"
        "  WHERE state IN ('succeeded', 'failed', 'cancelled');"
        /* A rowid table: inline tensor bytes make rows large, which WITHOUT ROWID handles
         * badly. */
        "CREATE TABLE tensors ("
        "  job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
        "  role TEXT NOT NULL CHECK (role IN ('in', 'out')),"
        "  slot INTEGER NOT NULL,"
        "  name TEXT NOT NULL,"
        "  dtype TEXT NOT NULL,"
        "  shape TEXT NOT NULL,"
        "  nbytes INTEGER NOT NULL,"
        "  buffer_id TEXT,"
        "  data BLOB,"
        "  file TEXT,"
        "  PRIMARY KEY (job_id, role, slot)"
        ");"
        "CREATE INDEX tensors_file ON tensors (file) WHERE file IS NOT NULL;"
        "CREATE TABLE buffers ("
        "  id TEXT PRIMARY KEY,"
        "  owner TEXT NOT NULL,"
        "  dtype TEXT NOT NULL,"
        "  shape TEXT NOT NULL,"
        "  nbytes INTEGER NOT NULL,"
        "  resident INTEGER NOT NULL,"
        "  created_us INTEGER NOT NULL,"
        "  data BLOB,"
        "  file TEXT"
        ");"
        "CREATE INDEX buffers_owner ON buffers (owner);"
        "CREATE INDEX buffers_file ON buffers (file) WHERE file IS NOT NULL;"},
    /* The device a resident buffer was placed on (-1: none, or the CPU backend). */
    {2, "ALTER TABLE buffers ADD COLUMN device INTEGER NOT NULL DEFAULT -1;"},
    /* Where a tensor starts in its file: tensors share segment files (store_segment.c). */
    {3, "ALTER TABLE tensors ADD COLUMN file_offset INTEGER NOT NULL DEFAULT 0;"},
    /* The CHECKs on state and role, and the jobs_finished index's condition, as OR chains
     * instead of IN lists: SQLite built an ephemeral table for each IN list it evaluated,
     * three per update of a job, which cost the loop thread a third of its time per tiny job
     * (bench_sched_throughput). A CHECK changes only with its table, so both tables are
     * rebuilt; tensors first, so that dropping the old jobs table cascades into nothing. */
    {4, "CREATE TABLE jobs_v4 ("
        "  id TEXT PRIMARY KEY,"
        "  owner TEXT NOT NULL,"
        "  op TEXT NOT NULL,"
        "  params TEXT,"
        "  priority INTEGER NOT NULL,"
        "  device INTEGER NOT NULL,"
        "  deadline_us INTEGER NOT NULL,"
        "  state TEXT NOT NULL CHECK (state = 'queued' OR state = 'running' OR "
        "    state = 'succeeded' OR state = 'failed' OR state = 'cancelled'),"
        "  attempts INTEGER NOT NULL DEFAULT 0,"
        "  created_us INTEGER NOT NULL,"
        "  started_us INTEGER NOT NULL DEFAULT 0,"
        "  finished_us INTEGER NOT NULL DEFAULT 0,"
        "  run_device INTEGER NOT NULL DEFAULT -1,"
        "  gpu_ns INTEGER NOT NULL DEFAULT 0,"
        "  batch_size INTEGER NOT NULL DEFAULT 0,"
        "  error_code TEXT NOT NULL DEFAULT '',"
        "  error_message TEXT NOT NULL DEFAULT '',"
        "  idempotency_key TEXT"
        ") WITHOUT ROWID;"
        "INSERT INTO jobs_v4 SELECT id, owner, op, params, priority, device, deadline_us, state, "
        "  attempts, created_us, started_us, finished_us, run_device, gpu_ns, batch_size, "
        "  error_code, error_message, idempotency_key FROM jobs;"
        "CREATE TABLE tensors_v4 ("
        "  job_id TEXT NOT NULL REFERENCES jobs_v4 (id) ON DELETE CASCADE,"
        "  role TEXT NOT NULL CHECK (role = 'in' OR role = 'out'),"
        "  slot INTEGER NOT NULL,"
        "  name TEXT NOT NULL,"
        "  dtype TEXT NOT NULL,"
        "  shape TEXT NOT NULL,"
        "  nbytes INTEGER NOT NULL,"
        "  buffer_id TEXT,"
        "  data BLOB,"
        "  file TEXT,"
        "  file_offset INTEGER NOT NULL DEFAULT 0,"
        "  PRIMARY KEY (job_id, role, slot)"
        ");"
        "INSERT INTO tensors_v4 SELECT job_id, role, slot, name, dtype, shape, nbytes, "
        "  buffer_id, data, file, file_offset FROM tensors;"
        "DROP TABLE tensors;"
        "DROP TABLE jobs;"
        "ALTER TABLE jobs_v4 RENAME TO jobs;"
        "ALTER TABLE tensors_v4 RENAME TO tensors;"
        "CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner, idempotency_key)"
        "  WHERE idempotency_key IS NOT NULL;"
        "CREATE INDEX jobs_owner_id ON jobs (owner, id);"
        "CREATE INDEX jobs_state ON jobs (state, created_us, id);"
        "CREATE INDEX jobs_finished ON jobs (finished_us) WHERE " STORE_FINAL_STATES ";"
        "CREATE INDEX tensors_file ON tensors (file) WHERE file IS NOT NULL;"},
    /* A job's tensors move into its row (store_tensors.c says why), and which files they name
     * into blob_refs: how many job tensors name each file, the count that retention and the
     * sweep at open go by. move_tensors_into_jobs (conversions below) fills the new columns
     * and drops tensors. */
    {5, "ALTER TABLE jobs ADD COLUMN inputs BLOB;"
        "ALTER TABLE jobs ADD COLUMN outputs BLOB;"
        "CREATE TABLE job_bytes ("
        "  job_id TEXT NOT NULL,"
        "  output INTEGER NOT NULL,"
        "  data BLOB NOT NULL,"
        "  PRIMARY KEY (job_id, output)"
        ");"
        "CREATE TABLE blob_refs ("
        "  file TEXT PRIMARY KEY,"
        "  refs INTEGER NOT NULL"
        ") WITHOUT ROWID;"
        "INSERT INTO blob_refs SELECT file, count(*) FROM tensors WHERE file IS NOT NULL "
        "  GROUP BY file;"},
    /* Indexes that a job's start leaves alone. jobs_state (state, created_us, id) and
     * jobs_finished's condition on state made every change of state rewrite index entries:
     * the start's, the end's, and a re-queue's. Partial indexes on finished_us, which is 0
     * until a job ends and set when it does (update_row keeps it so), replace them: jobs_live
     * (owner, id) for the queued and running jobs (recovery, the queue reloaded at open, a
     * listing by a live state), jobs_ended (state, id) for a listing by a final state, and
     * jobs_finished for retention. A start, which sets neither finished_us nor an indexed
     * column (STMT_JOB_START), then writes the row alone: the three writes of a job cost
     * 12.0 -> 10.8 µs (a probe of SQLite alone, 2-core machine). Ended jobs a past version
     * left without a finish time get their start's or their creation's, and live ones lose
     * any they have. */
    {6, "DROP INDEX jobs_state;"
        "DROP INDEX jobs_finished;"
        "UPDATE jobs SET finished_us = max(started_us, created_us, 1) "
        "  WHERE finished_us <= 0 AND " STORE_FINAL_STATES ";"
        "UPDATE jobs SET finished_us = 0 WHERE finished_us <> 0 AND NOT " STORE_FINAL_STATES ";"
        "CREATE INDEX jobs_live ON jobs (owner, id) WHERE " STORE_LIVE ";"
        "CREATE INDEX jobs_ended ON jobs (state, id) WHERE " STORE_ENDED ";"
        "CREATE INDEX jobs_finished ON jobs (finished_us) WHERE " STORE_ENDED ";"},
    /* Settings of the store itself: in shard 0 how many shards it has ("shards"), in the
     * others which one the file is ("shard"). */
    {7, "CREATE TABLE settings ("
        "  name TEXT PRIMARY KEY,"
        "  value INTEGER NOT NULL"
        ") WITHOUT ROWID;"},
};

static int move_tensors_into_jobs(store_conn_t *conn);

/* The migrations whose rows SQL alone cannot rewrite, by version. */
static const struct {
    int version;
    int (*convert)(store_conn_t *conn);
} conversions[] = {{5, move_tensors_into_jobs}};

#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

_Static_assert(STORE_SCHEMA_VERSION == N_MIGRATIONS, "one migration per schema version");

static int migrate(store_conn_t *conn)
{
    for (int i = 0; i < N_MIGRATIONS; i++) {
        int r = store_exec(conn, "BEGIN IMMEDIATE");
        if (r < 0) return r;
        int version = 0;
        r = store_user_version(conn, &version);
        if (r == 0 && version == migrations[i].version - 1) {
            char set_version[64];
            snprintf(set_version, sizeof set_version, "PRAGMA user_version = %d",
                     migrations[i].version);
            r = store_exec(conn, migrations[i].sql);
            for (size_t c = 0; c < sizeof conversions / sizeof conversions[0]; c++)
                if (r == 0 && conversions[c].version == migrations[i].version)
                    r = conversions[c].convert(conn);
            if (r == 0) r = store_exec(conn, set_version);
            if (r == 0)
                log_info("store: migrated '%s' to schema version %d", conn->db_path,
                         migrations[i].version);
        }
        if (r == 0) r = store_exec(conn, "COMMIT");
        if (r < 0) {
            if (!sqlite3_get_autocommit(conn->db)) store_exec(conn, "ROLLBACK");
            return r;
        }
    }
    return 0;
}

/* Binds b's bytes to col, NULL when there are none. */
static void bind_bytes(sqlite3_stmt *stmt, int col, const store_bytes_t *b)
{
    if (b->len)
        sqlite3_bind_blob64(stmt, col, b->p, b->len, SQLITE_STATIC);
    else
        sqlite3_bind_null(stmt, col);
}

/* Writes a job's inputs' (output 0) or outputs' bytes kept in the database, if it has any. */
static int insert_bytes(store_conn_t *conn, const char *job_id, int output, const store_bytes_t *b)
{
    if (b->len == 0) return 0;
    sqlite3_stmt *stmt = store_stmt(conn, STMT_JOB_BYTES_INSERT);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, job_id, false);
    sqlite3_bind_int(stmt, 2, output);
    bind_bytes(stmt, 3, b);
    int r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(conn, "writing a job's bytes");
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    return r;
}

/* Schema 5: a job's tensor rows, in slot order, become the records of its inputs and outputs
 * columns; then the tensors table goes. */
static int move_tensors_into_jobs(store_conn_t *conn)
{
    sqlite3_stmt *rows = NULL, *update = NULL;
    store_bytes_t cols[2] = {{0}}, data[2] = {{0}}; /* inputs, outputs */
    char job[ID_SIZE] = "";
    int r = 0, rc = SQLITE_DONE, moved = 0;
    if (sqlite3_prepare_v2(conn->db,
                           "SELECT job_id, role, slot, name, dtype, shape, nbytes, buffer_id, "
                           "data, file, file_offset FROM tensors ORDER BY job_id, role, slot",
                           -1, &rows, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(conn->db, "UPDATE jobs SET inputs = ?2, outputs = ?3 WHERE id = ?1", -1,
                           &update, NULL) != SQLITE_OK)
        r = store_sql_error(conn, "moving tensors into their jobs");
    for (bool more = r == 0; more;) {
        rc = sqlite3_step(rows);
        more = rc == SQLITE_ROW;
        const char *id = more ? (const char *)sqlite3_column_text(rows, 0) : NULL;
        if (job[0] && (!more || !id || strcmp(id, job) != 0)) {
            store_bind_text(update, 1, job, false);
            bind_bytes(update, 2, &cols[0]);
            bind_bytes(update, 3, &cols[1]);
            if (sqlite3_step(update) != SQLITE_DONE)
                r = store_sql_error(conn, "moving tensors into their jobs");
            sqlite3_reset(update);
            for (int c = 0; c < 2 && r == 0; c++)
                r = insert_bytes(conn, job, c, &data[c]);
            cols[0].len = cols[1].len = data[0].len = data[1].len = 0;
            moved++;
        }
        if (!more || r < 0) break;
        snprintf(job, sizeof job, "%s", id ? id : "");
        const char *role = (const char *)sqlite3_column_text(rows, 1);
        bool output = role && strcmp(role, "out") == 0;
        store_tensor_rec_t rec = {.slot = sqlite3_column_int(rows, 2)};
        store_column_copy(rows, 3, rec.name, sizeof rec.name);
        const char *dtype = (const char *)sqlite3_column_text(rows, 4);
        const char *shape = (const char *)sqlite3_column_text(rows, 5);
        rec.nbytes = (uint64_t)sqlite3_column_int64(rows, 6);
        if (!dtype || dtype_parse(dtype, &rec.desc.dtype) < 0 || !shape ||
            store_shape_parse(shape, &rec.desc) < 0) {
            r = log_error_errno(-EIO,
                                "store: job %s: a stored tensor's dtype or shape is "
                                "malformed; schema version 5 cannot be reached",
                                job);
            break;
        }
        if (sqlite3_column_type(rows, 7) == SQLITE_TEXT) {
            rec.where = STORE_IN_BUFFER;
            store_column_copy(rows, 7, rec.buffer_id, sizeof rec.buffer_id);
        } else if (sqlite3_column_type(rows, 9) == SQLITE_TEXT) {
            rec.where = STORE_IN_FILE;
            store_column_copy(rows, 9, rec.file, sizeof rec.file);
            rec.offset = (uint64_t)sqlite3_column_int64(rows, 10);
        } else {
            rec.where = STORE_IN_ROW;
            rec.data = sqlite3_column_blob(rows, 8);
            if ((uint64_t)sqlite3_column_bytes(rows, 8) != rec.nbytes) rec.data = NULL;
        }
        r = store_tensors_append(&cols[output], &data[output], &rec);
        if (r < 0)
            log_error("store: job %s: tensor slot %d cannot be moved into its row: %s", job,
                      rec.slot, strerror(-r));
    }
    if (r == 0 && rc != SQLITE_DONE) r = store_sql_error(conn, "moving tensors into their jobs");
    sqlite3_finalize(rows);
    sqlite3_finalize(update);
    for (int c = 0; c < 2; c++) {
        free(cols[c].p);
        free(data[c].p);
    }
    if (r == 0) r = store_exec(conn, "DROP TABLE tensors");
    if (r == 0 && moved) log_info("store: moved the tensors of %d job(s) into their rows", moved);
    return r;
}

static int mkdir_if_missing(const char *path)
{
    if (mkdir(path, 0750) == 0 || errno == EEXIST) return 0;
    return log_error_errno(-errno, "store: cannot create '%s': %s", path, strerror(errno));
}

static int configure_writer(store_conn_t *conn)
{
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(conn->db, "PRAGMA journal_mode = WAL", -1, &stmt, NULL) != SQLITE_OK)
        return store_sql_error(conn, "setting journal_mode");
    int r = 0;
    if (sqlite3_step(stmt) != SQLITE_ROW)
        r = store_sql_error(conn, "setting journal_mode");
    else if (strcmp((const char *)sqlite3_column_text(stmt, 0), "wal") != 0)
        r = log_error_errno(-EIO, "store: '%s' cannot use WAL mode (journal_mode is '%s')",
                            conn->db_path, sqlite3_column_text(stmt, 0));
    sqlite3_finalize(stmt);
    /* NORMAL: a commit writes its WAL frames without an fsync. With sync_full the durable
     * ones raise it to FULL around their commit (raise_sync); relaxed ones, the job path's,
     * are made durable by the WAL sync thread (store_sync.c), or not at all. */
    if (r == 0) r = store_exec(conn, "PRAGMA synchronous = NORMAL");
    /* Each write runs in a savepoint, whose journal of the pages it changes would otherwise
     * go through a temporary file: 4 of every 5 bytes this process wrote for tiny jobs. */
    if (r == 0) r = store_exec(conn, "PRAGMA temp_store = MEMORY");
    return r;
}

static int64_t refs_pending(const shard_t *sh, const char *file);
static int start_shard_threads(store_t *st);
static void stop_shard_threads(store_t *st);
static void run_on_shards(store_t *st, shard_task_t task, const bool *wants, bool parallel);

/* Whether a row of any shard names file, counting the changes of each shard's open write and
 * transaction not written yet, or file is a shard's active segment. A file that cannot be
 * checked counts as named: it stays for the sweep at the next open. */
static bool file_in_use(store_t *st, const char *file)
{
    for (int k = 0; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        bool used = true;
        if (store_segment_is_active(&sh->segment, file) ||
            store_blob_file_referenced(&sh->conn, file, refs_pending(sh, file), &used) < 0 || used)
            return true;
    }
    return false;
}

/* After a commit or rollback (of the store's transaction, or of a write outside one): retires
 * segments whose sync failed, and removes the shared files that may have lost their last row,
 * or never had one, when no row names them. */
static void files_settle(store_t *st)
{
    for (int k = 0; k < st->n_shards; k++)
        store_segment_txn_end(&st->shards[k].segment, &st->shards[k].maybe_unused);
    for (int k = 0; k < st->n_shards; k++) {
        blob_files_t *l = &st->shards[k].maybe_unused;
        for (size_t i = 0; i < l->n; i++)
            if (!file_in_use(st, l->a[i])) store_blob_file_remove(st->blobs_dir, l->a[i]);
        l->n = 0;
    }
}

static int shard_open(store_t *st, int k, const config_t *cfg, int *ret_version_before)
{
    shard_t *sh = &st->shards[k];
    sh->st = st;
    sh->index = k;
    store_segment_init(&sh->segment);
    pthread_mutex_init(&sh->checkpoint_lock, NULL);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX;
    /* Shard 0 says how many shards there are; the others exist from the store's creation on:
     * one missing held jobs, and is not made anew. */
    if (k == 0 || st->n_shards == 0) flags |= SQLITE_OPEN_CREATE;
    int r = store_conn_open(&sh->conn, cfg->state_dir, k, flags);
    if (r == -ENOENT)
        return log_error_errno(-ENOENT,
                               "store: shard file '%s' is missing: the jobs stored in it cannot "
                               "be read; restore it from a backup",
                               sh->conn.db_path);
    if (r == 0) r = configure_writer(&sh->conn);
    if (r == 0) r = store_user_version(&sh->conn, ret_version_before);
    if (r == 0) r = migrate(&sh->conn);
    return r;
}

/* The shard count of the store (n_shards, from the setting in shard 0; a store from before
 * shards has one), its other shards opened, and the count recorded once they all are. A
 * shard other than 0 records its index, so that files swapped by hand are refused. */
static int open_shards(store_t *st, const config_t *cfg, int version_before)
{
    int recorded = 0;
    int r = store_setting_get(&st->shards[0].conn, "shards", &recorded);
    if (r < 0) return r;
    int n = recorded ? recorded : version_before == 0 ? cfg->shards : 1;
    if (n < 1 || n > STORE_MAX_SHARDS || (n & (n - 1)))
        return log_error_errno(-EPROTO, "store: '%s' records %d shards, not a power of two to %d",
                               st->shards[0].conn.db_path, n, STORE_MAX_SHARDS);
    if (n != cfg->shards)
        log_warn("store: the store in '%s' has %d shard(s): [store] shards = %d applies to a new "
                 "state directory only",
                 cfg->state_dir, n, cfg->shards);
    st->n_shards = recorded ? n : 0; /* 0 while they are created: shard_open may create them */
    for (int k = 1; k < n && r == 0; k++) {
        int version = 0, index = 0;
        r = shard_open(st, k, cfg, &version);
        if (r == 0 && version == 0) r = store_setting_set(&st->shards[k].conn, "shard", k);
        if (r == 0) r = store_setting_get(&st->shards[k].conn, "shard", &index);
        if (r == 0 && index != k)
            r = log_error_errno(-EPROTO, "store: '%s' holds shard %d, not %d",
                                st->shards[k].conn.db_path, index, k);
        if (r < 0) {
            st->n_shards = k + 1; /* so that store_close closes what was opened */
            return r;
        }
    }
    st->n_shards = n;
    if (!recorded) r = store_setting_set(&st->shards[0].conn, "shards", n);
    return r;
}

int store_open(const config_t *cfg, store_t **ret)
{
    int r = mkdir_if_missing(cfg->state_dir);
    if (r < 0) return r;
    store_t *st = calloc(1, sizeof *st);
    if (!st) return -ENOMEM;
    st->inline_blob_bytes = cfg->inline_blob_bytes;
    st->sync_full = cfg->sync_full;
    if (snprintf(st->blobs_dir, sizeof st->blobs_dir, "%s/blobs", cfg->state_dir) >=
        (int)sizeof st->blobs_dir) {
        free(st);
        return log_error_errno(-ENAMETOOLONG, "store: state_dir '%s' is too long", cfg->state_dir);
    }
    st->n_shards = 1;
    int version_before = 0, removed = 0;
    r = mkdir_if_missing(st->blobs_dir);
    if (r == 0) r = shard_open(st, 0, cfg, &version_before);
    if (r == 0) r = open_shards(st, cfg, version_before);
    store_conn_t *conns[STORE_MAX_SHARDS];
    for (int k = 0; k < st->n_shards; k++)
        conns[k] = &st->shards[k].conn;
    if (r == 0) r = store_blob_sweep_orphans(conns, st->n_shards, &removed);
    if (r == 0 && st->n_shards > 1) r = start_shard_threads(st);
    if (r < 0) {
        store_close(st);
        return r;
    }
    if (removed > 0)
        log_info("store: removed %d blob file(s) that no committed row named", removed);
    if (st->n_shards > 1) log_info("store: %d shards", st->n_shards);
    *ret = st;
    return 0;
}

void store_close(store_t *st)
{
    if (!st) return;
    stop_shard_threads(st);
    if (st->in_txn) {
        log_warn("store: closing with a transaction open: rolling it back");
        store_rollback(st);
    }
    for (int k = 0; k < st->n_shards; k++)
        store_segment_close(&st->shards[k].segment, &st->shards[k].maybe_unused);
    files_settle(st);
    for (int k = 0; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        store_conn_close(&sh->conn);
        pthread_mutex_destroy(&sh->checkpoint_lock);
        free(sh->write_refs.a);
        free(sh->txn_refs.a);
        free(sh->cols.p);
        free(sh->data.p);
        free(sh->unlink.a);
        free(sh->maybe_unused.a);
        free(sh->placed);
        free(sh->deferred.a);
    }
    free(st);
}

int store_shards(const store_t *st)
{
    return st->n_shards;
}

static shard_t *shard_of(store_t *st, const char *id)
{
    return &st->shards[store_id_shard(id, st->n_shards)];
}

int store_blob_write(store_t *st, const void *data, uint64_t nbytes, char **ret_blob)
{
    if (nbytes <= st->inline_blob_bytes) {
        *ret_blob = NULL;
        return 0;
    }
    blob_file_t file;
    int r = store_blob_file_write(st->blobs_dir, data, nbytes, file);
    if (r < 0) return r;
    char *blob = store_locator_file(file, 0);
    if (!blob) {
        store_blob_file_remove(st->blobs_dir, file);
        return -ENOMEM;
    }
    *ret_blob = blob;
    return 0;
}

void store_blob_discard(store_t *st, const char *blob)
{
    store_locator_t loc;
    if (!blob || store_locator_parse(blob, &loc) < 0 || loc.kind != STORE_LOCATOR_FILE) return;
    if (loc.offset == 0) {
        store_blob_file_remove(st->blobs_dir, loc.file);
        return;
    }
    /* A segment holds other tensors too: it goes if no row names it once the transaction
     * ends. Out of memory, it stays for the sweep at the next open. */
    store_files_add(&st->shards[0].maybe_unused, loc.file);
    if (!st->in_txn) files_settle(st);
}

/* The tensor slot of a job that store_blob_pack takes: bytes in memory for a row, of a size
 * that would go to the loop's segment. */
static job_tensor_t *packable(uint64_t inline_blob_bytes, job_t *job, bool outputs, int slot)
{
    job_tensor_t *t = outputs ? &job->out[slot] : &job->in[slot];
    if (outputs && (slot >= job->call.n_out || job->error_code[0])) return NULL;
    bool takes = t->data && !t->blob && !t->buffer_id[0] && t->nbytes >= STORE_SEGMENT_MIN_BYTES &&
                 t->nbytes <= inline_blob_bytes;
    return takes ? t : NULL;
}

int store_blob_pack(store_t *st, job_t *const *jobs, size_t n, bool outputs)
{
    size_t count = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < OP_MAX_TENSORS; j++) {
            job_tensor_t *t = packable(st->inline_blob_bytes, jobs[i], outputs, j);
            if (!t) continue;
            count++;
            total += t->nbytes;
        }
    if (total <= STORE_TXN_ROW_BYTES) return 0;

    const void **data = malloc(count * sizeof *data);
    uint64_t *nbytes = malloc(count * sizeof *nbytes), *offsets = malloc(count * sizeof *offsets);
    job_tensor_t **tensors = malloc(count * sizeof *tensors);
    int r = data && nbytes && offsets && tensors ? 0 : -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; r == 0 && i < n; i++)
        for (int j = 0; j < OP_MAX_TENSORS; j++) {
            job_tensor_t *t = packable(st->inline_blob_bytes, jobs[i], outputs, j);
            if (!t) continue;
            tensors[k] = t;
            data[k] = t->data;
            nbytes[k++] = t->nbytes;
        }
    blob_file_t file;
    if (r == 0) r = store_segment_write(st->blobs_dir, data, nbytes, count, file, offsets);
    if (r == 0) {
        k = 0;
        while (k < count && (tensors[k]->blob = store_locator_file(file, offsets[k])))
            k++;
        if (k < count) {
            /* Out of memory for the locators: the file goes with them. */
            while (k-- > 0) {
                free(tensors[k]->blob);
                tensors[k]->blob = NULL;
            }
            store_blob_file_remove(st->blobs_dir, file);
            r = -ENOMEM;
        }
    }
    free(data);
    free(nbytes);
    free(offsets);
    free(tensors);
    return r;
}

static int touch(shard_t *sh);

/* store_jobs_place_small for the jobs of one shard (in, an array of n), which go to its
 * segment. */
static int shard_place_small(shard_t *sh, job_t *const *jobs, size_t n, bool outputs)
{
    uint64_t total = 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < OP_MAX_TENSORS; j++) {
            const job_tensor_t *t = packable(sh->st->inline_blob_bytes, jobs[i], outputs, j);
            if (!t) continue;
            total += t->nbytes;
            count++;
        }
    if (sh->txn_row_bytes + total <= STORE_TXN_ROW_BYTES) return 0;
    int r = touch(sh);
    if (r < 0) return r;
    if (sh->n_placed + count > sh->cap_placed) {
        size_t cap = 2 * (sh->n_placed + count);
        job_tensor_t **a = realloc(sh->placed, cap * sizeof *a);
        if (!a) return 0; /* nothing placed: the writes place them as they go */
        sh->placed = a;
        sh->cap_placed = cap;
    }
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < OP_MAX_TENSORS; j++) {
            job_tensor_t *t = packable(sh->st->inline_blob_bytes, jobs[i], outputs, j);
            if (!t) continue;
            blob_file_t file;
            uint64_t offset;
            r = store_segment_append(&sh->segment, sh->conn.blobs_dir, &sh->maybe_unused, t->data,
                                     t->nbytes, file, &offset);
            if (r == 0 && !(t->blob = store_locator_file(file, offset))) r = -ENOMEM;
            if (r < 0) return r;
            sh->placed[sh->n_placed++] = t;
        }
    return store_segment_sync_begin(&sh->segment);
}

int store_jobs_place_small(store_t *st, job_t *const *jobs, size_t n, bool outputs)
{
    if (!st->in_txn)
        return log_error_errno(-EINVAL, "store: placing tensors outside a transaction");
    if (st->n_shards == 1) return shard_place_small(&st->shards[0], jobs, n, outputs);
    job_t **mine = malloc((n ? n : 1) * sizeof *mine);
    if (!mine) return 0; /* the writes place them as they go */
    int r = 0;
    for (int k = 0; k < st->n_shards && r == 0; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (store_id_shard(jobs[i]->id, st->n_shards) == k) mine[m++] = jobs[i];
        if (m > 0) r = shard_place_small(&st->shards[k], mine, m, outputs);
    }
    free(mine);
    return r;
}

/* --- blob_refs --- */

static int refs_reserve(ref_deltas_t *d, size_t more)
{
    return vec_grow((void **)&d->a, &d->cap, d->n + more, sizeof *d->a, 16);
}

/* Adds what the open write changed to what its transaction will write; room was reserved. */
static void refs_merge(ref_deltas_t *into, const ref_deltas_t *from)
{
    for (size_t i = 0; i < from->n; i++) {
        size_t j = into->n;
        while (j-- > 0 && strcmp(into->a[j].file, from->a[i].file) != 0)
            ;
        if (j == SIZE_MAX) {
            into->a[into->n] = from->a[i];
            into->n++;
        } else {
            into->a[j].n += from->a[i].n;
        }
    }
}

/* Writes the changes into blob_refs (a count that drops to zero takes its row along). */
static int refs_write(shard_t *sh, ref_deltas_t *d)
{
    int r = 0;
    for (size_t i = 0; i < d->n && r == 0; i++) {
        if (d->a[i].n == 0) continue;
        store_stmt_id_t id = STMT_REFS_ADD;
        for (int step = 0; step < 2 && r == 0; step++) {
            sqlite3_stmt *stmt = store_stmt(&sh->conn, id);
            if (!stmt) return -EIO;
            store_bind_text(stmt, 1, d->a[i].file, false);
            if (id == STMT_REFS_ADD) sqlite3_bind_int64(stmt, 2, d->a[i].n);
            if (sqlite3_step(stmt) != SQLITE_DONE)
                r = store_sql_error(&sh->conn, "counting a file");
            sqlite3_reset(stmt);
            if (d->a[i].n > 0) break;
            id = STMT_REFS_DROP;
        }
    }
    if (r == 0) d->n = 0;
    return r;
}

/* The open transaction's change to the count of file, not written yet. */
static int64_t refs_pending(const shard_t *sh, const char *file)
{
    for (size_t i = 0; i < sh->txn_refs.n; i++)
        if (strcmp(sh->txn_refs.a[i].file, file) == 0) return sh->txn_refs.a[i].n;
    return 0;
}

/* --- transactions --- */

static void unlink_pending(shard_t *sh)
{
    for (size_t i = 0; i < sh->unlink.n; i++)
        store_blob_file_remove(sh->conn.blobs_dir, sh->unlink.a[i]);
    sh->unlink.n = sh->n_unlink_committed = 0;
}

/* Removes files whose rows are gone: now when that deletion is committed, else at the caller's
 * transaction's commit, or the next durable one after a relaxed transaction. */
static int unlink_after_commit(shard_t *sh, const blob_file_t *files, size_t n)
{
    if (!sh->in_txn) {
        for (size_t i = 0; i < n; i++)
            store_blob_file_remove(sh->conn.blobs_dir, files[i]);
        return 0;
    }
    /* Out of memory: the files stay, and the sweep at the next open removes them. */
    if (vec_grow((void **)&sh->unlink.a, &sh->unlink.cap, sh->unlink.n + n, sizeof *sh->unlink.a,
                 64) < 0)
        return -ENOMEM;
    memcpy(sh->unlink.a + sh->unlink.n, files, n * sizeof *files);
    sh->unlink.n += n;
    return 0;
}

/* With sync_full, raises synchronous to FULL for a durable commit. SQLite takes the level only
 * outside a transaction, and re-prepares the PRAGMA each time it runs: so the rare durable
 * transactions switch, and the job path's relaxed ones do not. */
static int raise_sync(shard_t *sh)
{
    if (!sh->st->sync_full) return 0;
    int r = store_stmt_run(&sh->conn, STMT_SYNC_FULL, "raising synchronous to FULL");
    sh->raised = r == 0;
    return r;
}

static void lower_sync(shard_t *sh)
{
    if (sh->raised) store_stmt_run(&sh->conn, STMT_SYNC_NORMAL, "lowering synchronous to NORMAL");
    sh->raised = false;
}

static int begin(shard_t *sh, bool relaxed)
{
    if (sh->in_txn)
        return log_error_errno(-EBUSY, "store: store_begin with a transaction already open");
    int r = relaxed ? 0 : raise_sync(sh);
    /* IMMEDIATE takes the write lock now, so that no write inside can fail on a lock upgrade. */
    if (r == 0) r = store_stmt_run(&sh->conn, STMT_BEGIN_IMMEDIATE, "BEGIN IMMEDIATE");
    if (r < 0) {
        lower_sync(sh);
        return r;
    }
    sh->in_txn = true;
    sh->relaxed = relaxed && sh->st->sync_full;
    sh->txn_row_bytes = 0;
    return 0;
}

/* Begins the shard's part of the store's open transaction, at its first write: the shards a
 * transaction leaves alone cost it nothing. */
static int touch(shard_t *sh)
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
    sh->in_txn = false;
    sh->relaxed = false;
    sh->aborted = false;
    lower_sync(sh);
}

static int shard_commit(shard_t *sh)
{
    /* The segment bytes its rows name reach the disk first, relaxed or not: then WAL frames
     * that survive a power loss never name bytes that did not. */
    int r = sh->aborted ? -EIO : store_segment_sync(&sh->segment);
    if (r == 0) r = refs_write(sh, &sh->txn_refs);
    if (r == 0) r = store_stmt_run(&sh->conn, STMT_COMMIT, "COMMIT");
    if (r == 0) {
        /* Files whose rows a relaxed commit deleted stay until a durable one: a power loss
         * may bring those rows back. */
        if (sh->relaxed)
            sh->n_unlink_committed = sh->unlink.n;
        else
            unlink_pending(sh);
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
        if (!st->relaxed && sh->n_unlink_committed > 0 && r == 0) r = touch(sh);
        wants[k] = sh->in_txn;
    }
    if (r == 0 && st->parallel_txn) {
        run_on_shards(st, TASK_COMMIT, wants, true);
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
                r = shard_commit(sh);
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
        files_settle(st);
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
    files_settle(st);
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
static void write_reset(shard_t *sh)
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
 * can fail once the statement ran. A savepoint cost the loop two more statements per job. */
static int write_begin(shard_t *sh, bool one_statement)
{
    sh->write_savepoint = !sh->in_txn || !one_statement;
    if (!sh->write_savepoint) return refs_reserve(&sh->txn_refs, sh->write_refs.n);
    int r = sh->in_txn ? 0 : raise_sync(sh);
    if (r == 0) r = store_stmt_run(&sh->conn, STMT_SAVEPOINT, "starting a write");
    if (r < 0 && !sh->in_txn) lower_sync(sh);
    return r;
}

/* Ends a write begun by write_begin: keeps it when r is 0 (committing it when no caller's
 * transaction is open), else undoes it. Returns r, or the error of the release. */
static int write_end(shard_t *sh, int r)
{
    if (!sh->write_savepoint) {
        if (r == 0)
            refs_merge(&sh->txn_refs, &sh->write_refs);
        else if (sqlite3_get_autocommit(sh->conn.db))
            abort_txn(sh);
        return r;
    }
    /* Outside a transaction the release commits: the segment bytes and the file counts go
     * first, as in store_commit. Inside one, the counts join the transaction's (room made
     * first, so that nothing can fail once the write is kept). */
    if (r == 0 && !sh->in_txn) r = store_segment_sync(&sh->segment);
    if (r == 0)
        r = sh->in_txn ? refs_reserve(&sh->txn_refs, sh->write_refs.n)
                       : refs_write(sh, &sh->write_refs);
    if (r == 0 && (r = store_stmt_run(&sh->conn, STMT_RELEASE, "committing a write")) == 0) {
        if (sh->in_txn) refs_merge(&sh->txn_refs, &sh->write_refs);
        if (!sh->in_txn) {
            lower_sync(sh);
            files_settle(sh->st);
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
        lower_sync(sh);
        files_settle(sh->st);
    }
    return r;
}

/* --- tensors --- */

/* Files written by one call, removed if the call fails. */
typedef struct written_files {
    blob_file_t files[2 * OP_MAX_TENSORS];
    int n;
} written_files_t;

static void written_remove(shard_t *sh, const written_files_t *w)
{
    for (int i = 0; i < w->n; i++)
        store_blob_file_remove(sh->conn.blobs_dir, w->files[i]);
}

/* Checks a tensor's descriptor, byte count and the source of its bytes. group and name make
 * the tensor's path for the message ("inputs", "x": inputs.x). */
static int check_tensor(const char *owner_id, const char *group, const char *name,
                        const job_tensor_t *t)
{
    int r = tensor_desc_check(&t->desc, UINT64_MAX);
    if (r < 0)
        return log_error_errno(-EINVAL, "store: %s: %s.%s.shape: not a valid dtype and shape",
                               owner_id, group, name);
    uint64_t bytes = tensor_desc_bytes(&t->desc);
    if (t->nbytes != bytes)
        return log_error_errno(
            -EINVAL, "store: %s: %s.%s.nbytes is %" PRIu64 " but its dtype and shape make %" PRIu64,
            owner_id, group, name, t->nbytes, bytes);
    store_locator_t loc;
    if (t->blob && (store_locator_parse(t->blob, &loc) < 0 ||
                    (loc.kind != STORE_LOCATOR_FILE && !t->data && t->nbytes > 0)))
        return log_error_errno(-EINVAL, "store: %s: %s.%s.blob '%s' is not a file blob", owner_id,
                               group, name, t->blob);
    if (!t->buffer_id[0] && !t->blob && !t->data && t->nbytes > 0)
        return log_error_errno(-EINVAL, "store: %s: %s.%s has no data, buffer or blob", owner_id,
                               group, name);
    return 0;
}

/* Decides where a tensor's bytes go (the row, the active segment, or a file of their own,
 * written now if the caller has not) and says so in rec (where, data, file, offset). */
static int place_bytes(shard_t *sh, bool segments, const void *data, uint64_t nbytes,
                       const char *blob, written_files_t *written, store_tensor_rec_t *rec)
{
    store_locator_t loc;
    rec->where = STORE_IN_FILE;
    rec->data = NULL;
    rec->offset = 0;
    if (blob && store_locator_parse(blob, &loc) == 0 && loc.kind == STORE_LOCATOR_FILE) {
        if (loc.offset && !segments)
            return log_error_errno(-EINVAL, "store: '%s' is a segment, which buffers never are",
                                   blob);
        memcpy(rec->file, loc.file, sizeof loc.file);
        rec->offset = loc.offset;
    } else if (nbytes > sh->st->inline_blob_bytes) {
        int r = store_blob_file_write(sh->conn.blobs_dir, data, nbytes, rec->file);
        if (r < 0) return r;
        memcpy(written->files[written->n++], rec->file, sizeof(blob_file_t));
    } else if (segments && nbytes >= STORE_SEGMENT_MIN_BYTES &&
               (!sh->in_txn || sh->txn_row_bytes + nbytes > STORE_TXN_ROW_BYTES)) {
        int r = store_segment_append(&sh->segment, sh->conn.blobs_dir, &sh->maybe_unused, data,
                                     nbytes, rec->file, &rec->offset);
        if (r < 0) return r;
    } else {
        rec->where = STORE_IN_ROW;
        rec->data = data;
        if (segments && nbytes >= STORE_SEGMENT_MIN_BYTES) sh->txn_row_bytes += nbytes;
    }
    return 0;
}

/* Notes n more job tensors naming file in the open write's count changes. */
static int refs_note(ref_deltas_t *d, const char *file, int64_t n)
{
    for (size_t i = d->n; i-- > 0;)
        if (strcmp(d->a[i].file, file) == 0) {
            d->a[i].n += n;
            return 0;
        }
    if (refs_reserve(d, 1) < 0) return -ENOMEM;
    memcpy(d->a[d->n].file, file, sizeof(blob_file_t));
    d->a[d->n++].n = n;
    return 0;
}

/* Places job_id's tensor t (input or output slot, named name) and appends its record to
 * sh->cols; returns the tensor's new locator in *ret_blob (NULL for a buffer reference). */
static int place_tensor(shard_t *sh, const char *job_id, bool output, int slot, const char *name,
                        const job_tensor_t *t, written_files_t *written, char **ret_blob)
{
    store_tensor_rec_t rec = {.slot = slot, .desc = t->desc, .nbytes = t->nbytes};
    store_copy_str(rec.name, sizeof rec.name, name);
    int r = 0;
    if (t->buffer_id[0]) {
        rec.where = STORE_IN_BUFFER;
        memcpy(rec.buffer_id, t->buffer_id, sizeof rec.buffer_id);
    } else {
        r = place_bytes(sh, true, t->data, t->nbytes, t->blob, written, &rec);
        if (r == 0 && rec.where == STORE_IN_FILE) r = refs_note(&sh->write_refs, rec.file, 1);
    }
    if (r == 0) r = store_tensors_append(&sh->cols, &sh->data, &rec);
    if (r < 0) return r;
    char *blob = NULL;
    if (rec.where != STORE_IN_BUFFER) {
        blob = rec.where == STORE_IN_FILE ? store_locator_file(rec.file, rec.offset)
                                          : store_locator_tensor(job_id, output, slot);
        if (!blob) return -ENOMEM;
    }
    *ret_blob = blob;
    return 0;
}

static void free_blobs(char **blobs)
{
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        free(blobs[j]);
        blobs[j] = NULL;
    }
}

/* Hands the new locators over to the tensors (freeing the ones they replace). */
static void set_blobs(job_tensor_t *ts, char **blobs)
{
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        if (!blobs[j]) continue;
        free(ts[j].blob);
        ts[j].blob = blobs[j];
        blobs[j] = NULL;
    }
}

/* Begins the write of a job whose tensors were placed (r: how that went); undoes the placing
 * when either failed. */
static int begin_placed(shard_t *sh, int r, written_files_t *written, char **blobs)
{
    if (r == 0) r = write_begin(sh, sh->data.len == 0); /* else a job_bytes row too */
    if (r < 0) {
        written_remove(sh, written);
        free_blobs(blobs);
    }
    return r;
}

/* Ids end up in locators and URLs: keep them to the alphabet id_new uses, plus '_' and '-'. */
static bool id_ok(const char *id)
{
    return store_id_ok(id, strnlen(id, ID_SIZE));
}

static const char *input_name(const job_t *job, int j)
{
    return job->in[j].name[0] ? job->in[j].name : job->call.op->input_names[j];
}

static int check_job_for_insert(const job_t *job)
{
    const char *id = job->id[0] ? job->id : "new job";
    if (!job->call.op || !job->call.op->name)
        return log_error_errno(-EINVAL, "store: %s: op is not set", id);
    if (job->id[0] && !id_ok(job->id))
        return log_error_errno(-EINVAL, "store: id '%.*s' is not a valid id", ID_SIZE, job->id);
    if (!job->owner[0]) return log_error_errno(-EINVAL, "store: %s: owner is empty", id);
    if (job->state != JOB_QUEUED && !(job->state == JOB_RUNNING && job->started_us > 0))
        return log_error_errno(-EINVAL,
                               "store: %s: state must be queued, or running with a start, to "
                               "insert, not %s",
                               id, job_state_name(job->state));
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        if (!job->call.has_in[j]) continue;
        if (j >= job->call.op->n_inputs)
            return log_error_errno(-EINVAL, "store: %s: input slot %d: op '%s' has %d inputs", id,
                                   j, job->call.op->name, job->call.op->n_inputs);
        int r = check_tensor(id, "inputs", input_name(job, j), &job->in[j]);
        if (r < 0) return r;
    }
    return 0;
}

static int shard_job_insert(shard_t *sh, job_t *job, const char *id)
{
    int r = check_job_for_insert(job);
    if (r < 0) return r;
    int64_t created_us = job->created_us ? job->created_us : now_us();
    if ((r = touch(sh)) < 0) return r;

    write_reset(sh);
    written_files_t written = {.n = 0};
    char *blobs[OP_MAX_TENSORS] = {0};
    for (int j = 0; r == 0 && j < OP_MAX_TENSORS; j++)
        if (job->call.has_in[j])
            r = place_tensor(sh, id, false, j, input_name(job, j), &job->in[j], &written,
                             &blobs[j]);
    r = begin_placed(sh, r, &written, blobs);
    if (r < 0) return r;
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_JOB_INSERT);
    if (!stmt) r = -EIO;
    if (r == 0) {
        store_bind_text(stmt, 1, id, false);
        store_bind_text(stmt, 2, job->owner, false);
        store_bind_text(stmt, 3, job->call.op->name, false);
        store_bind_text(stmt, 4, job->params_json, false);
        sqlite3_bind_int(stmt, 5, job->priority);
        sqlite3_bind_int(stmt, 6, job->device);
        sqlite3_bind_int64(stmt, 7, job->deadline_us);
        sqlite3_bind_int(stmt, 8, job->attempts);
        sqlite3_bind_int64(stmt, 9, created_us);
        store_bind_text(stmt, 10, job->idempotency_key, true);
        store_bind_text(stmt, 11, job_state_name(job->state), false);
        sqlite3_bind_int64(stmt, 12, job->started_us);
        sqlite3_bind_int(stmt, 13, job->batch_size);
        bind_bytes(stmt, 14, &sh->cols);
        r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(&sh->conn, "inserting a job");
        sqlite3_reset(stmt);
        sqlite3_clear_bindings(stmt); /* drop the SQLITE_STATIC pointer to sh->cols */
    }
    if (r == 0) r = insert_bytes(&sh->conn, id, 0, &sh->data);
    r = write_end(sh, r);
    if (r < 0) {
        written_remove(sh, &written);
        free_blobs(blobs);
        return r;
    }
    memcpy(job->id, id, ID_SIZE);
    job->created_us = created_us;
    for (int j = 0; j < OP_MAX_TENSORS; j++)
        if (job->call.has_in[j] && !job->in[j].name[0])
            snprintf(job->in[j].name, sizeof job->in[j].name, "%s", input_name(job, j));
    set_blobs(job->in, blobs);
    return 0;
}

static int defer(shard_t *sh, job_t *job, deferred_kind_t kind);

int store_job_insert(store_t *st, job_t *job)
{
    char id[ID_SIZE];
    if (job->id[0])
        memcpy(id, job->id, ID_SIZE);
    else
        id_new('j', id);
    shard_t *sh = shard_of(st, id);
    if (st->deferring && job->id[0]) return defer(sh, job, DEFER_INSERT);
    return shard_job_insert(sh, job, id);
}

/* --- state changes --- */

/* The states a job may be in for a change to `to`; -1 pads. */
static const int allowed_from[JOB_STATE_COUNT][2] = {
    [JOB_QUEUED] = {JOB_RUNNING, -1}, /* re-queue after a restart or a device fault */
    [JOB_RUNNING] = {JOB_QUEUED, -1},         [JOB_SUCCEEDED] = {JOB_RUNNING, -1},
    [JOB_FAILED] = {JOB_QUEUED, JOB_RUNNING}, [JOB_CANCELLED] = {JOB_QUEUED, JOB_RUNNING},
};

static const char *output_name(const job_t *job, int j)
{
    if (job->out[j].name[0]) return job->out[j].name;
    return job->call.out_names[j] ? job->call.out_names[j] : "";
}

static int check_outputs(const job_t *job)
{
    if (job->call.n_out < 0 || job->call.n_out > OP_MAX_TENSORS)
        return log_error_errno(-EINVAL, "store: %s: call.n_out %d is out of range", job->id,
                               job->call.n_out);
    for (int j = 0; j < job->call.n_out; j++) {
        if (!output_name(job, j)[0])
            return log_error_errno(-EINVAL, "store: %s: output %d has no name", job->id, j);
        if (job->out[j].buffer_id[0])
            return log_error_errno(-EINVAL, "store: %s: outputs.%s cannot be a buffer reference",
                                   job->id, output_name(job, j));
        int r = check_tensor(job->id, "outputs", output_name(job, j), &job->out[j]);
        if (r < 0) return r;
    }
    return 0;
}

/* 0 when job id exists (in *ret_state), -ENOENT when not. */
static int job_state_of(shard_t *sh, const char *id, job_state_t *ret_state)
{
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_JOB_STATE);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, id, false);
    int rc = sqlite3_step(stmt);
    int r = 0;
    if (rc == SQLITE_ROW)
        r = job_state_parse((const char *)sqlite3_column_text(stmt, 0), ret_state);
    else
        r = rc == SQLITE_DONE ? -ENOENT : store_sql_error(&sh->conn, "reading a job's state");
    sqlite3_reset(stmt);
    return r;
}

static int update_row(shard_t *sh, const job_t *job)
{
    bool start = job->state == JOB_RUNNING;
    sqlite3_stmt *stmt = store_stmt(&sh->conn, start ? STMT_JOB_START : STMT_JOB_UPDATE);
    if (!stmt) return -EIO;
    /* A state's timestamp the caller left unset is the time of the change. finished_us is set
     * exactly when the job is in a final state: the partial indexes go by it. */
    int64_t now = now_us();
    int64_t started = job->started_us == 0 && start ? now : job->started_us;
    int64_t finished = !job_state_is_final(job->state) ? 0
                       : job->finished_us > 0          ? job->finished_us
                                                       : now;
    store_bind_text(stmt, 1, job->id, false);
    sqlite3_bind_int(stmt, 3, job->attempts);
    sqlite3_bind_int64(stmt, 4, started);
    sqlite3_bind_int(stmt, 6, job->run_device);
    sqlite3_bind_int(stmt, 8, job->batch_size);
    if (!start) {
        store_bind_text(stmt, 2, job_state_name(job->state), false);
        sqlite3_bind_int64(stmt, 5, finished);
        sqlite3_bind_int64(stmt, 7, job->gpu_ns);
        store_bind_text(stmt, 9, job->error_code, false);
        store_bind_text(stmt, 10, job->error_message, false);
        const int *from = allowed_from[job->state];
        store_bind_text(stmt, 11, job_state_name((job_state_t)from[0]), false);
        store_bind_text(stmt, 12, job_state_name((job_state_t)(from[1] >= 0 ? from[1] : from[0])),
                        false);
        bind_bytes(stmt, 13, &sh->cols);
    }
    int r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(&sh->conn, "updating a job");
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    if (r < 0) return r;
    if (sqlite3_changes(sh->conn.db) == 1) return 0;

    job_state_t stored;
    r = job_state_of(sh, job->id, &stored);
    if (r == -ENOENT) return -ENOENT;
    if (r < 0) return r;
    log_debug("store: %s: refused change from %s to %s", job->id, job_state_name(stored),
              job_state_name(job->state));
    return -EBUSY;
}

static int shard_job_update(shard_t *sh, const job_t *job)
{
    if ((unsigned)job->state >= JOB_STATE_COUNT)
        return log_error_errno(-EINVAL, "store: %s: state %d is not a job state", job->id,
                               (int)job->state);
    if (!id_ok(job->id)) return log_error_errno(-EINVAL, "store: update of a job with no id");
    int r = job->state == JOB_SUCCEEDED ? check_outputs(job) : 0;
    if (r == 0) r = touch(sh);
    if (r < 0) return r;

    write_reset(sh);
    written_files_t written = {.n = 0};
    char *blobs[OP_MAX_TENSORS] = {0};
    for (int j = 0; r == 0 && job->state == JOB_SUCCEEDED && j < job->call.n_out; j++)
        r = place_tensor(sh, job->id, true, j, output_name(job, j), &job->out[j], &written,
                         &blobs[j]);
    r = begin_placed(sh, r, &written, blobs);
    if (r < 0) return r;
    r = update_row(sh, job);
    if (r == 0) r = insert_bytes(&sh->conn, job->id, 1, &sh->data);
    /* The job is const: the outputs' locators are read back with store_job_get. */
    free_blobs(blobs);
    r = write_end(sh, r);
    if (r < 0) written_remove(sh, &written);
    return r;
}

int store_job_update(store_t *st, const job_t *job)
{
    shard_t *sh = shard_of(st, job->id);
    if (st->deferring) return defer(sh, (job_t *)job, DEFER_UPDATE);
    return shard_job_update(sh, job);
}

/* --- deferred writes, run by the shards side by side --- */

void store_defer_writes(store_t *st)
{
    st->deferring = st->n_shards > 1 && st->in_txn;
}

static int defer(shard_t *sh, job_t *job, deferred_kind_t kind)
{
    int r = vec_grow((void **)&sh->deferred.a, &sh->deferred.cap, sh->deferred.n + 1,
                     sizeof *sh->deferred.a, 64);
    if (r < 0) return r;
    sh->deferred.a[sh->deferred.n++] = (deferred_t){.job = job, .kind = kind, .state = job->state};
    return 0;
}

/* Runs a shard's deferred writes in order. The state a job is written with is the one it had
 * when its write was asked for. */
static void run_deferred(shard_t *sh)
{
    for (size_t i = 0; i < sh->deferred.n; i++) {
        deferred_t *d = &sh->deferred.a[i];
        job_state_t now = d->job->state;
        d->job->state = d->state;
        if (d->kind == DEFER_INSERT) {
            char id[ID_SIZE]; /* the insert writes it back into the job */
            memcpy(id, d->job->id, ID_SIZE);
            d->result = shard_job_insert(sh, d->job, id);
        } else {
            d->result = shard_job_update(sh, d->job);
        }
        d->job->state = now;
    }
}

static void run_task(shard_t *sh)
{
    if (sh->task == TASK_WRITES)
        run_deferred(sh);
    else
        sh->commit_result = shard_commit(sh);
}

static void *shard_thread(void *arg)
{
    shard_t *sh = arg;
    store_t *st = sh->st;
    char name[16];
    snprintf(name, sizeof name, "gj-shard%d", sh->index);
    prctl(PR_SET_NAME, name);
    pthread_mutex_lock(&st->lock);
    for (;;) {
        while (!sh->go && !st->stopping)
            pthread_cond_wait(&sh->wake, &st->lock);
        if (!sh->go) break;
        pthread_mutex_unlock(&st->lock);
        run_task(sh);
        pthread_mutex_lock(&st->lock);
        sh->go = false;
        if (--st->running == 0) pthread_cond_signal(&st->all_done);
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

/* Starts a thread per shard but 0, whose writes the flushing thread runs itself. */
static int start_shard_threads(store_t *st)
{
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->all_done, NULL);
    st->threads_ready = true;
    for (int k = 1; k < st->n_shards; k++)
        pthread_cond_init(&st->shards[k].wake, NULL);
    for (int k = 1; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        int r = pthread_create(&sh->thread, NULL, shard_thread, sh);
        if (r != 0)
            return log_error_errno(-r, "store: cannot start a shard's thread: %s", strerror(r));
        sh->has_thread = true;
    }
    return 0;
}

static void stop_shard_threads(store_t *st)
{
    if (!st->threads_ready) return;
    pthread_mutex_lock(&st->lock);
    st->stopping = true;
    for (int k = 1; k < st->n_shards; k++)
        if (st->shards[k].has_thread) pthread_cond_signal(&st->shards[k].wake);
    pthread_mutex_unlock(&st->lock);
    for (int k = 1; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        if (sh->has_thread) pthread_join(sh->thread, NULL);
        pthread_cond_destroy(&sh->wake);
    }
    pthread_cond_destroy(&st->all_done);
    pthread_mutex_destroy(&st->lock);
}

/* Runs the task of each shard whose wants[k] is set: side by side when parallel (shard 0's on
 * the caller's thread, the others' on their own), else one after the other here. */
static void run_on_shards(store_t *st, shard_task_t task, const bool *wants, bool parallel)
{
    for (int k = 0; k < st->n_shards; k++)
        st->shards[k].task = task;
    if (!parallel || !st->threads_ready) {
        for (int k = 0; k < st->n_shards; k++)
            if (wants[k]) run_task(&st->shards[k]);
        return;
    }
    pthread_mutex_lock(&st->lock);
    for (int k = 1; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        if (!wants[k]) continue;
        sh->go = true;
        st->running++;
        pthread_cond_signal(&sh->wake);
    }
    pthread_mutex_unlock(&st->lock);
    if (wants[0]) run_task(&st->shards[0]);
    pthread_mutex_lock(&st->lock);
    while (st->running > 0)
        pthread_cond_wait(&st->all_done, &st->lock);
    pthread_mutex_unlock(&st->lock);
}

int store_flush(store_t *st, int (*failed)(job_t *job, job_state_t written, int err, void *ud),
                void *ud)
{
    st->deferring = false;
    size_t total = 0;
    bool wants[STORE_MAX_SHARDS];
    for (int k = 0; k < st->n_shards; k++) {
        total += st->shards[k].deferred.n;
        wants[k] = st->shards[k].deferred.n > 0;
    }
    if (total == 0) return 0;
    if (total >= STORE_PARALLEL_MIN_WRITES) st->parallel_txn = true;
    run_on_shards(st, TASK_WRITES, wants, total >= STORE_PARALLEL_MIN_WRITES);
    int r = 0;
    for (int k = 0; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        for (size_t i = 0; i < sh->deferred.n; i++) {
            deferred_t *d = &sh->deferred.a[i];
            int e = d->result < 0 && failed ? failed(d->job, d->state, d->result, ud) : d->result;
            if (r == 0 && e < 0) r = e;
        }
        sh->deferred.n = 0;
    }
    return r;
}

/* --- recovery --- */

static int recover_states(shard_t *sh, int max_attempts)
{
    char requeue[160], fail[512];
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
             now_us(), max_attempts);
    int r = raise_sync(sh);
    if (r == 0) r = store_exec(&sh->conn, "BEGIN IMMEDIATE");
    if (r < 0) {
        lower_sync(sh);
        return r;
    }
    r = store_exec(&sh->conn, requeue);
    int requeued = sqlite3_changes(sh->conn.db);
    if (r == 0) r = store_exec(&sh->conn, fail);
    int failed = sqlite3_changes(sh->conn.db);
    if (r == 0) r = store_exec(&sh->conn, "COMMIT");
    if (r < 0 && !sqlite3_get_autocommit(sh->conn.db)) store_exec(&sh->conn, "ROLLBACK");
    lower_sync(sh);
    if (r < 0) return r;
    if (requeued || failed)
        log_info("store: recovery: %d running job(s) re-queued, %d failed after too many "
                 "attempts",
                 requeued, failed);
    return 0;
}

/* A queued job, as recovery lists them. */
typedef struct queued {
    int64_t created_us;
    char id[ID_SIZE];
} queued_t;

typedef struct queued_list {
    queued_t *a;
    size_t n, cap;
} queued_list_t;

/* Appends the shard's queued jobs to l. */
static int queued_list(shard_t *sh, queued_list_t *l)
{
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(sh->conn.db,
                           "SELECT created_us, id FROM jobs WHERE " STORE_LIVE
                           " AND state = 'queued'",
                           -1, &stmt, NULL) != SQLITE_OK)
        return store_sql_error(&sh->conn, "listing queued jobs");
    int rc, r = 0;
    while (r == 0 && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        r = vec_grow((void **)&l->a, &l->cap, l->n + 1, sizeof *l->a, 256);
        if (r < 0) break;
        l->a[l->n].created_us = sqlite3_column_int64(stmt, 0);
        store_column_copy(stmt, 1, l->a[l->n++].id, ID_SIZE);
    }
    if (r == 0 && rc != SQLITE_DONE) r = store_sql_error(&sh->conn, "listing queued jobs");
    sqlite3_finalize(stmt);
    return r;
}

static int queued_before(const void *pa, const void *pb)
{
    const queued_t *a = pa, *b = pb;
    if (a->created_us != b->created_us) return a->created_us < b->created_us ? -1 : 1;
    return strcmp(a->id, b->id);
}

static int load_job(shard_t *sh, const char *id, job_t **ret)
{
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_JOB_GET);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, id, false);
    int rc = sqlite3_step(stmt);
    int r = rc == SQLITE_ROW    ? store_job_from_row(stmt, ret)
            : rc == SQLITE_DONE ? -ENOENT
                                : store_sql_error(&sh->conn, "reading a job");
    sqlite3_reset(stmt);
    return r;
}

int store_recover(store_t *st, int max_attempts, int (*resolve)(job_t *job),
                  void (*cb)(job_t *job, void *ud), void *ud)
{
    if (st->in_txn) return log_error_errno(-EBUSY, "store: store_recover inside a transaction");
    int r = 0;
    queued_list_t l = {0};
    for (int k = 0; k < st->n_shards && r == 0; k++) {
        r = recover_states(&st->shards[k], max_attempts);
        if (r == 0) r = queued_list(&st->shards[k], &l);
    }
    /* Oldest first across the shards; loaded one at a time, after the listing is finished, so
     * that cb may use the store. */
    if (r == 0) qsort(l.a, l.n, sizeof *l.a, queued_before);
    for (size_t i = 0; r == 0 && i < l.n; i++) {
        job_t *job;
        r = load_job(shard_of(st, l.a[i].id), l.a[i].id, &job);
        if (r == 0 && resolve && (r = resolve(job)) < 0) job_free(job);
        if (r == 0) cb(job, ud);
    }
    free(l.a);
    if (r == 0 && l.n > 0) log_info("store: recovery: %zu queued job(s) handed back", l.n);
    return r;
}

/* --- retention --- */

/* Deletes up to GC_BATCH expired jobs; the files they named are added to files. */
static int gc_batch(shard_t *sh, int64_t cutoff_us, blob_files_t *files, int *ret_n)
{
    char ids[GC_BATCH][ID_SIZE];
    int n = 0, r = 0;
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_GC_SELECT);
    if (!stmt) return -EIO;
    sqlite3_bind_int64(stmt, 1, cutoff_us);
    sqlite3_bind_int(stmt, 2, GC_BATCH);
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW)
        store_column_copy(stmt, 0, ids[n++], ID_SIZE);
    if (rc != SQLITE_DONE) r = store_sql_error(&sh->conn, "listing expired jobs");
    sqlite3_reset(stmt);

    for (int i = 0; r == 0 && i < n; i++) {
        stmt = store_stmt(&sh->conn, STMT_JOB_TENSORS);
        if (!stmt) return -EIO;
        store_bind_text(stmt, 1, ids[i], false);
        rc = sqlite3_step(stmt);
        if (rc != SQLITE_ROW) r = store_sql_error(&sh->conn, "reading an expired job's tensors");
        for (int col = 0; r == 0 && col < 2; col++) {
            const void *bytes = sqlite3_column_blob(stmt, col);
            size_t len = (size_t)sqlite3_column_bytes(stmt, col), pos = 0;
            store_tensor_rec_t rec;
            int k;
            while ((k = store_tensors_next(bytes, len, &pos, &rec)) > 0) {
                if (rec.where != STORE_IN_FILE) continue;
                bool known = false;
                for (size_t f = 0; f < sh->write_refs.n && !known; f++)
                    known = strcmp(sh->write_refs.a[f].file, rec.file) == 0;
                r = refs_note(&sh->write_refs, rec.file, -1);
                if (r < 0) break;
                if (known) continue;
                if ((r = store_files_add(files, rec.file)) < 0) break;
            }
            /* A job whose tensors cannot be read still goes; its files go at the next sweep. */
            if (k < 0) log_warn("store: gc: job %s: its stored tensors are malformed", ids[i]);
        }
        sqlite3_reset(stmt);
        static const store_stmt_id_t deletes[] = {STMT_GC_DELETE_BYTES, STMT_GC_DELETE};
        for (int d = 0; r == 0 && d < 2; d++) {
            stmt = store_stmt(&sh->conn, deletes[d]);
            if (!stmt) return -EIO;
            store_bind_text(stmt, 1, ids[i], false);
            r = sqlite3_step(stmt) == SQLITE_DONE ? 0
                                                  : store_sql_error(&sh->conn, "deleting a job");
            sqlite3_reset(stmt);
        }
    }
    if (r == 0) *ret_n = n;
    return r;
}

static int shard_gc(shard_t *sh, int64_t cutoff_us, int *ret_deleted)
{
    int deleted = 0, n = GC_BATCH, r = touch(sh);
    /* Batches keep each transaction (and the time the loop thread spends in it) short. */
    while (r == 0 && n == GC_BATCH) {
        blob_files_t files = {0};
        write_reset(sh);
        r = write_begin(sh, false);
        if (r < 0) break;
        r = write_end(sh, gc_batch(sh, cutoff_us, &files, &n));
        if (r == 0) {
            deleted += n;
            /* A file goes with the last row naming it: segments hold many jobs' tensors, and
             * the active one is still being appended to. Failing to remove one only leaves it
             * for the sweep at the next open. */
            size_t unused = 0;
            for (size_t i = 0; i < files.n; i++)
                if (!file_in_use(sh->st, files.a[i]))
                    memcpy(files.a[unused++], files.a[i], sizeof *files.a);
            unlink_after_commit(sh, files.a, unused);
        }
        free(files.a);
    }
    *ret_deleted = deleted;
    return r;
}

int store_gc(store_t *st, int64_t cutoff_us, int *ret_deleted)
{
    int deleted = 0, r = 0;
    for (int k = 0; k < st->n_shards && r == 0; k++) {
        int n = 0;
        r = shard_gc(&st->shards[k], cutoff_us, &n);
        deleted += n;
    }
    if (r < 0) return r;
    if (deleted > 0) log_debug("store: gc deleted %d finished job(s)", deleted);
    *ret_deleted = deleted;
    return 0;
}

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
 * already). It never waits for the checkpointer's pass: while that runs, the next commit tries
 * again. */
static int note_wal_pages(void *arg, sqlite3 *db, const char *name, int pages)
{
    shard_t *sh = arg;
    atomic_store_explicit(&sh->wal_pages, pages, memory_order_relaxed);
    if (pages >= STORE_WRITER_CHECKPOINT_PAGES) {
        if (pthread_mutex_trylock(&sh->checkpoint_lock) == 0) {
            sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
            pthread_mutex_unlock(&sh->checkpoint_lock);
        }
    } else if (pages >= STORE_CHECKPOINT_PAGES) {
        sh->st->checkpoint_due(sh->st->checkpoint_arg);
    }
    return SQLITE_OK;
}

int store_checkpointer_open(store_t *st, const config_t *cfg, void (*due)(void *arg), void *arg,
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
        r = store_conn_open(&cp->conns[k], cfg->state_dir, k,
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

/* --- buffers --- */

static int shard_buffer_delete(shard_t *sh, const char *owner, const char *id);

/* Buffers live in shard 0. */
int store_buffer_insert(store_t *st, buffer_t *buf)
{
    shard_t *sh = &st->shards[0];
    if (buf->id[0] && !id_ok(buf->id))
        return log_error_errno(-EINVAL, "store: buffer id '%.*s' is not a valid id", ID_SIZE,
                               buf->id);
    if (!buf->owner[0]) return log_error_errno(-EINVAL, "store: buffer: owner is empty");
    job_tensor_t as_tensor = {
        .desc = buf->desc, .nbytes = buf->nbytes, .data = buf->data, .blob = buf->blob};
    int r = check_tensor("buffer", "buffer", "bytes", &as_tensor);
    if (r < 0) return r;
    char id[ID_SIZE];
    if (buf->id[0])
        memcpy(id, buf->id, ID_SIZE);
    else
        id_new('b', id);
    int64_t created_us = buf->created_us ? buf->created_us : now_us();
    if ((r = touch(sh)) < 0) return r;

    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_BUFFER_INSERT);
    if (!stmt) return -EIO;
    char shape[TENSOR_MAX_DIMS * 21 + 3];
    store_shape_format(&buf->desc, shape, sizeof shape);
    store_bind_text(stmt, 1, id, false);
    store_bind_text(stmt, 2, buf->owner, false);
    store_bind_text(stmt, 3, dtype_name(buf->desc.dtype), false);
    store_bind_text(stmt, 4, shape, false);
    sqlite3_bind_int64(stmt, 5, (sqlite3_int64)buf->nbytes);
    sqlite3_bind_int(stmt, 6, buf->resident);
    sqlite3_bind_int64(stmt, 7, created_us);
    sqlite3_bind_int(stmt, 10, buf->device);
    written_files_t written = {.n = 0};
    store_tensor_rec_t placed;
    r = place_bytes(sh, false, buf->data, buf->nbytes, buf->blob, &written, &placed);
    const char *file = placed.where == STORE_IN_FILE ? placed.file : "";
    if (r == 0 && file[0])
        store_bind_text(stmt, 9, file, false);
    else if (r == 0)
        sqlite3_bind_blob64(stmt, 8, buf->nbytes ? buf->data : "", buf->nbytes, SQLITE_STATIC);
    if (r == 0) {
        /* One statement: atomic by itself, no savepoint needed. */
        r = sqlite3_step(stmt) == SQLITE_DONE ? 0
                                              : store_sql_error(&sh->conn, "inserting a buffer");
    }
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    char *blob = NULL;
    if (r == 0 && !(blob = file[0] ? store_locator_file(file, 0) : store_locator_buffer(id))) {
        r = -ENOMEM;
        /* The row is in; take it out again so the failure leaves nothing behind. */
        shard_buffer_delete(sh, NULL, id);
        written.n = 0; /* shard_buffer_delete queued or removed the file */
    }
    if (r < 0) {
        written_remove(sh, &written);
        return r;
    }
    memcpy(buf->id, id, ID_SIZE);
    buf->created_us = created_us;
    free(buf->blob);
    buf->blob = blob;
    return 0;
}

static int buffer_delete_row(shard_t *sh, const char *owner, const char *id, blob_file_t ret_file)
{
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_BUFFER_FILE);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, id, false);
    store_bind_text(stmt, 2, owner, false);
    int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) store_column_copy(stmt, 0, ret_file, sizeof(blob_file_t));
    int r = rc == SQLITE_ROW    ? 0
            : rc == SQLITE_DONE ? -ENOENT
                                : store_sql_error(&sh->conn, "reading a buffer");
    sqlite3_reset(stmt);
    if (r < 0) return r;
    stmt = store_stmt(&sh->conn, STMT_BUFFER_DELETE);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, id, false);
    store_bind_text(stmt, 2, owner, false);
    r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(&sh->conn, "deleting a buffer");
    sqlite3_reset(stmt);
    return r;
}

static int shard_buffer_delete(shard_t *sh, const char *owner, const char *id)
{
    if (!id) return -ENOENT;
    blob_file_t file = "";
    int r = touch(sh);
    if (r < 0) return r;
    write_reset(sh);
    r = write_begin(sh, false);
    if (r < 0) return r;
    r = write_end(sh, buffer_delete_row(sh, owner, id, file));
    if (r == 0 && file[0]) unlink_after_commit(sh, (const blob_file_t *)&file, 1);
    return r;
}

int store_buffer_delete(store_t *st, const char *owner, const char *id)
{
    return shard_buffer_delete(&st->shards[0], owner, id);
}

int store_resident_bytes(store_t *st, const char *owner, uint64_t *ret)
{
    shard_t *sh = &st->shards[0];
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_USAGE_BUFFERS);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, owner, false);
    int r = 0;
    if (sqlite3_step(stmt) == SQLITE_ROW)
        *ret = (uint64_t)sqlite3_column_int64(stmt, 2);
    else
        r = store_sql_error(&sh->conn, "summing resident bytes");
    sqlite3_reset(stmt);
    return r;
}
