/* Reads: read-only connections for any thread (WAL lets them run beside the writer), and the
 * rebuilding of a job_t from its rows, which the writer's recovery uses too. Reads made of
 * several statements run in one read transaction, so that they see one snapshot. */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "daemon/util/vec.h"
#include "store_internal.h"

#define LIST_LIMIT_MAX 1000

/* A connection per shard (store.h); conns[0] also reads the buffers. */
struct store_reader {
    int n_shards;
    store_conn_t conns[];
};

static int open_shard(const char *state_dir, int k, store_conn_t *conn)
{
    int r = store_conn_open(conn, state_dir, k, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX);
    int version = 0;
    if (r == 0) r = store_user_version(conn, &version);
    if (r == 0 && version != STORE_SCHEMA_VERSION)
        r = log_error_errno(-EPROTO,
                            "store: '%s' has schema version %d, this gpujobd reads %d: open the "
                            "store for writing first so that it migrates",
                            conn->db_path, version, STORE_SCHEMA_VERSION);
    return r;
}

int store_reader_open(store_t *st, store_reader_t **ret)
{
    /* Only what store_open fixed is read of st: any thread may call this. */
    const char *state_dir = st->state_dir;
    store_conn_t first;
    int n = 0;
    int r = open_shard(state_dir, 0, &first);
    if (r == 0) r = store_setting_get(&first, "shards", &n);
    if (r == 0 && (n < 0 || n > STORE_MAX_SHARDS))
        r = log_error_errno(-EPROTO, "store: '%s' records %d shards", first.db_path, n);
    if (n == 0) n = 1;
    store_reader_t *rd = r == 0 ? calloc(1, sizeof *rd + (size_t)n * sizeof rd->conns[0]) : NULL;
    if (!rd) {
        store_conn_close(&first);
        return r < 0 ? r : -ENOMEM;
    }
    rd->conns[0] = first;
    rd->n_shards = 1;
    for (; r == 0 && rd->n_shards < n; rd->n_shards++)
        r = open_shard(state_dir, rd->n_shards, &rd->conns[rd->n_shards]);
    if (r < 0) {
        store_reader_close(rd);
        return r;
    }
    *ret = rd;
    return 0;
}

void store_reader_close(store_reader_t *rd)
{
    if (!rd) return;
    for (int k = 0; k < rd->n_shards; k++)
        store_conn_close(&rd->conns[k]);
    free(rd);
}

/* The connection of the shard a job id names. */
static store_conn_t *job_conn(store_reader_t *rd, const char *id)
{
    return &rd->conns[store_id_shard(id, rd->n_shards)];
}

static int read_begin(store_conn_t *conn)
{
    return store_stmt_run(conn, STMT_BEGIN, "BEGIN");
}

/* Ends the read transaction; returns r (the read's own result) unless ending it failed. */
static int read_end(store_conn_t *conn, int r)
{
    int e = store_stmt_run(conn, STMT_COMMIT, "COMMIT");
    return r < 0 ? r : e;
}

static int corrupt(const char *job_id, const char *what)
{
    return log_error_errno(-EIO, "store: job %s: stored %s is malformed", job_id, what);
}

/* Fills job's inputs (output false) or outputs from their column of a job row. */
static int tensors_from_column(job_t *job, sqlite3_stmt *row, int col, bool output)
{
    const void *bytes = sqlite3_column_blob(row, col);
    size_t len = (size_t)sqlite3_column_bytes(row, col), pos = 0;
    store_tensor_rec_t rec;
    int k;
    while ((k = store_tensors_next(bytes, len, &pos, &rec)) > 0) {
        job_tensor_t *t = output ? &job->out[rec.slot] : &job->in[rec.slot];
        memcpy(t->name, rec.name, sizeof t->name);
        t->desc = rec.desc;
        t->nbytes = rec.nbytes;
        if (rec.where == STORE_IN_BUFFER) {
            memcpy(t->buffer_id, rec.buffer_id, sizeof t->buffer_id);
        } else if (rec.where == STORE_EXPIRED) {
            if (!(t->blob = strdup(STORE_LOCATOR_EXPIRED))) return -ENOMEM;
        } else {
            t->blob = rec.where == STORE_IN_FILE ? store_locator_file(rec.file, rec.offset)
                                                 : store_locator_tensor(job->id, output, rec.slot);
            if (!t->blob) return -ENOMEM;
        }
        if (!output) {
            job->call.has_in[rec.slot] = true;
            job->call.in[rec.slot] = t->desc;
        }
    }
    return k < 0 ? corrupt(job->id, output ? "outputs" : "inputs") : 0;
}

