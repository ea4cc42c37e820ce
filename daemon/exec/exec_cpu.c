/* The CPU backend: a pool of worker threads running the ops' CPU references, one batch at a
 * time per worker, behind the executor interface. Each worker reads input bytes that are not in
 * memory through a blob reader of its own.
 *
 * A worker stuck in a batch the scheduler's watchdog gave up on (abandon) cannot be stopped
 * safely: a replacement worker takes its place, so that the pool keeps its size, and the stuck
 * one reports its batch whenever it returns and then exits.
 *
 * A cancelled job (cancel) is skipped when its worker comes to it, or stopped at the next check
 * of its op's CPU code (op_call_t.cancel points at the job's flag): its worker goes on with the
 * batch's other jobs, and is free for the next batch as soon as the batch is done.
 *
 * Its working memory may be bounded (scheduler.cpu_memory_cap), as a GPU's pool is: fit() lets
 * a batch in while the batches let in before and not yet reported leave room for its inputs and
 * outputs, so that the scheduler holds back one that does not fit, and tests without a GPU see
 * the same admission. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "daemon/util/crash_guard.h"
#include "daemon/util/stamp.h"
#include "daemon/util/id.h"
#include "daemon/util/log.h"
#include "exec_ephemeral.h"
#include "exec_guard.h"
#include "exec_time.h"
#include "exec_inputs.h"
#include "executor.h"

typedef struct cpu_exec cpu_exec_t;

/* One worker thread and the batch it runs; guarded by the executor's lock. */
typedef struct cpu_worker {
    cpu_exec_t *ex;
    pthread_t thread;
    exec_batch_t *batch; /* running now, or NULL */
    int job_index;       /* the batch's job it runs or is about to run */
    bool replaced;       /* its batch was abandoned: another worker took its place */
} cpu_worker_t;

struct cpu_exec {
    executor_t base;
    exec_blob_reader_t blobs;
    ephemeral_table_t ephemeral; /* ephemeral buffers' bytes, kept in host memory */
    int n_threads;               /* the pool's size */
    cpu_worker_t **workers;      /* every worker started, replacements included */
    int n_started, workers_cap;
    pthread_mutex_t lock;
    pthread_cond_t work_cond; /* a batch was queued, or stopping */
    pthread_cond_t idle_cond; /* a batch finished */
    exec_batch_t **queue;     /* ring of accepted batches not yet started */
    int q_head, q_len, q_cap;
    int busy;
    /* Working memory: the bound on the inputs' and outputs' bytes of the batches fit() let in
     * (scheduler.cpu_memory_cap; 0: none), and what those not reported yet hold. */
    uint64_t mem_cap, mem_held;
    bool stopping;
    bool abandoned; /* destroy gave up waiting: finished batches are no longer reported */
    int reporting;  /* workers inside the done callback */
    int exited;     /* workers that left their loop */
};

/* Points in[] at the job's input bytes: those in memory, an ephemeral buffer's copy (lent:
 * borrowed[j] is set, and the caller releases it), or bytes read into the tensor. 0, or -1
 * with the job's error set. */
static int fetch_inputs(cpu_exec_t *ex, void *rd, job_t *job, const void **in, bool *borrowed)
{
    const op_call_t *call = &job->call;
    char why[ERROR_MESSAGE_SIZE];
    for (int j = 0; j < call->op->n_inputs; j++) {
        if (!call->has_in[j]) continue;
        job_tensor_t *t = &job->in[j];
        if (!t->data && t->buffer_id[0] &&
            (in[j] = ephemeral_table_acquire(&ex->ephemeral, t->buffer_id))) {
            borrowed[j] = true;
            continue;
        }
        if (!t->data && exec_input_load(&ex->blobs, rd, t, why, sizeof why) < 0) {
            job_set_error(job, "input_unavailable", "%s", why);
            return -1;
        }
        in[j] = t->data;
    }
    return 0;
}

