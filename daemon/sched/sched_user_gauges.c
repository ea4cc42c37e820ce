/* The per-user gauges of /metrics (sched_get_user_gauges): every SCHED_USER_GAUGES_MS the loop
 * walks its users once (each user's queue length and running count are already kept for fair
 * share), keeps the SCHED_USER_GAUGES_MAX with the most jobs queued, and copies them under a
 * lock that a scrape holds only for a copy of them. A scrape thus does no work in the queue's
 * length and never waits for the loop, at the price of a reading up to a period old. */
#include <stdlib.h>
#include <string.h>

#include "daemon/util/vec.h"
#include "sched_internal.h"

typedef struct gauge_rows {
    sched_user_gauge_t *a;
    size_t n, cap;
    bool failed;
} gauge_rows_t;

static void gauge_collect(const char *key, void *value, void *ud)
{
    (void)key;
    const user_t *u = value;
    gauge_rows_t *rows = ud;
    if ((u->queue.len == 0 && u->running == 0) || rows->failed) return;
    if (vec_grow((void **)&rows->a, &rows->cap, rows->n + 1, sizeof *rows->a, 16) < 0) {
        rows->failed = true;
        return;
    }
    sched_user_gauge_t *g = &rows->a[rows->n++];
    memcpy(g->user, u->owner, sizeof g->user);
    g->queued = (long)u->queue.len;
    g->running = u->running;
}

/* Most queued first, then most running, then by name: the rows a cap keeps are the users
 * whose queues matter most, in an order that does not change between equal readings. */
static int gauge_order(const void *a, const void *b)
{
    const sched_user_gauge_t *x = a, *y = b;
    if (x->queued != y->queued) return x->queued > y->queued ? -1 : 1;
    if (x->running != y->running) return x->running > y->running ? -1 : 1;
    return strcmp(x->user, y->user);
}

/* Publishes the users' counts now. Out of memory, the last snapshot stays, and the log says
 * so: the gauges are a view, not worth failing anything for. */
static void user_gauges_publish(sched_t *s)
{
    gauge_rows_t rows = {0};
    strmap_foreach(s->users, gauge_collect, &rows);
    if (rows.failed) {
        log_warn("per-user gauges: out of memory, /metrics keeps the previous reading");
        free(rows.a);
        return;
    }
    if (rows.n > 1) qsort(rows.a, rows.n, sizeof *rows.a, gauge_order);
    int n = rows.n < SCHED_USER_GAUGES_MAX ? (int)rows.n : SCHED_USER_GAUGES_MAX;
    pthread_mutex_lock(&s->user_gauges_lock);
    if (n > 0) memcpy(s->user_gauges, rows.a, (size_t)n * sizeof *rows.a);
    s->n_user_gauges = n;
    s->users_with_jobs = (long)rows.n;
    pthread_mutex_unlock(&s->user_gauges_lock);
    free(rows.a);
}

static void on_user_gauges_timer(uv_timer_t *t)
{
    user_gauges_publish(t->data);
}

void user_gauges_start(sched_t *s)
{
    uv_timer_start(&s->user_gauges_timer, on_user_gauges_timer, 0, SCHED_USER_GAUGES_MS);
}

int sched_get_user_gauges(sched_t *s, sched_user_gauge_t *ret, int cap, long *ret_users)
{
    pthread_mutex_lock(&s->user_gauges_lock);
    int n = s->n_user_gauges < cap ? s->n_user_gauges : cap;
    if (n > 0) memcpy(ret, s->user_gauges, (size_t)n * sizeof *ret);
    *ret_users = s->users_with_jobs;
    pthread_mutex_unlock(&s->user_gauges_lock);
    return n;
}
