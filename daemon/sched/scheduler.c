/* The scheduler's loop. Everything below runs on the loop thread except the public entry
 * points (which post a message and wake the loop), on_batch_done (which runs on an executor
 * thread and posts the finished batch) and answer_synced (which runs on the commit syncer's
 * thread and answers a message the loop handed over).
 *
 * In memory the loop keeps every job that is not final: an entry per job, indexed by id; per
 * user a heap of queued entries (priority, then arrival); per batch key a FIFO of queued
 * entries, from which batches are cut; a heap of deadlines. A job leaves memory when it ends;
 * reads of finished jobs go to the store. */
#include "scheduler.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <uv.h>

#include "daemon/store/store.h"
#include "daemon/util/log.h"
#include "daemon/util/service_notify.h"
#include "daemon/util/strmap.h"

/* Recent usage decays with this half-life: fair share looks at the last minute or so. */
#define USAGE_HALF_LIFE_US 30e6

typedef struct entry entry_t;

/* A binary heap of entries. Each entry records its own position in the heap (the int at
 * pos_offset in entry_t, -1 when absent), so that any entry leaves in O(log n). */
typedef struct heap {
    entry_t **a;
    int len, cap;
    bool (*before)(const entry_t *x, const entry_t *y);
    size_t pos_offset;
} heap_t;

typedef struct waiter {
    struct waiter *next;
    struct entry *entry;
    struct sched *s;
    sched_reply_fn reply;
    void *token;
    uv_timer_t timer;
} waiter_t;

typedef struct user {
    char owner[OWNER_SIZE];
    heap_t queue; /* queued entries: highest priority, then oldest, first */
    int running;
    long pending;    /* jobs submitted, waiting for the group commit */
    double usage_us; /* decayed device (or CPU) time, charged at dispatch, corrected at end */
    int64_t usage_at;
    unsigned skip_round; /* dispatch round in which this user's next batch is held back */
} user_t;

typedef struct keyq {
    struct entry *head, *tail;
    int len;
    char key[];
} keyq_t;

struct entry {
    job_t *job;
    user_t *user;
    uint64_t seq;
    int priority;     /* the job's, here for the heap's comparisons: a job_t is 4.6 KiB away */
    int queue_pos;    /* in user->queue, -1 when not queued */
    int deadline_pos; /* in s->deadlines, -1 when none */
    keyq_t *keyq;     /* while queued with a batch key */
    struct entry *kprev, *knext;
    waiter_t *waiters;
    /* Its result is thrown away when its launch returns: it was cancelled while running, or
     * its submission's commit failed after it had gone out. */
    bool discard_result;
    bool unstored;   /* went out in a group commit that failed: it has no row */
    bool start_lost; /* cut in a group commit that failed: its row still says queued */
    double charged_us;
};

typedef enum msg_kind {
    MSG_SUBMIT,
    MSG_WAIT,
    MSG_CANCEL,
    MSG_BUF_PUT,
    MSG_BUF_DELETE,
    MSG_DONE,
    MSG_STOP,
} msg_kind_t;

/* What became of each job of a submission in its group commit. */
typedef enum job_fate {
    FATE_NEW,      /* not taken (yet): the message owns it */
    FATE_REPLAYED, /* its idempotency key named a stored job: that job answers for it */
    FATE_TAKEN,    /* queued (or cut into a batch); the message owns it until the commit returns */
} job_fate_t;

typedef struct msg {
    struct msg *next;
    msg_kind_t kind;
    sched_reply_fn reply;
    void *token;
    job_t **jobs;
    size_t n;
    job_fate_t *fate; /* submit: per job */
    bool any_owner;
    char owner[OWNER_SIZE];
    char id[ID_SIZE];
    int timeout_ms;
    buffer_t *buf;
    exec_batch_t *batch;
    int err; /* a refusal of this message alone, within a group commit */
    char err_message[160];
    /* A committed submission's answer, given once its commit is durable: */
    job_t **shown;    /* submit: the jobs as accepted (or as first created, when replayed); owned */
    bool shown_taken; /* the answer's callee took shown (sched_result_t.take_jobs) */
    bool all_replayed;        /* every job's idempotency key was known */
    int shard;                /* of the store, that its rows go to (buffers: 0) */
    store_sync_item_t synced; /* queued with the commit syncer, which answers it */
} msg_t;

struct sched {
    const config_t *cfg;
    store_t *st;
    store_reader_t *rd; /* the loop's own reader, for finished jobs */
    executor_t *ex;

    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t commit_timer, dispatch_timer, deadline_timer, gc_timer, checkpoint_timer,
        drain_timer, watchdog_timer;
    pthread_t thread;
    bool thread_started;

    pthread_mutex_t lock; /* guards the inbox */
    msg_t *inbox_head, *inbox_tail;
    atomic_bool accepting;
    atomic_bool store_failed; /* a sync failed: nothing more is accepted */
    atomic_bool loop_gone;

    /* Loop thread only. */
    msg_t *pending_head, *pending_tail; /* awaiting the group commit */
    bool commit_scheduled;
    /* With [store] sync_full: a thread that makes group commits durable while the loop goes
     * on, and answers them then. */
    store_sync_t *syncer;
    store_checkpointer_t *checkpointer; /* run by the syncer; NULL without one */
    strmap_t *entries, *users, *keyqs;
    heap_t deadlines; /* queued entries with a deadline, earliest first */
    uint64_t next_seq;
    int batches_in_flight;
    unsigned round;
    unsigned next_shard; /* of the store, for the next round of few jobs (place_submissions) */
    bool stopping;

    atomic_long queued, running, submitted_total, succeeded_total, failed_total, cancelled_total,
        batches_total, batched_jobs_total;
};

typedef struct sched_batch {
    exec_batch_t batch;
    sched_t *s;
    int64_t dispatched_us;
    struct msg *done_msg; /* allocated at dispatch, so that reporting the end needs no memory */
    struct sched_batch *next_ended; /* in the list of finished batches end_batches records */
} sched_batch_t;

/* The most batches one dispatch cuts. */
#define DISPATCH_MAX 64

static void dispatch(sched_t *s);
static void end_batches(sched_t *s, sched_batch_t *ended, bool start_next);
static int cut_batches(sched_t *s, sched_batch_t *ready[DISPATCH_MAX]);
static int record_starts(sched_t *s, sched_batch_t *const *ready, int n, uint64_t taken_from);
static void launch(sched_t *s, sched_batch_t *const *ready, int n, bool recorded, int *refusal);
static void settle_refused(sched_t *s, sched_batch_t *const *ready, int n, const int *refusal);
static void mark_starts_lost(sched_t *s, sched_batch_t *const *ready, int n, unsigned committed);

static void reply_err(sched_reply_fn reply, void *token, int err, const char *message)
{
    sched_result_t res = {.err = err, .message = message};
    reply(token, &res);
}

static void reply_jobs(sched_reply_fn reply, void *token, job_t *const *jobs, size_t n,
                       bool replayed)
{
    sched_result_t res = {.jobs = jobs, .n_jobs = n, .replayed = replayed};
    reply(token, &res);
}

/* ---------------------------------------------------------------- heaps and queues */

static int *heap_pos(const heap_t *h, entry_t *e)
{
    return (int *)(void *)((char *)e + h->pos_offset);
}

static void heap_place(heap_t *h, int i, entry_t *e)
{
    h->a[i] = e;
    *heap_pos(h, e) = i;
}

