/* Waits for a job's end, cancels, and deadlines: the requests that look at one job, and the
 * timer that fails queued jobs whose deadline passed. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

/* A copy of the fields of a job that the loop owns, for answers about a running job: an
 * executor thread may be writing the job's outputs, error, device and timing fields meanwhile.
 * What the submission gave (params, idempotency key, limits) never changes, and is copied
 * whole. NULL when out of memory. */
static job_t *job_snapshot(const job_t *job)
{
    job_t *copy = job_new();
    if (!copy) return NULL;
    if (job->params_json && !(copy->params_json = strdup(job->params_json))) {
        job_free(copy);
        return NULL;
    }
    memcpy(copy->id, job->id, sizeof copy->id);
    memcpy(copy->owner, job->owner, sizeof copy->owner);
    memcpy(copy->idempotency_key, job->idempotency_key, sizeof copy->idempotency_key);
    memcpy(copy->op_name, job->op_name, sizeof copy->op_name);
    copy->call = job->call;
    copy->priority = job->priority;
    copy->device = job->device;
    copy->preferred_device = job->preferred_device;
    copy->deadline_us = job->deadline_us;
    copy->time_limit_ms = job->time_limit_ms;
    copy->state = job->state;
    copy->attempts = job->attempts;
    copy->created_us = job->created_us;
    copy->started_us = job->started_us;
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        memcpy(copy->in[j].name, job->in[j].name, sizeof copy->in[j].name);
        copy->in[j].desc = job->in[j].desc;
        copy->in[j].nbytes = job->in[j].nbytes;
        memcpy(copy->in[j].buffer_id, job->in[j].buffer_id, sizeof copy->in[j].buffer_id);
    }
    return copy;
}

/* Answers with the entry's job as it stands: the job itself while queued (the loop owns all
 * of it; read back first when stowed, which needs s), with why it waits when s is given, a
 * snapshot while it runs. */
static void reply_current(sched_t *s, sched_reply_fn reply, void *token, entry_t *e)
{
    int r = e->job ? 0 : s ? entry_load(s, e) : -EIO;
    if (r < 0) {
        reply_err(reply, token, r, "reading the queued job back from the store failed");
        return;
    }
    if (s && e->job->state == JOB_QUEUED) sched_explain(s, e, e->job);
    if (e->job->state != JOB_RUNNING) {
        reply_jobs(reply, token, &e->job, 1);
        return;
    }
    job_t *copy = job_snapshot(e->job);
    if (copy)
        reply_jobs(reply, token, &copy, 1);
    else
        reply_err(reply, token, -ENOMEM, NULL);
    job_free(copy);
}

/* ------------------------------------------------------------------------- waiters */

static void on_wait_timeout(uv_timer_t *t);

static sched_t *group_loop(const wait_group_t *g)
{
    return (sched_t *)((char *)g->timer.loop - offsetof(sched_t, loop));
}

static void group_closed(uv_handle_t *h)
{
    wait_group_t *g = h->data;
    for (size_t i = 0; i < g->n; i++)
        job_free(g->ends[i]);
    free(g->ends);
    free(g);
}

/* A wait for n jobs, for reply and token, answered by their ends or after timeout_ms; its
 * members join their jobs' entries with group_join. NULL when out of memory. */
static wait_group_t *group_new(sched_t *s, size_t n, sched_reply_fn reply, void *token,
                               int timeout_ms)
{
    wait_group_t *g = calloc(1, sizeof *g + n * sizeof g->members[0]);
    job_t **ends = g ? calloc(n ? n : 1, sizeof *ends) : NULL;
    if (!ends) {
        free(g);
        return NULL;
    }
    *g = (wait_group_t){.reply = reply, .token = token, .n = n, .ends = ends};
    queue_init(&g->submit_node);
    for (size_t i = 0; i < n; i++)
        queue_init(&g->members[i].node);
    uv_timer_init(&s->loop, &g->timer);
    g->timer.data = g;
    uv_timer_start(&g->timer, on_wait_timeout, (uint64_t)timeout_ms, 0);
    return g;
}