static void run_call(job_t *job, const void **in)
{
    const op_call_t *call = &job->call;
    void *out[OP_MAX_TENSORS] = {0};
    job_describe_outputs(job);
    for (int j = 0; j < call->n_out; j++) {
        job_tensor_t *t = &job->out[j];
        t->data = malloc(t->nbytes ? t->nbytes : 1);
        if (!t->data) {
            job_set_error(job, "out_of_memory", "no host memory for output '%s' (%llu bytes)",
                          t->name, (unsigned long long)t->nbytes);
            return;
        }
        out[j] = t->data;
    }
    op_error_t err = {0};
    int r = call->op->run_cpu(call, in, out, &err);
    if (r == -ECANCELED)
        job_set_error(job, "cancelled", "stopped while running: the job was cancelled");
    else if (r < 0)
        job_set_error(job, "op_failed", "%s%s%s", err.field, err.field[0] ? ": " : "", err.message);
}

static void run_job(cpu_exec_t *ex, void *rd, job_t *job)
{
    const void *in[OP_MAX_TENSORS] = {0};
    bool borrowed[OP_MAX_TENSORS] = {0};
    if (fetch_inputs(ex, rd, job, in, borrowed) == 0) run_call(job, in);
    for (int j = 0; j < OP_MAX_TENSORS; j++)
        if (borrowed[j]) ephemeral_table_release(&ex->ephemeral, job->in[j].buffer_id);
}

/* The working memory fit() held for batch goes back: the batch is being reported. Caller holds
 * the lock. */
static void release_locked(cpu_exec_t *ex, exec_batch_t *batch)
{
    if (!batch->held) return;
    ex->mem_held -= batch->held_bytes;
    batch->held = false;
}

/* Runs the batch's jobs one after the other, each marked alone in the crash guard while it
 * runs, so that a job that crashes the process is failed at the next start instead of run
 * again, and the batch's other jobs (finished, or not started yet, maybe other users') re-run
 * as after a kill -9 instead of failing with it. */
static void run_batch(cpu_worker_t *w, void *rd, exec_batch_t *batch)
{
    cpu_exec_t *ex = w->ex;
    int64_t start = mono_us();
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        job->run_device = -1;
        job->batch_size = batch->n;
        /* Under the lock, so that a cancel either sees this job started or the job sees it. */
        pthread_mutex_lock(&ex->lock);
        w->job_index = i;
        pthread_mutex_unlock(&ex->lock);
        if (exec_job_cancelled(job)) {
            exec_job_skip(job, "cancelled before it ran");
            continue;
        }
        if (!rd) {
            job_set_error(job, "store_failed", "the worker cannot read the store");
            continue;
        }
        exec_guard_job(job);
        exec_job_run_start(job, mono_us());
        run_job(ex, rd, job);
        exec_job_run_end(job, mono_us());
        exec_guard_clear();
    }
    /* The CPU is this backend's device: the batch's time on the worker is shared as a GPU's. */
    exec_time_share(batch, (mono_us() - start) * 1000);
}

static void *worker(void *arg)
{
    cpu_worker_t *w = arg;
    cpu_exec_t *ex = w->ex;
    prctl(PR_SET_NAME, "gj-cpu");
    if (crash_guard_thread_enter(1) < 0)
        log_warn("cpu worker: no memory for its crash guard: a job that crashes it re-runs");
    void *rd = NULL;
    int r = ex->blobs.open(ex->blobs.ctx, &rd);
    if (r < 0) log_error("cpu worker: cannot open a store reader: %s", strerror(-r));
    pthread_mutex_lock(&ex->lock);
    for (;;) {
        while (ex->q_len == 0 && !ex->stopping)
            pthread_cond_wait(&ex->work_cond, &ex->lock);
        if (ex->q_len == 0) break;
        exec_batch_t *batch = ex->queue[ex->q_head];
        ex->q_head = (ex->q_head + 1) % ex->q_cap;
        ex->q_len--;
        ex->busy++;
        w->batch = batch;
        w->job_index = 0;
        exec_batch_started(batch, mono_us());
        pthread_mutex_unlock(&ex->lock);

        STAMP(EXEC_STARTED);
        run_batch(w, rd, batch);
        STAMP(EXEC_DONE);

        /* The slot is free before the scheduler hears of the batch, so that the dispatch
         * its report triggers sees the slot (a replaced worker's slot was freed when its
         * batch was abandoned). While reporting, the worker is counted: destroy waits for
         * reports in progress even past its timeout (the report uses the scheduler, which is
         * freed right after). */
        pthread_mutex_lock(&ex->lock);
        w->batch = NULL;
        ex->busy -= !w->replaced;
        release_locked(ex, batch);
        bool report = !ex->abandoned;
        ex->reporting += report;
        pthread_mutex_unlock(&ex->lock);
        if (report) ex->base.done(batch, ex->base.done_ud);
        pthread_mutex_lock(&ex->lock);
        ex->reporting -= report;
        pthread_cond_broadcast(&ex->idle_cond);
        if (w->replaced) break; /* its replacement serves in its place */
    }
    ex->exited++;
    pthread_cond_broadcast(&ex->idle_cond);
    pthread_mutex_unlock(&ex->lock);
    ex->blobs.close(rd);
    crash_guard_thread_leave();
    return NULL;
}

