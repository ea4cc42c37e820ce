/* Group commit: submissions and buffer uploads wait up to commit_delay_us, then go to the
 * store in one transaction. Within it, idempotent retries are told from first submissions,
 * resident buffers are held to their owners' quotas, the store places the rows
 * (store_jobs_place), and what can start is cut and launched before the commit (its starts
 * recorded in the same transaction). The answers go out once the commit is durable: at once,
 * or from the store's durability thread when it makes the commits durable while the loop goes
 * on. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/budget.h"
#include "sched_internal.h"

/* Removes the files written for a job's inputs that no row of it will name (a file shared
 * with other jobs' tensors once none does). */
void discard_inputs(sched_t *s, const job_t *job)
{
    for (int j = 0; j < OP_MAX_TENSORS; j++)
        store_blob_discard(s->st, job->in[j].blob);
}

/* ------------------------------------------------------------------------ admission */

/* How many of a submission's jobs would be new: a job whose idempotency key names a stored job
 * is a retry, answered with that job, and adds nothing to the queue. */
static long new_jobs(sched_t *s, const msg_t *m)
{
    long n = 0;
    for (size_t i = 0; i < m->n; i++) {
        const job_t *job = m->jobs[i];
        char id[ID_SIZE];
        n += !job->idempotency_key[0] ||
             store_job_find_idempotent(s->rd, job->owner, job->idempotency_key, id) < 0;
    }
    return n;
}

/* Whether the user may submit: no GPU-time budget of theirs is spent (sched_budget.c: a
 * submission of idempotent retries alone is answered anyway), and their queue has room for the
 * submission's new jobs (max_queued_per_user); the jobs then count as pending for the user
 * until the commit. When not, m is answered -EAGAIN naming the key (-EPERM when the limit is
 * 0: the user may not submit), its input files go and m is freed. */
static bool submission_admitted(sched_t *s, msg_t *m)
{
    user_t *u = m->n > 0 ? user_get(s, m->jobs[0]->owner) : NULL;
    if (!u) return true;
    budget_refusal_t spent;
    if (budget_refuses(s, u, &spent) && new_jobs(s, m) > 0) {
        sched_result_t res = {.err = -EAGAIN,
                              .message = spent.message,
                              .limit = spent.limit,
                              .reset_at_us = spent.reset_at_us,
                              .budget_window = budget_window_name(spent.window)};
        m->reply(m->token, &res);
        for (size_t i = 0; i < m->n; i++)
            discard_inputs(s, m->jobs[i]);
        msg_free(m);
        return false;
    }
    long queued = (long)u->queue.len + u->pending;
    const policy_limits_t *l = user_limits(s, u);
    long max = (long)l->value[CONFIG_POLICY_MAX_QUEUED];
    if (queued + (long)m->n > max && queued + new_jobs(s, m) > max) {
        char why[256];
        /* A limit of 0 is not a full queue that will drain: the user may not submit. */
        if (max == 0)
            snprintf(why, sizeof why, "'%s' may not submit jobs: %s = 0", u->owner,
                     l->source[CONFIG_POLICY_MAX_QUEUED]);
        else
            snprintf(why, sizeof why, "'%s' has %ld jobs queued; %zu more would pass %s = %ld",
                     u->owner, queued, m->n, l->source[CONFIG_POLICY_MAX_QUEUED], max);
        reply_refused(m->reply, m->token, max == 0 ? -EPERM : -EAGAIN, why,
                      l->source[CONFIG_POLICY_MAX_QUEUED]);
        for (size_t i = 0; i < m->n; i++)
            discard_inputs(s, m->jobs[i]);
        msg_free(m);
        return false;
    }
    u->pending += (long)m->n;
    return true;
}

/* The window is over: the round commits. */
static void on_commit_timer(uv_timer_t *t)
{
    sched_round(t->data, false);
}

/* Asks the round for a group commit. libuv timers have millisecond resolution: a window under
 * 1 ms, or none while stopping (the loop is about to end), commits as soon as the round has
 * taken in every message of its wake, which groups everything that arrived meanwhile without
 * a loop iteration more; a longer one runs on commit_timer. */
