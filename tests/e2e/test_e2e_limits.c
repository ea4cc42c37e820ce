/* End-to-end: what bounds a job while it runs. Its own time limit (time_limit_ms): a job past
 * it fails with `time_limit`, stopped on the CPU backend, whose worker then takes the next job
 * at once; the limit a job may ask for is bounded by the user's policy, which a refusal names;
 * the CUDA backend, which cannot stop a kernel, refuses a job whose cost estimate passes its
 * limit, and the CPU backend takes it.
 *
 * Over TCP every client is the user "local", so a [user.local] section is the caller's own. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support/daemon_harness.h"

/* True when the suite runs the daemon on CUDA ($GPUJOB_E2E_BACKEND). */
static bool on_cuda(void)
{
    const char *b = getenv("GPUJOB_E2E_BACKEND");
    return b && strcmp(b, "cuda") == 0;
}

static const char *error_message(const json_t *body)
{
    const char *s = json_string_value(json_object_get(json_object_get(body, "error"), "message"));
    return s ? s : "";
}

static const char *job_error_code(const json_t *job)
{
    const char *s = json_string_value(json_object_get(json_object_get(job, "error"), "code"));
    return s ? s : "";
}

/* A timestamp field of a job ("2026-01-02T03:04:05.678901Z") in seconds since the epoch. */
static double job_time(const json_t *job, const char *key)
{
    const char *v = json_string_value(json_object_get(job, key));
    struct tm tm = {0};
    int usec = 0;
    ck_assert_msg(v && sscanf(v, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                              &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &usec) == 7,
                  "%s is not a time", key);
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (double)timegm(&tm) + usec * 1e-6;
}

/* debug_sleep of ms with the time limit limit_ms (0: the field left out), as JSON text. */
static char *sleep_job_text(int ms, long limit_ms)
{
    json_t *job = e2e_long_job_new(ms);
    if (limit_ms) json_object_set_new(job, "time_limit_ms", json_integer(limit_ms));
    char *text = json_dumps(job, JSON_COMPACT);
    json_decref(job);
    return text;
}

/* The id of a submission's answer, malloc'd. */
static char *submitted_id(e2e_daemon_t *d, const char *text)
{
    json_t *job = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
    char *id = strdup(json_string_value(json_object_get(job, "id")));
    json_decref(job);
    return id;
}

/* A 5 s sleep with a limit of 500 ms fails `time_limit` half a second after it started, and the
 * job queued behind it on the only worker runs at once, long before the sleep would have
 * ended. */
START_TEST(test_a_job_past_its_time_limit_fails_and_its_worker_takes_the_next_job)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    char *text = sleep_job_text(on_cuda() ? 3000 : 5000, 500);
    char *long_id = submitted_id(d, text);
    free(text);
    text = sleep_job_text(0, 0);
    char *next_id = submitted_id(d, text);
    free(text);

    json_t *failed = e2e_wait_final_ok(d, long_id, 30);
    ck_assert_str_eq(e2e_job_state(failed), "failed");
    ck_assert_str_eq(job_error_code(failed), "time_limit");
    ck_assert_int_eq(json_integer_value(json_object_get(failed, "time_limit_ms")), 500);
    double started = job_time(failed, "started_at"), ended = job_time(failed, "finished_at");
    ck_assert_msg(ended - started >= 0.45 && ended - started < 2.0,
                  "the job failed %.3f s after it started, not about 0.5 s", ended - started);
    /* Its params are the submission's, in the answer that carries the failure as after. */
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(failed, "params"), "ms")),
                     on_cuda() ? 3000 : 5000);

    json_t *next = e2e_wait_final_ok(d, next_id, 30);
    ck_assert_str_eq(e2e_job_state(next), "succeeded");
    double next_ended = job_time(next, "finished_at");
    if (!on_cuda())
        ck_assert_msg(next_ended - ended < 1.0,
                      "the next job ended %.3f s after the limit's failure: the worker was not "
                      "freed",
                      next_ended - ended);
    json_decref(next);

    /* The failure is the job's record: it reads the same from the store. */
    json_t *stored = e2e_get_job_ok(d, long_id);
    ck_assert_str_eq(job_error_code(stored), "time_limit");
    json_decref(stored);
    json_decref(failed);
    free(next_id);
    free(long_id);
    e2e_daemon_free(d);
}
END_TEST

/* The default limit and the user's bound: a job without time_limit_ms gets the default within
 * the bound; one that asks for more than the bound, or for none, gets 422 naming the key that
 * set the bound (the user's own section before [limits]); a bad value is 400 on its field. */
