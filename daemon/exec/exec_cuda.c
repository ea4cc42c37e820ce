/* The CUDA backend: one worker thread per GPU behind the executor interface.
 *
 * A worker owns its device: a few slots, each a CUDA stream with its own cuBLAS/cuBLASLt
 * handles and a pinned staging buffer, and the device's stream-ordered memory pool. A batch
 * runs on one slot as: inputs packed into pinned staging → one H2D copy → the op's run_cuda on
 * all n calls at once → one D2H copy of all outputs → an event, which the slot's waiter thread
 * blocks on. The waiter then unpacks the outputs, records the GPU time (CUDA events), frees the
 * slot and reports the batch, while the worker goes on launching. Several slots keep copies of
 * one batch overlapping compute of another. No thread spins: the worker sleeps on a condition
 * variable between events, and a waiter in the driver until its event is reached (a
 * blocking-sync event).
 *
 * Resident buffers: a resident buffer is loaded into device memory (outside the batch pool,
 * counted against the device cap) as soon as it is stored, when its device's worker has
 * nothing to start, or else by the first launch that reads it; a launch on another device
 * that reads it keeps a copy there too. Launches pass its device pointer to the op and skip
 * the copy. A deleted buffer's copies are freed once no launch uses them. When it does not
 * fit, the launch copies it as any input.
 *
 * Faults: a sticky error loses the device's context for the rest of the process; the worker
 * hands its batches back and the daemon restarts itself (recover, restart.h). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "executor.h"
#include "daemon/util/log.h"
#include "daemon/util/restart.h"

#define ALIGN 256
/* How stale the free-memory figure of /v1/info may get while the worker is busy. */
#define MEMORY_CHECK_NS (100 * 1000000L)

typedef enum device_state {
    DEVICE_READY,
    DEVICE_RESETTING, /* its context was lost: it takes no work until the daemon restarts */
    DEVICE_FAILED,    /* could not be set up: takes no work */
} device_state_t;

static const char *const device_state_names[] = {"ready", "resetting", "failed"};

typedef struct device_worker device_worker_t;
typedef struct slot slot_t;

/* A buffer kept in device memory. Guarded by the executor's lock; freed by its worker. */
typedef struct resident {
    char id[ID_SIZE];
    void *dptr;
    uint64_t nbytes;
    int refs;     /* launches using it now */
    bool deleted; /* gone from the store: free it when refs reach 0 */
} resident_t;

struct slot {
    device_worker_t *dw;
    /* The waiter's own copies: the worker's struct moves while the waiters start
     * (setup_devices). */
    struct cuda_exec *ex;
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasHandle_t blas;
    cudaEvent_t start, stop;
    cudaEvent_t done; /* recorded after a launch's last copy; blocking sync, no timing */
    pthread_t waiter;
    bool waiter_started;
    bool waiter_quit;
    bool waiter_in_sync; /* in cudaEventSynchronize, which may never return (a hung kernel) */
    pthread_cond_t wake; /* the waiter's: a new launch, or its end */
    void *pinned;        /* staging, grown on demand, reused across batches */
    size_t pinned_size;
    void *d_in, *d_out; /* device memory of the running batch, from the pool */
    size_t in_bytes, out_bytes;
    exec_batch_t *batch; /* NULL when free */
    bool exclusive;      /* the batch runs alone on the device (a re-run: see is_rerun) */
    resident_t **used;   /* resident buffers the running batch reads, each holding a ref */
    int n_used, cap_used;
    bool launched;   /* the batch's work is on the stream (events recorded) */
    bool finished;   /* to be completed: its done event was reached, or it failed or faulted */
    bool ran;        /* its done event was reached without an error: the outputs are in staging */
    bool completing; /* its waiter completes it and frees the slot: no one else touches it */
    unsigned launch; /* launches so far: the waiter waits for the done event of each */
    size_t reserved; /* bytes counted against the device cap */
};

struct device_worker {
    struct cuda_exec *ex;
    int device;
    char name[256];
    char uuid[64];
    int cc_major, cc_minor, sms;
    size_t mem_total;
    size_t cap;    /* bytes the pool may hand to batches */
    size_t in_use; /* reserved by running batches */
    cudaMemPool_t pool;
    pthread_t thread;
    int n_slots;
    slot_t *slots;
    exec_batch_t **queue; /* accepted, not yet on a slot */
    int q_head, q_len, q_cap;
    resident_t **residents;
    int n_residents, cap_residents;
    char (*preloads)[ID_SIZE]; /* resident buffers stored, to load ahead of their first job */
    int n_preloads, cap_preloads;
    bool preloading;       /* a load ahead of a job is being made: work in flight, as a batch is */
    size_t resident_bytes; /* counted against cap beside in_use */
    uint64_t loaded_bytes; /* resident buffers' bytes loaded so far, and the time it took */
    int64_t load_ns;
    unsigned placed; /* buffers placed here, to spread equal devices */
    device_state_t state;
    int resets; /* contexts lost, since the daemon was first started (restart.h) */
    bool thread_started;
    bool has_context; /* device_setup made the device current: there is something to tear down */
    int setup_rc;
    bool abandoned; /* work was left on the device: at the drain deadline, or by recover() */
    /* Written by the worker alone; read under the lock. */
    size_t mem_free;
    int64_t memory_checked_ns;
};

typedef struct cuda_exec {
    executor_t base;
    const config_t *cfg;
    pthread_mutex_t lock; /* guards every worker's queue, slots and flags */
    pthread_cond_t cond;  /* any change a worker may be waiting for */
    bool stopping;
    int64_t drain_deadline_ns; /* once stopping: when the workers give up on their work */
    int n_devices;
    device_worker_t *devices;
    /* Set by the first worker to see its context lost: a fault loses every device's context
     * (measured on two H200s), so the culprit is the launch that was alone in flight in the
     * whole process then, or none when there were several. */
    bool context_lost;
    cudaError_t lost_error; /* the error that lost it */
    const struct slot *culprit;
} cuda_exec_t;