/* Accepts batch into the ring. Each job's call points at the job's cancel flag from now on
 * (set here, on the loop thread, so that the worker only reads the call), for its op to check. */
static int cpu_submit(executor_t *base, exec_batch_t *batch)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    for (int i = 0; i < batch->n; i++)
        batch->jobs[i]->call.cancel = &batch->jobs[i]->cancel_requested;
    if (ex->mem_cap && !batch->held && exec_batch_device_bytes(batch) > ex->mem_cap) {
        /* Nothing will ever take it: fail the batch through the normal path. */
        for (int i = 0; i < batch->n; i++)
            job_set_error(batch->jobs[i], "exceeds_device_memory",
                          "the job needs %llu bytes of working memory, more than "
                          "scheduler.cpu_memory_cap = %llu allows",
                          (unsigned long long)exec_job_device_bytes(batch->jobs[i]),
                          (unsigned long long)ex->mem_cap);
        ex->base.done(batch, ex->base.done_ud);
        return 0;
    }
    pthread_mutex_lock(&ex->lock);
    int r = -EAGAIN;
    if (!ex->stopping && ex->q_len < ex->q_cap) {
        ex->queue[(ex->q_head + ex->q_len) % ex->q_cap] = batch;
        ex->q_len++;
        pthread_cond_signal(&ex->work_cond);
        r = 0;
    }
    pthread_mutex_unlock(&ex->lock);
    return r;
}

static int cpu_free_slots(executor_t *base, int device)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    int free_slots = ex->stopping ? 0 : ex->q_cap - ex->q_len - ex->busy;
    pthread_mutex_unlock(&ex->lock);
    return free_slots > 0 ? free_slots : 0;
}

static json_t *cpu_describe(executor_t *base)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    return json_pack("{s:s, s:i, s:[]}", "name", "cpu", "threads", ex->n_threads, "devices");
}

/* Starts one more worker. 0, -ENOMEM, or the error of pthread_create. Caller holds the lock
 * (or is the only thread that knows ex). */
static int worker_start_locked(cpu_exec_t *ex)
{
    if (ex->n_started == ex->workers_cap) {
        int cap = ex->workers_cap ? 2 * ex->workers_cap : 4;
        cpu_worker_t **workers = realloc(ex->workers, (size_t)cap * sizeof *workers);
        if (!workers) return -ENOMEM;
        ex->workers = workers;
        ex->workers_cap = cap;
    }
    cpu_worker_t *w = calloc(1, sizeof *w);
    if (!w) return -ENOMEM;
    w->ex = ex;
    int r = pthread_create(&w->thread, NULL, worker, w);
    if (r != 0) {
        free(w);
        return -r;
    }
    ex->workers[ex->n_started++] = w;
    return 0;
}

/* Takes batch out of the ring of batches not yet started; false when it is not there. Caller
 * holds the lock. */
