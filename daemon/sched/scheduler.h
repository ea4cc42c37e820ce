/* The scheduler: one libuv loop thread that owns the write side of the store, the per-user
 * queues, group commit, dynamic batching, deadlines, cancellation, retention and the executor.
 *
 * Requests from other threads (the HTTP server's) are posted to the loop; each carries a
 * callback that the loop calls exactly once with the result, on the loop thread. The result's
 * pointers are borrowed for the duration of the callback. No function here blocks. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/util/config.h"
#include "daemon/util/policy.h"
#include "daemon/exec/executor.h"
#include "daemon/job/job.h"
#include "daemon/store/store.h"

typedef struct sched sched_t;

/* A waited submission's answer may be handed over while its job's end is still being
 * written and committed (end_batches): the HTTP thread makes the answer's text meanwhile. The
 * gate opens once the commit is over; the answer leaves only after it (sched_gate_pass), so
 * that whatever its client does next (a GET of the job, a download of an output) finds the
 * end in the store. */
typedef struct sched_gate sched_gate_t;
/* A new reference to gate, for a reply's callee that keeps it past the callback. */
sched_gate_t *sched_gate_hold(sched_gate_t *gate);
/* Waits until gate is open, then drops the reference; NULL is a no-op. */
void sched_gate_pass(sched_gate_t *gate);
/* Drops a reference without waiting (the answer will not be sent); NULL is a no-op. */
void sched_gate_drop(sched_gate_t *gate);

typedef struct sched_result {
    int err;             /* 0, or negative errno: -ENOENT unknown id, -EBUSY wrong state,
                            -EAGAIN over a per-user limit, -ESHUTDOWN draining,
                            -EEXIST idempotency conflict, -EIO store failure */
    const char *message; /* for err != 0; may be NULL */
    job_t *const *jobs;  /* submit: the jobs as committed; wait/cancel: the job. Output
                            bytes are in out[j].data (in memory) during the callback. */
    size_t n_jobs;
    bool replayed; /* submit: an Idempotency-Key matched; jobs are the first ones */
    /* submit, when not NULL: setting *take_jobs keeps the array jobs and its jobs, which the
     * callee then owns (job_free each, free the array), so that it may show them later on a
     * thread of its own: the reply may come from the store's durability thread, which answers
     * every durable submission in turn. */
    bool *take_jobs;
    const buffer_t *buffer; /* buffer operations */
    /* cancel: what became of the job, "dequeued" (it had not started: it never runs),
     * "stopped" (its worker stops it at its next check) or "dropped" (it runs to its end on
     * the device; its result is dropped); a static string. */
    const char *cancel;
    /* -EAGAIN, -EDQUOT, -EPERM (a max_queued of 0) from the per-user policy: the key that
     * refused ("user.alice.max_queued", "limits.max_queued_per_user"), for the answer's error
     * field. */
    const char *limit;
    /* -EAGAIN from a GPU-time budget (limit names its key): when its window resets (wall-clock
     * µs), and which window, "day" or "month"; 0 and NULL for any other refusal. */
    int64_t reset_at_us;
    const char *budget_window;
    /* wait of a submission: not NULL while its last job's end is being committed; borrowed (see
     * sched_gate_t: a callee that answers later holds it and passes it before the answer). */
    sched_gate_t *end_gate;
    /* sched_user_counts: the rows, borrowed during the callback. */
    const struct sched_user_gauge *users;
    size_t n_users;
} sched_result_t;

typedef void (*sched_reply_fn)(void *token, const sched_result_t *res);

/* Creates the scheduler with its loop (not yet running). Takes no ownership of cfg or st. */
int sched_new(const config_t *cfg, store_t *st, sched_t **ret);
/* The store the scheduler writes (sched_new's): other threads open their readers on it
 * (store_reader_open). Any thread. */
store_t *sched_store(const sched_t *s);
/* Installs the executor (owned by the scheduler from now on). */
void sched_set_executor(sched_t *s, executor_t *ex);
/* Recovers and re-queues the jobs the store holds, then starts the loop thread. */
int sched_start(sched_t *s);
/* Stops intake (requests answer -ESHUTDOWN), lets running batches finish within
 * cfg->drain_timeout_ms, leaves queued jobs in the store for the next start, and joins the
 * loop thread. */
void sched_stop(sched_t *s);
void sched_free(sched_t *s);

/* Submits validated jobs (ownership passes to the scheduler, also on error). Replies once
 * all are committed, with the jobs as stored; an idempotent retry replies with the first job.
 * Array submissions are all-or-nothing. */
