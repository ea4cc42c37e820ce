/* Handlers of /v1/jobs: submit (to the scheduler), list and get (from the store), wait and
 * cancel (through the scheduler), and output downloads. */
#include "api_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_codec.h"

/* Reads an output's bytes through the calling thread's reader (for inlining). */
static int load_tensor(void *ud, const job_tensor_t *t, void **ret_data)
{
    api_env_t *env = ud;
    store_reader_t *rd = t->blob ? env->reader(env) : NULL;
    if (!rd) return -ENOENT;
    return store_blob_read(rd, t->blob, t->nbytes, ret_data);
}

json_t *api_job_json(const job_t *job)
{
    return job_json_from_job(job, 0, NULL, NULL, NULL);
}

json_t *api_jobs_json(job_t *const *jobs, size_t n, bool list)
{
    if (!list) return n ? api_job_json(jobs[0]) : NULL;
    json_t *body = json_array();
    for (size_t i = 0; body && i < n; i++)
        json_array_append_new(body, api_job_json(jobs[i]));
    return body;
}

/* True when the Accept header names application/octet-stream before application/json (a
 * client that reads binary sections); absent, or naming neither, JSON. */
static bool accepts_binary(const api_request_t *req)
{
    for (const char *item = req->accept ? req->accept : ""; *item;) {
        size_t len = strcspn(item, ",");
        if (api_media_is(item, len, "application/json")) return false;
        if (api_media_is(item, len, "application/octet-stream")) return true;
        item += len;
        if (*item == ',') item++;
    }
    return false;
}

void api_respond_job(api_request_t *req, int status, const job_t *job)
{
    job_json_section_t section = {0};
    bool binary = accepts_binary(req);
    json_t *o = job_json_from_job(job, req->env->cfg->max_inline_output_bytes, load_tensor,
                                  req->env, binary ? &section : NULL);
    api_respond_json(req, status, o);
    if (o && binary) {
        req->resp.framed = true;
        req->resp.section = section;
    } else {
        free(section.bytes);
    }
}

/* Checks a job id given in field (the {id} path parameter, or a query parameter). 0, or
 * API_DONE when it answered 400. */
static int check_job_id(api_request_t *req, const char *id, const char *field)
{
    if (!id_valid('j', id)) {
        api_respond_error(req, 400, "invalid_argument", field,
                          "'%.40s' is not a job id ('j' and 24 hex digits)", id ? id : "");
        return API_DONE;
    }
    return 0;
}

/* Loads job id, given in field, if the user may see it; else answers 400/404/503 and returns
 * API_DONE. Another owner's job answers 404, as if it did not exist. */
static int load_visible_job_id(api_request_t *req, const char *id, const char *field, job_t **ret)
{
    if (check_job_id(req, id, field)) return API_DONE;
    store_reader_t *rd = api_request_reader(req);
    if (!rd) return API_DONE;
    job_t *job = NULL;
    int r = store_job_get(rd, id, &job);
    if (r == 0 && !api_request_may_see(req, job->owner)) {
        job_free(job);
        r = -ENOENT;
    }
    if (r == -ENOENT) {
        api_respond_error(req, 404, "not_found", field, "job '%s' not found", id);
        return API_DONE;
    }
    if (r < 0) {
        api_respond_errno(req, r, "reading the job failed");
        return API_DONE;
    }
    *ret = job;
    return 0;
}

/* load_visible_job_id for the job of the {id} path parameter. */
static int load_visible_job(api_request_t *req, job_t **ret)
{
    return load_visible_job_id(req, api_path_param(req, "id"), "id", ret);
}

int api_job_output_find(api_request_t *req, const char *id, const char *id_field, const char *name,
                        const char *name_field, job_t **ret_job, const job_tensor_t **ret_t)
{
    job_t *job;
    if (load_visible_job_id(req, id, id_field, &job)) return API_DONE;
    if (job->state != JOB_SUCCEEDED) {
        api_respond_error(req, 409, "conflict", id_field,
                          "job '%s' is %s; outputs exist once it has succeeded", job->id,
                          job_state_name(job->state));
        job_free(job);
        return API_DONE;
    }
    const job_tensor_t *t = NULL;
    for (int j = 0; j < OP_MAX_TENSORS && !t; j++)
        if (job->out[j].name[0] && strcmp(job->out[j].name, name) == 0) t = &job->out[j];
    if (!t) {
        api_respond_error(req, 404, "not_found", name_field, "job '%s' has no output '%.64s'",
                          job->id, name);
        job_free(job);
        return API_DONE;
    }
    *ret_job = job;
    *ret_t = t;
    return 0;
}

