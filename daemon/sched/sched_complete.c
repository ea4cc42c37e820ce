/* The ends of batches: an executor thread posts a finished batch to the loop, which records
 * its jobs' ends (and the starts that follow, in the same transaction), answers their waiters
 * and lets them go; a batch the executor gave back or turned down has its jobs re-queued, or
 * failed when they are out of attempts or the store refuses. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/vec.h"
#include "sched_internal.h"

void count_final(sched_t *s, job_state_t state)
{
    if (state == JOB_SUCCEEDED)
        atomic_fetch_add(&s->succeeded_total, 1);
    else if (state == JOB_FAILED)
        atomic_fetch_add(&s->failed_total, 1);
    else if (state == JOB_CANCELLED)
        atomic_fetch_add(&s->cancelled_total, 1);
}

/* Executor thread: persists large outputs off the loop, and many small ones together (else the
 * loop appends them to its segment), then hands the batch to the loop. */
void on_batch_done(exec_batch_t *batch, void *ud)
{
    sched_t *s = ud;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        for (int j = 0; !job->error_code[0] && j < job->call.n_out; j++) {
            job_tensor_t *t = &job->out[j];
            if (t->data && !t->blob && t->nbytes > s->cfg->inline_blob_bytes) {
                int r = store_blob_write(s->st, t->data, t->nbytes, &t->blob);
                if (r < 0)
                    job_set_error(job, "store_failed", "could not persist output '%s': %s", t->name,
                                  strerror(-r));
            }
        }
    }
    int r = store_blob_pack(s->st, batch->jobs, (size_t)batch->n, true);
    if (r < 0)
        log_warn("could not write a batch's outputs together (%s): the loop stores them",
                 strerror(-r));
    msg_t *m = ((sched_batch_t *)batch->sched_priv)->done_msg;
    m->kind = MSG_DONE;
    m->batch = batch;
    STAMP(DONE_POSTED);
    inbox_push(s, m);
}

/* ---------------------------------------------------------------- recording ends */

/* Removes the files on_batch_done wrote for a job's outputs, which no row will name. */
static void discard_outputs(sched_t *s, const job_t *job)
{
    for (int j = 0; j < job->call.n_out; j++)
        store_blob_discard(s->st, job->out[j].blob);
}

/* The store could not record job's end (err), inside a transaction or outside one: the job
 * ends failed with the reason instead, when it was to succeed (a full disk while writing the
 * outputs, say), and the files of its outputs go; when even that fails, the store keeps it
 * unended and the next start runs it again, which the log says. */
static void end_refused(sched_t *s, job_t *job, int err)
{
    log_error("job %s: could not record its end: %s", job->id, strerror(-err));
    bool recorded = false;
    if (job->state == JOB_SUCCEEDED) {
        discard_outputs(s, job);
        job->state = JOB_FAILED;
        job_set_error(job, "store_failed", "the outputs could not be stored: %s", strerror(-err));
        recorded = store_job_update(s->st, job) >= 0;
    }
    if (!recorded)
        log_error("job %s stays unended in the store and runs again after a restart", job->id);
}

/* store_flush's report of a deferred write that failed: an end is dealt with here, and the
 * start recorded ahead of it when it was lost (record_end) leaves it to the end; a start of a
 * job still running fails the transaction. */
static int end_unrecorded(job_t *job, job_state_t written, int err, void *ud)
{
    if (!job_state_is_final(job->state)) return err;
    if (job_state_is_final(written)) end_refused(ud, job, err);
    return 0;
}

/* Records a job's end (after its start, when that went down with a failed group commit). */
static void record_end(sched_t *s, entry_t *e)
{
    job_t *job = e->job;
    if (e->start_lost) {
        job_state_t end = job->state;
        job->state = JOB_RUNNING;
        store_job_update(s->st, job); /* should it fail, the end below says why */
        job->state = end;
    }
    int r = store_job_update(s->st, job);
    if (r < 0) end_refused(s, job, r);
}

/* A batch leaves the executor's count: its jobs are running no more. */
static void batch_out_of_flight(sched_t *s, const sched_batch_t *sb)
{
    atomic_fetch_sub(&s->running, sb->batch.n);
    batch_flight_end(s, sb);
}

/* A job whose result is kept takes its end state, ended at now. */
static void end_state(job_t *job, int64_t now)
{
    job->finished_us = now;
    job->state = job->error_code[0] ? JOB_FAILED : JOB_SUCCEEDED;
}