void sched_submit(sched_t *s, job_t **jobs, size_t n, sched_reply_fn reply, void *token);
/* Submits validated jobs as sched_submit does and replies once all of them have ended, with
 * the jobs as they ended (outputs in memory), or after wait_ms with the jobs as they stand
 * (those that ended, as they ended): one timer and one answer for the whole array, however
 * long. The answer that carries the jobs' ends is given as soon as the last end is committed,
 * without waiting for the sync of the submission's commit, which follows in the background:
 * the client then holds the results, and should the connection fail, a retry with the same
 * Idempotency-Key finds the jobs. An answer that carries a job not yet final (the wait ran
 * out, the daemon stops) is given once the jobs' acceptance is durable, as sched_submit's. An
 * idempotent retry waits for the first jobs of its keys (replayed set). inline_max: the most
 * bytes of an output that the caller's answer inlines (the request's
 * limits.max_inline_output_bytes): a job whose outputs do not all fit is answered only once its
 * end is committed, and a job that ends before the last keeps no more of an output than that.
 * Errors as sched_submit's. */
void sched_submit_waited(sched_t *s, job_t **jobs, size_t n, int wait_ms, uint64_t inline_max,
                         sched_reply_fn reply, void *token);
/* Replies when job id (owned by owner, or any owner if owner is NULL) is final, or after
 * timeout_ms with its current state. */
void sched_wait(sched_t *s, const char *owner, const char *id, int timeout_ms, sched_reply_fn reply,
                void *token);
/* The client of the wait of token for job id (or, id "", of the submission of token through
 * sched_submit_waited) went away: that wait, if it still waits, is answered at once (with the
 * job as it stands), so that its caller can let the connection go.
 * A wait already answered is left alone. Since messages reach the loop in the order they were
 * posted, a token may be given to a new wait as soon as the old wait's reply has run. */
void sched_wait_cancel(sched_t *s, const char *id, void *token);
/* Says why each queued job of jobs[0..n) waits (job_t.waiting_*), as the loop sees it now,
 * with one pass over each owner's queue whatever n: the jobs are the caller's copies (from the
 * store), borrowed until the reply, which gives them back as res->jobs; one that the loop no
 * longer holds queued is left as it is. On error (-ENOMEM, -ESHUTDOWN) none is changed. */
void sched_explain_jobs(sched_t *s, job_t *const *jobs, size_t n, sched_reply_fn reply,
                        void *token);
/* Cancels: the job ends cancelled, durably, at once. A queued job is removed and never runs;
 * a running one is stopped by the executor where it can, its result discarded in any case
 * (sched_result_t.cancel says which). -EBUSY for a job already final. */
void sched_cancel(sched_t *s, const char *owner, const char *id, sched_reply_fn reply, void *token);
/* Stores an uploaded buffer (ownership passes): its bytes in buf->data, or already durable in
 * the blob file buf->blob names (a streamed upload). An ephemeral one (!buf->durable, resident)
 * gives its bytes to the executor's resident copy on the calling thread first (507 when no
 * device has room) and stores only its row. Replies when committed. */
void sched_buffer_put(sched_t *s, buffer_t *buf, sched_reply_fn reply, void *token);
/* An ephemeral buffer's upload streamed as it arrives, before the buffer exists: its resident
 * copy of nbytes is opened on the device the executor places it on (its memory taken now), the
 * request's bytes go into it in order (sched_upload_write, from one thread at a time), and
 * sched_buffer_put_upload makes it the buffer's once all of them are in, or
 * sched_upload_abort frees it. Any thread. 0; -ESHUTDOWN when draining; -EOPNOTSUPP where the
 * backend keeps no resident copies; -ENOSPC when no device has room; -EBUSY when the device's
 * upload staging is all in use; -ENOMEM; -EIO. */
int sched_upload_open(sched_t *s, uint64_t nbytes, exec_upload_t **ret);
/* 0; -EFBIG past the nbytes of the open (nothing written); -EIO after a device error. */
int sched_upload_write(exec_upload_t *up, const void *data, size_t n);
/* Accepts NULL. */
void sched_upload_abort(exec_upload_t *up);
/* sched_buffer_put of an ephemeral buffer (!buf->durable, resident, no bytes in buf->data)
 * whose bytes are all in up (taken, freed whatever the outcome). */
void sched_buffer_put_upload(sched_t *s, buffer_t *buf, exec_upload_t *up, sched_reply_fn reply,
                             void *token);
void sched_buffer_delete(sched_t *s, const char *owner, const char *id, sched_reply_fn reply,
                         void *token);

/* The per-user policy in force (a new reference: policy_unref it). Any thread. */
policy_t *sched_policy(sched_t *s);
/* Counts the policies installed: it changes with each sched_set_policy, so that a reader
 * that keeps limits resolved from one knows when to resolve them again. Any thread. */
unsigned sched_policy_generation(sched_t *s);
/* Installs policy p (the scheduler takes the caller's reference) in place of the one in
 * force, which goes once its last reader lets it go; each user's limits are resolved again
 * under p at their next use. Any thread: this is how a reload swaps the policy. */
void sched_set_policy(sched_t *s, policy_t *p);

/* How long a batch of n jobs may run before the watchdog gives up on it, in ms: its cost
 * estimate (the ops' bytes and flops, at conservative CPU rates) times
 * cfg->watchdog_cost_factor, and at least cfg->watchdog_min_ms; 0 when the watchdog is off. */
int64_t sched_watchdog_bound_ms(const config_t *cfg, job_t *const *jobs, int n);

