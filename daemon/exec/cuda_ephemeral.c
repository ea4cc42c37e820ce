/* Ephemeral buffers on the CUDA backend: an upload's device memory is taken when it opens, and
 * its bytes go, as the request brings them, through pinned staging (two halves: one is copied
 * to the device asynchronously while the next fills) into that memory, on the uploading
 * thread; the body is never held whole in host memory. Once all of it is in, the copy is
 * listed as a resident copy on its device (counted against the device cap from the open on)
 * before the buffer's row is stored. Launches use it as any resident copy; none ever loads
 * one from the store, which has no bytes of it. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "daemon/util/log.h"
#include "daemon/util/vec.h"

/* The pieces an upload is copied in: one fills half of its staging while the one before goes
 * to the device from the other half. */
#define EPHEMERAL_CHUNK ((size_t)8 << 20)
/* Uploads to one device at a time, each with staging of its own: a bound on the pinned memory
 * (2 * EPHEMERAL_CHUNK each) that clients can make the daemon hold. */
#define STAGING_SETS 4

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

/* One upload's staging: two pinned halves of EPHEMERAL_CHUNK, a stream, and an event per half
 * recorded after its copy to the device. */
typedef struct staging_set {
    char *pinned; /* NULL until first used */
    cudaStream_t stream;
    cudaEvent_t copied[2];
} staging_set_t;

/* A device's staging for ephemeral uploads: STAGING_SETS sets, each made by the first upload
 * that needs it and kept to the device's teardown, since giving pinned memory back waits for
 * every kernel running on the device. */
typedef struct upload_staging {
    pthread_mutex_t lock;
    staging_set_t sets[STAGING_SETS];
    bool busy[STAGING_SETS];
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
    for (int i = 0; i < STAGING_SETS; i++) {
        staging_set_t *set = &u->sets[i];
        for (int k = 0; k < 2; k++)
            if (set->copied[k]) cudaEventDestroy(set->copied[k]);
        if (set->stream) cudaStreamDestroy(set->stream);
        if (set->pinned) cudaFreeHost(set->pinned);
    }
    cudaGetLastError();
    pthread_mutex_destroy(&u->lock);
    free(u);
}

/* Makes set's memory, stream and events where they are missing; the device current. */
static cudaError_t staging_set_ready(staging_set_t *set)
{
    cudaError_t e = cudaSuccess;
    if (!set->stream) e = cudaStreamCreateWithFlags(&set->stream, cudaStreamNonBlocking);
    for (int k = 0; k < 2 && e == cudaSuccess; k++)
        if (!set->copied[k]) e = cudaEventCreateWithFlags(&set->copied[k], cudaEventDisableTiming);
    if (e == cudaSuccess && !set->pinned)
        e = cudaHostAlloc((void **)&set->pinned, 2 * EPHEMERAL_CHUNK, cudaHostAllocDefault);
    return e;
}

/* A free staging set of u, made ready (one already made first); its index in *ret. 0, -EBUSY
 * when every set is in use, or -EIO when one could not be made (logged). The device is
 * current. */
static int staging_take(upload_staging_t *u, int *ret)
{
    int pick = -1;
    pthread_mutex_lock(&u->lock);
    for (int i = 0; i < STAGING_SETS; i++)
        if (!u->busy[i] && (pick < 0 || u->sets[i].pinned)) pick = i;
    if (pick >= 0) u->busy[pick] = true;
    pthread_mutex_unlock(&u->lock);
    if (pick < 0) return -EBUSY;
    cudaError_t e = staging_set_ready(&u->sets[pick]);
    if (e != cudaSuccess) {
        log_warn("ephemeral upload staging could not be made: %s", cudaGetErrorString(e));
        pthread_mutex_lock(&u->lock);
        u->busy[pick] = false;
        pthread_mutex_unlock(&u->lock);
        return -EIO;
    }
    *ret = pick;
    return 0;
}

static void staging_give(upload_staging_t *u, int i)
{
    pthread_mutex_lock(&u->lock);
    u->busy[i] = false;
    pthread_mutex_unlock(&u->lock);
}

/* An upload in progress: its device memory, its staging set, the half being filled. */
typedef struct cuda_upload {
    exec_upload_t base;
    device_worker_t *dw;
    resident_t *res; /* the copy to be: res->dptr holds all of its bytes */
    int set;         /* in dw->upload */
    int half;        /* the half being filled */
    size_t fill;     /* bytes in that half */
    bool in_flight[2];
    uint64_t sent; /* bytes queued to the device */
} cuda_upload_t;

static staging_set_t *upload_set(cuda_upload_t *u)
{
    return &u->dw->upload->sets[u->set];
}

/* Frees u, its staging set, device memory and reservation, after any copy of its staging has
 * ended. */
