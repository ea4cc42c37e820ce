/* Cancel on the daemon's CUDA backend:
 * - a running kernel cannot be stopped: the cancel of a launched debug_sleep answers "dropped",
 *   the job ends `cancelled` at once with no output, a wait on it returns at once, and the
 *   device serves the next job;
 * - a job of a batch still waiting in its device's queue (one stream, busy with a long job) is
 *   left out of the launch ("dequeued"), and its batch-mates run and keep their results;
 * - a job cancelled while its batched launch is on the device has its result dropped, and its
 *   batch-mates keep theirs (the launch is large, so that the cancel lands in it; what it
 *   answered is printed, and the batch-mates are checked whatever it was);
 * - a dropped kernel is charged to its owner until its launch ends: the cancel's answer charges
 *   the time it had run, and once the kernel ends its record and GET /v1/usage hold all of
 *   it. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/gpu_daemon.h"
#include "support/gpu_support.h"
#include "support/run_suite.h"

/* The cancelled sleep: far longer than the test waits for anything. */
#define LONG_MS 10000

static const char *cancel_answer(const json_t *job)
{
    const char *what = json_string_value(json_object_get(job, "cancel"));
    return what ? what : "";
}

START_TEST(test_cancel_of_a_launched_kernel_drops_its_result)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    json_t *long_job = e2e_long_job_new(LONG_MS);
    char *id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, id, "running", 30);
    /* The worker launches a batch as soon as it has it; this leaves it the time to. */
    usleep(500 * 1000);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *job = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "cancelled");
    ck_assert_str_eq(cancel_answer(job), "dropped");
    json_decref(job);

    char wait_path[160];
    snprintf(wait_path, sizeof wait_path, "/v1/jobs/%s/wait?timeout=%d", id, LONG_MS / 1000);
    double before = e2e_now();
    job = e2e_json_ok(d, "GET", wait_path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "cancelled");
    ck_assert_msg(e2e_now() - before < LONG_MS / 2000.0, "the wait on a cancelled job waited");
    json_decref(job);
    snprintf(wait_path, sizeof wait_path, "/v1/jobs/%s/outputs/out", id);
    json_decref(e2e_json_ok(d, "GET", wait_path, NULL, 409)); /* outputs only once succeeded */

    /* The device serves on, on another stream. */
    unsigned seed = 7;
    gpu_daemon_check_saxpy(d, &seed, -1);
    json_decref(long_job);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

/* A job's gpu_ms as the exact integer of ns the daemon made it from. */
static int64_t gpu_ns_of(const json_t *job)
{
    return (int64_t)llround(json_number_value(json_object_get(job, "gpu_ms")) * 1e6);
}

START_TEST(test_a_dropped_kernel_is_charged_until_its_launch_ends)
{
    enum { SLEEP_MS = 3000 };
    e2e_daemon_t *d = gpu_daemon_start("");
    json_t *long_job = e2e_long_job_new(SLEEP_MS);
    char *id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, id, "running", 30);
    usleep(500 * 1000);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *job = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(cancel_answer(job), "dropped");
    int64_t at_cancel = gpu_ns_of(job);
    ck_assert_msg(at_cancel >= INT64_C(300000000), "charged %.3f ms at the cancel",
                  at_cancel / 1e6);
    json_decref(job);
    /* The kernel runs on for the rest of its sleep; then it is charged all of it. */
    int64_t charged = at_cancel;
    for (double until = e2e_now() + SLEEP_MS / 1000.0 + 30;
         charged < INT64_C(900000) * SLEEP_MS && e2e_now() < until; usleep(100 * 1000)) {
        job = e2e_json_ok(d, "GET", path, NULL, 200);
        charged = gpu_ns_of(job);
        json_decref(job);
    }
    ck_assert_msg(charged >= INT64_C(900000) * SLEEP_MS,
                  "a dropped kernel of %d ms was charged %.3f ms", SLEEP_MS, charged / 1e6);
    json_t *u = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(u, "totals"), "gpu_ns")),
                     charged);
    json_decref(u);
    json_decref(long_job);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

#define N_MATES 8
#define N_ELEMS 4096

/* N_MATES saxpys of fresh random inputs in one array (one batch); a[i] per job. */
static json_t *saxpy_array(const float *x, const float *y, const float *a)
{
    json_t *arr = json_array();
    for (int j = 0; j < N_MATES; j++)
        json_array_append_new(arr, json_pack("{s:s, s:{s:f}, s:{s:o, s:o}}", "op", "saxpy",
                                             "params", "a", (double)a[j], "inputs", "x",
                                             gpu_tensor_b64(x + (size_t)j * N_ELEMS, N_ELEMS), "y",
                                             gpu_tensor_b64(y + (size_t)j * N_ELEMS, N_ELEMS)));
    return arr;
}

/* Each job of jobs but skip succeeded with a * x + y, checked here. */
static void check_saxpys(e2e_daemon_t *d, const json_t *jobs, int skip, const float *x,
                         const float *y, const float *a)
{
    float *out = malloc(sizeof(float) * N_ELEMS);
    for (int j = 0; j < N_MATES; j++) {
        if (j == skip) continue;
        const char *id = json_string_value(json_object_get(json_array_get(jobs, j), "id"));
        json_t *done = e2e_wait_final_ok(d, id, 120);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        e2e_output_raw_ok(d, id, "out", out, sizeof(float) * N_ELEMS);
        for (int k = 0; k < N_ELEMS; k++) {
            float want = a[j] * x[(size_t)j * N_ELEMS + k] + y[(size_t)j * N_ELEMS + k];
            ck_assert_msg(out[k] == want || (out[k] - want) * (out[k] - want) < 1e-8f,
                          "job %d out[%d] = %g, want %g", j, k, out[k], want);
        }
        json_decref(done);
    }
    free(out);
}