/* Counters for /metrics and /readyz; safe from any thread. */
typedef struct sched_stats {
    bool accepting;
    bool store_failed; /* a commit could not be synced: submissions are refused */
    long queued, running;
    long submitted_total, succeeded_total, failed_total, cancelled_total;
    long batches_total, batched_jobs_total;
    /* Batches the watchdog gave up on, ever; and those whose worker or device has not come
     * back from them yet (the backend is not ready meanwhile). */
    long watchdog_expired_total, stuck_batches;
    /* The store's bound ([store] max_bytes; store_trim): the bytes counted against it at the
     * last measure, and since the start the tensor bytes dropped early, the jobs whose outputs
     * expired early and the finished jobs deleted early. */
    long store_bytes, store_expired_bytes_total, store_expired_jobs_total, store_deleted_jobs_total;
} sched_stats_t;
void sched_get_stats(sched_t *s, sched_stats_t *ret);

/* Jobs queued and running per user, for /metrics. The loop publishes a snapshot every
 * SCHED_USER_GAUGES_MS, so that a reader neither walks the queues nor waits for the loop: it
 * holds the SCHED_USER_GAUGES_MAX users with the most jobs queued (then running, then by name)
 * among those with any, so that a scrape stays small however many users there are. */
#define SCHED_USER_GAUGES_MAX 100
#define SCHED_USER_GAUGES_MS 1000
typedef struct sched_user_gauge {
    char user[OWNER_SIZE];
    long queued, running;
} sched_user_gauge_t;
/* Copies the latest snapshot's rows into ret[0..cap) and returns how many it copied;
 * *ret_users is how many users had jobs queued or running then, which may pass the rows
 * published. Any thread; empty until the loop's first publication. */
int sched_get_user_gauges(sched_t *s, sched_user_gauge_t *ret, int cap, long *ret_users);
/* The same counts as they stand now, for /v1/stats: the loop replies with a row for every user
 * with jobs queued or running (only owner's, when owner is not NULL), by name, uncapped, in
 * res->users[0..n_users). The rows come from the routine the snapshot uses, on the loop, after
 * the batches that ended before the message: exact, at the cost of a walk of the users. */
void sched_user_counts(sched_t *s, const char *owner, sched_reply_fn reply, void *token);

/* Histograms for /metrics, Prometheus-style: le[i] counts the observations at most
 * bounds[i] (cumulative, i < n), count all of them (the +Inf bucket) and sum their total. The
 * latency is a job's time from its submission to its end, for jobs that ran to success or
 * failure; the batch size is the jobs of each batch handed to the executor. The bounds are
 * static arrays of the scheduler's. */
#define SCHED_LATENCY_BUCKETS 14
#define SCHED_BATCH_BUCKETS 12
typedef struct sched_histogram {
    int n;
    const double *bounds;
    long le[SCHED_BATCH_BUCKETS > SCHED_LATENCY_BUCKETS ? SCHED_BATCH_BUCKETS
                                                        : SCHED_LATENCY_BUCKETS];
    long count;
    double sum;
} sched_histogram_t;
typedef struct sched_histograms {
    sched_histogram_t latency_s, batch_jobs;
} sched_histograms_t;
/* Any thread; each bucket is read on its own, so a reading taken while jobs end may be off by
 * the jobs that ended meanwhile. */
void sched_get_histograms(sched_t *s, sched_histograms_t *ret);
/* Whether the store's disk is full (store_disk_full): reason (size bytes) then says why. Any
 * thread. */
bool sched_disk_full(sched_t *s, char *reason, size_t size);
/* Whether the store was found damaged (store_damaged): it refuses every write; reason (size
 * bytes) then says what was found. Any thread. */
bool sched_store_damaged(sched_t *s, char *reason, size_t size);
/* The executor's description for /v1/info (a new reference). */
json_t *sched_describe_backend(sched_t *s);
/* Whether the backend can run op's jobs (op_supports for the executor's backend). */
bool sched_runs_op(sched_t *s, const op_def_t *op);
/* The executor's device memory pool (executor_ops_t.memory_pool): every device's bytes together
 * (0: no bound), the largest device's in *ret_largest, and the configuration key that sets them
 * in *ret_key. Any thread. */
uint64_t sched_device_memory(sched_t *s, uint64_t *ret_largest, const char **ret_key);
/* A user's share of a device memory pool of pool bytes: percent (0..100,
 * limits.device_memory_percent_per_user) of it, rounded down and without overflow; 0 (no
 * bound) when percent is 0. Inline: the API's door and the loop both ask it. */
static inline uint64_t sched_memory_share(uint64_t pool, uint64_t percent)
{
    return pool / 100 * percent + pool % 100 * percent / 100;
}
/* Whether a job's time limit must cover its cost estimate at submission: the backend cannot
 * stop a running job (executor_ops_t.stops_running is false). */
bool sched_time_limit_by_cost(sched_t *s);
/* True when the backend runs jobs on that device (where resident buffers draw their jobs). */
bool sched_serves_device(sched_t *s, int device);