static size_t align_up(size_t n)
{
    return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

static bool resident_here_locked(const device_worker_t *dw, const char *id);

/* Bytes of a batch's inputs and outputs, each tensor aligned. Resident inputs take no room:
 * those whose device pointer the launch has (in_ptrs[i * OP_MAX_TENSORS + j] set), or, before
 * the launch, those already resident on dw (the caller holds the lock). */
static void batch_sizes(const exec_batch_t *b, const void *const *in_ptrs,
                        const device_worker_t *dw, size_t *ret_in, size_t *ret_out)
{
    size_t in = 0, out = 0;
    for (int i = 0; i < b->n; i++) {
        const job_t *job = b->jobs[i];
        const op_call_t *c = &job->call;
        for (int j = 0; j < c->op->n_inputs; j++)
            if (c->has_in[j] && !(in_ptrs && in_ptrs[(size_t)i * OP_MAX_TENSORS + j]) &&
                !(dw && job->in[j].buffer_id[0] && resident_here_locked(dw, job->in[j].buffer_id)))
                in += align_up(tensor_desc_bytes(&c->in[j]));
        for (int j = 0; j < c->n_out; j++)
            out += align_up(tensor_desc_bytes(&c->out[j]));
    }
    *ret_in = in;
    *ret_out = out;
}

static void *pool_alloc(void *pool, size_t bytes)
{
    slot_t *slot = pool;
    void *p = NULL;
    if (cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, slot->dw->pool, slot->stream) !=
        cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void pool_free(void *pool, void *ptr)
{
    slot_t *slot = pool;
    if (ptr) cudaFreeAsync(ptr, slot->stream);
}

static cudaError_t complete(slot_t *slot);
static void slot_release_residents_locked(slot_t *slot);

/* Names the calling thread after its device (as top -H shows it) and makes the device
 * current for it. */
static void enter_device_thread(const char *name_format, int device)
{
    char name[16];
    snprintf(name, sizeof name, name_format, device);
    prctl(PR_SET_NAME, name);
    cudaSetDevice(device);
}

/* Reports a slot's batch, which complete() has dealt with, then frees the slot. Its device
 * memory and resident buffers go back first; the slot itself only after the report, which may
 * write large outputs to disk (the scheduler's done callback): a batch given to the slot
 * meanwhile would wait for them behind its waiter. Until then the slot's batch pointer, which
 * the report may free, is only compared with NULL. */
static void release_slot(slot_t *slot)
{
    cuda_exec_t *ex = slot->ex;
    pthread_mutex_lock(&ex->lock);
    slot_release_residents_locked(slot);
    slot->dw->in_use -= slot->reserved;
    slot->reserved = 0;
    slot->exclusive = false;
    pthread_cond_broadcast(&ex->cond); /* a batch may be waiting for the memory */
    pthread_mutex_unlock(&ex->lock);
    ex->base.done(slot->batch, ex->base.done_ud);
    pthread_mutex_lock(&ex->lock);
    slot->batch = NULL;
    slot->finished = slot->launched = slot->ran = slot->completing = false;
    /* The worker may have a batch for this slot, and another device's re-run may be waiting
     * for it to be free. */
    pthread_cond_broadcast(&ex->cond);
    pthread_mutex_unlock(&ex->lock);
}

/* A slot's waiter: sleeps in the driver until each launch's done event is reached, then
 * completes the batch and frees the slot itself, while the worker goes on launching. A fault
 * ends the wait with its error: the slot is then marked finished for the worker, which deals
 * with faults, as it does with a batch that ran once the device's context is lost. Measured on
 * the H200 for a tiny batch, from the launch to a thread that sees its end: 18 µs this way,
 * 36-66 µs through a host function on the stream (bench/RESULTS.md, session 7). */
static void *slot_waiter(void *arg)
{
    slot_t *slot = arg;
    cuda_exec_t *ex = slot->ex;
    enter_device_thread("gj-gpu%d-wait", slot->device);
    pthread_mutex_lock(&ex->lock);
    unsigned seen = 0; /* the slot's launches start at 1: the first may come before this runs */
    for (;;) {
        while (slot->launch == seen && !slot->waiter_quit)
            pthread_cond_wait(&slot->wake, &ex->lock);
        if (slot->waiter_quit) break;
        seen = slot->launch;
        if (!slot->batch) continue; /* handed back by recover() */
        slot->waiter_in_sync = true;
        pthread_mutex_unlock(&ex->lock);
        cudaError_t e = cudaEventSynchronize(slot->done);
        cudaGetLastError();
        pthread_mutex_lock(&ex->lock);
        slot->waiter_in_sync = false;
        if (slot->waiter_quit) break; /* left behind at the drain deadline */
        if (!slot->batch || slot->launch != seen) continue;
        slot->ran = e == cudaSuccess;
        if (!slot->ran || ex->context_lost) {
            slot->finished = true;
            pthread_cond_broadcast(&ex->cond);
            continue;
        }
        slot->completing = true;
        pthread_mutex_unlock(&ex->lock);
        complete(slot);
        release_slot(slot);
        pthread_mutex_lock(&ex->lock);
    }
    pthread_mutex_unlock(&ex->lock);
    return NULL;
}

/* Ends the device's waiters. One still in cudaEventSynchronize (a launch its worker left at the
 * drain deadline, or one recover() handed back) is left to the process's exit, and the device
 * counts as abandoned: cuda_destroy then keeps its slots and the executor, as the waiter, should
 * it wake, finds itself told to quit and touches nothing but its slot and the executor's lock. */
static void waiters_stop(device_worker_t *dw)
{
    pthread_mutex_lock(&dw->ex->lock);
    bool in_sync[dw->n_slots];
    for (int k = 0; k < dw->n_slots; k++) {
        dw->slots[k].waiter_quit = true;
        pthread_cond_signal(&dw->slots[k].wake);
        in_sync[k] = dw->slots[k].waiter_in_sync;
        dw->abandoned |= in_sync[k];
    }
    pthread_mutex_unlock(&dw->ex->lock);
    for (int k = 0; k < dw->n_slots; k++) {
        slot_t *s = &dw->slots[k];
        if (!s->waiter_started) continue;
        if (in_sync[k])
            pthread_detach(s->waiter);
        else
            pthread_join(s->waiter, NULL);
        s->waiter_started = false;
    }
}

static int grow_pinned(slot_t *slot, size_t bytes)
{
    if (slot->pinned_size >= bytes) return 0;
    cudaFreeHost(slot->pinned);
    slot->pinned = NULL;
    slot->pinned_size = 0;
    size_t size = bytes < (1 << 20) ? (1 << 20) : bytes + bytes / 4;
    if (cudaMallocHost(&slot->pinned, size) != cudaSuccess) {
        cudaGetLastError();
        return -ENOMEM;
    }
    slot->pinned_size = size;
    return 0;
}

static void fail_batch(exec_batch_t *b, const char *code, const char *message)
{
    for (int i = 0; i < b->n; i++)
        if (!b->jobs[i]->error_code[0]) job_set_error(b->jobs[i], code, "%s", message);
}

static void clear_errors(exec_batch_t *b)
{
    for (int i = 0; i < b->n; i++)
        b->jobs[i]->error_code[0] = b->jobs[i]->error_message[0] = '\0';
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The worker's look at the device's free memory, for /v1/info and /metrics. */
static void refresh_memory(device_worker_t *dw)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
    pthread_mutex_lock(&dw->ex->lock);
    dw->mem_free = free_b;
    dw->memory_checked_ns = now_ns();
    pthread_mutex_unlock(&dw->ex->lock);
}

/* ------------------------------------------------------------------ resident buffers */

static bool serves_device_locked(cuda_exec_t *ex, int device)
{
    for (int d = 0; d < ex->n_devices; d++)
        if (ex->devices[d].device == device && ex->devices[d].state != DEVICE_FAILED) return true;
    return false;
}

/* Records that the slot's batch holds a reference on res. Caller holds the lock. */
static int slot_track_locked(slot_t *slot, resident_t *res)
{
    if (slot->n_used == slot->cap_used) {
        int cap = slot->cap_used ? 2 * slot->cap_used : 8;
        resident_t **used = realloc(slot->used, (size_t)cap * sizeof *used);
        if (!used) return -ENOMEM;
        slot->used = used;
        slot->cap_used = cap;
    }
    slot->used[slot->n_used++] = res;
    res->refs++;
    return 0;
}

static resident_t *find_resident_locked(const device_worker_t *dw, const char *id)
{
    for (int k = 0; k < dw->n_residents; k++)
        if (!dw->residents[k]->deleted && strcmp(dw->residents[k]->id, id) == 0)
            return dw->residents[k];
    return NULL;
}

static bool resident_here_locked(const device_worker_t *dw, const char *id)
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

/* The pieces a resident buffer's load goes in: one is read from the store (by several threads,
 * store_blob_read_at) into half of the slot's staging while the one before copies to the
 * device from the other half. */
#define LOAD_CHUNK ((size_t)16 << 20)

/* Copies a buffer's stored bytes to dptr on the slot's stream (the slot is idle) and waits for
 * them. 0; -EIO after a CUDA error, in *ret_err; or the store's or the host's errno. */
static int load_bytes(slot_t *slot, store_reader_t *rd, const buffer_t *buf, void *dptr,
                      cudaError_t *ret_err)
{
    cudaError_t e = cudaSuccess;
    cudaEvent_t copied[2] = {NULL, NULL};
    size_t chunk = buf->nbytes < LOAD_CHUNK ? (size_t)buf->nbytes : LOAD_CHUNK;
    int r = grow_pinned(slot, 2 * chunk);
    if (r == 0) {
        char *half[2] = {slot->pinned, (char *)slot->pinned + chunk};
        e = cudaEventCreateWithFlags(&copied[0], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&copied[1], cudaEventDisableTiming);
        for (uint64_t off = 0; off < buf->nbytes && e == cudaSuccess && r == 0; off += chunk) {
            int k = (int)(off / chunk % 2);
            size_t n = buf->nbytes - off < chunk ? (size_t)(buf->nbytes - off) : chunk;
            if (off >= 2 * chunk) e = cudaEventSynchronize(copied[k]); /* half k is free */
            if (e == cudaSuccess)
                r = store_blob_read_at(rd, buf->blob, buf->nbytes, off, half[k], n);
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

/* Copies a resident buffer's bytes to the slot's device and keeps them there, referenced by
 * the slot. NULL when it does not fit under the cap or the copy fails (*ret_err says which
 * CUDA error, if one did): the launch then copies the bytes as for any input. */
static resident_t *resident_load(slot_t *slot, store_reader_t *rd, const buffer_t *buf,
                                 cudaError_t *ret_err)
{
    *ret_err = cudaSuccess;
    device_worker_t *dw = slot->dw;
    cuda_exec_t *ex = dw->ex;
    uint64_t nbytes = buf->nbytes;
    resident_t *res = calloc(1, sizeof *res);
    if (!res) return NULL;
    snprintf(res->id, sizeof res->id, "%s", buf->id);
    res->nbytes = nbytes;
    /* The batch reserved room for these bytes as an input to copy: as a resident copy they
     * move from its reservation to the resident bytes, not counted twice. */
    pthread_mutex_lock(&ex->lock);
    size_t moved = nbytes < slot->reserved ? nbytes : slot->reserved;
    bool fits = dw->in_use - moved + dw->resident_bytes + nbytes <= dw->cap;
    if (fits) {
        slot->reserved -= moved;
        dw->in_use -= moved;
        dw->resident_bytes += nbytes;
    }
    pthread_mutex_unlock(&ex->lock);
    if (!fits) {
        free(res);
        return NULL;
    }
    int64_t started = now_ns();
    cudaError_t e = cudaMalloc(&res->dptr, nbytes ? nbytes : 1);
    if (e != cudaSuccess) {
        /* Memory the batch pool keeps for reuse may be in the way: give it back, once. */
        cudaGetLastError();
        cudaMemPoolTrimTo(dw->pool, 0);
        e = cudaMalloc(&res->dptr, nbytes ? nbytes : 1);
    }
    int r = e == cudaSuccess ? load_bytes(slot, rd, buf, res->dptr, &e) : -EIO;
    int64_t took = now_ns() - started;
    bool added = false;
    pthread_mutex_lock(&ex->lock);
    if (r == 0 && dw->n_residents == dw->cap_residents) {
        int cap = dw->cap_residents ? 2 * dw->cap_residents : 16;
        resident_t **a = realloc(dw->residents, (size_t)cap * sizeof *a);
        if (a) {
            dw->residents = a;
            dw->cap_residents = cap;
        }
    }
    if (r == 0 && dw->n_residents < dw->cap_residents && slot_track_locked(slot, res) == 0) {
        dw->residents[dw->n_residents++] = res;
        dw->loaded_bytes += nbytes;
        dw->load_ns += took;
        added = true;
    } else {
        dw->resident_bytes -= nbytes;
        slot->reserved += moved;
        dw->in_use += moved;
    }
    pthread_mutex_unlock(&ex->lock);
    if (!added) {
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
             buf->id, nbytes, (double)took / 1e6, took ? (double)nbytes / (double)took : 0.0);
    /* A delete that committed while the bytes were copied found nothing to mark: look again
     * now that the copy is listed, so that it cannot outlive its buffer. */
    buffer_t *still = NULL;
    if (store_buffer_get(rd, buf->id, &still) == -ENOENT) {
        pthread_mutex_lock(&ex->lock);
        res->deleted = true;
        pthread_mutex_unlock(&ex->lock);
    }
    buffer_free(still);
    return res;
}

/* Drops the references the slot's batch held. Caller holds the lock. */
static void slot_release_residents_locked(slot_t *slot)
{
    for (int k = 0; k < slot->n_used; k++)
        slot->used[k]->refs--;
    slot->n_used = 0;
}

/* A deleted resident buffer no launch uses any more, unlisted; NULL when none. Caller holds
 * the lock; the caller frees its memory. */
static resident_t *take_unused_deleted_locked(device_worker_t *dw)
{
    for (int k = 0; k < dw->n_residents; k++) {
        resident_t *res = dw->residents[k];
        if (res->deleted && res->refs == 0) {
            dw->residents[k] = dw->residents[--dw->n_residents];
            dw->resident_bytes -= res->nbytes;
            return res;
        }
    }
    return NULL;
}

/* Brings a buffer input's bytes where the launch can use them: the device pointer of its
 * resident copy in *ret_dptr (loading it on first use), or its bytes into t->data. */
static int fetch_buffer_input(slot_t *slot, store_reader_t *rd, job_tensor_t *t,
                              const void **ret_dptr)
{
    resident_t *res = resident_acquire(slot, t->buffer_id);
    if (res) {
        *ret_dptr = res->dptr;
        return 0;
    }
    buffer_t *buf = NULL;
    int r = store_buffer_get(rd, t->buffer_id, &buf);
    if (r < 0) return r;
    /* Kept on whichever device runs a job that reads it: a job that reads buffers placed on
     * two devices would otherwise copy one of them from the host every time it runs. */
    cudaError_t e;
    if (buf->resident && (res = resident_load(slot, rd, buf, &e)))
        *ret_dptr = res->dptr;
    else
        r = store_blob_read(rd, buf->blob, buf->nbytes, &t->data);
    buffer_free(buf);
    return r;
}

/* Queues a batch on a free slot. Returns 0 when the work is on the stream (the slot's waiter
 * completes it), or a negative errno after failing the batch's jobs: -EIO when a
 * CUDA call failed (which a lost context explains), another errno when the host did. */
static int launch(slot_t *slot, exec_batch_t *b, store_reader_t *rd)
{
    device_worker_t *dw = slot->dw;
    char why[ERROR_MESSAGE_SIZE];
    const op_call_t **calls = calloc((size_t)b->n, sizeof *calls);
    const void **in_ptrs = calloc((size_t)b->n * OP_MAX_TENSORS, sizeof *in_ptrs);
    void **out_ptrs = calloc((size_t)b->n * OP_MAX_TENSORS, sizeof *out_ptrs);
    const void *const **ins = calloc((size_t)b->n, sizeof *ins);
    void *const **outs = calloc((size_t)b->n, sizeof *outs);
    int r = 0;
    if (!calls || !in_ptrs || !out_ptrs || !ins || !outs) {
        r = -ENOMEM;
        fail_batch(b, "out_of_memory", "no host memory for the launch");
        goto out;
    }
    cudaSetDevice(dw->device);
    for (int i = 0; i < b->n && r == 0; i++) {
        job_t *job = b->jobs[i];
        job->run_device = dw->device;
        job->batch_size = b->n;
        for (int j = 0; j < job->call.op->n_inputs && r == 0; j++) {
            job_tensor_t *t = &job->in[j];
            if (!job->call.has_in[j] || t->data) continue;
            r = -ENOENT;
            if (t->buffer_id[0])
                r = fetch_buffer_input(slot, rd, t, &in_ptrs[(size_t)i * OP_MAX_TENSORS + j]);
            else if (t->blob)
                r = store_blob_read(rd, t->blob, t->nbytes, &t->data);
            if (r < 0) {
                snprintf(why, sizeof why, "input '%s' could not be read", t->name);
                fail_batch(b, "input_unavailable", why);
            }
        }
    }
    if (r < 0) {
        r = -ENODATA;
        goto out;
    }

    if (!b->jobs[0]->call.op->run_cuda) {
        fail_batch(b, "unsupported", "this op has no CUDA implementation in this build");
        r = -EOPNOTSUPP;
        goto out;
    }
    size_t in_bytes, out_bytes;
    batch_sizes(b, in_ptrs, NULL, &in_bytes, &out_bytes);
    if (grow_pinned(slot, in_bytes > out_bytes ? in_bytes : out_bytes) < 0) {
        fail_batch(b, "out_of_memory", "no pinned host memory for staging");
        r = -EIO;
        goto out;
    }
    slot->d_in = pool_alloc(slot, in_bytes);
    slot->d_out = pool_alloc(slot, out_bytes);
    if (!slot->d_in || !slot->d_out) {
        pool_free(slot, slot->d_in);
        pool_free(slot, slot->d_out);
        slot->d_in = slot->d_out = NULL;
        fail_batch(b, "out_of_memory", "the device memory pool is exhausted");
        r = -EIO;
        goto out;
    }
    slot->in_bytes = in_bytes;
    slot->out_bytes = out_bytes;

    /* Pack inputs (resident ones already have their pointers), and lay out device pointers
     * for every call. */
    size_t in_off = 0, out_off = 0;
    for (int i = 0; i < b->n; i++) {
        job_t *job = b->jobs[i];
        calls[i] = &job->call;
        ins[i] = in_ptrs + (size_t)i * OP_MAX_TENSORS;
        outs[i] = out_ptrs + (size_t)i * OP_MAX_TENSORS;
        for (int j = 0; j < job->call.op->n_inputs; j++) {
            if (!job->call.has_in[j] || in_ptrs[(size_t)i * OP_MAX_TENSORS + j]) continue;
            memcpy((char *)slot->pinned + in_off, job->in[j].data, job->in[j].nbytes);
            in_ptrs[(size_t)i * OP_MAX_TENSORS + j] = (char *)slot->d_in + in_off;
            in_off += align_up(job->in[j].nbytes);
        }
        for (int j = 0; j < job->call.n_out; j++) {
            out_ptrs[(size_t)i * OP_MAX_TENSORS + j] = (char *)slot->d_out + out_off;
            out_off += align_up(tensor_desc_bytes(&job->call.out[j]));
        }
    }
    cudaError_t e =
        cudaMemcpyAsync(slot->d_in, slot->pinned, in_bytes, cudaMemcpyHostToDevice, slot->stream);
    cudaEventRecord(slot->start, slot->stream);
    op_cuda_ctx_t ctx = {
        .stream = slot->stream,
        .blaslt = slot->lt,
        .blas = slot->blas,
        .device = dw->device,
        .scratch_alloc = pool_alloc,
        .scratch_free = pool_free,
        .pool = slot,
    };
    op_error_t err = {0};
    if (e == cudaSuccess && calls[0]->op->run_cuda(&ctx, b->n, calls, ins, outs, &err) < 0) {
        r = -EIO;
        fail_batch(b, "op_failed", err.message);
    }
    cudaEventRecord(slot->stop, slot->stream);
    if (r == 0 && e == cudaSuccess)
        e = cudaMemcpyAsync(slot->pinned, slot->d_out, out_bytes, cudaMemcpyDeviceToHost,
                            slot->stream);
    /* Only a whole launch is the waiter's to end: the worker ends a failed one itself, and
     * a late wake-up of the waiter could then end the slot's next batch. */
    if (r == 0 && e == cudaSuccess) e = cudaEventRecord(slot->done, slot->stream);
    if (r == 0 && e == cudaSuccess) {
        pthread_mutex_lock(&dw->ex->lock);
        slot->launched = true;
        slot->launch++;
        pthread_cond_signal(&slot->wake);
        pthread_mutex_unlock(&dw->ex->lock);
    }
    if (e != cudaSuccess) {
        snprintf(why, sizeof why, "CUDA: %s", cudaGetErrorString(e));
        fail_batch(b, "cuda_error", why);
        cudaGetLastError();
        r = -EIO;
    }
    if (r < 0) {
        /* Let whatever was queued drain before the memory goes back to the pool. */
        cudaStreamSynchronize(slot->stream);
        cudaGetLastError();
        pool_free(slot, slot->d_in);
        pool_free(slot, slot->d_out);
        slot->d_in = slot->d_out = NULL;
    }
out:
    free(calls);
    free(in_ptrs);
    free(out_ptrs);
    free(ins);
    free(outs);
    return r;
}

/* After the stream finished: outputs out of staging, GPU time shared by cost, memory back.
 * Returns the stream's error, after failing the batch with it; cudaSuccess for a batch that
 * ran (its done event was reached: all its work did), or that failed before its launch. */
static cudaError_t complete(slot_t *slot)
{
    exec_batch_t *b = slot->batch;
    float ms = 0;
    cudaError_t e = cudaSuccess;
    if (slot->launched && !slot->ran) {
        e = cudaStreamQuery(slot->stream);
        if (e == cudaErrorNotReady) e = cudaSuccess;
    }
    /* A batch that failed before its launch has no events of its own: no GPU time; nor has
     * one whose context was lost after it ran. */
    if (slot->launched && e == cudaSuccess &&
        cudaEventElapsedTime(&ms, slot->start, slot->stop) != cudaSuccess) {
        ms = 0;
        cudaGetLastError();
    }
    if (e != cudaSuccess) {
        char why[ERROR_MESSAGE_SIZE];
        snprintf(why, sizeof why, "CUDA: %s", cudaGetErrorString(e));
        fail_batch(b, "cuda_error", why);
        cudaGetLastError();
    }
    double total_cost = 0;
    for (int i = 0; i < b->n; i++)
        total_cost += b->jobs[i]->call.cost.bytes + b->jobs[i]->call.cost.flops + 1;
    size_t out_off = 0;
    for (int i = 0; i < b->n; i++) {
        job_t *job = b->jobs[i];
        const op_call_t *c = &job->call;
        job->gpu_ns = (int64_t)(ms * 1e6 * (c->cost.bytes + c->cost.flops + 1) / total_cost);
        if (!job->error_code[0]) job_describe_outputs(job);
        for (int j = 0; j < c->n_out; j++) {
            job_tensor_t *t = &job->out[j];
            uint64_t nbytes = tensor_desc_bytes(&c->out[j]);
            if (!job->error_code[0]) {
                t->data = malloc(nbytes ? nbytes : 1);
                if (t->data)
                    memcpy(t->data, (char *)slot->pinned + out_off, nbytes);
                else
                    job_set_error(job, "out_of_memory", "no host memory for output '%s'", t->name);
            }
            out_off += align_up(nbytes);
        }
    }
    pool_free(slot, slot->d_in);
    pool_free(slot, slot->d_out);
    slot->d_in = slot->d_out = NULL;
    return e;
}

/* After a failed CUDA call: the error that lost the device's context (a sticky one, which every
 * later call returns too), or cudaSuccess when the device still works. */
static cudaError_t sticky_error(void)
{
    cudaGetLastError();
    cudaError_t e = cudaDeviceSynchronize();
    cudaGetLastError();
    return e;
}

/* Logs which step of device_setup failed, and why. */
static int setup_failed(const device_worker_t *dw, const char *step, const char *why)
{
    log_error("gpu %d: %s failed: %s", dw->device, step, why);
    return -ENODEV;
}

/* The slots' streams, events, cuBLAS handles and staging; and the device's pool. */
static int device_setup(device_worker_t *dw)
{
    cudaError_t e = cudaSetDevice(dw->device);
    dw->has_context = e == cudaSuccess;
    if (e != cudaSuccess || (e = cudaDeviceGetDefaultMemPool(&dw->pool, dw->device)) != cudaSuccess)
        return setup_failed(dw, "selecting the device and its pool", cudaGetErrorString(e));
    /* Keep freed memory in the pool up to the cap instead of returning it at every sync. */
    uint64_t threshold = dw->cap;
    cudaMemPoolSetAttribute(dw->pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    for (int k = 0; k < dw->n_slots; k++) {
        slot_t *s = &dw->slots[k];
        cublasStatus_t b;
        if ((e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess ||
            (e = cudaEventCreate(&s->start)) != cudaSuccess ||
            (e = cudaEventCreate(&s->stop)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming |
                                                        cudaEventBlockingSync)) != cudaSuccess)
            return setup_failed(dw, "creating a stream and its events", cudaGetErrorString(e));
        if ((b = cublasLtCreate(&s->lt)) != CUBLAS_STATUS_SUCCESS ||
            (b = cublasCreate(&s->blas)) != CUBLAS_STATUS_SUCCESS ||
            (b = cublasSetStream(s->blas, s->stream)) != CUBLAS_STATUS_SUCCESS)
            return setup_failed(dw, "creating the cuBLAS handles", cublasGetStatusString(b));
        int r = pthread_create(&s->waiter, NULL, slot_waiter, s);
        if (r != 0) return setup_failed(dw, "starting a stream's waiter thread", strerror(r));
        s->waiter_started = true;
    }
    return 0;
}

/* A batch run before, interrupted by a lost context (or a daemon restart). It runs alone in the
 * process, on whichever device: should it fault again, it is then known to be the culprit and
 * fails, and should it be innocent, it cannot be interrupted by another culprit again. */
static bool is_rerun(const exec_batch_t *b)
{
    for (int i = 0; i < b->n; i++)
        if (b->jobs[i]->attempts > 1) return true;
    return false;
}

/* Undoes device_setup: after the work drained, or on a lost context, where the calls fail
 * harmlessly before the reset. */
static void device_teardown(device_worker_t *dw)
{
    if (!dw->has_context) return;
    cudaSetDevice(dw->device);
    for (int k = 0; k < dw->n_slots; k++) {
        slot_t *s = &dw->slots[k];
        if (s->stream) cudaStreamSynchronize(s->stream);
        if (s->blas) cublasDestroy(s->blas);
        if (s->lt) cublasLtDestroy(s->lt);
        if (s->start) cudaEventDestroy(s->start);
        if (s->stop) cudaEventDestroy(s->stop);
        if (s->done) cudaEventDestroy(s->done);
        if (s->stream) cudaStreamDestroy(s->stream);
        if (s->pinned) cudaFreeHost(s->pinned);
        s->blas = NULL;
        s->lt = NULL;
        s->start = s->stop = s->done = NULL;
        s->stream = NULL;
        s->pinned = NULL;
        s->pinned_size = 0;
    }
    cudaGetLastError();
}

/* The first lost context of the process: the launch alone in flight then, on any device, is
 * the culprit; with several in flight none can be told apart. A launch still being made counts
 * as in flight: its kernels may have started. */
static void find_culprit_locked(cuda_exec_t *ex, cudaError_t why)
{
    if (ex->context_lost) return;
    ex->context_lost = true;
    ex->lost_error = why;
    int in_flight = 0;
    for (int d = 0; d < ex->n_devices; d++)
        for (int k = 0; k < ex->devices[d].n_slots; k++) {
            const slot_t *s = &ex->devices[d].slots[k];
            bool failed_before_launch = s->finished && !s->launched;
            if (s->batch && !failed_before_launch && !s->ran) {
                ex->culprit = s;
                in_flight++;
            }
        }
    if (in_flight != 1) ex->culprit = NULL;
}

/* A sticky error lost the device's context, for good: no call of this process can use the
 * device again (restart.h). Every batch the worker holds goes back to the scheduler: those whose
 * work had finished with their outputs; the culprit's jobs fail with the error when it was the
 * only launch in flight (else no launch can be told apart, and each runs again while attempts
 * remain, alone in the process: is_rerun); batches not yet launched run again. The
 * device takes no more work, /readyz and /v1/info show it resetting, and the daemon is asked to
 * drain and restart, which gets the device back. The other devices' workers find their
 * contexts lost too, and hand their batches back the same way. */
static void recover(device_worker_t *dw, cudaError_t why)
{
    cuda_exec_t *ex = dw->ex;
    char msg[ERROR_MESSAGE_SIZE];
    snprintf(msg, sizeof msg, "CUDA: %s; the daemon restarted to reset the device",
             cudaGetErrorString(why));
    log_error("gpu %d: %s: the device's context is lost", dw->device, cudaGetErrorString(why));
    exec_batch_t *back[dw->n_slots + dw->q_cap];
    int n_back = 0;

    /* A batch whose done event was reached did all its work: its outputs are in staging. One
     * its waiter is completing is the waiter's to report. */
    bool ran[dw->n_slots];
    pthread_mutex_lock(&ex->lock);
    dw->state = DEVICE_RESETTING;
    find_culprit_locked(ex, why);
    for (int k = 0; k < dw->n_slots; k++)
        ran[k] = dw->slots[k].batch && dw->slots[k].ran && !dw->slots[k].completing;
    pthread_mutex_unlock(&ex->lock);
    for (int k = 0; k < dw->n_slots; k++)
        if (ran[k]) complete(&dw->slots[k]);

    pthread_mutex_lock(&ex->lock);
    for (int k = 0; k < dw->n_slots; k++) {
        slot_t *s = &dw->slots[k];
        if (!s->batch || s->completing) continue;
        /* A batch that failed before its launch keeps its own error. */
        const char *fate = ran[k] ? "had finished" : "had failed before its launch";
        if (!ran[k] && s->launched) {
            if (s == ex->culprit) {
                fail_batch(s->batch, "cuda_error", msg);
                fate = "caused the fault and fails";
            } else {
                /* Not the fault of its own: the error complete() read off its stream goes,
                 * so that a job out of attempts ends as reset, not as the culprit's error. */
                clear_errors(s->batch);
                fail_batch(s->batch, "device_reset", msg);
                s->batch->retry = EXEC_RETRY_INTERRUPTED;
                fate = "was interrupted and runs again alone";
            }
        }
        log_info("gpu %d: the batch of %d %s job(s) on stream %d %s", dw->device, s->batch->n,
                 s->batch->jobs[0]->call.op->name, k, fate);
        back[n_back++] = s->batch;
        s->batch = NULL;
        s->finished = s->launched = s->ran = s->exclusive = false;
        dw->in_use -= s->reserved;
        s->reserved = 0;
        s->n_used = 0;
    }
    for (; dw->q_len > 0; dw->q_len--) {
        back[n_back] = dw->queue[dw->q_head];
        back[n_back++]->retry = EXEC_RETRY_UNSTARTED;
        dw->q_head = (dw->q_head + 1) % dw->q_cap;
    }
    dw->resets++;
    pthread_cond_broadcast(&ex->cond); /* its slots are free: waiting re-runs look again */
    pthread_mutex_unlock(&ex->lock);
    for (int i = 0; i < n_back; i++)
        ex->base.done(back[i], ex->base.done_ud);
    /* After the batches: the scheduler records them before it drains. */
    restart_request(dw->device);
}

/* Waits on ex->cond (whose lock the caller holds) for at most wait_ns. */
static void wait_locked(cuda_exec_t *ex, int64_t wait_ns)
{
    if (wait_ns <= 0) return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += wait_ns / 1000000000;
    until.tv_nsec += wait_ns % 1000000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&ex->cond, &ex->lock, &until);
}

/* Loads a resident buffer ahead of its first job, on the idle slot. Nothing is lost when it
 * cannot (a job then loads or copies it); returns the context's error when that is lost. */
static cudaError_t preload(slot_t *slot, store_reader_t *rd, const char *id)
{
    buffer_t *buf = NULL;
    if (store_buffer_get(rd, id, &buf) < 0) return cudaSuccess; /* deleted meanwhile */
    cudaError_t e;
    resident_t *res = resident_load(slot, rd, buf, &e);
    buffer_free(buf);
    if (!res) return e != cudaSuccess ? sticky_error() : cudaSuccess;
    pthread_mutex_lock(&slot->dw->ex->lock);
    slot_release_residents_locked(slot); /* no launch holds it */
    pthread_mutex_unlock(&slot->dw->ex->lock);
    return cudaSuccess;
}

static void *device_thread(void *arg)
{
    device_worker_t *dw = arg;
    cuda_exec_t *ex = dw->ex;
    enter_device_thread("gj-gpu%d", dw->device);
    store_reader_t *rd = NULL;
    if (store_reader_open(ex->cfg, &rd) < 0)
        log_error("gpu %d: cannot open a store reader", dw->device);

    pthread_mutex_lock(&ex->lock);
    for (;;) {
        if (now_ns() - dw->memory_checked_ns > MEMORY_CHECK_NS) {
            pthread_mutex_unlock(&ex->lock);
            refresh_memory(dw);
            pthread_mutex_lock(&ex->lock);
        }
        slot_t *free_slot = NULL;
        int running = 0, running_anywhere = 0;
        bool exclusive = false;     /* a re-run holds the process's devices */
        bool rerun_waiting = false; /* one waits for them: nothing else starts meanwhile */
        for (int k = 0; k < dw->n_slots; k++) {
            slot_t *s = &dw->slots[k];
            if (!s->batch && !free_slot) free_slot = s;
            running += s->batch != NULL;
        }
        for (int d = 0; d < ex->n_devices; d++) {
            const device_worker_t *other = &ex->devices[d];
            for (int k = 0; k < other->n_slots; k++) {
                const slot_t *s = &other->slots[k];
                running_anywhere += s->batch != NULL;
                exclusive |= s->batch && s->exclusive;
            }
            running_anywhere += other->preloading; /* a re-run must wait for it too */
            rerun_waiting |=
                other != dw && other->q_len > 0 && is_rerun(other->queue[other->q_head]);
        }
        /* Past the drain deadline nothing more starts, and nothing more is waited for: the
         * jobs of batches left queued or running stay running in the store and run again after
         * the next start (the scheduler's loop has ended; no one would record their end). */
        if (ex->stopping && (dw->q_len > 0 || running > 0) && now_ns() >= ex->drain_deadline_ns) {
            log_warn("gpu %d: drain timeout: %d queued and %d running batches are left to the "
                     "next start",
                     dw->device, dw->q_len, running);
            dw->abandoned = running > 0;
            pthread_cond_broadcast(&ex->cond); /* the others look at the deadline too */
            break;
        }
        /* Another device's fault lost this one's context too: nothing more starts here (it
         * would run on a dead context and count as in flight), its batches go back now. */
        if (ex->context_lost && dw->state == DEVICE_READY) {
            cudaError_t why = ex->lost_error;
            pthread_mutex_unlock(&ex->lock);
            recover(dw, why);
            pthread_mutex_lock(&ex->lock);
            continue;
        }
        /* cudaFree waits for the whole device: deleted copies go while nothing runs. */
        resident_t *unused = running == 0 ? take_unused_deleted_locked(dw) : NULL;
        if (unused) {
            pthread_mutex_unlock(&ex->lock);
            cudaFree(unused->dptr);
            free(unused);
            pthread_mutex_lock(&ex->lock);
            continue;
        }
        /* Finished slots first: they free memory and slots for the queue. */
        slot_t *done = NULL;
        for (int k = 0; k < dw->n_slots && !done; k++)
            if (dw->slots[k].batch && dw->slots[k].finished) done = &dw->slots[k];
        if (done) {
            pthread_mutex_unlock(&ex->lock);
            cudaError_t e = complete(done);
            if (e != cudaSuccess && sticky_error() != cudaSuccess)
                recover(dw, e);
            else
                release_slot(done);
            pthread_mutex_lock(&ex->lock);
            continue;
        }
        /* With nothing running or queued here, a slot loads a resident buffer just stored (a
         * load holds this thread: no completion may be waiting behind it). */
        if (dw->n_preloads > 0 && running == 0 && dw->q_len == 0 && !exclusive && !rerun_waiting &&
            !ex->stopping && !ex->context_lost && dw->state == DEVICE_READY && rd) {
            char id[ID_SIZE];
            memcpy(id, dw->preloads[--dw->n_preloads], sizeof id);
            bool here = resident_here_locked(dw, id);
            dw->preloading = !here;
            pthread_mutex_unlock(&ex->lock);
            cudaError_t lost = here ? cudaSuccess : preload(&dw->slots[0], rd, id);
            pthread_mutex_lock(&ex->lock);
            dw->preloading = false;
            pthread_cond_broadcast(&ex->cond); /* a re-run may wait for it */
            if (lost != cudaSuccess) {
                pthread_mutex_unlock(&ex->lock);
                recover(dw, lost);
                pthread_mutex_lock(&ex->lock);
            }
            continue;
        }
        /* The queue's head starts when a slot is free and no re-run holds the devices, unless
         * it is a re-run and others run on any device, or another device's re-run waits for
         * the devices to empty, or it needs memory that running batches hold: then it waits
         * below, like any worker with batches in flight (freeing a slot on any device wakes
         * every worker). */
        exec_batch_t *b = free_slot && dw->q_len > 0 && !exclusive ? dw->queue[dw->q_head] : NULL;
        bool rerun = b && is_rerun(b);
        size_t in_bytes = 0, out_bytes = 0;
        if (b) batch_sizes(b, NULL, dw, &in_bytes, &out_bytes);
        size_t need = in_bytes + out_bytes;
        bool too_big = need > dw->cap;
        if (b && ((rerun && running_anywhere > 0) || (!rerun && rerun_waiting) ||
                  (!too_big && dw->in_use + dw->resident_bytes + need > dw->cap && dw->in_use > 0)))
            b = NULL;
        if (b) {
            dw->q_head = (dw->q_head + 1) % dw->q_cap;
            dw->q_len--;
            free_slot->batch = b;
            free_slot->exclusive = rerun;
            free_slot->finished = free_slot->ran = false;
            free_slot->reserved = too_big ? 0 : need;
            dw->in_use += free_slot->reserved;
            pthread_mutex_unlock(&ex->lock);
            int r;
            cudaError_t lost = cudaSuccess;
            if (too_big) {
                fail_batch(b, "exceeds_device_memory",
                           "the job needs more device memory than the configured cap");
                r = -E2BIG;
            } else if (!rd) {
                fail_batch(b, "store_failed", "the device worker cannot read the store");
                r = -EIO;
            } else {
                r = launch(free_slot, b, rd);
                /* A launch that failed on a context lost earlier (its fault not seen yet) or
                 * by its own doing is part of the fault, not a failure of its jobs. */
                if (r == -EIO) lost = sticky_error();
            }
            pthread_mutex_lock(&ex->lock);
            /* A whole launch (r == 0) is its waiter's now: the slot is not touched here. One
             * that failed on a lost context counts as launched: its kernels may have run. */
            if (lost != cudaSuccess) {
                free_slot->launched = true;
                pthread_mutex_unlock(&ex->lock);
                clear_errors(b);
                recover(dw, lost);
                pthread_mutex_lock(&ex->lock);
                continue;
            }
            if (r < 0) free_slot->finished = true; /* report it through the same path */
            continue;
        }
        if (ex->stopping && dw->q_len == 0 && running == 0) break;
        /* Draining, a worker looks again at the deadline even if no one wakes it (its batches
         * may never end, and one holding its queue back for another device's re-run is not
         * woken by its own). */
        if (ex->stopping)
            wait_locked(ex, ex->drain_deadline_ns - now_ns());
        else if (running > 0) /* keeps the free memory of /v1/info fresh while it runs */
            wait_locked(ex, dw->memory_checked_ns + MEMORY_CHECK_NS - now_ns());
        else
            pthread_cond_wait(&ex->cond, &ex->lock);
    }
    pthread_mutex_unlock(&ex->lock);
    waiters_stop(dw);
    store_reader_close(rd);
    return NULL;
}

/* The device's description and the worker's memory; no context yet (device_setup). */
static int worker_init(cuda_exec_t *ex, device_worker_t *dw, int device)
{
    dw->ex = ex;
    dw->device = device;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        return -ENODEV;
    }
    snprintf(dw->name, sizeof dw->name, "%s", prop.name);
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(dw->uuid, sizeof dw->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
    dw->resets = restart_device_resets(device);
    dw->cc_major = prop.major;
    dw->cc_minor = prop.minor;
    dw->sms = prop.multiProcessorCount;
    dw->mem_total = prop.totalGlobalMem;
    dw->cap = ex->cfg->device_memory_cap ? ex->cfg->device_memory_cap
                                         : (size_t)(0.9 * (double)prop.totalGlobalMem);
    dw->n_slots = ex->cfg->streams_per_device > 0 ? ex->cfg->streams_per_device : 1;
    dw->slots = calloc((size_t)dw->n_slots, sizeof *dw->slots);
    dw->q_cap = 2 * dw->n_slots;
    dw->queue = calloc((size_t)dw->q_cap, sizeof *dw->queue);
    if (!dw->slots || !dw->queue) {
        free(dw->slots);
        dw->slots = NULL; /* nothing for worker_release to tear down */
        return -ENOMEM;
    }
    for (int k = 0; k < dw->n_slots; k++) {
        dw->slots[k] = (slot_t){.dw = dw, .ex = ex, .device = device};
        pthread_cond_init(&dw->slots[k].wake, NULL);
    }
    return 0;
}

static void worker_release(device_worker_t *dw)
{
    if (dw->slots) {
        waiters_stop(dw);
        device_teardown(dw);
        for (int k = 0; k < dw->n_slots; k++) {
            free(dw->slots[k].used);
            pthread_cond_destroy(&dw->slots[k].wake);
        }
    }
    for (int k = 0; k < dw->n_residents; k++) {
        cudaFree(dw->residents[k]->dptr);
        free(dw->residents[k]);
    }
    free(dw->residents);
    free(dw->preloads);
    free(dw->slots);
    free(dw->queue);
    dw->slots = NULL;
}

static void *setup_thread(void *arg)
{
    device_worker_t *dw = arg;
    dw->setup_rc = device_setup(dw);
    if (dw->setup_rc == 0) refresh_memory(dw);
    return NULL;
}

/* Sets the selected devices up side by side: with eager module loading a context takes
 * seconds (2.6 s measured on an H200), which a restart after a fault pays again. Devices that
 * fail are dropped from ex->devices. */
static void setup_devices(cuda_exec_t *ex)
{
    if (ex->n_devices == 0) return;
    pthread_t threads[ex->n_devices];
    bool started[ex->n_devices];
    for (int d = 0; d < ex->n_devices; d++) {
        started[d] = pthread_create(&threads[d], NULL, setup_thread, &ex->devices[d]) == 0;
        if (!started[d]) setup_thread(&ex->devices[d]);
    }
    for (int d = 0; d < ex->n_devices; d++)
        if (started[d]) pthread_join(threads[d], NULL);
    int kept = 0;
    for (int d = 0; d < ex->n_devices; d++) {
        device_worker_t *dw = &ex->devices[d];
        if (dw->setup_rc < 0) {
            log_error("gpu %d: initialisation failed: %s", dw->device, strerror(-dw->setup_rc));
            worker_release(dw);
            continue;
        }
        log_info("gpu %d: %s (%s), compute %d.%d, %d SMs, %.1f GiB, pool cap %.1f GiB, %d "
                 "streams",
                 dw->device, dw->name, dw->uuid, dw->cc_major, dw->cc_minor, dw->sms,
                 (double)dw->mem_total / (1 << 30), (double)dw->cap / (1 << 30), dw->n_slots);
        if (kept != d) {
            ex->devices[kept] = *dw;
            for (int k = 0; k < dw->n_slots; k++)
                ex->devices[kept].slots[k].dw = &ex->devices[kept];
            memset(dw, 0, sizeof *dw);
        }
        kept++;
    }
    ex->n_devices = kept;
}

/* The device with room in its queue and the fewest batches ahead, honouring a pinned device
 * (all jobs of a batch share it: the scheduler's batch key includes the pin). */
static int cuda_submit(executor_t *base, exec_batch_t *b)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    int pin = b->jobs[0]->device, preferred = b->jobs[0]->preferred_device;
    pthread_mutex_lock(&ex->lock);
    /* Resident inputs hold their jobs to their device while it serves; only a device that does
     * not (lost, failed, or not served after a restart) lets them run elsewhere. */
    if (pin < 0 && preferred >= 0)
        for (int d = 0; d < ex->n_devices; d++)
            if (ex->devices[d].device == preferred && ex->devices[d].state == DEVICE_READY)
                pin = preferred;
    device_worker_t *best = NULL;
    int best_load = 0;
    /* After a lost context no device takes work: every context is gone, the restart is near. */
    for (int d = 0; d < ex->n_devices && !ex->stopping && !ex->context_lost; d++) {
        device_worker_t *dw = &ex->devices[d];
        if (dw->state != DEVICE_READY || dw->q_len == dw->q_cap || (pin >= 0 && dw->device != pin))
            continue;
        int load = dw->q_len;
        for (int k = 0; k < dw->n_slots; k++)
            load += dw->slots[k].batch != NULL;
        if (!best || load < best_load) {
            best = dw;
            best_load = load;
        }
    }
    int r = -EAGAIN;
    if (best) {
        best->queue[(best->q_head + best->q_len) % best->q_cap] = b;
        best->q_len++;
        pthread_cond_broadcast(&ex->cond);
        r = 0;
    } else if (pin >= 0) {
        bool exists = false;
        for (int d = 0; d < ex->n_devices; d++)
            exists |= ex->devices[d].device == pin && ex->devices[d].state != DEVICE_FAILED;
        if (!exists) {
            /* Nothing will ever take it: fail the batch through the normal path. */
            fail_batch(b, "no_such_device", "the pinned device does not exist here");
            pthread_mutex_unlock(&ex->lock);
            ex->base.done(b, ex->base.done_ud);
            return 0;
        }
    }
    pthread_mutex_unlock(&ex->lock);
    return r;
}

static int cuda_free_slots(executor_t *base, int device)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    int n = device >= 0 && !serves_device_locked(ex, device) ? 1 : 0;
    for (int d = 0; d < ex->n_devices && !ex->stopping && !ex->context_lost; d++) {
        const device_worker_t *dw = &ex->devices[d];
        if (dw->state == DEVICE_READY && (device < 0 || dw->device == device))
            n += dw->q_cap - dw->q_len;
    }
    pthread_mutex_unlock(&ex->lock);
    return n;
}

/* From what the workers recorded: no CUDA call here, so that HTTP threads never wait on a
 * device's calls, nor touch a lost context. */
static json_t *cuda_describe(executor_t *base)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    json_t *devices = json_array();
    pthread_mutex_lock(&ex->lock);
    for (int d = 0; d < ex->n_devices; d++) {
        device_worker_t *dw = &ex->devices[d];
        char cc[16];
        snprintf(cc, sizeof cc, "%d.%d", dw->cc_major, dw->cc_minor);
        json_array_append_new(
            devices,
            json_pack(
                "{s:i, s:s, s:s, s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:i, s:I, s:f, s:i, s:s, s:i}",
                "index", dw->device, "name", dw->name, "uuid", dw->uuid, "compute_capability", cc,
                "sms", dw->sms, "memory_total", (json_int_t)dw->mem_total, "memory_free",
                (json_int_t)dw->mem_free, "pool_cap", (json_int_t)dw->cap, "pool_in_use",
                (json_int_t)dw->in_use, "resident_bytes", (json_int_t)dw->resident_bytes,
                "resident_buffers", dw->n_residents, "resident_loaded_bytes",
                (json_int_t)dw->loaded_bytes, "resident_load_seconds", (double)dw->load_ns / 1e9,
                "streams", dw->n_slots, "state", device_state_names[dw->state], "resets",
                dw->resets));
    }
    pthread_mutex_unlock(&ex->lock);
    return json_pack("{s:s, s:o}", "name", "cuda", "devices", devices);
}

static void cuda_destroy(executor_t *base, int timeout_ms)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    ex->stopping = true;
    ex->drain_deadline_ns = now_ns() + (int64_t)timeout_ms * 1000000;
    pthread_cond_broadcast(&ex->cond);
    pthread_mutex_unlock(&ex->lock);
    /* The workers finish what they hold until the deadline, then exit. */
    for (int d = 0; d < ex->n_devices; d++)
        if (ex->devices[d].thread_started) pthread_join(ex->devices[d].thread, NULL);
    /* Tearing down a device waits for its streams: one whose worker left work on it is left
     * to the process's exit, and so is the executor, whose lock its waiters may still take. */
    bool abandoned = false;
    for (int d = 0; d < ex->n_devices; d++) {
        abandoned |= ex->devices[d].abandoned;
        if (!ex->devices[d].abandoned) worker_release(&ex->devices[d]);
    }
    if (abandoned) return;
    pthread_mutex_destroy(&ex->lock);
    pthread_cond_destroy(&ex->cond);
    free(ex->devices);
    free(ex);
}

/* The device with the most room left beside its resident buffers; among equals, the one
 * given the fewest buffers, so that a run of uploads spreads over the devices. */
static int cuda_place_buffer(executor_t *base, uint64_t nbytes)
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

static void cuda_buffer_added(executor_t *base, const buffer_t *buf)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    for (int d = 0; d < ex->n_devices; d++) {
        device_worker_t *dw = &ex->devices[d];
        if (dw->device != buf->device || dw->state != DEVICE_READY) continue;
        if (dw->n_preloads == dw->cap_preloads) {
            int cap = dw->cap_preloads ? 2 * dw->cap_preloads : 8;
            char(*a)[ID_SIZE] = realloc(dw->preloads, (size_t)cap * sizeof *a);
            if (!a) break; /* its first job loads it */
            dw->preloads = a;
            dw->cap_preloads = cap;
        }
        snprintf(dw->preloads[dw->n_preloads++], ID_SIZE, "%s", buf->id);
    }
    pthread_cond_broadcast(&ex->cond);
    pthread_mutex_unlock(&ex->lock);
}