static void schedule_commit(sched_t *s)
{
    if (s->want.commit) return;
    s->want.commit = true;
    if (s->cfg->commit_delay_us < 1000 || s->stopping) return;
    uv_timer_start(&s->commit_timer, on_commit_timer, (uint64_t)s->cfg->commit_delay_us / 1000, 0);
}

/* A submission or buffer upload joins the next group commit (m is the loop's from now on). */
void handle_submission(sched_t *s, msg_t *m)
{
    STAMP(LOOP_TAKEN);
    if (m->kind == MSG_SUBMIT && !submission_admitted(s, m)) return;
    queue_insert_tail(&s->pending, &m->node);
    schedule_commit(s);
}

/* ------------------------------------------------------------- inside the transaction */

/* Sets m->err (naming the key in m->err_limit) when buffer bytes of the owner's, used, and
 * the new buffer's pass the byte limit key. */
static bool buffer_quota_refuses(msg_t *m, const policy_limits_t *l, config_policy_key_t key,
                                 uint64_t used)
{
    if (!policy_bytes_exceeded(l, key, m->buf->owner, used, m->buf->nbytes, m->err_message,
                               sizeof m->err_message))
        return false;
    m->err = -EDQUOT;
    snprintf(m->err_limit, sizeof m->err_limit, "%s", l->source[key]);
    return true;
}

/* Sets m->err (naming the key) when the owner's resident bytes, used, and the new buffer's pass
 * the owner's share of the device memory pool (share bytes; sched_memory.c). */
static bool device_share_refuses(msg_t *m, const policy_limits_t *l, uint64_t share, uint64_t used)
{
    uint64_t more = m->buf->nbytes;
    if (!share || (used <= share && more <= share - used)) return false;
    const char *key = l->source[CONFIG_POLICY_DEVICE_MEMORY_PCT];
    snprintf(m->err_message, sizeof m->err_message,
             "%llu resident bytes held, %llu more would pass %s = %llu%% of the device "
             "memory pool (%llu bytes)",
             (unsigned long long)used, (unsigned long long)more, key,
             (unsigned long long)l->value[CONFIG_POLICY_DEVICE_MEMORY_PCT],
             (unsigned long long)share);
    m->err = -EDQUOT;
    snprintf(m->err_limit, sizeof m->err_limit, "%s", key);
    return true;
}

/* A buffer must fit its owner's quotas of stored (and, resident, of resident) bytes, and a
 * resident one its owner's share of the device memory pool. The sums are read inside the group
 * commit's transaction, so that the buffers of one commit add up (the API's check before the
 * upload is written cannot see those). Sets m->err when it does not fit. */
static int check_buffer_quotas(sched_t *s, msg_t *m)
{
    user_t *u = user_get(s, m->buf->owner);
    if (!u) return -ENOMEM;
    const policy_limits_t *l = user_limits(s, u);
    uint64_t share = m->buf->resident ? memory_user_limit(s, u) : 0;
    bool resident = m->buf->resident && (l->value[CONFIG_POLICY_MAX_RESIDENT_BYTES] || share);
    if (!resident && !l->value[CONFIG_POLICY_MAX_STORED_BYTES]) return 0;
    uint64_t stored = 0, resident_used = 0;
    int r = store_buffer_bytes(s->st, m->buf->owner, &stored, &resident_used);
    if (r < 0) return r;
    /* An ephemeral buffer is never stored: only the resident quota holds it. */
    bool stored_over =
        m->buf->durable && buffer_quota_refuses(m, l, CONFIG_POLICY_MAX_STORED_BYTES, stored);
    if (!stored_over && resident &&
        !buffer_quota_refuses(m, l, CONFIG_POLICY_MAX_RESIDENT_BYTES, resident_used))
        device_share_refuses(m, l, share, resident_used);
    return 0;
}

/* Inserts the round's buffers that fit their quotas. */
static int insert_buffers(sched_t *s, queue_t *pending)
{
    int r = 0;
    for (queue_t *q = queue_head(pending); q && r >= 0; q = queue_next(pending, q)) {
        msg_t *m = queue_data(q, msg_t, node);
        if (m->kind != MSG_BUF_PUT) continue;
        r = check_buffer_quotas(s, m);
        if (r >= 0 && !m->err) r = store_buffer_insert(s->st, m->buf);
        if (r >= 0 && !m->err && m->buf->resident) memory_resident_changed(s);
    }
    return r;
}

