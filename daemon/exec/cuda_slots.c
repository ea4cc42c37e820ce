/* Stream slots: a device runs each batch on a slot of its own, a CUDA stream with its cuBLAS
 * handles and a pinned staging buffer. A launch packs the inputs into staging, copies them to
 * the device in one go, runs the op on all the batch's calls at once, copies all outputs back
 * in one go and records the slot's done event. The slot's waiter thread sleeps in the driver on
 * that event, then completes the batch and frees the slot while the worker goes on launching. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "cuda_internal.h"
#include "daemon/util/crash_guard.h"
#include "daemon/util/id.h"
#include "exec_guard.h"
#include "exec_time.h"
#include "exec_inputs.h"
#include "daemon/util/log.h"

void cuda_fail_batch(exec_batch_t *b, const char *code, const char *message)
{
    for (int i = 0; i < b->n; i++)
        if (!b->jobs[i]->error_code[0]) job_set_error(b->jobs[i], code, "%s", message);
}

void cuda_release_held_locked(device_worker_t *dw, exec_batch_t *b)
{
    if (!b->held) return;
    dw->held -= b->held_bytes;
    b->held = false;
}

/* Whether the launch of the job's batch leaves it out: it was cancelled before the launch. */
static bool left_out(const job_t *job)
{
    return job->skipped;
}

/* Leaves the jobs of b cancelled before its launch out of it (left_out); returns how many jobs
 * the launch still has. */
static int leave_out_cancelled(exec_batch_t *b)
{
    int live = 0;
    for (int i = 0; i < b->n; i++) {
        if (exec_job_cancelled(b->jobs[i]))
            exec_job_skip(b->jobs[i], "cancelled before its launch");
        else
            live++;
    }
    return live;
}

void cuda_enter_device_thread(const char *name_format, int device, int max_batch)
{
    char name[16];
    snprintf(name, sizeof name, name_format, device);
    prctl(PR_SET_NAME, name);
    cudaSetDevice(device);
    if (crash_guard_thread_enter(max_batch) < 0)
        log_warn("gpu %d: no memory for a crash guard: a job that crashes it re-runs", device);
}

/* Bytes of a batch's inputs and outputs, each tensor aligned. Resident inputs take no room:
 * those whose device pointer the launch has (in_ptrs[i * OP_MAX_TENSORS + j] set), or, before
 * the launch, those already resident on dw (the caller holds the lock). */
