/* Maintenance on the loop's timers (the retention sweep and the store's bound, the store's upkeep,
 * systemd's watchdog) and the drain at stop. */
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"
#include "daemon/util/service_notify.h"

/* The pause between trim passes of one trim, so that the loop serves in between. */
#define TRIM_AGAIN_MS 10

/* Measures the store and, past [store] max_bytes, trims it (store_trim) by one bounded pass.
 * Whether the trim has more to do. */
static bool store_bound(sched_t *s)
{
    store_trim_stats_t t;
    int r = store_trim(s->st, s->cfg->max_bytes, STORE_TRIM_PASS_JOBS, &t);
    if (r < 0) {
        log_error("store bound: trimming the store failed: %s", strerror(-r));
        return false;
    }
    atomic_store(&s->store_bytes, (long)t.bytes);
    atomic_fetch_add(&s->store_expired_bytes_total, (long)t.expired_bytes);
    atomic_fetch_add(&s->store_expired_jobs_total, (long)t.expired_jobs);
    atomic_fetch_add(&s->store_deleted_jobs_total, (long)t.deleted_jobs);
    return t.more;
}

/* The retention sweep every gc_interval_s; with a bound on the store, its check every second
 * in between, so that a burst of jobs overshoots it by at most a second's worth. A trim pass
 * that stopped at its budget goes on after the loop has run other work for TRIM_AGAIN_MS. */
static void on_gc_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    int64_t now = now_us();
    if (now >= s->next_retention_us) {
        s->next_retention_us = now + (int64_t)s->cfg->gc_interval_s * 1000000;
        int deleted = 0;
        int r = store_gc(s->st, now - (int64_t)s->cfg->retention_s * 1000000, &deleted);
        if (r < 0)
            log_error("retention sweep failed: %s", strerror(-r));
        else if (deleted)
            log_info("retention: removed %d finished jobs", deleted);
    }
    if (now >= s->next_fair_save_us) {
        s->next_fair_save_us = now + FAIR_STATE_SAVE_US;
        fair_state_save(s);
    }
    if (store_bound(s)) uv_timer_start(t, on_gc_timer, TRIM_AGAIN_MS, uv_timer_get_repeat(t));
}

static void on_upkeep_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    int r = store_upkeep(s->st);
    if (r < 0) log_warn("the store's upkeep failed: %s", strerror(-r));
    if (s->n_late_charges) late_charges_write(s);
}

/* The loop turns: systemd's watchdog hears it (service_notify.h). */
static void on_watchdog_timer(uv_timer_t *t)
{
    (void)t;
    service_notify("WATCHDOG=1");
}

/* Starts the retention sweep, the store's upkeep, the per-user gauges and, under systemd's
 * watchdog, the heartbeat. */
void timers_start(sched_t *s)
{
    uint64_t gc_ms = s->cfg->max_bytes > 0 ? 1000 : (uint64_t)s->cfg->gc_interval_s * 1000;
    uv_timer_start(&s->gc_timer, on_gc_timer, 1000, gc_ms);
    uint64_t upkeep_ms = store_upkeep_interval_ms(s->st);
    uv_timer_start(&s->upkeep_timer, on_upkeep_timer, upkeep_ms, upkeep_ms);
    uint64_t watchdog_ms = service_watchdog_usec() / 1000;
    if (watchdog_ms > 0) /* twice per interval, as sd_watchdog_enabled(3) advises */
        uv_timer_start(&s->watchdog_timer, on_watchdog_timer, 0,
                       watchdog_ms / 2 > 0 ? watchdog_ms / 2 : 1);
    batch_watchdog_start(s);
    user_gauges_start(s);
}

/* ---------------------------------------------------------------------------- drain */

/* Ends the loop once stopping and no batch is running any more. */
void stop_if_drained(sched_t *s)
{
    /* A batch the watchdog gave up on is not waited for: it may never come back. */
    if (!s->stopping || s->batches_in_flight - atomic_load(&s->stuck_batches) > 0) return;
    uv_timer_stop(&s->drain_timer);
    uv_stop(&s->loop);
}

static void on_drain_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    log_warn("drain timeout: %d batches still running; their jobs re-run after the next start",
             s->batches_in_flight);
    uv_stop(&s->loop);
}

/* The stop, once the round has committed the accepted submissions (they run after a
 * restart): waiters are answered with their jobs as they stand, and the loop ends when the
 * running batches have finished (stop_if_drained, the round's last phase) or
 * drain_timeout_ms has passed. */
void handle_stop(sched_t *s)
{
    waiters_answer_all(s);
    uv_timer_start(&s->drain_timer, on_drain_timer, (uint64_t)s->cfg->drain_timeout_ms, 0);
}
