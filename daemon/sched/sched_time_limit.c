/* Running jobs' own time limits (job_t.time_limit_ms). A job's clock starts when its own run
 * starts in the executor (exec_job_run_started: its batch's launch on a GPU; on the CPU the
 * moment its worker comes to it, since a batch's jobs run there one after the other), so that
 * neither a wait in a device's queue nor a batch-mate's run counts against it. Past its limit
 * the job ends `failed` with `time_limit` through running_end, the path of every running job
 * ended before its batch returns (its waiters are answered, and its result is dropped when the
 * batch comes back), and the executor is told as for a cancel: the CPU backend stops the job at
 * its op's next look at its flag and goes on with the batch's other jobs; a launched kernel
 * cannot be stopped, so on CUDA the launch runs on and the job's outputs are dropped while its
 * batch-mates keep theirs. Jobs of different limits therefore batch together: each limit is
 * its own job's alone.
 *
 * A CPU op that does not look at its flag within TIME_LIMIT_GRACE_MS of the stop loses its
 * worker: the executor starts a replacement (executor_ops_t.stop_overdue), as the watchdog has
 * it do for a stuck batch, so that the slot comes back while the old worker finishes alone.
 *
 * One timer serves every limit: it is due at the earliest moment a running job may pass its
 * limit, and each firing looks at the batches in flight. A job whose run has not started (in
 * a device's queue, or behind a batch-mate on the CPU) cannot pass its limit before now plus
 * that limit, which bounds the next look. Times are on the monotonic clock (mono_us()). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "sched_internal.h"

/* How long a CPU job stopped at its limit may go on before its worker is replaced. */
#define TIME_LIMIT_GRACE_MS 1000

/* (Re)arms the timer for due (mono_us()) unless it is due sooner already. */
static void time_limit_arm(sched_t *s, int64_t due, int64_t now);

/* Fails job, past its limit, and has the executor stop it or drop its result. */
static void time_limit_expire(sched_t *s, sched_batch_t *sb, job_t *job, int64_t now)
{
    entry_t *e = entry_of(s, job);
    char message[ERROR_MESSAGE_SIZE];
    snprintf(message, sizeof message,
             "the job ran past its time limit of %" PRId64 " ms (time_limit_ms) and was %s",
             job->time_limit_ms, s->ex->ops->stops_running ? "stopped" : "dropped");
    int r = running_end(s, e, JOB_FAILED, "time_limit", message, NULL, NULL);
    if (r < 0) {
        log_error("job %s: its time limit's failure could not be recorded (%s): it ends when its "
                  "batch comes back",
                  job->id, strerror(-r));
        return;
    }
    exec_cancel_t outcome = EXEC_CANCEL_DROPPED;
    if (s->ex->ops->cancel) outcome = s->ex->ops->cancel(s->ex, &sb->batch, job);
    log_info("job %s: past its time limit of %" PRId64 " ms: failed, its run %s", job->id,
             job->time_limit_ms, outcome == EXEC_CANCEL_STOPPED ? "stopped" : "dropped");
    if (outcome == EXEC_CANCEL_STOPPED) {
        sb->stopping = job;
        sb->stopping_since_us = now;
    }
}

/* Looks at one batch in flight: fails its jobs past their limits, replaces the worker of one
 * that did not stop within the grace (*ret_replaced: a worker was); returns the earliest moment
 * it needs another look (INT64_MAX: none). */
static int64_t batch_look(sched_t *s, sched_batch_t *sb, int64_t now, bool *ret_replaced)
{
    int64_t next = INT64_MAX;
    exec_batch_t *b = &sb->batch;
    for (int i = 0; !sb->expired && i < b->n; i++) {
        job_t *job = b->jobs[i];
        if (job->time_limit_ms <= 0 || entry_of(s, job)->discard_result || exec_job_run_ended(job))
            continue;
        int64_t started = exec_job_run_started(job);
        int64_t due = (started ? started : now) + job->time_limit_ms * 1000;
        if (started && now >= due)
            time_limit_expire(s, sb, job, now);
        else if (due < next)
            next = due;
    }
    if (sb->stopping && exec_job_run_ended(sb->stopping)) sb->stopping = NULL;
    if (sb->stopping) {
        int64_t grace_end = sb->stopping_since_us + TIME_LIMIT_GRACE_MS * 1000;
        if (now < grace_end) {
            if (grace_end < next) next = grace_end;
        } else {
            if (s->ex->ops->stop_overdue && s->ex->ops->stop_overdue(s->ex, b, sb->stopping))
                *ret_replaced = true;
            sb->stopping = NULL;
        }
    }
    return next;
}

static void on_time_limit_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    s->time_limit_due_us = 0;
    int64_t now = mono_us(), next = INT64_MAX;
    bool replaced = false;
    queue_t *q;
    queue_foreach(q, &s->in_flight)
    {
        int64_t due = batch_look(s, queue_data(q, sched_batch_t, flight), now, &replaced);
        if (due < next) next = due;
    }
    if (next != INT64_MAX) time_limit_arm(s, next, now);
    if (!replaced) return;
    s->want.dispatch = true; /* the replacement worker takes work */
    sched_round(s, false);
}

static void time_limit_arm(sched_t *s, int64_t due, int64_t now)
{
    if (s->time_limit_due_us && s->time_limit_due_us <= due) return;
    s->time_limit_due_us = due;
    int64_t wait_us = due - now;
    uv_timer_start(&s->time_limit_timer, on_time_limit_timer,
                   wait_us > 0 ? (uint64_t)(wait_us + 999) / 1000 : 0, 0);
}

void time_limit_track(sched_t *s, const sched_batch_t *sb)
{
    int64_t least_ms = 0;
    for (int i = 0; i < sb->batch.n; i++) {
        int64_t ms = sb->batch.jobs[i]->time_limit_ms;
        if (ms > 0 && (least_ms == 0 || ms < least_ms)) least_ms = ms;
    }
    if (least_ms == 0) return;
    /* Its runs start now at the soonest. */
    int64_t now = mono_us();
    time_limit_arm(s, now + least_ms * 1000, now);
}