static void upload_free(cuda_upload_t *u)
{
    cudaSetDevice(u->dw->device);
    if (u->set >= 0) {
        cudaStreamSynchronize(upload_set(u)->stream);
        staging_give(u->dw->upload, u->set);
    }
    if (u->res->dptr) cudaFree(u->res->dptr);
    cudaGetLastError();
    ephemeral_unreserve(u->dw, u->base.nbytes);
    free(u->res);
    free(u);
}

int cuda_upload_open(executor_t *base, int device, uint64_t nbytes, exec_upload_t **ret)
{
    device_worker_t *dw = worker_of((cuda_exec_t *)base, device);
    if (!dw || !ephemeral_reserve(dw, nbytes)) return -ENOSPC;
    cuda_upload_t *u = calloc(1, sizeof *u);
    resident_t *res = calloc(1, sizeof *res);
    if (!u || !res) {
        free(u);
        free(res);
        ephemeral_unreserve(dw, nbytes);
        return -ENOMEM;
    }
    *u = (cuda_upload_t){
        .base = {.ex = base, .nbytes = nbytes, .device = device}, .dw = dw, .res = res, .set = -1};
    res->nbytes = nbytes;
    cudaError_t e = cudaSetDevice(device);
    int r = e == cudaSuccess ? staging_take(dw->upload, &u->set) : -EIO;
    if (r == 0) e = cuda_resident_malloc(dw, &res->dptr, nbytes);
    if (r == 0 && e != cudaSuccess) r = e == cudaErrorMemoryAllocation ? -ENOSPC : -EIO;
    if (r < 0) {
        if (e != cudaSuccess)
            log_warn("gpu %d: an ephemeral upload of %" PRIu64 " bytes cannot start: %s", device,
                     nbytes, cudaGetErrorString(e));
        upload_free(u);
        return r;
    }
    *ret = &u->base;
    return 0;
}

/* Queues the filled half to the device and moves on to the other one. */
static cudaError_t upload_flush(cuda_upload_t *u)
{
    staging_set_t *set = upload_set(u);
    cudaError_t e = cudaMemcpyAsync((char *)u->res->dptr + u->sent,
                                    set->pinned + (size_t)u->half * EPHEMERAL_CHUNK, u->fill,
                                    cudaMemcpyHostToDevice, set->stream);
    if (e == cudaSuccess) e = cudaEventRecord(set->copied[u->half], set->stream);
    if (e != cudaSuccess) return e;
    u->in_flight[u->half] = true;
    u->sent += u->fill;
    u->fill = 0;
    u->half ^= 1;
    return cudaSuccess;
}

int cuda_upload_write(exec_upload_t *up, const void *data, size_t n)
{
    cuda_upload_t *u = (cuda_upload_t *)up;
    staging_set_t *set = upload_set(u);
    const char *src = data;
    cudaError_t e = cudaSetDevice(u->dw->device);
    while (n && e == cudaSuccess) {
        if (u->in_flight[u->half]) { /* its last piece must be on the device before a refill */
            e = cudaEventSynchronize(set->copied[u->half]);
            if (e != cudaSuccess) break;
            u->in_flight[u->half] = false;
        }
        size_t take = EPHEMERAL_CHUNK - u->fill < n ? EPHEMERAL_CHUNK - u->fill : n;
        memcpy(set->pinned + (size_t)u->half * EPHEMERAL_CHUNK + u->fill, src, take);
        u->fill += take;
        src += take;
        n -= take;
        if (u->fill == EPHEMERAL_CHUNK) e = upload_flush(u);
    }
    if (e == cudaSuccess) return 0;
    log_warn("gpu %d: an ephemeral upload failed: %s", u->dw->device, cudaGetErrorString(e));
    cudaGetLastError();
    return -EIO;
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

int cuda_upload_keep(exec_upload_t *up, const char *id)
{
    cuda_upload_t *u = (cuda_upload_t *)up;
    cudaError_t e = cudaSetDevice(u->dw->device);
    if (e == cudaSuccess && u->fill) e = upload_flush(u);
    if (e == cudaSuccess) e = cudaStreamSynchronize(upload_set(u)->stream);
    if (e != cudaSuccess) {
        log_warn("gpu %d: ephemeral buffer %s not kept: %s", u->dw->device, id,
                 cudaGetErrorString(e));
        upload_free(u);
        return -EIO;
    }
    staging_give(u->dw->upload, u->set);
    u->set = -1;
    memcpy(u->res->id, id, ID_SIZE);
    if (!ephemeral_list(u->dw, u->res)) {
        upload_free(u);
        return -ENOMEM;
    }
    log_info("gpu %d: ephemeral buffer %s kept, %" PRIu64 " bytes", u->dw->device, id,
             u->base.nbytes);
    free(u);
    return 0;
}

void cuda_upload_abort(exec_upload_t *up)
{
    if (up) upload_free((cuda_upload_t *)up);
}
