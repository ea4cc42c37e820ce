/* The scheduler's life cycle, its loop thread, and the messages between threads: the inbox
 * other threads post to, the loop's wake-up that runs the round (sched_round.c), and the
 * hand-off of each message to the file of its concern (sched_internal.h describes the whole). */
#include "scheduler.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "sched_internal.h"
#include "daemon/util/crash_guard.h"

/* ------------------------------------------------------------------------- replies */

void reply_err(sched_reply_fn reply, void *token, int err, const char *message)
{
    sched_result_t res = {.err = err, .message = message};
    reply(token, &res);
}

/* Answers a refusal by the per-user policy: limit names the key that decided it. */
void reply_refused(sched_reply_fn reply, void *token, int err, const char *message,
                   const char *limit)
{
    sched_result_t res = {.err = err, .message = message, .limit = limit};
    reply(token, &res);
}

/* Answers with jobs (borrowed for the duration of the callback). */
void reply_jobs(sched_reply_fn reply, void *token, job_t *const *jobs, size_t n)
{
    sched_result_t res = {.jobs = jobs, .n_jobs = n};
    reply(token, &res);
}

/* The answer to a request that came while the daemon stops. */
void reply_stopping(sched_reply_fn reply, void *token)
{
    reply_err(reply, token, -ESHUTDOWN, "the daemon is stopping");
}

/* ------------------------------------------------------------------------ messages */

void msg_free(msg_t *m)
{
    if (!m) return;
    for (size_t i = 0; m->jobs && i < m->n; i++)
        job_free(m->jobs[i]);
    free(m->jobs);
    for (size_t i = 0; m->shown && !m->shown_taken && i < m->n; i++)
        job_free(m->shown[i]);
    if (!m->shown_taken) free(m->shown);
    free(m->fate);
    buffer_free(m->buf);
    free(m);
}

/* Any thread: appends m to the inbox and wakes the loop. */
void inbox_push(sched_t *s, msg_t *m)
{
    pthread_mutex_lock(&s->lock);
    queue_insert_tail(&s->inbox, &m->node);
    pthread_mutex_unlock(&s->lock);
    uv_async_send(&s->wake);
}

/* Posts a message to the loop; after the loop has gone, answers -ESHUTDOWN at once. */
void msg_post(sched_t *s, msg_t *m)
{
    pthread_mutex_lock(&s->lock);
    bool gone = atomic_load(&s->loop_gone);
    if (!gone) queue_insert_tail(&s->inbox, &m->node);
    pthread_mutex_unlock(&s->lock);
    if (gone) {
        reply_stopping(m->reply, m->token);
        msg_free(m);
        return;
    }
    uv_async_send(&s->wake);
}

/* Takes everything in the inbox into list (the caller's). */
void inbox_take(sched_t *s, queue_t *list)
{
    pthread_mutex_lock(&s->lock);
    queue_move(&s->inbox, list);
    pthread_mutex_unlock(&s->lock);
}

static void handle_buffer_delete(sched_t *s, msg_t *m)
{
    int r = store_buffer_delete(s->st, m->any_owner ? NULL : m->owner, m->id);
    if (r < 0) {
        reply_err(m->reply, m->token, r, r == -ENOENT ? "no such buffer" : NULL);
        return;
    }
    if (s->ex && s->ex->ops->buffer_deleted) s->ex->ops->buffer_deleted(s->ex, m->id);
    memory_resident_changed(s);
    sched_result_t res = {0};
    m->reply(m->token, &res);
}

/* Hands a message to its handler; frees it, but for the submissions and uploads that join the
 * group commit, which owns them from then on. Finished batches (batch_ended) and the stop are
 * the round's to deal with (sched_round.c). */
void handle_msg(sched_t *s, msg_t *m)
{
    switch (m->kind) {
    case MSG_SUBMIT:
    case MSG_BUF_PUT:
        handle_submission(s, m);
        return;
    case MSG_WAIT:
        handle_wait(s, m);
        break;
    case MSG_WAIT_CANCEL:
        handle_wait_cancel(s, m);
        break;
    case MSG_CANCEL:
        handle_cancel(s, m);
        break;
    case MSG_EXPLAIN:
        handle_explain(s, m);
        break;
    case MSG_USER_COUNTS:
        handle_user_counts(s, m);
        break;
    case MSG_BUF_DELETE:
        handle_buffer_delete(s, m);
        break;
    case MSG_DONE: /* a batch given back: the round ends the others */
        handle_given_back(s, m);
        break;
    case MSG_STOP:
        break;
    }
    msg_free(m);
}

