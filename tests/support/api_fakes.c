#include "support/api_fakes.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/json_write.h"

fake_sched_t fake_sched;

/* --- the op table --- */

static int tadd_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    double alpha;
    int r = op_param_double(params, "alpha", 1.0, &alpha, err);
    if (r < 0) return r;
    if (!dtype_is_float(call->in[0].dtype))
        return op_error(err, -EINVAL, "inputs.x.dtype", "x must have a float dtype");
    if (call->has_in[1] && !tensor_desc_equal(&call->in[0], &call->in[1]))
        return op_error(err, -EINVAL, "inputs.y.shape", "y must match x");
    memcpy(call->params.bytes, &alpha, sizeof alpha);
    call->n_out = 1;
    call->out_names[0] = "out";
    call->out[0] = call->in[0];
    /* alpha ms at 100 GFLOP/s (op_cost_ms), so that a test picks a job's estimate. */
    call->cost.flops = alpha > 0 ? alpha * 1e8 : 0;
    snprintf(call->batch_key, sizeof call->batch_key, "tadd");
    return 0;
}

static const char *const tadd_inputs[] = {"x", "y"};
static const char *const tadd_params[] = {"alpha", NULL};
static const op_def_t fake_tadd = {
    .name = "tadd",
    .summary = "out = alpha * x + y (test op)",
    .n_inputs = 2,
    .input_names = tadd_inputs,
    .required_inputs = 1,
    .param_names = tadd_params,
    .validate = tadd_validate,
};

const op_def_t *fake_find_op(const char *name)
{
    return strcmp(name, "tadd") == 0 ? &fake_tadd : NULL;
}

/* --- the store --- */

typedef struct fake_blob {
    char locator[32];
    void *data;
    uint64_t nbytes;
} fake_blob_t;

static job_t *stored_jobs[64];
static int n_stored_jobs;
static buffer_t *stored_buffers[64];
static int n_stored_buffers;
static fake_blob_t blobs[256];
static int n_blobs;
static int reader_token;

store_reader_t *fake_reader(void)
{
    return (store_reader_t *)(void *)&reader_token;
}

/* Keeps a copy of nbytes of data as a blob; returns its new locator. */
static char *blob_keep(const void *data, uint64_t nbytes)
{
    fake_blob_t *b = &blobs[n_blobs];
    snprintf(b->locator, sizeof b->locator, "fake:%d", n_blobs++);
    b->data = malloc(nbytes ? nbytes : 1);
    memcpy(b->data, data, nbytes);
    b->nbytes = nbytes;
    return strdup(b->locator);
}

/* A deep copy without in-memory bytes: like the real store, tensors come back with locators. */
static job_t *job_copy(const job_t *src)
{
    job_t *job = job_new();
    *job = *src;
    job->params_json = src->params_json ? strdup(src->params_json) : NULL;
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        job_tensor_t *ts[2] = {&job->in[j], &job->out[j]};
        const job_tensor_t *ss[2] = {&src->in[j], &src->out[j]};
        for (int k = 0; k < 2; k++) {
            ts[k]->data = NULL;
            ts[k]->blob = ss[k]->blob ? strdup(ss[k]->blob) : NULL;
        }
    }
    return job;
}

void fake_store_add_job(const job_t *job)
{
    job_t *copy = job_copy(job);
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        job_tensor_t *ts[2] = {&copy->in[j], &copy->out[j]};
        const job_tensor_t *ss[2] = {&job->in[j], &job->out[j]};
        for (int k = 0; k < 2; k++)
            if (ss[k]->data && !ts[k]->blob) ts[k]->blob = blob_keep(ss[k]->data, ss[k]->nbytes);
    }
    stored_jobs[n_stored_jobs++] = copy;
}

void fake_store_add_buffer(const buffer_t *buf)
{
    buffer_t *copy = buffer_new();
    *copy = *buf;
    copy->data = NULL;
    copy->blob = NULL;
    stored_buffers[n_stored_buffers++] = copy;
}

int store_job_get(store_reader_t *rd, const char *id, job_t **ret)
{
    for (int i = 0; i < n_stored_jobs; i++)
        if (strcmp(stored_jobs[i]->id, id) == 0) {
            *ret = job_copy(stored_jobs[i]);
            return 0;
        }
    return -ENOENT;
}

