/* Retention: finished jobs past the cutoff are deleted with their tensors' bytes, in batches
 * that keep each of the loop thread's transactions short, and the files they alone named go
 * after the commit. store_trim (store_trim.c) deletes jobs through the same helpers. */
#include "store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

#define GC_BATCH 256

int store_drop_tensors(shard_t *sh, const char *job_id, const void *bytes, size_t len,
                       blob_files_t *files, uint64_t *ret_bytes)
{
    size_t pos = 0;
    uint64_t kept = 0;
    store_tensor_rec_t rec;
    int k, r = 0;
    while ((k = store_tensors_next(bytes, len, &pos, &rec)) > 0) {
        if (rec.where == STORE_IN_ROW || rec.where == STORE_IN_FILE) kept += rec.nbytes;
        if (rec.where != STORE_IN_FILE) continue;
        bool known = false;
        for (size_t f = 0; f < sh->write_refs.n && !known; f++)
            known = strcmp(sh->write_refs.a[f].file, rec.file) == 0;
        if ((r = store_refs_note(&sh->write_refs, rec.file, -1)) < 0) return r;
        if (!known && (r = store_files_add(files, rec.file)) < 0) return r;
    }
    /* A job whose tensors cannot be read still goes; its files go at the next sweep. */
    if (k < 0) log_warn("store: job %s: its stored tensors are malformed", job_id);
    *ret_bytes = kept;
    return 0;
}

int store_delete_jobs(shard_t *sh, char (*ids)[ID_SIZE], int n, blob_files_t *files,
                      uint64_t *ret_bytes)
{
    uint64_t total = 0;
    int r = 0;
    for (int i = 0; r == 0 && i < n; i++) {
        sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_JOB_TENSORS);
        if (!stmt) return -EIO;
        store_bind_text(stmt, 1, ids[i], false);
        if (sqlite3_step(stmt) != SQLITE_ROW)
            r = store_sql_error(&sh->conn, "reading a deleted job's tensors");
        for (int col = 0; r == 0 && col < 2; col++) {
            uint64_t kept = 0;
            r = store_drop_tensors(sh, ids[i], sqlite3_column_blob(stmt, col),
                                   (size_t)sqlite3_column_bytes(stmt, col), files, &kept);
            total += kept;
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
    if (r == 0) *ret_bytes = total;
    return r;
}

void store_remove_unused(shard_t *sh, blob_files_t *files)
{
    /* A file goes with the last row naming it: segments hold many jobs' tensors, and the
     * active one is still being appended to. Failing to remove one only leaves it for the
     * sweep at the next open. */
    size_t unused = 0;
    for (size_t i = 0; i < files->n; i++)
        if (!store_file_in_use(sh->st, files->a[i]))
            memcpy(files->a[unused++], files->a[i], sizeof *files->a);
    store_unlink_after_commit(sh, files->a, unused);
}

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
    uint64_t bytes = 0;
    if (r == 0) r = store_delete_jobs(sh, ids, n, files, &bytes);
    if (r == 0) *ret_n = n;
    return r;
}

static int shard_gc(shard_t *sh, int64_t cutoff_us, int *ret_deleted)
{
    int deleted = 0, n = GC_BATCH, r = store_touch(sh);
    /* Batches keep each transaction (and the time the loop thread spends in it) short. */
    while (r == 0 && n == GC_BATCH) {
        blob_files_t files = {0};
        store_write_reset(sh);
        r = store_write_begin(sh, false);
        if (r < 0) break;
        r = store_write_end(sh, gc_batch(sh, cutoff_us, &files, &n));
        if (r == 0) {
            deleted += n;
            store_remove_unused(sh, &files);
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
