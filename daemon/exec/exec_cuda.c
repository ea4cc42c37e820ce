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
 * Resident buffers stay in device memory across jobs (cuda_resident.c). A sticky error loses
 * the device's context for the rest of the process: the worker hands its batches back and the
 * daemon restarts itself (cuda_recovery.c). The parts are listed in cuda_internal.h; this file
 * is the executor interface. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "daemon/util/log.h"
#include "exec_placement.h"

static const char *const device_state_names[] = {"ready", "resetting", "failed"};

static bool serves_device_locked(cuda_exec_t *ex, int device)
{
    for (int d = 0; d < ex->n_devices; d++)
        if (ex->devices[d].device == device && ex->devices[d].state != DEVICE_FAILED) return true;
    return false;
}

/* What placement_pick() knows of each device for b: its slots, its load, and its pool, with
 * what b would take there (its inputs resident there take nothing). After a lost context no
 * device serves: every context is gone, the restart is near. Caller holds the lock. */
static void placement_view_locked(cuda_exec_t *ex, const exec_batch_t *b, placement_device_t *devs,
                                  placement_batch_t *ret_pb)
{
    for (int d = 0; d < ex->n_devices; d++) {
        const device_worker_t *dw = &ex->devices[d];
        int load = dw->q_len + dw->n_fitted;
        for (int k = 0; k < dw->n_slots; k++)
            load += dw->slots[k].batch != NULL;
        size_t in_bytes, out_bytes, taken = dw->in_use + dw->held + dw->resident_bytes;
        cuda_batch_sizes(b, NULL, dw, &in_bytes, &out_bytes);
        devs[d] = (placement_device_t){
            .device = dw->device,
            .serves = dw->state == DEVICE_READY && !ex->stopping && !ex->context_lost,
            .free_slots = dw->q_cap - dw->q_len - dw->n_fitted,
            .load = load,
            .cap = dw->cap,
            .room = taken < dw->cap ? dw->cap - taken : 0,
            .need = in_bytes + out_bytes,
        };
    }
    *ret_pb =
        (placement_batch_t){.pin = b->jobs[0]->device, .preferred = b->jobs[0]->preferred_device};
}

/* The device of ordinal device, or NULL. Caller holds the lock. */
static device_worker_t *worker_of_locked(cuda_exec_t *ex, int device)
{
    for (int d = 0; d < ex->n_devices; d++)
        if (ex->devices[d].device == device) return &ex->devices[d];
    return NULL;
}

/* The device whose pool has room for b now and placement_pick() chooses, holding that room for b
 * (fit's contract in executor.h); -ENOSPC, -EAGAIN or -E2BIG when there is none. A batch pinned
 * to a device this backend does not have fits, holding nothing: submit() fails it. */
static int cuda_fit(executor_t *base, exec_batch_t *b)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    int pin = b->jobs[0]->device;
    pthread_mutex_lock(&ex->lock);
    /* Pinned to a device it does not have, it goes to submit(), which fails it. */
    if (pin >= 0 && !serves_device_locked(ex, pin)) {
        pthread_mutex_unlock(&ex->lock);
        return 0;
    }
    placement_device_t devs[ex->n_devices > 0 ? ex->n_devices : 1];
    placement_batch_t pb;
    placement_view_locked(ex, b, devs, &pb);
    int d = placement_pick(devs, ex->n_devices, &pb);
    if (d >= 0) {
        device_worker_t *dw = &ex->devices[d];
        dw->held += devs[d].need;
        dw->n_fitted++;
        b->held = true;
        b->held_device = dw->device;
        b->held_bytes = devs[d].need;
    } else if (d == -EAGAIN && placement_waits_for_memory(devs, ex->n_devices, &pb)) {
        d = -ENOSPC;
    }
    pthread_mutex_unlock(&ex->lock);
    return d >= 0 ? 0 : d;
}

static void cuda_unfit(executor_t *base, exec_batch_t *b)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    device_worker_t *dw = b->held ? worker_of_locked(ex, b->held_device) : NULL;
    if (dw) {
        cuda_release_held_locked(dw, b);
        dw->n_fitted--;
    }
    pthread_mutex_unlock(&ex->lock);
}

