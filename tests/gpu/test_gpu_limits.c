/* What bounds a job on the daemon's CUDA backend:
 * - a launched kernel cannot be stopped, so a job past its time limit (a debug_sleep of 3 s
 *   with time_limit_ms = 500, whose cost estimate is tiny) fails with time_limit about half a
 *   second after its launch, its result dropped, and the device serves the next job meanwhile;
 * - a job whose cost estimate passes its time limit (a 2048^3 f32 gemm, about 172 ms at the
 *   estimate's rates, with 10 ms) is refused at submission, and the same job without a limit
 *   of its own runs;
 * - with GPU 0's pool bounded to 64 MiB, a job of 48 MiB runs and the next one of 48 MiB waits
 *   for device memory, queued and saying so, while the device's other streams are free, and
 *   starts once the first has ended. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/gpu_daemon.h"
#include "support/gpu_support.h"
#include "support/run_suite.h"

START_TEST(test_a_kernel_past_its_time_limit_fails_and_its_result_is_dropped)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    json_t *job = e2e_long_job_new(3000);
    json_object_set_new(job, "time_limit_ms", json_integer(500));
    char *id = e2e_submit_ok(d, job);
    json_t *failed = e2e_wait_final_ok(d, id, 30);
    ck_assert_str_eq(e2e_job_state(failed), "failed");
    ck_assert_str_eq(e2e_error_code(failed), "time_limit");
    double ran = e2e_job_time_ok(failed, "finished_at") - e2e_job_time_ok(failed, "started_at");
    ck_assert_msg(ran >= 0.45 && ran < 2.0, "failed %.3f s after its start", ran);
    ck_assert_int_eq(json_object_size(json_object_get(failed, "outputs")), 0);
    json_decref(failed);
    /* The device serves on, on another stream, while the dropped kernel runs out. */
    unsigned seed = 11;
    gpu_daemon_check_saxpy(d, &seed, -1);
    json_decref(job);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_job_whose_estimate_passes_its_time_limit_is_refused_at_submission)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    enum { N = 2048 };
    float *ones = calloc((size_t)N * N, sizeof *ones);
    json_t *a = e2e_upload_ok(d, "f32", "2048,2048", ones, sizeof(float) * N * N, false, 201);
    const char *a_id = json_string_value(json_object_get(a, "id"));
    json_t *job = json_pack("{s:s, s:I, s:{s:{s:s}, s:{s:s}}}", "op", "gemm", "time_limit_ms",
                            (json_int_t)10, "inputs", "a", "buffer", a_id, "b", "buffer", a_id);
    char *text = json_dumps(job, JSON_COMPACT);
    json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", text, 422);
    ck_assert_str_eq(e2e_error_code(refused), "time_limit_too_short");
    ck_assert_str_eq(e2e_error_field(refused), "time_limit_ms");
    json_decref(refused);
    free(text);
    json_object_del(job, "time_limit_ms");
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    json_decref(done);
    free(id);
    json_decref(job);
    json_decref(a);
    free(ones);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_batch_the_pool_cannot_serve_waits_for_device_memory)
{
    e2e_daemon_t *d = gpu_daemon_start("[gpu]\ndevices = 0\ndevice_memory_cap = 64MiB\n"
                                       "[limits]\ndevice_memory_percent_per_user = 0\n");
    enum { N = 6 << 20 }; /* 24 MiB of f32: x and out take 48 MiB */
    float *x = calloc(N, sizeof *x);
    json_t *buf = e2e_upload_ok(d, "f32", "6291456", x, sizeof(float) * N, false, 201);
    json_t *job =
        json_pack("{s:s, s:{s:i}, s:{s:{s:s}}}", "op", "debug_sleep", "params", "ms", 2000,
                  "inputs", "x", "buffer", json_string_value(json_object_get(buf, "id")));
    char *first = e2e_submit_ok(d, job);
    e2e_wait_state_ok(d, first, "running", 30);
    char *second = e2e_submit_ok(d, job);
    double until = e2e_now() + 10;
    for (;;) {
        json_t *got = e2e_get_job_ok(d, second);
        json_t *waiting = json_object_get(got, "waiting");
        const char *reason = json_string_value(json_object_get(waiting, "reason"));
        if (reason && !strcmp(reason, "device_memory")) {
            ck_assert_str_eq(e2e_job_state(got), "queued");
            ck_assert_str_eq(json_string_value(json_object_get(waiting, "limit")),
                             "gpu.device_memory_cap");
            json_decref(got);
            break;
        }
        ck_assert_msg(e2e_now() < until, "the second job is %s, waiting for %s", e2e_job_state(got),
                      reason ? reason : "nothing");
        json_decref(got);
        usleep(20000);
    }
    json_t *a = e2e_wait_final_ok(d, first, 60), *b = e2e_wait_final_ok(d, second, 60);
    ck_assert_str_eq(e2e_job_state(a), "succeeded");
    ck_assert_str_eq(e2e_job_state(b), "succeeded");
    ck_assert_msg(e2e_job_time_ok(b, "started_at") >= e2e_job_time_ok(a, "finished_at"),
                  "the second job started before the first gave its memory back");
    json_decref(a);
    json_decref(b);
    free(second);
    free(first);
    json_decref(job);
    json_decref(buf);
    free(x);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    gpu_require();
    Suite *s = suite_create("gpu_limits");
    TCase *tc = tcase_create("gpu_limits");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_a_kernel_past_its_time_limit_fails_and_its_result_is_dropped);
    tcase_add_test(tc, test_a_job_whose_estimate_passes_its_time_limit_is_refused_at_submission);
    tcase_add_test(tc, test_a_batch_the_pool_cannot_serve_waits_for_device_memory);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
