/* End-to-end: the batch watchdog. A job that makes no progress within its bound
 * (scheduler.watchdog_min_ms here, as debug_sleep costs next to nothing) fails with
 * watchdog_timeout long before it would have ended, and the job behind it runs. On the CPU
 * backend a replacement worker serves it while /readyz and /metrics say a worker is stuck,
 * until the stuck one comes back and its late result is dropped without harm. On the CUDA
 * backend (GPUJOB_E2E_BACKEND=cuda) the daemon restarts in place to get its device back, as
 * after a sticky fault, and serves on: there is no stuck worker to report. The failed job is
 * charged the time it ran: at least its bound when it fails, and on the CPU backend, once the
 * stuck worker returns, all of its run, in its record and in GET /v1/usage alike. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* One worker, so that the job behind the stuck one runs only on a replacement. */
#define WATCHDOG_CONFIG "[scheduler]\ncpu_threads = 1\nwatchdog_min_ms = 500\n"
/* How long the stuck job sleeps: long enough that every check of the stuck state below comes
 * well before it returns, even on a slow machine. */
#define STUCK_MS 8000

static const char *error_field(const json_t *job, const char *key)
{
    const char *s = json_string_value(json_object_get(json_object_get(job, "error"), key));
    return s ? s : "";
}

/* GET /readyz: its status code, and its body's status copied into status. */
static long readyz(e2e_daemon_t *d, char *status, size_t size, bool *ret_retry_after)
{
    e2e_response_t resp;
    ck_assert_int_eq(e2e_http_request(d, "GET", "/readyz", NULL, NULL, 0, &resp), 0);
    const char *s = json_string_value(json_object_get(resp.json, "status"));
    snprintf(status, size, "%s", s ? s : "");
    char buf[32];
    *ret_retry_after = e2e_response_header(&resp, "Retry-After", buf, sizeof buf) != NULL;
    long code = resp.status;
    e2e_response_clear(&resp);
    return code;
}

/* A job's gpu_ms as the exact integer of ns the daemon made it from. */
static int64_t gpu_ns(const json_t *job)
{
    json_t *v = json_object_get(job, "gpu_ms");
    ck_assert_msg(json_is_number(v), "gpu_ms is not a number");
    return (int64_t)llround(json_number_value(v) * 1e6);
}

START_TEST(test_watchdog_fails_a_stuck_job_and_the_daemon_serves_on)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(WATCHDOG_CONFIG);
    double t0 = e2e_now();
    json_t *stuck_job = e2e_long_job_new(STUCK_MS);
    char *stuck = e2e_submit_ok(d, stuck_job);
    json_t *next_job = e2e_long_job_new(1);
    char *next = e2e_submit_ok(d, next_job);

    json_t *failed = e2e_wait_final_ok(d, stuck, 60);
    ck_assert_str_eq(e2e_job_state(failed), "failed");
    ck_assert_str_eq(error_field(failed, "code"), "watchdog_timeout");
    ck_assert_ptr_nonnull(strstr(error_field(failed, "message"), "500 ms"));
    /* It ran past its bound before it failed, and is charged that. */
    ck_assert_int_ge(gpu_ns(failed), INT64_C(500000000));
    /* The job behind it runs on the replacement worker, while the stuck one still sleeps. */
    json_t *done = e2e_wait_final_ok(d, next, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    char status[32];
    bool retry_after = false;
    long code;
    const char *backend = getenv("GPUJOB_E2E_BACKEND");
    if (!backend || strcmp(backend, "cpu") == 0) {
        code = readyz(d, status, sizeof status, &retry_after);
        ck_assert_double_lt(e2e_now() - t0, STUCK_MS / 1000.0);
        ck_assert_int_eq(code, 503);
        ck_assert_str_eq(status, "recovering");
        ck_assert(retry_after);
        ck_assert_double_eq(e2e_metric_ok(d, "gpujobd_watchdog_expired_total"), 1);
        ck_assert_double_eq(e2e_metric_ok(d, "gpujobd_watchdog_stuck_batches"), 1);
    }

    /* The stuck worker comes back: the daemon is ready again, the late result is dropped and
     * the job stays failed. */
    double until = t0 + STUCK_MS / 1000.0 + 30;
    while ((code = readyz(d, status, sizeof status, &retry_after)) != 200 && e2e_now() < until)
        usleep(50 * 1000);
    ck_assert_int_eq(code, 200);
    ck_assert_double_eq(e2e_metric_ok(d, "gpujobd_watchdog_stuck_batches"), 0);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", stuck);
    json_t *after = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(after), "failed");
    ck_assert_str_eq(error_field(after, "code"), "watchdog_timeout");
    json_t *outputs = json_object_get(after, "outputs");
    ck_assert(!outputs || json_is_null(outputs) || json_object_size(outputs) == 0);
    ck_assert_int_ge(gpu_ns(after), gpu_ns(failed));
    if (!backend || strcmp(backend, "cpu") == 0) {
        /* Its worker slept through all of it, and the usage rollup holds what the records do. */
        ck_assert_msg(gpu_ns(after) >= INT64_C(1000000) * STUCK_MS,
                      "a job stuck for %d ms was charged %.3f ms", STUCK_MS, gpu_ns(after) / 1e6);
        json_t *u = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
        ck_assert_int_eq(
            json_integer_value(json_object_get(json_object_get(u, "totals"), "gpu_ns")),
            gpu_ns(after) + gpu_ns(done));
        json_decref(u);
    }
    /* And it serves on. */
    char *again = e2e_submit_ok(d, next_job);
    json_t *again_done = e2e_wait_final_ok(d, again, 60);
    ck_assert_str_eq(e2e_job_state(again_done), "succeeded");
    int wait_status = 0;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &wait_status), 0);
    ck_assert(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);

    json_decref(again_done);
    free(again);
    json_decref(after);
    json_decref(done);
    json_decref(failed);
    free(next);
    free(stuck);
    json_decref(next_job);
    json_decref(stuck_job);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_watchdog");
    TCase *tc = tcase_create("watchdog");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_watchdog_fails_a_stuck_job_and_the_daemon_serves_on);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
