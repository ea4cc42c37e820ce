/* The public entry points, called on other threads (the HTTP server's): each builds a message
 * and posts it to the loop, after the work that needs no loop (ids, blob files of large
 * tensors) is done on the caller's thread; and the counters any thread may read. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "sched_internal.h"

static msg_t *msg_new(msg_kind_t kind, sched_reply_fn reply, void *token)
{
    msg_t *m = calloc(1, sizeof *m);
    if (!m) {
        reply_err(reply, token, -ENOMEM, NULL);
        return NULL;
    }
    queue_init(&m->node);
    m->kind = kind;
    m->reply = reply;
    m->token = token;
    return m;
}

/* A message about one job or buffer: id, seen by owner (any owner when NULL). */
static msg_t *msg_new_target(msg_kind_t kind, const char *owner, const char *id,
                             sched_reply_fn reply, void *token)
{
    msg_t *m = msg_new(kind, reply, token);
    if (!m) return NULL;
    m->any_owner = owner == NULL;
    snprintf(m->owner, sizeof m->owner, "%s", owner ? owner : "");
    snprintf(m->id, sizeof m->id, "%s", id);
    return m;
}

/* Writes tensors too large for a row to blob files, on the caller's thread. */
static int persist_large(sched_t *s, job_tensor_t *t)
{
    if (!t->data || t->blob || t->nbytes <= s->cfg->inline_blob_bytes) return 0;
    return store_blob_write(s->st, t->data, t->nbytes, &t->blob);
}

/* Names and dates the jobs (queued from now), keeps a copy of each as the answer will show it, and
 * writes their inputs' files. 0, or a negative errno with no file of theirs left. */
static int submission_prepare(sched_t *s, msg_t *m)
{
    int64_t now = now_us();
    int r = 0;
    for (size_t i = 0; i < m->n; i++) {
        job_t *job = m->jobs[i];
        /* Where jobs with an idempotency key stay (place_submissions). */
        store_job_id_new(s->st, job->id);
        job->created_us = now;
        job->state = JOB_QUEUED;
        /* What the answer shows of it, as accepted; copied here, off the loop. */
        m->shown[i] = job_copy_shown(job);
        for (int j = 0; j < OP_MAX_TENSORS && r == 0; j++)
            r = persist_large(s, &job->in[j]);
    }
    /* An array's many small inputs too: written here, by the HTTP thread, not by the loop. */
    if (r == 0) r = store_blob_pack(s->st, m->jobs, m->n, false);
    if (r < 0)
        /* Files of their own only, which any thread may remove: a failed pack leaves none. */
        for (size_t i = 0; i < m->n; i++)
            discard_inputs(s, m->jobs[i]);
    return r;
}

/* Posts a submission (waited: sched_submit_waited's, for wait_ms, inlining up to inline_max). */
static void submit_post(sched_t *s, job_t **jobs, size_t n, bool waited, int wait_ms,
                        uint64_t inline_max, sched_reply_fn reply, void *token)
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
    m->waited = waited;
    m->timeout_ms = wait_ms;
    m->inline_max = inline_max;
    m->fate = calloc(n ? n : 1, sizeof *m->fate);
    m->shown = calloc(n ? n : 1, sizeof *m->shown);
    if (!m->fate || !m->shown) {
        reply_err(reply, token, -ENOMEM, NULL);
        msg_free(m);
        return;
    }
    if (!atomic_load(&s->accepting)) {
        reply_stopping(reply, token);
        msg_free(m);
        return;
    }
    int r = submission_prepare(s, m);
    if (r < 0) {
        /* A full disk is the client's to know (507); any other failure is ours. */
        reply_err(reply, token, r == -ENOSPC ? r : -EIO, "could not persist the input tensors");
        msg_free(m);
        return;
    }
    STAMP(POSTED);
    msg_post(s, m);
}

void sched_submit(sched_t *s, job_t **jobs, size_t n, sched_reply_fn reply, void *token)
{
    submit_post(s, jobs, n, false, 0, 0, reply, token);
}

void sched_submit_waited(sched_t *s, job_t **jobs, size_t n, int wait_ms, uint64_t inline_max,
                         sched_reply_fn reply, void *token)
{
    submit_post(s, jobs, n, true, wait_ms, inline_max, reply, token);
}

void sched_wait(sched_t *s, const char *owner, const char *id, int timeout_ms, sched_reply_fn reply,
                void *token)
{
    msg_t *m = msg_new_target(MSG_WAIT, owner, id, reply, token);
    if (!m) return;
    m->timeout_ms = timeout_ms;
    msg_post(s, m);
}

/* The reply of a message that answers nobody (a wait's cancel, refused or out of memory). */
static void reply_nobody(void *token, const sched_result_t *res)
{
    (void)token;
    (void)res;
}

void sched_wait_cancel(sched_t *s, const char *id, void *token)
{
    msg_t *m = msg_new_target(MSG_WAIT_CANCEL, NULL, id, reply_nobody, token);
    if (m) msg_post(s, m);
}

void sched_explain_jobs(sched_t *s, job_t *const *jobs, size_t n, sched_reply_fn reply, void *token)
{
    msg_t *m = msg_new(MSG_EXPLAIN, reply, token);
    if (!m) return;
    m->explain = jobs;
    m->n_explain = n;
    msg_post(s, m);
}

void sched_user_counts(sched_t *s, const char *owner, sched_reply_fn reply, void *token)
{
    msg_t *m = msg_new_target(MSG_USER_COUNTS, owner, "", reply, token);
    if (m) msg_post(s, m);
}