/* Builds a job from a row of STMT_JOB_GET's columns (or a list statement's, which are the
 * same), as stored: its op by name, its tensors' descriptors and locators. */
static int job_from_row(sqlite3_stmt *row, job_t **ret)
{
    job_t *job = job_new();
    if (!job) return -ENOMEM;
    int r = 0;
    store_column_copy(row, 0, job->id, sizeof job->id);
    store_column_copy(row, 1, job->owner, sizeof job->owner);
    store_column_copy(row, 2, job->op_name, sizeof job->op_name);
    const char *params = (const char *)sqlite3_column_text(row, 3);
    if (params && !(job->params_json = strdup(params))) r = -ENOMEM;
    job->priority = sqlite3_column_int(row, 4);
    job->device = sqlite3_column_int(row, 5);
    job->deadline_us = sqlite3_column_int64(row, 6);
    if (r == 0 && job_state_parse((const char *)sqlite3_column_text(row, 7), &job->state) < 0)
        r = corrupt(job->id, "state");
    job->attempts = sqlite3_column_int(row, 8);
    job->created_us = sqlite3_column_int64(row, 9);
    job->started_us = sqlite3_column_int64(row, 10);
    job->finished_us = sqlite3_column_int64(row, 11);
    job->run_device = sqlite3_column_int(row, 12);
    job->gpu_ns = sqlite3_column_int64(row, 13);
    job->batch_size = sqlite3_column_int(row, 14);
    job->batch_ns = sqlite3_column_int64(row, 21);
    job->time_limit_ms = sqlite3_column_int64(row, 22);
    store_column_copy(row, 15, job->error_code, sizeof job->error_code);
    store_column_copy(row, 16, job->error_message, sizeof job->error_message);
    store_column_copy(row, 17, job->idempotency_key, sizeof job->idempotency_key);
    if (sqlite3_column_type(row, 20) != SQLITE_NULL && sqlite3_column_int64(row, 20) >= 0) {
        char key[IDEM_KEY_SIZE];
        memcpy(key, job->idempotency_key, sizeof key);
        job_idem_key_format(job->idempotency_key, key, true, (size_t)sqlite3_column_int64(row, 20));
    }
    if (r == 0) r = tensors_from_column(job, row, 18, false);
    if (r == 0) r = tensors_from_column(job, row, 19, true);
    if (r < 0) {
        job_free(job);
        return r;
    }
    *ret = job;
    return 0;
}

int store_job_read(store_conn_t *conn, const char *id, job_t **ret)
{
    sqlite3_stmt *stmt = store_stmt(conn, STMT_JOB_GET);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, id, false);
    int rc = sqlite3_step(stmt);
    int r = rc == SQLITE_ROW    ? job_from_row(stmt, ret)
            : rc == SQLITE_DONE ? -ENOENT
                                : store_sql_error(conn, "reading a job");
    sqlite3_reset(stmt);
    return r;
}

int store_job_get(store_reader_t *rd, const char *id, job_t **ret)
{
    if (!id) return -ENOENT;
    store_conn_t *conn = job_conn(rd, id);
    int r = read_begin(conn);
    if (r < 0) return r;
    return read_end(conn, store_job_read(conn, id, ret));
}

/* Jobs with a key live in shard 0 (sched.c, place_submissions). */
int store_job_find_idempotent(store_reader_t *rd, const char *owner, const char *key,
                              char ret_id[ID_SIZE])
{
    if (!owner || !key || !*key) return -ENOENT;
    sqlite3_stmt *stmt = store_stmt(&rd->conns[0], STMT_JOB_FIND_IDEMPOTENT);
    if (!stmt) return -EIO;
    /* A list's element was once stored as KEY:INDEX. */
    char split[IDEM_KEY_SIZE], legacy[IDEM_KEY_SIZE + 24];
    int64_t index = job_idem_key_split(key, split);
    if (index >= 0)
        snprintf(legacy, sizeof legacy, "%s:%lld", split, (long long)index);
    else
        store_copy_str(legacy, sizeof legacy, split);
    store_bind_text(stmt, 1, owner, false);
    store_bind_text(stmt, 2, split, false);
    sqlite3_bind_int64(stmt, 3, index);
    store_bind_text(stmt, 4, legacy, false);
    int rc = sqlite3_step(stmt);
    int r = rc == SQLITE_ROW    ? 0
            : rc == SQLITE_DONE ? -ENOENT
                                : store_sql_error(&rd->conns[0], "finding an idempotency key");
    if (r == 0) store_column_copy(stmt, 0, ret_id, ID_SIZE);
    sqlite3_reset(stmt);
    return r;
}