static void heap_sift(heap_t *h, int i)
{
    entry_t *e = h->a[i];
    while (i > 0 && h->before(e, h->a[(i - 1) / 2])) {
        heap_place(h, i, h->a[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        int l = 2 * i + 1, r = l + 1, best = i;
        entry_t *b = e;
        if (l < h->len && h->before(h->a[l], b)) best = l, b = h->a[l];
        if (r < h->len && h->before(h->a[r], b)) best = r, b = h->a[r];
        if (best == i) break;
        heap_place(h, i, b);
        i = best;
    }
    heap_place(h, i, e);
}

static int heap_push(heap_t *h, entry_t *e)
{
    if (h->len == h->cap) {
        int cap = h->cap ? 2 * h->cap : 16;
        entry_t **a = realloc(h->a, (size_t)cap * sizeof *a);
        if (!a) return -ENOMEM;
        h->a = a;
        h->cap = cap;
    }
    heap_place(h, h->len++, e);
    heap_sift(h, h->len - 1);
    return 0;
}

static void heap_remove(heap_t *h, entry_t *e)
{
    int i = *heap_pos(h, e);
    if (i < 0) return;
    entry_t *last = h->a[--h->len];
    if (i != h->len) {
        heap_place(h, i, last);
        heap_sift(h, i);
    }
    *heap_pos(h, e) = -1;
}

/* A user's queue: highest priority first, then arrival. */
static bool entry_before(const entry_t *a, const entry_t *b)
{
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->seq < b->seq;
}

static bool deadline_before(const entry_t *a, const entry_t *b)
{
    return a->job->deadline_us < b->job->deadline_us;
}

static void deadline_arm(sched_t *s);

static int deadline_push(sched_t *s, entry_t *e)
{
    int r = heap_push(&s->deadlines, e);
    if (r >= 0 && e->deadline_pos == 0) deadline_arm(s);
    return r;
}

static void keyq_remove(sched_t *s, entry_t *e)
{
    keyq_t *q = e->keyq;
    if (!q) return;
    if (e->kprev)
        e->kprev->knext = e->knext;
    else
        q->head = e->knext;
    if (e->knext)
        e->knext->kprev = e->kprev;
    else
        q->tail = e->kprev;
    e->kprev = e->knext = NULL;
    e->keyq = NULL;
    if (--q->len == 0) {
        strmap_remove(s->keyqs, q->key);
        free(q);
    }
}

/* Jobs batch together when their ops say so (equal batch keys) and they may run on the same
 * device (equal pins). */
static int keyq_append(sched_t *s, entry_t *e)
{
    char key[OP_BATCH_KEY_LEN + 16];
    snprintf(key, sizeof key, "%s@%d/%d", e->job->call.batch_key, e->job->device,
             e->job->preferred_device);
    keyq_t *q = strmap_get(s->keyqs, key);
    if (!q) {
        size_t len = strlen(key);
        q = calloc(1, sizeof *q + len + 1);
        if (!q) return -ENOMEM;
        memcpy(q->key, key, len + 1);
        if (strmap_put(s->keyqs, q->key, q) < 0) {
            free(q);
            return -ENOMEM;
        }
    }
    e->keyq = q;
    e->kprev = q->tail;
    e->knext = NULL;
    if (q->tail)
        q->tail->knext = e;
    else
        q->head = e;
    q->tail = e;
    q->len++;
    return 0;
}

static user_t *user_get(sched_t *s, const char *owner)
{
    user_t *u = strmap_get(s->users, owner);
    if (u) return u;
    u = calloc(1, sizeof *u);
    if (!u) return NULL;
    snprintf(u->owner, sizeof u->owner, "%s", owner);
    u->queue = (heap_t){.before = entry_before, .pos_offset = offsetof(entry_t, queue_pos)};
    u->usage_at = now_us();
    if (strmap_put(s->users, u->owner, u) < 0) {
        free(u);
        return NULL;
    }
    return u;
}

static void user_charge(user_t *u, double us)
{
    int64_t now = now_us();
    u->usage_us = u->usage_us * exp2(-(double)(now - u->usage_at) / USAGE_HALF_LIFE_US) + us;
    u->usage_at = now;
}

/* Takes a queued entry out of every queue structure (not out of s->entries). */
static void entry_unqueue(sched_t *s, entry_t *e)
{
    heap_remove(&e->user->queue, e);
    keyq_remove(s, e);
    heap_remove(&s->deadlines, e);
}

/* Puts an entry into its user's queue, its batch key's FIFO and the deadlines. */
static int entry_queue(sched_t *s, entry_t *e)
{
    int r = heap_push(&e->user->queue, e);
    if (r >= 0 && e->job->call.batch_key[0]) r = keyq_append(s, e);
    if (r >= 0 && e->job->deadline_us) r = deadline_push(s, e);
    if (r < 0) entry_unqueue(s, e);
    return r;
}

/* Makes a queued job schedulable (inside its group commit, or recovered at the start). On
 * allocation failure the job stays in the store and is picked up at the next start. */
static int enqueue(sched_t *s, job_t *job)
{
    entry_t *e = calloc(1, sizeof *e);
    user_t *u = user_get(s, job->owner);
    if (!e || !u) {
        free(e);
        return -ENOMEM;
    }
    e->job = job;
    e->user = u;
    e->seq = s->next_seq++;
    e->priority = job->priority;
    e->queue_pos = e->deadline_pos = -1;
    int r = strmap_put(s->entries, job->id, e);
    if (r >= 0) r = entry_queue(s, e);
    if (r < 0) {
        strmap_remove(s->entries, job->id);
        free(e);
        return r;
    }
    atomic_fetch_add(&s->queued, 1);
    return 0;
}

/* --------------------------------------------------------------------- job endings */

/* A copy of the fields of a job that the loop owns, for answers about a running job: an
 * executor thread may be writing the job's outputs, error, device and timing fields meanwhile.
 * NULL when out of memory. */
static job_t *job_snapshot(const job_t *job)
{
    job_t *copy = job_new();
    if (!copy) return NULL;
    memcpy(copy->id, job->id, sizeof copy->id);
    memcpy(copy->owner, job->owner, sizeof copy->owner);
    copy->call = job->call;
    copy->priority = job->priority;
    copy->device = job->device;
    copy->preferred_device = job->preferred_device;
    copy->deadline_us = job->deadline_us;
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
 * of it), a snapshot while it runs. */
static void reply_current(sched_reply_fn reply, void *token, const entry_t *e)
{
    if (e->job->state != JOB_RUNNING) {
        reply_jobs(reply, token, &e->job, 1, false);
        return;
    }
    job_t *copy = job_snapshot(e->job);
    if (copy)
        reply_jobs(reply, token, &copy, 1, false);
    else
        reply_err(reply, token, -ENOMEM, NULL);
    job_free(copy);
}

static void waiter_closed(uv_handle_t *h)
{
    free(h->data);
}

/* Replies to every waiter of e with job (its final or current state) and drops them. */
static void waiters_reply(entry_t *e, const job_t *job)
{
    for (waiter_t *w = e->waiters, *next; w; w = next) {
        next = w->next;
        uv_timer_stop(&w->timer);
        reply_jobs(w->reply, w->token, (job_t *const *)&job, 1, false);
        uv_close((uv_handle_t *)&w->timer, waiter_closed);
    }
    e->waiters = NULL;
}

static void count_final(sched_t *s, job_state_t state)
{
    if (state == JOB_SUCCEEDED)
        atomic_fetch_add(&s->succeeded_total, 1);
    else if (state == JOB_FAILED)
        atomic_fetch_add(&s->failed_total, 1);
    else if (state == JOB_CANCELLED)
        atomic_fetch_add(&s->cancelled_total, 1);
}

/* Ends a queued job (cancelled or failed) in the store and in memory. When reply is given, it
 * is answered with the ended job before the job is freed. */
static int end_queued(sched_t *s, entry_t *e, job_state_t state, const char *code,
                      const char *message, sched_reply_fn reply, void *token)
{
    job_t *job = e->job;
    job->state = state;
    job->finished_us = now_us();
    job_set_error(job, code, "%s", message);
    int r = store_job_update(s->st, job);
    if (r < 0) {
        /* The store refused: the job keeps its stored state and stays queued here. */
        job->state = JOB_QUEUED;
        job->finished_us = 0;
        job->error_code[0] = job->error_message[0] = '\0';
        return r;
    }
    entry_unqueue(s, e);
    strmap_remove(s->entries, job->id);
    atomic_fetch_sub(&s->queued, 1);
    count_final(s, state);
    if (reply) reply_jobs(reply, token, &job, 1, false);
    waiters_reply(e, job);
    job_free(job);
    free(e);
    return 0;
}

/* --------------------------------------------------------------------- group commit */

static void commit_pending(sched_t *s);

static void on_commit_timer(uv_timer_t *t)
{
    commit_pending(t->data);
}

static void schedule_commit(sched_t *s)
{
    if (s->commit_scheduled) return;
    s->commit_scheduled = true;
    /* libuv timers have millisecond resolution: a window under 1 ms commits on the next loop
     * iteration, which still groups everything that arrived meanwhile. */
    uv_timer_start(&s->commit_timer, on_commit_timer, (uint64_t)s->cfg->commit_delay_us / 1000, 0);
}

/* Removes the files written for a job's inputs that no row of it will name (a file shared
 * with other jobs' tensors once none does). */
static void discard_inputs(sched_t *s, const job_t *job)
{
    for (int j = 0; j < OP_MAX_TENSORS; j++)
        store_blob_discard(s->st, job->in[j].blob);
}

static void msg_free(msg_t *m)
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

/* A resident buffer must fit its owner's quota. The sum is read inside the group commit's
 * transaction, so that the buffers of one commit add up (the API's check before the upload
 * is written cannot see those). Sets m->err when it does not fit. */
static int check_resident_quota(sched_t *s, msg_t *m)
{
    uint64_t used = 0;
    if (!m->buf->resident || s->cfg->max_resident_bytes_per_user == 0) return 0;
    int r = store_resident_bytes(s->st, m->buf->owner, &used);
    if (r == 0 && config_resident_quota_exceeded(s->cfg, m->buf->owner, used, m->buf->nbytes,
                                                 m->err_message, sizeof m->err_message))
        m->err = -EDQUOT;
    return r;
}

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
        if (enqueue(s, job) == 0) m->fate[i] = FATE_TAKEN;
    }
}

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
        m->jobs[i] = NULL;
    }
}