void sched_cancel(sched_t *s, const char *owner, const char *id, sched_reply_fn reply, void *token)
{
    msg_t *m = msg_new_target(MSG_CANCEL, owner, id, reply, token);
    if (m) msg_post(s, m);
}

int sched_upload_open(sched_t *s, uint64_t nbytes, exec_upload_t **ret)
{
    if (!atomic_load(&s->accepting)) return -ESHUTDOWN;
    if (!s->ex || !s->ex->ops->upload_open) return -EOPNOTSUPP;
    int device = s->ex->ops->place_buffer ? s->ex->ops->place_buffer(s->ex, nbytes) : -1;
    return s->ex->ops->upload_open(s->ex, device, nbytes, ret);
}

int sched_upload_write(exec_upload_t *up, const void *data, size_t n)
{
    if (n > up->nbytes - up->written) return -EFBIG;
    int r = up->ex->ops->upload_write(up, data, n);
    if (r == 0) up->written += n;
    return r;
}

void sched_upload_abort(exec_upload_t *up)
{
    if (up) up->ex->ops->upload_abort(up);
}

/* Gives an ephemeral buffer's bytes, streamed into up or held in buf->data (freed), to the
 * executor's resident copy, before its row exists: a job that finds the row finds the copy.
 * up is freed. 0, or a negative errno. */
static int buffer_keep_ephemeral(sched_t *s, buffer_t *buf, exec_upload_t *up)
{
    int r = up ? 0 : sched_upload_open(s, buf->nbytes, &up);
    if (r == 0 && buf->data) r = sched_upload_write(up, buf->data, buf->nbytes);
    free(buf->data);
    buf->data = NULL;
    if (r == 0 && up->written != up->nbytes) r = -EINVAL;
    if (r < 0) {
        sched_upload_abort(up);
        return r;
    }
    buf->device = up->device;
    return up->ex->ops->upload_keep(up, buf->id);
}

void sched_buffer_put_upload(sched_t *s, buffer_t *buf, exec_upload_t *up, sched_reply_fn reply,
                             void *token)
{
    msg_t *m = msg_new(MSG_BUF_PUT, reply, token);
    if (!m) {
        store_blob_discard(s->st, buf->blob);
        sched_upload_abort(up);
        buffer_free(buf);
        return;
    }
    m->buf = buf;
    if (!atomic_load(&s->accepting)) {
        store_blob_discard(s->st, buf->blob);
        sched_upload_abort(up);
        reply_stopping(reply, token);
        msg_free(m);
        return;
    }
    id_new('b', buf->id);
    buf->created_us = now_us();
    int r;
    if (!buf->durable) {
        r = buffer_keep_ephemeral(s, buf, up);
        if (r < 0) {
            reply_err(reply, token, r,
                      r == -ENOSPC  ? "no device has room for the ephemeral buffer"
                      : r == -EBUSY ? "too many ephemeral uploads to the device at once"
                                    : "the backend could not keep the ephemeral buffer");
            msg_free(m);
            return;
        }
    } else if (buf->data && buf->nbytes > s->cfg->inline_blob_bytes &&
               (r = store_blob_write(s->st, buf->data, buf->nbytes, &buf->blob)) < 0) {
        reply_err(reply, token, r == -ENOSPC ? r : -EIO, "could not persist the buffer");
        msg_free(m);
        return;
    }
    if (buf->resident && buf->durable && s->ex && s->ex->ops->place_buffer)
        buf->device = s->ex->ops->place_buffer(s->ex, buf->nbytes);
    msg_post(s, m);
}

void sched_buffer_put(sched_t *s, buffer_t *buf, sched_reply_fn reply, void *token)
{
    sched_buffer_put_upload(s, buf, NULL, reply, token);
}

void sched_buffer_delete(sched_t *s, const char *owner, const char *id, sched_reply_fn reply,
                         void *token)
{
    msg_t *m = msg_new_target(MSG_BUF_DELETE, owner, id, reply, token);
    if (m) msg_post(s, m);
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
        .watchdog_expired_total = atomic_load(&s->watchdog_expired_total),
        .stuck_batches = atomic_load(&s->stuck_batches),
        .store_bytes = atomic_load(&s->store_bytes),
        .store_expired_bytes_total = atomic_load(&s->store_expired_bytes_total),
        .store_expired_jobs_total = atomic_load(&s->store_expired_jobs_total),
        .store_deleted_jobs_total = atomic_load(&s->store_deleted_jobs_total),
    };
}

json_t *sched_describe_backend(sched_t *s)
{
    return s->ex ? s->ex->ops->describe(s->ex) : json_null();
}

bool sched_runs_op(sched_t *s, const op_def_t *op)
{
    return s->ex && op_supports(op, s->ex->ops->backend);
}

uint64_t sched_device_memory(sched_t *s, uint64_t *ret_largest, const char **ret_key)
{
    /* Set once, when the executor is installed, before any request. */
    *ret_largest = s->pool_largest;
    *ret_key = s->pool_key ? s->pool_key : "";
    return s->pool_bytes;
}

bool sched_time_limit_by_cost(sched_t *s)
{
    return s->ex && !s->ex->ops->stops_running;
}

bool sched_serves_device(sched_t *s, int device)
{
    return device >= 0 && s->ex && s->ex->ops->serves_device &&
           s->ex->ops->serves_device(s->ex, device);
}

bool sched_disk_full(sched_t *s, char *reason, size_t size)
{
    return store_disk_full(s->st, reason, size);
}

bool sched_store_damaged(sched_t *s, char *reason, size_t size)
{
    return store_damaged(s->st, reason, size);
}