int api_job_output_read(api_request_t *req, const job_tensor_t *t, void **ret_bytes)
{
    void *bytes = NULL;
    int r = 0;
    if (t->data) {
        bytes = malloc(t->nbytes ? t->nbytes : 1);
        if (!bytes)
            r = -ENOMEM;
        else
            memcpy(bytes, t->data, t->nbytes);
    } else if (t->blob) {
        r = store_blob_read(req->env->reader(req->env), t->blob, t->nbytes, &bytes);
    } else {
        r = -EIO;
    }
    if (r < 0) {
        api_respond_errno(req, r == -ENOENT ? -EIO : r, "reading the output failed");
        return API_DONE;
    }
    *ret_bytes = bytes;
    return 0;
}

/* Descriptor of a buffer the submitting user may use (job_json_env_t.buffer_desc). */
static int visible_buffer_desc(void *ud, const char *owner, const char *id, tensor_desc_t *ret,
                               int *ret_device)
{
    api_request_t *req = ud;
    store_reader_t *rd = req->env->reader(req->env);
    if (!rd) return -EIO;
    buffer_t *buf = NULL;
    int r = store_buffer_get(rd, id, &buf);
    if (r < 0) return r;
    if (!api_request_may_see(req, buf->owner)) r = -ENOENT;
    if (r == 0) {
        *ret = buf->desc;
        *ret_device =
            buf->resident && sched_serves_device(req->env->sched, buf->device) ? buf->device : -1;
    }
    buffer_free(buf);
    return r;
}

/* Job id from the store when it has ended and the user may see it; else NULL. */
static job_t *stored_if_ended(api_request_t *req, const char *id)
{
    store_reader_t *rd = req->env->reader(req->env);
    job_t *job = NULL;
    if (rd && store_job_get(rd, id, &job) == 0 && job_state_is_final(job->state) &&
        api_request_may_see(req, job->owner))
        return job;
    job_free(job);
    return NULL;
}

/* Answers a submission with ?wait= once its job has ended or the wait is over: the job as it
 * stands then, outputs inlined, as a wait answers it. If the wait itself fails (the daemon is
 * stopping), the job is still accepted: the answer is the submission's own. */
static void submit_wait_reply(void *token, const sched_result_t *res)
{
    api_request_t *req = token;
    json_t *body = req->submit_answer;
    req->submit_answer = NULL;
    if (!res->err && res->n_jobs > 0) {
        json_decref(body);
        api_respond_job(req, req->submit_status, res->jobs[0]);
    } else {
        api_respond_json(req, req->submit_status, body);
    }
    api_request_resume(req);
}

static void submit_reply(void *token, const sched_result_t *res)
{
    api_request_t *req = token;
    /* An idempotent retry is answered with the jobs the first submission created. */
    int status = res->replayed ? 200 : 201;
    /* With sync_full this runs once the acceptance is durable, by when a tiny job has often
     * ended: a ?wait= is answered from the store then, without a trip through the loop. */
    job_t *ended = !res->err && res->n_jobs > 0 && req->submit_waits && req->env->cfg->sync_full
                       ? stored_if_ended(req, res->jobs[0]->id)
                       : NULL;
    if (res->err) {
        api_respond_errno(req, res->err, res->message);
    } else if (res->n_jobs == 0) {
        api_respond_error(req, 500, "internal", NULL, "the scheduler returned no job");
    } else if (ended) {
        api_respond_job(req, status, ended);
        job_free(ended);
    } else if (!req->submit_waits && res->take_jobs) {
        /* Shown by the HTTP thread that sends the answer, not by this one. */
        *res->take_jobs = true;
        api_respond_jobs_later(req, status, (job_t **)res->jobs, res->n_jobs, req->submit_is_list);
    } else {
        json_t *body = api_jobs_json(res->jobs, res->n_jobs, req->submit_is_list);
        if (req->submit_waits) {
            req->submit_status = status;
            req->submit_answer = body;
            sched_wait(req->env->sched, api_request_owner_filter(req), res->jobs[0]->id,
                       req->submit_wait_ms, submit_wait_reply, req);
            return;
        }
        api_respond_json(req, status, body);
    }
    api_request_resume(req);
}