/* After a failed commit: the taken jobs leave the queues. Those that went out already stay
 * with their batches, which throw their results away. */
static void drop_submitted(sched_t *s, msg_t *m)
{
    for (size_t i = 0; i < m->n; i++) {
        if (m->fate[i] != FATE_TAKEN) continue;
        entry_t *e = strmap_get(s->entries, m->jobs[i]->id);
        if (e->job->state == JOB_RUNNING) {
            e->discard_result = e->unstored = true;
            m->jobs[i] = NULL;
            continue;
        }
        entry_unqueue(s, e);
        strmap_remove(s->entries, e->job->id);
        atomic_fetch_sub(&s->queued, 1);
        free(e);
    }
}

/* Answers a committed submission or buffer. */
static void answer_committed(msg_t *m)
{
    for (size_t i = 0; !m->err && m->kind == MSG_SUBMIT && i < m->n; i++)
        if (!m->shown[i]) m->err = -ENOMEM; /* committed, but cannot be shown */
    if (m->err) {
        reply_err(m->reply, m->token, m->err, m->err_message[0] ? m->err_message : NULL);
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

/* Sync thread: answers a message whose commit is durable now, or could not be made so. The
 * message is the sync thread's alone by then: nothing in it belongs to the loop. */
static void answer_synced(store_sync_item_t *item, int err)
{
    msg_t *m = (msg_t *)(void *)((char *)item - offsetof(msg_t, synced));
    if (err) {
        char why[160];
        snprintf(why, sizeof why,
                 "the store could not make the request durable (%s); its jobs may still run",
                 strerror(-err));
        reply_err(m->reply, m->token, -EIO, why);
    } else
        answer_committed(m);
    msg_free(m);
}

/* Inserts the rows of a round's jobs with an idempotency key (keyed), or of the others. A
 * keyed job goes in before the cut: when its key names a stored job it is replayed, and must
 * not be queued. */
static int insert_jobs(sched_t *s, msg_t *pending, bool keyed)
{
    int r = 0;
    for (msg_t *m = pending; m && r >= 0; m = m->next)
        for (size_t i = 0; m->kind == MSG_SUBMIT && i < m->n && r >= 0; i++) {
            job_t *job = m->jobs[i];
            if ((job->idempotency_key[0] != '\0') != keyed) continue;
            r = store_job_insert(s->st, job);
            if (r == -EEXIST && keyed) {
                m->fate[i] = FATE_REPLAYED;
                r = 0;
            }
        }
    return r;
}

/* Hands the store the small inputs of a round's submissions before their rows are written, so
 * that, when they go to its segment, its sync runs beside those writes
 * (store_jobs_place_small). Out of memory, the writes place them as they go. */
static int place_submitted_inputs(sched_t *s, msg_t *pending)
{
    size_t n = 0;
    for (msg_t *m = pending; m; m = m->next)
        if (m->kind == MSG_SUBMIT && !m->err) n += m->n;
    job_t **jobs = n > 0 ? malloc(n * sizeof *jobs) : NULL;
    if (!jobs) return 0;
    n = 0;
    for (msg_t *m = pending; m; m = m->next)
        for (size_t i = 0; m->kind == MSG_SUBMIT && !m->err && i < m->n; i++)
            jobs[n++] = m->jobs[i];
    int r = store_jobs_place_small(s->st, jobs, n, false);
    free(jobs);
    return r;
}

/* Puts the submissions of a round without an idempotency key in shards of the store: a round
 * of few jobs in one, the next round's in the next, so that it commits and syncs one file; a
 * round of many, each submission in the shard with the fewest of the round's jobs so far, so
 * that the shards write them side by side (store_flush). A job's id names its shard: the ids,
 * made on the HTTP threads in shard 0, get theirs here, in the answers' copies too. Jobs with
 * an idempotency key stay in shard 0, whose unique index tells a retry from a first
 * submission whatever the keys of an array's jobs. */
static void place_submissions(sched_t *s, msg_t *pending)
{
    int shards = store_shards(s->st);
    if (shards == 1) return;
    size_t load[STORE_MAX_SHARDS] = {0}, total = 0;
    for (msg_t *m = pending; m; m = m->next) {
        if (m->kind != MSG_SUBMIT || m->err || m->n == 0) continue;
        if (m->jobs[0]->idempotency_key[0]) load[0] += m->n;
        total += m->n;
    }
    bool spread = total >= STORE_PARALLEL_MIN_WRITES;
    int one = (int)(s->next_shard++ & (unsigned)(shards - 1));
    for (msg_t *m = pending; m; m = m->next) {
        if (m->kind != MSG_SUBMIT || m->err || m->n == 0 || m->jobs[0]->idempotency_key[0])
            continue;
        int k = one;
        for (int j = 0; spread && j < shards; j++)
            if (load[j] < load[k]) k = j;
        load[k] += m->n;
        m->shard = k;
        for (size_t i = 0; i < m->n; i++) {
            store_id_assign_shard(m->jobs[i]->id, shards, k);
            if (m->shown[i]) store_id_assign_shard(m->shown[i]->id, shards, k);
        }
    }
}

/* Writes every pending submission and buffer in one transaction, starts what it can, and
 * answers them (after the sync, with a syncer). */
static void commit_pending(sched_t *s)
{
    s->commit_scheduled = false;
    msg_t *pending = s->pending_head;
    s->pending_head = s->pending_tail = NULL;
    if (!pending) return;
    for (msg_t *m = pending; m; m = m->next)
        if (m->kind == MSG_SUBMIT && m->n > 0) {
            user_t *u = strmap_get(s->users, m->jobs[0]->owner);
            if (u) u->pending -= (long)m->n;
        }

    /* While the loop runs, the syncer makes the commit durable and the jobs start meanwhile;
     * when it is about to end, the commit syncs itself. */
    bool defer = s->syncer && !s->stopping;
    msg_t *unsynced = NULL, **unsynced_end = &unsynced; /* committed, answered once durable */
    /* After a failed sync, what is committed may not reach the disk: nothing more is taken
     * (the jobs would run, and their submitters, told of an error, would submit them again). */
    int r = defer ? store_sync_error(s->syncer) : 0;
    const char *why = "the store could not commit the request";
    if (r < 0) {
        atomic_store(&s->store_failed, true);
        why = "the store's disk failed to sync; nothing is accepted until the daemon restarts";
    }
    if (r == 0) r = defer ? store_begin_relaxed(s->st) : store_begin(s->st);
    place_submissions(s, pending);
    if (r >= 0) r = place_submitted_inputs(s, pending);
    for (msg_t *m = pending; m && r >= 0; m = m->next)
        if (m->kind == MSG_BUF_PUT) {
            r = check_resident_quota(s, m);
            if (r >= 0 && !m->err) r = store_buffer_insert(s->st, m->buf);
        }
    if (r >= 0) r = insert_jobs(s, pending, true);
    /* The new jobs join the queues and what can start goes out before the commit, its start
     * recorded in the same transaction: the device runs them while the commit writes. Jobs
     * without a key get their rows only now, as their cut left them: one that starts costs
     * one row write instead of two. */
    sched_batch_t *ready[DISPATCH_MAX];
    int refusal[DISPATCH_MAX];
    int n_ready = 0;
    bool cut = r >= 0;
    if (cut) {
        uint64_t taken_from = s->next_seq;
        for (msg_t *m = pending; m; m = m->next)
            if (m->kind == MSG_SUBMIT && !m->err) take_submitted(s, m);
        n_ready = cut_batches(s, ready);
        /* The shards of the store write the rows side by side (store_defer_writes). */
        store_defer_writes(s->st);
        r = record_starts(s, ready, n_ready, taken_from);
        if (r >= 0) r = insert_jobs(s, pending, false);
        int flushed = store_flush(s->st, NULL, NULL);
        if (r >= 0) r = flushed;
        launch(s, ready, n_ready, r >= 0, refusal);
    }
    /* The shards whose part committed: a message's rows are all in its shard, so that a
     * commit that failed in another shard leaves it committed (store_committed_shards). */
    unsigned committed = 0;
    if (r >= 0) {
        r = store_commit(s->st);
        committed = store_committed_shards(s->st);
    }
    if (r < 0) {
        store_rollback(s->st);
        log_error("group commit failed: %s", strerror(-r));
    }

    for (msg_t *m = pending, *next; m; m = next) {
        next = m->next;
        bool lost = !(committed & (1u << m->shard));
        if (lost && m->kind == MSG_SUBMIT) drop_submitted(s, m);
        /* Files written for rows that were not committed (a failed commit, a refused buffer,
         * a replayed submission) go now rather than at the next start's sweep; those of jobs
         * that went out go when their launch returns (end_jobs). */
        if (m->kind == MSG_BUF_PUT && (lost || m->err)) store_blob_discard(s->st, m->buf->blob);
        for (size_t i = 0; i < m->n; i++)
            if (m->jobs[i] && (lost || m->fate[i] == FATE_REPLAYED)) discard_inputs(s, m->jobs[i]);
        if (lost) {
            reply_err(m->reply, m->token, -EIO, why);
        } else if (m->err) {
            reply_err(m->reply, m->token, m->err, m->err_message);
        } else {
            if (m->kind == MSG_SUBMIT) settle_submitted(s, m);
            if (m->kind == MSG_BUF_PUT && m->buf->resident && s->ex && s->ex->ops->buffer_added)
                s->ex->ops->buffer_added(s->ex, m->buf);
            if (defer) {
                m->next = NULL;
                *unsynced_end = m;
                unsynced_end = &m->next;
                continue;
            }
            answer_committed(m);
        }
        msg_free(m);
    }
    mark_starts_lost(s, ready, n_ready, committed);
    settle_refused(s, ready, n_ready, refusal);
    if (!cut) dispatch(s); /* the transaction failed before its cut: start what was queued */
    for (msg_t *m = unsynced, *next; m; m = next) {
        next = m->next;
        m->synced.done = answer_synced;
        m->synced.wals = 1u << m->shard;
        store_sync_request(s->syncer, &m->synced);
    }
}

/* ------------------------------------------------------------------------ dispatch */

typedef struct pick {
    sched_t *s;
    user_t *best;
} pick_t;

static void pick_user_visit(const char *key, void *value, void *ud)
{
    (void)key;
    pick_t *p = ud;
    user_t *u = value;
    if (u->queue.len == 0 || u->running >= p->s->cfg->max_running_per_user ||
        u->skip_round == p->s->round)
        return;
    user_charge(u, 0); /* bring the decay up to date */
    user_t *b = p->best;
    if (!b || u->usage_us < b->usage_us ||
        (u->usage_us == b->usage_us && u->queue.a[0]->seq < b->queue.a[0]->seq))
        p->best = u;
}

/* The user with queued work, under its running limit, with the least recent usage. */
static user_t *pick_user(sched_t *s)
{
    pick_t p = {s, NULL};
    strmap_foreach(s->users, pick_user_visit, &p);
    return p.best;
}

/* A rough run-time estimate used to charge a user at dispatch, corrected when the batch
 * ends: fair share must see work the moment it is handed out. */
static double estimate_us(const job_t *job)
{
    return 5.0 + job->call.cost.bytes / 1e4 + job->call.cost.flops / 1e6;
}

static void on_dispatch_timer(uv_timer_t *t)
{
    dispatch(t->data);
}

static void fail_dispatched(sched_t *s, sched_batch_t *sb, const char *why);
static void retry_batch(sched_t *s, sched_batch_t *sb);

/* Entries looked at, best first, when a user's first waits for its device. */
#define STARTABLE_SCAN 64

/* The device a queued entry must run on (pinned, or its resident inputs' one), or -1. */
static int entry_device(const entry_t *e)
{
    return e->job->device >= 0 ? e->job->device : e->job->preferred_device;
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
    entry_t **a = u->queue.a;
    if (entry_can_start(s, a[0], room, MEMO)) return a[0];
    if (u->running + 1 >= s->cfg->max_running_per_user) return NULL;
    int frontier[STARTABLE_SCAN + 2], n = 0; /* heap indexes: children of what cannot start */
    for (int c = 1; c <= 2 && c < u->queue.len; c++)
        frontier[n++] = c;
    for (int looked = 0; n > 0 && looked < STARTABLE_SCAN; looked++) {
        int best = 0;
        for (int k = 1; k < n; k++)
            if (entry_before(a[frontier[k]], a[frontier[best]])) best = k;
        int i = frontier[best];
        frontier[best] = frontier[--n];
        if (entry_can_start(s, a[i], room, MEMO)) return a[i];
        for (int c = 2 * i + 1; c <= 2 * i + 2 && c < u->queue.len; c++)
            frontier[n++] = c;
    }
    return NULL;
}

/* A queued entry joins a batch being cut: it leaves the queues, starts, and its user is
 * charged an estimate at once (corrected when the batch ends). */
static void batch_take(sched_t *s, sched_batch_t *sb, entry_t *e, int64_t now)
{
    job_t *job = e->job;
    sb->batch.jobs[sb->batch.n++] = job;
    entry_unqueue(s, e);
    e->user->running++;
    job->state = JOB_RUNNING;
    job->started_us = now;
    job->attempts++;
    e->charged_us = estimate_us(job);
    user_charge(e->user, e->charged_us);
}

/* Cuts batches while the executor has free slots, into ready; returns how many. A partial
 * batch whose oldest job has waited less than max_delay_us is held back while other batches
 * are in flight, so that company can arrive; with the executor idle it goes at once. */
static int cut_batches(sched_t *s, sched_batch_t *ready[DISPATCH_MAX])
{
    if (s->stopping || !s->ex) return 0;
    s->round++;
    int64_t hold_until = 0;
    int n_ready = 0;
    int slots = s->ex->ops->free_slots(s->ex, -1);
    while (n_ready < slots && n_ready < DISPATCH_MAX) {
        user_t *u = pick_user(s);
        if (!u) break;
        /* A job pinned to a device with no room (or held there by its resident inputs) waits
         * for it without a trip to the executor (and the two store writes a turned-down batch
         * costs), and the user's best job that can start leads instead; the device's next
         * completion dispatches again. */
        entry_t *top = best_startable(s, u);
        if (!top) {
            u->skip_round = s->round;
            continue;
        }
        keyq_t *q = top->keyq;
        int want = q ? (q->len < s->cfg->max_batch ? q->len : s->cfg->max_batch) : 1;
        int64_t now = now_us();
        if (q && want < s->cfg->max_batch && s->cfg->max_delay_us > 0 &&
            s->batches_in_flight + n_ready > 0 &&
            now - q->head->job->created_us < s->cfg->max_delay_us) {
            int64_t until = q->head->job->created_us + s->cfg->max_delay_us;
            if (!hold_until || until < hold_until) hold_until = until;
            u->skip_round = s->round;
            continue;
        }
        sched_batch_t *sb = calloc(1, sizeof *sb);
        job_t **jobs = calloc((size_t)want, sizeof *jobs);
        msg_t *done_msg = calloc(1, sizeof *done_msg);
        if (!sb || !jobs || !done_msg) {
            free(sb);
            free(jobs);
            free(done_msg);
            break;
        }
        sb->done_msg = done_msg;
        sb->s = s;
        sb->batch.jobs = jobs;
        sb->batch.sched_priv = sb;
        entry_t *e = q ? q->head : top;
        /* The chosen user's top job leads; with a batch key, its FIFO fills the rest with the
         * jobs of users under their running limit, the batch's own jobs counted. The look
         * ahead is bounded, so that a backlog of users at their limit costs no long scan:
         * the jobs behind it lead batches of their own when their users are picked. */
        if (q && e != top) batch_take(s, sb, top, now);
        for (int seen = 0; e && sb->batch.n < want && seen < 4 * want; seen++) {
            entry_t *next = e->knext;
            if (e->user->running < s->cfg->max_running_per_user) batch_take(s, sb, e, now);
            e = next;
        }
        ready[n_ready++] = sb;
        for (int i = 0; i < sb->batch.n; i++)
            jobs[i]->batch_size = sb->batch.n;
    }

    if (hold_until) {
        int64_t wait_us = hold_until - now_us();
        uv_timer_start(&s->dispatch_timer, on_dispatch_timer,
                       wait_us > 0 ? (uint64_t)(wait_us + 999) / 1000 : 0, 0);
    }
    return n_ready;
}

/* Records the starts of n cut batches in the store's open transaction, but for jobs without an
 * idempotency key taken in since sequence number taken_from (UINT64_MAX: none): their rows are
 * yet to be inserted, started (insert_jobs). */
static int record_starts(sched_t *s, sched_batch_t *const *ready, int n, uint64_t taken_from)
{
    int r = 0;
    for (int b = 0; b < n && r >= 0; b++)
        for (int i = 0; i < ready[b]->batch.n && r >= 0; i++) {
            job_t *job = ready[b]->batch.jobs[i];
            if (taken_from != UINT64_MAX && !job->idempotency_key[0] &&
                ((entry_t *)strmap_get(s->entries, job->id))->seq >= taken_from)
                continue;
            r = store_job_update(s->st, job);
        }
    return r;
}

/* After a group commit that failed in some shards (committed: those whose part committed):
 * the starts it recorded in the others went down with it, so the rows of the jobs it cut that
 * were committed before still say queued. Their ends record the start first (record_end); a
 * re-queue leaves them as they are (requeue_batch). */
static void mark_starts_lost(sched_t *s, sched_batch_t *const *ready, int n, unsigned committed)
{
    int shards = store_shards(s->st);
    for (int b = 0; b < n; b++)
        for (int i = 0; i < ready[b]->batch.n; i++) {
            entry_t *e = strmap_get(s->entries, ready[b]->batch.jobs[i]->id);
            bool lost = !(committed & (1u << store_id_shard(e->job->id, shards)));
            e->start_lost = lost && !e->discard_result;
        }
}

/* A start the store did not record: the batch is not handed over. */
enum { START_UNRECORDED = 1 };

/* Counts n cut batches out of the queues and, when their starts are recorded, hands them to
 * the executor. refusal[b] says what became of each: 0 handed over, else what
 * settle_refused deals with once the store's transaction is over. */
static void launch(sched_t *s, sched_batch_t *const *ready, int n, bool recorded, int *refusal)
{
    for (int b = 0; b < n; b++) {
        sched_batch_t *sb = ready[b];
        long jobs = sb->batch.n;
        atomic_fetch_sub(&s->queued, jobs);
        atomic_fetch_add(&s->running, jobs);
        s->batches_in_flight++;
        sb->dispatched_us = now_us();
        refusal[b] = recorded ? s->ex->ops->submit(s->ex, &sb->batch) : START_UNRECORDED;
        if (refusal[b] == 0) {
            atomic_fetch_add(&s->batches_total, 1);
            if (jobs > 1) atomic_fetch_add(&s->batched_jobs_total, jobs);
        }
    }
}

/* The batches launch did not hand over: turned down by a full device (-EAGAIN), their jobs go
 * back to their queues; otherwise they fail with the reason. */
static void settle_refused(sched_t *s, sched_batch_t *const *ready, int n, const int *refusal)
{
    for (int b = 0; b < n; b++) {
        if (refusal[b] == 0) continue;
        if (refusal[b] == -EAGAIN) {
            ready[b]->batch.retry = EXEC_RETRY_UNSTARTED;
            retry_batch(s, ready[b]);
        } else {
            fail_dispatched(s, ready[b],
                            refusal[b] == START_UNRECORDED ? "the store could not record the start"
                                                           : strerror(-refusal[b]));
        }
    }
}

/* Starts what the executor has room for, outside a group commit (a held batch's wait is
 * over, a group commit failed before its cut, a batch was given back). */
static void dispatch(sched_t *s)
{
    end_batches(s, NULL, true);
}

/* ---------------------------------------------------------------- batch completion */

/* Executor thread: persists large outputs off the loop, and many small ones together (else the
 * loop appends them to its segment), then hands the batch to the loop. */
static void on_batch_done(exec_batch_t *batch, void *ud)
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
    pthread_mutex_lock(&s->lock);
    if (s->inbox_tail)
        s->inbox_tail->next = m;
    else
        s->inbox_head = m;
    s->inbox_tail = m;
    pthread_mutex_unlock(&s->lock);
    uv_async_send(&s->wake);
}

static void maybe_finish_stop(sched_t *s);

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

/* A finished batch's jobs take their end states, recorded in the store's open transaction
 * when record; its slot and its users' running counts are freed, so that a cut in the same
 * transaction sees them, and its users are charged what it took. */
static void end_jobs(sched_t *s, sched_batch_t *sb, int64_t now, bool record)
{
    exec_batch_t *batch = &sb->batch;
    double share_us = batch->n ? (double)(now - sb->dispatched_us) / batch->n : 0;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        entry_t *e = strmap_get(s->entries, job->id);
        e->user->running--;
        user_charge(e->user, share_us - e->charged_us);
        if (e->discard_result) {
            /* Its result is discarded: so are the files on_batch_done wrote for it, which no
             * row will name, and its input files when it has no row either. */
            discard_outputs(s, job);
            if (e->unstored) discard_inputs(s, job);
            continue;
        }
        job->finished_us = now;
        job->state = job->error_code[0] ? JOB_FAILED : JOB_SUCCEEDED;
        /* A failed job keeps no outputs: files on_batch_done wrote for them go (those of a
         * job whose success the store refuses go with end_refused). */
        if (job->state != JOB_SUCCEEDED) discard_outputs(s, job);
        if (record) record_end(s, e);
    }
    /* Counters before the waiters: one that wakes up and reads /metrics sees the batch ended. */
    atomic_fetch_sub(&s->running, batch->n);
    s->batches_in_flight--;
}

