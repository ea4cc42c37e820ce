/* End-to-end: the real gpujobd on the CPU backend, driven over HTTP: a job's life through the
 * API: submissions waited for or in arrays, cancel (queued or running), deadlines, idempotency
 * keys, listing with filters and pages, and the health, metrics, usage and info endpoints. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/e2e_jobs.h"
#include "support/run_suite.h"

/* POST /v1/jobs?wait=S answers once the job has ended: 201 with its final state and outputs
 * inline, equal to the computation here; a job longer than the wait is answered as it stands
 * (still 201: it is accepted); a wait out of range answers 400. */
START_TEST(test_submit_waits_for_its_job_when_asked)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 257 };
    static const int64_t shape[] = {N};
    uint32_t seed = 31;
    double x[N], y[N], got[N];
    e2e_jobs_random_values("f32", x, N, -4, 4, &seed);
    e2e_jobs_random_values("f32", y, N, -4, 4, &seed);
    json_t *job = e2e_jobs_saxpy(1.5, shape, 1, x, y, N);
    char *text = json_dumps(job, JSON_COMPACT);
    json_t *done = e2e_json_ok(d, "POST", "/v1/jobs?wait=1e9", text, 201); /* cut to the limit */
    e2e_jobs_output(done, "out", "f32", N, got);
    for (int i = 0; i < N; i++)
        ck_assert_msg(got[i] == (double)(1.5f * (float)x[i] + (float)y[i]), "[%d]", i);
    json_decref(done);

    /* A wait shorter than the job: answered as it stands, then it ends as any job does. */
    json_t *long_job = e2e_long_job_new(1500);
    char *long_text = json_dumps(long_job, JSON_COMPACT);
    json_t *early = e2e_json_ok(d, "POST", "/v1/jobs?wait=0.2", long_text, 201);
    const char *state = e2e_job_state(early);
    ck_assert_msg(strcmp(state, "queued") == 0 || strcmp(state, "running") == 0, "state %s", state);
    json_t *ended = e2e_wait_final_ok(d, json_string_value(json_object_get(early, "id")), 30);
    ck_assert_str_eq(e2e_job_state(ended), "succeeded");
    json_decref(ended);
    json_decref(early);

    static const char *const bad_waits[] = {"-1", "abc", "inf", ""};
    for (size_t i = 0; i < sizeof bad_waits / sizeof bad_waits[0]; i++) {
        char path[64];
        snprintf(path, sizeof path, "/v1/jobs?wait=%s", bad_waits[i]);
        json_t *bad = e2e_json_ok(d, "POST", path, text, 400);
        ck_assert_str_eq(e2e_error_field(bad), "query.wait");
        json_decref(bad);
    }

    free(long_text);
    json_decref(long_job);
    free(text);
    json_decref(job);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_array_of_100_jobs_in_one_post)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    /* 4 KiB tensors: the array's inputs, and each batch's outputs, come to more than 64 KiB, so
     * that they are written together to files of their own (store_blob_pack), which the
     * answers read back. */
    enum { JOBS = 100, N = 1024 };
    static const int64_t shape[] = {N};
    static double x[JOBS][N], y[JOBS][N];
    uint32_t seed = 11;
    json_t *array = json_array();
    for (int j = 0; j < JOBS; j++) {
        const char *dtype = j % 2 ? "i32" : "f32";
        e2e_jobs_random_values(dtype, x[j], N, -100, 100, &seed);
        e2e_jobs_random_values(dtype, y[j], N, -100, 100, &seed);
        json_array_append_new(
            array, json_pack("{s:s, s:{s:o, s:o}}", "op", j % 3 ? "add" : "mul", "inputs", "x",
                             e2e_jobs_tensor_inline(dtype, shape, 1, x[j], N), "y",
                             e2e_jobs_tensor_inline(dtype, shape, 1, y[j], N)));
    }
    char *text = json_dumps(array, JSON_COMPACT);
    json_t *created = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
    free(text);
    ck_assert_msg(json_is_array(created), "an array POST answers an array");
    ck_assert_int_eq(json_array_size(created), JOBS);
    for (int j = 0; j < JOBS; j++) {
        const char *id = json_string_value(json_object_get(json_array_get(created, j), "id"));
        ck_assert(id != NULL);
        for (int k = 0; k < j; k++)
            ck_assert_str_ne(id,
                             json_string_value(json_object_get(json_array_get(created, k), "id")));
        json_t *done = e2e_wait_final_ok(d, id, 30);
        double got[N];
        e2e_jobs_output(done, "out", j % 2 ? "i32" : "f32", N, got);
        for (int i = 0; i < N; i++) {
            double want = j % 3 ? (double)((float)x[j][i] + (float)y[j][i])
                                : (double)((float)x[j][i] * (float)y[j][i]);
            if (j % 2) want = j % 3 ? x[j][i] + y[j][i] : x[j][i] * y[j][i];
            ck_assert_msg(got[i] == want, "job %d [%d]: got %g, expected %g", j, i, got[i], want);
        }
        json_decref(done);
    }
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), JOBS);
    json_decref(created);
    json_decref(array);
    e2e_daemon_free(d);
}
END_TEST

