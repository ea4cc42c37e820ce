/* The scheduler's private structures and the functions its files share; only daemon/sched/
 * includes this header.
 *
 * Everything runs on the loop thread except the public entry points (sched_api.c: they post a
 * message and wake the loop), on_batch_done (an executor thread: it posts the finished batch)
 * and answer_synced (the store's durability thread: it answers a message the loop handed over).
 *
 * In memory the loop keeps every job that is not final: an entry per job, indexed by id; per
 * user a heap of queued entries (priority, then arrival); per batch key a FIFO of queued
 * entries, from which batches are cut; a heap of deadlines. A job leaves memory when it ends;
 * reads of finished jobs go to the store. */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "scheduler.h"
#include "daemon/util/heap.h"
#include "daemon/util/log.h"
#include "daemon/util/policy.h"
#include "daemon/util/queue.h"
#include "daemon/util/stamp.h"
#include "daemon/util/strmap.h"

/* The most batches one round cuts. */
#define DISPATCH_MAX 64

typedef struct entry entry_t;

typedef struct wait_group wait_group_t;

/* One job's place in a wait (wait_group_t): in its entry's waiters until the job ends or the
 * wait is answered. */
typedef struct waiter {
    queue_t node;   /* in entry->waiters; empty once out of them */
    entry_t *entry; /* NULL once its job's end came */
    wait_group_t *group;
} waiter_t;

/* A wait for the ends of jobs, answered once all of them have ended, or by its one timer with
 * the jobs as they stand: the wait of GET /v1/jobs/{id}/wait (one job), or a waited
 * submission's (sched_submit_waited: every job of it). The ends that come before the last are
 * kept, outputs in memory, until the answer. */
struct wait_group {
    sched_reply_fn reply;
    void *token;
    uv_timer_t timer;
    /* A submission's: in s->submit_waiters, found there by token. An answer with a job not
     * final goes once the commit is durable (durable_first); replayed: the submission was an
     * idempotent retry. */
    queue_t submit_node;
    bool durable_first;
    bool replayed;
    bool short_of_memory; /* an end could not be kept: the answer is -ENOMEM */
    /* A submission's: the most bytes of an output its answer inlines (the request's
     * limits.max_inline_output_bytes). An end kept until the last keeps no more of one, and
     * a job's end is answered before its commit only when every output fits
     * (waiters_carry_result). A wait for one job keeps no end and leaves it 0. */
    uint64_t inline_max;
    size_t n, left;     /* its jobs, and those whose ends it still waits for */
    job_t **ends;       /* per job: its end (owned) once it came, else NULL */
    waiter_t members[]; /* per job */
};

/* The queued entries of one user at one priority, by arrival, for counting those before one
 * (sched_rank.c): slots in seq order (NULL once the entry left) and a Fenwick tree over them. */
typedef struct rank_level {
    int priority;
    entry_t **slots;
    int32_t *bit;
    size_t n, cap, live;
    uint64_t max_seq; /* the highest seq appended since the last rebuild */
} rank_level_t;

/* A user (an owner of jobs) as fair share sees it. */
typedef struct user {
    char owner[OWNER_SIZE];
    heap_t queue;         /* queued entries: highest priority, then oldest, first */
    rank_level_t *levels; /* the same entries by priority, highest first (sched_rank.c) */
    size_t n_levels;
    int running;
    long pending;    /* jobs submitted, waiting for the group commit */
    double usage_us; /* decayed device (or CPU) time, charged at dispatch, corrected at end */
    int64_t usage_at;
    double half_life_us;    /* of usage_us: [scheduler] fair_share_half_life_s */
    unsigned skip_round;    /* dispatch round in which this user's next batch is held back */
    policy_limits_t limits; /* under the policy of generation limits_gen (user_limits) */
    unsigned limits_gen;
    /* GPU time charged (ns) on UTC day budget_day and in the month whose first day is
     * budget_month: the usage rollup's sums for them, for the budgets (sched_budget.c). */
    int64_t budget_day, budget_month;
    int64_t day_ns, month_ns;
    /* Device memory (sched_memory.c): what its running jobs take (exec_job_device_bytes), and
     * its resident buffers' bytes as the store had them when s->resident_gen was this one. */
    uint64_t device_bytes;
    uint64_t resident_bytes;
    unsigned resident_gen;
} user_t;

