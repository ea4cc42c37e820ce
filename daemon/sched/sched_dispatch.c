/* Starting jobs: a round cuts batches while the executor has room (fair share picks whose
 * batch goes next, a batch key fills it), records their starts in the store's open
 * transaction, hands them to the executor before that transaction commits, and settles those
 * it did not take once it has. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

/* Entries looked at, best first, when a user's first waits for its device. */
#define STARTABLE_SCAN 64

/* A start the store did not record: the batch is not handed over. */
enum { START_UNRECORDED = 1 };

void batch_free(sched_batch_t *sb)
{
    queue_remove(&sb->flight);
    free(sb->batch.jobs);
    free(sb->done_msg); /* NULL when the batch's end came in it */
    free(sb);
}

/* ------------------------------------------------------------------ choosing jobs */

/* The device a queued entry must run on (pinned, or its resident inputs' one), or -1. */
static int entry_device(const entry_t *e)
{
    return e->device >= 0 ? e->device : e->preferred_device;
}

/* Whether e's device (if it needs one) has room; room[] remembers each device's answer. */
static bool entry_can_start(sched_t *s, const entry_t *e, signed char *room, int n_room)
{
    int d = entry_device(e);
    if (d < 0) return true;
    if (d < n_room && room[d] >= 0) return room[d];
    bool ok = s->ex->ops->free_slots(s->ex, d) > 0;
    if (d < n_room) room[d] = ok;
    return ok;
}

/* The user's first entry (by priority, then arrival) whose device has room, or NULL. When
 * the first waits for its busy device, the next ones are looked at best first (up to
 * STARTABLE_SCAN of them, walking the heap from its root), so that it holds back no other
 * job of its user; but only while the user stays under its running limit with one to spare,
 * so that the waiting job finds the user able to run it once its device frees up. */
static entry_t *best_startable(sched_t *s, user_t *u)
{
    enum { MEMO = 16 };
    signed char room[MEMO]; /* per device: -1 not asked yet, else 0 or 1 */
    memset(room, -1, sizeof room);
    const heap_t *h = &u->queue;
    entry_t *first = heap_min(h);
    if (entry_can_start(s, first, room, MEMO)) return first;
    if (u->running + 1 >= user_max_running(s, u)) return NULL;
    size_t frontier[STARTABLE_SCAN + 2], n = 0; /* heap indexes: children of what cannot start */
    for (size_t c = 1; c <= 2 && c < h->len; c++)
        frontier[n++] = c;
    for (int looked = 0; n > 0 && looked < STARTABLE_SCAN; looked++) {
        size_t best = 0;
        for (size_t k = 1; k < n; k++)
            if (entry_before(heap_at(h, frontier[k]), heap_at(h, frontier[best]))) best = k;
        size_t i = frontier[best];
        frontier[best] = frontier[--n];
        if (entry_can_start(s, heap_at(h, i), room, MEMO)) return heap_at(h, i);
        for (size_t c = 2 * i + 1; c <= 2 * i + 2 && c < h->len; c++)
            frontier[n++] = c;
    }
    return NULL;
}

/* ---------------------------------------------------------------- cutting batches */

/* Whether a partial batch of q's jobs (want of them) waits for company: it does while other
 * batches are in flight (or cut in this round) and its oldest job has waited less than
 * max_delay_us; *hold_until then becomes the earliest moment such a wait ends. With the
 * executor idle it goes at once. */
static bool batch_waits_for_company(sched_t *s, const keyq_t *q, int want, int n_cut, int64_t now,
                                    int64_t *hold_until)
{
    const entry_t *oldest = queue_data(queue_head(&q->entries), entry_t, keyq_node);
    if (want >= s->cfg->max_batch || s->cfg->max_delay_us <= 0 ||
        s->batches_in_flight + n_cut == 0 || now - oldest->created_us >= s->cfg->max_delay_us)
        return false;
    int64_t until = oldest->created_us + s->cfg->max_delay_us;
    if (!*hold_until || until < *hold_until) *hold_until = until;
    return true;
}