/* Inserts the rows of a round's jobs with an idempotency key (keyed), or of the others. A
 * keyed job goes in before the cut: when its key names a stored job it is replayed, and must
 * not be queued. */
static int insert_jobs(sched_t *s, queue_t *pending, bool keyed)
{
    int r = 0;
    for (queue_t *q = queue_head(pending); q && r >= 0; q = queue_next(pending, q)) {
        msg_t *m = queue_data(q, msg_t, node);
        for (size_t i = 0; m->kind == MSG_SUBMIT && i < m->n && r >= 0; i++) {
            job_t *job = m->jobs[i];
            if ((job->idempotency_key[0] != '\0') != keyed) continue;
            r = store_job_insert(s->st, job);
            if (r == -EEXIST && keyed) {
                m->fate[i] = FATE_REPLAYED;
                r = 0;
            }
        }
    }
    return r;
}

/* Whether m is a submission still to be written (not refused on its own). */
static bool is_live_submission(const msg_t *m)
{
    return m->kind == MSG_SUBMIT && !m->err;
}

/* Hands the store the small inputs of a round's submissions before their rows are written, so
 * that, when they go to its segment, its sync runs beside those writes
 * (store_jobs_place_small). Out of memory, the writes place them as they go. */
static int place_submitted_inputs(sched_t *s, queue_t *pending)
{
    size_t n = 0;
    queue_t *q;
    queue_foreach(q, pending)
    {
        msg_t *m = queue_data(q, msg_t, node);
        if (is_live_submission(m)) n += m->n;
    }
    job_t **jobs = n > 0 ? malloc(n * sizeof *jobs) : NULL;
    if (!jobs) return 0;
    n = 0;
    queue_foreach(q, pending)
    {
        msg_t *m = queue_data(q, msg_t, node);
        for (size_t i = 0; is_live_submission(m) && i < m->n; i++)
            jobs[n++] = m->jobs[i];
    }
    int r = store_jobs_place_small(s->st, jobs, n, false);
    free(jobs);
    return r;
}

/* Has the store choose where the rows of a round's submissions go, each submission's
 * together, so that a commit keeps or loses a submission whole and the rows of many run side
 * by side (store_jobs_place). Their ids, made on the HTTP threads, may change: the answers'
 * copies follow. Out of memory, the rows stay where their ids put them. */
static void place_submissions(sched_t *s, queue_t *pending)
{
    size_t n = 0;
    queue_t *q;
    queue_foreach(q, pending) n += is_live_submission(queue_data(q, msg_t, node));
    store_job_group_t *groups = n > 0 ? malloc(n * sizeof *groups) : NULL;
    if (!groups) return;
    n = 0;
    queue_foreach(q, pending)
    {
        msg_t *m = queue_data(q, msg_t, node);
        if (is_live_submission(m)) groups[n++] = (store_job_group_t){m->jobs, m->n};
    }
    store_jobs_place(s->st, groups, n);
    free(groups);
    queue_foreach(q, pending)
    {
        msg_t *m = queue_data(q, msg_t, node);
        for (size_t i = 0; is_live_submission(m) && i < m->n; i++)
            if (m->shown[i]) memcpy(m->shown[i]->id, m->jobs[i]->id, ID_SIZE);
    }
}

/* Takes a submission's new jobs into the queues, inside its group commit's transaction. The
 * message owns them until the commit returns: settle_submitted then hands them to the queues,
 * or drop_submitted takes them back. */
static void take_submitted(sched_t *s, msg_t *m)
{
    for (size_t i = 0; i < m->n; i++) {
        job_t *job = m->jobs[i];
        if (m->fate[i] == FATE_REPLAYED) continue;
        /* Keep small inputs in memory for the run; large ones are read back then. */
        for (int j = 0; j < OP_MAX_TENSORS; j++)
            if (job->in[j].nbytes > s->cfg->inline_blob_bytes && job->in[j].blob) {
                free(job->in[j].data);
                job->in[j].data = NULL;
            }
        if (entry_add(s, job) == 0) m->fate[i] = FATE_TAKEN;
    }
}