/* Room for a batch-key FIFO's key: "BATCH_KEY@DEVICE/PREFERRED_DEVICE". */
#define KEYQ_KEY_SIZE (OP_BATCH_KEY_LEN + 32)

/* The queued entries of one batch key, oldest first: the jobs a batch may take together. */
typedef struct keyq {
    queue_t entries; /* of entry_t, through keyq_node */
    int len;
    char key[];
} keyq_t;

/* A job that is not final, as the loop keeps it. A queued job's entry holds what the queues
 * need (its order, batch key, device, deadline and cost); its job_t stays in memory only while
 * the queue is short (QUEUED_IN_MEMORY): a longer queue keeps the rest in the store alone, and
 * the job is read back from there when it starts or is answered for (entry_load). */
struct entry {
    job_t *job; /* NULL while stowed: queued, its job in the store alone */
    user_t *user;
    uint64_t seq;
    int64_t created_us;       /* the job's, for a batch's wait for company */
    int64_t deadline_us;      /* the job's (absolute wall-clock µs), 0 for none */
    float estimate_us;        /* what its user is charged at dispatch (estimate_us) */
    int priority;             /* the job's, kept here for the heap's comparisons */
    int16_t device;           /* the job's pin, or -1 */
    int16_t preferred_device; /* where its resident input lives, or -1 (job.h) */
    /* Its result is thrown away when its launch returns: it was cancelled while running, or
     * its submission's commit failed after it had gone out. */
    bool discard_result;
    bool unstored;   /* went out in a group commit that failed: it has no row */
    bool start_lost; /* cut in a group commit that failed: its row still says queued */
    bool answered;   /* its submissions' waiters had its end before it was written */
    /* Why it was last held back for device memory (memory_wait_t), until it starts. */
    uint8_t memory_wait;
    uint16_t resident_inputs; /* its job's (job.h), kept while the job is stowed */
    uint32_t rank_slot;       /* in its user's level of its priority while queued (sched_rank.c) */
    size_t queue_pos;         /* in user->queue, HEAP_ABSENT when not queued */
    size_t deadline_pos;      /* in s->deadlines, HEAP_ABSENT when none */
    keyq_t *keyq;             /* while queued with a batch key */
    queue_t keyq_node;
    queue_t waiters;   /* of waiter_t */
    double charged_us; /* what fair share was charged for it: an estimate, then its gpu_ns */
    /* The device time its record and the rollup were charged (entry_charge); for a job ended
     * while its launch goes on (running_record): when it ended, and whether what the launch
     * measures is charged once it returns (charge_on_return) and how much more then
     * (late_ns, written to the store after the round's commit). */
    int64_t charged_ns, ended_us, late_ns;
    bool charge_on_return;
    char id[ID_SIZE];
};

/* Why a queued entry was held back for device memory: its batch found no room in the pool, or
 * its user's share of the pool (limits.device_memory_percent_per_user) is taken. */
typedef enum memory_wait { MEMORY_WAIT_NONE, MEMORY_WAIT_POOL, MEMORY_WAIT_USER } memory_wait_t;

/* How many queued jobs keep their whole job_t in memory: those that go out soon after their
 * commit start without a read back, and a long queue costs only its entries. */
#define QUEUED_IN_MEMORY 1024