/* Once a batch's ends are in the store: its jobs are counted, their waiters answered, and
 * they leave memory. */
static void release_ended(sched_t *s, sched_batch_t *sb)
{
    exec_batch_t *batch = &sb->batch;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        entry_t *e = strmap_get(s->entries, job->id);
        if (!e->discard_result) {
            count_final(s, job->state);
            waiters_reply(e, job);
        }
        strmap_remove(s->entries, job->id);
        job_free(job);
        free(e);
    }
    free(batch->jobs);
    free(sb->done_msg); /* NULL when the batch's end came in it */
    free(sb);
}

/* The outputs of the ended batches' jobs whose results are kept, to the store ahead of their
 * ends, as place_submitted_inputs does with inputs. */
static int place_ended_outputs(sched_t *s, sched_batch_t *ended)
{
    size_t n = 0;
    for (sched_batch_t *sb = ended; sb; sb = sb->next_ended)
        n += (size_t)sb->batch.n;
    job_t **jobs = n > 0 ? malloc(n * sizeof *jobs) : NULL;
    if (!jobs) return 0;
    n = 0;
    for (sched_batch_t *sb = ended; sb; sb = sb->next_ended)
        for (int i = 0; i < sb->batch.n; i++) {
            job_t *job = sb->batch.jobs[i];
            if (!((entry_t *)strmap_get(s->entries, job->id))->discard_result) jobs[n++] = job;
        }
    int r = store_jobs_place_small(s->st, jobs, n, true);
    free(jobs);
    return r;
}

