/* The schema and its migrations: every shard's database file is brought to
 * STORE_SCHEMA_VERSION when the store opens it, one version at a time, so that a state
 * directory written by any earlier gpujobd still opens. */
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

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
     * instead of IN lists: SQLite builds an ephemeral table for each IN list it evaluates,
     * three per update of a job on the loop thread. A CHECK changes only with its table, so
     * both tables are rebuilt; tensors first, so that dropping the old jobs table cascades
     * into nothing. */
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
     * jobs_finished's condition on state make every change of state rewrite index entries:
     * the start's, the end's, and a re-queue's. Partial indexes on finished_us, which is 0
     * until a job ends and set when it does (update_row keeps it so), replace them: jobs_live
     * (owner, id) for the queued and running jobs (recovery, the queue reloaded at open, a
     * listing by a live state), jobs_ended (state, id) for a listing by a final state, and
     * jobs_finished for retention. A start, which sets neither finished_us nor an indexed
     * column (STMT_JOB_START), then writes the row alone. Ended jobs without a finish time get
     * their start's or their creation's, and live ones lose any they have. */
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
    /* The index of a list's element apart from its key, which lists once spelled KEY:INDEX,
     * a key a single job could take too. New rows say -1 for a single job and the index for a
     * list's element; rows from before keep NULL, and are found by their old spelling
     * (STMT_JOB_FIND_IDEMPOTENT), as they were. */
    {8, "ALTER TABLE jobs ADD COLUMN idempotency_index INTEGER;"
        "DROP INDEX jobs_idempotency;"
        "CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner, idempotency_key, idempotency_index)"
        "  WHERE idempotency_key IS NOT NULL;"},
    /* Accounting that outlives retention: usage_daily sums the jobs that ended, by owner, day
     * (UTC, days since the epoch) and op, and is written in the write that ends each job
     * (store_usage.c), so that it never disagrees with the jobs; retention and the store's
     * bound delete jobs, never its rows. It starts from the ended jobs still stored (whose
     * bytes in and out the rows do not sum: 0). batch_ns is the measured device time of the
     * batch a job ran in, which its gpu_ns is a share of. fair_share (shard 0) keeps the
     * scheduler's decayed usage per owner across restarts. */
    {9, "ALTER TABLE jobs ADD COLUMN batch_ns INTEGER NOT NULL DEFAULT 0;"
        "CREATE TABLE usage_daily ("
        "  owner TEXT NOT NULL,"
        "  day INTEGER NOT NULL,"
        "  op TEXT NOT NULL,"
        "  jobs INTEGER NOT NULL,"
        "  succeeded INTEGER NOT NULL,"
        "  failed INTEGER NOT NULL,"
        "  cancelled INTEGER NOT NULL,"
        "  run_us INTEGER NOT NULL,"
        "  gpu_ns INTEGER NOT NULL,"
        "  bytes_in INTEGER NOT NULL,"
        "  bytes_out INTEGER NOT NULL,"
        "  PRIMARY KEY (owner, day, op)"
        ") WITHOUT ROWID;"
        "INSERT INTO usage_daily SELECT owner, finished_us / 86400000000, op, count(*), "
        "  sum(state = 'succeeded'), sum(state = 'failed'), sum(state = 'cancelled'), "
        "  sum(CASE WHEN started_us > 0 AND finished_us >= started_us "
        "    THEN finished_us - started_us ELSE 0 END), sum(gpu_ns), 0, 0 "
        "  FROM jobs WHERE " STORE_ENDED " GROUP BY owner, finished_us / 86400000000, op;"
        "CREATE TABLE fair_share ("
        "  owner TEXT PRIMARY KEY,"
        "  usage_us REAL NOT NULL,"
        "  at_us INTEGER NOT NULL"
        ") WITHOUT ROWID;"},
    /* Whether a buffer's bytes are stored (1) or live only in the executor's resident copy (0,
     * an ephemeral buffer: a row without data or file, deleted when the daemon starts). */
    {10, "ALTER TABLE buffers ADD COLUMN durable INTEGER NOT NULL DEFAULT 1;"},
    /* What the scheduler keeps of a queued job, so that recovery lists the queue from these
     * columns without reading and validating every job: its call's batch key ('' never
     * batches) and cost. Rows from before keep NULL, and recovery reads those jobs whole.
     * jobs_queued covers that listing in its order, and jobs_running finds the jobs a restart
     * re-queues: recovery then reads neither the table's rows nor every live job (state is in
     * jobs_queued's columns only so that SQLite sees it covers the listing). Both stay
     * small where it matters (a job inserted running, as a round's own jobs are, never enters
     * jobs_queued; jobs_running holds the jobs in flight), and a commit touches the few
     * pages at their ends. */
    {11, "ALTER TABLE jobs ADD COLUMN batch_key TEXT;"
         "ALTER TABLE jobs ADD COLUMN cost_bytes REAL;"
         "ALTER TABLE jobs ADD COLUMN cost_flops REAL;"
         "CREATE INDEX jobs_queued ON jobs (created_us, id, owner, priority, device, deadline_us, "
         "  batch_key, cost_bytes, cost_flops, state) WHERE state = 'queued';"
         "CREATE INDEX jobs_running ON jobs (id) WHERE state = 'running';"},
    /* A job's own time limit in ms (0: none), which a job re-queued by a restart keeps. */
    {12, "ALTER TABLE jobs ADD COLUMN time_limit_ms INTEGER NOT NULL DEFAULT 0;"},
};