/* Whether the round's batches may go to the executor before the rows of their jobs are
 * written: when every job in them is new, without a key (taken in since sequence number
 * taken_from: its row is yet to be inserted, started), and has its inputs in memory. Writing
 * a new row reads the job's inputs and sets their locators, while the executor, once it has
 * the batch, reads in (into the tensor) every input whose bytes are not in memory, a blob's
 * or a buffer's, and sets the job's device; the update that records an older job's start
 * (which the store may defer to store_flush) reads that device. With only such new jobs
 * the writes and the executor touch nothing in common but what both only read. */
static bool launch_before_rows(sched_t *s, const round_t *rd, uint64_t taken_from)
{
    for (int b = 0; b < rd->n; b++)
        for (int i = 0; i < rd->ready[b]->batch.n; i++) {
            const job_t *job = rd->ready[b]->batch.jobs[i];
            if (job->idempotency_key[0] || entry_of(s, job)->seq < taken_from) return false;
            for (int j = 0; j < OP_MAX_TENSORS; j++)
                if (job->call.has_in[j] && (!job->in[j].data || !job->in[j].name[0])) return false;
        }
    return true;
}

/* The new jobs join the queues and what can start goes out before the commit, its start
 * recorded in the same transaction: the device runs them while the commit writes. Jobs
 * without a key get their rows only now, as their cut left them: one that starts costs one
 * row write instead of two. Those rows are written after the launch when launch_before_rows
 * allows, so that a waited tiny job starts without waiting for its own insert: its row is
 * committed before this wake of the loop ends, and its end, which the loop takes in only on
 * a later wake, finds it there. Should the rows or the commit fail after the launch, the
 * batches' results are thrown away (drop_submitted) and their submitters told, as when a
 * commit fails after any launch. */
static int cut_and_launch(sched_t *s, queue_t *pending, round_t *rd)
{
    uint64_t taken_from = s->next_seq;
    queue_t *q;
    queue_foreach(q, pending)
    {
        msg_t *m = queue_data(q, msg_t, node);
        if (is_live_submission(m)) take_submitted(s, m);
    }
    round_cut(s, rd);
    /* The store may write the rows side by side (store_defer_writes). */
    store_defer_writes(s->st);
    int r = round_record_starts(s, rd, taken_from);
    bool first = launch_before_rows(s, rd, taken_from);
    if (first) round_launch(s, rd, r >= 0);
    if (r >= 0) r = insert_jobs(s, pending, false);
    int flushed = store_flush(s->st, NULL, NULL);
    if (r >= 0) r = flushed;
    if (!first) round_launch(s, rd, r >= 0);
    return r;
}

/* Writes the round's buffers and jobs and commits them, cutting and launching what can start
 * on the way (*cut says whether it got that far). *why is what a message lost with a failed
 * commit is told. */
static int commit_write(sched_t *s, queue_t *pending, bool defer, round_t *rd, bool *cut,
                        const char **why)
{
    /* After a failed sync, what is committed may not reach the disk: nothing more is taken
     * (the jobs would run, and their submitters, told of an error, would submit them again). */
    int r = defer ? store_durable_error(s->st) : 0;
    *why = "the store could not commit the request";
    if (r < 0) {
        /* Even after a full disk: freeing space cannot bring back what the failed sync lost. */
        atomic_store(&s->store_failed, true);
        *why = "the store's disk failed to sync; nothing is accepted until the daemon restarts";
        r = -EIO;
    }
    if (r == 0) r = defer ? store_begin_relaxed(s->st) : store_begin(s->st);
    place_submissions(s, pending);
    if (r >= 0) r = place_submitted_inputs(s, pending);
    if (r >= 0) r = insert_buffers(s, pending);
    if (r >= 0) r = insert_jobs(s, pending, true);
    *cut = r >= 0;
    if (*cut) r = cut_and_launch(s, pending, rd);
    /* The store keeps or loses a message's rows together (store_jobs_place): a commit that
     * failed may still have kept it (rd->committed). */
    r = round_commit(s, rd, r);
    if (r < 0) log_error("group commit failed: %s", strerror(-r));
    if (r == -ENOSPC) *why = "no space left on the daemon's disk to commit the request";
    return r;
}

