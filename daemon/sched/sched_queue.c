/* The loop's queues: an entry per job that is not final (indexed by id), each user's heap of
 * queued entries, each batch key's FIFO of them, the heap of deadlines, and fair share, which
 * picks the user whose batch goes next. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

/* A user's queue: highest priority first, then arrival. */
bool entry_before(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->priority != y->priority) return x->priority > y->priority;
    return x->seq < y->seq;
}

static bool deadline_before(const void *a, const void *b)
{
    return ((const entry_t *)a)->deadline_us < ((const entry_t *)b)->deadline_us;
}

int queues_init(sched_t *s)
{
    s->deadlines = heap_init(deadline_before, offsetof(entry_t, deadline_pos));
    int r = strmap_new(&s->entries);
    if (r >= 0) r = strmap_new(&s->users);
    if (r >= 0) r = strmap_new(&s->keyqs);
    return r;
}

static void free_entry(const char *key, void *value, void *ud)
{
    (void)key;
    (void)ud;
    entry_t *e = value;
    /* Jobs of batches still in an executor (after a drain timeout) are not freed: a worker may
     * still hold them, and the process is about to exit. */
    if (entry_queued(e)) {
        job_free(e->job);
        free(e);
    }
}

static void free_user(const char *key, void *value, void *ud)
{
    (void)key;
    (void)ud;
    user_t *u = value;
    heap_clear(&u->queue);
    rank_free(u);
    free(u);
}

static void free_keyq(const char *key, void *value, void *ud)
{
    (void)key;
    (void)ud;
    free(value);
}

/* Frees the queues and the queued jobs (accepts maps never made). */
void queues_free(sched_t *s)
{
    if (s->entries) strmap_foreach(s->entries, free_entry, NULL);
    if (s->users) strmap_foreach(s->users, free_user, NULL);
    if (s->keyqs) strmap_foreach(s->keyqs, free_keyq, NULL);
    strmap_free(s->entries);
    strmap_free(s->users);
    strmap_free(s->keyqs);
    heap_clear(&s->deadlines);
}

/* ---------------------------------------------------------------------- fair share */

user_t *user_get(sched_t *s, const char *owner)
{
    user_t *u = strmap_get(s->users, owner);
    if (u) return u;
    u = calloc(1, sizeof *u);
    if (!u) return NULL;
    snprintf(u->owner, sizeof u->owner, "%s", owner);
    u->queue = heap_init(entry_before, offsetof(entry_t, queue_pos));
    u->usage_at = now_us();
    u->half_life_us = s->cfg->fair_share_half_life_s * 1e6;
    if (strmap_put(s->users, u->owner, u) < 0) {
        free(u);
        return NULL;
    }
    return u;
}

/* Adds us (maybe negative, a correction) to the user's usage, decayed to now. */
void user_charge(user_t *u, double us)
{
    int64_t now = now_us();
    u->usage_us = u->usage_us * exp2(-(double)(now - u->usage_at) / u->half_life_us) + us;
    u->usage_at = now;
}

void entry_untake(entry_t *e)
{
    e->user->running--;
    memory_give(e);
    user_charge(e->user, -e->charged_us);
    e->charged_us = 0;
}

typedef struct pick {
    sched_t *s;
    user_t *best;
} pick_t;

static void user_pick_visit(const char *key, void *value, void *ud)
{
    (void)key;
    pick_t *p = ud;
    user_t *u = value;
    if (u->queue.len == 0 || u->running >= user_max_running(p->s, u) ||
        u->skip_round == p->s->round)
        return;
    user_charge(u, 0); /* bring the decay up to date */
    user_t *b = p->best;
    double share = user_share(p->s, u), best = b ? user_share(p->s, b) : 0;
    if (!b || share < best ||
        (share == best &&
         ((entry_t *)heap_min(&u->queue))->seq < ((entry_t *)heap_min(&b->queue))->seq))
        p->best = u;
}

/* The user with queued work, under its running limit and not held back this round, with the
 * least recent usage per unit of its weight; NULL when there is none. */
user_t *user_pick(sched_t *s)
{
    pick_t p = {s, NULL};
    strmap_foreach(s->users, user_pick_visit, &p);
    return p.best;
}