static void cuda_buffer_deleted(executor_t *base, const char *id)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    for (int d = 0; d < ex->n_devices; d++)
        for (int k = 0; k < ex->devices[d].n_residents; k++)
            if (strcmp(ex->devices[d].residents[k]->id, id) == 0)
                ex->devices[d].residents[k]->deleted = true;
    pthread_cond_broadcast(&ex->cond);
    pthread_mutex_unlock(&ex->lock);
}

static bool cuda_serves_device(executor_t *base, int device)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    bool served = serves_device_locked(ex, device);
    pthread_mutex_unlock(&ex->lock);
    return served;
}

static const executor_ops_t cuda_ops = {
    .name = "cuda",
    .submit = cuda_submit,
    .free_slots = cuda_free_slots,
    .describe = cuda_describe,
    .destroy = cuda_destroy,
    .place_buffer = cuda_place_buffer,
    .buffer_added = cuda_buffer_added,
    .buffer_deleted = cuda_buffer_deleted,
    .serves_device = cuda_serves_device,
};

/* Parses cfg->devices ("all", or a comma list of ordinals or UUIDs) against what is present. */
static bool device_selected(const char *spec, int ordinal, const char *uuid)
{
    if (strcmp(spec, "all") == 0) return true;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if ((*end == '\0' && v == ordinal) || strcmp(tok, uuid) == 0) return true;
    }
    return false;
}