/* Job i of g waits for the end of e's job. */
static void group_join(wait_group_t *g, size_t i, entry_t *e)
{
    waiter_t *w = &g->members[i];
    w->entry = e;
    w->group = g;
    queue_insert_tail(&e->waiters, &w->node);
    g->left++;
}

/* Takes g, answered, out of every list it is in, and frees it once its timer is closed. */
static void group_close(wait_group_t *g)
{
    uv_timer_stop(&g->timer);
    for (size_t i = 0; i < g->n; i++)
        queue_remove(&g->members[i].node);
    queue_remove(&g->submit_node);
    uv_close((uv_handle_t *)&g->timer, group_closed);
}

/* An answer held back until the store has made its jobs' acceptance durable. */
typedef struct durable_answer {
    store_durable_wait_t item;
    sched_reply_fn reply;
    void *token;
    job_t **jobs; /* owned, n of them */
    size_t n;
    bool replayed;
} durable_answer_t;

/* Sync thread (or the loop, when nothing is to be synced): gives the held answer, or the
 * sync's failure. */
static void durable_answer_give(store_durable_wait_t *item, int err)
{
    durable_answer_t *a =
        (durable_answer_t *)(void *)((char *)item - offsetof(durable_answer_t, item));
    if (err) {
        char why[160];
        snprintf(why, sizeof why,
                 "the store could not make the request durable (%s); its jobs may still run",
                 strerror(-err));
        reply_err(a->reply, a->token, err == -ENOSPC ? err : -EIO, why);
    } else {
        sched_result_t res = {.jobs = a->jobs, .n_jobs = a->n, .replayed = a->replayed};
        a->reply(a->token, &res);
    }
    for (size_t i = 0; i < a->n; i++)
        job_free(a->jobs[i]);
    free(a->jobs);
    free(a);
}

/* Job i of g as it stands, into *ret (owned): its end when that came (moved out of g), else a
 * copy of its entry's job, read back first when stowed; s explains a queued one when given.
 * 0, -ENOMEM, or the store's error. */
static int group_current(sched_t *s, wait_group_t *g, size_t i, job_t **ret)
{
    entry_t *e = g->members[i].entry;
    int r = g->ends[i] ? 0 : !e ? -ENOMEM : entry_load(group_loop(g), e);
    if (r < 0) return r;
    job_t *job = g->ends[i];
    g->ends[i] = NULL;
    if (!job && e->job->state == JOB_QUEUED) {
        job = job_copy_shown(e->job);
        if (job && s) sched_explain(s, e, job);
    } else if (!job) {
        job = job_snapshot(e->job);
    }
    if (!job) return -ENOMEM;
    *ret = job;
    return 0;
}

/* The answer of g with its jobs as they stand (group_current); NULL after answering its error
 * when one of them cannot be shown. */
static durable_answer_t *group_answer_new(sched_t *s, wait_group_t *g)
{
    durable_answer_t *a = calloc(1, sizeof *a);
    job_t **jobs = a ? calloc(g->n ? g->n : 1, sizeof *jobs) : NULL;
    int r = jobs ? 0 : -ENOMEM;
    for (size_t i = 0; r == 0 && i < g->n; i++)
        r = group_current(s, g, i, &jobs[i]);
    if (r == 0) {
        *a = (durable_answer_t){
            .reply = g->reply, .token = g->token, .jobs = jobs, .n = g->n, .replayed = g->replayed};
        a->item.done = durable_answer_give;
        return a;
    }
    for (size_t i = 0; jobs && i < g->n; i++)
        job_free(jobs[i]);
    free(jobs);
    free(a);
    reply_err(g->reply, g->token, r,
              r == -ENOMEM ? NULL : "reading a queued job back from the store failed");
    return NULL;
}

/* Answers g with its jobs as they stand, not all final, and closes it: a submission's once its
 * jobs' acceptance is durable when it must be, through the store's durability thread, which syncs
 * everything committed before (its commit among them); a GET's wait (one job) at once, with the
 * job itself. s explains queued jobs when given. */
