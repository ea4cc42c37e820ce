/* Where a tensor's bytes go: in its job's row, appended to the loop's active segment, in a
 * segment written whole by the thread that has the bytes (store_blob_pack), or in a blob file
 * of their own; and the checks a tensor passes before it is stored. */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

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
    if (!st->in_txn) store_files_settle(st);
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

/* The bytes of the tensors of n jobs that packable takes, and how many tensors (*ret_count). */
static uint64_t packable_bytes(uint64_t inline_blob_bytes, job_t *const *jobs, size_t n,
                               bool outputs, size_t *ret_count)
{
    uint64_t total = 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < OP_MAX_TENSORS; j++) {
            const job_tensor_t *t = packable(inline_blob_bytes, jobs[i], outputs, j);
            if (!t) continue;
            total += t->nbytes;
            count++;
        }
    *ret_count = count;
    return total;
}

int store_blob_pack(store_t *st, job_t *const *jobs, size_t n, bool outputs)
{
    size_t count;
    uint64_t total = packable_bytes(st->inline_blob_bytes, jobs, n, outputs, &count);
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

/* store_jobs_place_small for the jobs of one shard (in, an array of n), which go to its
 * segment. */
static int shard_place_small(shard_t *sh, job_t *const *jobs, size_t n, bool outputs)
{
    size_t count;
    uint64_t total = packable_bytes(sh->st->inline_blob_bytes, jobs, n, outputs, &count);
    if (sh->txn_row_bytes + total <= STORE_TXN_ROW_BYTES) return 0;
    int r = store_touch(sh);
    if (r < 0) return r;
    if (vec_grow((void **)&sh->placed, &sh->cap_placed, sh->n_placed + count, sizeof *sh->placed,
                 64) < 0)
        return 0; /* nothing placed: the writes place them as they go */
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

void store_written_remove(shard_t *sh, const written_files_t *w)
{
    for (int i = 0; i < w->n; i++)
        store_blob_file_remove(sh->conn.blobs_dir, w->files[i]);
}

/* Checks a tensor's descriptor, byte count and the source of its bytes. group and name make
 * the tensor's path for the message ("inputs", "x": inputs.x). */
int store_check_tensor(const char *owner_id, const char *group, const char *name,
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
int store_place_bytes(shard_t *sh, bool segments, const void *data, uint64_t nbytes,
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

/* Places job_id's tensor t (input or output slot, named name) and appends its record to
 * sh->cols; returns the tensor's new locator in *ret_blob (NULL for a buffer reference). */
int store_place_tensor(shard_t *sh, const char *job_id, bool output, int slot, const char *name,
                       const job_tensor_t *t, written_files_t *written, char **ret_blob)
{
    store_tensor_rec_t rec = {.slot = slot, .desc = t->desc, .nbytes = t->nbytes};
    store_copy_str(rec.name, sizeof rec.name, name);
    int r = 0;
    if (t->buffer_id[0]) {
        rec.where = STORE_IN_BUFFER;
        memcpy(rec.buffer_id, t->buffer_id, sizeof rec.buffer_id);
    } else {
        r = store_place_bytes(sh, true, t->data, t->nbytes, t->blob, written, &rec);
        if (r == 0 && rec.where == STORE_IN_FILE) r = store_refs_note(&sh->write_refs, rec.file, 1);
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