static void on_wake(uv_async_t *a)
{
    sched_round(a->data, true);
}

static void *loop_thread(void *arg)
{
    sched_t *s = arg;
    prctl(PR_SET_NAME, "gj-loop"); /* as top -H and /proc/PID/task show it */
    uv_run(&s->loop, UV_RUN_DEFAULT);
    atomic_store(&s->loop_gone, true);
    return NULL;
}

/* Takes what is left in the inbox once the loop has ended and answers every request in it
 * with -ESHUTDOWN; from then on msg_post() answers at once. Finished batches found there are
 * dropped: their jobs are still `running` in the store and run again after a restart. */
static void inbox_close(sched_t *s)
{
    queue_t msgs;
    queue_init(&msgs);
    pthread_mutex_lock(&s->lock);
    queue_move(&s->inbox, &msgs);
    atomic_store(&s->loop_gone, true);
    pthread_mutex_unlock(&s->lock);
    for (queue_t *q; (q = queue_pop(&msgs));) {
        msg_t *m = queue_data(q, msg_t, node);
        if (m->kind != MSG_DONE && m->kind != MSG_STOP && m->reply)
            reply_stopping(m->reply, m->token);
        msg_free(m);
    }
}

/* ---------------------------------------------------------------------- life cycle */

static void init_timer(sched_t *s, uv_timer_t *t)
{
    uv_timer_init(&s->loop, t);
    t->data = s;
}

store_t *sched_store(const sched_t *s)
{
    return s->st;
}

int sched_new(const config_t *cfg, store_t *st, sched_t **ret)
{
    sched_t *s = calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    s->cfg = cfg;
    s->st = st;
    queue_init(&s->inbox);
    queue_init(&s->pending);
    queue_init(&s->ended);
    queue_init(&s->in_flight);
    queue_init(&s->submit_waiters);
    int r = sched_policy_init(s);
    if (r >= 0) r = store_reader_open(st, &s->rd);
    if (r >= 0) r = queues_init(s);
    if (r >= 0) r = uv_loop_init(&s->loop);
    if (r < 0) {
        store_reader_close(s->rd);
        queues_free(s);
        sched_policy_free(s);
        free(s);
        return r;
    }
    pthread_mutex_init(&s->lock, NULL);
    uv_async_init(&s->loop, &s->wake, on_wake);
    s->wake.data = s;
    init_timer(s, &s->commit_timer);
    init_timer(s, &s->dispatch_timer);
    init_timer(s, &s->deadline_timer);
    init_timer(s, &s->gc_timer);
    init_timer(s, &s->upkeep_timer);
    init_timer(s, &s->drain_timer);
    init_timer(s, &s->watchdog_timer);
    init_timer(s, &s->batch_watchdog_timer);
    init_timer(s, &s->time_limit_timer);
    init_timer(s, &s->user_gauges_timer);
    pthread_mutex_init(&s->user_gauges_lock, NULL);
    *ret = s;
    return 0;
}

void sched_set_executor(sched_t *s, executor_t *ex)
{
    ex->done = on_batch_done;
    ex->done_ud = s;
    s->ex = ex;
    memory_init(s);
}

/* The store hands back each recovered queued job as the queues need it; the job itself is
 * read back (and its call validated again) when it starts. */
static void recover_one(const store_queued_t *q, void *ud)
{
    sched_t *s = ud;
    if (entry_add_stowed(s, q) < 0)
        log_error("job %s could not be re-queued (out of memory): it runs after a restart", q->id);
}

/* The jobs whose run took the previous process down (crash_guard.h) end failed with
 * "worker_crashed" rather than run again, which would crash this one too; then the list is
 * emptied. The other jobs left running are re-queued by store_recover_queued. */