/* Appends the job rows stmt lists, up to limit, to jobs (room for that many made). */
static int list_rows(store_conn_t *conn, sqlite3_stmt *stmt, int limit, job_t **jobs, size_t *n)
{
    int rc = SQLITE_DONE, r = 0;
    size_t got = 0;
    while (r == 0 && got < (size_t)limit && (rc = sqlite3_step(stmt)) == SQLITE_ROW)
        if ((r = job_from_row(stmt, &jobs[*n])) == 0) {
            (*n)++;
            got++;
        }
    if (r == 0 && got < (size_t)limit && rc != SQLITE_DONE)
        r = store_sql_error(conn, "listing jobs");
    return r;
}

static int id_order(const void *a, const void *b)
{
    return strcmp((*(job_t *const *)a)->id, (*(job_t *const *)b)->id);
}

/* Each shard lists its first limit jobs; the first limit of them all in id order are the
 * answer. */
int store_jobs_list(store_reader_t *rd, const store_list_query_t *q, job_t ***ret_jobs,
                    size_t *ret_n)
{
    if (q->limit < 1 || q->limit > LIST_LIMIT_MAX)
        return log_error_errno(-EINVAL, "store: list: limit %d is not in 1..%d", q->limit,
                               LIST_LIMIT_MAX);
    if (q->state != -1 && (q->state < 0 || q->state >= JOB_STATE_COUNT))
        return log_error_errno(-EINVAL, "store: list: state %d is not a job state", q->state);
    int mask = (q->owner ? STORE_LIST_BY_OWNER : 0) | (q->state >= 0 ? STORE_LIST_BY_STATE : 0) |
               (q->op ? STORE_LIST_BY_OP : 0) | (q->after && *q->after ? STORE_LIST_AFTER : 0) |
               (q->state >= 0 && !job_state_is_final(q->state) ? STORE_LIST_LIVE : 0);
    job_t **jobs = calloc((size_t)rd->n_shards * (size_t)q->limit, sizeof *jobs);
    if (!jobs) return -ENOMEM;
    size_t n = 0;
    int r = 0;
    for (int k = 0; k < rd->n_shards && r == 0; k++) {
        store_conn_t *conn = &rd->conns[k];
        if ((r = read_begin(conn)) < 0) break;
        sqlite3_stmt *stmt = store_stmt(conn, (store_stmt_id_t)(STMT_LIST_FIRST + mask));
        if (!stmt) {
            r = read_end(conn, -EIO);
            break;
        }
        if (mask & STORE_LIST_BY_OWNER) store_bind_text(stmt, 1, q->owner, false);
        if (mask & STORE_LIST_BY_STATE)
            store_bind_text(stmt, 2, job_state_name((job_state_t)q->state), false);
        if (mask & STORE_LIST_BY_OP) store_bind_text(stmt, 3, q->op, false);
        if (mask & STORE_LIST_AFTER) store_bind_text(stmt, 4, q->after, false);
        sqlite3_bind_int(stmt, 5, q->limit);
        r = list_rows(conn, stmt, q->limit, jobs, &n);
        sqlite3_reset(stmt);
        r = read_end(conn, r);
    }
    if (r == 0 && rd->n_shards > 1 && n > 1) qsort(jobs, n, sizeof *jobs, id_order);
    size_t keep = r == 0 && n > (size_t)q->limit ? (size_t)q->limit : n;
    for (size_t i = r == 0 ? keep : 0; i < n; i++)
        job_free(jobs[i]);
    if (r < 0) {
        free(jobs);
        return r;
    }
    *ret_jobs = jobs;
    *ret_n = keep;
    return 0;
}

