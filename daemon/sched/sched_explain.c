/* Why a queued job waits, and roughly how many jobs will run before it: computed on the loop
 * when the scheduler answers for queued jobs (a wait, a read that asks the loop, a list, a
 * submission's answer), and written into the jobs' waiting_* fields for their JSON.
 *
 * The position counts the jobs of its own user's queue ahead of it exactly, in O(log n) of
 * that queue (sched_rank.c), so that a read or a list costs the same with a long queue; and it
 * estimates those of the other users that fair share will serve meanwhile: each other user
 * with queued jobs gets, per job of ours, its weight over ours in jobs, up to what it has
 * queued. Jobs already running are not counted. The estimate shrinks as the jobs ahead run. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

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

/* Explains e, whose own user's queue holds mine entries before it, into job (its job, or a
 * copy of it). */
static void explain_at(sched_t *s, const entry_t *e, long mine, job_t *job)
{
    user_t *u = e->user;
    const policy_limits_t *l = user_limits(s, u);
    user_charge(u, 0); /* shares compared at the same moment */
    others_t o = {.s = s, .self = u, .share = user_share(s, u), .jobs_per_own = (double)mine + 1};
    strmap_foreach(s->users, others_visit, &o);
    const char *reason = "fair_share";
    job->waiting_limit[0] = '\0';
    if ((uint64_t)u->running >= l->value[CONFIG_POLICY_MAX_RUNNING]) {
        reason = "user_limit";
        snprintf(job->waiting_limit, sizeof job->waiting_limit, "%s",
                 l->source[CONFIG_POLICY_MAX_RUNNING]);
    } else if (e->memory_wait != MEMORY_WAIT_NONE) {
        /* Held back at its last chance to start: its user's share of the pool was taken, or
         * the pool had no room for its batch. */
        reason = "device_memory";
        const char *key = e->memory_wait == MEMORY_WAIT_USER
                              ? l->source[CONFIG_POLICY_DEVICE_MEMORY_PCT]
                              : s->pool_key;
        snprintf(job->waiting_limit, sizeof job->waiting_limit, "%s", key ? key : "");
    } else if (o.ahead > 0) {
        reason = "fair_share"; /* other users' jobs are due before it */
    } else if (s->ex && s->ex->ops->free_slots(s->ex, e->device) == 0) {
        reason = "devices_busy";
    } else if (mine == 0 && e->keyq && e->keyq->len < s->cfg->max_batch) {
        reason = "batching"; /* first in line: its partial batch waits for company */
    }
    snprintf(job->waiting_reason, sizeof job->waiting_reason, "%s", reason);
    job->waiting_position = mine + o.ahead;
}

void sched_explain(sched_t *s, entry_t *e, job_t *into)
{
    explain_at(s, e, rank_ahead(e->user, e), into);
}

int sched_explain_entries(sched_t *s, explained_t *es, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sched_explain(s, es[i].e, es[i].into);
    return 0;
}

/* The loop's entry of the caller's copy of a job when the loop holds it queued; else NULL. */
static entry_t *queued_entry(sched_t *s, const job_t *copy)
{
    entry_t *e = copy->state == JOB_QUEUED ? strmap_get(s->entries, copy->id) : NULL;
    return e && entry_queued(e) && !e->discard_result ? e : NULL;
}

int sched_explain_copies(sched_t *s, job_t *const *jobs, size_t n)
{
    explained_t *es = malloc((n ? n : 1) * sizeof *es);
    if (!es) return -ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (jobs[i] && (es[k].e = queued_entry(s, jobs[i]))) es[k++].into = jobs[i];
    int r = sched_explain_entries(s, es, k);
    free(es);
    return r;
}

void handle_explain(sched_t *s, msg_t *m)
{
    int r = sched_explain_copies(s, m->explain, m->n_explain);
    if (r < 0)
        reply_err(m->reply, m->token, r, NULL);
    else
        reply_jobs(m->reply, m->token, m->explain, m->n_explain);
}