/* Records the ends of the finished batches (a list through next_ended, maybe empty) and, when
 * start_next, the starts of what the executor has room for then, in one transaction: one
 * commit per completion instead of two. The new batches go out before the commit, as in a
 * group commit, and the ended jobs' waiters are answered after it. An end or start lost to a
 * power loss makes the job run again (at least once, never lost): nothing here waits for an
 * fsync. */
static void end_batches(sched_t *s, sched_batch_t *ended, bool start_next)
{
    int64_t now = now_us();
    int r = ended ? store_begin_relaxed(s->st) : 0;
    if (r >= 0 && ended) r = place_ended_outputs(s, ended);
    /* The shards of the store write the ends and starts side by side (store_defer_writes);
     * an end they refuse is dealt with by end_unrecorded. */
    if (r >= 0 && ended) store_defer_writes(s->st);
    for (sched_batch_t *sb = ended; sb; sb = sb->next_ended)
        end_jobs(s, sb, now, r >= 0);
    sched_batch_t *ready[DISPATCH_MAX];
    int refusal[DISPATCH_MAX];
    /* Starts join the ends' transaction only while it stands; else they get one of their own
     * once the ends are dealt with, rather than fail for want of a record. */
    bool cut = start_next && r >= 0;
    int n_ready = cut ? cut_batches(s, ready) : 0;
    if (!ended && n_ready == 0) return;
    if (!ended && (r = store_begin_relaxed(s->st)) >= 0) store_defer_writes(s->st);
    if (r >= 0) r = record_starts(s, ready, n_ready, UINT64_MAX);
    int flushed = store_flush(s->st, end_unrecorded, s);
    if (r >= 0) r = flushed;
    launch(s, ready, n_ready, r >= 0, refusal);
    unsigned committed = 0; /* the shards whose part committed (store_committed_shards) */
    if (r >= 0) {
        r = store_commit(s->st);
        committed = store_committed_shards(s->st);
    }
    if (r < 0) {
        /* The transaction is lost, in some shards or all: record each end there on its own,
         * so that no job is answered as ended while the store still says running. */
        store_rollback(s->st);
        log_error("could not commit a round of ends and starts (%s)%s", strerror(-r),
                  ended ? ": recording the ends one by one" : "");
        int shards = store_shards(s->st);
        for (sched_batch_t *sb = ended; sb; sb = sb->next_ended)
            for (int i = 0; i < sb->batch.n; i++) {
                entry_t *e = strmap_get(s->entries, sb->batch.jobs[i]->id);
                bool lost = !(committed & (1u << store_id_shard(e->job->id, shards)));
                if (lost && !e->discard_result) record_end(s, e);
            }
        mark_starts_lost(s, ready, n_ready, committed);
    }
    for (sched_batch_t *sb = ended, *next; sb; sb = next) {
        next = sb->next_ended;
        release_ended(s, sb);
    }
    settle_refused(s, ready, n_ready, refusal);
    if (start_next && !cut) dispatch(s);
    maybe_finish_stop(s);
}