/* Copies the nbytes at bytes into a new malloc'd block. */
static int copy_out(const void *bytes, uint64_t len, const char *blob, uint64_t nbytes,
                    void **ret_data)
{
    if (len != nbytes)
        return log_error_errno(-EIO, "store: blob '%s' holds %llu bytes, expected %llu", blob,
                               (unsigned long long)len, (unsigned long long)nbytes);
    void *data = malloc(nbytes ? nbytes : 1);
    if (!data) return -ENOMEM;
    if (nbytes) memcpy(data, bytes, nbytes);
    *ret_data = data;
    return 0;
}

/* The bytes the database holds for one of a job's tensors, from a row of STMT_JOB_BYTES: the
 * record of loc's slot says where they are in the job's bytes. -ENOENT when they are not
 * there. */
static int read_tensor_bytes(sqlite3_stmt *stmt, const store_locator_t *loc, const char *blob,
                             uint64_t nbytes, void **ret_data)
{
    int col = loc->output ? 1 : 0;
    const void *bytes = sqlite3_column_blob(stmt, col);
    size_t len = (size_t)sqlite3_column_bytes(stmt, col), pos = 0;
    store_tensor_rec_t rec;
    int k;
    while ((k = store_tensors_next(bytes, len, &pos, &rec)) > 0) {
        if (rec.slot != loc->slot) continue;
        if (rec.where != STORE_IN_ROW) return -ENOENT;
        const unsigned char *data = sqlite3_column_blob(stmt, 2);
        uint64_t data_len = (uint64_t)sqlite3_column_bytes(stmt, 2);
        if (rec.at > data_len || rec.nbytes > data_len - rec.at) {
            k = -EIO;
            break;
        }
        return copy_out(rec.nbytes ? data + rec.at : NULL, rec.nbytes, blob, nbytes, ret_data);
    }
    return k < 0 ? corrupt(loc->id, loc->output ? "outputs" : "inputs") : -ENOENT;
}

bool store_blob_expired(const char *blob)
{
    return blob && strcmp(blob, STORE_LOCATOR_EXPIRED) == 0;
}

int store_blob_read(store_reader_t *rd, const char *blob, uint64_t nbytes, void **ret_data)
{
    store_locator_t loc;
    if (store_blob_expired(blob)) return -ENODATA;
    if (store_locator_parse(blob, &loc) < 0)
        return log_error_errno(-EINVAL, "store: '%s' is not a blob locator", blob ? blob : "");
    if (loc.kind == STORE_LOCATOR_FILE)
        return store_blob_file_read(rd->conns[0].blobs_dir, loc.file, loc.offset, nbytes, ret_data);
    bool tensor = loc.kind == STORE_LOCATOR_TENSOR;
    store_conn_t *conn = tensor ? job_conn(rd, loc.id) : &rd->conns[0];
    sqlite3_stmt *stmt = store_stmt(conn, tensor ? STMT_JOB_BYTES : STMT_BUFFER_DATA);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, loc.id, false);
    if (tensor) sqlite3_bind_int(stmt, 2, loc.output);
    int rc = sqlite3_step(stmt), r;
    if (rc != SQLITE_ROW)
        r = rc == SQLITE_DONE ? -ENOENT : store_sql_error(conn, "reading a blob");
    else if (tensor)
        r = read_tensor_bytes(stmt, &loc, blob, nbytes, ret_data);
    else if (sqlite3_column_type(stmt, 0) != SQLITE_BLOB)
        r = -ENOENT;
    else
        r = copy_out(sqlite3_column_blob(stmt, 0), (uint64_t)sqlite3_column_bytes(stmt, 0), blob,
                     nbytes, ret_data);
    sqlite3_reset(stmt);
    return r;
}

int store_blob_read_at(store_reader_t *rd, const char *blob, uint64_t nbytes, uint64_t offset,
                       void *dst, size_t n)
{
    store_locator_t loc;
    if (store_blob_expired(blob)) return -ENODATA;
    if (offset > nbytes || n > nbytes - offset || store_locator_parse(blob, &loc) < 0)
        return log_error_errno(-EINVAL, "store: cannot read %zu bytes at %" PRIu64 " of '%s'", n,
                               offset, blob ? blob : "");
    if (loc.kind == STORE_LOCATOR_FILE)
        return store_blob_file_read_at(rd->conns[0].blobs_dir, loc.file, loc.offset, nbytes, offset,
                                       dst, n);
    /* A row holds at most inline_blob_bytes: read it whole. */
    void *all = NULL;
    int r = store_blob_read(rd, blob, nbytes, &all);
    if (r == 0) memcpy(dst, (char *)all + offset, n);
    free(all);
    return r;
}