int store_job_find_idempotent(store_reader_t *rd, const char *owner, const char *key,
                              char ret_id[ID_SIZE])
{
    for (int i = 0; i < n_stored_jobs; i++)
        if (strcmp(stored_jobs[i]->owner, owner) == 0 &&
            strcmp(stored_jobs[i]->idempotency_key, key) == 0) {
            memcpy(ret_id, stored_jobs[i]->id, ID_SIZE);
            return 0;
        }
    return -ENOENT;
}

int store_jobs_list(store_reader_t *rd, const store_list_query_t *q, job_t ***ret_jobs,
                    size_t *ret_n)
{
    job_t **jobs = calloc((size_t)n_stored_jobs + 1, sizeof *jobs);
    size_t n = 0;
    /* Stored in id order by the tests. */
    for (int i = 0; i < n_stored_jobs && n < (size_t)q->limit; i++) {
        const job_t *job = stored_jobs[i];
        if ((q->owner && strcmp(job->owner, q->owner) != 0) ||
            (q->state >= 0 && (int)job->state != q->state) ||
            (q->op && strcmp(job->call.op->name, q->op) != 0) ||
            (q->after && strcmp(job->id, q->after) <= 0))
            continue;
        jobs[n++] = job_copy(job);
    }
    *ret_jobs = jobs;
    *ret_n = n;
    return 0;
}

bool store_blob_expired(const char *blob)
{
    return blob && strcmp(blob, "expired:") == 0;
}

int store_blob_read(store_reader_t *rd, const char *blob, uint64_t nbytes, void **ret_data)
{
    for (int i = 0; i < n_blobs; i++)
        if (strcmp(blobs[i].locator, blob) == 0) {
            if (blobs[i].nbytes != nbytes) return -EIO;
            void *data = malloc(nbytes ? nbytes : 1);
            memcpy(data, blobs[i].data, nbytes);
            *ret_data = data;
            return 0;
        }
    return -ENOENT;
}

int store_buffer_get(store_reader_t *rd, const char *id, buffer_t **ret)
{
    for (int i = 0; i < n_stored_buffers; i++)
        if (strcmp(stored_buffers[i]->id, id) == 0) {
            buffer_t *copy = buffer_new();
            *copy = *stored_buffers[i];
            *ret = copy;
            return 0;
        }
    return -ENOENT;
}

int store_usage_get(store_reader_t *rd, const char *owner, store_usage_t *ret)
{
    store_usage_t u = {0};
    snprintf(u.owner, sizeof u.owner, "%s", owner ? owner : "*");
    for (int i = 0; i < n_stored_jobs; i++)
        if (!owner || strcmp(stored_jobs[i]->owner, owner) == 0) {
            u.jobs_by_state[stored_jobs[i]->state]++;
            u.gpu_ns += stored_jobs[i]->gpu_ns;
        }
    for (int i = 0; i < n_stored_buffers; i++)
        if (!owner || strcmp(stored_buffers[i]->owner, owner) == 0) {
            u.buffers++;
            u.buffer_bytes += (int64_t)stored_buffers[i]->nbytes;
        }
    *ret = u;
    return 0;
}

/* The rollup as a row per stored final job of the query's owner (every day matches). */
int store_usage_rollup(store_reader_t *rd, const store_usage_query_t *q,
                       store_usage_row_t **ret_rows, size_t *ret_n)
{
    (void)rd;
    store_usage_row_t *rows = calloc((size_t)n_stored_jobs + 1, sizeof *rows);
    size_t n = 0;
    if (!rows) return -ENOMEM;
    for (int i = 0; i < n_stored_jobs; i++) {
        const job_t *job = stored_jobs[i];
        if ((q->owner && strcmp(job->owner, q->owner) != 0) || !job_state_is_final(job->state))
            continue;
        store_usage_row_t *r = &rows[n++];
        snprintf(r->owner, sizeof r->owner, "%s", job->owner);
        snprintf(r->op, sizeof r->op, "%s", job_op_name(job) ? job_op_name(job) : "");
        r->jobs = 1;
        r->succeeded = job->state == JOB_SUCCEEDED;
        r->failed = job->state == JOB_FAILED;
        r->cancelled = job->state == JOB_CANCELLED;
        r->gpu_ns = job->gpu_ns;
    }
    *ret_rows = rows;
    *ret_n = n;
    return 0;
}