/* A batch that never reached the executor: its jobs fail with the reason. */
static void fail_dispatched(sched_t *s, sched_batch_t *sb, const char *why)
{
    free(sb->done_msg);
    sb->done_msg = NULL;
    for (int i = 0; i < sb->batch.n; i++)
        job_set_error(sb->batch.jobs[i], "dispatch_failed", "%s", why);
    end_batches(s, sb, false);
}

/* A batch the executor turned down although it had room (-EAGAIN: the device its jobs are
 * pinned to is full), or gave back from a device reset: its jobs go back to their queues, in
 * the store and here, and wait for the next dispatch; the attempt counts only when they ran.
 * If the store refuses, they fail instead, with the reason. */
static void requeue_batch(sched_t *s, sched_batch_t *sb, bool ran)
{
    exec_batch_t *batch = &sb->batch;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        job->state = JOB_QUEUED;
        job->started_us = 0;
        job->attempts -= !ran;
        job->batch_size = 0;
        job->run_device = -1;
        job->error_code[0] = job->error_message[0] = '\0';
    }
    int r = store_begin(s->st);
    for (int i = 0; i < batch->n && r >= 0; i++) {
        entry_t *e = strmap_get(s->entries, batch->jobs[i]->id);
        if (!e->start_lost) r = store_job_update(s->st, batch->jobs[i]);
    }
    if (r >= 0) r = store_commit(s->st);
    if (r < 0) {
        store_rollback(s->st);
        for (int i = 0; i < batch->n; i++) {
            batch->jobs[i]->state = JOB_RUNNING;
            batch->jobs[i]->started_us = sb->dispatched_us;
            batch->jobs[i]->attempts += !ran;
        }
        fail_dispatched(s, sb, "no device could take the job and the store refused to re-queue it");
        return;
    }
    atomic_fetch_sub(&s->running, batch->n);
    s->batches_in_flight--;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        entry_t *e = strmap_get(s->entries, job->id);
        e->user->running--;
        user_charge(e->user, -e->charged_us);
        e->charged_us = 0;
        e->start_lost = false;
        if (entry_queue(s, e) < 0) {
            log_error("job %s could not be re-queued (out of memory): it runs after a restart",
                      job->id);
            strmap_remove(s->entries, job->id);
            job_free(job);
            free(e);
            continue;
        }
        atomic_fetch_add(&s->queued, 1);
    }
    free(batch->jobs);
    free(sb->done_msg);
    free(sb);
}

/* A batch the executor gave back (exec_retry_t). Jobs cancelled meanwhile, and interrupted
 * jobs out of attempts (which end with the executor's error), finish in a batch of their
 * own; the others are queued again. */
static void retry_batch(sched_t *s, sched_batch_t *sb)
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
        end_batches(s, sb, false);
        return;
    }
    int keep = 0;
    for (int i = 0; i < batch->n; i++) {
        job_t *job = batch->jobs[i];
        entry_t *e = strmap_get(s->entries, job->id);
        if (!e->discard_result && (!ran || job->attempts < s->cfg->max_attempts))
            batch->jobs[keep++] = job;
        else
            spent->batch.jobs[spent->batch.n++] = job;
    }
    batch->n = keep;
    if (spent->batch.n > 0) {
        spent->s = s;
        spent->dispatched_us = sb->dispatched_us;
        spent->batch.sched_priv = spent;
        s->batches_in_flight++; /* end_jobs counts it out */
        end_batches(s, spent, false);
    } else {
        free(spent->batch.jobs);
        free(spent);
    }
    if (batch->n > 0) {
        requeue_batch(s, sb, ran);
        return;
    }
    s->batches_in_flight--;
    free(batch->jobs);
    free(sb->done_msg);
    free(sb);
}

/* ------------------------------------------------------------- waits and cancels */

static void on_wait_timeout(uv_timer_t *t)
{
    waiter_t *w = t->data;
    entry_t *e = w->entry;
    for (waiter_t **p = &e->waiters; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    reply_current(w->reply, w->token, e);
    uv_close((uv_handle_t *)&w->timer, waiter_closed);
}

/* The in-memory entry for id if owner may see it; NULL otherwise. */
static entry_t *entry_find(sched_t *s, const msg_t *m)
{
    entry_t *e = strmap_get(s->entries, m->id);
    if (e && !m->any_owner && strcmp(e->job->owner, m->owner) != 0) return NULL;
    return e;
}

/* A finished (or unknown) job from the store, for waits and cancels of jobs not in memory.
 * Replies -ENOENT when missing or not the caller's; otherwise calls reply with it. */
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

static void handle_wait(sched_t *s, msg_t *m)
{
    entry_t *e = entry_find(s, m);
    /* A job cancelled while running has ended: the store holds its final record, and the
     * entry lives on only until its launch returns. (One whose group commit failed has no
     * record: its submitter was told so, and this answers that there is no such job.) */
    if (!e || e->discard_result) {
        job_t *job = stored_job(s, m);
        if (job) reply_jobs(m->reply, m->token, &job, 1, false);
        job_free(job);
        return;
    }
    if (m->timeout_ms <= 0 || s->stopping) {
        reply_current(m->reply, m->token, e);
        return;
    }
    waiter_t *w = calloc(1, sizeof *w);
    if (!w) {
        reply_err(m->reply, m->token, -ENOMEM, NULL);
        return;
    }
    w->entry = e;
    w->s = s;
    w->reply = m->reply;
    w->token = m->token;
    uv_timer_init(&s->loop, &w->timer);
    w->timer.data = w;
    uv_timer_start(&w->timer, on_wait_timeout, (uint64_t)m->timeout_ms, 0);
    w->next = e->waiters;
    e->waiters = w;
}

static void handle_cancel(sched_t *s, msg_t *m)
{
    entry_t *e = entry_find(s, m);
    if (!e) {
        job_t *job = stored_job(s, m);
        if (job) reply_err(m->reply, m->token, -EBUSY, "the job has already ended");
        job_free(job);
        return;
    }
    job_t *job = e->job;
    if (job->state == JOB_QUEUED) {
        int r = end_queued(s, e, JOB_CANCELLED, "cancelled", "cancelled by request", m->reply,
                           m->token);
        if (r < 0) reply_err(m->reply, m->token, r, "the store refused the cancellation");
        return;
    }
    if (e->discard_result) {
        reply_err(m->reply, m->token, -EBUSY, "the job is already cancelled");
        return;
    }
    /* Running: the launch finishes and its result is discarded. The executor may be writing
     * the job's outputs and error fields right now, so the store gets a copy made of the
     * fields the loop owns. */
    job_t *rec = job_snapshot(job);
    if (!rec) {
        reply_err(m->reply, m->token, -ENOMEM, NULL);
        return;
    }
    rec->finished_us = now_us();
    rec->state = JOB_CANCELLED;
    job_set_error(rec, "cancelled", "cancelled by request while running");
    int r = store_job_update(s->st, rec);
    if (r < 0) {
        reply_err(m->reply, m->token, r, "the store refused the cancellation");
    } else {
        e->discard_result = true;
        count_final(s, JOB_CANCELLED);
        reply_jobs(m->reply, m->token, &rec, 1, false);
        waiters_reply(e, rec);
    }
    job_free(rec);
}

/* ------------------------------------------------------------------------ deadlines */

static void on_deadline_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    int64_t now = now_us();
    while (s->deadlines.len > 0 && s->deadlines.a[0]->job->deadline_us <= now) {
        entry_t *e = s->deadlines.a[0];
        if (end_queued(s, e, JOB_FAILED, "deadline_exceeded",
                       "the deadline passed while the job was queued", NULL, NULL) < 0)
            heap_remove(&s->deadlines, e); /* leave it queued; do not spin on it */
    }
    deadline_arm(s);
}

static void deadline_arm(sched_t *s)
{
    if (s->deadlines.len == 0) {
        uv_timer_stop(&s->deadline_timer);
        return;
    }
    int64_t wait_us = s->deadlines.a[0]->job->deadline_us - now_us();
    uv_timer_start(&s->deadline_timer, on_deadline_timer,
                   wait_us > 0 ? (uint64_t)(wait_us + 999) / 1000 : 0, 0);
}

/* ------------------------------------------------------------- maintenance timers */

static void on_gc_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    int deleted = 0;
    int r = store_gc(s->st, now_us() - (int64_t)s->cfg->retention_s * 1000000, &deleted);
    if (r < 0)
        log_error("retention sweep failed: %s", strerror(-r));
    else if (deleted)
        log_info("retention: removed %d finished jobs", deleted);
}

static void on_checkpoint_timer(uv_timer_t *t)
{
    sched_t *s = t->data;
    if (s->checkpointer) return; /* the syncer's thread checkpoints */
    int r = store_checkpoint(s->st);
    if (r < 0) log_warn("WAL checkpoint failed: %s", strerror(-r));
}

/* Writer's thread, after a commit that left the WAL long: the syncer copies it back. */
static void on_checkpoint_due(void *arg)
{
    sched_t *s = arg;
    if (s->syncer) store_sync_checkpoint_soon(s->syncer);
}

