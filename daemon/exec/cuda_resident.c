/* Resident buffers: a resident buffer is loaded into device memory (outside the batch pool,
 * counted against the device cap) as soon as it is stored, when its device's worker has
 * nothing to start, or else by the first launch that reads it; a launch on another device
 * that reads it keeps a copy there too. Launches pass its device pointer to the op and skip
 * the copy. A deleted buffer's copies are freed once no launch uses them. When it does not
 * fit, the launch copies it as any input. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "daemon/util/log.h"
#include "daemon/util/vec.h"
#include "exec_inputs.h"

/* The pieces a resident buffer's load goes in: one is read from the store (by several threads,
 * read_at) into half of the slot's staging while the one before copies to the device from the
 * other half. */
#define LOAD_CHUNK ((size_t)16 << 20)

/* Records that the slot's batch holds a reference on res. Caller holds the lock. */
static int slot_track_locked(slot_t *slot, resident_t *res)
{
    int r =
        vec_grow((void **)&slot->used, &slot->cap_used, slot->n_used + 1, sizeof *slot->used, 8);
    if (r < 0) return r;
    slot->used[slot->n_used++] = res;
    res->refs++;
    return 0;
}

static resident_t *find_resident_locked(const device_worker_t *dw, const char *id)
{
    for (size_t k = 0; k < dw->n_residents; k++)
        if (!dw->residents[k]->deleted && strcmp(dw->residents[k]->id, id) == 0)
            return dw->residents[k];
    return NULL;
}

bool cuda_resident_here_locked(const device_worker_t *dw, const char *id)
{
    return find_resident_locked(dw, id) != NULL;
}

/* The resident copy of buffer id on the slot's device, referenced by the slot; NULL when
 * there is none. */
static resident_t *resident_acquire(slot_t *slot, const char *id)
{
    device_worker_t *dw = slot->dw;
    pthread_mutex_lock(&dw->ex->lock);
    resident_t *found = find_resident_locked(dw, id);
    if (found && slot_track_locked(slot, found) < 0) found = NULL;
    pthread_mutex_unlock(&dw->ex->lock);
    return found;
}

/* Copies a buffer's stored bytes to dptr on the slot's stream (the slot is idle) and waits for
 * them. 0; -EIO after a CUDA error, in *ret_err; or the reader's or the host's errno. */
static int load_bytes(slot_t *slot, void *rd, const buffer_t *buf, void *dptr, cudaError_t *ret_err)
{
    const exec_blob_reader_t *blobs = &slot->ex->blobs;
    cudaError_t e = cudaSuccess;
    cudaEvent_t copied[2] = {NULL, NULL};
    size_t chunk = buf->nbytes < LOAD_CHUNK ? (size_t)buf->nbytes : LOAD_CHUNK;
    int r = cuda_slot_grow_pinned(slot, 2 * chunk);
    if (r == 0) {
        char *half[2] = {slot->pinned, (char *)slot->pinned + chunk};
        e = cudaEventCreateWithFlags(&copied[0], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&copied[1], cudaEventDisableTiming);
        for (uint64_t off = 0; off < buf->nbytes && e == cudaSuccess && r == 0; off += chunk) {
            int k = (int)(off / chunk % 2);
            size_t n = buf->nbytes - off < chunk ? (size_t)(buf->nbytes - off) : chunk;
            if (off >= 2 * chunk) e = cudaEventSynchronize(copied[k]); /* half k is free */
            if (e == cudaSuccess) r = blobs->read_at(rd, buf->blob, buf->nbytes, off, half[k], n);
            if (e == cudaSuccess && r == 0)
                e = cudaMemcpyAsync((char *)dptr + off, half[k], n, cudaMemcpyHostToDevice,
                                    slot->stream);
            if (e == cudaSuccess && r == 0) e = cudaEventRecord(copied[k], slot->stream);
        }
    }
    /* Whatever failed, nothing may still be copying out of staging once this returns. */
    cudaError_t synced = cudaStreamSynchronize(slot->stream);
    if (e == cudaSuccess) e = synced;
    for (int k = 0; k < 2; k++)
        if (copied[k]) cudaEventDestroy(copied[k]);
    *ret_err = e;
    return e != cudaSuccess ? -EIO : r;
}

/* Moves nbytes of the slot's reservation (at most all of it: *ret_moved says how much) to the
 * device's resident bytes, when the copy fits under the cap: the batch reserved room for these
 * bytes as an input to copy, and as a resident copy they are not counted twice. */