static json_t *small_add_job(int value)
{
    return json_pack("{s:s, s:{s:{s:s, s:[i], s:[i,i]}, s:{s:s, s:[i], s:[i,i]}}}", "op", "add",
                     "inputs", "x", "dtype", "i32", "shape", 2, "data", value, value + 1, "y",
                     "dtype", "i32", "shape", 2, "data", 1, 1);
}

START_TEST(test_cancel_queued_job_never_runs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);

    json_t *small = small_add_job(5);
    char *id = e2e_submit_ok(d, small);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *job = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "queued");
    json_decref(job);

    job = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "cancelled");
    json_decref(job);

    json_t *long_done = e2e_wait_final_ok(d, long_id, 60);
    ck_assert_str_eq(e2e_job_state(long_done), "succeeded");
    /* The worker was free after the long job: a job left in the queue would have run by now. */
    char *after_id = e2e_submit_ok(d, small);
    json_decref(e2e_wait_final_ok(d, after_id, 30));
    free(after_id);
    job = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "cancelled");
    ck_assert_msg(json_is_null(json_object_get(job, "started_at")), "a cancelled job started");
    json_decref(job);
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 409));
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=cancelled"), 1);

    free(id);
    free(long_id);
    json_decref(small);
    json_decref(long_job);
    json_decref(long_done);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_cancel_running_job_keeps_nothing_of_its_result)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    enum { N = 100000 }; /* 400 KB: the input buffer and the output each get a file */
    float *x = calloc(N, sizeof *x);
    json_t *meta = e2e_upload_ok(d, "f32", "100000", x, N * sizeof *x, false, 201);
    json_t *job =
        json_pack("{s:s, s:{s:i}, s:{s:{s:s}}}", "op", "debug_sleep", "params", "ms", 1000,
                  "inputs", "x", "buffer", json_string_value(json_object_get(meta, "id")));
    ck_assert_int_eq(e2e_jobs_count_blob_files(d), 1);
    char *id = e2e_submit_ok(d, job);
    e2e_wait_state_ok(d, id, "running", 10);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *cancelled = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(cancelled), "cancelled");
    json_decref(cancelled);

    /* The run ends; its result is discarded, and so is the file written for its output. */
    double until = e2e_now() + 10;
    while (e2e_metric_ok(d, "gpujobd_jobs_running") > 0 && e2e_now() < until)
        usleep(20000);
    ck_assert(e2e_metric_ok(d, "gpujobd_jobs_running") == 0);
    ck_assert_int_eq(e2e_jobs_count_blob_files(d), 1);
    json_t *now = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(now), "cancelled");
    json_decref(now);

    free(id);
    free(x);
    json_decref(job);
    json_decref(meta);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_deadline_passes_while_queued)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);

    json_t *small = small_add_job(1);
    json_object_set_new(small, "deadline_ms", json_integer(200));
    char *id = e2e_submit_ok(d, small);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    ck_assert_str_eq(e2e_job_state(done), "failed");
    ck_assert_str_eq(e2e_error_code(done), "deadline_exceeded");
    ck_assert(json_is_null(json_object_get(done, "started_at")));
    /* It failed while the long job still held the only worker. */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", long_id);
    json_t *long_now = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(long_now), "running");
    json_decref(long_now);

    json_decref(e2e_wait_final_ok(d, long_id, 60));
    free(id);
    free(long_id);
    json_decref(done);
    json_decref(small);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_idempotent_resubmission_returns_first_job)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *job = small_add_job(3);
    char *text = json_dumps(job, JSON_COMPACT);
    const char *hdrs[] = {"Content-Type: application/json", "Idempotency-Key: e2e-key-1", NULL};
    e2e_response_t first, again;
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", hdrs, text, strlen(text), &first) == 0);
    ck_assert_msg(first.status == 201, "first: %ld %s", first.status, first.body);
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", hdrs, text, strlen(text), &again) == 0);
    ck_assert_msg(again.status == 200, "retry: %ld %s", again.status, again.body);
    const char *id1 = json_string_value(json_object_get(first.json, "id"));
    const char *id2 = json_string_value(json_object_get(again.json, "id"));
    ck_assert(id1 && id2);
    ck_assert_str_eq(id1, id2);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 1);

    /* Another key is another job. */
    const char *hdrs2[] = {"Content-Type: application/json", "Idempotency-Key: e2e-key-2", NULL};
    e2e_response_t other;
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", hdrs2, text, strlen(text), &other) == 0);
    ck_assert_int_eq(other.status, 201);
    ck_assert_str_ne(json_string_value(json_object_get(other.json, "id")), id1);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 2);
    e2e_response_clear(&first);
    e2e_response_clear(&again);
    e2e_response_clear(&other);
    free(text);
    json_decref(job);
    e2e_daemon_free(d);
}
END_TEST

