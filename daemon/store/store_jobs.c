/* Job writes: inserts, and updates that apply a state transition. The transitions are
 * enforced here and nowhere else (store.h lists them): an update names the states it may come
 * from, and the row changes only if it is in one of them. */
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

/* Writes a job's inputs' (output 0) or outputs' bytes kept in the database, if it has any. */
int store_job_bytes_insert(store_conn_t *conn, const char *job_id, int output,
                           const store_bytes_t *b)
{
    if (b->len == 0) return 0;
    sqlite3_stmt *stmt = store_stmt(conn, STMT_JOB_BYTES_INSERT);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, job_id, false);
    sqlite3_bind_int(stmt, 2, output);
    store_bind_bytes(stmt, 3, b);
    int r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(conn, "writing a job's bytes");
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    return r;
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
static int begin_placed(shard_t *sh, int r, written_files_t *written, char **blobs,
                        bool one_statement)
{
    if (r == 0) r = store_write_begin(sh, one_statement);
    if (r < 0) {
        store_written_remove(sh, written);
        free_blobs(blobs);
    }
    return r;
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
    if (job->id[0] && !store_id_ok(job->id))
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
        int r = store_check_tensor(id, "inputs", input_name(job, j), &job->in[j]);
        if (r < 0) return r;
    }
    return 0;
}

int store_shard_job_insert(shard_t *sh, job_t *job, const char *id)
{
    int r = check_job_for_insert(job);
    if (r < 0) return r;
    int64_t created_us = job->created_us ? job->created_us : now_us();
    if ((r = store_touch(sh)) < 0) return r;

    store_write_reset(sh);
    written_files_t written = {.n = 0};
    char *blobs[OP_MAX_TENSORS] = {0};
    for (int j = 0; r == 0 && j < OP_MAX_TENSORS; j++)
        if (job->call.has_in[j])
            r = store_place_tensor(sh, id, false, j, input_name(job, j), &job->in[j], &written,
                                   &blobs[j]);
    r = begin_placed(sh, r, &written, blobs, sh->data.len == 0); /* else a job_bytes row too */
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
        char key[IDEM_KEY_SIZE];
        int64_t index = job_idem_key_split(job->idempotency_key, key);
        store_bind_text(stmt, 10, key, true);
        if (key[0]) sqlite3_bind_int64(stmt, 15, index);
        store_bind_text(stmt, 11, job_state_name(job->state), false);
        sqlite3_bind_int64(stmt, 12, job->started_us);
        sqlite3_bind_int(stmt, 13, job->batch_size);
        store_bind_bytes(stmt, 14, &sh->cols);
        store_bind_text(stmt, 16, job->call.batch_key, false);
        sqlite3_bind_double(stmt, 17, job->call.cost.bytes);
        sqlite3_bind_double(stmt, 18, job->call.cost.flops);
        sqlite3_bind_int64(stmt, 19, job->time_limit_ms);
        r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(&sh->conn, "inserting a job");
        sqlite3_reset(stmt);
        sqlite3_clear_bindings(stmt); /* drop the SQLITE_STATIC pointer to sh->cols */
    }
    if (r == 0) r = store_job_bytes_insert(&sh->conn, id, 0, &sh->data);
    r = store_write_end(sh, r);
    if (r < 0) {
        store_written_remove(sh, &written);
        free_blobs(blobs);
        return r;
    }
    /* Written only where they change: the scheduler may have handed the job to an executor
     * thread already, which reads its id (store.h, store_job_insert). */
    if (memcmp(job->id, id, ID_SIZE) != 0) memcpy(job->id, id, ID_SIZE);
    if (job->created_us != created_us) job->created_us = created_us;
    for (int j = 0; j < OP_MAX_TENSORS; j++)
        if (job->call.has_in[j] && !job->in[j].name[0])
            snprintf(job->in[j].name, sizeof job->in[j].name, "%s", input_name(job, j));
    set_blobs(job->in, blobs);
    return 0;
}

int store_job_insert(store_t *st, job_t *job)
{
    char id[ID_SIZE];
    if (job->id[0])
        memcpy(id, job->id, ID_SIZE);
    else
        id_new('j', id);
    shard_t *sh = store_shard_of(st, id);
    if (st->deferring && job->id[0]) return store_defer(sh, job, DEFER_INSERT);
    return store_shard_job_insert(sh, job, id);
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
        int r = store_check_tensor(job->id, "outputs", output_name(job, j), &job->out[j]);
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

/* Writes the row's change. An end adds to the usage rollup: noted for the open transaction's
 * commit when collect (store_usage_prepare made room), else by a statement of its own. */
static int update_row(shard_t *sh, const job_t *job, bool collect)
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
        store_bind_bytes(stmt, 13, &sh->cols);
        sqlite3_bind_int64(stmt, 14, job->batch_ns);
    }
    int r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(&sh->conn, "updating a job");
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    if (r < 0) return r;
    if (sqlite3_changes(sh->conn.db) == 1) {
        if (start) return 0;
        if (!collect) return store_usage_note_end(sh, job, started, finished);
        store_usage_collect(sh, job, started, finished);
        return 0;
    }

    job_state_t stored;
    r = job_state_of(sh, job->id, &stored);
    if (r == -ENOENT) return -ENOENT;
    if (r < 0) return r;
    log_debug("store: %s: refused change from %s to %s", job->id, job_state_name(stored),
              job_state_name(job->state));
    return -EBUSY;
}

int store_shard_job_update(shard_t *sh, const job_t *job)
{
    if ((unsigned)job->state >= JOB_STATE_COUNT)
        return log_error_errno(-EINVAL, "store: %s: state %d is not a job state", job->id,
                               (int)job->state);
    if (!store_id_ok(job->id)) return log_error_errno(-EINVAL, "store: update of a job with no id");
    int r = job->state == JOB_SUCCEEDED ? check_outputs(job) : 0;
    if (r == 0) r = store_touch(sh);
    if (r < 0) return r;

    store_write_reset(sh);
    written_files_t written = {.n = 0};
    char *blobs[OP_MAX_TENSORS] = {0};
    for (int j = 0; r == 0 && job->state == JOB_SUCCEEDED && j < job->call.n_out; j++)
        r = store_place_tensor(sh, job->id, true, j, output_name(job, j), &job->out[j], &written,
                               &blobs[j]);
    /* Inside a transaction an end's line in the usage rollup waits for the commit; outside
     * one it is a statement more, as is a job_bytes row. */
    bool final = job_state_is_final(job->state);
    bool collect = final && sh->in_txn;
    if (r == 0 && collect) r = store_usage_prepare(sh, job);
    bool one_statement = sh->data.len == 0 && (!final || collect);
    r = begin_placed(sh, r, &written, blobs, one_statement);
    if (r < 0) return r;
    r = update_row(sh, job, collect);
    if (r == 0) r = store_job_bytes_insert(&sh->conn, job->id, 1, &sh->data);
    /* The job is const: the outputs' locators are read back with store_job_get. */
    free_blobs(blobs);
    r = store_write_end(sh, r);
    if (r < 0) store_written_remove(sh, &written);
    if (r == 0 && collect) store_usage_keep(sh);
    return r;
}

int store_job_update(store_t *st, const job_t *job)
{
    shard_t *sh = store_shard_of(st, job->id);
    if (st->deferring) return store_defer(sh, (job_t *)job, DEFER_UPDATE);
    return store_shard_job_update(sh, job);
}
