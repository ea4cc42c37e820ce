/* The store's SQLite connections: opening with the settings every connection needs, the
 * prepared-statement cache, and small helpers for binding and reading columns. */
#include "store_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"

#define JOB_COLUMNS                                                                                \
    "id, owner, op, params, priority, device, deadline_us, state, attempts, created_us, "          \
    "started_us, finished_us, run_device, gpu_ns, batch_size, error_code, error_message, "         \
    "idempotency_key, inputs, outputs, idempotency_index, batch_ns, time_limit_ms"

static const char *const stmt_sql[STMT_LIST_FIRST] = {
    [STMT_JOB_INSERT] = "INSERT INTO jobs (id, owner, op, params, priority, device, deadline_us, "
                        "state, attempts, created_us, idempotency_key, started_us, batch_size, "
                        "inputs, idempotency_index, batch_key, cost_bytes, cost_flops, "
                        "time_limit_ms) "
                        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?11, ?8, ?9, ?10, ?12, ?13, ?14, ?15, "
                        "?16, ?17, ?18, ?19)",
    /* The allowed previous states are bound as ?11 and ?12 (the same twice when only one is
     * allowed), so the check and the change are one atomic statement. */
    [STMT_JOB_UPDATE] = "UPDATE jobs SET state = ?2, attempts = ?3, started_us = ?4, "
                        "finished_us = ?5, run_device = ?6, gpu_ns = ?7, batch_size = ?8, "
                        "error_code = ?9, error_message = ?10, outputs = ?13, batch_ns = ?14 "
                        "WHERE id = ?1 AND (state = ?11 OR state = ?12)",
    /* A start, with STMT_JOB_UPDATE's numbering: it sets no indexed column and not
     * finished_us, so that it rewrites the row and no index. */
    [STMT_JOB_START] = "UPDATE jobs SET state = 'running', attempts = ?3, started_us = ?4, "
                       "run_device = ?6, batch_size = ?8 WHERE id = ?1 AND state = 'queued'",
    [STMT_JOB_STATE] = "SELECT state FROM jobs WHERE id = ?1",
    [STMT_JOB_GET] = "SELECT " JOB_COLUMNS " FROM jobs WHERE id = ?1",
    /* The key and index (?2, ?3: -1 for a single job) as rows store them; then, among rows
     * from before the index had a column (NULL), the key as they spelled it (?4). */
    [STMT_JOB_FIND_IDEMPOTENT] = "SELECT id FROM jobs WHERE owner = ?1 AND idempotency_key = ?2 "
                                 "AND idempotency_index = ?3 UNION ALL SELECT id FROM jobs "
                                 "WHERE owner = ?1 AND idempotency_key = ?4 "
                                 "AND idempotency_index IS NULL LIMIT 1",
    [STMT_JOB_TENSORS] = "SELECT inputs, outputs FROM jobs WHERE id = ?1",
    /* ?2: 0 for the inputs' bytes, 1 for the outputs'. */
    [STMT_JOB_BYTES] = "SELECT j.inputs, j.outputs, b.data FROM jobs j LEFT JOIN job_bytes b "
                       "ON b.job_id = j.id AND b.output = ?2 WHERE j.id = ?1",
    [STMT_JOB_BYTES_INSERT] = "INSERT OR REPLACE INTO job_bytes (job_id, output, data) "
                              "VALUES (?1, ?2, ?3)",
    [STMT_BUFFER_INSERT] = "INSERT INTO buffers (id, owner, dtype, shape, nbytes, resident, "
                           "created_us, data, file, device, durable) "
                           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    [STMT_BUFFER_GET] = "SELECT id, owner, dtype, shape, nbytes, resident, created_us, file, "
                        "device, durable FROM buffers WHERE id = ?1",
    [STMT_BUFFER_DATA] = "SELECT data FROM buffers WHERE id = ?1",
    [STMT_BUFFER_DELETE] = "DELETE FROM buffers WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
    [STMT_BUFFER_FILE] = "SELECT file FROM buffers WHERE id = ?1 AND (?2 IS NULL OR owner = ?2)",
    /* Usage reads what is bounded: the live jobs (queued and running, through their partial
     * index), the rollup's rows and the buffers, never every job an owner ever had. ?1 NULL:
     * every owner (admins). */
    [STMT_USAGE_STATES] = "SELECT state, count(*) FROM jobs INDEXED BY jobs_live WHERE " STORE_LIVE
                          " AND owner >= ?1 AND owner <= ?2 GROUP BY state",
    [STMT_USAGE_TIMES] =
        "SELECT coalesce(sum(succeeded), 0), coalesce(sum(failed), 0), "
        "coalesce(sum(cancelled), 0), coalesce(sum(run_us), 0), "
        "coalesce(sum(gpu_ns), 0) FROM usage_daily WHERE owner >= ?1 AND owner <= ?2",
    /* Stored bytes are the durable buffers'; resident bytes count the ephemeral ones too. */
    [STMT_USAGE_BUFFERS] = "SELECT count(*), coalesce(sum(CASE WHEN durable THEN nbytes ELSE 0 "
                           "END), 0), coalesce(sum(CASE WHEN resident THEN nbytes ELSE 0 END), 0), "
                           "coalesce(sum(CASE WHEN durable THEN 0 ELSE nbytes END), 0) "
                           "FROM buffers WHERE owner >= ?1 AND owner <= ?2",
    [STMT_USAGE_ADD] = "INSERT INTO usage_daily (owner, day, op, jobs, succeeded, failed, "
                       "cancelled, run_us, gpu_ns, bytes_in, bytes_out) "
                       "VALUES (?1, ?2, ?3, ?11, ?4, ?5, ?6, ?7, ?8, ?9, ?10) "
                       "ON CONFLICT (owner, day, op) DO UPDATE SET jobs = jobs + ?11, "
                       "succeeded = succeeded + ?4, failed = failed + ?5, "
                       "cancelled = cancelled + ?6, run_us = run_us + ?7, gpu_ns = gpu_ns + ?8, "
                       "bytes_in = bytes_in + ?9, bytes_out = bytes_out + ?10",
    [STMT_USAGE_ROLLUP] = "SELECT owner, day, op, jobs, succeeded, failed, cancelled, run_us, "
                          "gpu_ns, bytes_in, bytes_out FROM usage_daily "
                          "WHERE owner >= ?1 AND owner <= ?2 AND day >= ?3 AND day <= ?4 "
                          "ORDER BY owner, day, op LIMIT ?5",
    /* The first term repeats the partial index's WHERE, which makes the index usable, and
     * INDEXED BY makes it used. (A prepare fails if the index ever stops matching; the gc
     * tests see it.) */
    [STMT_GC_SELECT] = "SELECT id FROM jobs INDEXED BY jobs_finished WHERE " STORE_ENDED
                       " AND finished_us < ?1 LIMIT ?2",
    [STMT_GC_DELETE] = "DELETE FROM jobs WHERE id = ?1",
    [STMT_GC_DELETE_BYTES] = "DELETE FROM job_bytes WHERE job_id = ?1",
    /* store_trim: the finished jobs after (?1, ?2) in (finished_us, id) order, which
     * jobs_finished (finished_us, and the key id) gives without sorting. */
    [STMT_TRIM_NEXT] =
        "SELECT id, finished_us, outputs FROM jobs INDEXED BY jobs_finished WHERE " STORE_ENDED
        " AND finished_us >= ?1 AND (finished_us > ?1 OR id > ?2) "
        "ORDER BY finished_us, id LIMIT ?3",
    [STMT_TRIM_EXPIRE] = "UPDATE jobs SET outputs = ?2 WHERE id = ?1",
    [STMT_TRIM_DELETE_OUTPUT_BYTES] = "DELETE FROM job_bytes WHERE job_id = ?1 AND output = 1",
    [STMT_FILE_REFERENCED] = "SELECT coalesce((SELECT refs FROM blob_refs WHERE file = ?1), 0), "
                             "EXISTS (SELECT 1 FROM buffers WHERE file = ?1)",
    /* A transaction's changes to the count of job tensors naming a file, one per file at its
     * commit (store_refs_write). */
    [STMT_REFS_ADD] = "INSERT INTO blob_refs (file, refs) VALUES (?1, ?2) "
                      "ON CONFLICT (file) DO UPDATE SET refs = refs + ?2",
    [STMT_REFS_DROP] = "DELETE FROM blob_refs WHERE file = ?1 AND refs <= 0",
    /* A write of more than one statement is wrapped in a savepoint: inside a caller's
     * transaction a failed write undoes only its own rows, and outside one the savepoint is the
     * transaction (store_write_begin). */
    [STMT_SAVEPOINT] = "SAVEPOINT store_write",
    [STMT_SETTING_GET] = "SELECT value FROM settings WHERE name = ?1",
    [STMT_SETTING_SET] = "INSERT OR REPLACE INTO settings (name, value) VALUES (?1, ?2)",
    [STMT_RELEASE] = "RELEASE store_write",
    [STMT_ROLLBACK_TO] = "ROLLBACK TO store_write",
    /* Transactions run several times per job (submit, start, end): prepared once, as
     * sqlite3_exec() would parse and prepare them on every call. */
    [STMT_BEGIN] = "BEGIN",
    [STMT_BEGIN_IMMEDIATE] = "BEGIN IMMEDIATE",
    [STMT_COMMIT] = "COMMIT",
    [STMT_ROLLBACK] = "ROLLBACK",
    /* Switched around durable commits (store_raise_sync). */
    [STMT_SYNC_NORMAL] = "PRAGMA synchronous = NORMAL",
    [STMT_SYNC_FULL] = "PRAGMA synchronous = FULL",
};

