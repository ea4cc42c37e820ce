/* End-to-end: what bounds a job while it runs. Its own time limit (time_limit_ms): a job past
 * it fails with `time_limit`, stopped on the CPU backend, whose worker then takes the next job
 * at once; the limit a job may ask for is bounded by the user's policy, which a refusal names;
 * the CUDA backend, which cannot stop a kernel, refuses a job whose cost estimate passes its
 * limit, and the CPU backend takes it. Device memory: the CPU backend's working memory bounded
 * as a GPU's pool is (scheduler.cpu_memory_cap), a job whose batch the pool cannot serve waits,
 * queued and shown waiting for device_memory, while a worker is free, and runs once memory comes
 * back; a batch larger than the pool is cut to fit; a user's share of the pool holds the user's
 * jobs and resident buffers back; a job that could never fit is refused at submission.
 *
 * Over loopback TCP the caller is the test's own account (e2e_caller_name), whose [user.NAME]
 * section is its own. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/run_suite.h"

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
    ck_assert_str_eq(e2e_error_code(failed), "time_limit");
    ck_assert_int_eq(json_integer_value(json_object_get(failed, "time_limit_ms")), 500);
    double started = e2e_job_time_ok(failed, "started_at"),
           ended = e2e_job_time_ok(failed, "finished_at");
    ck_assert_msg(ended - started >= 0.45 && ended - started < 2.0,
                  "the job failed %.3f s after it started, not about 0.5 s", ended - started);
    /* Its params are the submission's, in the answer that carries the failure as after. */
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(failed, "params"), "ms")),
                     on_cuda() ? 3000 : 5000);

    json_t *next = e2e_wait_final_ok(d, next_id, 30);
    ck_assert_str_eq(e2e_job_state(next), "succeeded");
    double next_ended = e2e_job_time_ok(next, "finished_at");
    if (!on_cuda())
        ck_assert_msg(next_ended - ended < 1.0,
                      "the next job ended %.3f s after the limit's failure: the worker was not "
                      "freed",
                      next_ended - ended);
    json_decref(next);

    /* The failure is the job's record: it reads the same from the store. */
    json_t *stored = e2e_get_job_ok(d, long_id);
    ck_assert_str_eq(e2e_error_code(stored), "time_limit");
    json_decref(stored);
    json_decref(failed);
    free(next_id);
    free(long_id);
    e2e_daemon_free(d);
}
END_TEST

/* A job killed with the daemon while it runs is re-queued by the next start with its limit:
 * it runs again and fails with time_limit, instead of running its 5 s out. */
START_TEST(test_a_job_keeps_its_time_limit_across_a_restart)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    char *text = sleep_job_text(5000, 400);
    char *id = submitted_id(d, text);
    free(text);
    e2e_wait_state_ok(d, id, "running", 10);
    e2e_daemon_kill(d);
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    json_t *failed = e2e_wait_final_ok(d, id, 30);
    ck_assert_str_eq(e2e_error_code(failed), "time_limit");
    ck_assert_int_eq(json_integer_value(json_object_get(failed, "attempts")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(failed, "time_limit_ms")), 400);
    json_decref(failed);
    free(id);
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
    char config[256], field[128];
    snprintf(config, sizeof config,
             "[limits]\nmax_time_limit_ms = 1000\n[user.%s]\n"
             "max_time_limit_ms = 5000\n",
             e2e_caller_name());
    snprintf(field, sizeof field, "user.%s.max_time_limit_ms", e2e_caller_name());
    d = e2e_daemon_start_ok(config);
    text = sleep_job_text(0, 5000);
    json_decref(e2e_json_ok(d, "POST", "/v1/jobs", text, 201));
    free(text);
    text = sleep_job_text(0, 5001);
    refused = e2e_json_ok(d, "POST", "/v1/jobs", text, 422);
    free(text);
    ck_assert_str_eq(e2e_error_field(refused), field);
    json_decref(refused);
    e2e_daemon_free(d);
}
END_TEST

/* A gemm estimated at about 6 ms (2 x 512^3 flops at 100 GFLOP/s, and its 3 MiB at 1 GB/s) with
 * a limit of 1 ms: the CPU backend takes it and keeps the limit by stopping it; the CUDA backend,
 * which could not stop its kernel, refuses it at submission, naming the field. */