int cuda_device_count(void)
{
    /* Before the process's first CUDA call. Loaded lazily (CUDA's default), a kernel's first
     * launch waits until every kernel running on the device has finished (measured on the H200:
     * a fault job sat 2 s behind a 2 s job on another stream), so the first use of an op, or of
     * a GEMM shape's cuBLAS kernel, would stall behind the longest job. Eager loading costs about
     * 2.6 s at start and 390 MiB of device memory (cuBLAS's kernels), once. An administrator's
     * own CUDA_MODULE_LOADING wins. */
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

int exec_cuda_new(const config_t *cfg, executor_t **ret)
{
    int present = cuda_device_count();
    if (present == 0) return -ENODEV;
    cuda_exec_t *ex = calloc(1, sizeof *ex);
    device_worker_t *devices = calloc((size_t)present, sizeof *devices);
    if (!ex || !devices) {
        free(ex);
        free(devices);
        return -ENOMEM;
    }
    ex->base.ops = &cuda_ops;
    ex->cfg = cfg;
    ex->devices = devices;
    pthread_mutex_init(&ex->lock, NULL);
    pthread_cond_init(&ex->cond, NULL);
    for (int d = 0; d < present; d++) {
        device_worker_t *dw = &ex->devices[ex->n_devices];
        int r = worker_init(ex, dw, d);
        if (r < 0) log_error("gpu %d: initialisation failed: %s", d, strerror(-r));
        /* A device left out gets no context: no memory or time spent on it. */
        if (r < 0 || !device_selected(cfg->devices, d, dw->uuid)) {
            worker_release(dw);
            memset(dw, 0, sizeof *dw);
            continue;
        }
        ex->n_devices++;
    }
    setup_devices(ex);
    if (ex->n_devices == 0) {
        cuda_destroy(&ex->base, 0);
        return -ENODEV;
    }
    for (int d = 0; d < ex->n_devices; d++) {
        device_worker_t *dw = &ex->devices[d];
        dw->thread_started = pthread_create(&dw->thread, NULL, device_thread, dw) == 0;
        if (!dw->thread_started) dw->state = DEVICE_FAILED;
    }
    *ret = &ex->base;
    return 0;
}
