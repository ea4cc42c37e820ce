/* The device worker: one thread per GPU that owns the device. Each turn of its loop does the
 * first thing that is due: give up at the drain deadline, hand its batches back when another
 * device's fault lost its context too, free a deleted resident copy, complete a slot its waiter
 * left to it, load a resident buffer ahead of its first job, or start the queue's head on a
 * free slot. With nothing to do it sleeps on the executor's condition variable: no thread
 * spins. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "daemon/util/crash_guard.h"
#include "daemon/util/log.h"

/* What a worker sees of the devices at the start of a turn. */
typedef struct worker_view {
    slot_t *free_slot;    /* a free slot of its own, or NULL */
    int running;          /* its slots that hold a batch */
    int running_anywhere; /* slots that hold a batch, and loads ahead of a job, on any device */
    bool exclusive;       /* a re-run holds the process's devices */
    bool rerun_waiting;   /* another device's re-run waits for them: nothing else starts */
} worker_view_t;

void cuda_refresh_memory(device_worker_t *dw)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
    pthread_mutex_lock(&dw->ex->lock);
    dw->mem_free = free_b;
    dw->memory_checked_ns = cuda_now_ns();
    pthread_mutex_unlock(&dw->ex->lock);
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

/* cuda_recover() called with the executor's lock, which the caller holds, let go meanwhile. */
static void recover_unlocked(device_worker_t *dw, cudaError_t why)
{
    pthread_mutex_unlock(&dw->ex->lock);
    cuda_recover(dw, why);
    pthread_mutex_lock(&dw->ex->lock);
}

static void look_locked(device_worker_t *dw, worker_view_t *v)
{
    cuda_exec_t *ex = dw->ex;
    *v = (worker_view_t){0};
    for (int k = 0; k < dw->n_slots; k++) {
        slot_t *s = &dw->slots[k];
        if (!s->batch && !v->free_slot) v->free_slot = s;
        v->running += s->batch != NULL;
    }
    for (int d = 0; d < ex->n_devices; d++) {
        const device_worker_t *other = &ex->devices[d];
        for (int k = 0; k < other->n_slots; k++) {
            const slot_t *s = &other->slots[k];
            v->running_anywhere += s->batch != NULL;
            v->exclusive |= s->batch && s->exclusive;
        }
        v->running_anywhere += other->preloading; /* a re-run must wait for it too */
        v->rerun_waiting |=
            other != dw && other->q_len > 0 && cuda_is_rerun(other->queue[other->q_head]);
    }
}

/* Past the drain deadline nothing more starts, and nothing more is waited for: the jobs of
 * batches left queued or running stay running in the store and run again after the next start
 * (the scheduler's loop has ended; no one would record their end). True when the worker is to
 * leave its loop. */
static bool drain_expired_locked(device_worker_t *dw, const worker_view_t *v)
{
    cuda_exec_t *ex = dw->ex;
    if (!ex->stopping || (dw->q_len == 0 && v->running == 0) ||
        cuda_now_ns() < ex->drain_deadline_ns)
        return false;
    log_warn("gpu %d: drain timeout: %d queued and %d running batches are left to the next start",
             dw->device, dw->q_len, v->running);
    dw->abandoned = v->running > 0;
    pthread_cond_broadcast(&ex->cond); /* the others look at the deadline too */
    return true;
}

/* Frees a deleted resident copy no launch uses, while nothing runs here: cudaFree waits for
 * the whole device. True when it freed one. */
static bool free_unused_deleted_locked(device_worker_t *dw, const worker_view_t *v)
{
    resident_t *unused = v->running == 0 ? cuda_take_unused_deleted_locked(dw) : NULL;
    if (!unused) return false;
    pthread_mutex_unlock(&dw->ex->lock);
    cudaFree(unused->dptr);
    free(unused);
    pthread_mutex_lock(&dw->ex->lock);
    return true;
}

