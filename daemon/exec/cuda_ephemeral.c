/* Ephemeral buffers on the CUDA backend: an upload's bytes go from host memory through the
 * device's upload staging into device memory on the buffer's device, a chunk at a time with
 * two halves in flight, on the uploading thread; the copy is listed as a resident copy there
 * (counted against the device cap) before the buffer's row is stored. Launches use it as any
 * resident copy; none ever loads one from the store, which has no bytes of it. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "daemon/util/log.h"
#include "daemon/util/vec.h"

/* The pieces an upload is copied in: one is copied into half of the staging while the one
 * before goes to the device from the other half. */
#define EPHEMERAL_CHUNK ((size_t)8 << 20)

/* The worker of device, or NULL when the backend does not run it. */
static device_worker_t *worker_of(cuda_exec_t *ex, int device)
{
    for (int d = 0; d < ex->n_devices; d++)
        if (ex->devices[d].device == device) return &ex->devices[d];
    return NULL;
}

/* Counts nbytes against dw's cap as resident bytes; false when they do not fit (or the device
 * does not serve). */
static bool ephemeral_reserve(device_worker_t *dw, uint64_t nbytes)
{
    pthread_mutex_lock(&dw->ex->lock);
    bool fits = dw->state == DEVICE_READY && dw->in_use + dw->resident_bytes + nbytes <= dw->cap;
    if (fits) dw->resident_bytes += nbytes;
    pthread_mutex_unlock(&dw->ex->lock);
    return fits;
}

static void ephemeral_unreserve(device_worker_t *dw, uint64_t nbytes)
{
    pthread_mutex_lock(&dw->ex->lock);
    dw->resident_bytes -= nbytes;
    pthread_mutex_unlock(&dw->ex->lock);
}

/* A device's staging for ephemeral uploads: two pinned halves of EPHEMERAL_CHUNK, a stream
 * and an event per half, made by the first upload and kept to the device's teardown, since
 * giving pinned memory back waits for every kernel running on the device. Uploads to one
 * device take turns on it; they share its copy engine anyway. */
typedef struct upload_staging {
    pthread_mutex_t lock;
    char *pinned; /* NULL until the first upload */
    cudaStream_t stream;
    cudaEvent_t copied[2];
} upload_staging_t;

upload_staging_t *cuda_upload_staging_new(void)
{
    upload_staging_t *u = calloc(1, sizeof *u);
    if (u) pthread_mutex_init(&u->lock, NULL);
    return u;
}

/* After the device's work drained (its teardown), when nothing copies any more. */
void cuda_upload_staging_free(upload_staging_t *u)
{
    if (!u) return;
    for (int k = 0; k < 2; k++)
        if (u->copied[k]) cudaEventDestroy(u->copied[k]);
    if (u->stream) cudaStreamDestroy(u->stream);
    if (u->pinned) cudaFreeHost(u->pinned);
    cudaGetLastError();
    pthread_mutex_destroy(&u->lock);
    free(u);
}

/* Makes u's memory, stream and events the first time; its lock held, the device current. */
static cudaError_t staging_ready_locked(upload_staging_t *u)
{
    cudaError_t e = cudaSuccess;
    if (!u->stream) e = cudaStreamCreateWithFlags(&u->stream, cudaStreamNonBlocking);
    for (int k = 0; k < 2 && e == cudaSuccess; k++)
        if (!u->copied[k]) e = cudaEventCreateWithFlags(&u->copied[k], cudaEventDisableTiming);
    if (e == cudaSuccess && !u->pinned)
        e = cudaHostAlloc((void **)&u->pinned, 2 * EPHEMERAL_CHUNK, cudaHostAllocDefault);
    return e;
}

/* Copies nbytes from src (pageable host memory) to dptr through dw's upload staging, and waits
 * for the copies. The current device is dptr's. */