static int recover_crashed(sched_t *s)
{
    crash_guard_victim_t *v = NULL;
    size_t n = 0;
    int r = crash_guard_take(&v, &n);
    for (size_t i = 0; r == 0 && i < n; i++) {
        char message[ERROR_MESSAGE_SIZE];
        snprintf(message, sizeof message,
                 "the daemon crashed (signal %d, %s) while this job ran: its run took the daemon "
                 "down, so it is not run again",
                 v[i].signo, strsignal(v[i].signo));
        bool failed = false;
        r = store_recover_crashed(s->st, v[i].id, "worker_crashed", message, &failed);
        if (r == 0 && failed)
            log_warn("job %s failed: the daemon crashed (%s) while it ran", v[i].id,
                     strsignal(v[i].signo));
    }
    free(v);
    if (r == 0) r = crash_guard_clear();
    return r;
}

int sched_start(sched_t *s)
{
    int r = recover_crashed(s);
    if (r < 0)
        return log_error_errno(r, "failing the jobs that crashed the daemon failed: %s",
                               strerror(-r));
    if ((r = fair_state_load(s)) < 0) return r;
    r = store_recover_queued(s->st, s->cfg->max_attempts, job_resolve_op, recover_one, s);
    if (r < 0) return log_error_errno(r, "recovering jobs from the store failed: %s", strerror(-r));
    /* After recovery, whose failed jobs count in the rollup the budgets start from. */
    if ((r = budget_load(s)) < 0) return r;
    long queued = atomic_load(&s->queued);
    if (queued > 0) log_info("recovered %ld queued jobs", queued);
    timers_start(s);
    deadline_arm(s);
    if (queued > 0) dispatch_soon(s); /* the recovered jobs go out as soon as the loop runs */
    /* Accepted jobs are answered once the store has made them durable. */
    r = store_durability_start(s->st);
    if (r < 0) return r;
    atomic_store(&s->accepting, true);
    r = pthread_create(&s->thread, NULL, loop_thread, s);
    if (r != 0) return -r;
    s->thread_started = true;
    return 0;
}

void sched_stop(sched_t *s)
{
    if (!s || !s->thread_started) return;
    atomic_store(&s->accepting, false);
    msg_t *m = calloc(1, sizeof *m);
    if (m) {
        m->kind = MSG_STOP;
        msg_post(s, m);
    }
    pthread_join(s->thread, NULL);
    s->thread_started = false;
    /* The loop is over: its store is this thread's now. */
    if (s->n_late_charges) late_charges_write(s);
    if (s->n_late_charges)
        log_error("%zu charge(s) of device time are lost at the stop: the store did not take "
                  "them, and the usage and budgets of the next start lack them",
                  s->n_late_charges);
    fair_state_save(s);
    /* Answers still waiting for their sync are given before the HTTP server stops. */
    store_durability_stop(s->st);
    /* Requests that arrived while the loop was ending must be answered now: the HTTP server
     * cannot stop with connections still suspended on them. */
    inbox_close(s);
}

/* At the end only the scheduler's own handles are left (waiters were answered at stop); they
 * live inside sched_t, so closing needs no callback. */
static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

void sched_free(sched_t *s)
{
    if (!s) return;
    if (s->thread_started) sched_stop(s);
    /* The executor goes last, after the HTTP server (which may ask it to describe itself)
     * has stopped; batches still running after the drain get no more time. */
    if (s->ex) s->ex->ops->destroy(s->ex, s->batches_in_flight ? 0 : s->cfg->drain_timeout_ms);
    s->ex = NULL;
    inbox_close(s);
    uv_walk(&s->loop, close_any, NULL);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    uv_loop_close(&s->loop);
    /* Batches still in the executor's hands (stuck past the drain, or given up on by the
     * watchdog) may yet be written to by a worker that cannot be stopped: their jobs, entries
     * and batches are left to the process's exit rather than freed under it. */
    if (s->batches_in_flight > 0)
        log_warn("%d batches still running at exit: their jobs are left in memory for their "
                 "workers",
                 s->batches_in_flight);
    else
        queues_free(s);
    store_durability_stop(s->st);
    store_reader_close(s->rd);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->user_gauges_lock);
    sched_policy_free(s);
    free(s->late_charges);
    free(s);
}