/* The ended jobs of waited submissions whose answers carry their results are answered before
 * their ends are written and committed, so that the HTTP thread makes the answer's text while
 * the loop writes: no fsync is waited for (the client holds the result, and retries with its
 * idempotency key should the connection fail; a kill -9 before the commit leaves the job
 * running in the store, to run again at the next start, as for any end). The answer leaves
 * only once the end is committed, later in this same wake of the loop: the gate returned (NULL
 * when none was answered) opens then (sched_gate_t), and whatever the client does next (a
 * GET, a download of an output) finds the end in the store. A job whose outputs are too large
 * for the answer is answered after the commit, as a wait's answer is, and so are the other
 * waiters of every job (waiters_reply_gated). */
static sched_gate_t *answer_waited_ends(sched_t *s, queue_t *ended, int64_t now)
{
    sched_gate_t *gate = NULL;
    queue_t *q;
    queue_foreach(q, ended)
    {
        exec_batch_t *batch = &queue_data(q, sched_batch_t, ended)->batch;
        for (int i = 0; i < batch->n; i++) {
            job_t *job = batch->jobs[i];
            entry_t *e = entry_of(s, job);
            if (e->discard_result) continue;
            end_state(job, now);
            if (!waiters_carry_result(e, job) || (!gate && !(gate = sched_gate_new()))) continue;
            count_final(s, job->state);
            sched_observe_job_end(s, job);
            waiters_reply_gated(e, job, gate);
            e->answered = true;
        }
    }
    return gate;
}

/* What a job ended while its launch went on (running_record) is charged in all, now that the
 * launch returned: nothing when the executor left it out of the run (it never ran), else the
 * device time the launch measured for it, or what it was charged at its end if that was more
 * (a launch interrupted by a device reset measures nothing). */
static int64_t late_charge(const entry_t *e, const job_t *job)
{
    if (job->skipped) return 0;
    return job->gpu_ns > e->charged_ns ? job->gpu_ns : e->charged_ns;
}

/* A finished batch's jobs take their end states, recorded in the store's open transaction
 * when record; its slot and its users' running counts are freed, so that a cut in the same
 * transaction sees them, and its users are charged what it took: each job its gpu_ns, as its
 * record says (entry_charge). A job ended while the launch went on gets the rest of its charge
 * now (late_charge), written to the store once the round commits (write_late_charges). */
static void end_jobs(sched_t *s, sched_batch_t *sb, int64_t now, bool record)
{
    exec_batch_t *batch = &sb->batch;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        entry_t *e = entry_of(s, job);
        e->user->running--;
        memory_give(e);
        if (e->discard_result) {
            /* A job without a row (its submission's commit failed) is charged nothing. */
            int64_t total = e->charge_on_return ? late_charge(e, job) : e->charged_ns;
            e->late_ns = e->charge_on_return ? total - e->charged_ns : 0;
            entry_charge(s, e, e->ended_us, total);
            /* Its result is discarded: so are the files on_batch_done wrote for it, which no
             * row will name, and its input files when it has no row either. */
            discard_outputs(s, job);
            if (e->unstored) discard_inputs(s, job);
            continue;
        }
        end_state(job, now);
        entry_charge(s, e, now, job->gpu_ns);
        /* A failed job keeps no outputs: files on_batch_done wrote for them go (those of a
         * job whose success the store refuses go with end_refused). */
        if (job->state != JOB_SUCCEEDED) discard_outputs(s, job);
        if (record) record_end(s, e);
    }
    /* Counters before the waiters: one that wakes up and reads /metrics sees the batch ended. */
    batch_out_of_flight(s, sb);
}

/* Once a batch's ends are in the store: its jobs are counted (but those answer_waited_ends
 * counted already), their waiters answered (but the waited submissions answer_waited_ends
 * answered already), and they leave memory. */
static void release_ended(sched_t *s, sched_batch_t *sb)
{
    exec_batch_t *batch = &sb->batch;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        entry_t *e = entry_of(s, job);
        if (!e->discard_result && !e->answered) {
            count_final(s, job->state);
            sched_observe_job_end(s, job);
        }
        if (!e->discard_result) waiters_reply(e, job);
        entry_forget(s, e);
        job_free(job);
    }
    batch_free(sb);
}

/* How many late charges wait for the store at most: past it (a store refusing writes for
 * long), a new one is logged and dropped. */
#define LATE_CHARGES_MAX 65536