/* A list's elements and single jobs never share a key: a single job keyed "x:0" is not the
 * first element of a list keyed "x", and each retry replays its own jobs. */
START_TEST(test_a_list_key_never_names_a_single_job)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *job = small_add_job(3);
    char *single = json_dumps(job, JSON_COMPACT);
    json_t *list_json = json_pack("[O,O]", job, job);
    char *list = json_dumps(list_json, JSON_COMPACT);
    const char *single_key[] = {"Content-Type: application/json", "Idempotency-Key: x:0", NULL};
    const char *list_key[] = {"Content-Type: application/json", "Idempotency-Key: x", NULL};
    e2e_response_t one, many, one_again, many_again;
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", single_key, single, strlen(single), &one) ==
              0);
    ck_assert_msg(one.status == 201, "single: %ld %s", one.status, one.body);
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", list_key, list, strlen(list), &many) == 0);
    ck_assert_msg(many.status == 201, "list: %ld %s", many.status, many.body);
    const char *single_id = json_string_value(json_object_get(one.json, "id"));
    json_t *jobs = many.json;
    ck_assert_int_eq(json_array_size(jobs), 2);
    const char *list_ids[2];
    for (int i = 0; i < 2; i++) {
        list_ids[i] = json_string_value(json_object_get(json_array_get(jobs, (size_t)i), "id"));
        ck_assert_ptr_nonnull(list_ids[i]);
        ck_assert_msg(strcmp(list_ids[i], single_id) != 0,
                      "the list's element %d is the single job keyed x:0", i);
    }
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 3);

    /* Retries replay their own jobs. */
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", list_key, list, strlen(list), &many_again) ==
              0);
    ck_assert_msg(many_again.status == 200, "list retry: %ld %s", many_again.status,
                  many_again.body);
    jobs = many_again.json;
    ck_assert_int_eq(json_array_size(jobs), 2);
    for (int i = 0; i < 2; i++)
        ck_assert_str_eq(json_string_value(json_object_get(json_array_get(jobs, (size_t)i), "id")),
                         list_ids[i]);
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", single_key, single, strlen(single),
                               &one_again) == 0);
    ck_assert_msg(one_again.status == 200, "single retry: %ld %s", one_again.status,
                  one_again.body);
    ck_assert_str_eq(json_string_value(json_object_get(one_again.json, "id")), single_id);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 3);
    e2e_response_clear(&one);
    e2e_response_clear(&many);
    e2e_response_clear(&one_again);
    e2e_response_clear(&many_again);
    free(single);
    free(list);
    json_decref(list_json);
    json_decref(job);
    e2e_daemon_free(d);
}
END_TEST