/* ------------------------------------------------------------------ after the commit */

/* After the commit: the taken jobs belong to the queues (and to the batches they went out
 * in); replayed ones answer with the job their key created first. */
static void settle_submitted(sched_t *s, msg_t *m)
{
    m->all_replayed = true;
    for (size_t i = 0; i < m->n; i++) {
        job_t *job = m->jobs[i];
        char id[ID_SIZE];
        if (m->fate[i] == FATE_REPLAYED) {
            job_t *first = NULL;
            if (store_job_find_idempotent(s->rd, job->owner, job->idempotency_key, id) == 0 &&
                store_job_get(s->rd, id, &first) == 0) {
                job_free(m->shown[i]);
                m->shown[i] = first;
            }
            continue;
        }
        m->all_replayed = false;
        atomic_fetch_add(&s->submitted_total, 1);
        if (m->fate[i] != FATE_TAKEN) {
            log_error("job %s committed but not queued (out of memory): it runs after a restart",
                      job->id);
            continue;
        }
        entry_t *e = entry_of(s, job);
        m->jobs[i] = NULL;
        if (e) entry_stow(s, e);
    }
    /* The answer says why those of its jobs that did not start at once wait; without memory
     * for that it still answers, only without the reasons. */
    (void)sched_explain_copies(s, m->shown, m->n);
}

/* After a failed commit: the taken jobs leave the queues. Those that went out already stay
 * with their batches, which throw their results away. */
static void drop_submitted(sched_t *s, msg_t *m)
{
    for (size_t i = 0; i < m->n; i++) {
        if (m->fate[i] != FATE_TAKEN) continue;
        entry_t *e = entry_of(s, m->jobs[i]);
        if (!entry_queued(e)) {
            e->discard_result = e->unstored = true;
            m->jobs[i] = NULL;
            continue;
        }
        entry_unqueue(s, e);
        entry_forget(s, e);
        atomic_fetch_sub(&s->queued, 1);
    }
}

/* Answers a committed submission or buffer. */
static void answer_committed(msg_t *m)
{
    for (size_t i = 0; !m->err && m->kind == MSG_SUBMIT && i < m->n; i++)
        if (!m->shown[i]) m->err = -ENOMEM; /* committed, but cannot be shown */
    if (m->err) {
        reply_refused(m->reply, m->token, m->err, m->err_message[0] ? m->err_message : NULL,
                      m->err_limit[0] ? m->err_limit : NULL);
    } else if (m->kind == MSG_BUF_PUT) {
        sched_result_t res = {.buffer = m->buf};
        m->reply(m->token, &res);
    } else {
        sched_result_t res = {.jobs = m->shown,
                              .n_jobs = m->n,
                              .replayed = m->all_replayed,
                              .take_jobs = &m->shown_taken};
        m->reply(m->token, &res);
    }
}

/* Sync thread: answers a message whose commit is durable now, or could not be made so (but
 * a waited submission, whose answer is its job's end: m->reply is NULL then). The message is
 * the sync thread's alone by then: nothing in it belongs to the loop. */
static void answer_synced(store_durable_wait_t *item, int err)
{
    msg_t *m = (msg_t *)(void *)((char *)item - offsetof(msg_t, synced));
    STAMP(SYNCED);
    if (!m->reply) {
        /* A waited submission: its job's end answers it (submission_wait). */
        msg_free(m);
        return;
    }
    if (err) {
        char why[160];
        snprintf(why, sizeof why,
                 "the store could not make the request durable (%s); its jobs may still run",
                 strerror(-err));
        /* A full disk is the client's to know (507); any other failure is ours. */
        reply_err(m->reply, m->token, err == -ENOSPC ? err : -EIO, why);
    } else
        answer_committed(m);
    msg_free(m);
}

/* Settles one message of the round once its commit returned (committed: what the store kept
 * of it; err: the commit's error, why: what a lost message is told). Returns true when m is
 * to be synced (defer): the caller then hands it to the store's durability thread, which answers it
 * (but for a waited submission, answered by its job's end); otherwise m is answered here (or waits
 * for its job's end) and the caller frees it. */