int store_sql_error(store_conn_t *conn, const char *what)
{
    int code = sqlite3_extended_errcode(conn->db);
    if (code == SQLITE_CONSTRAINT_UNIQUE || code == SQLITE_CONSTRAINT_PRIMARYKEY) {
        log_debug("store: %s: %s", what, sqlite3_errmsg(conn->db));
        return -EEXIST;
    }
    /* A full disk is the client's to know (507), and frees up when space is freed. */
    if (code == SQLITE_FULL ||
        ((code & 0xff) == SQLITE_IOERR && sqlite3_system_errno(conn->db) == ENOSPC)) {
        log_error("store: %s failed: %s", what, strerror(ENOSPC));
        return -ENOSPC;
    }
    /* A page SQLite cannot read: what the statement began is undone by SQLite and the caller's
     * rollback, and the caller refuses to go on (at the start: the daemon does not start). */
    if ((code & 0xff) == SQLITE_CORRUPT || code == SQLITE_NOTADB)
        return log_error_errno(-EUCLEAN,
                               "store: '%s' fails its integrity check: SQLite found a damaged "
                               "page while %s (%s). Nothing was changed by it: restore the "
                               "database from a backup",
                               conn->db_path, what, sqlite3_errmsg(conn->db));
    log_error("store: %s failed: %s (SQLite code %d)", what, sqlite3_errmsg(conn->db), code);
    return -EIO;
}