int store_buffer_get(store_reader_t *rd, const char *id, buffer_t **ret)
{
    if (!id) return -ENOENT;
    sqlite3_stmt *stmt = store_stmt(&rd->conns[0], STMT_BUFFER_GET);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, id, false);
    int rc = sqlite3_step(stmt);
    if (rc != SQLITE_ROW) {
        int r = rc == SQLITE_DONE ? -ENOENT : store_sql_error(&rd->conns[0], "reading a buffer");
        sqlite3_reset(stmt);
        return r;
    }
    buffer_t *buf = buffer_new();
    int r = buf ? 0 : -ENOMEM;
    if (r == 0) {
        store_column_copy(stmt, 0, buf->id, sizeof buf->id);
        store_column_copy(stmt, 1, buf->owner, sizeof buf->owner);
        if (dtype_parse((const char *)sqlite3_column_text(stmt, 2), &buf->desc.dtype) < 0 ||
            store_shape_parse((const char *)sqlite3_column_text(stmt, 3), &buf->desc) < 0)
            r = log_error_errno(-EIO, "store: buffer %s: stored dtype or shape is malformed", id);
        buf->nbytes = (uint64_t)sqlite3_column_int64(stmt, 4);
        buf->resident = sqlite3_column_int(stmt, 5) != 0;
        buf->created_us = sqlite3_column_int64(stmt, 6);
        buf->device = sqlite3_column_int(stmt, 8);
        buf->durable = sqlite3_column_int(stmt, 9) != 0;
        const char *file = (const char *)sqlite3_column_text(stmt, 7);
        /* An ephemeral buffer has no stored bytes: no locator. */
        if (r == 0 && buf->durable &&
            !(buf->blob = file ? store_locator_file(file, 0) : store_locator_buffer(id)))
            r = -ENOMEM;
    }
    sqlite3_reset(stmt);
    if (r < 0) {
        buffer_free(buf);
        return r;
    }
    *ret = buf;
    return 0;
}

/* Adds what a shard's rows say of owner's (NULL: everyone's) jobs and buffers to u: the live
 * jobs by state, the ended ones and their times from the rollup, the buffers (shard 0's). */
static int usage_read(store_conn_t *conn, const char *owner, store_usage_t *u)
{
    sqlite3_stmt *stmt = store_stmt(conn, STMT_USAGE_STATES);
    if (!stmt) return -EIO;
    store_bind_owners(stmt, 1, owner);
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        job_state_t s;
        if (job_state_parse((const char *)sqlite3_column_text(stmt, 0), &s) == 0)
            u->jobs_by_state[s] += sqlite3_column_int64(stmt, 1);
    }
    int r = rc == SQLITE_DONE ? 0 : store_sql_error(conn, "counting jobs");
    sqlite3_reset(stmt);
    if (r < 0) return r;

    const store_stmt_id_t sums[2] = {STMT_USAGE_TIMES, STMT_USAGE_BUFFERS};
    int64_t *dst[2][5] = {
        {&u->jobs_by_state[JOB_SUCCEEDED], &u->jobs_by_state[JOB_FAILED],
         &u->jobs_by_state[JOB_CANCELLED], &u->run_us, &u->gpu_ns},
        {&u->buffers, &u->buffer_bytes, &u->resident_bytes, &u->ephemeral_bytes, NULL}};
    for (int i = 0; r == 0 && i < 2; i++) {
        if (!(stmt = store_stmt(conn, sums[i]))) return -EIO;
        store_bind_owners(stmt, 1, owner);
        if (sqlite3_step(stmt) == SQLITE_ROW) {
            for (int c = 0; c < 5 && dst[i][c]; c++)
                *dst[i][c] += sqlite3_column_int64(stmt, c);
        } else {
            r = store_sql_error(conn, "summing usage");
        }
        sqlite3_reset(stmt);
    }
    return r;
}