static bool resident_reserve(slot_t *slot, uint64_t nbytes, size_t *ret_moved)
{
    device_worker_t *dw = slot->dw;
    pthread_mutex_lock(&dw->ex->lock);
    size_t moved = nbytes < slot->reserved ? nbytes : slot->reserved;
    bool fits = dw->in_use - moved + dw->resident_bytes + nbytes <= dw->cap;
    if (fits) {
        slot->reserved -= moved;
        dw->in_use -= moved;
        dw->resident_bytes += nbytes;
    }
    pthread_mutex_unlock(&dw->ex->lock);
    *ret_moved = moved;
    return fits;
}

/* Device memory for a resident copy: memory the batch pool keeps for reuse may be in the way,
 * so it is given back once before a second try. */
cudaError_t cuda_resident_malloc(device_worker_t *dw, void **ret, uint64_t nbytes)
{
    cudaError_t e = cudaMalloc(ret, nbytes ? nbytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaMemPoolTrimTo(dw->pool, 0);
        e = cudaMalloc(ret, nbytes ? nbytes : 1);
    }
    return e;
}

/* Lists a copy that loaded on its device, referenced by the slot; true when it is listed.
 * Otherwise (it did not load, or there is no memory to list it) the reservation that
 * resident_reserve() moved goes back to the slot. */
static bool resident_settle(slot_t *slot, resident_t *res, bool loaded, size_t moved, int64_t took)
{
    device_worker_t *dw = slot->dw;
    pthread_mutex_lock(&dw->ex->lock);
    bool added = loaded &&
                 vec_grow((void **)&dw->residents, &dw->cap_residents, dw->n_residents + 1,
                          sizeof *dw->residents, 16) == 0 &&
                 slot_track_locked(slot, res) == 0;
    if (added) {
        dw->residents[dw->n_residents++] = res;
        dw->loaded_bytes += res->nbytes;
        dw->load_ns += took;
    } else {
        dw->resident_bytes -= res->nbytes;
        slot->reserved += moved;
        dw->in_use += moved;
    }
    pthread_mutex_unlock(&dw->ex->lock);
    return added;
}

/* Copies a resident buffer's bytes to the slot's device and keeps them there, referenced by
 * the slot. NULL when it does not fit under the cap or the copy fails (*ret_err says which
 * CUDA error, if one did): the launch then copies the bytes as for any input. */
static resident_t *resident_load(slot_t *slot, void *rd, const buffer_t *buf, cudaError_t *ret_err)
{
    *ret_err = cudaSuccess;
    device_worker_t *dw = slot->dw;
    resident_t *res = calloc(1, sizeof *res);
    if (!res) return NULL;
    snprintf(res->id, sizeof res->id, "%s", buf->id);
    res->nbytes = buf->nbytes;
    size_t moved;
    if (!resident_reserve(slot, res->nbytes, &moved)) {
        free(res);
        return NULL;
    }
    int64_t started = cuda_now_ns();
    cudaError_t e = cuda_resident_malloc(dw, &res->dptr, res->nbytes);
    int r = e == cudaSuccess ? load_bytes(slot, rd, buf, res->dptr, &e) : -EIO;
    int64_t took = cuda_now_ns() - started;
    if (!resident_settle(slot, res, r == 0, moved, took)) {
        if (e != cudaSuccess) {
            log_warn("gpu %d: buffer %s stays in host memory: %s", dw->device, buf->id,
                     cudaGetErrorString(e));
            cudaGetLastError();
            *ret_err = e;
        }
        if (res->dptr) cudaFree(res->dptr);
        free(res);
        return NULL;
    }
    log_info("gpu %d: buffer %s loaded, %" PRIu64 " bytes in %.1f ms (%.2f GB/s)", dw->device,
             buf->id, res->nbytes, (double)took / 1e6,
             took ? (double)res->nbytes / (double)took : 0.0);
    /* A delete that committed while the bytes were copied found nothing to mark: look again
     * now that the copy is listed, so that it cannot outlive its buffer. */
    buffer_t *still = NULL;
    if (slot->ex->blobs.buffer_get(rd, buf->id, &still) == -ENOENT) {
        pthread_mutex_lock(&dw->ex->lock);
        res->deleted = true;
        pthread_mutex_unlock(&dw->ex->lock);
    }
    buffer_free(still);
    return res;
}

void cuda_slot_release_residents_locked(slot_t *slot)
{
    for (size_t k = 0; k < slot->n_used; k++)
        slot->used[k]->refs--;
    slot->n_used = 0;
}

