/* Faults: a sticky error loses the device's context for the rest of the process; the worker
 * hands its batches back and the daemon restarts itself (restart.h), which gets the device
 * back. A device that the scheduler's watchdog finds stuck is reset the same way. */
#include <stdio.h>

#include "cuda_internal.h"
#include "daemon/util/log.h"
#include "daemon/util/restart.h"

cudaError_t cuda_sticky_error(void)
{
    cudaGetLastError();
    cudaError_t e = cudaDeviceSynchronize();
    cudaGetLastError();
    return e;
}

/* A batch run before, interrupted by a lost context (or a daemon restart). It runs alone in the
 * process, on whichever device: should it fault again, it is then known to be the culprit and
 * fails, and should it be innocent, it cannot be interrupted by another culprit again. */
bool cuda_is_rerun(const exec_batch_t *b)
{
    for (int i = 0; i < b->n; i++)
        if (b->jobs[i]->attempts > 1) return true;
    return false;
}

void cuda_clear_errors(exec_batch_t *b)
{
    for (int i = 0; i < b->n; i++)
        b->jobs[i]->error_code[0] = b->jobs[i]->error_message[0] = '\0';
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

/* Takes slot k's batch back, deciding its fate, and frees the slot. ran: its done event was
 * reached (cuda_slot_complete() has dealt with it). Caller holds the lock. */
static exec_batch_t *take_back_locked(device_worker_t *dw, int k, bool ran, const char *msg)
{
    slot_t *s = &dw->slots[k];
    /* A batch that failed before its launch keeps its own error. */
    const char *fate = ran ? "had finished" : "had failed before its launch";
    if (!ran && s->launched) {
        if (s == dw->ex->culprit) {
            cuda_fail_batch(s->batch, "cuda_error", msg);
            fate = "caused the fault and fails";
        } else {
            /* Not the fault of its own: the error cuda_slot_complete() read off its stream
             * goes, so that a job out of attempts ends as reset, not as the culprit's error. */
            cuda_clear_errors(s->batch);
            cuda_fail_batch(s->batch, "device_reset", msg);
            s->batch->retry = EXEC_RETRY_INTERRUPTED;
            fate = "was interrupted and runs again alone";
        }
    }
    log_info("gpu %d: the batch of %d %s job(s) on stream %d %s", dw->device, s->batch->n,
             s->batch->jobs[0]->call.op->name, k, fate);
    exec_batch_t *b = s->batch;
    s->batch = NULL;
    s->finished = s->launched = s->ran = s->exclusive = false;
    dw->in_use -= s->reserved;
    s->reserved = 0;
    s->n_used = 0;
    return b;
}

/* A sticky error lost the device's context, for good: no call of this process can use the
 * device again (restart.h). Every batch the worker holds goes back to the scheduler: those whose
 * work had finished with their outputs; the culprit's jobs fail with the error when it was the
 * only launch in flight (else no launch can be told apart, and each runs again while attempts
 * remain, alone in the process: cuda_is_rerun); batches not yet launched run again. The
 * device takes no more work, /readyz and /v1/info show it resetting, and the daemon is asked to
 * drain and restart, which gets the device back. The other devices' workers find their
 * contexts lost too, and hand their batches back the same way. */
void cuda_recover(device_worker_t *dw, cudaError_t why)
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
        if (ran[k]) cuda_slot_complete(&dw->slots[k]);

    pthread_mutex_lock(&ex->lock);
    for (int k = 0; k < dw->n_slots; k++)
        if (dw->slots[k].batch && !dw->slots[k].completing)
            back[n_back++] = take_back_locked(dw, k, ran[k], msg);
    for (; dw->q_len > 0; dw->q_len--) {
        back[n_back] = dw->queue[dw->q_head];
        cuda_release_held_locked(dw, back[n_back]);
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

/* Whether dw holds b, launched or queued. Caller holds the lock. */
static bool holds_batch_locked(const device_worker_t *dw, const exec_batch_t *b)
{
    for (int k = 0; k < dw->n_slots; k++)
        if (dw->slots[k].batch == b) return true;
    for (int i = 0; i < dw->q_len; i++)
        if (dw->queue[(dw->q_head + i) % dw->q_cap] == b) return true;
    return false;
}

/* The scheduler's watchdog gave up on b (it has failed b's jobs): a kernel or copy that never
 * ends cannot be stopped from within the process, so the device holding b is treated as after
 * a sticky fault. It takes no more work, /readyz and /v1/info show it resetting, and the daemon
 * is asked to drain and restart, which gets the device back; b is left to the restart, which
 * does not wait for it. */
void cuda_abandon(executor_t *base, exec_batch_t *b)
{
    cuda_exec_t *ex = (cuda_exec_t *)base;
    int device = -1;
    pthread_mutex_lock(&ex->lock);
    for (int d = 0; d < ex->n_devices && device < 0; d++)
        if (holds_batch_locked(&ex->devices[d], b)) {
            ex->devices[d].state = DEVICE_RESETTING;
            device = ex->devices[d].device;
        }
    pthread_cond_broadcast(&ex->cond);
    pthread_mutex_unlock(&ex->lock);
    if (device < 0) return; /* it came back meanwhile: its done() is on its way */
    log_error("gpu %d: a batch made no progress within the watchdog's bound: restarting the "
              "daemon to reset the device",
              device);
    restart_request(device);
}
