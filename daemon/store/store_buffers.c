/* Buffers: uploaded tensors that jobs name by id. They live in shard 0. */
#include "store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

static int shard_buffer_delete(shard_t *sh, const char *owner, const char *id);

/* Buffers live in shard 0. */
int store_buffer_insert(store_t *st, buffer_t *buf)
{
    shard_t *sh = &st->shards[0];
    if (buf->id[0] && !store_id_ok(buf->id))
        return log_error_errno(-EINVAL, "store: buffer id '%.*s' is not a valid id", ID_SIZE,
                               buf->id);
    if (!buf->owner[0]) return log_error_errno(-EINVAL, "store: buffer: owner is empty");
    int r = 0;
    if (buf->durable) {
        job_tensor_t as_tensor = {
            .desc = buf->desc, .nbytes = buf->nbytes, .data = buf->data, .blob = buf->blob};
        r = store_check_tensor("buffer", "buffer", "bytes", &as_tensor);
    } else if (!buf->resident) {
        r = log_error_errno(-EINVAL, "store: buffer: an ephemeral buffer must be resident");
    }
    if (r < 0) return r;
    char id[ID_SIZE];
    if (buf->id[0])
        memcpy(id, buf->id, ID_SIZE);
    else
        id_new('b', id);
    int64_t created_us = buf->created_us ? buf->created_us : now_us();
    if ((r = store_touch(sh)) < 0) return r;

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
    sqlite3_bind_int(stmt, 11, buf->durable);
    written_files_t written = {.n = 0};
    store_tensor_rec_t placed = {.where = STORE_IN_ROW};
    /* An ephemeral buffer's row has neither data nor file: its bytes are the executor's. */
    if (buf->durable)
        r = store_place_bytes(sh, false, buf->data, buf->nbytes, buf->blob, &written, &placed);
    const char *file = placed.where == STORE_IN_FILE ? placed.file : "";
    if (r == 0 && file[0])
        store_bind_text(stmt, 9, file, false);
    else if (r == 0 && buf->durable)
        sqlite3_bind_blob64(stmt, 8, buf->nbytes ? buf->data : "", buf->nbytes, SQLITE_STATIC);
    if (r == 0) {
        /* One statement: atomic by itself, no savepoint needed. */
        r = sqlite3_step(stmt) == SQLITE_DONE ? 0
                                              : store_sql_error(&sh->conn, "inserting a buffer");
    }
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    char *blob = NULL;
    if (r == 0 && buf->durable &&
        !(blob = file[0] ? store_locator_file(file, 0) : store_locator_buffer(id))) {
        r = -ENOMEM;
        /* The row is in; take it out again so the failure leaves nothing behind. */
        shard_buffer_delete(sh, NULL, id);
        written.n = 0; /* shard_buffer_delete queued or removed the file */
    }
    if (r < 0) {
        store_written_remove(sh, &written);
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
    int r = store_touch(sh);
    if (r < 0) return r;
    store_write_reset(sh);
    r = store_write_begin(sh, false);
    if (r < 0) return r;
    r = store_write_end(sh, buffer_delete_row(sh, owner, id, file));
    if (r == 0 && file[0]) store_unlink_after_commit(sh, (const blob_file_t *)&file, 1);
    return r;
}

int store_buffer_delete(store_t *st, const char *owner, const char *id)
{
    int r = shard_buffer_delete(&st->shards[0], owner, id);
    /* Deleting rows needs room in the WAL: on a full disk the reserve file makes it, so that
     * space can always be freed. */
    if (r == -ENOSPC && store_space_release(st)) r = shard_buffer_delete(&st->shards[0], owner, id);
    return r;
}

int store_buffer_bytes(store_t *st, const char *owner, uint64_t *ret_stored, uint64_t *ret_resident)
{
    shard_t *sh = &st->shards[0];
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_USAGE_BUFFERS);
    if (!stmt) return -EIO;
    store_bind_owners(stmt, 1, owner);
    int r = 0;
    if (sqlite3_step(stmt) == SQLITE_ROW) {
        *ret_stored = (uint64_t)sqlite3_column_int64(stmt, 1);
        *ret_resident = (uint64_t)sqlite3_column_int64(stmt, 2);
    } else {
        r = store_sql_error(&sh->conn, "summing buffer bytes");
    }
    sqlite3_reset(stmt);
    return r;
}

int store_buffers_forget_ephemeral(store_t *st)
{
    shard_t *sh = &st->shards[0];
    int r = store_exec(&sh->conn, "DELETE FROM buffers WHERE durable = 0");
    if (r < 0) return r;
    int n = sqlite3_changes(sh->conn.db);
    if (n) log_info("store: %d ephemeral buffer(s) of the last run forgotten", n);
    return 0;
}