/* A retry of an accepted submission is answered with its job even while the user's queue is
 * full (it adds nothing to the queue); a new job is refused then, 429. */
START_TEST(test_idempotent_retry_is_answered_while_the_queue_is_full)
{
    e2e_daemon_t *d =
        e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG "[limits]\nmax_queued_per_user = 2\n");
    json_t *long_job = e2e_long_job_new(3000);
    char *text = json_dumps(long_job, JSON_COMPACT);
    char *running = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, running, "running", 10);
    const char *keyed[] = {"Content-Type: application/json", "Idempotency-Key: full-queue", NULL};
    e2e_response_t first, retry;
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", keyed, text, strlen(text), &first) == 0);
    ck_assert_msg(first.status == 201, "first: %ld %s", first.status, first.body);
    char *second = e2e_submit_ok(d, long_job); /* the queue holds two now: full */
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", keyed, text, strlen(text), &retry) == 0);
    ck_assert_msg(retry.status == 200, "retry: %ld %s", retry.status, retry.body);
    ck_assert_str_eq(json_string_value(json_object_get(retry.json, "id")),
                     json_string_value(json_object_get(first.json, "id")));
    json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", text, 429);
    ck_assert_str_eq(e2e_error_code(refused), "quota_exceeded");
    ck_assert_str_eq(e2e_error_field(refused), "limits.max_queued_per_user");
    json_decref(refused);
    e2e_response_clear(&first);
    e2e_response_clear(&retry);
    free(second);
    free(running);
    free(text);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

static bool id_in(const char *id, char **ids, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(ids[i], id) == 0) return true;
    return false;
}

START_TEST(test_list_pagination_and_filters)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { JOBS = 25, MULS = 10 };
    char *ids[JOBS];
    for (int i = 0; i < JOBS; i++) {
        json_t *job = small_add_job(i);
        if (i >= JOBS - MULS) json_object_set_new(job, "op", json_string("mul"));
        ids[i] = e2e_submit_ok(d, job);
        json_decref(job);
    }
    for (int i = 0; i < JOBS; i++)
        json_decref(e2e_wait_final_ok(d, ids[i], 30));

    char *seen[JOBS + 1];
    int n_seen = 0, pages = 0;
    char cursor[128] = "";
    for (;;) {
        char path[256];
        snprintf(path, sizeof path, "/v1/jobs?limit=10%s%s", *cursor ? "&after=" : "", cursor);
        json_t *page = e2e_json_ok(d, "GET", path, NULL, 200);
        json_t *jobs = json_object_get(page, "jobs");
        pages++;
        ck_assert_int_eq(json_array_size(jobs), pages < 3 ? 10 : 5);
        size_t i;
        json_t *j;
        json_array_foreach(jobs, i, j)
        {
            const char *id = json_string_value(json_object_get(j, "id"));
            ck_assert_msg(id && !id_in(id, seen, n_seen), "page %d repeats %s", pages, id);
            ck_assert_msg(id_in(id, ids, JOBS), "listed %s was never submitted", id);
            ck_assert(n_seen < JOBS);
            seen[n_seen++] = strdup(id);
        }
        json_t *next = json_object_get(page, "next");
        bool more = json_is_string(next);
        if (more) snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
        ck_assert_msg(more == (pages < 3), "page %d: next is %s", pages, more ? "set" : "null");
        json_decref(page);
        if (!more) break;
    }
    ck_assert_int_eq(n_seen, JOBS);

    /* op filter: exactly the mul jobs. */
    json_t *muls = e2e_json_ok(d, "GET", "/v1/jobs?op=mul&limit=100", NULL, 200);
    json_t *list = json_object_get(muls, "jobs");
    ck_assert_int_eq(json_array_size(list), MULS);
    size_t i;
    json_t *j;
    json_array_foreach(list, i, j)
    {
        ck_assert_str_eq(json_string_value(json_object_get(j, "op")), "mul");
        ck_assert(id_in(json_string_value(json_object_get(j, "id")), ids + JOBS - MULS, MULS));
    }
    json_decref(muls);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=succeeded"), JOBS);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=failed"), 0);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=queued"), 0);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=succeeded&op=add"), JOBS - MULS);

    for (int k = 0; k < JOBS; k++)
        free(ids[k]);
    for (int k = 0; k < n_seen; k++)
        free(seen[k]);
    e2e_daemon_free(d);
}
END_TEST