/* Every serving device's pool together, and the largest. */
static uint64_t cuda_memory_pool(executor_t *base, uint64_t *ret_largest, const char **ret_key)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    uint64_t total = 0, largest = 0;
    pthread_mutex_lock(&ex->lock);
    for (int d = 0; d < ex->n_devices; d++) {
        const device_worker_t *dw = &ex->devices[d];
        if (dw->state != DEVICE_READY) continue;
        total += dw->cap;
        if (dw->cap > largest) largest = dw->cap;
    }
    pthread_mutex_unlock(&ex->lock);
    *ret_largest = largest;
    *ret_key = "gpu.device_memory_cap";
    return total;
}

/* The device b goes to: the one fit() held room on, else the one placement_pick() chooses
 * now; NULL with *ret_err -EAGAIN when none has a free slot (or fit's device no longer serves,
 * the room it held given back), -E2BIG when b never fits. Caller holds the lock. */
static device_worker_t *submit_device_locked(cuda_exec_t *ex, exec_batch_t *b, int *ret_err)
{
    *ret_err = -EAGAIN;
    if (b->held) {
        device_worker_t *dw = worker_of_locked(ex, b->held_device);
        if (!dw) return NULL;
        dw->n_fitted--;
        if (dw->state == DEVICE_READY && !ex->stopping && !ex->context_lost &&
            dw->q_len < dw->q_cap)
            return dw;
        cuda_release_held_locked(dw, b);
        return NULL;
    }
    placement_device_t devs[ex->n_devices > 0 ? ex->n_devices : 1];
    placement_batch_t pb;
    placement_view_locked(ex, b, devs, &pb);
    /* Handed over without fit(), a batch goes where a slot is free, its memory taken when it
     * starts, as the device worker sees it then. */
    for (int d = 0; d < ex->n_devices; d++)
        if (devs[d].need <= devs[d].cap) devs[d].room = devs[d].cap;
    int d = placement_pick(devs, ex->n_devices, &pb);
    if (d >= 0) return &ex->devices[d];
    *ret_err = d;
    return NULL;
}

/* Queues b on its device (submit_device_locked); -EAGAIN when none has room now. A batch pinned
 * to a device this backend does not serve, or that needs more than every pool it may run on,
 * fails, reported through the done callback. */
static int cuda_submit(executor_t *base, exec_batch_t *b)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    int pin = b->jobs[0]->device;
    pthread_mutex_lock(&ex->lock);
    int r;
    device_worker_t *dw = submit_device_locked(ex, b, &r);
    const char *code = NULL, *why = NULL;
    if (dw) {
        dw->queue[(dw->q_head + dw->q_len) % dw->q_cap] = b;
        dw->q_len++;
        pthread_cond_broadcast(&ex->cond);
        r = 0;
    } else if (pin >= 0 && !serves_device_locked(ex, pin)) {
        code = "no_such_device";
        why = "the pinned device does not exist here";
    } else if (r == -E2BIG) {
        code = "exceeds_device_memory";
        why = "the job needs more device memory than any device's pool holds "
              "(gpu.device_memory_cap)";
    }
    if (code) {
        /* Nothing will ever take it: fail the batch through the normal path. */
        cuda_fail_batch(b, code, why);
        pthread_mutex_unlock(&ex->lock);
        ex->base.done(b, ex->base.done_ud);
        return 0;
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
            n += dw->q_cap - dw->q_len - dw->n_fitted;
    }
    pthread_mutex_unlock(&ex->lock);
    return n;
}

/* One device's entry of /v1/info, from what its worker recorded. Caller holds the lock. */
static json_t *describe_device_locked(const device_worker_t *dw)
{
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", dw->cc_major, dw->cc_minor);
    return json_pack(
        "{s:i, s:s, s:s, s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:i, s:I, s:f, s:i, s:s, s:i}", "index",
        dw->device, "name", dw->name, "uuid", dw->uuid, "compute_capability", cc, "sms", dw->sms,
        "memory_total", (json_int_t)dw->mem_total, "memory_free", (json_int_t)dw->mem_free,
        "pool_cap", (json_int_t)dw->cap, "pool_in_use", (json_int_t)dw->in_use, "resident_bytes",
        (json_int_t)dw->resident_bytes, "resident_buffers", (int)dw->n_residents,
        "resident_loaded_bytes", (json_int_t)dw->loaded_bytes, "resident_load_seconds",
        (double)dw->load_ns / 1e9, "streams", dw->n_slots, "state", device_state_names[dw->state],
        "resets", dw->resets);
}

/* From what the workers recorded: no CUDA call here, so that HTTP threads never wait on a
 * device's calls, nor touch a lost context. */