int store_usage_get(store_reader_t *rd, const char *owner, store_usage_t *ret)
{
    if (owner && !*owner) return log_error_errno(-EINVAL, "store: usage: owner is empty");
    store_usage_t u;
    memset(&u, 0, sizeof u);
    snprintf(u.owner, sizeof u.owner, "%s", owner ? owner : "*");
    int r = 0;
    for (int k = 0; k < rd->n_shards && r == 0; k++) {
        store_conn_t *conn = &rd->conns[k];
        if ((r = read_begin(conn)) == 0) r = read_end(conn, usage_read(conn, owner, &u));
    }
    if (r == 0) *ret = u;
    return r;
}

static int usage_row_cmp(const void *a, const void *b)
{
    const store_usage_row_t *x = a, *y = b;
    int c = strcmp(x->owner, y->owner);
    if (c == 0) c = (x->day > y->day) - (x->day < y->day);
    return c ? c : strcmp(x->op, y->op);
}

/* Appends a shard's rows of the query to *rows (n, cap); -E2BIG past max_rows. */
static int usage_rows_read(store_conn_t *conn, const store_usage_query_t *q,
                           store_usage_row_t **rows, size_t *n, size_t *cap)
{
    sqlite3_stmt *stmt = store_stmt(conn, STMT_USAGE_ROLLUP);
    if (!stmt) return -EIO;
    store_bind_owners(stmt, 1, q->owner);
    sqlite3_bind_int64(stmt, 3, q->since_day);
    sqlite3_bind_int64(stmt, 4, q->until_day);
    sqlite3_bind_int64(stmt, 5, (sqlite3_int64)q->max_rows + 1);
    int r = 0, rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        if (*n >= q->max_rows) {
            r = -E2BIG;
            break;
        }
        if ((r = vec_grow((void **)rows, cap, *n + 1, sizeof **rows, 64)) < 0) break;
        store_usage_row_t *u = &(*rows)[(*n)++];
        store_column_copy(stmt, 0, u->owner, sizeof u->owner);
        u->day = sqlite3_column_int64(stmt, 1);
        store_column_copy(stmt, 2, u->op, sizeof u->op);
        int64_t *sums[] = {&u->jobs,   &u->succeeded, &u->failed,   &u->cancelled,
                           &u->run_us, &u->gpu_ns,    &u->bytes_in, &u->bytes_out};
        for (int c = 0; c < 8; c++)
            *sums[c] = sqlite3_column_int64(stmt, 3 + c);
    }
    if (r == 0 && rc != SQLITE_DONE) r = store_sql_error(conn, "reading the usage rollup");
    sqlite3_reset(stmt);
    return r;
}

/* Sorts rows gathered from several shards and adds up those of the same owner, day and op;
 * returns how many remain. */
static size_t usage_rows_merge(store_usage_row_t *rows, size_t n)
{
    if (n < 2) return n;
    qsort(rows, n, sizeof *rows, usage_row_cmp);
    size_t m = 0;
    for (size_t i = 1; i < n; i++) {
        store_usage_row_t *a = &rows[m], *b = &rows[i];
        if (usage_row_cmp(a, b) != 0) {
            rows[++m] = *b;
            continue;
        }
        a->jobs += b->jobs;
        a->succeeded += b->succeeded;
        a->failed += b->failed;
        a->cancelled += b->cancelled;
        a->run_us += b->run_us;
        a->gpu_ns += b->gpu_ns;
        a->bytes_in += b->bytes_in;
        a->bytes_out += b->bytes_out;
    }
    return m + 1;
}

int store_usage_rollup(store_reader_t *rd, const store_usage_query_t *q,
                       store_usage_row_t **ret_rows, size_t *ret_n)
{
    if (q->owner && !*q->owner) return log_error_errno(-EINVAL, "store: usage: owner is empty");
    store_usage_row_t *rows = NULL;
    size_t n = 0, cap = 0;
    int r = 0;
    /* Each shard may hold up to max_rows of its own: their sum is bounded after the merge. */
    store_usage_query_t shard_q = *q;
    for (int k = 0; k < rd->n_shards && r == 0; k++) {
        store_conn_t *conn = &rd->conns[k];
        size_t before = n;
        shard_q.max_rows = q->max_rows + before;
        if ((r = read_begin(conn)) == 0)
            r = read_end(conn, usage_rows_read(conn, &shard_q, &rows, &n, &cap));
        if (r == 0) n = usage_rows_merge(rows, n);
    }
    if (r == 0 && n > q->max_rows) r = -E2BIG;
    if (r < 0) {
        free(rows);
        return r;
    }
    *ret_rows = rows;
    *ret_n = n;
    return 0;
}