int store_exec(store_conn_t *conn, const char *sql)
{
    if (sqlite3_exec(conn->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return store_sql_error(conn, sql);
    return 0;
}

int store_stmt_run(store_conn_t *conn, store_stmt_id_t id, const char *what)
{
    sqlite3_stmt *stmt = store_stmt(conn, id);
    if (!stmt) return -EIO;
    int r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(conn, what);
    sqlite3_reset(stmt);
    return r;
}

/* SQLite's process-wide settings, made once before its first use. A page cache starts with a
 * bulk allocation of 20 pages (88 KB); for the short-lived caches of ephemeral tables that
 * block, freed at once, makes malloc hand memory back to the kernel and fault it in again on
 * the loop thread. Without the bulk allocation a cache allocates its pages as it uses them. */
static void configure_sqlite(void)
{
    /* Memory statistics take a global mutex on every allocation; nothing here reads them. */
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    int rc = sqlite3_config(SQLITE_CONFIG_PAGECACHE, NULL, 0, 0);
    /* SQLITE_MISUSE: SQLite was initialized already (a test that used it first); only speed
     * is at stake. */
    if (rc != SQLITE_OK)
        log_debug("store: cannot configure SQLite's page cache: %s", sqlite3_errstr(rc));
}

int store_db_path(const char *state_dir, int shard, char path[PATH_MAX])
{
    int n = shard == 0 ? snprintf(path, PATH_MAX, "%s/%s", state_dir, STORE_DB_NAME)
                       : snprintf(path, PATH_MAX, "%s/gpujobd-%d.db", state_dir, shard);
    return n < PATH_MAX ? 0 : -ENAMETOOLONG;
}

int store_conn_open(store_conn_t *conn, const char *state_dir, int shard, int flags)
{
    static pthread_once_t configured = PTHREAD_ONCE_INIT;
    pthread_once(&configured, configure_sqlite);
    memset(conn, 0, sizeof *conn);
    if (store_db_path(state_dir, shard, conn->db_path) < 0 ||
        snprintf(conn->blobs_dir, sizeof conn->blobs_dir, "%s/blobs", state_dir) >=
            (int)sizeof conn->blobs_dir)
        return log_error_errno(-ENAMETOOLONG, "store: state_dir '%s' is too long", state_dir);

    int rc = sqlite3_open_v2(conn->db_path, &conn->db, flags, NULL);
    if (rc != SQLITE_OK) {
        int r = rc == SQLITE_CANTOPEN ? -ENOENT : -EIO;
        log_error("store: cannot open '%s': %s", conn->db_path,
                  conn->db ? sqlite3_errmsg(conn->db) : sqlite3_errstr(rc));
        sqlite3_close(conn->db);
        conn->db = NULL;
        return r;
    }
    sqlite3_extended_result_codes(conn->db, 1);
    /* Every connection waits for a competing lock rather than failing at once. */
    sqlite3_busy_timeout(conn->db, STORE_BUSY_TIMEOUT_MS);
    return 0;
}

int store_conn_close(store_conn_t *conn)
{
    for (int i = 0; i < STMT_COUNT; i++) {
        sqlite3_finalize(conn->stmts[i]);
        conn->stmts[i] = NULL;
    }
    int r = 0;
    if (conn->db && sqlite3_close(conn->db) != SQLITE_OK)
        r = log_error_errno(-EIO, "store: closing '%s': %s", conn->db_path,
                            sqlite3_errmsg(conn->db));
    conn->db = NULL;
    return r;
}

int store_user_version(store_conn_t *conn, int *ret)
{
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(conn->db, "PRAGMA user_version", -1, &stmt, NULL) != SQLITE_OK)
        return store_sql_error(conn, "reading user_version");
    int r = sqlite3_step(stmt) == SQLITE_ROW ? 0 : store_sql_error(conn, "reading user_version");
    int version = r == 0 ? sqlite3_column_int(stmt, 0) : 0;
    sqlite3_finalize(stmt);
    if (r < 0) return r;
    /* A database written by a newer gpujobd may mean things this one does not know, and
     * writing to it (or misreading it) could corrupt them. */
    if (version > STORE_SCHEMA_VERSION)
        return log_error_errno(-EPROTO,
                               "store: '%s' has schema version %d, newer than this gpujobd's "
                               "%d: refusing to open it (run a newer gpujobd)",
                               conn->db_path, version, STORE_SCHEMA_VERSION);
    *ret = version;
    return 0;
}

int store_setting_get(store_conn_t *conn, const char *name, int *ret)
{
    sqlite3_stmt *stmt = store_stmt(conn, STMT_SETTING_GET);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, name, false);
    int rc = sqlite3_step(stmt);
    *ret = rc == SQLITE_ROW ? sqlite3_column_int(stmt, 0) : 0;
    sqlite3_reset(stmt);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : store_sql_error(conn, "reading a setting");
}