/* --- the scheduler --- */

static void record_target(const char *owner, const char *id)
{
    fake_sched.last_owner_was_null = owner == NULL;
    snprintf(fake_sched.last_owner, sizeof fake_sched.last_owner, "%s", owner ? owner : "");
    snprintf(fake_sched.last_id, sizeof fake_sched.last_id, "%s", id ? id : "");
}

void sched_submit(sched_t *s, job_t **jobs, size_t n, sched_reply_fn reply, void *token)
{
    fake_sched.submits++;
    fake_sched.last_n = n;
    sched_result_t res = {.err = fake_sched.next_err, .message = fake_sched.next_message};
    if (!res.err && fake_sched.retry_job) {
        res.jobs = (job_t *const *)&fake_sched.retry_job;
        res.n_jobs = 1;
        res.replayed = true;
    } else if (!res.err) {
        res.jobs = jobs;
        res.n_jobs = n;
    }
    reply(token, &res);
    /* The scheduler owns the jobs and their array, also on error. */
    for (size_t i = 0; i < n; i++) {
        if (!res.err && fake_sched.n_submitted < 64)
            fake_sched.submitted[fake_sched.n_submitted++] = jobs[i];
        else
            job_free(jobs[i]);
    }
    free(jobs);
}

/* A waited submission answers as a submission does here, its wait recorded as a wait's. */
void sched_submit_waited(sched_t *s, job_t **jobs, size_t n, int wait_ms, uint64_t inline_max,
                         sched_reply_fn reply, void *token)
{
    (void)inline_max;
    fake_sched.last_timeout_ms = wait_ms;
    sched_submit(s, jobs, n, reply, token);
}

static void reply_job(sched_reply_fn reply, void *token)
{
    sched_result_t res = {.err = fake_sched.next_err, .message = fake_sched.next_message};
    if (!res.err) {
        res.jobs = (job_t *const *)&fake_sched.reply_job;
        res.n_jobs = fake_sched.reply_job ? 1 : 0;
    }
    reply(token, &res);
}

void sched_wait(sched_t *s, const char *owner, const char *id, int timeout_ms, sched_reply_fn reply,
                void *token)
{
    fake_sched.waits++;
    fake_sched.last_timeout_ms = timeout_ms;
    record_target(owner, id);
    reply_job(reply, token);
}

/* The fake's waits are answered at once: nothing is left to cancel. */
void sched_wait_cancel(sched_t *s, const char *id, void *token) {}

/* The fake explains nothing: the jobs come back as they were lent. */
void sched_explain_jobs(sched_t *s, job_t *const *jobs, size_t n, sched_reply_fn reply, void *token)
{
    sched_result_t res = {.jobs = jobs, .n_jobs = n};
    reply(token, &res);
}

void sched_cancel(sched_t *s, const char *owner, const char *id, sched_reply_fn reply, void *token)
{
    fake_sched.cancels++;
    record_target(owner, id);
    reply_job(reply, token);
}

void sched_buffer_put(sched_t *s, buffer_t *buf, sched_reply_fn reply, void *token)
{
    fake_sched.buffer_puts++;
    sched_result_t res = {.err = fake_sched.next_err, .message = fake_sched.next_message};
    if (!res.err) res.buffer = buf;
    reply(token, &res);
    buffer_free(fake_sched.last_buffer);
    fake_sched.last_buffer = buf;
}

/* The fake keeps no resident copies, as a backend without upload hooks. */
int sched_upload_open(sched_t *s, uint64_t nbytes, exec_upload_t **ret)
{
    return -EOPNOTSUPP;
}

int sched_upload_write(exec_upload_t *up, const void *data, size_t n)
{
    return -EIO;
}

void sched_upload_abort(exec_upload_t *up) {}