static void group_answer_current(sched_t *s, wait_group_t *g)
{
    if (queue_empty(&g->submit_node)) {
        reply_current(s, g->reply, g->token, g->members[0].entry);
        group_close(g);
        return;
    }
    durable_answer_t *a = group_answer_new(s, g);
    sched_t *loop = group_loop(g);
    bool durable_first = g->durable_first;
    group_close(g);
    if (a && durable_first && store_durable_later(loop->st))
        store_when_durable(loop->st, &a->item);
    else if (a)
        durable_answer_give(&a->item, 0);
}

/* Answers g with the ends of all its jobs and closes it: that of job last, when job is given
 * (borrowed), and those kept before. */
static void group_answer_ends(wait_group_t *g, size_t last, const job_t *job,
                              sched_gate_t *end_gate)
{
    if (g->short_of_memory) {
        reply_err(g->reply, g->token, -ENOMEM, NULL);
    } else {
        if (job) g->ends[last] = (job_t *)job;
        sched_result_t res = {
            .jobs = g->ends, .n_jobs = g->n, .replayed = g->replayed, .end_gate = end_gate};
        STAMP(REPLY);
        g->reply(g->token, &res);
        if (job) g->ends[last] = NULL;
    }
    group_close(g);
}

/* Member w of its wait takes its job's end (borrowed): the wait's answer when it was the last
 * end it waited for, with end_gate, else kept until then. */
static void waiter_take_end(waiter_t *w, const job_t *job, sched_gate_t *end_gate)
{
    wait_group_t *g = w->group;
    size_t i = (size_t)(w - g->members);
    queue_remove(&w->node);
    w->entry = NULL;
    if (--g->left == 0)
        group_answer_ends(g, i, job, end_gate);
    else if (!(g->ends[i] = job_copy_answer(job, g->inline_max)))
        g->short_of_memory = true;
}

/* Answers every waiter of e, or keeps the end it brings until its wait's last: with job (its
 * final state, or a record of it), or with the jobs as they stand when job is NULL. An answer
 * with the jobs' ends goes at once, whatever the sync of their commit: it carries the
 * results. */
void waiters_reply(entry_t *e, const job_t *job)
{
    for (queue_t *q; (q = queue_head(&e->waiters));) {
        waiter_t *w = queue_data(q, waiter_t, node);
        if (job)
            waiter_take_end(w, job, NULL);
        else
            group_answer_current(NULL, w->group); /* takes w out of e's waiters */
    }
}

/* The first of e's waiters that belongs to a waited submission's wait, or NULL. */
static waiter_t *submission_waiter(const entry_t *e)
{
    queue_t *q;
    queue_foreach(q, &e->waiters)
    {
        waiter_t *w = queue_data(q, waiter_t, node);
        if (!queue_empty(&w->group->submit_node)) return w;
    }
    return NULL;
}

/* waiters_reply with the job's end while it is being committed, end_gate opening once it is
 * (sched_gate_t), for the waits of submissions alone: their replies hold the gate. The other
 * waiters (GET /v1/jobs/{id}/wait) stay, for waiters_reply once the end is committed, so that
 * whatever their clients do next finds it in the store. */
void waiters_reply_gated(entry_t *e, const job_t *job, sched_gate_t *end_gate)
{
    for (waiter_t *w; (w = submission_waiter(e));)
        waiter_take_end(w, job, end_gate);
}

bool waiters_carry_result(const entry_t *e, const job_t *job)
{
    bool any = false;
    queue_t *q;
    queue_foreach(q, &e->waiters)
    {
        const wait_group_t *g = queue_data(q, waiter_t, node)->group;
        if (queue_empty(&g->submit_node)) continue;
        any = true;
        for (int j = 0; job->state == JOB_SUCCEEDED && j < job->call.n_out; j++)
            if (job->out[j].nbytes > g->inline_max) return false;
    }
    return any;
}

static void waiters_answer_visit(const char *key, void *value, void *ud)
{
    (void)key;
    entry_t *e = value;
    if (!queue_empty(&e->waiters)) (void)entry_load(ud, e); /* a stowed one is read back */
    waiters_reply(e, NULL);
}

/* At stop: every waiter is answered with its job as it stands, so that no request waits on a
 * loop that is ending. */
void waiters_answer_all(sched_t *s)
{
    strmap_foreach(s->entries, waiters_answer_visit, s);
}