/* The integer value of key anywhere in v (depth first), or -1. */
static json_int_t find_int(const json_t *v, const char *key)
{
    const char *k;
    json_t *e;
    size_t i;
    if (json_is_object(v)) {
        json_t *direct = json_object_get(v, key);
        if (json_is_integer(direct)) return json_integer_value(direct);
        json_object_foreach((json_t *)v, k, e)
        {
            json_int_t r = find_int(e, key);
            if (r >= 0) return r;
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, e)
        {
            json_int_t r = find_int(e, key);
            if (r >= 0) return r;
        }
    }
    return -1;
}

START_TEST(test_health_metrics_usage_and_info)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *health = e2e_json_ok(d, "GET", "/healthz", NULL, 200);
    ck_assert_str_eq(json_string_value(json_object_get(health, "status")), "ok");
    json_decref(health);
    json_decref(e2e_json_ok(d, "GET", "/readyz", NULL, 200));

    json_t *info = e2e_json_ok(d, "GET", "/v1/info", NULL, 200);
    ck_assert(json_is_string(json_object_get(info, "version")));
    json_decref(info);
    ck_assert(e2e_jobs_info_has_op(d, "saxpy"));

    const char *m201 = "gpujobd_http_requests_total{code=\"201\"}";
    double submitted0 = e2e_metric_ok(d, "gpujobd_jobs_submitted_total");
    double succeeded0 = e2e_metric_ok(d, "gpujobd_jobs_succeeded_total");
    double created0 = e2e_metric_ok(d, m201);
    enum { JOBS = 3 };
    for (int i = 0; i < JOBS; i++) {
        json_t *job = small_add_job(i);
        char *id = e2e_submit_ok(d, job);
        json_decref(e2e_wait_final_ok(d, id, 30));
        free(id);
        json_decref(job);
    }
    ck_assert_int_eq((long)(e2e_metric_ok(d, "gpujobd_jobs_submitted_total") - submitted0), JOBS);
    ck_assert_int_eq((long)(e2e_metric_ok(d, "gpujobd_jobs_succeeded_total") - succeeded0), JOBS);
    ck_assert_int_eq((long)(e2e_metric_ok(d, m201) - created0), JOBS);
    /* The gauges are updated on the scheduler's loop after the job's reply went out, so they
     * may lag the wait by a moment. */
    double until = e2e_now() + 2;
    while ((e2e_metric_ok(d, "gpujobd_jobs_queued") != 0 ||
            e2e_metric_ok(d, "gpujobd_jobs_running") != 0) &&
           e2e_now() < until)
        usleep(10 * 1000);
    ck_assert(e2e_metric_ok(d, "gpujobd_jobs_queued") == 0);
    ck_assert(e2e_metric_ok(d, "gpujobd_jobs_running") == 0);
    ck_assert(e2e_metric_ok(d, "gpujobd_batches_total") >= 1);

    json_t *usage = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_msg(json_is_object(usage), "usage is not an object");
    ck_assert_msg(find_int(usage, "succeeded") == JOBS, "usage: %s",
                  json_dumps(usage, JSON_COMPACT));
    json_decref(usage);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_jobs");
    TCase *tc = tcase_create("jobs");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_submit_waits_for_its_job_when_asked);
    tcase_add_test(tc, test_array_of_100_jobs_in_one_post);
    tcase_add_test(tc, test_cancel_queued_job_never_runs);
    tcase_add_test(tc, test_cancel_running_job_keeps_nothing_of_its_result);
    tcase_add_test(tc, test_deadline_passes_while_queued);
    tcase_add_test(tc, test_idempotent_resubmission_returns_first_job);
    tcase_add_test(tc, test_a_list_key_never_names_a_single_job);
    tcase_add_test(tc, test_idempotent_retry_is_answered_while_the_queue_is_full);
    tcase_add_test(tc, test_list_pagination_and_filters);
    tcase_add_test(tc, test_health_metrics_usage_and_info);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