/* An empty batch with room for want jobs; NULL when out of memory. */
static sched_batch_t *batch_new(sched_t *s, int want)
{
    sched_batch_t *sb = calloc(1, sizeof *sb);
    job_t **jobs = calloc((size_t)want, sizeof *jobs);
    msg_t *done_msg = calloc(1, sizeof *done_msg);
    if (!sb || !jobs || !done_msg) {
        free(sb);
        free(jobs);
        free(done_msg);
        return NULL;
    }
    sb->done_msg = done_msg;
    sb->s = s;
    sb->batch.jobs = jobs;
    sb->batch.sched_priv = sb;
    queue_init(&sb->ended);
    queue_init(&sb->flight);
    return sb;
}

/* A queued entry joins a batch being cut: its job is read back when stowed, it leaves the
 * queues, starts, and its user is charged an estimate at once (corrected when the batch ends)
 * and counted the device memory it takes. False when its job could not be read back, or would
 * pass its user's share of device memory (memory_admits): it stays queued. */
static bool batch_take(sched_t *s, sched_batch_t *sb, entry_t *e, int64_t now)
{
    if (entry_load(s, e) < 0 || !memory_admits(s, e)) return false;
    job_t *job = e->job;
    sb->batch.jobs[sb->batch.n++] = job;
    entry_unqueue(s, e);
    e->memory_wait = MEMORY_WAIT_NONE;
    memory_take(e);
    e->user->running++;
    job->state = JOB_RUNNING;
    job->started_us = now;
    job->run_started_us = job->run_ended_us = 0;
    job->attempts++;
    e->charged_us = e->estimate_us;
    user_charge(e->user, e->charged_us);
    return true;
}

/* Fills a new batch of up to want jobs led by top, the chosen user's best job. With a batch
 * key, its FIFO fills the rest with the jobs of users under their running limit, the batch's
 * own jobs counted. The look ahead is bounded, so that a backlog of users at their limit costs
 * no long scan: the jobs behind it lead batches of their own when their users are picked. */
static void batch_fill(sched_t *s, sched_batch_t *sb, entry_t *top, int want, int64_t now)
{
    keyq_t *q = top->keyq;
    queue_t *node = q ? queue_head(&q->entries) : NULL;
    entry_t *e = node ? queue_data(node, entry_t, keyq_node) : top;
    if (q && e != top && !batch_take(s, sb, top, now)) return;
    for (int seen = 0; e && sb->batch.n < want && seen < 4 * want; seen++) {
        /* The next one is found before e leaves its FIFO (and maybe frees it). */
        queue_t *next = q ? queue_next(&q->entries, &e->keyq_node) : NULL;
        if (e->user->running < user_max_running(s, e->user)) batch_take(s, sb, e, now);
        e = next ? queue_data(next, entry_t, keyq_node) : NULL;
    }
    for (int i = 0; i < sb->batch.n; i++)
        sb->batch.jobs[i]->batch_size = sb->batch.n;
}

/* Undoes batch_take for every job of sb: they go back to their queues (their batch-key FIFOs'
 * ends), as they were. One that cannot, out of memory, leaves memory: it stays queued in the
 * store and runs after a restart. */
static void batch_untake(sched_t *s, sched_batch_t *sb)
{
    for (int i = 0; i < sb->batch.n; i++) {
        job_t *job = sb->batch.jobs[i];
        entry_t *e = entry_of(s, job);
        entry_untake(e);
        job->state = JOB_QUEUED;
        job->started_us = 0;
        job->batch_size = 0;
        job->attempts--;
        if (entry_queue(s, e) < 0) {
            log_error("job %s could not be re-queued (out of memory): it runs after a restart",
                      job->id);
            waiters_reply(e, NULL);
            entry_forget(s, e);
            job_free(job);
            atomic_fetch_sub(&s->queued, 1);
        }
    }
    sb->batch.n = 0;
}