/* Completes a slot its waiter marked finished (its launch failed or faulted), which frees
 * memory and a slot for the queue. True when there was one. */
static bool complete_finished_locked(device_worker_t *dw)
{
    slot_t *done = NULL;
    for (int k = 0; k < dw->n_slots && !done; k++)
        if (dw->slots[k].batch && dw->slots[k].finished) done = &dw->slots[k];
    if (!done) return false;
    pthread_mutex_unlock(&dw->ex->lock);
    cudaError_t e = cuda_slot_complete(done);
    if (e != cudaSuccess && cuda_sticky_error() != cudaSuccess)
        cuda_recover(dw, e);
    else
        cuda_slot_release(done);
    pthread_mutex_lock(&dw->ex->lock);
    return true;
}

/* With nothing running or queued here, a slot loads a resident buffer just stored (a load holds
 * this thread: no completion may be waiting behind it). True when it took one off the list. */
static bool preload_next_locked(device_worker_t *dw, const worker_view_t *v, void *rd)
{
    cuda_exec_t *ex = dw->ex;
    if (dw->n_preloads == 0 || v->running > 0 || dw->q_len > 0 || v->exclusive ||
        v->rerun_waiting || ex->stopping || ex->context_lost || dw->state != DEVICE_READY || !rd)
        return false;
    char id[ID_SIZE];
    memcpy(id, dw->preloads[--dw->n_preloads], sizeof id);
    bool here = cuda_resident_here_locked(dw, id);
    dw->preloading = !here;
    pthread_mutex_unlock(&ex->lock);
    cudaError_t lost = here ? cudaSuccess : cuda_preload(&dw->slots[0], rd, id);
    pthread_mutex_lock(&ex->lock);
    dw->preloading = false;
    pthread_cond_broadcast(&ex->cond); /* a re-run may wait for it */
    if (lost != cudaSuccess) recover_unlocked(dw, lost);
    return true;
}

/* The queue's head, when it may start now: a slot is free and no re-run holds the devices,
 * unless it is a re-run and others run on any device, or another device's re-run waits for the
 * devices to empty, or it needs memory that running batches hold. The scheduler hands a batch
 * over only once fit() held room for it (executor.h), so a head short of memory is one whose
 * device took a resident buffer since: it waits for the running batches' memory, and with
 * none running starts all the same rather than hold the queue behind it for good. *ret_need:
 * the device bytes it needs beside its inputs already resident here. */
static exec_batch_t *startable_head_locked(device_worker_t *dw, const worker_view_t *v,
                                           size_t *ret_need)
{
    if (!v->free_slot || dw->q_len == 0 || v->exclusive) return NULL;
    exec_batch_t *b = dw->queue[dw->q_head];
    bool rerun = cuda_is_rerun(b);
    size_t in_bytes, out_bytes;
    cuda_batch_sizes(b, NULL, dw, &in_bytes, &out_bytes);
    size_t need = in_bytes + out_bytes;
    bool too_big = need > dw->cap;
    if ((rerun && v->running_anywhere > 0) || (!rerun && v->rerun_waiting) ||
        (!too_big && dw->in_use + dw->resident_bytes + need > dw->cap && dw->in_use > 0))
        return NULL;
    *ret_need = need;
    return b;
}

/* Puts the queue's head b on the free slot and launches it; a batch that cannot run fails
 * there and is reported through the slot like any other. */