static void on_wait_timeout(uv_timer_t *t)
{
    wait_group_t *g = t->data;
    group_answer_current(group_loop(g), g);
}

/* -------------------------------------------------------------- finding the job */

/* The in-memory entry for m's id if m's owner may see it; NULL otherwise. */
static entry_t *entry_find(sched_t *s, const msg_t *m)
{
    entry_t *e = strmap_get(s->entries, m->id);
    if (e && !m->any_owner && strcmp(e->user->owner, m->owner) != 0) return NULL;
    return e;
}

/* A finished (or unknown) job from the store, for waits and cancels of jobs not in memory (a
 * new job). Replies -ENOENT and returns NULL when missing or not the caller's. */
static job_t *stored_job(sched_t *s, const msg_t *m)
{
    job_t *job = NULL;
    if (store_job_get(s->rd, m->id, &job) < 0 ||
        (!m->any_owner && strcmp(job->owner, m->owner) != 0)) {
        job_free(job);
        reply_err(m->reply, m->token, -ENOENT, "no such job");
        return NULL;
    }
    return job;
}

/* --------------------------------------------------------------------------- waits */

void handle_wait(sched_t *s, msg_t *m)
{
    entry_t *e = entry_find(s, m);
    /* A job cancelled while running has ended: the store holds its final record, and the
     * entry lives on only until its launch returns. (One whose group commit failed has no
     * record: its submitter was told so, and this answers that there is no such job.) */
    if (!e || e->discard_result) {
        job_t *job = stored_job(s, m);
        if (job) reply_jobs(m->reply, m->token, &job, 1);
        job_free(job);
        return;
    }
    if (m->timeout_ms <= 0 || s->stopping) {
        if (s->stopping) (void)entry_load(s, e); /* answered as it stands, not explained */
        reply_current(s->stopping ? NULL : s, m->reply, m->token, e);
        return;
    }
    wait_group_t *g = group_new(s, 1, m->reply, m->token, m->timeout_ms);
    if (g)
        group_join(g, 0, e);
    else
        reply_err(m->reply, m->token, -ENOMEM, NULL);
}

/* The entry whose end job (a committed submission's, as shown) waits for: NULL when none is
 * waiting to end (the job ended, or it was cancelled while running). */
static entry_t *submitted_entry(sched_t *s, const job_t *job)
{
    entry_t *e = strmap_get(s->entries, job->id);
    if (!e || e->discard_result || (e->job && job_state_is_final(e->job->state))) return NULL;
    return e;
}

/* Whether each job of m can be waited for: to end, or (a replayed one) ended already. */
static bool submission_waitable(sched_t *s, const msg_t *m)
{
    for (size_t i = 0; i < m->n; i++)
        if (!m->shown[i] ||
            (!submitted_entry(s, m->shown[i]) &&
             (m->fate[i] != FATE_REPLAYED || !job_state_is_final(m->shown[i]->state))))
            return false;
    return true;
}

/* A waited submission, committed (sched_submit_waited): a wait for all of its jobs, which
 * answers it with their ends, or with the jobs as they stand once durable when the wait runs
 * out. A replayed job waits for the first one of its key, or, that one ended already, is
 * answered with it. m->reply is then NULL: the answer is the wait's. False when it cannot wait
 * (out of memory, a job that will not end here, the daemon stops): m is then answered as any
 * submission. */
bool submission_wait(sched_t *s, msg_t *m)
{
    if (m->n == 0 || s->stopping || !submission_waitable(s, m)) return false;
    wait_group_t *g = group_new(s, m->n, m->reply, m->token, m->timeout_ms);
    if (!g) return false;
    g->durable_first = store_durable_later(s->st);
    g->replayed = m->all_replayed;
    g->inline_max = m->inline_max;
    queue_insert_tail(&s->submit_waiters, &g->submit_node);
    for (size_t i = 0; i < m->n; i++) {
        entry_t *e = submitted_entry(s, m->shown[i]);
        if (e) {
            group_join(g, i, e);
        } else {
            g->ends[i] = m->shown[i];
            m->shown[i] = NULL;
        }
    }
    m->reply = NULL;
    if (g->left == 0) group_answer_ends(g, 0, NULL, NULL);
    return true;
}