typedef enum msg_kind {
    MSG_SUBMIT,
    MSG_WAIT,
    MSG_WAIT_CANCEL,
    MSG_CANCEL,
    MSG_EXPLAIN,
    MSG_USER_COUNTS,
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

/* A request to the loop, from another thread or from the executor. */
typedef struct msg {
    queue_t node; /* in the inbox, then in the pending group commit */
    msg_kind_t kind;
    sched_reply_fn reply;
    void *token;
    job_t **jobs;
    size_t n;
    job_fate_t *fate;    /* submit: per job */
    bool waited;         /* submit: sched_submit_waited's, for timeout_ms */
    uint64_t inline_max; /* waited submit: sched_submit_waited's inline_max */
    bool any_owner;
    char owner[OWNER_SIZE];
    char id[ID_SIZE];
    int timeout_ms;
    job_t *const *explain; /* explain: the caller's jobs, borrowed until the reply */
    size_t n_explain;
    buffer_t *buf;
    exec_batch_t *batch;
    int err; /* a refusal of this message alone, within a group commit */
    char err_message[256];
    char err_limit[POLICY_SOURCE_SIZE]; /* the policy key that refused it, if one did */
    /* A committed submission's answer, given once its commit is durable: */
    job_t **shown;    /* submit: the jobs as accepted (or as first created, when replayed); owned */
    bool shown_taken; /* the answer's callee took shown (sched_result_t.take_jobs) */
    bool all_replayed;           /* every job's idempotency key was known */
    store_durable_wait_t synced; /* handed to the store, whose durability thread answers it */
} msg_t;

struct sched {
    const config_t *cfg;
    store_t *st;
    store_reader_t *rd; /* the loop's own reader, for finished jobs */
    executor_t *ex;

    uv_loop_t loop;
    uv_async_t wake;
    /* watchdog_timer is systemd's heartbeat; batch_watchdog_timer looks for stuck batches. */
    uv_timer_t commit_timer, dispatch_timer, deadline_timer, gc_timer, upkeep_timer, drain_timer,
        watchdog_timer, batch_watchdog_timer;
    /* Running jobs' time limits (sched_time_limit.c): the timer, and when it is due (mono_us(),
     * 0 when stopped). */
    uv_timer_t time_limit_timer;
    int64_t time_limit_due_us;
    pthread_t thread;
    bool thread_started;

    pthread_mutex_t lock; /* guards the inbox */
    queue_t inbox;        /* of msg_t */
    atomic_bool accepting;
    atomic_bool store_failed; /* a sync failed: nothing more is accepted */
    atomic_bool loop_gone;

    /* Loop thread only. */
    queue_t pending; /* of msg_t, awaiting the group commit */
    /* What the handlers ask of the round (sched_round.c), which runs the phases they name:
     * commit: the pending messages' group commit, due once commit_timer is not running;
     * dispatch: a cut of what the executor has room for; and the timers it arms at its end.
     * ended: the finished batches (of sched_batch_t, through ended) whose ends the round
     * records next. */
    struct {
        bool commit, dispatch;
        bool deadlines;        /* the earliest deadline changed: deadline_arm */
        int64_t hold_until_us; /* the earliest end of a partial batch's wait for company, or 0 */
    } want;
    queue_t ended;
    strmap_t *entries, *users, *keyqs;
    keyq_t *keyq_last;      /* the FIFO last appended to, while it exists (keyq_append) */
    heap_t deadlines;       /* queued entries with a deadline, earliest first */
    queue_t in_flight;      /* of sched_batch_t, through flight: handed to the executor */
    queue_t submit_waiters; /* of wait_group_t, through submit_node: waited submissions */
    uint64_t next_seq;
    int batches_in_flight;
    unsigned round;
    /* The executor's pool (executor_ops_t.memory_pool, read when it is installed): every
     * device's together (0: no bound), the largest, and the key that sets it. resident_gen
     * counts changes to buffers, after which users' resident bytes are read again. */
    uint64_t pool_bytes, pool_largest;
    const char *pool_key;
    unsigned resident_gen;
    bool stopping;

    atomic_long queued, running, submitted_total, succeeded_total, failed_total, cancelled_total,
        batches_total, batched_jobs_total;
    /* Batches the watchdog gave up on: ever, and those the executor has not given back yet
     * (counted in batches_in_flight too, but not waited for by the drain). */
    atomic_long watchdog_expired_total, stuck_batches;
    /* The store's bound (sched_timers.c): its bytes at the last measure, and what store_trim
     * dropped since the start. */
    atomic_long store_bytes, store_expired_bytes_total, store_expired_jobs_total,
        store_deleted_jobs_total;
    /* The histograms of sched_get_histograms (sched_histograms.c): counts per bucket, not
     * cumulative; written by the loop thread, read by any. */
    atomic_long latency_bucket[SCHED_LATENCY_BUCKETS + 1], latency_sum_us;
    atomic_long batch_bucket[SCHED_BATCH_BUCKETS + 1], batch_jobs_sum;
    int64_t next_retention_us; /* loop thread: when the retention sweep is due */
    int64_t next_fair_save_us; /* loop thread: when the fair-share state is saved next */
    /* Loop thread: late charges the store has not taken yet, oldest first (late_charges_write),
     * and whether the last try failed. */
    store_charge_t *late_charges;
    size_t n_late_charges, cap_late_charges;
    bool late_charges_failing;

    /* The per-user policy (sched_policy.c): swapped whole under policy_lock, each swap
     * counted in policy_gen so that the loop resolves its users again. */
    pthread_mutex_t policy_lock;
    policy_t *policy;
    atomic_uint policy_gen;

    /* The per-user gauges of sched_get_user_gauges (sched_user_gauges.c): written by the loop
     * on user_gauges_timer, read by any thread, under user_gauges_lock. */
    uv_timer_t user_gauges_timer;
    pthread_mutex_t user_gauges_lock;
    sched_user_gauge_t user_gauges[SCHED_USER_GAUGES_MAX];
    int n_user_gauges;
    long users_with_jobs;
};

/* A batch as the scheduler hands it to the executor. */
typedef struct sched_batch {
    exec_batch_t batch;
    sched_t *s;
    int64_t dispatched_us;
    msg_t *done_msg;  /* allocated at dispatch, so that reporting the end needs no memory */
    queue_t ended;    /* in the list of finished batches end_batches records */
    queue_t flight;   /* in s->in_flight while the executor has it */
    int64_t bound_ms; /* how long it may run before the watchdog gives up on it */
    bool expired;     /* the watchdog gave up on it: its jobs were failed, its result is not */
    /* A job of it that its time limit stopped (EXEC_CANCEL_STOPPED) and since when (mono_us()),
     * until its worker lets it go or the grace runs out (sched_time_limit.c). */
    job_t *stopping;
    int64_t stopping_since_us;
} sched_batch_t;

/* One round of starts: the batches cut, what became of each at launch, and what the store
 * kept of the round's transaction. */
typedef struct round {
    sched_batch_t *ready[DISPATCH_MAX];
    int refusal[DISPATCH_MAX]; /* 0 handed over, else what round_settle_refused deals with */
    int n;
    store_commit_result_t committed;
} round_t;

/* scheduler.c: messages and replies. */
void reply_err(sched_reply_fn reply, void *token, int err, const char *message);
void reply_refused(sched_reply_fn reply, void *token, int err, const char *message,
                   const char *limit);
void reply_jobs(sched_reply_fn reply, void *token, job_t *const *jobs, size_t n);
void reply_stopping(sched_reply_fn reply, void *token);
void inbox_push(sched_t *s, msg_t *m);
void inbox_take(sched_t *s, queue_t *list);
void handle_msg(sched_t *s, msg_t *m);
void msg_post(sched_t *s, msg_t *m);
void msg_free(msg_t *m);

/* sched_queue.c: entries, per-user and per-batch-key queues, fair share. */
int queues_init(sched_t *s);
void queues_free(sched_t *s);
bool entry_before(const void *a, const void *b);
int entry_add(sched_t *s, job_t *job);
int entry_add_stowed(sched_t *s, const store_queued_t *q);
void entry_stow(sched_t *s, entry_t *e);
int entry_load(sched_t *s, entry_t *e);
bool entry_queued(const entry_t *e);
entry_t *entry_of(sched_t *s, const job_t *job);
void entry_forget(sched_t *s, entry_t *e);
int entry_queue(sched_t *s, entry_t *e);
void entry_unqueue(sched_t *s, entry_t *e);
user_t *user_get(sched_t *s, const char *owner);
void user_charge(user_t *u, double us);
/* A job taken for a batch goes back to its queue without having run to its end: its user gets
 * back the running slot, the device memory and the fair-share estimate it was charged when the
 * batch was cut. */
void entry_untake(entry_t *e);
user_t *user_pick(sched_t *s);

/* sched_budget.c: charges and GPU-time budgets. entry_charge brings what e's user is charged
 * for e's job (fair share, and the budgets' sums) to total_ns, charged as of finished_us
 * (the job's end: the rollup's day); call it wherever the job's gpu_ns goes to the store.
 * budget_load restores the budgets' sums from the rollup at start; budget_refuses says
 * whether u's budgets refuse a submission now, and why. */
typedef struct budget_refusal {
    char message[384];
    char limit[POLICY_SOURCE_SIZE]; /* the key that decided */
    int window;                     /* budget_window_t */
    int64_t reset_at_us;            /* when that budget's window resets */
} budget_refusal_t;
void entry_charge(sched_t *s, entry_t *e, int64_t finished_us, int64_t total_ns);
/* sched_complete.c: writes the late charges kept in s->late_charges to the store, oldest first,
 * until the store refuses one: that one and those after it stay for the next try (the next
 * round of ends, the upkeep timer, the scheduler's stop), so that the record and the rollup get
 * what fair share and the budgets were charged. Loop thread, or after it ended. */
void late_charges_write(sched_t *s);
int budget_load(sched_t *s);
bool budget_refuses(sched_t *s, user_t *u, budget_refusal_t *ret);

/* sched_policy.c: the per-user policy. */
int sched_policy_init(sched_t *s);
void sched_policy_free(sched_t *s);
const policy_limits_t *user_limits(sched_t *s, user_t *u);
int user_max_running(sched_t *s, user_t *u);
double user_share(sched_t *s, user_t *u);

/* sched_rank.c: how many of a user's queued entries come before one, in O(log n). rank_add
 * (0 or -ENOMEM) and rank_remove follow the user's queue; rank_ahead counts; rank_free frees
 * the user's levels. */
int rank_add(user_t *u, entry_t *e);
void rank_remove(user_t *u, entry_t *e);
long rank_ahead(const user_t *u, const entry_t *e);
void rank_free(user_t *u);

/* sched_explain.c: why a queued job waits. sched_explain explains one entry into into (its
 * job or a copy); sched_explain_entries explains es[0..n) (queued entries, each into its
 * job), in O(log n) of its user's queue each; sched_explain_copies
 * writes into copies of jobs (NULL ones skipped) why the loop's queued jobs of the same ids
 * wait: 0 or -ENOMEM. handle_explain answers sched_explain_jobs. */
typedef struct explained {
    entry_t *e;
    job_t *into;
} explained_t;
void sched_explain(sched_t *s, entry_t *e, job_t *into);
int sched_explain_entries(sched_t *s, explained_t *es, size_t n);
int sched_explain_copies(sched_t *s, job_t *const *jobs, size_t n);
void handle_explain(sched_t *s, msg_t *m);

/* sched_round.c: the round, the one function that runs the phases below in their order,
 * from the flags (s->want) and the queue of ended batches (s->ended) that the handlers fill.
 * inbox says whether it takes the inbox's messages first (the wake); a timer's callback sets
 * its flag and runs the round without them. */
void sched_round(sched_t *s, bool inbox);

/* sched_commit.c: group commit of submissions and buffers. commit_pending is the round's
 * commit phase. */
void handle_submission(sched_t *s, msg_t *m);
void commit_pending(sched_t *s);
void discard_inputs(sched_t *s, const job_t *job);

/* sched_dispatch.c: cutting batches and starting them. round_cut is the cut of every phase
 * that starts jobs; it answers s->want.dispatch. */
void dispatch_soon(sched_t *s);
void dispatch_timer_arm(sched_t *s);
void round_cut(sched_t *s, round_t *rd);
int round_record_starts(sched_t *s, const round_t *rd, uint64_t taken_from);
void round_launch(sched_t *s, round_t *rd, bool recorded);
int round_commit(sched_t *s, round_t *rd, int r);
bool round_job_committed(const round_t *rd, const job_t *job);
void round_mark_starts_lost(sched_t *s, const round_t *rd);
void round_settle_refused(sched_t *s, const round_t *rd);
void batch_free(sched_batch_t *sb);

/* sched_complete.c: ends of batches, retries and re-queues. end_batches is the round's phase
 * that records ends and cuts (start_next) in one transaction; it asks for a dispatch when the
 * transaction could not take the cut. */
void on_batch_done(exec_batch_t *batch, void *ud);
bool batch_ended(sched_t *s, msg_t *m);
void end_batches(sched_t *s, queue_t *ended, bool start_next);
void batch_fail(sched_t *s, sched_batch_t *sb, const char *why);
void batch_retry(sched_t *s, sched_batch_t *sb);
void handle_given_back(sched_t *s, msg_t *m);
void count_final(sched_t *s, job_state_t state);
/* Loop thread: a job's end (its latency) and a launched batch of n jobs, into the histograms. */
void sched_observe_job_end(sched_t *s, const job_t *job);
void sched_observe_batch(sched_t *s, long n);

/* sched_wait.c: waits, cancels, deadlines. */
void handle_wait(sched_t *s, msg_t *m);
bool submission_wait(sched_t *s, msg_t *m);
void handle_wait_cancel(sched_t *s, msg_t *m);
void handle_cancel(sched_t *s, msg_t *m);
void waiters_reply(entry_t *e, const job_t *job);
void waiters_reply_gated(entry_t *e, const job_t *job, sched_gate_t *end_gate);
/* Whether a waited submission waits for e's job, and every such submission's answer carries
 * the job's whole result (job, in its end state): each output inlined; a failed job has none. */
bool waiters_carry_result(const entry_t *e, const job_t *job);
void waiters_answer_all(sched_t *s);
void deadline_arm(sched_t *s);
int running_end(sched_t *s, entry_t *e, job_state_t state, const char *code, const char *message,
                sched_reply_fn reply, void *token);

/* sched_gate.c: the loop's side of sched_gate_t. A new gate, closed, with the loop's
 * reference (NULL when out of memory); sched_gate_open opens it and drops that reference. */
sched_gate_t *sched_gate_new(void);
void sched_gate_open(sched_gate_t *gate);

/* sched_watchdog.c: batches that make no progress. */
void batch_watchdog_start(sched_t *s);
void batch_watchdog_track(sched_t *s, sched_batch_t *sb);
void batch_flight_end(sched_t *s, const sched_batch_t *sb);

/* sched_time_limit.c: running jobs' own time limits. time_limit_track arms the timer for a
 * batch just handed to the executor. */
void time_limit_track(sched_t *s, const sched_batch_t *sb);

/* sched_memory.c: device memory per user. memory_admits says whether e's job (loaded) fits its
 * user's share beside what the user holds, marking e when not; memory_take and memory_give
 * count a job into and out of its user's running bytes; memory_user_limit is the user's share
 * in bytes (0: none); memory_resident_changed says a buffer came or went. */
void memory_init(sched_t *s);
uint64_t memory_user_limit(sched_t *s, user_t *u);
bool memory_admits(sched_t *s, entry_t *e);
void memory_take(entry_t *e);
void memory_give(entry_t *e);
void memory_resident_changed(sched_t *s);

/* sched_timers.c: maintenance timers and the drain at stop. */
void timers_start(sched_t *s);

/* --- fair share across restarts (sched_fair_state.c) --- */

/* How often the loop saves the fair-share state (besides at the scheduler's end). */
#define FAIR_STATE_SAVE_US INT64_C(10000000)
/* Saves every user's decayed usage to the store; a failure is logged, and costs only the
 * usage since the last save should the daemon stop now. Loop thread, or after it ended. */
void fair_state_save(sched_t *s);
/* Loads the saved usage, decayed over the time since it was saved, before anything runs. */
int fair_state_load(sched_t *s);
/* The stop, once the round has committed what was pending: answers the waiters and starts
 * the drain timer; stop_if_drained, the round's last phase, ends the loop once drained. */
void handle_stop(sched_t *s);
void stop_if_drained(sched_t *s);

/* sched_user_gauges.c: the per-user counts. user_gauges_start publishes the snapshot of
 * /metrics at once and then every SCHED_USER_GAUGES_MS on the loop; handle_user_counts answers
 * sched_user_counts. */
void user_gauges_start(sched_t *s);
void handle_user_counts(sched_t *s, msg_t *m);
