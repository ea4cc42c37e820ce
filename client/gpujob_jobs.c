/* The calls on /v1/jobs: submitting specs with idempotency keys and retries (waiting in the
 * same request, when asked, for the job or the whole list to end), reading jobs back (get,
 * list, long-poll wait) and cancelling them. Specs are built in gpujob_spec.c, the jobs
 * answered read in gpujob_job_answer.c, outputs downloaded in gpujob_outputs.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "gpujob_internal.h"

/* The longest wait a submission asks for: the bound of the daemon's limits.max_wait_ms, which
 * cuts it further; a longer one is sent as this. */
#define MAX_WAIT_S 86400.0

/* ---- Submitting -------------------------------------------------------------------------- */

/* 32 random hex digits: unique enough that two submissions never share a key. */
static int idempotency_key_new(char key[48])
{
    unsigned char bytes[16];
    size_t got = 0;
    while (got < sizeof bytes) {
        ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        got += (size_t)n;
    }
    strcpy(key, "gj-");
    for (size_t i = 0; i < sizeof bytes; i++)
        snprintf(key + 3 + 2 * i, 3, "%02x", bytes[i]);
    return 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* The longest Retry-After a submission waits out before trying again. */
#define GJC_MAX_RETRY_AFTER_S 60

static bool transport_error_is_retryable(int r)
{
    return r == -ECONNRESET || r == -ECONNREFUSED || r == -ETIMEDOUT;
}

/* Sends a submission, again after transient failures, always with the same key: the daemon
 * answers a repeated key with the job it created the first time (200), so a retry can never
 * create a duplicate, whether or not the lost attempt reached it. */
static int submit_body(gpujob_client_t *c, const char *body, size_t len, size_t json_len,
                       bool binary, const char *key, double wait_s, json_t **ret,
                       gjc_section_t *ret_section)
{
    char path[64] = "/v1/jobs";
    if (wait_s >= 0) snprintf(path, sizeof path, "/v1/jobs?wait=%.3f", wait_s);
    gjc_request_t req = {.method = "POST",
                         .path = path,
                         .content_type = binary ? "application/octet-stream" : "application/json",
                         .body = body,
                         .body_len = len,
                         .accept = gjc_job_accept(c),
                         .idempotency_key = key,
                         .json_length = binary ? json_len : 0,
                         .extra_timeout_ms = wait_s > 0 ? (long)(wait_s * 1000.0) : 0};
    long backoff_ms = 100;
    for (int attempt = 0;; attempt++) {
        gjc_response_t resp = {.retry_after_s = -1};
        int r = gjc_perform(c, &req, &resp);
        bool retry = false;
        long wait_ms = backoff_ms;
        if (r < 0) {
            retry = transport_error_is_retryable(r);
        } else if (resp.status == 429 || resp.status == 503) {
            /* A wait longer than a retry is worth (a spent GPU-time budget resets with its
             * UTC day or month) is the caller's to decide: the refusal goes back at once. */
            retry = resp.retry_after_s <= GJC_MAX_RETRY_AFTER_S;
            if (resp.retry_after_s >= 0) wait_ms = resp.retry_after_s * 1000;
        }
        if (retry && attempt < c->retries) {
            gjc_response_clear(&resp);
            sleep_ms(wait_ms);
            backoff_ms *= 2;
            continue;
        }
        if (r >= 0) r = gjc_check_status(c, &resp, 201, 200);
        json_t *root = NULL;
        if (r >= 0) r = gjc_parse_body(c, &resp, &root);
        if (r >= 0) gjc_take_section(&resp, ret_section);
        gjc_response_clear(&resp);
        if (r < 0) return r;
        *ret = root;
        return 0;
    }
}

/* gpujob_submit_many_wait without its check of wait_s: a negative one does not wait. */
static int submit_specs(gpujob_client_t *c, const gpujob_spec_t *const *specs, size_t n,
                        const char *idempotency_key, double wait_s, gpujob_job_t **ret_jobs)
{
    gjc_clear_error(c);
    if (!specs || n == 0 || !ret_jobs) return gjc_fail(c, -EINVAL, "no jobs to submit");
    for (size_t i = 0; i < n; i++)
        if (!specs[i]) return gjc_fail(c, -EINVAL, "no job to submit at %zu", i);
    char key[48];
    if (idempotency_key) {
        if (!idempotency_key[0] || strlen(idempotency_key) > 127 ||
            strpbrk(idempotency_key, "\r\n"))
            return gjc_fail(c, -EINVAL, "idempotency key must be 1..127 characters on one line");
    } else {
        int r = idempotency_key_new(key);
        if (r < 0) return gjc_fail(c, r, "no random bytes for an idempotency key");
        idempotency_key = key;
    }
    size_t json_len = 0, len = 0;
    bool binary = false;
    char *body = gjc_submission_body(specs, n, &json_len, &len, &binary);
    if (!body) return gjc_fail(c, -ENOMEM, "out of memory encoding the submission");

    json_t *root = NULL;
    gjc_section_t section;
    int r = submit_body(c, body, len, json_len, binary, idempotency_key, wait_s, &root, &section);
    free(body);
    if (r < 0) return r;
    bool shape_ok =
        n == 1 ? json_is_object(root) || (json_is_array(root) && json_array_size(root) == 1)
               : json_is_array(root) && json_array_size(root) == n;
    size_t no_id = n;
    for (size_t i = 0; shape_ok && i < n && no_id == n; i++)
        if (!json_is_string(
                json_object_get(json_is_array(root) ? json_array_get(root, i) : root, "id")))
            no_id = i;
    if (!shape_ok || no_id < n) {
        bool list = json_is_array(root);
        json_decref(root);
        free(section.body);
        if (no_id < n) return gjc_fail(c, -EBADMSG, "job %zu of the answer has no id", no_id);
        return gjc_fail(c, -EBADMSG, "the daemon answered a submission of %zu jobs with %s", n,
                        list ? "a list of another length" : "no job list");
    }
    /* Every job of a waited answer may have outputs in its binary section. */
    r = gjc_jobs_new(root, n, &section, ret_jobs);
    return r < 0 ? gjc_fail(c, r, "out of memory") : 0;
}

int gpujob_submit_many(gpujob_client_t *c, const gpujob_spec_t *const *specs, size_t n,
                       const char *idempotency_key, gpujob_job_t **ret_jobs)
{
    return submit_specs(c, specs, n, idempotency_key, -1, ret_jobs);
}

int gpujob_submit_many_wait(gpujob_client_t *c, const gpujob_spec_t *const *specs, size_t n,
                            const char *idempotency_key, double wait_s, gpujob_job_t **ret_jobs)
{
    if (!isfinite(wait_s)) {
        gjc_clear_error(c);
        return gjc_fail(c, -EINVAL, "the wait must be a number of seconds");
    }
    if (wait_s > MAX_WAIT_S) wait_s = MAX_WAIT_S;
    return submit_specs(c, specs, n, idempotency_key, wait_s, ret_jobs);
}

int gpujob_submit(gpujob_client_t *c, const gpujob_spec_t *spec, gpujob_job_t **ret)
{
    return gpujob_submit_wait(c, spec, -1, ret);
}

int gpujob_submit_wait(gpujob_client_t *c, const gpujob_spec_t *spec, double wait_s,
                       gpujob_job_t **ret)
{
    const gpujob_spec_t *specs[1] = {spec};
    return gpujob_submit_many_wait(c, specs, 1, NULL, wait_s, ret);
}

/* ---- Reading jobs ------------------------------------------------------------------------ */

/* GETs path (or DELETEs it) and wraps the job it answers. */
static int job_call(gpujob_client_t *c, const char *method, const char *path, long extra_timeout_ms,
                    gpujob_job_t **ret)
{
    gjc_request_t req = {.method = method,
                         .path = path,
                         .accept = gjc_job_accept(c),
                         .extra_timeout_ms = extra_timeout_ms};
    json_t *root = NULL;
    gjc_section_t section;
    int r = gjc_call_json(c, &req, 200, 0, &root, &section);
    if (r < 0) return r;
    if (!json_is_object(root) || !json_is_string(json_object_get(root, "id"))) {
        json_decref(root);
        free(section.body);
        return gjc_fail(c, -EBADMSG, "%s %s: the answer is not a job", method, path);
    }
    gpujob_job_t *job = gjc_job_new(root, &section);
    if (!job) return gjc_fail(c, -ENOMEM, "out of memory");
    *ret = job;
    return 0;
}

/* "/v1/jobs/ID" + suffix with ID escaped; NULL with the error set. */
char *gjc_job_path(gpujob_client_t *c, const char *id, const char *suffix)
{
    if (!id || !id[0]) {
        gjc_fail(c, -EINVAL, "empty job id");
        return NULL;
    }
    char *escaped = gjc_escape(c, id), *path = NULL;
    if (!escaped || asprintf(&path, "/v1/jobs/%s%s", escaped, suffix) < 0) path = NULL;
    free(escaped);
    if (!path) gjc_fail(c, -ENOMEM, "out of memory");
    return path;
}

int gpujob_get(gpujob_client_t *c, const char *id, gpujob_job_t **ret)
{
    gjc_clear_error(c);
    char *path = gjc_job_path(c, id, "");
    if (!path) return id && id[0] ? -ENOMEM : -EINVAL;
    int r = job_call(c, "GET", path, 0, ret);
    free(path);
    return r;
}

int gpujob_cancel(gpujob_client_t *c, const char *id, gpujob_job_t **ret)
{
    gjc_clear_error(c);
    char *path = gjc_job_path(c, id, "");
    if (!path) return id && id[0] ? -ENOMEM : -EINVAL;
    gpujob_job_t *job = NULL;
    int r = job_call(c, "DELETE", path, 0, &job);
    free(path);
    if (r < 0) return r;
    if (ret)
        *ret = job;
    else
        gpujob_job_free(job);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The longest single long poll: under the daemon's default max_wait_ms (300 s) and short
 * enough that a lost connection is noticed within a minute. */
#define WAIT_POLL_MAX_S 25.0

int gpujob_wait_progress(gpujob_client_t *c, const char *id, double timeout_s, double interval_s,
                         gpujob_progress_fn progress, void *userdata, gpujob_job_t **ret)
{
    gjc_clear_error(c);
    if (!id || !id[0]) return gjc_fail(c, -EINVAL, "empty job id");
    double start = now_s();
    for (;;) {
        double elapsed = now_s() - start;
        double poll = WAIT_POLL_MAX_S;
        if (progress && interval_s > 0 && interval_s < poll) poll = interval_s;
        if (timeout_s >= 0 && timeout_s - elapsed < poll) poll = timeout_s - elapsed;
        if (poll < 0) poll = 0;
        char suffix[64];
        snprintf(suffix, sizeof suffix, "/wait?timeout=%.3f", poll);
        char *path = gjc_job_path(c, id, suffix);
        if (!path) return -ENOMEM;
        double poll_start = now_s();
        gpujob_job_t *job = NULL;
        int r = job_call(c, "GET", path, (long)(poll * 1000.0), &job);
        free(path);
        if (r < 0) return r;
        gpujob_state_t state = gpujob_job_state(job);
        if (gpujob_state_is_final(state)) {
            *ret = job;
            return 0;
        }
        elapsed = now_s() - start;
        if (progress && progress(job, elapsed, userdata) != 0) {
            gpujob_job_free(job);
            return gjc_fail(c, -ECANCELED, "wait for job %s stopped", id);
        }
        gpujob_job_free(job);
        if (timeout_s >= 0 && elapsed >= timeout_s)
            return gjc_fail(c, -ETIMEDOUT, "job %s is still %s after %.1f s", id,
                            gpujob_state_name(state), elapsed);
        /* A daemon that answers a long poll early must not turn this loop into a busy one. */
        if (now_s() - poll_start < poll / 2) sleep_ms(20);
    }
}

int gpujob_wait(gpujob_client_t *c, const char *id, double timeout_s, gpujob_job_t **ret)
{
    return gpujob_wait_progress(c, id, timeout_s, 0, NULL, NULL, ret);
}

/* ---- Lists ------------------------------------------------------------------------------- */

struct gpujob_job_list {
    gpujob_job_t **jobs;
    size_t n;
    char *next;
};

void gpujob_job_list_free(gpujob_job_list_t *list)
{
    if (!list) return;
    for (size_t i = 0; i < list->n; i++)
        gpujob_job_free(list->jobs[i]);
    free(list->jobs);
    free(list->next);
    free(list);
}

size_t gpujob_job_list_count(const gpujob_job_list_t *list)
{
    return list->n;
}

const gpujob_job_t *gpujob_job_list_at(const gpujob_job_list_t *list, size_t i)
{
    return i < list->n ? list->jobs[i] : NULL;
}

const char *gpujob_job_list_next(const gpujob_job_list_t *list)
{
    return list->next;
}

static int query_add(gpujob_client_t *c, char **query, const char *key, const char *value)
{
    if (!value) return 0;
    char *escaped = gjc_escape(c, value), *q = NULL;
    int n = escaped ? asprintf(&q, "%s%s%s=%s", *query, (*query)[0] ? "&" : "?", key, escaped) : -1;
    free(escaped);
    if (n < 0) return -ENOMEM;
    free(*query);
    *query = q;
    return 0;
}

int gjc_get_json_query(gpujob_client_t *c, const char *path, const char *const *keys,
                       const char *const *values, size_t n, json_t **ret)
{
    char *q = strdup(""), *target = NULL;
    int r = q ? 0 : -ENOMEM;
    for (size_t i = 0; i < n && r >= 0; i++)
        r = query_add(c, &q, keys[i], values[i]);
    if (r >= 0 && asprintf(&target, "%s%s", path, q) < 0) r = -ENOMEM;
    free(q);
    if (r < 0) return gjc_fail(c, r, "out of memory");
    gjc_request_t req = {.method = "GET", .path = target, .accept = "application/json"};
    r = gjc_call_json(c, &req, 200, 0, ret, NULL);
    free(target);
    return r;
}

int gpujob_list(gpujob_client_t *c, const gpujob_list_query_t *query, gpujob_job_list_t **ret)
{
    gjc_clear_error(c);
    gpujob_list_query_t none = {0};
    if (!query) query = &none;
    char limit[24];
    snprintf(limit, sizeof limit, "%d", query->limit);
    static const char *const keys[] = {"state", "op", "limit", "after"};
    const char *values[] = {query->state, query->op, query->limit ? limit : NULL, query->after};
    json_t *root = NULL;
    int r = gjc_get_json_query(c, "/v1/jobs", keys, values, 4, &root);
    if (r < 0) return r;
    json_t *jobs = json_object_get(root, "jobs"), *next = json_object_get(root, "next");
    if (!json_is_array(jobs) || (next && !json_is_null(next) && !json_is_string(next))) {
        json_decref(root);
        return gjc_fail(c, -EBADMSG, "GET /v1/jobs: the answer has no job list");
    }
    gpujob_job_list_t *list = calloc(1, sizeof *list);
    size_t n = json_array_size(jobs);
    if (list) list->jobs = calloc(n ? n : 1, sizeof *list->jobs);
    if (list && list->jobs && json_is_string(next)) list->next = strdup(json_string_value(next));
    bool ok = list && list->jobs && (!json_is_string(next) || list->next);
    for (size_t i = 0; ok && i < n; i++) {
        list->jobs[i] = gjc_job_new(json_incref(json_array_get(jobs, i)), NULL);
        if (!list->jobs[i])
            ok = false;
        else
            list->n++;
    }
    json_decref(root);
    if (!ok) {
        gpujob_job_list_free(list);
        return gjc_fail(c, -ENOMEM, "out of memory");
    }
    *ret = list;
    return 0;
}