int store_setting_set(store_conn_t *conn, const char *name, int value)
{
    sqlite3_stmt *stmt = store_stmt(conn, STMT_SETTING_SET);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, name, false);
    sqlite3_bind_int(stmt, 2, value);
    int r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(conn, "writing a setting");
    sqlite3_reset(stmt);
    return r;
}

/* The SELECT of store_jobs_list for one combination of filters. */
static void list_sql(int mask, char *buf, size_t size)
{
    /* A state names its partial index (jobs_live or jobs_ended) by the index's condition. The
     * live jobs are few, and the planner, without statistics, would rather read every job in
     * id order than them. */
    bool by_state = mask & STORE_LIST_BY_STATE, live = mask & STORE_LIST_LIVE;
    snprintf(buf, size, "SELECT " JOB_COLUMNS " FROM jobs%s WHERE 1%s%s%s%s%s ORDER BY id LIMIT ?5",
             by_state && live ? " INDEXED BY jobs_live" : "",
             mask & STORE_LIST_BY_OWNER ? " AND owner = ?1" : "", by_state ? " AND state = ?2" : "",
             !by_state ? ""
             : live    ? " AND " STORE_LIVE
                       : " AND " STORE_ENDED,
             mask & STORE_LIST_BY_OP ? " AND op = ?3" : "",
             mask & STORE_LIST_AFTER ? " AND id > ?4" : "");
}