resident_t *cuda_take_unused_deleted_locked(device_worker_t *dw)
{
    for (size_t k = 0; k < dw->n_residents; k++) {
        resident_t *res = dw->residents[k];
        if (res->deleted && res->refs == 0) {
            dw->residents[k] = dw->residents[--dw->n_residents];
            dw->resident_bytes -= res->nbytes;
            return res;
        }
    }
    return NULL;
}

void cuda_residents_free(device_worker_t *dw)
{
    for (size_t k = 0; k < dw->n_residents; k++) {
        cudaFree(dw->residents[k]->dptr);
        free(dw->residents[k]);
    }
    free(dw->residents);
    free(dw->preloads);
}

/* The device pointer of its resident copy in *ret_dptr (loading it on first use), or its bytes
 * into t->data. */
int cuda_fetch_buffer_input(slot_t *slot, void *rd, job_tensor_t *t, const void **ret_dptr,
                            char *why, size_t why_size)
{
    resident_t *res = resident_acquire(slot, t->buffer_id);
    if (res) {
        *ret_dptr = res->dptr;
        return 0;
    }
    buffer_t *buf = NULL;
    int r = exec_input_buffer_get(&slot->ex->blobs, rd, t, &buf, why, why_size);
    if (r < 0) return r;
    /* Kept on whichever device runs a job that reads it: a job that reads buffers placed on
     * two devices would otherwise copy one of them from the host every time it runs. */
    /* An ephemeral buffer has no stored bytes to load: without its copy here, the job fails
     * (exec_input_take_buffer says why). */
    cudaError_t e;
    if (buf->resident && buf->durable && (res = resident_load(slot, rd, buf, &e)))
        *ret_dptr = res->dptr;
    else
        r = exec_input_take_buffer(&slot->ex->blobs, rd, t, buf, why, why_size);
    buffer_free(buf);
    return r;
}

cudaError_t cuda_preload(slot_t *slot, void *rd, const char *id)
{
    buffer_t *buf = NULL;
    if (slot->ex->blobs.buffer_get(rd, id, &buf) < 0) return cudaSuccess; /* deleted meanwhile */
    cudaError_t e;
    resident_t *res = resident_load(slot, rd, buf, &e);
    buffer_free(buf);
    if (!res) return e != cudaSuccess ? cuda_sticky_error() : cudaSuccess;
    pthread_mutex_lock(&slot->ex->lock);
    cuda_slot_release_residents_locked(slot); /* no launch holds it */
    pthread_mutex_unlock(&slot->ex->lock);
    return cudaSuccess;
}

/* The device with the most room left beside its resident buffers; among equals, the one
 * given the fewest buffers, so that a run of uploads spreads over the devices. */
int cuda_place_buffer(executor_t *base, uint64_t nbytes)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    device_worker_t *best = NULL;
    size_t best_room = 0;
    for (int d = 0; d < ex->n_devices; d++) {
        device_worker_t *dw = &ex->devices[d];
        size_t room = dw->cap > dw->resident_bytes ? dw->cap - dw->resident_bytes : 0;
        if (dw->state == DEVICE_FAILED || room < nbytes) continue;
        if (!best || room > best_room || (room == best_room && dw->placed < best->placed)) {
            best = dw;
            best_room = room;
        }
    }
    if (best) best->placed++;
    int device = best ? best->device : -1;
    pthread_mutex_unlock(&ex->lock);
    return device;
}

/* Queues the stored buffer for a load ahead of its first job on its device. */
void cuda_buffer_added(executor_t *base, const buffer_t *buf)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    if (!buf->durable) return; /* kept already, by cuda_upload_keep */
    pthread_mutex_lock(&ex->lock);
    for (int d = 0; d < ex->n_devices; d++) {
        device_worker_t *dw = &ex->devices[d];
        if (dw->device != buf->device || dw->state != DEVICE_READY) continue;
        if (vec_grow((void **)&dw->preloads, &dw->cap_preloads, dw->n_preloads + 1,
                     sizeof *dw->preloads, 8) < 0)
            break; /* its first job loads it */
        snprintf(dw->preloads[dw->n_preloads++], ID_SIZE, "%s", buf->id);
    }
    pthread_cond_broadcast(&ex->cond);
    pthread_mutex_unlock(&ex->lock);
}

/* Marks the buffer's copies deleted: their workers free them once no launch uses them. */
void cuda_buffer_deleted(executor_t *base, const char *id)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    for (int d = 0; d < ex->n_devices; d++)
        for (size_t k = 0; k < ex->devices[d].n_residents; k++)
            if (strcmp(ex->devices[d].residents[k]->id, id) == 0)
                ex->devices[d].residents[k]->deleted = true;
    pthread_cond_broadcast(&ex->cond);
    pthread_mutex_unlock(&ex->lock);
}