static bool unqueue_locked(cpu_exec_t *ex, const exec_batch_t *batch)
{
    for (int i = 0; i < ex->q_len; i++) {
        if (ex->queue[(ex->q_head + i) % ex->q_cap] != batch) continue;
        for (int k = i; k + 1 < ex->q_len; k++)
            ex->queue[(ex->q_head + k) % ex->q_cap] = ex->queue[(ex->q_head + k + 1) % ex->q_cap];
        ex->q_len--;
        return true;
    }
    return false;
}

/* The watchdog gave up on batch. Not started yet (every worker is stuck), it is reported at
 * once, on the calling thread as executor.h allows, never run, each job failed with
 * `watchdog_timeout`: a job whose failure the scheduler could not record ends as reported, and
 * must not end `succeeded` with no outputs. Running, its worker is left to finish it (a thread
 * cannot be stopped safely in the middle of an op) and reports it then; its slot is freed now and a
 * replacement worker started, so that the pool keeps its size. */
static void cpu_abandon(executor_t *base, exec_batch_t *batch)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    bool queued = unqueue_locked(ex, batch);
    cpu_worker_t *stuck = NULL;
    for (int i = 0; !queued && i < ex->n_started; i++)
        if (ex->workers[i]->batch == batch && !ex->workers[i]->replaced) stuck = ex->workers[i];
    int r = stuck && !ex->stopping ? worker_start_locked(ex) : 0;
    if (stuck && r == 0 && !ex->stopping) {
        stuck->replaced = true;
        ex->busy--;
    }
    pthread_mutex_unlock(&ex->lock);
    if (r < 0)
        log_error("cpu backend: no replacement for a stuck worker (%s): one worker fewer until "
                  "it returns",
                  strerror(-r));
    else if (stuck)
        log_warn("cpu backend: a worker is stuck in an abandoned batch; a replacement serves");
    if (!queued) return;
    pthread_mutex_lock(&ex->lock);
    release_locked(ex, batch);
    pthread_mutex_unlock(&ex->lock);
    for (int i = 0; i < batch->n; i++)
        job_set_error(batch->jobs[i], "watchdog_timeout",
                      "the job waited for a CPU worker past the watchdog's bound, every worker "
                      "being stuck, and never ran");
    ex->base.done(batch, ex->base.done_ud);
}

/* The index of job in batch, or -1. */
static int job_index_in(const exec_batch_t *batch, const job_t *job)
{
    for (int i = 0; i < batch->n; i++)
        if (batch->jobs[i] == job) return i;
    return -1;
}

/* A job stopped at its time limit (cancel said EXEC_CANCEL_STOPPED) still runs: its op does not
 * look at its flag often enough. Its worker is left to it, as to a batch abandoned by the
 * watchdog, and a replacement takes its place in the pool; the stuck worker then goes on with
 * the batch's jobs after it (skipping those cancelled) and reports the batch whenever it
 * returns. False when no worker runs the job any more. */
static bool cpu_stop_overdue(executor_t *base, exec_batch_t *batch, job_t *job)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    int at = job_index_in(batch, job);
    cpu_worker_t *stuck = NULL;
    for (int i = 0; at >= 0 && i < ex->n_started; i++) {
        cpu_worker_t *w = ex->workers[i];
        if (w->batch == batch && !w->replaced && w->job_index == at && !exec_job_run_ended(job))
            stuck = w;
    }
    int r = stuck && !ex->stopping ? worker_start_locked(ex) : -ECANCELED;
    if (r == 0) {
        stuck->replaced = true;
        ex->busy--;
    }
    pthread_mutex_unlock(&ex->lock);
    if (r == 0)
        log_warn("cpu backend: job %s did not stop at its time limit; a replacement worker "
                 "serves while its worker finishes it",
                 job->id);
    else if (stuck && r != -ECANCELED)
        log_error("cpu backend: no replacement for the worker of job %s (%s): one worker fewer "
                  "until it returns",
                  job->id, strerror(-r));
    return r == 0;
}

/* A job of batch was cancelled. In a batch not started yet it is skipped when a worker takes
 * the batch; once every job of such a batch is cancelled, the batch leaves the ring and is
 * reported at once, on the calling thread, as executor.h allows. In a running batch, the job
 * being run is stopped at its op's next check, one not reached yet is skipped, and one already
 * run keeps nothing (the scheduler drops its result). */