void late_charges_write(sched_t *s)
{
    size_t done = 0;
    int r = 0;
    while (done < s->n_late_charges && (r = store_job_charge(s->st, &s->late_charges[done])) >= 0)
        done++;
    s->n_late_charges -= done;
    memmove(s->late_charges, s->late_charges + done, s->n_late_charges * sizeof *s->late_charges);
    if (r < 0 && !s->late_charges_failing)
        log_error("%zu charge(s) of device time that launches used after their jobs' end could "
                  "not be recorded (%s): kept, and tried again",
                  s->n_late_charges, strerror(-r));
    else if (r >= 0 && s->late_charges_failing)
        log_info("the charges of device time kept for the store are recorded");
    s->late_charges_failing = r < 0;
}

/* Keeps the rest of the charge of e (late_ns), whose job is job, for late_charges_write. */
static void late_charge_keep(sched_t *s, const entry_t *e, const job_t *job)
{
    const char *op = job_op_name(job);
    if (s->n_late_charges >= LATE_CHARGES_MAX ||
        vec_grow((void **)&s->late_charges, &s->cap_late_charges, s->n_late_charges + 1,
                 sizeof *s->late_charges, 16) < 0) {
        log_error("job %s: %lld ns of device time its launch used after its end are lost: %zu "
                  "charges already wait for the store",
                  e->id, (long long)e->late_ns, s->n_late_charges);
        return;
    }
    store_charge_t *c = &s->late_charges[s->n_late_charges++];
    snprintf(c->id, sizeof c->id, "%s", e->id);
    snprintf(c->owner, sizeof c->owner, "%s", job->owner);
    snprintf(c->op, sizeof c->op, "%s", op ? op : "");
    c->finished_us = e->ended_us;
    c->delta_ns = e->late_ns;
}

/* Writes the rest of the charge of the ended batches' jobs that ended while their launch went
 * on (end_jobs: late_ns), with the charges kept from earlier tries, once the round's
 * transaction is over and before any of the batches' jobs is answered, so that what a client
 * reads next shows it. */
static void write_late_charges(sched_t *s, queue_t *ended)
{
    queue_t *q;
    queue_foreach(q, ended)
    {
        exec_batch_t *batch = &queue_data(q, sched_batch_t, ended)->batch;
        for (int i = 0; i < batch->n; i++) {
            entry_t *e = entry_of(s, batch->jobs[i]);
            if (!e->late_ns) continue;
            late_charge_keep(s, e, batch->jobs[i]);
            e->late_ns = 0;
        }
    }
    if (s->n_late_charges) late_charges_write(s);
}

/* The outputs of the ended batches' jobs whose results are kept, to the store ahead of their
 * ends, as place_submitted_inputs does with inputs. */
static int place_ended_outputs(sched_t *s, queue_t *ended)
{
    size_t n = 0;
    queue_t *q;
    queue_foreach(q, ended) n += (size_t)queue_data(q, sched_batch_t, ended)->batch.n;
    job_t **jobs = n > 0 ? malloc(n * sizeof *jobs) : NULL;
    if (!jobs) return 0;
    n = 0;
    queue_foreach(q, ended)
    {
        exec_batch_t *batch = &queue_data(q, sched_batch_t, ended)->batch;
        for (int i = 0; i < batch->n; i++)
            if (!entry_of(s, batch->jobs[i])->discard_result) jobs[n++] = batch->jobs[i];
    }
    int r = store_jobs_place_small(s->st, jobs, n, true);
    free(jobs);
    return r;
}

/* The round's transaction is lost, in part or whole (store_job_committed): each end it lost
 * is recorded on its own, so that no job is answered as ended while the store still says
 * running. */
static void record_lost_ends(sched_t *s, queue_t *ended, const round_t *rd, int err)
{
    bool any = ended && !queue_empty(ended);
    log_error("could not commit a round of ends and starts (%s)%s", strerror(-err),
              any ? ": recording the ends one by one" : "");
    queue_t *q;
    if (any) queue_foreach(q, ended)
        {
            exec_batch_t *batch = &queue_data(q, sched_batch_t, ended)->batch;
            for (int i = 0; i < batch->n; i++) {
                entry_t *e = entry_of(s, batch->jobs[i]);
                if (!round_job_committed(rd, e->job) && !e->discard_result) record_end(s, e);
            }
        }
    round_mark_starts_lost(s, rd);
}

