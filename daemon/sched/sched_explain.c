/* Why a queued job waits, and roughly how many jobs will run before it: computed on the loop
 * when the scheduler answers for a queued job (a wait, or a read that asks the loop), and
 * written into the job's waiting_* fields for its JSON.
 *
 * The position counts the jobs of its own user's queue ahead of it exactly, and estimates
 * those of the other users that fair share will serve meanwhile: each other user with queued
 * jobs gets, per job of ours, its weight over ours in jobs, up to what it has queued. Jobs
 * already running are not counted. The estimate shrinks as the jobs ahead run. */
#include <stdio.h>
#include <string.h>

#include "sched_internal.h"

/* How many entries of e's user's queue come before e (priority, then arrival). */
static long own_ahead(const entry_t *e)
{
    const heap_t *h = &e->user->queue;
    long n = 0;
    for (size_t i = 0; i < h->len; i++)
        n += entry_before(heap_at(h, i), e);
    return n;
}

typedef struct others {
    sched_t *s;
    const user_t *self;
    double share, jobs_per_own; /* self's share; its jobs' count, to scale others' by weight */
    long ahead;                 /* jobs of other users due before the one explained */
} others_t;

static void others_visit(const char *key, void *value, void *ud)
{
    (void)key;
    others_t *o = ud;
    user_t *v = value;
    if (v == o->self || v->queue.len == 0) return;
    double w_self = (double)user_limits(o->s, (user_t *)o->self)->value[CONFIG_POLICY_WEIGHT];
    double w_v = (double)user_limits(o->s, v)->value[CONFIG_POLICY_WEIGHT];
    long due = (long)(o->jobs_per_own * w_v / (w_self > 0 ? w_self : 1) + 0.5);
    /* A user whose share is smaller than ours goes first at least once. */
    if (due == 0 && user_share(o->s, v) < o->share) due = 1;
    o->ahead += due < (long)v->queue.len ? due : (long)v->queue.len;
}

void sched_explain(sched_t *s, entry_t *e)
{
    job_t *job = e->job;
    user_t *u = e->user;
    const policy_limits_t *l = user_limits(s, u);
    long mine = own_ahead(e);
    user_charge(u, 0); /* shares compared at the same moment */
    others_t o = {.s = s, .self = u, .share = user_share(s, u), .jobs_per_own = (double)mine + 1};
    strmap_foreach(s->users, others_visit, &o);
    const char *reason = "fair_share";
    job->waiting_limit[0] = '\0';
    if ((uint64_t)u->running >= l->value[CONFIG_POLICY_MAX_RUNNING]) {
        reason = "user_limit";
        snprintf(job->waiting_limit, sizeof job->waiting_limit, "%s",
                 l->source[CONFIG_POLICY_MAX_RUNNING]);
    } else if (o.ahead > 0) {
        reason = "fair_share"; /* other users' jobs are due before it */
    } else if (s->ex && s->ex->ops->free_slots(s->ex, job->device) == 0) {
        reason = "devices_busy";
    } else if (mine == 0 && e->keyq && e->keyq->len < s->cfg->max_batch) {
        reason = "batching"; /* first in line: its partial batch waits for company */
    }
    snprintf(job->waiting_reason, sizeof job->waiting_reason, "%s", reason);
    job->waiting_position = mine + o.ahead;
}
