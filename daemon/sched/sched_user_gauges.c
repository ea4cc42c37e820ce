/* Jobs queued and running per user, as the loop counts them for fair share (each user's queue
 * length and running count), read two ways from one routine (user_counts_collect):
 *
 * - the per-user gauges of /metrics (sched_get_user_gauges): every SCHED_USER_GAUGES_MS the
 *   loop keeps the SCHED_USER_GAUGES_MAX users with the most jobs queued and copies them under
 *   a lock that a scrape holds only for a copy of them. A scrape thus does no work in the
 *   number of users and never waits for the loop, at the price of a reading up to a period
 *   old: fit for a scraper that polls every few seconds and keeps a time series.
 * - the per-user rows of /v1/stats (sched_user_counts): a message the loop answers with every
 *   user's counts (or the caller's alone) as they stand, by name. A status page and an API
 *   reader want the counts of now, of every user, which the cap and the period would cut. */
#include <errno.h>
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

/* Gathers into rows the counts of every user with jobs queued or running, or of owner alone
 * when owner is not NULL: the one routine both readings use. 0, or -ENOMEM with rows freed. */
static int user_counts_collect(sched_t *s, const char *owner, gauge_rows_t *rows)
{
    if (!owner) {
        strmap_foreach(s->users, gauge_collect, rows);
    } else {
        user_t *u = strmap_get(s->users, owner);
        if (u) gauge_collect(owner, u, rows);
    }
    if (!rows->failed) return 0;
    free(rows->a);
    *rows = (gauge_rows_t){0};
    return -ENOMEM;
}

/* Publishes the users' counts now. Out of memory, the last snapshot stays, and the log says
 * so: the gauges are a view, not worth failing anything for. */
static void user_gauges_publish(sched_t *s)
{
    gauge_rows_t rows = {0};
    if (user_counts_collect(s, NULL, &rows) < 0) {
        log_warn("per-user gauges: out of memory, /metrics keeps the previous reading");
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

static int name_order(const void *a, const void *b)
{
    return strcmp(((const sched_user_gauge_t *)a)->user, ((const sched_user_gauge_t *)b)->user);
}

void handle_user_counts(sched_t *s, msg_t *m)
{
    gauge_rows_t rows = {0};
    int r = user_counts_collect(s, m->any_owner ? NULL : m->owner, &rows);
    if (r < 0) {
        reply_err(m->reply, m->token, r, "out of memory counting the users' jobs");
        return;
    }
    if (rows.n > 1) qsort(rows.a, rows.n, sizeof *rows.a, name_order);
    sched_result_t res = {.users = rows.a, .n_users = rows.n};
    m->reply(m->token, &res);
    free(rows.a);
}