/* ------------------------------------------------------------------ batch-key FIFOs */

/* Writes v in decimal at p (room for 12 bytes), unterminated; returns its length. */
static size_t fmt_int(char *p, int v)
{
    char tmp[12];
    unsigned u = v < 0 ? 0u - (unsigned)v : (unsigned)v;
    size_t n = 0;
    do
        tmp[n++] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    size_t len = 0;
    if (v < 0) p[len++] = '-';
    while (n)
        p[len++] = tmp[--n];
    return len;
}

static void keyq_remove(sched_t *s, entry_t *e)
{
    keyq_t *q = e->keyq;
    if (!q) return;
    queue_remove(&e->keyq_node);
    e->keyq = NULL;
    if (--q->len == 0) {
        if (s->keyq_last == q) s->keyq_last = NULL;
        strmap_remove(s->keyqs, q->key);
        free(q);
    }
}

/* Writes "BATCH_KEY@DEVICE/PREFERRED" into key without snprintf, which recovery would call
 * for every queued job. */
static void keyq_key(char key[KEYQ_KEY_SIZE], const char *batch_key, int device, int preferred)
{
    size_t n = strnlen(batch_key, OP_BATCH_KEY_LEN);
    memcpy(key, batch_key, n);
    key[n++] = '@';
    n += fmt_int(key + n, device);
    key[n++] = '/';
    n += fmt_int(key + n, preferred);
    key[n] = '\0';
}

/* Jobs batch together when their ops say so (equal batch keys) and they may run on the same
 * device (equal pins). */
static int keyq_append(sched_t *s, entry_t *e, const char *batch_key)
{
    char key[KEYQ_KEY_SIZE];
    keyq_key(key, batch_key, e->device, e->preferred_device);
    /* Jobs submitted or recovered together mostly share their key: the last FIFO appended to
     * is tried before the map. */
    keyq_t *q = s->keyq_last && strcmp(s->keyq_last->key, key) == 0 ? s->keyq_last
                                                                    : strmap_get(s->keyqs, key);
    if (!q) {
        size_t len = strlen(key);
        q = calloc(1, sizeof *q + len + 1);
        if (!q) return -ENOMEM;
        queue_init(&q->entries);
        memcpy(q->key, key, len + 1);
        if (strmap_put(s->keyqs, q->key, q) < 0) {
            free(q);
            return -ENOMEM;
        }
    }
    e->keyq = q;
    queue_insert_tail(&q->entries, &e->keyq_node);
    q->len++;
    s->keyq_last = q;
    return 0;
}

/* ------------------------------------------------------------------------- entries */

static int deadline_push(sched_t *s, entry_t *e)
{
    int r = heap_push(&s->deadlines, e);
    if (r >= 0 && heap_min(&s->deadlines) == e) s->want.deadlines = true;
    return r;
}

/* Takes a queued entry out of every queue structure (not out of s->entries). */
void entry_unqueue(sched_t *s, entry_t *e)
{
    if (e->queue_pos != HEAP_ABSENT) rank_remove(e->user, e);
    heap_remove(&e->user->queue, e);
    keyq_remove(s, e);
    heap_remove(&s->deadlines, e);
}

/* Puts an entry into its user's queue, the FIFO of batch_key ("": none) and the deadlines. */
static int entry_queue_keyed(sched_t *s, entry_t *e, const char *batch_key)
{
    int r = heap_push(&e->user->queue, e);
    if (r >= 0 && (r = rank_add(e->user, e)) < 0) heap_remove(&e->user->queue, e);
    if (r >= 0 && batch_key[0]) r = keyq_append(s, e, batch_key);
    if (r >= 0 && e->deadline_us) r = deadline_push(s, e);
    if (r < 0) entry_unqueue(s, e);
    return r;
}

/* Puts an entry whose job is in memory (a re-queue) back into the queues. */
int entry_queue(sched_t *s, entry_t *e)
{
    return entry_queue_keyed(s, e, e->job->call.batch_key);
}

/* A rough run-time estimate used to charge a user at dispatch, corrected when the batch
 * ends: fair share must see work the moment it is handed out. */
static double cost_estimate_us(op_cost_t cost)
{
    return 5.0 + cost.bytes / 1e4 + cost.flops / 1e6;
}