sqlite3_stmt *store_stmt(store_conn_t *conn, store_stmt_id_t id)
{
    sqlite3_stmt *stmt = conn->stmts[id];
    if (stmt) {
        sqlite3_reset(stmt);
        sqlite3_clear_bindings(stmt);
        return stmt;
    }
    char list_buf[1024];
    const char *sql = stmt_sql[id < STMT_LIST_FIRST ? id : 0];
    if (id >= STMT_LIST_FIRST) {
        list_sql(id - STMT_LIST_FIRST, list_buf, sizeof list_buf);
        sql = list_buf;
    }
    if (sqlite3_prepare_v3(conn->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, NULL) !=
        SQLITE_OK) {
        store_sql_error(conn, "preparing a statement");
        return NULL;
    }
    conn->stmts[id] = stmt;
    return stmt;
}

int store_bind_text(sqlite3_stmt *stmt, int col, const char *s, bool empty_is_null)
{
    if (!s || (empty_is_null && !*s)) return sqlite3_bind_null(stmt, col);
    return sqlite3_bind_text(stmt, col, s, -1, SQLITE_TRANSIENT);
}

void store_bind_owners(sqlite3_stmt *stmt, int col, const char *owner)
{
    static const unsigned char above_text = 0xff;
    store_bind_text(stmt, col, owner ? owner : "", false);
    if (owner)
        store_bind_text(stmt, col + 1, owner, false);
    else
        sqlite3_bind_blob(stmt, col + 1, &above_text, 1, SQLITE_STATIC);
}

/* Binds b's bytes to col, NULL when there are none. */
void store_bind_bytes(sqlite3_stmt *stmt, int col, const store_bytes_t *b)
{
    if (b->len)
        sqlite3_bind_blob64(stmt, col, b->p, b->len, SQLITE_STATIC);
    else
        sqlite3_bind_null(stmt, col);
}

int store_files_add(blob_files_t *l, const char *file)
{
    if (l->n > 0 && strcmp(l->a[l->n - 1], file) == 0) return 0;
    if (vec_grow((void **)&l->a, &l->cap, l->n + 1, sizeof *l->a, 16) < 0) return -ENOMEM;
    snprintf(l->a[l->n++], sizeof *l->a, "%s", file);
    return 0;
}

void store_column_copy(sqlite3_stmt *stmt, int col, char *dst, size_t size)
{
    /* No snprintf: recovery copies two columns of every queued job. */
    const unsigned char *s = sqlite3_column_text(stmt, col);
    size_t n = s ? (size_t)sqlite3_column_bytes(stmt, col) : 0;
    if (n >= size) n = size - 1;
    if (n) memcpy(dst, s, n);
    dst[n] = '\0';
}

void store_shape_format(const tensor_desc_t *d, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < d->ndim && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, i ? "," : "", d->shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
}

int store_shape_parse(const char *text, tensor_desc_t *d)
{
    if (!text || *text != '[') return -EINVAL;
    const char *p = text + 1;
    int ndim = 0;
    int64_t shape[TENSOR_MAX_DIMS];
    while (*p != ']') {
        if (ndim == TENSOR_MAX_DIMS) return -EINVAL;
        if (ndim > 0 && *p++ != ',') return -EINVAL;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0) return -EINVAL;
        shape[ndim++] = v;
        p = end;
    }
    if (p[1] != '\0') return -EINVAL;
    d->ndim = ndim;
    memcpy(d->shape, shape, sizeof(int64_t) * (size_t)ndim);
    return 0;
}