static int move_tensors_into_jobs(store_conn_t *conn);

/* The migrations whose rows SQL alone cannot rewrite, by version. */
static const struct {
    int version;
    int (*convert)(store_conn_t *conn);
} conversions[] = {{5, move_tensors_into_jobs}};

#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

_Static_assert(STORE_SCHEMA_VERSION == N_MIGRATIONS, "one migration per schema version");

int store_migrate(store_conn_t *conn)
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

/* A row of the tensors table (as move_tensors_into_jobs selects it) of job, as a record of
 * its job's inputs or outputs (*ret_output). */
static int tensor_row_rec(sqlite3_stmt *rows, const char *job, store_tensor_rec_t *ret,
                          bool *ret_output)
{
    const char *role = (const char *)sqlite3_column_text(rows, 1);
    store_tensor_rec_t rec = {.slot = sqlite3_column_int(rows, 2)};
    store_column_copy(rows, 3, rec.name, sizeof rec.name);
    const char *dtype = (const char *)sqlite3_column_text(rows, 4);
    const char *shape = (const char *)sqlite3_column_text(rows, 5);
    rec.nbytes = (uint64_t)sqlite3_column_int64(rows, 6);
    if (!dtype || dtype_parse(dtype, &rec.desc.dtype) < 0 || !shape ||
        store_shape_parse(shape, &rec.desc) < 0)
        return log_error_errno(-EIO,
                               "store: job %s: a stored tensor's dtype or shape is malformed; "
                               "schema version 5 cannot be reached",
                               job);
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
    *ret = rec;
    *ret_output = role && strcmp(role, "out") == 0;
    return 0;
}

/* Writes job's inputs' and outputs' records (cols) and bytes (data) gathered from its tensor
 * rows, and empties them for the next job. */
static int job_tensors_write(store_conn_t *conn, sqlite3_stmt *update, const char *job,
                             store_bytes_t cols[2], store_bytes_t data[2])
{
    int r = 0;
    store_bind_text(update, 1, job, false);
    store_bind_bytes(update, 2, &cols[0]);
    store_bind_bytes(update, 3, &cols[1]);
    if (sqlite3_step(update) != SQLITE_DONE)
        r = store_sql_error(conn, "moving tensors into their jobs");
    sqlite3_reset(update);
    for (int c = 0; c < 2 && r == 0; c++)
        r = store_job_bytes_insert(conn, job, c, &data[c]);
    cols[0].len = cols[1].len = data[0].len = data[1].len = 0;
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
            r = job_tensors_write(conn, update, job, cols, data);
            moved++;
        }
        if (!more || r < 0) break;
        snprintf(job, sizeof job, "%s", id ? id : "");
        store_tensor_rec_t rec;
        bool output;
        if ((r = tensor_row_rec(rows, job, &rec, &output)) < 0) break;
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