static bool commit_settle(sched_t *s, msg_t *m, const store_commit_result_t *committed, bool defer,
                          int err, const char *why)
{
    /* The sync it waits for, when deferred, is that of its rows' commit. */
    bool lost = m->kind == MSG_SUBMIT && m->n > 0
                    ? !store_job_committed(committed, m->jobs[0]->id, &m->synced)
                    : !store_buffers_committed(committed, &m->synced);
    if (lost && m->kind == MSG_SUBMIT) drop_submitted(s, m);
    /* Files written for rows that were not committed (a failed commit, a refused buffer, a
     * replayed submission) go now rather than at the next start's sweep; those of jobs that
     * went out go when their launch returns (end_jobs). */
    if (m->kind == MSG_BUF_PUT && (lost || m->err)) {
        store_blob_discard(s->st, m->buf->blob);
        /* An ephemeral buffer's copy was kept before its row: it goes with the row. */
        if (!m->buf->durable && s->ex && s->ex->ops->buffer_deleted)
            s->ex->ops->buffer_deleted(s->ex, m->buf->id);
    }
    for (size_t i = 0; i < m->n; i++)
        if (m->jobs[i] && (lost || m->fate[i] == FATE_REPLAYED)) discard_inputs(s, m->jobs[i]);
    if (lost) {
        reply_err(m->reply, m->token, err == -ENOSPC ? err : -EIO, why);
        return false;
    }
    if (m->err) {
        reply_refused(m->reply, m->token, m->err, m->err_message,
                      m->err_limit[0] ? m->err_limit : NULL);
        return false;
    }
    if (m->kind == MSG_SUBMIT) settle_submitted(s, m);
    if (m->kind == MSG_BUF_PUT && m->buf->resident && s->ex && s->ex->ops->buffer_added)
        s->ex->ops->buffer_added(s->ex, m->buf);
    /* A waited submission is answered by its job's end (submission_wait), without waiting for
     * the sync, which still follows. */
    if (m->waited && submission_wait(s, m)) return defer;
    if (defer) return true;
    answer_committed(m);
    return false;
}

/* Takes the pending messages into round, a list of the caller's; their jobs stop counting as
 * their users' pending ones. */
static void take_pending(sched_t *s, queue_t *round)
{
    queue_move(&s->pending, round);
    queue_t *q;
    queue_foreach(q, round)
    {
        msg_t *m = queue_data(q, msg_t, node);
        if (m->kind != MSG_SUBMIT || m->n == 0) continue;
        user_t *u = strmap_get(s->users, m->jobs[0]->owner);
        if (u) u->pending -= (long)m->n;
    }
}

/* Writes every pending submission and buffer in one transaction, starts what it can, and
 * answers them (once durable, when the store makes commits durable later). */
void commit_pending(sched_t *s)
{
    s->want.commit = false;
    queue_t pending, unsynced; /* unsynced: committed, answered once durable */
    queue_init(&pending);
    queue_init(&unsynced);
    take_pending(s, &pending);
    if (queue_empty(&pending)) return;
    /* While the loop runs, the store makes the commit durable and the jobs start meanwhile;
     * when it is about to end, the commit syncs itself. */
    bool defer = store_durable_later(s->st) && !s->stopping;
    round_t rd = {.n = 0};
    bool cut;
    const char *why;
    int err = commit_write(s, &pending, defer, &rd, &cut, &why);
    STAMP(INSERTED);
    for (queue_t *q; (q = queue_pop(&pending));) {
        msg_t *m = queue_data(q, msg_t, node);
        if (commit_settle(s, m, &rd.committed, defer, err, why))
            queue_insert_tail(&unsynced, &m->node);
        else
            msg_free(m);
    }
    round_mark_starts_lost(s, &rd);
    round_settle_refused(s, &rd);
    if (!cut) s->want.dispatch = true; /* the transaction failed before its cut */
    for (queue_t *q; (q = queue_pop(&unsynced));) {
        msg_t *m = queue_data(q, msg_t, node);
        m->synced.done = answer_synced;
        STAMP(SYNC_ASKED);
        store_when_durable(s->st, &m->synced);
    }
}