START_TEST(test_a_limit_under_the_cost_estimate_is_refused_only_where_jobs_cannot_be_stopped)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 512 };
    float *ones = calloc((size_t)N * N, sizeof *ones);
    json_t *a = e2e_upload_ok(d, "f32", "512,512", ones, sizeof(float) * N * N, false, 201);
    const char *a_id = json_string_value(json_object_get(a, "id"));
    char body[256];
    snprintf(body, sizeof body,
             "{\"op\": \"gemm\", \"time_limit_ms\": 1, \"inputs\": {\"a\": {\"buffer\": \"%s\"}, "
             "\"b\": {\"buffer\": \"%s\"}}}",
             a_id, a_id);
    if (on_cuda()) {
        json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", body, 422);
        ck_assert_str_eq(e2e_error_code(refused), "time_limit_too_short");
        ck_assert_str_eq(e2e_error_field(refused), "time_limit_ms");
        json_decref(refused);
    } else {
        json_t *job = e2e_json_ok(d, "POST", "/v1/jobs", body, 201);
        ck_assert_int_eq(json_integer_value(json_object_get(job, "time_limit_ms")), 1);
        json_decref(job);
    }
    json_decref(a);
    free(ones);
    e2e_daemon_free(d);
}
END_TEST

/* A debug_sleep of ms on a zero f32 x of n elements (b64), as JSON text: it takes 2 x 4n bytes
 * of working memory (x and out), n a multiple of 64. */
static char *sized_sleep_text(int ms, size_t n)
{
    float *zeros = calloc(n, sizeof *zeros);
    char *b64 = e2e_base64(zeros, n * sizeof *zeros);
    json_t *job =
        json_pack("{s:s, s:{s:i}, s:{s:{s:s, s:[I], s:s}}}", "op", "debug_sleep", "params", "ms",
                  ms, "inputs", "x", "dtype", "f32", "shape", (json_int_t)n, "b64", b64);
    char *text = json_dumps(job, JSON_COMPACT);
    json_decref(job);
    free(b64);
    free(zeros);
    return text;
}

static const char *waiting_field(const json_t *job, const char *key)
{
    const char *v = json_string_value(json_object_get(json_object_get(job, "waiting"), key));
    return v ? v : "";
}

/* Polls job id until its waiting.reason is reason; fails the test after 10 s. */
static json_t *wait_reason_ok(e2e_daemon_t *d, const char *id, const char *reason)
{
    double until = e2e_now() + 10;
    for (;;) {
        json_t *job = e2e_get_job_ok(d, id);
        if (!strcmp(waiting_field(job, "reason"), reason)) return job;
        ck_assert_msg(e2e_now() < until, "job %s is %s, waiting for '%s', not '%s'", id,
                      e2e_job_state(job), waiting_field(job, "reason"), reason);
        json_decref(job);
        usleep(20000);
    }
}

/* Two debug_sleeps of 1500 ms on 64 KiB each: the first runs, and the second's JSON is
 * returned once it waits for device memory; their ids go to ret_first and ret_second. */
static json_t *second_of_two_waits_for_memory_ok(e2e_daemon_t *d, char **ret_first,
                                                 char **ret_second)
{
    char *text = sized_sleep_text(1500, 8192);
    *ret_first = submitted_id(d, text);
    e2e_wait_state_ok(d, *ret_first, "running", 10);
    *ret_second = submitted_id(d, text);
    free(text);
    return wait_reason_ok(d, *ret_second, "device_memory");
}

/* A debug_sleep on 128 KiB is refused at submission (413 exceeds_device_memory), naming
 * field. */
static void too_large_for_memory_refused_ok(e2e_daemon_t *d, const char *field)
{
    char *text = sized_sleep_text(0, 16384);
    json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", text, 413);
    free(text);
    ck_assert_str_eq(e2e_error_code(refused), "exceeds_device_memory");
    ck_assert_str_eq(e2e_error_field(refused), field);
    json_decref(refused);
}

/* Two workers and a pool of 96 KiB: a job of 64 KiB runs, the next one of 64 KiB waits for
 * device memory while the second worker is idle, and starts only once the first has ended; a
 * job of 128 KiB could never fit and is refused at once, naming the key that sets the pool. */
START_TEST(test_a_job_the_pool_cannot_serve_waits_for_device_memory)
{
    if (on_cuda()) return; /* the GPU's pool: tests/gpu/test_gpu_limits.c */
    e2e_daemon_t *d = e2e_daemon_start_ok("[scheduler]\ncpu_threads = 2\ncpu_memory_cap = 96KiB\n"
                                          "[limits]\ndevice_memory_percent_per_user = 0\n");
    char *first, *second;
    json_t *waiting = second_of_two_waits_for_memory_ok(d, &first, &second);
    ck_assert_str_eq(e2e_job_state(waiting), "queued");
    ck_assert_str_eq(waiting_field(waiting, "limit"), "scheduler.cpu_memory_cap");
    json_decref(waiting);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=running"), 1);

    json_t *a = e2e_wait_final_ok(d, first, 30), *b = e2e_wait_final_ok(d, second, 30);
    ck_assert_str_eq(e2e_job_state(a), "succeeded");
    ck_assert_str_eq(e2e_job_state(b), "succeeded");
    ck_assert_msg(e2e_job_time_ok(b, "started_at") >= e2e_job_time_ok(a, "finished_at"),
                  "the second job started before the first gave its memory back");
    json_decref(a);
    json_decref(b);

    too_large_for_memory_refused_ok(d, "scheduler.cpu_memory_cap");
    free(second);
    free(first);
    e2e_daemon_free(d);
}
END_TEST

