/* The batch watchdog: a batch handed to the executor that has not come back within a bound
 * derived from its cost estimate is given up on. Its jobs fail with `watchdog_timeout` (in the
 * store, and for their waiters) and the executor is asked to recover (executor_ops_t.abandon);
 * the batch itself stays in flight, its jobs kept in memory, until the executor reports it,
 * since a stuck worker may still write to them. Meanwhile it counts as stuck: /readyz answers
 * 503 and /metrics shows it.
 *
 * A batch's clock starts when the executor starts to run it (exec_batch_t.started_us), not when
 * the scheduler hands it over: a CUDA batch may wait in its device's queue behind others, and
 * that wait is not its own lack of progress. A batch not started yet is not watched; the batch
 * ahead of it is, and the executor's recovery from that one gives back or reports the batches
 * waiting behind it. Durations are measured on the monotonic clock (mono_us()), which a step of
 * the wall clock does not stretch or shrink. */
#include <stdio.h>
#include <string.h>

#include "sched_internal.h"

/* The timer looks for expired batches a few times per bound, at most once a second. */
#define WATCHDOG_TICK_MAX_MS 1000
#define WATCHDOG_TICK_MIN_MS 10

int64_t sched_watchdog_bound_ms(const config_t *cfg, job_t *const *jobs, int n)
{
    if (cfg->watchdog_min_ms <= 0) return 0;
    /* op_cost_ms's rates are what a single CPU worker running the ops' plain C references
     * sustains at the least; the CUDA backend is much faster, so the bound leaves it more
     * room still. */
    double ms = 0;
    for (int i = 0; i < n; i++)
        ms += op_cost_ms(jobs[i]->call.cost);
    ms *= cfg->watchdog_cost_factor;
    /* A year caps a cost no run could reach (and keeps the sum an exact integer). */
    const double cap_ms = 365.0 * 24 * 3600 * 1000;
    if (!(ms < cap_ms)) ms = cap_ms;
    return ms > cfg->watchdog_min_ms ? (int64_t)ms : cfg->watchdog_min_ms;
}

/* A batch the executor just accepted is in flight from now on (where a cancel finds it), and
 * watched when it has a bound. */
void batch_watchdog_track(sched_t *s, sched_batch_t *sb)
{
    sb->bound_ms = sched_watchdog_bound_ms(s->cfg, sb->batch.jobs, sb->batch.n);
    queue_insert_tail(&s->in_flight, &sb->flight);
}

/* A batch leaves the executor's hands (its end, or its return for a retry). */
void batch_flight_end(sched_t *s, const sched_batch_t *sb)
{
    s->batches_in_flight--;
    if (sb->expired) atomic_fetch_sub(&s->stuck_batches, 1);
}

/* Gives up on sb: its jobs end failed now, naming the bound, and the executor recovers. A job
 * already ended (cancelled while running) is left as it is; one whose failure the store
 * refuses ends when the batch comes back, as the executor reports it. */
static void batch_expire(sched_t *s, sched_batch_t *sb, int64_t now)
{
    exec_batch_t *b = &sb->batch;
    sb->expired = true;
    atomic_fetch_add(&s->watchdog_expired_total, 1);
    atomic_fetch_add(&s->stuck_batches, 1);
    log_error("watchdog: a batch of %d %s job(s) has run %lld ms, past its bound of %lld ms: "
              "its jobs fail and the %s backend recovers",
              b->n, b->jobs[0]->call.op->name, (long long)((now - exec_batch_started_us(b)) / 1000),
              (long long)sb->bound_ms, s->ex->ops->name);
    char message[ERROR_MESSAGE_SIZE];
    snprintf(message, sizeof message,
             "the job made no progress within the watchdog's bound of %lld ms (derived from its "
             "cost estimate); its worker or device is being recovered",
             (long long)sb->bound_ms);
    for (int i = 0; i < b->n; i++) {
        entry_t *e = entry_of(s, b->jobs[i]);
        if (e->discard_result) continue;
        int r = running_end(s, e, JOB_FAILED, "watchdog_timeout", message, NULL, NULL);
        if (r < 0)
            log_error("job %s: its watchdog failure could not be recorded (%s): it ends when "
                      "its batch comes back",
                      b->jobs[i]->id, strerror(-r));
    }
    if (s->ex->ops->abandon) s->ex->ops->abandon(s->ex, b);
}

/* The first watched batch, started, past its bound and not expired yet, or NULL; now is
 * mono_us(). */
static sched_batch_t *first_overdue(sched_t *s, int64_t now)
{
    queue_t *q;
    queue_foreach(q, &s->in_flight)
    {
        sched_batch_t *sb = queue_data(q, sched_batch_t, flight);
        int64_t started = exec_batch_started_us(&sb->batch);
        if (sb->bound_ms > 0 && !sb->expired && started > 0 && now - started > sb->bound_ms * 1000)
            return sb;
    }
    return NULL;
}

/* Expires every overdue batch, one at a time (an expiry may end or add batches), then lets
 * the round give the capacity the executor got back work. */
static void on_batch_watchdog_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    int64_t now = mono_us();
    bool any = false;
    for (sched_batch_t *sb; (sb = first_overdue(s, now)); any = true)
        batch_expire(s, sb, now);
    if (!any) return;
    s->want.dispatch = true;
    sched_round(s, false);
}

/* Starts looking for stuck batches, unless scheduler.watchdog_min_ms is 0. */
void batch_watchdog_start(sched_t *s)
{
    int tick = s->cfg->watchdog_min_ms / 4;
    if (s->cfg->watchdog_min_ms <= 0) return;
    if (tick > WATCHDOG_TICK_MAX_MS) tick = WATCHDOG_TICK_MAX_MS;
    if (tick < WATCHDOG_TICK_MIN_MS) tick = WATCHDOG_TICK_MIN_MS;
    uv_timer_start(&s->batch_watchdog_timer, on_batch_watchdog_timer, (uint64_t)tick,
                   (uint64_t)tick);
}