/* A new entry of owner's queued job id, indexed but in no queue; NULL when out of memory. */
static entry_t *entry_new(sched_t *s, const char *id, const char *owner, int priority, int device,
                          int64_t created_us, int64_t deadline_us, op_cost_t cost)
{
    entry_t *e = calloc(1, sizeof *e);
    user_t *u = user_get(s, owner);
    if (!e || !u || strmap_put(s->entries, id, e) < 0) {
        free(e);
        return NULL;
    }
    size_t id_len = strnlen(id, sizeof e->id - 1);
    memcpy(e->id, id, id_len); /* calloc'd: terminated */
    e->user = u;
    e->seq = s->next_seq++;
    e->priority = priority;
    e->device = (int16_t)device;
    e->preferred_device = -1;
    e->created_us = created_us;
    e->deadline_us = deadline_us;
    e->estimate_us = (float)cost_estimate_us(cost);
    e->queue_pos = e->deadline_pos = HEAP_ABSENT;
    queue_init(&e->keyq_node);
    queue_init(&e->waiters);
    return e;
}

/* Queues a new entry (batch_key: its job's); on failure it is dropped again. */
static int entry_start_queued(sched_t *s, entry_t *e, const char *batch_key)
{
    int r = entry_queue_keyed(s, e, batch_key);
    if (r < 0) {
        strmap_remove(s->entries, e->id);
        free(e);
        return r;
    }
    atomic_fetch_add(&s->queued, 1);
    return 0;
}

/* Makes a queued job schedulable (inside its group commit): the entry takes the job. On
 * allocation failure the job stays in the store and is picked up at the next start. */
int entry_add(sched_t *s, job_t *job)
{
    entry_t *e = entry_new(s, job->id, job->owner, job->priority, job->device, job->created_us,
                           job->deadline_us, job->call.cost);
    if (!e) return -ENOMEM;
    e->job = job;
    e->preferred_device = (int16_t)job->preferred_device;
    e->resident_inputs = job->resident_inputs;
    return entry_start_queued(s, e, job->call.batch_key);
}

/* Makes a queued job recovered at the start schedulable from its compact row alone: it is
 * read back from the store when it starts. */
int entry_add_stowed(sched_t *s, const store_queued_t *q)
{
    entry_t *e = entry_new(s, q->id, q->owner, q->priority, q->device, q->created_us,
                           q->deadline_us, q->cost);
    if (!e) return -ENOMEM;
    return entry_start_queued(s, e, q->batch_key);
}

/* Whether the entry's job is queued (a stowed one always is). */
bool entry_queued(const entry_t *e)
{
    return !e->job || e->job->state == JOB_QUEUED;
}

/* Frees the job_t of a queued entry whose row is committed, when the queue is long: the
 * entry keeps what the queues need, the store the rest. */
void entry_stow(sched_t *s, entry_t *e)
{
    if (!e->job || e->job->state != JOB_QUEUED || e->discard_result ||
        atomic_load(&s->queued) <= QUEUED_IN_MEMORY)
        return;
    job_free(e->job);
    e->job = NULL;
}

/* Reads a stowed entry's job back from the store (the loop's reader: the row is committed)
 * and resolves its op; e->job is then set. 0 at once for an entry in memory; else 0 or the
 * store's error, logged (the job stays queued and stowed). */
int entry_load(sched_t *s, entry_t *e)
{
    if (e->job) return 0;
    job_t *job = NULL;
    int r = store_job_get(s->rd, e->id, &job);
    if (r == 0 && (r = job_resolve_op(job)) < 0) job_free(job);
    if (r < 0)
        return log_error_errno(r, "reading queued job %s back from the store failed: %s", e->id,
                               strerror(-r));
    job->preferred_device = e->preferred_device;
    job->resident_inputs = e->resident_inputs;
    e->job = job;
    return 0;
}

/* The entry of a job that is not final (borrowed). */
entry_t *entry_of(sched_t *s, const job_t *job)
{
    return strmap_get(s->entries, job->id);
}

/* Drops an entry that is in no queue from memory; its job is the caller's to free. */
void entry_forget(sched_t *s, entry_t *e)
{
    strmap_remove(s->entries, e->id);
    free(e);
}