/* Eight adds of 24 KiB each (two inputs and an output of 8 KiB) submitted together, with a pool
 * of 96 KiB and one worker: their batch of 192 KiB could never fit, so it is cut into batches
 * that do, and every job succeeds. */
START_TEST(test_a_batch_larger_than_the_pool_is_cut_to_fit)
{
    if (on_cuda()) return; /* the GPU's pool: tests/gpu/test_gpu_limits.c */
    e2e_daemon_t *d = e2e_daemon_start_ok("[scheduler]\ncpu_threads = 1\ncpu_memory_cap = 96KiB\n"
                                          "[limits]\ndevice_memory_percent_per_user = 0\n");
    enum { N = 2048, JOBS = 8 };
    float *ones = malloc(N * sizeof *ones);
    for (int i = 0; i < N; i++)
        ones[i] = 1;
    char *b64 = e2e_base64(ones, N * sizeof *ones);
    json_t *list = json_array();
    for (int i = 0; i < JOBS; i++)
        json_array_append_new(list,
                              json_pack("{s:s, s:{s:{s:s, s:[i], s:s}, s:{s:s, s:[i], s:s}}}", "op",
                                        "add", "inputs", "x", "dtype", "f32", "shape", N, "b64",
                                        b64, "y", "dtype", "f32", "shape", N, "b64", b64));
    char *text = json_dumps(list, JSON_COMPACT);
    json_t *jobs = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
    for (int i = 0; i < JOBS; i++) {
        const char *id = json_string_value(json_object_get(json_array_get(jobs, i), "id"));
        json_t *done = e2e_wait_final_ok(d, id, 30);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        json_int_t batch = json_integer_value(json_object_get(done, "batch_size"));
        ck_assert_msg(batch >= 1 && batch <= 4, "job %d ran in a batch of %lld", i,
                      (long long)batch);
        json_decref(done);
    }
    json_decref(jobs);
    free(text);
    json_decref(list);
    free(b64);
    free(ones);
    e2e_daemon_free(d);
}
END_TEST

/* A user's share of a pool of 192 KiB is 50%, 96 KiB: with a job of 64 KiB running, the user's
 * next one waits for device memory although the pool has room, naming the share's key, and
 * runs once the first has ended. A job past the share alone is refused at submission, and so is
 * a resident buffer that would take the user past it. */
START_TEST(test_a_users_share_of_device_memory_holds_its_jobs_and_buffers_back)
{
    if (on_cuda()) return; /* the GPU's pool: tests/gpu/test_gpu_limits.c */
    e2e_daemon_t *d = e2e_daemon_start_ok("[scheduler]\ncpu_threads = 2\ncpu_memory_cap = 192KiB\n"
                                          "[limits]\ndevice_memory_percent_per_user = 50\n");
    char *first, *second;
    json_t *waiting = second_of_two_waits_for_memory_ok(d, &first, &second);
    ck_assert_str_eq(waiting_field(waiting, "limit"), "limits.device_memory_percent_per_user");
    json_decref(waiting);
    json_t *b = e2e_wait_final_ok(d, second, 30);
    ck_assert_str_eq(e2e_job_state(b), "succeeded");
    json_decref(b);

    too_large_for_memory_refused_ok(d, "limits.device_memory_percent_per_user");

    float zeros[16384] = {0};
    json_decref(e2e_upload_ok(d, "f32", "16384", zeros, 64 * 1024, true, 201));
    json_t *refused = e2e_upload_ok(d, "f32", "16384", zeros, 64 * 1024, true, 413);
    ck_assert_str_eq(e2e_error_code(refused), "quota_exceeded");
    ck_assert_str_eq(e2e_error_field(refused), "limits.device_memory_percent_per_user");
    json_decref(refused);
    free(second);
    free(first);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_limits");
    TCase *tc = tcase_create("time_limit");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_a_job_past_its_time_limit_fails_and_its_worker_takes_the_next_job);
    tcase_add_test(tc, test_a_job_keeps_its_time_limit_across_a_restart);
    tcase_add_test(tc, test_time_limits_are_bounded_by_the_users_policy);
    tcase_add_test(
        tc, test_a_limit_under_the_cost_estimate_is_refused_only_where_jobs_cannot_be_stopped);
    suite_add_tcase(s, tc);
    TCase *memory = tcase_create("device_memory");
    tcase_set_timeout(memory, 120);
    tcase_add_test(memory, test_a_job_the_pool_cannot_serve_waits_for_device_memory);
    tcase_add_test(memory, test_a_batch_larger_than_the_pool_is_cut_to_fit);
    tcase_add_test(memory, test_a_users_share_of_device_memory_holds_its_jobs_and_buffers_back);
    suite_add_tcase(s, memory);
    return run_suite(s);
}