START_TEST(test_time_limits_are_bounded_by_the_users_policy)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[limits]\ndefault_time_limit_ms = 700\n"
                                          "max_time_limit_ms = 1000\n");
    char *text = sleep_job_text(0, 0);
    json_t *job = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
    free(text);
    ck_assert_int_eq(json_integer_value(json_object_get(job, "time_limit_ms")), 700);
    json_decref(job);
    text = sleep_job_text(0, 1000);
    job = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
    free(text);
    ck_assert_int_eq(json_integer_value(json_object_get(job, "time_limit_ms")), 1000);
    json_decref(job);

    /* The second job of a list asks for too much: nothing of the list is taken. */
    char list[512];
    char *ok = sleep_job_text(0, 10), *over = sleep_job_text(0, 1001);
    snprintf(list, sizeof list, "[%s, %s]", ok, over);
    json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", list, 422);
    ck_assert_str_eq(e2e_error_code(refused), "time_limit_too_long");
    ck_assert_str_eq(e2e_error_field(refused), "limits.max_time_limit_ms");
    ck_assert_ptr_nonnull(strstr(error_message(refused), "[1].time_limit_ms = 1001 ms"));
    ck_assert_ptr_nonnull(strstr(error_message(refused), "limits.max_time_limit_ms = 1000 ms"));
    json_decref(refused);
    free(ok);
    free(over);
    refused = e2e_json_ok(d, "POST", "/v1/jobs",
                          "{\"op\": \"debug_sleep\", \"params\": {\"ms\": 0}, \"time_limit_ms\": "
                          "null, \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [1], "
                          "\"data\": [1]}}}",
                          422);
    ck_assert_str_eq(e2e_error_code(refused), "time_limit_too_long");
    json_decref(refused);
    refused = e2e_json_ok(d, "POST", "/v1/jobs",
                          "{\"op\": \"debug_sleep\", \"params\": {\"ms\": 0}, \"time_limit_ms\": "
                          "0, \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [1], "
                          "\"data\": [1]}}}",
                          400);
    ck_assert_str_eq(e2e_error_field(refused), "time_limit_ms");
    json_decref(refused);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 2);
    e2e_daemon_free(d);

    /* A user's own section decides before [limits], and is named. */
    d = e2e_daemon_start_ok("[limits]\nmax_time_limit_ms = 1000\n"
                            "[user.local]\nmax_time_limit_ms = 5000\n");
    text = sleep_job_text(0, 5000);
    json_decref(e2e_json_ok(d, "POST", "/v1/jobs", text, 201));
    free(text);
    text = sleep_job_text(0, 5001);
    refused = e2e_json_ok(d, "POST", "/v1/jobs", text, 422);
    free(text);
    ck_assert_str_eq(e2e_error_field(refused), "user.local.max_time_limit_ms");
    json_decref(refused);
    e2e_daemon_free(d);
}
END_TEST

/* A gemm estimated at about 170 ms (2 x 512^3 flops at 100 GFLOP/s, and its bytes) with a limit
 * of 20 ms: the CPU backend takes it and keeps the limit by stopping it; the CUDA backend, which
 * could not stop its kernel, refuses it at submission, naming the field. */
START_TEST(test_a_limit_under_the_cost_estimate_is_refused_only_where_jobs_cannot_be_stopped)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 512 };
    float *ones = calloc((size_t)N * N, sizeof *ones);
    json_t *a = e2e_upload_ok(d, "f32", "512,512", ones, sizeof(float) * N * N, false, 201);
    const char *a_id = json_string_value(json_object_get(a, "id"));
    char body[256];
    snprintf(body, sizeof body,
             "{\"op\": \"gemm\", \"time_limit_ms\": 20, \"inputs\": {\"a\": {\"buffer\": \"%s\"}, "
             "\"b\": {\"buffer\": \"%s\"}}}",
             a_id, a_id);
    if (on_cuda()) {
        json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", body, 422);
        ck_assert_str_eq(e2e_error_code(refused), "time_limit_too_short");
        ck_assert_str_eq(e2e_error_field(refused), "time_limit_ms");
        json_decref(refused);
    } else {
        json_t *job = e2e_json_ok(d, "POST", "/v1/jobs", body, 201);
        ck_assert_int_eq(json_integer_value(json_object_get(job, "time_limit_ms")), 20);
        json_decref(job);
    }
    json_decref(a);
    free(ones);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_limits");
    TCase *tc = tcase_create("time_limit");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_a_job_past_its_time_limit_fails_and_its_worker_takes_the_next_job);
    tcase_add_test(tc, test_time_limits_are_bounded_by_the_users_policy);
    tcase_add_test(
        tc, test_a_limit_under_the_cost_estimate_is_refused_only_where_jobs_cannot_be_stopped);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