static cudaError_t copy_staged(device_worker_t *dw, void *dptr, const char *src, uint64_t nbytes)
{
    upload_staging_t *u = dw->upload;
    pthread_mutex_lock(&u->lock);
    cudaError_t e = staging_ready_locked(u);
    for (uint64_t off = 0; off < nbytes && e == cudaSuccess; off += EPHEMERAL_CHUNK) {
        int k = (int)(off / EPHEMERAL_CHUNK % 2);
        size_t n = nbytes - off < EPHEMERAL_CHUNK ? (size_t)(nbytes - off) : EPHEMERAL_CHUNK;
        if (off >= 2 * EPHEMERAL_CHUNK) e = cudaEventSynchronize(u->copied[k]); /* k is free */
        if (e != cudaSuccess) break;
        char *half = u->pinned + (size_t)k * EPHEMERAL_CHUNK;
        memcpy(half, src + off, n);
        e = cudaMemcpyAsync((char *)dptr + off, half, n, cudaMemcpyHostToDevice, u->stream);
        if (e == cudaSuccess) e = cudaEventRecord(u->copied[k], u->stream);
    }
    /* Whatever failed, nothing may still be copying out of staging for the next upload. */
    if (u->stream) {
        cudaError_t synced = cudaStreamSynchronize(u->stream);
        if (e == cudaSuccess) e = synced;
    }
    pthread_mutex_unlock(&u->lock);
    return e;
}

/* Lists res on dw; false when there is no memory to list it. */
static bool ephemeral_list(device_worker_t *dw, resident_t *res)
{
    pthread_mutex_lock(&dw->ex->lock);
    bool added = vec_grow((void **)&dw->residents, &dw->cap_residents, dw->n_residents + 1,
                          sizeof *dw->residents, 16) == 0;
    if (added) dw->residents[dw->n_residents++] = res;
    pthread_mutex_unlock(&dw->ex->lock);
    return added;
}

/* The device copy of host's nbytes in res->dptr; 0, -ENOSPC when device memory ran out, or
 * -EIO after another CUDA error (logged). */
static int ephemeral_copy(device_worker_t *dw, resident_t *res, const void *host)
{
    cudaError_t e = cudaSetDevice(dw->device);
    if (e == cudaSuccess) e = cuda_resident_malloc(dw, &res->dptr, res->nbytes);
    if (e == cudaSuccess) e = copy_staged(dw, res->dptr, host, res->nbytes);
    if (e == cudaSuccess) return 0;
    log_warn("gpu %d: ephemeral buffer %s not kept: %s", dw->device, res->id,
             cudaGetErrorString(e));
    cudaGetLastError();
    if (res->dptr) cudaFree(res->dptr);
    res->dptr = NULL;
    return e == cudaErrorMemoryAllocation ? -ENOSPC : -EIO;
}

int cuda_buffer_keep(executor_t *base, buffer_t *buf)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    void *host = buf->data;
    buf->data = NULL;
    device_worker_t *dw = worker_of(ex, buf->device);
    if (!dw || !ephemeral_reserve(dw, buf->nbytes)) {
        free(host);
        return -ENOSPC;
    }
    resident_t *res = calloc(1, sizeof *res);
    int r = res ? 0 : -ENOMEM;
    if (r == 0) {
        memcpy(res->id, buf->id, ID_SIZE);
        res->nbytes = buf->nbytes;
        int64_t started = cuda_now_ns();
        r = ephemeral_copy(dw, res, host);
        int64_t took = cuda_now_ns() - started;
        if (r == 0)
            log_info("gpu %d: ephemeral buffer %s kept, %" PRIu64 " bytes in %.1f ms (%.2f GB/s)",
                     dw->device, res->id, res->nbytes, (double)took / 1e6,
                     took ? (double)res->nbytes / (double)took : 0.0);
    }
    free(host);
    if (r == 0 && !ephemeral_list(dw, res)) {
        cudaFree(res->dptr);
        r = -ENOMEM;
    }
    if (r < 0) {
        free(res);
        ephemeral_unreserve(dw, buf->nbytes);
    }
    return r;
}