/* The client of a waited submission (id "") went away: a submission still in its group
 * commit's window is answered as any once committed, without waiting for its jobs; a committed
 * one's wait, found by token, is answered now with its jobs as they stand. */
static void submission_wait_cancel(sched_t *s, const msg_t *m)
{
    queue_t *q;
    queue_foreach(q, &s->pending)
    {
        msg_t *p = queue_data(q, msg_t, node);
        if (p->kind == MSG_SUBMIT && p->token == m->token) p->waited = false;
    }
    queue_foreach(q, &s->submit_waiters)
    {
        wait_group_t *g = queue_data(q, wait_group_t, submit_node);
        if (g->token != m->token) continue;
        group_answer_current(s, g);
        return;
    }
}

/* The client of a wait went away: its waiter, found by token, is answered now. */
void handle_wait_cancel(sched_t *s, msg_t *m)
{
    if (!m->id[0]) {
        submission_wait_cancel(s, m);
        return;
    }
    entry_t *e = strmap_get(s->entries, m->id);
    if (!e) return;
    queue_t *q;
    queue_foreach(q, &e->waiters)
    {
        wait_group_t *g = queue_data(q, waiter_t, node)->group;
        if (g->token != m->token) continue;
        group_answer_current(s, g);
        return;
    }
}

/* ------------------------------------------------------------------------- cancels */

/* How a cancel's answer names what became of the job. */
static const char *const cancel_outcome_names[] = {
    [EXEC_CANCEL_DEQUEUED] = "dequeued",
    [EXEC_CANCEL_STOPPED] = "stopped",
    [EXEC_CANCEL_DROPPED] = "dropped",
};

/* The answer to the cancel of a queued job (token: its message): the job never ran. */
static void cancel_queued_reply(void *token, const sched_result_t *res)
{
    const msg_t *m = token;
    sched_result_t named = *res;
    named.cancel = cancel_outcome_names[EXEC_CANCEL_DEQUEUED];
    m->reply(m->token, &named);
}

/* Ends a queued job (cancelled or failed) in the store and in memory, read back first when
 * stowed. When reply is given, it is answered with the ended job before the job is freed. */
static int end_queued(sched_t *s, entry_t *e, job_state_t state, const char *code,
                      const char *message, sched_reply_fn reply, void *token)
{
    int r = entry_load(s, e);
    if (r < 0) return r;
    job_t *job = e->job;
    job->state = state;
    job->finished_us = now_us();
    job_set_error(job, code, "%s", message);
    r = store_job_update(s->st, job);
    if (r < 0) {
        /* The store refused: the job keeps its stored state and stays queued here. */
        job->state = JOB_QUEUED;
        job->finished_us = 0;
        job->error_code[0] = job->error_message[0] = '\0';
        return r;
    }
    entry_unqueue(s, e);
    atomic_fetch_sub(&s->queued, 1);
    count_final(s, state);
    if (reply) reply_jobs(reply, token, &job, 1);
    waiters_reply(e, job);
    entry_forget(s, e);
    job_free(job);
    return 0;
}

/* The batch in the executor's hands that holds job, or NULL. */
static exec_batch_t *flight_batch_of(sched_t *s, const job_t *job)
{
    queue_t *q;
    queue_foreach(q, &s->in_flight)
    {
        exec_batch_t *b = &queue_data(q, sched_batch_t, flight)->batch;
        for (int i = 0; i < b->n; i++)
            if (b->jobs[i] == job) return b;
    }
    return NULL;
}

/* Records the end of a running job (cancelled, or failed by the watchdog or any other limit)
 * in the store, while its launch goes on: the launch's result is discarded when it returns.
 * The executor may be writing the job's outputs and error fields right now, so the store gets a
 * copy made of the fields the loop owns, which *ret_rec receives (job_free it) for the answers.
 * The job is charged the device time it has run so far (exec_job_time_so_far), in its record,
 * the rollup, fair share and the budgets alike; what its launch measures, if more, is charged
 * when it returns (end_jobs). 0, -ENOMEM, or the store's error (the job then stays running). */