void cuda_batch_sizes(const exec_batch_t *b, const void *const *in_ptrs, const device_worker_t *dw,
                      size_t *ret_in, size_t *ret_out)
{
    size_t in = 0, out = 0;
    for (int i = 0; i < b->n; i++) {
        const job_t *job = b->jobs[i];
        const op_call_t *c = &job->call;
        if (left_out(job)) continue;
        for (int j = 0; j < c->op->n_inputs; j++)
            if (c->has_in[j] && !(in_ptrs && in_ptrs[(size_t)i * OP_MAX_TENSORS + j]) &&
                !(dw && job->in[j].buffer_id[0] &&
                  cuda_resident_here_locked(dw, job->in[j].buffer_id)))
                in += cuda_align_up(tensor_desc_bytes(&c->in[j]));
        for (int j = 0; j < c->n_out; j++)
            out += cuda_align_up(tensor_desc_bytes(&c->out[j]));
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

/* Gives the running batch's device memory back to the pool, on the slot's stream. */
static void slot_free_device_memory(slot_t *slot)
{
    pool_free(slot, slot->d_in);
    pool_free(slot, slot->d_out);
    slot->d_in = slot->d_out = NULL;
}

int cuda_slot_grow_pinned(slot_t *slot, size_t bytes)
{
    if (slot->pinned_size >= bytes) return 0;
    cudaFreeHost(slot->pinned);
    slot->pinned = NULL;
    slot->pinned_size = 0;
    size_t size = bytes < CUDA_STAGING_MIN ? CUDA_STAGING_MIN : bytes + bytes / 4;
    if (cudaMallocHost(&slot->pinned, size) != cudaSuccess) {
        cudaGetLastError();
        return -ENOMEM;
    }
    slot->pinned_size = size;
    return 0;
}

/* The pointer arrays a launch hands to the op: for its call i (of n, the batch's jobs that are
 * not left out), ins[i] and outs[i] point at the OP_MAX_TENSORS entries of in_ptrs and out_ptrs
 * of its job. */
typedef struct launch_args {
    int n;
    const op_call_t **calls;
    const void **in_ptrs;
    void **out_ptrs;
    const void *const **ins;
    void *const **outs;
} launch_args_t;

static int launch_args_alloc(launch_args_t *a, int n)
{
    a->calls = calloc((size_t)n, sizeof *a->calls);
    a->in_ptrs = calloc((size_t)n * OP_MAX_TENSORS, sizeof *a->in_ptrs);
    a->out_ptrs = calloc((size_t)n * OP_MAX_TENSORS, sizeof *a->out_ptrs);
    a->ins = calloc((size_t)n, sizeof *a->ins);
    a->outs = calloc((size_t)n, sizeof *a->outs);
    return a->calls && a->in_ptrs && a->out_ptrs && a->ins && a->outs ? 0 : -ENOMEM;
}

static void launch_args_free(launch_args_t *a)
{
    free(a->calls);
    free(a->in_ptrs);
    free(a->out_ptrs);
    free(a->ins);
    free(a->outs);
}

/* Reads the inputs that are not in memory: resident buffers give their device pointer (in
 * in_ptrs), the others their bytes. 0, or -ENODATA after failing the batch. */
static int launch_fetch_inputs(slot_t *slot, exec_batch_t *b, void *rd, const void **in_ptrs)
{
    const exec_blob_reader_t *blobs = &slot->ex->blobs;
    char why[ERROR_MESSAGE_SIZE];
    for (int i = 0; i < b->n; i++) {
        job_t *job = b->jobs[i];
        job->run_device = slot->dw->device;
        job->batch_size = b->n;
        if (left_out(job)) continue;
        for (int j = 0; j < job->call.op->n_inputs; j++) {
            job_tensor_t *t = &job->in[j];
            if (!job->call.has_in[j] || t->data) continue;
            const void **dptr = &in_ptrs[(size_t)i * OP_MAX_TENSORS + j];
            int r = t->buffer_id[0] ? cuda_fetch_buffer_input(slot, rd, t, dptr, why, sizeof why)
                                    : exec_input_load(blobs, rd, t, why, sizeof why);
            if (r < 0) {
                cuda_fail_batch(b, "input_unavailable", why);
                return -ENODATA;
            }
        }
    }
    return 0;
}

/* Staging and device memory for the batch's copies. 0, or -EIO after failing the batch. */
static int launch_alloc(slot_t *slot, exec_batch_t *b, size_t in_bytes, size_t out_bytes)
{
    if (cuda_slot_grow_pinned(slot, in_bytes > out_bytes ? in_bytes : out_bytes) < 0) {
        cuda_fail_batch(b, "out_of_memory", "no pinned host memory for staging");
        return -EIO;
    }
    slot->d_in = pool_alloc(slot, in_bytes);
    slot->d_out = pool_alloc(slot, out_bytes);
    if (!slot->d_in || !slot->d_out) {
        slot_free_device_memory(slot);
        cuda_fail_batch(b, "out_of_memory", "the device memory pool is exhausted");
        return -EIO;
    }
    return 0;
}

/* Packs the inputs into staging (resident ones already have their pointers) and lays out the
 * device pointers of every call. */
static void launch_pack(slot_t *slot, exec_batch_t *b, launch_args_t *a)
{
    size_t in_off = 0, out_off = 0;
    a->n = 0;
    for (int i = 0; i < b->n; i++) {
        job_t *job = b->jobs[i];
        if (left_out(job)) continue;
        const void **in_ptrs = a->in_ptrs + (size_t)i * OP_MAX_TENSORS;
        void **out_ptrs = a->out_ptrs + (size_t)i * OP_MAX_TENSORS;
        a->calls[a->n] = &job->call;
        a->ins[a->n] = in_ptrs;
        a->outs[a->n] = out_ptrs;
        a->n++;
        for (int j = 0; j < job->call.op->n_inputs; j++) {
            if (!job->call.has_in[j] || in_ptrs[j]) continue;
            memcpy((char *)slot->pinned + in_off, job->in[j].data, job->in[j].nbytes);
            in_ptrs[j] = (char *)slot->d_in + in_off;
            in_off += cuda_align_up(job->in[j].nbytes);
        }
        for (int j = 0; j < job->call.n_out; j++) {
            out_ptrs[j] = (char *)slot->d_out + out_off;
            out_off += cuda_align_up(tensor_desc_bytes(&job->call.out[j]));
        }
    }
}

/* Puts the copies, the op and the events on the slot's stream and hands a whole launch to the
 * waiter. 0, or -EIO after failing the batch, with the stream drained and its memory back. */
static int launch_enqueue(slot_t *slot, exec_batch_t *b, const launch_args_t *a, size_t in_bytes,
                          size_t out_bytes)
{
    int r = 0;
    cudaError_t e =
        cudaMemcpyAsync(slot->d_in, slot->pinned, in_bytes, cudaMemcpyHostToDevice, slot->stream);
    cudaEventRecord(slot->start, slot->stream);
    op_cuda_ctx_t ctx = {
        .stream = slot->stream,
        .blaslt = slot->lt,
        .blas = slot->blas,
        .device = slot->dw->device,
        .scratch_alloc = pool_alloc,
        .scratch_free = pool_free,
        .pool = slot,
    };
    op_error_t err = {0};
    if (e == cudaSuccess &&
        a->calls[0]->op->run_cuda(&ctx, a->n, a->calls, a->ins, a->outs, &err) < 0) {
        r = -EIO;
        cuda_fail_batch(b, "op_failed", err.message);
    }
    cudaEventRecord(slot->stop, slot->stream);
    if (r == 0 && e == cudaSuccess)
        e = cudaMemcpyAsync(slot->pinned, slot->d_out, out_bytes, cudaMemcpyDeviceToHost,
                            slot->stream);
    /* Only a whole launch is the waiter's to end: the worker ends a failed one itself, and
     * a late wake-up of the waiter could then end the slot's next batch. */
    if (r == 0 && e == cudaSuccess) e = cudaEventRecord(slot->done, slot->stream);
    if (r == 0 && e == cudaSuccess) {
        pthread_mutex_lock(&slot->ex->lock);
        slot->launched = true;
        slot->launch++;
        pthread_cond_signal(&slot->wake);
        pthread_mutex_unlock(&slot->ex->lock);
    }
    if (e != cudaSuccess) {
        char why[ERROR_MESSAGE_SIZE];
        snprintf(why, sizeof why, "CUDA: %s", cudaGetErrorString(e));
        cuda_fail_batch(b, "cuda_error", why);
        cudaGetLastError();
        r = -EIO;
    }
    if (r < 0) {
        /* Let whatever was queued drain before the memory goes back to the pool. */
        cudaStreamSynchronize(slot->stream);
        cudaGetLastError();
        slot_free_device_memory(slot);
    }
    return r;
}

/* Queues a batch on a free slot. Returns 0 when the work is on the stream (the slot's waiter
 * completes it), or a negative errno after failing the batch's jobs: -EIO when a CUDA call
 * failed (which a lost context explains), another errno when the host did. */
int cuda_slot_launch(slot_t *slot, exec_batch_t *b, void *rd)
{
    launch_args_t a;
    int r = launch_args_alloc(&a, b->n);
    if (r < 0) {
        cuda_fail_batch(b, "out_of_memory", "no host memory for the launch");
        goto out;
    }
    cudaSetDevice(slot->dw->device);
    int64_t started = mono_us();
    exec_batch_started(b, started);
    for (int i = 0; i < b->n; i++)
        exec_job_run_start(b->jobs[i], started);
    exec_guard_batch(b);
    /* A batch whose jobs were all cancelled while it waited is reported without a launch. */
    if (leave_out_cancelled(b) == 0) {
        r = -ECANCELED;
        goto out;
    }
    r = launch_fetch_inputs(slot, b, rd, a.in_ptrs);
    if (r < 0) goto out;
    if (!b->jobs[0]->call.op->run_cuda) {
        cuda_fail_batch(b, "unsupported", "this op has no CUDA implementation in this build");
        r = -EOPNOTSUPP;
        goto out;
    }
    size_t in_bytes, out_bytes;
    cuda_batch_sizes(b, a.in_ptrs, NULL, &in_bytes, &out_bytes);
    r = launch_alloc(slot, b, in_bytes, out_bytes);
    if (r < 0) goto out;
    launch_pack(slot, b, &a);
    r = launch_enqueue(slot, b, &a, in_bytes, out_bytes);
out:
    exec_guard_clear();
    launch_args_free(&a);
    return r;
}

/* Copies each successful job's outputs out of staging into memory of their own. Those of a job
 * cancelled after its launch are not copied: its result is dropped, its batch-mates keep
 * theirs. */
static void unpack_outputs(slot_t *slot, exec_batch_t *b)
{
    size_t out_off = 0;
    for (int i = 0; i < b->n; i++) {
        job_t *job = b->jobs[i];
        const op_call_t *c = &job->call;
        if (left_out(job)) continue; /* it has no room in staging */
        bool keep = !job->error_code[0] && !exec_job_cancelled(job);
        if (keep) job_describe_outputs(job);
        for (int j = 0; j < c->n_out; j++) {
            job_tensor_t *t = &job->out[j];
            uint64_t nbytes = tensor_desc_bytes(&c->out[j]);
            if (keep) {
                t->data = malloc(nbytes ? nbytes : 1);
                if (t->data)
                    memcpy(t->data, (char *)slot->pinned + out_off, nbytes);
                else
                    job_set_error(job, "out_of_memory", "no host memory for output '%s'", t->name);
            }
            out_off += cuda_align_up(nbytes);
        }
    }
}

/* After the stream finished: outputs out of staging, GPU time shared by cost, memory back.
 * Returns the stream's error, after failing the batch with it; cudaSuccess for a batch that
 * ran (its done event was reached: all its work did), or that failed before its launch. */
cudaError_t cuda_slot_complete(slot_t *slot)
{
    exec_batch_t *b = slot->batch;
    int64_t ended = mono_us();
    for (int i = 0; i < b->n; i++)
        exec_job_run_end(b->jobs[i], ended);
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
        cuda_fail_batch(b, "cuda_error", why);
        cudaGetLastError();
    }
    exec_time_share(b, llround((double)ms * 1e6));
    exec_guard_batch(b);
    unpack_outputs(slot, b);
    exec_guard_clear();
    slot_free_device_memory(slot);
    return e;
}

/* Reports a slot's batch, which cuda_slot_complete() has dealt with, then frees the slot. Its
 * device memory and resident buffers go back first; the slot itself only after the report,
 * which may write large outputs to disk (the scheduler's done callback): a batch given to the
 * slot meanwhile would wait for them behind its waiter. Until then the slot's batch pointer,
 * which the report may free, is only compared with NULL. */
void cuda_slot_release(slot_t *slot)
{
    cuda_exec_t *ex = slot->ex;
    pthread_mutex_lock(&ex->lock);
    cuda_slot_release_residents_locked(slot);
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

/* Waits for a launch's done event: polls it for up to spin_us, then sleeps in the driver. A
 * tiny job's launch ends within tens of microseconds, and the driver's wake-up of a sleeping
 * thread adds about as much again. */
static cudaError_t slot_wait_done(slot_t *slot, int spin_us)
{
    for (int64_t until = mono_us() + spin_us; spin_us > 0 && mono_us() < until;) {
        cudaError_t e = cudaEventQuery(slot->done);
        if (e != cudaErrorNotReady) return e;
    }
    return cudaEventSynchronize(slot->done);
}

/* A slot's waiter: waits until each launch's done event is reached (slot_wait_done), then
 * completes the batch and frees the slot itself, while the worker goes on launching. A fault
 * ends the wait with its error: the slot is then marked finished for the worker, which deals
 * with faults, as it does with a batch that ran once the device's context is lost. A thread
 * waiting on the event sees a launch end sooner than a host function on the stream would. */
void *cuda_slot_waiter(void *arg)
{
    slot_t *slot = arg;
    cuda_exec_t *ex = slot->ex;
    cuda_enter_device_thread("gj-gpu%d-wait", slot->device, ex->cfg->max_batch);
    pthread_mutex_lock(&ex->lock);
    unsigned seen = 0; /* the slot's launches start at 1: the first may come before this runs */
    for (;;) {
        while (slot->launch == seen && !slot->waiter_quit)
            pthread_cond_wait(&slot->wake, &ex->lock);
        if (slot->waiter_quit) break;
        seen = slot->launch;
        if (!slot->batch) continue; /* handed back by cuda_recover() */
        slot->waiter_in_sync = true;
        pthread_mutex_unlock(&ex->lock);
        cudaError_t e = slot_wait_done(slot, ex->cfg->spin_us);
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
        cuda_slot_complete(slot);
        cuda_slot_release(slot);
        pthread_mutex_lock(&ex->lock);
    }
    pthread_mutex_unlock(&ex->lock);
    crash_guard_thread_leave();
    return NULL;
}

/* Ends the device's waiters. One still in cudaEventSynchronize (a launch its worker left at the
 * drain deadline, or one cuda_recover() handed back) is left to the process's exit, and the
 * device counts as abandoned: cuda_destroy then keeps its slots and the executor, as the
 * waiter, should it wake, finds itself told to quit and touches nothing but its slot and the
 * executor's lock. */
void cuda_waiters_stop(device_worker_t *dw)
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