/* The loop turns: systemd's watchdog hears it (service_notify.h). */
static void on_watchdog_timer(uv_timer_t *t)
{
    service_notify("WATCHDOG=1");
}

/* ----------------------------------------------------------------------- the loop */

static void stop_waiter(const char *key, void *value, void *ud)
{
    (void)key;
    (void)ud;
    entry_t *e = value;
    for (waiter_t *w = e->waiters, *next; w; w = next) {
        next = w->next;
        uv_timer_stop(&w->timer);
        reply_current(w->reply, w->token, e);
        uv_close((uv_handle_t *)&w->timer, waiter_closed);
    }
    e->waiters = NULL;
}

static void maybe_finish_stop(sched_t *s)
{
    if (!s->stopping || s->batches_in_flight > 0) return;
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

static void handle_msg(sched_t *s, msg_t *m)
{
    switch (m->kind) {
    case MSG_SUBMIT:
    case MSG_BUF_PUT:
        if (m->kind == MSG_SUBMIT && m->n > 0) {
            user_t *u = user_get(s, m->jobs[0]->owner);
            long queued = u ? u->queue.len + u->pending : 0;
            if (u && queued + (long)m->n > s->cfg->max_queued_per_user &&
                queued + new_jobs(s, m) > s->cfg->max_queued_per_user) {
                reply_err(m->reply, m->token, -EAGAIN, "too many queued jobs for this user");
                for (size_t i = 0; i < m->n; i++)
                    discard_inputs(s, m->jobs[i]);
                msg_free(m);
                return;
            }
            if (u) u->pending += (long)m->n;
        }
        m->next = NULL;
        if (s->pending_tail)
            s->pending_tail->next = m;
        else
            s->pending_head = m;
        s->pending_tail = m;
        if (s->stopping)
            commit_pending(s); /* the loop is about to end: no window */
        else
            schedule_commit(s);
        return;
    case MSG_WAIT:
        handle_wait(s, m);
        break;
    case MSG_CANCEL:
        handle_cancel(s, m);
        break;
    case MSG_BUF_DELETE: {
        int r = store_buffer_delete(s->st, m->any_owner ? NULL : m->owner, m->id);
        if (r < 0)
            reply_err(m->reply, m->token, r, r == -ENOENT ? "no such buffer" : NULL);
        else {
            if (s->ex && s->ex->ops->buffer_deleted) s->ex->ops->buffer_deleted(s->ex, m->id);
            sched_result_t res = {0};
            m->reply(m->token, &res);
        }
        break;
    }
    case MSG_DONE: { /* a batch given back: on_wake ends the others */
        sched_batch_t *sb = m->batch->sched_priv;
        sb->done_msg = NULL; /* m itself, freed below */
        retry_batch(s, sb);
        maybe_finish_stop(s);
        dispatch(s);
        break;
    }
    case MSG_STOP:
        s->stopping = true;
        commit_pending(s); /* accepted submissions are committed: they run after restart */
        strmap_foreach(s->entries, stop_waiter, NULL);
        uv_timer_start(&s->drain_timer, on_drain_timer, (uint64_t)s->cfg->drain_timeout_ms, 0);
        maybe_finish_stop(s);
        break;
    }
    msg_free(m);
}

static void on_wake(uv_async_t *a)
{
    sched_t *s = a->data;
    pthread_mutex_lock(&s->lock);
    msg_t *m = s->inbox_head;
    s->inbox_head = s->inbox_tail = NULL;
    pthread_mutex_unlock(&s->lock);
    /* The batches that ended since the last wake are recorded together, with the starts that
     * follow them. Messages whose handling looks at running jobs' ends come after those. */
    sched_batch_t *ended = NULL, **ended_tail = &ended;
    while (m) {
        msg_t *next = m->next;
        m->next = NULL;
        if (m->kind == MSG_DONE && m->batch->retry == EXEC_RETRY_NONE) {
            sched_batch_t *sb = m->batch->sched_priv;
            sb->done_msg = NULL;
            msg_free(m);
            *ended_tail = sb;
            ended_tail = &sb->next_ended;
        } else {
            /* A wait that answers at once (no timeout, or the loop is stopping) must see them
             * ended; a longer one is answered by their end anyway. */
            bool sees_ends = m->kind != MSG_SUBMIT && m->kind != MSG_BUF_PUT &&
                             (m->kind != MSG_WAIT || m->timeout_ms <= 0 || s->stopping);
            if (ended && sees_ends) {
                end_batches(s, ended, true);
                ended = NULL;
                ended_tail = &ended;
            }
            handle_msg(s, m);
        }
        m = next;
    }
    if (ended) end_batches(s, ended, true);
}

static void *loop_thread(void *arg)
{
    sched_t *s = arg;
    prctl(PR_SET_NAME, "gj-loop"); /* as top -H and /proc/PID/task show it */
    uv_run(&s->loop, UV_RUN_DEFAULT);
    atomic_store(&s->loop_gone, true);
    return NULL;
}

/* ------------------------------------------------------------ public entry points */

/* Posts a message to the loop; after the loop has gone, answers -ESHUTDOWN at once. */
static void post(sched_t *s, msg_t *m)
{
    pthread_mutex_lock(&s->lock);
    bool gone = atomic_load(&s->loop_gone);
    if (!gone) {
        if (s->inbox_tail)
            s->inbox_tail->next = m;
        else
            s->inbox_head = m;
        s->inbox_tail = m;
    }
    pthread_mutex_unlock(&s->lock);
    if (gone) {
        reply_err(m->reply, m->token, -ESHUTDOWN, "the daemon is stopping");
        msg_free(m);
        return;
    }
    uv_async_send(&s->wake);
}

static msg_t *msg_new(msg_kind_t kind, sched_reply_fn reply, void *token)
{
    msg_t *m = calloc(1, sizeof *m);
    if (!m) {
        reply_err(reply, token, -ENOMEM, NULL);
        return NULL;
    }
    m->kind = kind;
    m->reply = reply;
    m->token = token;
    return m;
}

static void msg_set_target(msg_t *m, const char *owner, const char *id)
{
    m->any_owner = owner == NULL;
    snprintf(m->owner, sizeof m->owner, "%s", owner ? owner : "");
    snprintf(m->id, sizeof m->id, "%s", id);
}

/* Writes tensors too large for a row to blob files, on the caller's thread. */
static int persist_large(sched_t *s, job_tensor_t *t)
{
    if (!t->data || t->blob || t->nbytes <= s->cfg->inline_blob_bytes) return 0;
    return store_blob_write(s->st, t->data, t->nbytes, &t->blob);
}

void sched_submit(sched_t *s, job_t **jobs, size_t n, sched_reply_fn reply, void *token)
{
    msg_t *m = msg_new(MSG_SUBMIT, reply, token);
    if (!m) {
        for (size_t i = 0; i < n; i++)
            job_free(jobs[i]);
        free(jobs);
        return;
    }
    m->jobs = jobs;
    m->n = n;
    m->fate = calloc(n ? n : 1, sizeof *m->fate);
    m->shown = calloc(n ? n : 1, sizeof *m->shown);
    if (!m->fate || !m->shown) {
        reply_err(reply, token, -ENOMEM, NULL);
        msg_free(m);
        return;
    }
    if (!atomic_load(&s->accepting)) {
        reply_err(reply, token, -ESHUTDOWN, "the daemon is stopping");
        msg_free(m);
        return;
    }
    int64_t now = now_us();
    int r = 0;
    for (size_t i = 0; i < n; i++) {
        job_t *job = jobs[i];
        id_new('j', job->id);
        /* Shard 0, where jobs with an idempotency key stay (place_submissions). */
        store_id_assign_shard(job->id, store_shards(s->st), 0);
        job->created_us = now;
        job->state = JOB_QUEUED;
        /* What the answer shows of it, as accepted; copied here, off the loop. */
        m->shown[i] = job_copy_shown(job);
        for (int j = 0; j < OP_MAX_TENSORS && r == 0; j++)
            r = persist_large(s, &job->in[j]);
    }
    /* An array's many small inputs too: written here, by the HTTP thread, not by the loop. */
    if (r == 0) r = store_blob_pack(s->st, jobs, n, false);
    if (r < 0) {
        /* Files of their own only, which any thread may remove: a failed pack leaves none. */
        for (size_t i = 0; i < n; i++)
            discard_inputs(s, jobs[i]);
        reply_err(reply, token, -EIO, "could not persist the input tensors");
        msg_free(m);
        return;
    }
    post(s, m);
}

void sched_wait(sched_t *s, const char *owner, const char *id, int timeout_ms, sched_reply_fn reply,
                void *token)
{
    msg_t *m = msg_new(MSG_WAIT, reply, token);
    if (!m) return;
    msg_set_target(m, owner, id);
    m->timeout_ms = timeout_ms;
    post(s, m);
}

void sched_cancel(sched_t *s, const char *owner, const char *id, sched_reply_fn reply, void *token)
{
    msg_t *m = msg_new(MSG_CANCEL, reply, token);
    if (!m) return;
    msg_set_target(m, owner, id);
    post(s, m);
}

void sched_buffer_put(sched_t *s, buffer_t *buf, sched_reply_fn reply, void *token)
{
    msg_t *m = msg_new(MSG_BUF_PUT, reply, token);
    if (!m) {
        store_blob_discard(s->st, buf->blob);
        buffer_free(buf);
        return;
    }
    m->buf = buf;
    if (!atomic_load(&s->accepting)) {
        store_blob_discard(s->st, buf->blob);
        reply_err(reply, token, -ESHUTDOWN, "the daemon is stopping");
        msg_free(m);
        return;
    }
    id_new('b', buf->id);
    buf->created_us = now_us();
    if (buf->resident && s->ex && s->ex->ops->place_buffer)
        buf->device = s->ex->ops->place_buffer(s->ex, buf->nbytes);
    if (buf->data && buf->nbytes > s->cfg->inline_blob_bytes &&
        store_blob_write(s->st, buf->data, buf->nbytes, &buf->blob) < 0) {
        reply_err(reply, token, -EIO, "could not persist the buffer");
        msg_free(m);
        return;
    }
    post(s, m);
}

void sched_buffer_delete(sched_t *s, const char *owner, const char *id, sched_reply_fn reply,
                         void *token)
{
    msg_t *m = msg_new(MSG_BUF_DELETE, reply, token);
    if (!m) return;
    msg_set_target(m, owner, id);
    post(s, m);
}

void sched_get_stats(sched_t *s, sched_stats_t *ret)
{
    *ret = (sched_stats_t){
        .accepting = atomic_load(&s->accepting),
        .store_failed = atomic_load(&s->store_failed),
        .queued = atomic_load(&s->queued),
        .running = atomic_load(&s->running),
        .submitted_total = atomic_load(&s->submitted_total),
        .succeeded_total = atomic_load(&s->succeeded_total),
        .failed_total = atomic_load(&s->failed_total),
        .cancelled_total = atomic_load(&s->cancelled_total),
        .batches_total = atomic_load(&s->batches_total),
        .batched_jobs_total = atomic_load(&s->batched_jobs_total),
    };
}

json_t *sched_describe_backend(sched_t *s)
{
    return s->ex ? s->ex->ops->describe(s->ex) : json_null();
}

bool sched_serves_device(sched_t *s, int device)
{
    return device >= 0 && s->ex && s->ex->ops->serves_device &&
           s->ex->ops->serves_device(s->ex, device);
}

/* ------------------------------------------------------------------- life cycle */

static void init_timer(sched_t *s, uv_timer_t *t)
{
    uv_timer_init(&s->loop, t);
    t->data = s;
}

int sched_new(const config_t *cfg, store_t *st, sched_t **ret)
{
    sched_t *s = calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    s->deadlines =
        (heap_t){.before = deadline_before, .pos_offset = offsetof(entry_t, deadline_pos)};
    s->cfg = cfg;
    s->st = st;
    int r = store_reader_open(cfg, &s->rd);
    if (r >= 0) r = strmap_new(&s->entries);
    if (r >= 0) r = strmap_new(&s->users);
    if (r >= 0) r = strmap_new(&s->keyqs);
    if (r >= 0) r = uv_loop_init(&s->loop);
    if (r < 0) {
        store_reader_close(s->rd);
        strmap_free(s->entries);
        strmap_free(s->users);
        strmap_free(s->keyqs);
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
    init_timer(s, &s->checkpoint_timer);
    init_timer(s, &s->drain_timer);
    init_timer(s, &s->watchdog_timer);
    *ret = s;
    return 0;
}

void sched_set_executor(sched_t *s, executor_t *ex)
{
    ex->done = on_batch_done;
    ex->done_ud = s;
    s->ex = ex;
}

/* The store hands back recovered jobs with their calls validated again (a job whose op this
 * build no longer runs carries a stand-in that fails with the reason when it runs). */
static void recover_one(job_t *job, void *ud)
{
    sched_t *s = ud;
    if (enqueue(s, job) < 0) {
        log_error("job %s could not be re-queued (out of memory)", job->id);
        job_free(job);
    }
}

int sched_start(sched_t *s)
{
    int r = store_recover(s->st, s->cfg->max_attempts, job_resolve_op, recover_one, s);
    if (r < 0) return log_error_errno(r, "recovering jobs from the store failed: %s", strerror(-r));
    long queued = atomic_load(&s->queued);
    if (queued > 0) log_info("recovered %ld queued jobs", queued);
    uv_timer_start(&s->gc_timer, on_gc_timer, 1000, (uint64_t)s->cfg->gc_interval_s * 1000);
    uv_timer_start(&s->checkpoint_timer, on_checkpoint_timer,
                   (uint64_t)s->cfg->checkpoint_interval_s * 1000,
                   (uint64_t)s->cfg->checkpoint_interval_s * 1000);
    uint64_t watchdog_ms = service_watchdog_usec() / 1000;
    if (watchdog_ms > 0) /* twice per interval, as sd_watchdog_enabled(3) advises */
        uv_timer_start(&s->watchdog_timer, on_watchdog_timer, 0,
                       watchdog_ms / 2 > 0 ? watchdog_ms / 2 : 1);
    deadline_arm(s);
    if (queued > 0) /* the recovered jobs go out as soon as the loop runs */
        uv_timer_start(&s->dispatch_timer, on_dispatch_timer, 0, 0);
    const char *wals[STORE_MAX_SHARDS];
    int n_wals = store_wal_paths(s->st, wals);
    if (n_wals &&
        (r = store_checkpointer_open(s->st, s->cfg, on_checkpoint_due, s, &s->checkpointer)) < 0)
        log_warn("WAL checkpoints stay on the loop: opening a connection for them failed: %s",
                 strerror(-r));
    if (n_wals && (r = store_sync_start(wals, n_wals, s->checkpointer, &s->syncer)) < 0)
        return log_error_errno(r, "starting the commit syncer failed: %s", strerror(-r));
    atomic_store(&s->accepting, true);
    r = pthread_create(&s->thread, NULL, loop_thread, s);
    if (r != 0) return -r;
    s->thread_started = true;
    return 0;
}

/* Takes what is left in the inbox once the loop has ended and answers every request in it
 * with -ESHUTDOWN; from then on post() answers at once. Finished batches found there are
 * dropped: their jobs are still `running` in the store and run again after a restart. */
static void inbox_close(sched_t *s)
{
    pthread_mutex_lock(&s->lock);
    msg_t *m = s->inbox_head;
    s->inbox_head = s->inbox_tail = NULL;
    atomic_store(&s->loop_gone, true);
    pthread_mutex_unlock(&s->lock);
    while (m) {
        msg_t *next = m->next;
        if (m->kind != MSG_DONE && m->kind != MSG_STOP && m->reply)
            reply_err(m->reply, m->token, -ESHUTDOWN, "the daemon is stopping");
        msg_free(m);
        m = next;
    }
}

void sched_stop(sched_t *s)
{
    if (!s || !s->thread_started) return;
    atomic_store(&s->accepting, false);
    msg_t *m = calloc(1, sizeof *m);
    if (m) {
        m->kind = MSG_STOP;
        post(s, m);
    }
    pthread_join(s->thread, NULL);
    s->thread_started = false;
    /* Answers still waiting for their sync are given before the HTTP server stops. */
    store_sync_free(s->syncer);
    s->syncer = NULL;
    store_checkpointer_close(s->checkpointer);
    s->checkpointer = NULL;
    /* Requests that arrived while the loop was ending must be answered now: the HTTP server
     * cannot stop with connections still suspended on them. */
    inbox_close(s);
}

static void free_entry(const char *key, void *value, void *ud)
{
    (void)key;
    (void)ud;
    entry_t *e = value;
    /* Jobs of batches still in an executor (after a drain timeout) are not freed: a worker may
     * still hold them, and the process is about to exit. */
    if (e->job->state == JOB_QUEUED) {
        job_free(e->job);
        free(e);
    }
}

static void free_value(const char *key, void *value, void *ud)
{
    (void)key;
    (void)ud;
    user_t *u = value;
    free(u->queue.a);
    free(u);
}

static void free_keyq(const char *key, void *value, void *ud)
{
    (void)key;
    (void)ud;
    free(value);
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
    strmap_foreach(s->entries, free_entry, NULL);
    strmap_foreach(s->users, free_value, NULL);
    strmap_foreach(s->keyqs, free_keyq, NULL);
    strmap_free(s->entries);
    strmap_free(s->users);
    strmap_free(s->keyqs);
    free(s->deadlines.a);
    store_sync_free(s->syncer);
    store_checkpointer_close(s->checkpointer);
    store_reader_close(s->rd);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