/* Asks the executor whether sb's device memory fits (executor_ops_t.fit). A batch that never
 * fits is cut in half, refilled from the same leader, while it has more than one job; a single
 * job that never fits goes out all the same, for the executor to fail. A batch that must wait,
 * for memory or for a slot of its device, goes back to its queues, its jobs marked when they
 * wait for memory. 0 when sb goes out; else the batch is empty. */
static int batch_fit(sched_t *s, sched_batch_t *sb, entry_t *top, int64_t now)
{
    if (!s->ex->ops->fit) return 0;
    int r;
    while ((r = s->ex->ops->fit(s->ex, &sb->batch)) == -E2BIG && sb->batch.n > 1) {
        int half = sb->batch.n / 2;
        batch_untake(s, sb);
        batch_fill(s, sb, top, half, now);
        if (sb->batch.n == 0) return -EAGAIN;
    }
    if (r == -E2BIG || r == 0) return 0;
    for (int i = 0; i < sb->batch.n; i++)
        entry_of(s, sb->batch.jobs[i])->memory_wait =
            r == -ENOSPC ? MEMORY_WAIT_POOL : MEMORY_WAIT_NONE;
    batch_untake(s, sb);
    return r;
}

/* A held batch's wait is over, or the jobs recovered at start wait: the round dispatches. */
static void on_dispatch_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    s->want.dispatch = true;
    sched_round(s, false);
}

/* Cuts batches while the executor has free slots, into rd (rd->n of them). A partial batch may
 * be held back for company (batch_waits_for_company): the round's timers phase then arms the
 * dispatch timer for when the first such wait ends (s->want.hold_until_us). */
void round_cut(sched_t *s, round_t *rd)
{
    rd->n = 0;
    s->want.dispatch = false; /* whoever asked for a cut has it */
    if (s->stopping || !s->ex) return;
    s->round++;
    int64_t hold_until = 0;
    int slots = s->ex->ops->free_slots(s->ex, -1);
    while (rd->n < slots && rd->n < DISPATCH_MAX) {
        user_t *u = user_pick(s);
        if (!u) break;
        /* A job pinned to a device with no room (or held there by its resident inputs) waits
         * for it without a trip to the executor (and the two store writes a turned-down batch
         * costs), and the user's best job that can start leads instead; the device's next
         * completion dispatches again. */
        entry_t *top = best_startable(s, u);
        keyq_t *q = top ? top->keyq : NULL;
        int want = q ? (q->len < s->cfg->max_batch ? q->len : s->cfg->max_batch) : 1;
        int64_t now = now_us();
        if (!top || (q && batch_waits_for_company(s, q, want, rd->n, now, &hold_until))) {
            u->skip_round = s->round;
            continue;
        }
        sched_batch_t *sb = batch_new(s, want);
        if (!sb) break;
        batch_fill(s, sb, top, want, now);
        /* Its leader could not be read back or waits for device memory, or the whole batch
         * does: its user waits a round. */
        if (sb->batch.n == 0 || batch_fit(s, sb, top, now) < 0) {
            u->skip_round = s->round;
            batch_free(sb);
            continue;
        }
        rd->ready[rd->n++] = sb;
    }
    if (hold_until && (!s->want.hold_until_us || hold_until < s->want.hold_until_us))
        s->want.hold_until_us = hold_until;
}

/* The round's timers phase: the dispatch timer runs the next round when the earliest wait for
 * company that this round's cuts held back ends. */
void dispatch_timer_arm(sched_t *s)
{
    int64_t wait_us = s->want.hold_until_us - now_us();
    s->want.hold_until_us = 0;
    uv_timer_start(&s->dispatch_timer, on_dispatch_timer,
                   wait_us > 0 ? (uint64_t)(wait_us + 999) / 1000 : 0, 0);
}

/* ------------------------------------------------------------------ starting them */

/* Records the starts of the round's batches in the store's open transaction, but for jobs
 * without an idempotency key taken in since sequence number taken_from (UINT64_MAX: none):
 * their rows are yet to be inserted, started (insert_jobs). */