static exec_cancel_t cpu_cancel(executor_t *base, exec_batch_t *batch, job_t *job)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    exec_cancel_t outcome = EXEC_CANCEL_DROPPED;
    pthread_mutex_lock(&ex->lock);
    exec_job_cancel(job);
    bool report = false;
    for (int i = 0; i < ex->q_len; i++)
        if (ex->queue[(ex->q_head + i) % ex->q_cap] == batch) outcome = EXEC_CANCEL_DEQUEUED;
    if (outcome == EXEC_CANCEL_DEQUEUED && exec_batch_all_cancelled(batch))
        report = unqueue_locked(ex, batch);
    if (report) release_locked(ex, batch);
    for (int i = 0; outcome != EXEC_CANCEL_DEQUEUED && i < ex->n_started; i++) {
        const cpu_worker_t *w = ex->workers[i];
        if (w->batch != batch) continue;
        int at = job_index_in(batch, job);
        outcome = at == w->job_index  ? EXEC_CANCEL_STOPPED
                  : at > w->job_index ? EXEC_CANCEL_DEQUEUED
                                      : EXEC_CANCEL_DROPPED;
    }
    pthread_mutex_unlock(&ex->lock);
    if (report) {
        for (int i = 0; i < batch->n; i++)
            exec_job_skip(batch->jobs[i], "cancelled before it ran");
        ex->base.done(batch, ex->base.done_ud);
    }
    return outcome;
}

/* The CPU backend has one pool, its working memory: a batch fits while the batches let in and
 * not yet reported leave room for its inputs and outputs. */
static int cpu_fit(executor_t *base, exec_batch_t *b)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    if (!ex->mem_cap) return 0;
    uint64_t need = exec_batch_device_bytes(b);
    if (need > ex->mem_cap) return -E2BIG;
    pthread_mutex_lock(&ex->lock);
    int r = ex->mem_held + need > ex->mem_cap ? -ENOSPC : 0;
    if (r == 0) {
        ex->mem_held += need;
        b->held = true;
        b->held_device = -1;
        b->held_bytes = need;
    }
    pthread_mutex_unlock(&ex->lock);
    return r;
}

static void cpu_unfit(executor_t *base, exec_batch_t *b)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    pthread_mutex_lock(&ex->lock);
    release_locked(ex, b);
    pthread_mutex_unlock(&ex->lock);
}

static uint64_t cpu_memory_pool(executor_t *base, uint64_t *ret_largest, const char **ret_key)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    *ret_largest = ex->mem_cap;
    *ret_key = "scheduler.cpu_memory_cap";
    return ex->mem_cap;
}

static void cpu_destroy(executor_t *base, int timeout_ms)
{
    cpu_exec_t *ex = (cpu_exec_t *)base;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (deadline.tv_nsec >= 1000000000) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&ex->lock);
    ex->stopping = true;
    pthread_cond_broadcast(&ex->work_cond);
    while (ex->exited < ex->n_started &&
           pthread_cond_timedwait(&ex->idle_cond, &ex->lock, &deadline) == 0)
        ;
    bool all_exited = ex->exited == ex->n_started;
    if (!all_exited) {
        ex->abandoned = true;
        while (ex->reporting > 0)
            pthread_cond_wait(&ex->idle_cond, &ex->lock);
    }
    pthread_mutex_unlock(&ex->lock);
    if (!all_exited) {
        /* A worker is stuck in a long op: leave it (and this struct) to process exit. */
        log_warn("cpu backend: %d workers still busy at shutdown", ex->n_started - ex->exited);
        for (int i = 0; i < ex->n_started; i++)
            pthread_detach(ex->workers[i]->thread);
        return;
    }
    for (int i = 0; i < ex->n_started; i++) {
        pthread_join(ex->workers[i]->thread, NULL);
        free(ex->workers[i]);
    }
    pthread_mutex_destroy(&ex->lock);
    pthread_cond_destroy(&ex->work_cond);
    pthread_cond_destroy(&ex->idle_cond);
    ephemeral_table_destroy(&ex->ephemeral);
    free(ex->workers);
    free(ex->queue);
    free(ex);
}