/* The round's complete and dispatch phases (sched_round.c): records the ends of the finished
 * batches (a list through sched_batch_t.ended; NULL or empty for none) and, when start_next,
 * the starts of what the executor has room for then, in one transaction: one commit per
 * completion instead of two. A cut it could not make (the transaction failed first) is left
 * to the round (s->want.dispatch). The new batches go out before the commit, as in a group
 * commit, and the ended jobs' waiters are answered after it (waited submissions whose answers
 * carry their results before it, to leave once it is over: answer_waited_ends). An end or
 * start lost to a power loss makes the job run again (at least once, never lost): nothing
 * here waits for an fsync. */
void end_batches(sched_t *s, queue_t *ended, bool start_next)
{
    bool any = ended && !queue_empty(ended);
    int64_t now = now_us();
    sched_gate_t *gate = any ? answer_waited_ends(s, ended, now) : NULL;
    int r = any ? store_begin_relaxed(s->st) : 0;
    if (r >= 0 && any) r = place_ended_outputs(s, ended);
    /* The store may write the ends and starts side by side (store_defer_writes); an end it
     * refuses is dealt with by end_unrecorded. */
    if (r >= 0 && any) store_defer_writes(s->st);
    queue_t *q;
    if (any) queue_foreach(q, ended) end_jobs(s, queue_data(q, sched_batch_t, ended), now, r >= 0);
    /* Starts join the ends' transaction only while it stands; else they get one of their own
     * once the ends are dealt with, rather than fail for want of a record. */
    round_t rd = {.n = 0};
    bool cut = start_next && r >= 0;
    if (cut) round_cut(s, &rd);
    if (!any && rd.n == 0) return;
    if (!any && (r = store_begin_relaxed(s->st)) >= 0) store_defer_writes(s->st);
    if (r >= 0) r = round_record_starts(s, &rd, UINT64_MAX);
    int flushed = store_flush(s->st, end_unrecorded, s);
    if (r >= 0) r = flushed;
    round_launch(s, &rd, r >= 0);
    r = round_commit(s, &rd, r);
    if (any) STAMP(END_RECORDED);
    if (r < 0) record_lost_ends(s, ended, &rd, r);
    if (any) write_late_charges(s, ended);
    sched_gate_open(gate);
    while (any && (q = queue_pop(ended)))
        release_ended(s, queue_data(q, sched_batch_t, ended));
    round_settle_refused(s, &rd);
    if (start_next && !cut) s->want.dispatch = true;
}

/* Ends one batch that is not to run (again), starting nothing: its own transaction, never a
 * cut, so that settling a round's refused batches asks nothing of the round. */
static void end_batch(sched_t *s, sched_batch_t *sb)
{
    queue_t one;
    queue_init(&one);
    queue_insert_tail(&one, &sb->ended);
    end_batches(s, &one, false);
}

/* A batch that never reached the executor: its jobs fail with the reason. */
void batch_fail(sched_t *s, sched_batch_t *sb, const char *why)
{
    free(sb->done_msg);
    sb->done_msg = NULL;
    for (int i = 0; i < sb->batch.n; i++)
        job_set_error(sb->batch.jobs[i], "dispatch_failed", "%s", why);
    end_batch(s, sb);
}

/* ------------------------------------------------------------ retries and re-queues */

/* Writes the batch's jobs back as queued (the attempt counts only when they ran), in one
 * transaction; rows whose start was lost say queued already. On failure the jobs are left as
 * they were, running. */
static int requeue_record(sched_t *s, sched_batch_t *sb, bool ran)
{
    exec_batch_t *batch = &sb->batch;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        job->state = JOB_QUEUED;
        job->started_us = 0;
        job->attempts -= !ran;
        job->batch_size = 0;
        job->run_device = -1;
        job->gpu_ns = job->batch_ns = 0; /* an interrupted run is not charged */
        job->error_code[0] = job->error_message[0] = '\0';
    }
    int r = store_begin(s->st);
    for (int i = 0; i < batch->n && r >= 0; i++)
        if (!entry_of(s, batch->jobs[i])->start_lost) r = store_job_update(s->st, batch->jobs[i]);
    if (r >= 0) r = store_commit(s->st);
    if (r < 0) {
        store_rollback(s->st);
        for (int i = 0; i < batch->n; i++) {
            batch->jobs[i]->state = JOB_RUNNING;
            batch->jobs[i]->started_us = sb->dispatched_us;
            batch->jobs[i]->attempts += !ran;
        }
    }
    return r;
}