/* Answers a retried submission from the store when its key already names jobs: 1 when it
 * answered, 0 when the key is new (or only partly known: the scheduler then decides). */
static int answer_known_idempotent(api_request_t *req, store_reader_t *rd, const char *key,
                                   size_t n, bool is_list)
{
    json_t *list = json_array();
    job_t *first = NULL;
    for (size_t i = 0; i < n; i++) {
        char full[IDEM_KEY_SIZE], id[ID_SIZE];
        job_t *job = NULL;
        if (is_list)
            snprintf(full, sizeof full, "%s:%zu", key, i);
        else
            snprintf(full, sizeof full, "%s", key);
        if (store_job_find_idempotent(rd, req->user.name, full, id) < 0 ||
            store_job_get(rd, id, &job) < 0) {
            json_decref(list);
            job_free(first);
            return 0;
        }
        json_array_append_new(list, api_job_json(job));
        if (!first)
            first = job;
        else
            job_free(job);
    }
    if (is_list) {
        api_respond_json(req, 200, list);
    } else {
        json_decref(list);
        api_respond_json(req, 200, api_job_json(first));
    }
    job_free(first);
    return 1;
}

/* Idempotency-Key: 1..IDEM_KEY_SIZE-1 printable ASCII characters. */
static bool idempotency_key_valid(const char *key)
{
    size_t len = strlen(key);
    if (len == 0 || len >= IDEM_KEY_SIZE) return false;
    for (size_t i = 0; i < len; i++)
        if (key[i] < 0x20 || key[i] > 0x7e) return false;
    return true;
}

/* How long to wait, from query parameter key (seconds; default_s when absent), at most
 * limits.max_wait_ms: longer is cut down to it when clamp, else refused. 0 with *ret_ms set, or
 * API_DONE after answering 400. */
static int wait_query(api_request_t *req, const char *key, double default_s, bool clamp,
                      int *ret_ms)
{
    double max_s = req->env->cfg->max_wait_ms / 1000.0, s = default_s;
    const char *v = api_query(req, key);
    if (v) {
        char *end;
        s = strtod(v, &end);
        if (!*v || *end || !isfinite(s) || s < 0 || (!clamp && s > max_s)) {
            char field[32];
            snprintf(field, sizeof field, "query.%s", key);
            api_respond_error(req, 400, "invalid_argument", field,
                              "%s must be a number of seconds in [0, %g]", key, max_s);
            return API_DONE;
        }
    }
    *ret_ms = (int)(fmin(s, max_s) * 1000.0);
    return 0;
}