/* An ephemeral upload on the CPU backend: its bytes land in host memory allocated for all of
 * them at the open (its pages touched only as they arrive), which becomes the resident copy
 * without a copy. */
typedef struct cpu_upload {
    exec_upload_t base;
    char *data;
} cpu_upload_t;

static int cpu_upload_open(executor_t *base, int device, uint64_t nbytes, exec_upload_t **ret)
{
    if (nbytes >= SIZE_MAX) return -ENOMEM;
    cpu_upload_t *u = calloc(1, sizeof *u);
    char *data = malloc(nbytes ? (size_t)nbytes : 1);
    if (!u || !data) {
        free(u);
        free(data);
        return -ENOMEM;
    }
    u->base = (exec_upload_t){.ex = base, .nbytes = nbytes, .device = device};
    u->data = data;
    *ret = &u->base;
    return 0;
}

static int cpu_upload_write(exec_upload_t *up, const void *data, size_t n)
{
    memcpy(((cpu_upload_t *)up)->data + up->written, data, n);
    return 0;
}

static int cpu_upload_keep(exec_upload_t *up, const char *id)
{
    cpu_upload_t *u = (cpu_upload_t *)up;
    int r = ephemeral_table_add(&((cpu_exec_t *)up->ex)->ephemeral, id, u->data);
    free(u);
    return r;
}

static void cpu_upload_abort(exec_upload_t *up)
{
    if (!up) return;
    free(((cpu_upload_t *)up)->data);
    free(up);
}

static void cpu_buffer_deleted(executor_t *base, const char *id)
{
    ephemeral_table_delete(&((cpu_exec_t *)base)->ephemeral, id);
}

static const executor_ops_t cpu_ops = {
    .name = "cpu",
    .backend = OP_BACKEND_CPU,
    .stops_running = true,
    .submit = cpu_submit,
    .free_slots = cpu_free_slots,
    .describe = cpu_describe,
    .destroy = cpu_destroy,
    .abandon = cpu_abandon,
    .cancel = cpu_cancel,
    .stop_overdue = cpu_stop_overdue,
    .fit = cpu_fit,
    .unfit = cpu_unfit,
    .memory_pool = cpu_memory_pool,
    .upload_open = cpu_upload_open,
    .upload_write = cpu_upload_write,
    .upload_keep = cpu_upload_keep,
    .upload_abort = cpu_upload_abort,
    .buffer_deleted = cpu_buffer_deleted,
};

int exec_cpu_new(const config_t *cfg, const exec_blob_reader_t *blobs, executor_t **ret)
{
    cpu_exec_t *ex = calloc(1, sizeof *ex);
    if (!ex) return -ENOMEM;
    ex->base.ops = &cpu_ops;
    ex->blobs = *blobs;
    ex->mem_cap = cfg->cpu_memory_cap;
    ephemeral_table_init(&ex->ephemeral);
    ex->n_threads = cfg->cpu_threads > 0 ? cfg->cpu_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ex->n_threads < 1) ex->n_threads = 1;
    /* No batches queued ahead of the workers: a job handed over starts at once, so `running`
     * means running, and everything waiting stays in the scheduler's queues (deadlines, fair
     * share and cancellation apply there). */
    ex->q_cap = ex->n_threads;
    ex->queue = calloc((size_t)ex->q_cap, sizeof *ex->queue);
    if (!ex->queue) {
        free(ex);
        return -ENOMEM;
    }
    pthread_mutex_init(&ex->lock, NULL);
    pthread_cond_init(&ex->work_cond, NULL);
    pthread_cond_init(&ex->idle_cond, NULL);
    int r = 0;
    while (ex->n_started < ex->n_threads && (r = worker_start_locked(ex)) == 0)
        ;
    if (ex->n_started == 0) {
        cpu_destroy(&ex->base, 0);
        return r;
    }
    /* Run with the workers that did start. */
    ex->n_threads = ex->n_started;
    log_info("backend: cpu, %d worker threads", ex->n_threads);
    *ret = &ex->base;
    return 0;
}