static void start_locked(device_worker_t *dw, slot_t *slot, exec_batch_t *b, size_t need, void *rd)
{
    cuda_exec_t *ex = dw->ex;
    bool too_big = need > dw->cap;
    dw->q_head = (dw->q_head + 1) % dw->q_cap;
    dw->q_len--;
    cuda_release_held_locked(dw, b); /* from here on, it is in use */
    slot->batch = b;
    slot->exclusive = cuda_is_rerun(b);
    slot->finished = slot->ran = false;
    slot->reserved = too_big ? 0 : need;
    dw->in_use += slot->reserved;
    pthread_mutex_unlock(&ex->lock);
    int r;
    cudaError_t lost = cudaSuccess;
    if (too_big) {
        cuda_fail_batch(b, "exceeds_device_memory",
                        "the job needs more device memory than the configured cap");
        r = -E2BIG;
    } else if (!rd) {
        cuda_fail_batch(b, "store_failed", "the device worker cannot read the store");
        r = -EIO;
    } else {
        r = cuda_slot_launch(slot, b, rd);
        /* A launch that failed on a context lost earlier (its fault not seen yet) or by its
         * own doing is part of the fault, not a failure of its jobs. */
        if (r == -EIO) lost = cuda_sticky_error();
    }
    pthread_mutex_lock(&ex->lock);
    /* A whole launch (r == 0) is its waiter's now: the slot is not touched here. One that
     * failed on a lost context counts as launched: its kernels may have run. */
    if (lost != cudaSuccess) {
        slot->launched = true;
        cuda_clear_errors(b);
        recover_unlocked(dw, lost);
        return;
    }
    if (r < 0) slot->finished = true; /* report it through the same path */
}

/* Sleeps until something changes. Draining, a worker looks again at the deadline even if no one
 * wakes it (its batches may never end, and one holding its queue back for another device's
 * re-run is not woken by its own); running, it keeps the free memory of /v1/info fresh. */
static void sleep_locked(device_worker_t *dw, const worker_view_t *v)
{
    cuda_exec_t *ex = dw->ex;
    if (ex->stopping)
        wait_locked(ex, ex->drain_deadline_ns - cuda_now_ns());
    else if (v->running > 0)
        wait_locked(ex, dw->memory_checked_ns + CUDA_MEMORY_CHECK_NS - cuda_now_ns());
    else
        pthread_cond_wait(&ex->cond, &ex->lock);
}

/* One turn of the worker's loop, the lock held; false when the worker is to leave it. */
static bool turn_locked(device_worker_t *dw, void *rd)
{
    cuda_exec_t *ex = dw->ex;
    if (cuda_now_ns() - dw->memory_checked_ns > CUDA_MEMORY_CHECK_NS) {
        pthread_mutex_unlock(&ex->lock);
        cuda_refresh_memory(dw);
        pthread_mutex_lock(&ex->lock);
    }
    worker_view_t v;
    look_locked(dw, &v);
    if (drain_expired_locked(dw, &v)) return false;
    /* Another device's fault lost this one's context too: nothing more starts here (it would
     * run on a dead context and count as in flight), its batches go back now. */
    if (ex->context_lost && dw->state == DEVICE_READY) {
        recover_unlocked(dw, ex->lost_error);
        return true;
    }
    if (free_unused_deleted_locked(dw, &v) || complete_finished_locked(dw) ||
        preload_next_locked(dw, &v, rd))
        return true;
    size_t need = 0;
    exec_batch_t *b = startable_head_locked(dw, &v, &need);
    if (b) {
        start_locked(dw, v.free_slot, b, need, rd);
        return true;
    }
    if (ex->stopping && dw->q_len == 0 && v.running == 0) return false;
    /* A batch that may not start yet waits here like any worker with batches in flight:
     * freeing a slot on any device wakes every worker. */
    sleep_locked(dw, &v);
    return true;
}

void *cuda_device_thread(void *arg)
{
    device_worker_t *dw = arg;
    cuda_exec_t *ex = dw->ex;
    cuda_enter_device_thread("gj-gpu%d", dw->device, ex->cfg->max_batch);
    void *rd = NULL;
    if (ex->blobs.open(ex->blobs.ctx, &rd) < 0)
        log_error("gpu %d: cannot open a store reader", dw->device);
    pthread_mutex_lock(&ex->lock);
    while (turn_locked(dw, rd))
        ;
    pthread_mutex_unlock(&ex->lock);
    cuda_waiters_stop(dw);
    ex->blobs.close(rd);
    crash_guard_thread_leave();
    return NULL;
}