static json_t *cuda_describe(executor_t *base)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    json_t *devices = json_array();
    pthread_mutex_lock(&ex->lock);
    for (int d = 0; d < ex->n_devices; d++)
        json_array_append_new(devices, describe_device_locked(&ex->devices[d]));
    pthread_mutex_unlock(&ex->lock);
    return json_pack("{s:s, s:o}", "name", "cuda", "devices", devices);
}

static void cuda_destroy(executor_t *base, int timeout_ms)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    ex->stopping = true;
    ex->drain_deadline_ns = cuda_now_ns() + (int64_t)timeout_ms * 1000000;
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
        if (!ex->devices[d].abandoned) cuda_worker_release(&ex->devices[d]);
    }
    if (abandoned) return;
    pthread_mutex_destroy(&ex->lock);
    pthread_cond_destroy(&ex->cond);
    free(ex->devices);
    free(ex);
}

static bool cuda_serves_device(executor_t *base, int device)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    bool served = serves_device_locked(ex, device);
    pthread_mutex_unlock(&ex->lock);
    return served;
}

/* A job of b was cancelled. A batch still in its device's queue leaves the job out when it is
 * launched (cuda_slots.c; one left with no job is reported without a launch). A batch on a slot
 * runs on, since a launched kernel cannot be stopped: the job's outputs are not copied out of
 * staging (its result is dropped) while its batch-mates keep theirs, and the batch's device
 * memory, the job's included, goes back to the pool as soon as its stream work completes. */
static exec_cancel_t cuda_cancel(executor_t *base, exec_batch_t *b, job_t *job)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    exec_cancel_t outcome = EXEC_CANCEL_DROPPED;
    pthread_mutex_lock(&ex->lock);
    exec_job_cancel(job);
    for (int d = 0; d < ex->n_devices; d++) {
        const device_worker_t *dw = &ex->devices[d];
        for (int i = 0; i < dw->q_len; i++)
            if (dw->queue[(dw->q_head + i) % dw->q_cap] == b) outcome = EXEC_CANCEL_DEQUEUED;
    }
    pthread_mutex_unlock(&ex->lock);
    return outcome;
}

static const executor_ops_t cuda_ops = {
    .name = "cuda",
    .backend = OP_BACKEND_CUDA,
    .submit = cuda_submit,
    .free_slots = cuda_free_slots,
    .describe = cuda_describe,
    .destroy = cuda_destroy,
    .place_buffer = cuda_place_buffer,
    .buffer_added = cuda_buffer_added,
    .buffer_deleted = cuda_buffer_deleted,
    .upload_open = cuda_upload_open,
    .upload_write = cuda_upload_write,
    .upload_keep = cuda_upload_keep,
    .upload_abort = cuda_upload_abort,
    .serves_device = cuda_serves_device,
    .abandon = cuda_abandon,
    .cancel = cuda_cancel,
    .fit = cuda_fit,
    .unfit = cuda_unfit,
    .memory_pool = cuda_memory_pool,
};

int exec_cuda_new(const config_t *cfg, const exec_blob_reader_t *blobs, executor_t **ret)
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
    ex->blobs = *blobs;
    ex->devices = devices;
    pthread_mutex_init(&ex->lock, NULL);
    pthread_cond_init(&ex->cond, NULL);
    for (int d = 0; d < present; d++) {
        device_worker_t *dw = &ex->devices[ex->n_devices];
        int r = cuda_worker_init(ex, dw, d);
        if (r < 0) log_error("gpu %d: initialisation failed: %s", d, strerror(-r));
        /* A device left out gets no context: no memory or time spent on it. */
        if (r < 0 || !cuda_device_selected(cfg->devices, d, dw->uuid)) {
            cuda_worker_release(dw);
            memset(dw, 0, sizeof *dw);
            continue;
        }
        ex->n_devices++;
    }
    cuda_devices_setup(ex);
    if (ex->n_devices == 0) {
        cuda_destroy(&ex->base, 0);
        return -ENODEV;
    }
    for (int d = 0; d < ex->n_devices; d++) {
        device_worker_t *dw = &ex->devices[d];
        dw->thread_started = pthread_create(&dw->thread, NULL, cuda_device_thread, dw) == 0;
        if (!dw->thread_started) dw->state = DEVICE_FAILED;
    }
    *ret = &ex->base;
    return 0;
}