static int running_record(sched_t *s, entry_t *e, job_state_t state, const char *code,
                          const char *message, job_t **ret_rec)
{
    job_t *rec = job_snapshot(e->job);
    if (!rec) return -ENOMEM;
    rec->finished_us = now_us();
    rec->state = state;
    job_set_error(rec, code, "%s", message);
    exec_batch_t *b = flight_batch_of(s, e->job);
    rec->gpu_ns = b ? exec_job_time_so_far(b, e->job, mono_us()) : 0;
    int r = store_job_update(s->st, rec);
    if (r < 0) {
        job_free(rec);
        return r;
    }
    e->discard_result = true;
    e->ended_us = rec->finished_us;
    e->charge_on_return = true;
    entry_charge(s, e, rec->finished_us, rec->gpu_ns);
    count_final(s, state);
    *ret_rec = rec;
    return 0;
}

/* Ends a running job now (running_record), and answers its waiters and reply (when given). */
int running_end(sched_t *s, entry_t *e, job_state_t state, const char *code, const char *message,
                sched_reply_fn reply, void *token)
{
    job_t *rec;
    int r = running_record(s, e, state, code, message, &rec);
    if (r < 0) return r;
    if (reply) reply_jobs(reply, token, &rec, 1);
    waiters_reply(e, rec);
    job_free(rec);
    return 0;
}

/* Ends a running job as cancelled, durably, and then has the executor free what it holds:
 * the answer says whether the job had not started, was stopped, or runs on with its result
 * dropped. */
static void cancel_running(sched_t *s, msg_t *m, entry_t *e)
{
    job_t *rec;
    int r = running_record(s, e, JOB_CANCELLED, "cancelled", "cancelled by request while running",
                           &rec);
    if (r < 0) {
        reply_err(m->reply, m->token, r,
                  r == -ENOMEM ? NULL : "the store refused the cancellation");
        return;
    }
    exec_cancel_t outcome = EXEC_CANCEL_DROPPED;
    exec_batch_t *b = flight_batch_of(s, e->job);
    if (b && s->ex->ops->cancel) outcome = s->ex->ops->cancel(s->ex, b, e->job);
    sched_result_t res = {.jobs = &rec, .n_jobs = 1, .cancel = cancel_outcome_names[outcome]};
    m->reply(m->token, &res);
    waiters_reply(e, rec);
    job_free(rec);
}

void handle_cancel(sched_t *s, msg_t *m)
{
    entry_t *e = entry_find(s, m);
    if (!e) {
        job_t *job = stored_job(s, m);
        if (job) reply_err(m->reply, m->token, -EBUSY, "the job has already ended");
        job_free(job);
        return;
    }
    if (entry_queued(e)) {
        int r = end_queued(s, e, JOB_CANCELLED, "cancelled", "cancelled by request",
                           cancel_queued_reply, m);
        if (r < 0) reply_err(m->reply, m->token, r, "the store refused the cancellation");
        return;
    }
    if (e->discard_result) {
        reply_err(m->reply, m->token, -EBUSY, "the job is already cancelled");
        return;
    }
    cancel_running(s, m, e);
}

/* ----------------------------------------------------------------------- deadlines */

static void on_deadline_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    int64_t now = now_us();
    for (entry_t *e; (e = heap_min(&s->deadlines)) && e->deadline_us <= now;)
        if (end_queued(s, e, JOB_FAILED, "deadline_exceeded",
                       "the deadline passed while the job was queued", NULL, NULL) < 0)
            heap_remove(&s->deadlines, e); /* leave it queued; do not spin on it */
    deadline_arm(s);
}

/* Sets the deadline timer for the earliest deadline, or stops it when there is none. */
void deadline_arm(sched_t *s)
{
    s->want.deadlines = false;
    entry_t *first = heap_min(&s->deadlines);
    if (!first) {
        uv_timer_stop(&s->deadline_timer);
        return;
    }
    int64_t wait_us = first->deadline_us - now_us();
    uv_timer_start(&s->deadline_timer, on_deadline_timer,
                   wait_us > 0 ? (uint64_t)(wait_us + 999) / 1000 : 0, 0);
}