int api_handle_jobs_submit(api_request_t *req)
{
    static const char *const allowed[] = {"wait", NULL};
    if (api_query_check(req, allowed)) return API_DONE;
    req->submit_waits = api_query(req, "wait") != NULL;
    /* A job is not refused for wanting a long wait: the wait is cut to the limit. */
    if (req->submit_waits && wait_query(req, "wait", 0, true, &req->submit_wait_ms))
        return API_DONE;
    /* curl -d labels its body application/x-www-form-urlencoded unless told otherwise; the
     * body is JSON all the same, so that label is accepted too. With Gpujob-Json-Length, the
     * body is that many bytes of JSON and then the bytes its tensors name (binary_offset):
     * no base64 to encode, lex and decode. */
    const char *ct = req->content_type;
    size_t json_len = req->body_len;
    if (req->json_length) {
        if (!ct || !api_media_is(ct, strlen(ct), "application/octet-stream")) {
            api_respond_error(req, 415, "unsupported_media_type", "header.Content-Type",
                              "a body with Gpujob-Json-Length is application/octet-stream");
            return API_DONE;
        }
        char *end;
        errno = 0;
        unsigned long long n = strtoull(req->json_length, &end, 10);
        if (!isdigit((unsigned char)req->json_length[0]) || *end || errno || n > req->body_len) {
            api_respond_error(req, 400, "invalid_argument", "header.Gpujob-Json-Length",
                              "Gpujob-Json-Length must be the byte length of the JSON at the "
                              "start of the body (at most %zu)",
                              req->body_len);
            return API_DONE;
        }
        json_len = (size_t)n;
    } else if (ct && !api_media_is(ct, strlen(ct), "application/json") &&
               !api_media_is(ct, strlen(ct), "application/x-www-form-urlencoded")) {
        api_respond_error(req, 415, "unsupported_media_type", "header.Content-Type",
                          "jobs are submitted as application/json, or as "
                          "application/octet-stream with Gpujob-Json-Length");
        return API_DONE;
    }
    const char *key = req->idempotency_key;
    if (key && !idempotency_key_valid(key)) {
        api_respond_error(req, 400, "invalid_argument", "header.Idempotency-Key",
                          "Idempotency-Key must be 1 to %d printable ASCII characters",
                          IDEM_KEY_SIZE - 1);
        return API_DONE;
    }
    json_error_t jerr;
    json_t *root = json_loadb(req->body ? req->body : "", json_len,
                              JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) {
        api_respond_error(req, 400, "invalid_json", "body", "invalid JSON at line %d column %d: %s",
                          jerr.line, jerr.column, jerr.text);
        return API_DONE;
    }
    job_json_env_t penv = {
        .cfg = req->env->cfg,
        .owner = req->user.name,
        .now_us = now_us(),
        .find_op = req->env->find_op,
        .buffer_desc = visible_buffer_desc,
        .ud = req,
        .binary = req->json_length ? (const unsigned char *)req->body + json_len : NULL,
        .binary_len = req->body_len - json_len,
    };
    job_t **jobs = NULL;
    size_t n = 0;
    bool is_list = false;
    api_error_t err;
    int r = job_json_parse_request(root, &penv, key, &jobs, &n, &is_list, &err);
    json_decref(root);
    if (r < 0) {
        api_respond_api_error(req, &err);
        return API_DONE;
    }
    if (req->submit_waits && is_list) {
        job_json_free_jobs(jobs, n);
        api_respond_error(req, 400, "invalid_argument", "query.wait",
                          "wait is for a single job; wait for each job of a list with GET "
                          "/v1/jobs/{id}/wait");
        return API_DONE;
    }
    /* With sync_full the rows read here may not be on disk yet (their commit's 201 may still be
     * waiting for its sync): the scheduler then answers the retry, after a sync. A retry that
     * waits goes to the scheduler too. */
    store_reader_t *rd =
        key && !req->env->cfg->sync_full && !req->submit_waits ? req->env->reader(req->env) : NULL;
    if (rd && answer_known_idempotent(req, rd, key, n, is_list)) {
        job_json_free_jobs(jobs, n);
        return API_DONE;
    }
    req->submit_is_list = is_list;
    api_request_suspend(req);
    /* The scheduler takes the jobs and the array, also on error. */
    sched_submit(req->env->sched, jobs, n, submit_reply, req);
    return API_PENDING;
}

/* A decimal integer filling the whole string, in [lo, hi]. */
static bool parse_int_arg(const char *s, long lo, long hi, long *ret)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return false;
    *ret = v;
    return true;
}