/* A batch the executor turned down although it had room (-EAGAIN: the device its jobs are
 * pinned to is full), or gave back from a device reset: its jobs go back to their queues, in
 * the store and here, and wait for the next dispatch; the attempt counts only when they ran.
 * If the store refuses, they fail instead, with the reason. */
static void requeue_batch(sched_t *s, sched_batch_t *sb, bool ran)
{
    if (requeue_record(s, sb, ran) < 0) {
        batch_fail(s, sb, "no device could take the job and the store refused to re-queue it");
        return;
    }
    batch_out_of_flight(s, sb);
    for (int i = 0; i < sb->batch.n; i++) {
        job_t *job = sb->batch.jobs[i];
        entry_t *e = entry_of(s, job);
        entry_untake(e);
        e->start_lost = false;
        if (entry_queue(s, e) < 0) {
            log_error("job %s could not be re-queued (out of memory): it runs after a restart",
                      job->id);
            waiters_reply(e, NULL); /* their waits must not outlive the entry */
            entry_forget(s, e);
            job_free(job);
            continue;
        }
        atomic_fetch_add(&s->queued, 1);
    }
    batch_free(sb);
}

/* Moves out of the batch, into spent, the jobs that are not to run again: cancelled ones,
 * and, when the batch ran, those out of attempts. */
static void split_spent(sched_t *s, exec_batch_t *batch, exec_batch_t *spent, bool ran)
{
    int keep = 0;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        if (!entry_of(s, job)->discard_result && (!ran || job->attempts < s->cfg->max_attempts))
            batch->jobs[keep++] = job;
        else
            spent->jobs[spent->n++] = job;
    }
    batch->n = keep;
}

/* A batch the executor gave back (exec_retry_t). Jobs cancelled meanwhile, and interrupted
 * jobs out of attempts (which end with the executor's error), finish in a batch of their
 * own; the others are queued again. */
void batch_retry(sched_t *s, sched_batch_t *sb)
{
    exec_batch_t *batch = &sb->batch;
    bool ran = batch->retry == EXEC_RETRY_INTERRUPTED;
    sched_batch_t *spent = calloc(1, sizeof *spent);
    if (spent && !(spent->batch.jobs = calloc((size_t)batch->n, sizeof *spent->batch.jobs))) {
        free(spent);
        spent = NULL;
    }
    if (!spent) {
        /* Out of memory: the whole batch ends, with the executor's error or this one. */
        for (int i = 0; i < batch->n; i++)
            if (!batch->jobs[i]->error_code[0])
                job_set_error(batch->jobs[i], "out_of_memory",
                              "the job's device was reset and it could not be queued again");
        end_batch(s, sb);
        return;
    }
    split_spent(s, batch, &spent->batch, ran);
    /* A job ended while this launch went on keeps what it was charged then: an interrupted
     * launch measures nothing. */
    for (int i = 0; i < spent->batch.n; i++)
        entry_of(s, spent->batch.jobs[i])->charge_on_return = false;
    queue_init(&spent->ended);
    queue_init(&spent->flight);
    if (spent->batch.n > 0) {
        spent->s = s;
        spent->dispatched_us = sb->dispatched_us;
        spent->batch.sched_priv = spent;
        s->batches_in_flight++; /* end_jobs counts it out */
        end_batch(s, spent);
    } else {
        batch_free(spent);
    }
    if (batch->n > 0) {
        requeue_batch(s, sb, ran);
        return;
    }
    batch_flight_end(s, sb);
    batch_free(sb);
}

/* A batch the executor gave back rather than finished (the others join s->ended: batch_ended);
 * the round dispatches after it. */
void handle_given_back(sched_t *s, msg_t *m)
{
    sched_batch_t *sb = m->batch->sched_priv;
    sb->done_msg = NULL; /* m itself, which the caller frees */
    batch_retry(s, sb);
    s->want.dispatch = true;
}

/* A batch the executor finished (m, its done message, which this frees) joins s->ended, for
 * the round to record with the others: true. False for a batch given back (handle_given_back). */
bool batch_ended(sched_t *s, msg_t *m)
{
    if (m->kind != MSG_DONE || m->batch->retry != EXEC_RETRY_NONE) return false;
    sched_batch_t *sb = m->batch->sched_priv;
    STAMP(COMPLETION);
    sb->done_msg = NULL;
    msg_free(m);
    queue_insert_tail(&s->ended, &sb->ended);
    return true;
}