void sched_buffer_put_upload(sched_t *s, buffer_t *buf, exec_upload_t *up, sched_reply_fn reply,
                             void *token)
{
    sched_buffer_put(s, buf, reply, token);
}

void sched_buffer_delete(sched_t *s, const char *owner, const char *id, sched_reply_fn reply,
                         void *token)
{
    fake_sched.buffer_deletes++;
    record_target(owner, id);
    sched_result_t res = {.err = fake_sched.next_err, .message = fake_sched.next_message};
    reply(token, &res);
}

/* The default policy ([limits] as config_defaults has them), made on first use. */
policy_t *sched_policy(sched_t *s)
{
    static policy_t *policy;
    if (!policy) {
        static config_t cfg;
        config_defaults(&cfg);
        if (policy_new(&cfg, &policy) < 0) abort();
    }
    return policy_ref(policy);
}

unsigned sched_policy_generation(sched_t *s)
{
    return 1;
}

void sched_get_stats(sched_t *s, sched_stats_t *ret)
{
    *ret = fake_sched.stats;
}

int sched_get_user_gauges(sched_t *s, sched_user_gauge_t *ret, int cap, long *ret_users)
{
    int n = fake_sched.n_user_gauges < cap ? fake_sched.n_user_gauges : cap;
    memcpy(ret, fake_sched.user_gauges, (size_t)n * sizeof *ret);
    *ret_users = fake_sched.users_with_jobs;
    return n;
}

/* The fake's loop counts the rows its gauges hold, whatever the owner. */
void sched_user_counts(sched_t *s, const char *owner, sched_reply_fn reply, void *token)
{
    sched_result_t res = {.users = fake_sched.user_gauges,
                          .n_users = (size_t)fake_sched.n_user_gauges};
    reply(token, &res);
}

/* Empty histograms: only their +Inf buckets, at 0. */
void sched_get_histograms(sched_t *s, sched_histograms_t *ret)
{
    *ret = (sched_histograms_t){0};
}

bool sched_disk_full(sched_t *s, char *reason, size_t size)
{
    snprintf(reason, size, "fake");
    return false;
}

bool sched_store_damaged(sched_t *s, char *reason, size_t size)
{
    (void)s;
    (void)reason;
    (void)size;
    return false;
}

json_t *sched_describe_backend(sched_t *s)
{
    return fake_sched.backend_json ? json_loads(fake_sched.backend_json, 0, NULL)
                                   : json_pack("{s:s}", "name", "fake");
}

bool sched_runs_op(sched_t *s, const op_def_t *op)
{
    return !fake_sched.unsupported_op || strcmp(op->name, fake_sched.unsupported_op) != 0;
}

uint64_t sched_device_memory(sched_t *s, uint64_t *ret_largest, const char **ret_key)
{
    *ret_largest = 0;
    *ret_key = "";
    return 0;
}

bool sched_time_limit_by_cost(sched_t *s)
{
    return false;
}

bool sched_serves_device(sched_t *s, int device)
{
    return false;
}

void fakes_reset(void)
{
    for (int i = 0; i < fake_sched.n_submitted; i++)
        job_free(fake_sched.submitted[i]);
    buffer_free(fake_sched.last_buffer);
    memset(&fake_sched, 0, sizeof fake_sched);
    fake_sched.stats.accepting = true;
    for (int i = 0; i < n_stored_jobs; i++)
        job_free(stored_jobs[i]);
    for (int i = 0; i < n_stored_buffers; i++)
        buffer_free(stored_buffers[i]);
    for (int i = 0; i < n_blobs; i++)
        free(blobs[i].data);
    n_stored_jobs = n_stored_buffers = n_blobs = 0;
}

json_t *fake_as_sent(const json_t *v)
{
    char *text;
    size_t len;
    if (json_write(v, &text, &len) < 0) {
        fprintf(stderr, "fake_as_sent: the writer failed\n");
        abort();
    }
    json_error_t jerr;
    json_t *back = json_loadb(text, len, JSON_DECODE_ANY, &jerr);
    if (!back) {
        fprintf(stderr, "fake_as_sent: the writer wrote bad JSON (%s): %s\n", jerr.text, text);
        abort();
    }
    free(text);
    return back;
}