int api_handle_jobs_list(api_request_t *req)
{
    static const char *const allowed[] = {"state", "op", "limit", "after", NULL};
    if (api_query_check(req, allowed)) return API_DONE;
    store_list_query_t q = {.owner = api_request_owner_filter(req), .state = -1, .limit = 100};
    const char *v;
    if ((v = api_query(req, "state"))) {
        job_state_t state;
        if (job_state_parse(v, &state) < 0) {
            api_respond_error(req, 400, "invalid_argument", "query.state",
                              "state must be one of queued, running, succeeded, failed, "
                              "cancelled");
            return API_DONE;
        }
        q.state = (int)state;
    }
    if ((v = api_query(req, "op"))) {
        if (!req->env->find_op(v)) {
            api_respond_error(req, 400, "invalid_argument", "query.op", "unknown op '%.64s'", v);
            return API_DONE;
        }
        q.op = v;
    }
    if ((v = api_query(req, "limit"))) {
        long limit;
        if (!parse_int_arg(v, 1, 1000, &limit)) {
            api_respond_error(req, 400, "invalid_argument", "query.limit",
                              "limit must be an integer in [1, 1000]");
            return API_DONE;
        }
        q.limit = (int)limit;
    }
    if ((v = api_query(req, "after"))) {
        if (!id_valid('j', v)) {
            api_respond_error(req, 400, "invalid_argument", "query.after",
                              "after must be a job id (the previous page's next)");
            return API_DONE;
        }
        q.after = v;
    }
    store_reader_t *rd = api_request_reader(req);
    if (!rd) return API_DONE;
    job_t **jobs = NULL;
    size_t n = 0;
    int r = store_jobs_list(rd, &q, &jobs, &n);
    if (r < 0) {
        api_respond_errno(req, r, "listing jobs failed");
        return API_DONE;
    }
    json_t *list = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(list, api_job_json(jobs[i]));
    json_t *next = n == (size_t)q.limit && n > 0 ? json_string(jobs[n - 1]->id) : json_null();
    job_json_free_jobs(jobs, n);
    api_respond_json(req, 200, json_pack("{s:o, s:o}", "jobs", list, "next", next));
    return API_DONE;
}

int api_handle_job_get(api_request_t *req)
{
    static const char *const no_args[] = {NULL};
    if (api_query_check(req, no_args)) return API_DONE;
    job_t *job;
    if (load_visible_job(req, &job)) return API_DONE;
    api_respond_job(req, 200, job);
    job_free(job);
    return API_DONE;
}

/* Replies of wait and cancel: the job as it stands, outputs inlined. */
static void job_reply(void *token, const sched_result_t *res)
{
    api_request_t *req = token;
    if (res->err == -ENOENT)
        api_respond_error(req, 404, "not_found", "id", "job '%s' not found",
                          api_path_param(req, "id"));
    else if (res->err == -EBUSY)
        api_respond_error(req, 409, "conflict", NULL, "%s",
                          res->message ? res->message : "the job has already finished");
    else if (res->err)
        api_respond_errno(req, res->err, res->message);
    else if (res->n_jobs == 0)
        api_respond_error(req, 500, "internal", NULL, "the scheduler returned no job");
    else
        api_respond_job(req, 200, res->jobs[0]);
    api_request_resume(req);
}

int api_handle_job_wait(api_request_t *req)
{
    static const char *const allowed[] = {"timeout", NULL};
    if (api_query_check(req, allowed)) return API_DONE;
    const char *id = api_path_param(req, "id");
    if (check_job_id(req, id, "id")) return API_DONE;
    int timeout_ms;
    if (wait_query(req, "timeout", 30.0, false, &timeout_ms)) return API_DONE;
    /* A job that has ended is answered here, from the store, without the scheduler's loop (a
     * job's bottleneck): by the time its 201 arrives a tiny job has often ended already, as it
     * runs while its acceptance is synced. */
    job_t *ended = stored_if_ended(req, id);
    if (ended) {
        api_respond_job(req, 200, ended);
        job_free(ended);
        return API_DONE;
    }
    api_request_suspend(req);
    sched_wait(req->env->sched, api_request_owner_filter(req), id, timeout_ms, job_reply, req);
    return API_PENDING;
}

int api_handle_job_cancel(api_request_t *req)
{
    static const char *const no_args[] = {NULL};
    if (api_query_check(req, no_args)) return API_DONE;
    const char *id = api_path_param(req, "id");
    if (check_job_id(req, id, "id")) return API_DONE;
    api_request_suspend(req);
    sched_cancel(req->env->sched, api_request_owner_filter(req), id, job_reply, req);
    return API_PENDING;
}