int round_record_starts(sched_t *s, const round_t *rd, uint64_t taken_from)
{
    int r = 0;
    for (int b = 0; b < rd->n && r >= 0; b++)
        for (int i = 0; i < rd->ready[b]->batch.n && r >= 0; i++) {
            job_t *job = rd->ready[b]->batch.jobs[i];
            if (taken_from != UINT64_MAX && !job->idempotency_key[0] &&
                entry_of(s, job)->seq >= taken_from)
                continue;
            r = store_job_update(s->st, job);
        }
    return r;
}

/* Counts the round's batches out of the queues and, when their starts are recorded, hands
 * them to the executor; rd->refusal says what became of each. */
void round_launch(sched_t *s, round_t *rd, bool recorded)
{
    for (int b = 0; b < rd->n; b++) {
        sched_batch_t *sb = rd->ready[b];
        long jobs = sb->batch.n;
        atomic_fetch_sub(&s->queued, jobs);
        atomic_fetch_add(&s->running, jobs);
        s->batches_in_flight++;
        sb->dispatched_us = now_us();
        rd->refusal[b] = recorded ? s->ex->ops->submit(s->ex, &sb->batch) : START_UNRECORDED;
        STAMP(DISPATCHED);
        if (rd->refusal[b] == 0) {
            batch_watchdog_track(s, sb);
            time_limit_track(s, sb);
            atomic_fetch_add(&s->batches_total, 1);
            if (jobs > 1) atomic_fetch_add(&s->batched_jobs_total, jobs);
            sched_observe_batch(s, jobs);
        }
    }
}

/* Commits the round's transaction while r says it stands, else (or when the commit fails) rolls
 * it back. rd->committed becomes what the store kept of it: a commit that fails may have kept
 * part of it (store_commit_result). Returns r, or the commit's error. */
int round_commit(sched_t *s, round_t *rd, int r)
{
    rd->committed = (store_commit_result_t){0};
    if (r >= 0) {
        r = store_commit(s->st);
        store_commit_result(s->st, &rd->committed);
    }
    if (r < 0) store_rollback(s->st);
    return r;
}

/* Whether the store kept what the round wrote of job. */
bool round_job_committed(const round_t *rd, const job_t *job)
{
    return store_job_committed(&rd->committed, job->id, NULL);
}

/* After a round the store did not keep whole (store_job_committed): the starts it recorded
 * may be lost with it, so the rows of the jobs it cut that were committed before still say
 * queued. Their ends record the start first (record_end); a re-queue leaves them as they are
 * (requeue_batch). */
void round_mark_starts_lost(sched_t *s, const round_t *rd)
{
    for (int b = 0; b < rd->n; b++)
        for (int i = 0; i < rd->ready[b]->batch.n; i++) {
            entry_t *e = entry_of(s, rd->ready[b]->batch.jobs[i]);
            e->start_lost = !round_job_committed(rd, e->job) && !e->discard_result;
        }
}

/* The batches the round's launch did not hand over: turned down by a full device (-EAGAIN),
 * their jobs go back to their queues; otherwise they fail with the reason. Called once the
 * store's transaction is over. */
void round_settle_refused(sched_t *s, const round_t *rd)
{
    for (int b = 0; b < rd->n; b++) {
        int refusal = rd->refusal[b];
        if (refusal == 0) continue;
        /* What fit() held for it goes back, whatever becomes of it. */
        if (s->ex->ops->unfit) s->ex->ops->unfit(s->ex, &rd->ready[b]->batch);
        if (refusal == -EAGAIN) {
            rd->ready[b]->batch.retry = EXEC_RETRY_UNSTARTED;
            batch_retry(s, rd->ready[b]);
        } else {
            batch_fail(s, rd->ready[b],
                       refusal == START_UNRECORDED ? "the store could not record the start"
                                                   : strerror(-refusal));
        }
    }
}

/* Starts what the executor has room for once the loop runs (the jobs recovered at start). */
void dispatch_soon(sched_t *s)
{
    uv_timer_start(&s->dispatch_timer, on_dispatch_timer, 0, 0);
}
