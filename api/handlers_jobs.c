/* Handlers of /v1/jobs: submit (to the scheduler), list and get (from the store), wait and
 * cancel (through the scheduler). Output downloads are handlers_outputs.c's. */
#include "api_internal.h"

#include <ctype.h>
#include <inttypes.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the daemon's backend runs op (job_json_env_t.runs_op). */
static bool backend_runs_op(void *ud, const op_def_t *op)
{
    const api_request_t *req = ud;
    return sched_runs_op(req->env->sched, op);
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

/* Orders a wait's post against its client's going away: a wait posted is cancelled after its
 * post. A request's own lock could not be held across the post: the wait's answer may free
 * the request before the post returns. */
static pthread_mutex_t wait_lock = PTHREAD_MUTEX_INITIALIZER;

void api_request_client_gone(api_request_t *req)
{
    pthread_mutex_lock(&wait_lock);
    req->client_gone = true;
    if (req->wait_posted) sched_wait_cancel(req->env->sched, req->waits_for, req);
    pthread_mutex_unlock(&wait_lock);
}

/* Answers a submission refused by a spent GPU-time budget: 429 budget_exceeded naming its key,
 * with the time its window resets in the body (reset_at) and, in whole seconds, in
 * Retry-After. */
static void respond_budget_exceeded(api_request_t *req, const sched_result_t *res)
{
    int64_t wait_us = res->reset_at_us - now_us();
    long long wait_s = wait_us > 0 ? (wait_us + 999999) / 1000000 : 1;
    json_t *error = json_pack("{s:s, s:s, s:s, s:o, s:s}", "code", "budget_exceeded", "message",
                              res->message ? res->message : "a GPU-time budget is spent", "field",
                              res->limit, "reset_at", job_json_time(res->reset_at_us), "window",
                              res->budget_window ? res->budget_window : "");
    api_respond_json(req, 429, json_pack("{s:o}", "error", error));
    api_response_add_header(&req->resp, "Retry-After", "%lld", wait_s);
}

/* Answers a submission the scheduler refused, or that it answered without a job: true then. */
static bool submit_refused(api_request_t *req, const sched_result_t *res)
{
    if (res->err == -EAGAIN && res->limit && res->reset_at_us) {
        respond_budget_exceeded(req, res);
    } else if (res->err == -EAGAIN && res->limit) {
        api_respond_error(req, 429, "quota_exceeded", res->limit, "%s", res->message);
        api_response_add_header(&req->resp, "Retry-After", "1");
    } else if (res->err == -EPERM && res->limit) {
        api_respond_error(req, 403, "forbidden", res->limit, "%s", res->message);
    } else if (res->err) {
        api_respond_errno(req, res->err, res->message);
    } else if (res->n_jobs == 0) {
        api_respond_error(req, 500, "internal", NULL, "the scheduler returned no job");
    } else {
        return false;
    }
    return true;
}

static void submit_reply(void *token, const sched_result_t *res)
{
    STAMP(REPLY);
    api_request_t *req = token;
    /* An idempotent retry is answered with the jobs the first submission created. */
    int status = res->replayed ? 200 : 201;
    if (submit_refused(req, res)) {
        /* Answered. */
    } else if (res->take_jobs) {
        /* Shown by the HTTP thread that sends the answer, not by this one. */
        *res->take_jobs = true;
        api_respond_jobs_later(req, status, (job_t **)res->jobs, res->n_jobs, req->submit_is_list);
    } else {
        api_respond_json(req, status, api_jobs_json(res->jobs, res->n_jobs, req->submit_is_list));
    }
    api_request_resume(req);
}

/* Answers a submission with ?wait= (sched_submit_waited): its jobs as they ended, or as they
 * stood when the wait ran out, outputs inlined, as a wait answers a job; a list for a list.
 * Still 201 (200 for a retry): the jobs are accepted whether or not they ended within the
 * wait. The reply runs on the scheduler's loop: the answer's text is made by the HTTP thread
 * that sends it, from copies, while the loop commits the last job's end; it is sent once that
 * is over (res->end_gate). */
static void submit_waited_reply(void *token, const sched_result_t *res)
{
    STAMP(REPLY);
    api_request_t *req = token;
    if (res->end_gate) req->answer_gate = sched_gate_hold(res->end_gate);
    int status = res->replayed ? 200 : 201;
    if (submit_refused(req, res)) {
        api_request_resume(req);
        return;
    }
    size_t n = res->n_jobs, i = 0;
    job_t **later = calloc(n, sizeof *later);
    while (later && i < n &&
           (later[i] = job_copy_answer(res->jobs[i], req->cfg->max_inline_output_bytes)))
        i++;
    if (later && i == n) {
        api_respond_jobs_later(req, status, later, n, req->submit_is_list);
        req->resp.jobs_whole = true;
    } else {
        job_json_free_jobs(later, later ? i : 0); /* out of memory for the copies */
        api_respond_jobs_whole(req, status, res->jobs, n, req->submit_is_list);
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
        job_idem_key_format(full, key, is_list, i);
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

/* The length of the JSON at the start of a submission's body, from its Content-Type and
 * Gpujob-Json-Length. curl -d labels its body application/x-www-form-urlencoded unless told
 * otherwise; the body is JSON all the same, so that label is accepted too. With
 * Gpujob-Json-Length, the body is that many bytes of JSON and then the bytes its tensors name
 * (binary_offset): no base64 to encode, lex and decode. 0, or API_DONE after answering. */
static int submit_json_length(api_request_t *req, size_t *ret)
{
    if (!req->json_length) {
        if (req->content_type && !api_content_type_is(req, "application/json") &&
            !api_content_type_is(req, "application/x-www-form-urlencoded")) {
            api_respond_error(req, 415, "unsupported_media_type", "header.Content-Type",
                              "jobs are submitted as application/json, or as "
                              "application/octet-stream with Gpujob-Json-Length");
            return API_DONE;
        }
        *ret = req->body_len;
        return 0;
    }
    if (!api_content_type_is(req, "application/octet-stream")) {
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
    *ret = (size_t)n;
    return 0;
}

/* Large bodies being parsed now, against limits.max_large_parses: each parse takes memory of
 * the order of its body, and every HTTP thread could be parsing one. */
static pthread_mutex_t large_parses_lock = PTHREAD_MUTEX_INITIALIZER;
static int large_parses;

/* Takes a parse slot for a body of len bytes when it is large: 0 (*ret_took says whether one
 * was taken, to give back), or API_DONE after answering 503 when every slot is taken. */
static int large_parse_take(api_request_t *req, size_t len, bool *ret_took)
{
    const config_t *cfg = req->cfg;
    bool took = false;
    if (len >= cfg->large_parse_bytes) {
        pthread_mutex_lock(&large_parses_lock);
        took = large_parses < cfg->max_large_parses;
        if (took) large_parses++;
        pthread_mutex_unlock(&large_parses_lock);
        if (!took) {
            api_respond_error(req, 503, "unavailable", "body",
                              "%d large bodies are being parsed; send this one again shortly",
                              cfg->max_large_parses);
            api_response_add_header(&req->resp, "Retry-After", "1");
            return API_DONE;
        }
    }
    *ret_took = took;
    return 0;
}

static void large_parse_give(bool took)
{
    if (!took) return;
    pthread_mutex_lock(&large_parses_lock);
    large_parses--;
    pthread_mutex_unlock(&large_parses_lock);
}

/* The jobs of a submission's body (json_len bytes of JSON, then its binary section), parsed
 * and validated: a malloc'd array of n owned jobs. 0, or API_DONE after answering. */
static int submit_parse(api_request_t *req, size_t json_len, const char *key, job_t ***ret_jobs,
                        size_t *ret_n, bool *ret_is_list)
{
    bool took;
    if (large_parse_take(req, json_len, &took)) return API_DONE;
    policy_limits_t l;
    api_user_limits(req, &l);
    job_json_env_t penv = {
        .cfg = req->cfg,
        .owner = req->user.name,
        .now_us = now_us(),
        .max_time_limit_ms = (int64_t)l.value[CONFIG_POLICY_MAX_TIME_LIMIT_MS],
        .max_time_limit_key = l.source[CONFIG_POLICY_MAX_TIME_LIMIT_MS],
        .time_limit_by_cost = sched_time_limit_by_cost(req->env->sched),
        .find_op = req->env->find_op,
        .runs_op = backend_runs_op,
        .buffer_desc = visible_buffer_desc,
        .ud = req,
        .binary = req->json_length ? (const unsigned char *)req->body + json_len : NULL,
        .binary_len = req->body_len - json_len,
    };
    api_error_t err;
    int r = job_json_parse_body(req->body ? req->body : "", json_len, &penv, key, ret_jobs, ret_n,
                                ret_is_list, &err);
    large_parse_give(took);
    if (r < 0) {
        api_respond_api_error(req, &err);
        return API_DONE;
    }
    return 0;
}

/* True, after answering 413 job_too_large, when one of the jobs is estimated to run longer
 * than the user's max_job_cost_ms (op_cost_ms: the same estimate the watchdog bounds). */
static bool job_cost_refuses(api_request_t *req, job_t *const *jobs, size_t n)
{
    policy_limits_t l;
    api_user_limits(req, &l);
    uint64_t max = l.value[CONFIG_POLICY_MAX_JOB_COST_MS];
    for (size_t i = 0; max && i < n; i++) {
        double ms = op_cost_ms(jobs[i]->call.cost);
        if (ms <= (double)max) continue;
        const char *source = l.source[CONFIG_POLICY_MAX_JOB_COST_MS];
        api_respond_error(req, 413, "job_too_large", source,
                          "job %zu (%s) is estimated at %.0f ms, over %s = %" PRIu64 " ms", i,
                          jobs[i]->call.op->name, ms, source, max);
        return true;
    }
    return false;
}

/* True, after answering 403, when the user's max_queued is 0: a user kept out of submitting,
 * refused before the body is parsed. Not 429: no wait makes room. */
static bool submit_forbidden(api_request_t *req)
{
    policy_limits_t l;
    api_user_limits(req, &l);
    if (l.value[CONFIG_POLICY_MAX_QUEUED] != 0) return false;
    const char *source = l.source[CONFIG_POLICY_MAX_QUEUED];
    api_respond_error(req, 403, "forbidden", source, "'%s' may not submit jobs: %s = 0",
                      req->user.name, source);
    return true;
}

/* True, after answering 413 exceeds_device_memory, when one of the jobs needs more device
 * memory (exec_job_device_bytes) than the largest device's pool holds, or than the user's share
 * of the pool (limits.device_memory_percent_per_user): it could never start. */
static bool job_memory_refuses(api_request_t *req, job_t *const *jobs, size_t n)
{
    uint64_t largest = 0;
    const char *pool_key = "";
    uint64_t pool = sched_device_memory(req->env->sched, &largest, &pool_key);
    if (!pool) return false;
    policy_limits_t l;
    api_user_limits(req, &l);
    uint64_t percent = l.value[CONFIG_POLICY_DEVICE_MEMORY_PCT];
    uint64_t share = sched_memory_share(pool, percent);
    for (size_t i = 0; i < n; i++) {
        uint64_t need = exec_job_device_bytes(jobs[i]);
        if (largest && need > largest) {
            api_respond_error(req, 413, "exceeds_device_memory", pool_key,
                              "job %zu (%s) needs %" PRIu64 " bytes of device memory, more than "
                              "the largest pool holds (%s: %" PRIu64 " bytes)",
                              i, jobs[i]->call.op->name, need, pool_key, largest);
            return true;
        }
        if (share && need > share) {
            const char *key = l.source[CONFIG_POLICY_DEVICE_MEMORY_PCT];
            api_respond_error(req, 413, "exceeds_device_memory", key,
                              "job %zu (%s) needs %" PRIu64 " bytes of device memory, more than "
                              "%s = %" PRIu64 "%% of the pool (%" PRIu64 " bytes) allows",
                              i, jobs[i]->call.op->name, need, key, percent, share);
            return true;
        }
    }
    return false;
}

int api_handle_jobs_submit(api_request_t *req)
{
    STAMP_BEGIN();
    static const char *const allowed[] = {"wait", NULL};
    if (api_query_check(req, allowed) || submit_forbidden(req)) return API_DONE;
    req->submit_waits = api_query(req, "wait") != NULL;
    /* A job is not refused for wanting a long wait: the wait is cut to the limit. */
    if (req->submit_waits &&
        api_query_seconds(req, "wait", 0, req->cfg->max_wait_ms, true, &req->submit_wait_ms))
        return API_DONE;
    size_t json_len;
    if (submit_json_length(req, &json_len)) return API_DONE;
    const char *key = req->idempotency_key;
    if (key && !idempotency_key_valid(key)) {
        api_respond_error(req, 400, "invalid_argument", "header.Idempotency-Key",
                          "Idempotency-Key must be 1 to %d printable ASCII characters",
                          IDEM_KEY_SIZE - 1);
        return API_DONE;
    }
    job_t **jobs = NULL;
    size_t n = 0;
    bool is_list = false;
    if (submit_parse(req, json_len, key, &jobs, &n, &is_list)) return API_DONE;
    STAMP(PARSED);
    if (job_cost_refuses(req, jobs, n) || job_memory_refuses(req, jobs, n)) {
        job_json_free_jobs(jobs, n);
        return API_DONE;
    }
    /* With sync_full the rows read here may not be on disk yet (their commit's 201 may still be
     * waiting for its sync): the scheduler then answers the retry, after a sync. A retry that
     * waits goes to the scheduler too. */
    store_reader_t *rd =
        key && !req->cfg->sync_full && !req->submit_waits ? req->env->reader(req->env) : NULL;
    if (rd && answer_known_idempotent(req, rd, key, n, is_list)) {
        job_json_free_jobs(jobs, n);
        return API_DONE;
    }
    req->submit_is_list = is_list;
    api_request_suspend(req);
    /* The scheduler takes the jobs and the array, also on error. */
    if (req->submit_waits) {
        /* Its wait (for every job of a list at once) has no job id to name until the commit:
         * a client that goes away cancels it by the request alone (waits_for ""). Armed only
         * after the post: no lock needed before. */
        req->waits_for[0] = '\0';
        req->wait_posted = true;
        sched_submit_waited(req->env->sched, jobs, n, req->submit_wait_ms,
                            req->cfg->max_inline_output_bytes, submit_waited_reply, req);
    } else {
        sched_submit(req->env->sched, jobs, n, submit_reply, req);
    }
    return API_PENDING;
}

/* The store query of GET /v1/jobs, from its query arguments. 0, or API_DONE after answering
 * 400. */
static int list_query(api_request_t *req, store_list_query_t *ret)
{
    store_list_query_t q = {.owner = api_request_owner_filter(req), .state = -1};
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
    if ((v = api_query(req, "user")) && strcmp(v, req->user.name) != 0) {
        if (!v[0] || strlen(v) >= OWNER_SIZE) {
            api_respond_error(req, 400, "invalid_argument", "query.user",
                              "user must be a user name");
            return API_DONE;
        }
        /* Another user's jobs are for admins alone, in every auth mode. */
        if (api_request_require_admin(req, "query.user", "list another user's jobs"))
            return API_DONE;
    }
    if (v) q.owner = v;
    long limit;
    if (api_query_int(req, "limit", 1, 1000, 100, &limit)) return API_DONE;
    q.limit = (int)limit;
    if ((v = api_query(req, "after"))) {
        if (!id_valid('j', v)) {
            api_respond_error(req, 400, "invalid_argument", "query.after",
                              "after must be a job id (the previous page's next)");
            return API_DONE;
        }
        q.after = v;
    }
    *ret = q;
    return 0;
}

/* Answers a page of jobs (freed here): "next" names its last job when the page is full. */
static void list_respond(api_request_t *req, job_t **jobs, size_t n, int limit)
{
    json_t *list = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(list, api_job_json(jobs[i]));
    json_t *next = n == (size_t)limit && n > 0 ? json_string(jobs[n - 1]->id) : json_null();
    job_json_free_jobs(jobs, n);
    api_respond_json(req, 200, json_pack("{s:o, s:o}", "jobs", list, "next", next));
}

/* The loop's reply to a page's explanation: the page, its queued jobs with why they wait (or
 * without, when the loop could not say: the page is still the store's). */
static void list_explained(void *token, const sched_result_t *res)
{
    (void)res;
    api_request_t *req = token;
    job_t **jobs = req->list_jobs;
    req->list_jobs = NULL;
    list_respond(req, jobs, req->list_n, req->list_limit);
    api_request_resume(req);
}

/* A page is read from the store; when it shows queued jobs, the scheduler's loop says why
 * they wait, all in one message, before it is answered. */
int api_handle_jobs_list(api_request_t *req)
{
    static const char *const allowed[] = {"state", "op", "user", "limit", "after", NULL};
    store_list_query_t q;
    if (api_query_check(req, allowed) || list_query(req, &q)) return API_DONE;
    store_reader_t *rd = api_request_reader(req);
    if (!rd) return API_DONE;
    job_t **jobs = NULL;
    size_t n = 0;
    int r = store_jobs_list(rd, &q, &jobs, &n);
    if (r < 0) {
        api_respond_errno(req, r, "listing jobs failed");
        return API_DONE;
    }
    bool any_queued = false;
    for (size_t i = 0; i < n && !any_queued; i++)
        any_queued = jobs[i]->state == JOB_QUEUED;
    if (!any_queued) {
        list_respond(req, jobs, n, q.limit);
        return API_DONE;
    }
    req->list_jobs = jobs;
    req->list_n = n;
    req->list_limit = q.limit;
    api_request_suspend(req);
    sched_explain_jobs(req->env->sched, jobs, n, list_explained, req);
    return API_PENDING;
}

/* Replies of wait and cancel: the job as it stands, outputs inlined. */
static void job_reply(void *token, const sched_result_t *res)
{
    api_request_t *req = token;
    if (res->err == -ENOENT)
        api_respond_not_found(req, 'j', api_path_param(req, "id"), "id");
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

/* A queued job is answered by the scheduler's loop, which says why it waits and where it
 * stands (sched_explain.c); any other from the store, as read. */
int api_handle_job_get(api_request_t *req)
{
    static const char *const no_args[] = {NULL};
    if (api_query_check(req, no_args)) return API_DONE;
    job_t *job;
    const char *id = api_path_param(req, "id");
    if (api_job_find(req, id, "id", &job)) return API_DONE;
    if (job->state == JOB_QUEUED) {
        job_free(job);
        api_request_suspend(req);
        sched_wait(req->env->sched, api_request_owner_filter(req), id, 0, job_reply, req);
        return API_PENDING;
    }
    api_respond_job(req, 200, job);
    job_free(job);
    return API_DONE;
}

int api_handle_job_wait(api_request_t *req)
{
    static const char *const allowed[] = {"timeout", NULL};
    if (api_query_check(req, allowed)) return API_DONE;
    const char *id = api_path_param(req, "id");
    if (api_id_check(req, 'j', id, "id")) return API_DONE;
    int timeout_ms;
    if (api_query_seconds(req, "timeout", 30.0, req->cfg->max_wait_ms, false, &timeout_ms))
        return API_DONE;
    /* A job that has ended is answered here, from the store, without the scheduler's loop (a
     * job's bottleneck): by the time its 201 arrives a tiny job has often ended already, as it
     * runs while its acceptance is synced. */
    job_t *ended = stored_if_ended(req, id);
    if (ended) {
        api_respond_job(req, 200, ended);
        job_free(ended);
        return API_DONE;
    }
    snprintf(req->waits_for, sizeof req->waits_for, "%s", id);
    /* Armed only after the post: no lock needed before. */
    req->wait_posted = true;
    api_request_suspend(req);
    sched_wait(req->env->sched, api_request_owner_filter(req), id, timeout_ms, job_reply, req);
    return API_PENDING;
}

/* The reply of a cancel: the job as it now stands (cancelled, without outputs), and what
 * became of it in "cancel" (sched_result_t.cancel). */
static void cancel_reply(void *token, const sched_result_t *res)
{
    api_request_t *req = token;
    if (res->err || res->n_jobs == 0) {
        job_reply(token, res);
        return;
    }
    json_t *o = api_job_json(res->jobs[0]);
    if (o && res->cancel) json_object_set_new(o, "cancel", json_string(res->cancel));
    api_respond_json(req, 200, o);
    api_request_resume(req);
}

int api_handle_job_cancel(api_request_t *req)
{
    static const char *const no_args[] = {NULL};
    if (api_query_check(req, no_args)) return API_DONE;
    const char *id = api_path_param(req, "id");
    if (api_id_check(req, 'j', id, "id")) return API_DONE;
    api_request_suspend(req);
    sched_cancel(req->env->sched, api_request_owner_filter(req), id, cancel_reply, req);
    return API_PENDING;
}