typedef enum output_format { FORMAT_JSON, FORMAT_RAW, FORMAT_NPY } output_format_t;

/* Picks the format from ?format= or else the Accept header (first acceptable item wins; no
 * header means JSON). 0, or API_DONE after answering 400/406. */
static int choose_format(api_request_t *req, output_format_t *ret)
{
    static const struct {
        const char *query, *media;
        output_format_t format;
    } formats[] = {
        {"json", "application/json", FORMAT_JSON}, {"raw", "application/octet-stream", FORMAT_RAW},
        {"npy", "application/x-npy", FORMAT_NPY},  {NULL, "*/*", FORMAT_JSON},
        {NULL, "application/*", FORMAT_JSON},
    };
    const char *q = api_query(req, "format");
    if (q) {
        for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
            if (formats[i].query && strcmp(formats[i].query, q) == 0) {
                *ret = formats[i].format;
                return 0;
            }
        api_respond_error(req, 400, "invalid_argument", "query.format",
                          "format must be json, raw or npy");
        return API_DONE;
    }
    const char *accept = req->accept;
    if (!accept || !*accept) {
        *ret = FORMAT_JSON;
        return 0;
    }
    for (const char *item = accept; *item;) {
        size_t len = strcspn(item, ",");
        for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
            if (api_media_is(item, len, formats[i].media)) {
                *ret = formats[i].format;
                return 0;
            }
        item += len;
        if (*item == ',') item++;
    }
    api_respond_error(req, 406, "not_acceptable", "header.Accept",
                      "outputs are served as application/json, application/octet-stream or "
                      "application/x-npy");
    return API_DONE;
}

static void respond_output(api_request_t *req, const job_tensor_t *t, output_format_t format,
                           void *bytes)
{
    char shape[160];
    switch (format) {
    case FORMAT_RAW:
        api_respond_bytes(req, 200, "application/octet-stream", bytes, t->nbytes);
        api_response_add_header(&req->resp, "X-Dtype", "%s", dtype_name(t->desc.dtype));
        shape[0] = '\0';
        for (int i = 0; i < t->desc.ndim; i++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", i ? "," : "",
                     (long long)t->desc.shape[i]);
        api_response_add_header(&req->resp, "X-Shape", "%s", shape);
        return;
    case FORMAT_NPY: {
        void *file;
        size_t len;
        int r = codec_npy_write(&t->desc, bytes, &file, &len);
        free(bytes);
        if (r == -ENOTSUP)
            api_respond_error(req, 406, "not_acceptable", "header.Accept",
                              "dtype %s has no .npy equivalent; ask for "
                              "application/octet-stream",
                              dtype_name(t->desc.dtype));
        else if (r < 0)
            api_respond_errno(req, r, "writing the .npy file failed");
        else
            api_respond_bytes(req, 200, "application/x-npy", file, len);
        return;
    }
    case FORMAT_JSON: {
        json_t *o = job_json_tensor_desc(&t->desc);
        json_object_set_new(o, "name", json_string(t->name));
        json_object_set_new(o, "data", codec_data_to_json(&t->desc, bytes));
        free(bytes);
        api_respond_json(req, 200, o);
        return;
    }
    }
}

int api_handle_job_output(api_request_t *req)
{
    static const char *const allowed[] = {"format", NULL};
    if (api_query_check(req, allowed)) return API_DONE;
    output_format_t format = FORMAT_JSON;
    if (choose_format(req, &format)) return API_DONE;
    job_t *job;
    const job_tensor_t *t;
    if (api_job_output_find(req, api_path_param(req, "id"), "id", api_path_param(req, "name"),
                            "name", &job, &t))
        return API_DONE;
    void *bytes;
    if (format == FORMAT_JSON && t->nbytes > req->env->cfg->max_body_bytes)
        api_respond_error(req, 406, "not_acceptable", "header.Accept",
                          "output '%s' is too large for JSON; ask for "
                          "application/octet-stream or application/x-npy",
                          t->name);
    else if (api_job_output_read(req, t, &bytes) == 0)
        respond_output(req, t, format, bytes);
    job_free(job);
    return API_DONE;
}