START_TEST(test_a_job_cancelled_before_its_launch_is_left_out_and_its_batch_mates_run)
{
    /* One stream: the long job holds it, and the batch waits in the device's queue. */
    e2e_daemon_t *d = gpu_daemon_start("[gpu]\nstreams_per_device = 1\n");
    json_t *long_job = e2e_long_job_new(LONG_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 30);

    unsigned seed = 11;
    float *x = malloc(sizeof(float) * N_ELEMS * N_MATES);
    float *y = malloc(sizeof(float) * N_ELEMS * N_MATES);
    float a[N_MATES];
    fill_random(DTYPE_F32, x, (int64_t)N_ELEMS * N_MATES, -1, 1, &seed);
    fill_random(DTYPE_F32, y, (int64_t)N_ELEMS * N_MATES, -1, 1, &seed);
    fill_random(DTYPE_F32, a, N_MATES, -4, 4, &seed);
    json_t *arr = saxpy_array(x, y, a);
    char *body = json_dumps(arr, JSON_COMPACT);
    json_t *jobs = e2e_json_ok(d, "POST", "/v1/jobs", body, 201);
    const int victim = 3;
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s",
             json_string_value(json_object_get(json_array_get(jobs, victim), "id")));
    json_t *job = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "cancelled");
    ck_assert_str_eq(cancel_answer(job), "dequeued");
    json_decref(job);

    /* The long job goes: its stream is free for the batch. */
    snprintf(path, sizeof path, "/v1/jobs/%s", long_id);
    job = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(cancel_answer(job), "dropped");
    json_decref(job);
    check_saxpys(d, jobs, victim, x, y, a);

    free(body);
    free(x);
    free(y);
    free(long_id);
    json_decref(arr);
    json_decref(jobs);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

/* Rows and columns of each GEMM of the large launch, and its jobs. */
#define GEMM_N 4096
#define GEMM_JOBS 16

START_TEST(test_batch_mates_of_a_job_dropped_from_a_launch_keep_their_results)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    size_t n = (size_t)GEMM_N * GEMM_N;
    float *ones = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        ones[i] = 1;
    char shape[32];
    snprintf(shape, sizeof shape, "%d,%d", GEMM_N, GEMM_N);
    json_t *buf = e2e_upload_ok(d, "f32", shape, ones, sizeof(float) * n, true, 201);
    const char *buf_id = json_string_value(json_object_get(buf, "id"));
    json_t *arr = json_array();
    for (int i = 0; i < GEMM_JOBS; i++)
        json_array_append_new(arr, json_pack("{s:s, s:{s:{s:s}, s:{s:s}}}", "op", "gemm", "inputs",
                                             "a", "buffer", buf_id, "b", "buffer", buf_id));
    char *body = json_dumps(arr, JSON_COMPACT);
    json_t *jobs = e2e_json_ok(d, "POST", "/v1/jobs", body, 201);
    const int victim = GEMM_JOBS / 2;
    const char *victim_id = json_string_value(json_object_get(json_array_get(jobs, victim), "id"));
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", victim_id);
    e2e_response_t r = {0};
    ck_assert_int_eq(e2e_http_request(d, "DELETE", path, NULL, NULL, 0, &r), 0);
    if (r.status == 200) {
        ck_assert_str_eq(e2e_job_state(r.json), "cancelled");
        printf("the cancel answered %s\n", cancel_answer(r.json));
        ck_assert(!strcmp(cancel_answer(r.json), "dropped") ||
                  !strcmp(cancel_answer(r.json), "dequeued"));
    } else {
        ck_assert_int_eq(r.status, 409);
        printf("the launch ended before its cancel\n");
    }
    e2e_response_clear(&r);

    float *out = malloc(sizeof(float) * n);
    for (int j = 0; j < GEMM_JOBS; j++) {
        const char *id = json_string_value(json_object_get(json_array_get(jobs, j), "id"));
        json_t *done = e2e_wait_final_ok(d, id, 120);
        if (j == victim && strcmp(e2e_job_state(done), "succeeded") != 0) {
            ck_assert_str_eq(e2e_job_state(done), "cancelled");
            json_decref(done);
            continue;
        }
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        e2e_output_raw_ok(d, id, "out", out, sizeof(float) * n);
        for (size_t k = 0; k < n; k += 4099)
            ck_assert_msg(out[k] == GEMM_N, "job %d out[%zu] = %g", j, k, out[k]);
        json_decref(done);
    }
    free(out);
    free(body);
    free(ones);
    json_decref(arr);
    json_decref(jobs);
    json_decref(buf);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    gpu_require();
    Suite *s = suite_create("gpu_cancel");
    TCase *tc = tcase_create("cancel");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_cancel_of_a_launched_kernel_drops_its_result);
    tcase_add_test(tc, test_a_job_cancelled_before_its_launch_is_left_out_and_its_batch_mates_run);
    tcase_add_test(tc, test_batch_mates_of_a_job_dropped_from_a_launch_keep_their_results);
    tcase_add_test(tc, test_a_dropped_kernel_is_charged_until_its_launch_ends);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
