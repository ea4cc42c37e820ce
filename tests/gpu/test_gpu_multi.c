/* The daemon on its CUDA backend with two GPUs or more (skipped with fewer):
 * - a burst of jobs spreads over the devices, and pinned jobs run where they are pinned;
 * - resident buffers are spread over the devices, and the jobs that read them run there; a job
 *   that reads two of them keeps a copy of the other on its device;
 * - a sticky fault on one device loses every device's context: the job running on the other
 *   device runs again and succeeds, the faulting job is found out when it runs alone and
 *   fails, and after the daemon's restarts both devices serve;
 * - [gpu] devices serves a chosen device only. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/daemon_harness.h"
#include "support/gpu_daemon.h"
#include "support/gpu_support.h"

#define BURST_JOBS 4000
#define PER_POST 1000
#define ELEMS 1000

START_TEST(test_a_burst_spreads_over_the_gpus_and_pins_hold)
{
    e2e_daemon_t *d = gpu_daemon_start("[limits]\nmax_jobs_per_request = 1000\n");
    unsigned seed = 2024;
    float *x = malloc(sizeof(float) * ELEMS);
    fill_random(DTYPE_F32, x, ELEMS, -1, 1, &seed);
    char **ids = calloc(BURST_JOBS, sizeof *ids);
    for (int post = 0; post < BURST_JOBS / PER_POST; post++) {
        json_t *arr = json_array();
        for (int k = 0; k < PER_POST; k++)
            json_array_append_new(arr,
                                  json_pack("{s:s, s:{s:f}, s:{s:o, s:o}}", "op", "saxpy", "params",
                                            "a", 2.0, "inputs", "x", gpu_tensor_b64(x, ELEMS), "y",
                                            gpu_tensor_b64(x, ELEMS)));
        char *body = json_dumps(arr, JSON_COMPACT);
        json_t *res = e2e_json_ok(d, "POST", "/v1/jobs", body, 201);
        for (int k = 0; k < PER_POST; k++)
            ids[post * PER_POST + k] =
                strdup(json_string_value(json_object_get(json_array_get(res, k), "id")));
        json_decref(res);
        free(body);
        json_decref(arr);
    }
    int ran_on[2] = {0, 0};
    for (int j = 0; j < BURST_JOBS; j++) {
        json_t *job = e2e_wait_final_ok(d, ids[j], 120);
        ck_assert_str_eq(e2e_job_state(job), "succeeded");
        int dev = (int)json_integer_value(json_object_get(job, "run_device"));
        ck_assert(dev >= 0);
        if (dev < 2) ran_on[dev]++;
        json_decref(job);
        free(ids[j]);
    }
    printf("burst of %d jobs: %d on GPU 0, %d on GPU 1\n", BURST_JOBS, ran_on[0], ran_on[1]);
    ck_assert_int_gt(ran_on[0], 0);
    ck_assert_int_gt(ran_on[1], 0);

    for (int i = 0; i < 4; i++) {
        gpu_daemon_check_saxpy(d, &seed, 1);
        gpu_daemon_check_saxpy(d, &seed, 0);
    }
    free(ids);
    free(x);
    e2e_daemon_free(d);
}
END_TEST

/* The n values of a succeeded job's output "out", into got. */
static void out_values(const json_t *done, double *got, long n)
{
    json_t *out = json_object_get(json_object_get(done, "outputs"), "out");
    ck_assert_int_eq(e2e_json_flatten(json_object_get(out, "data"), got, n), n);
    /* f32 values come as the shortest text that reads back to them as f32s. */
    for (long i = 0; i < n; i++)
        got[i] = (float)got[i];
}

START_TEST(test_resident_buffers_spread_over_the_gpus_and_draw_their_jobs)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    enum { N = 4096 };
    unsigned seed = 77;
    float w[2][N], y[N];
    char *ids[2];
    int placed[2];
    for (int k = 0; k < 2; k++) {
        fill_random(DTYPE_F32, w[k], N, -1, 1, &seed);
        json_t *meta = e2e_upload_ok(d, "f32", "4096", w[k], sizeof w[k], true, 201);
        ids[k] = strdup(json_string_value(json_object_get(meta, "id")));
        placed[k] = (int)json_integer_value(json_object_get(meta, "device"));
        json_decref(meta);
    }
    /* Two equal devices: the second buffer goes where the first did not. */
    ck_assert_int_ne(placed[0], placed[1]);

    for (int k = 0; k < 2; k++) {
        fill_random(DTYPE_F32, y, N, -1, 1, &seed);
        json_t *job = json_pack("{s:s, s:{s:{s:s}, s:o}}", "op", "mul", "inputs", "x", "buffer",
                                ids[k], "y", gpu_tensor_b64(y, N));
        char *id = e2e_submit_ok(d, job);
        json_t *done = e2e_wait_final_ok(d, id, 60);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        ck_assert_int_eq(json_integer_value(json_object_get(done, "run_device")), placed[k]);
        double got[N];
        out_values(done, got, N);
        for (int i = 0; i < N; i++)
            ck_assert_msg(got[i] == (double)(w[k][i] * y[i]), "buffer %d [%d]", k, i);
        json_decref(done);
        json_decref(job);
        free(id);
    }
    for (int k = 0; k < 2; k++) {
        json_t *dev = gpu_daemon_device(d, placed[k]);
        ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_buffers")), 1);
        json_decref(dev);
    }

    /* A job that reads both runs on one device, which keeps a copy of the other's buffer
     * rather than copying it from the host at every run. */
    json_t *job = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}}", "op", "add", "inputs", "x", "buffer",
                            ids[0], "y", "buffer", ids[1]);
    for (int round = 0; round < 2; round++) {
        char *id = e2e_submit_ok(d, job);
        json_t *done = e2e_wait_final_ok(d, id, 60);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        int ran = (int)json_integer_value(json_object_get(done, "run_device"));
        double got[N];
        out_values(done, got, N);
        for (int i = 0; i < N; i++)
            ck_assert_msg(got[i] == (double)(w[0][i] + w[1][i]), "both [%d]", i);
        json_t *dev = gpu_daemon_device(d, ran);
        ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_buffers")), 2);
        ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_loaded_bytes")),
                         2 * (json_int_t)sizeof w[0]);
        json_decref(dev);
        json_decref(done);
        free(id);
    }
    json_decref(job);
    free(ids[0]);
    free(ids[1]);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_fault_on_one_gpu_fails_only_its_job)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    unsigned seed = 4711;
    char *sleeper, *faulty;
    gpu_daemon_fault_beside_sleeper(d, 1500, 0, 1, &sleeper, &faulty);

    /* The fault on GPU 1 takes GPU 0's context too: neither launch can be told the culprit,
     * both run again, each alone in the process; the faulting job then fails. */
    json_t *done = e2e_wait_final_ok(d, faulty, 120);
    ck_assert_str_eq(e2e_job_state(done), "failed");
    ck_assert_str_eq(e2e_error_code(done), "cuda_error");
    ck_assert_int_eq(json_integer_value(json_object_get(done, "attempts")), 2);
    json_decref(done);
    done = e2e_wait_final_ok(d, sleeper, 120);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(done, "attempts")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(done, "run_device")), 0);
    json_decref(done);

    json_decref(e2e_json_until(d, "GET", "/readyz", 200, e2e_now() + 60));
    json_t *dev = gpu_daemon_device(d, 1);
    ck_assert_str_eq(json_string_value(json_object_get(dev, "state")), "ready");
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resets")), 2);
    json_decref(dev);
    dev = gpu_daemon_device(d, 0);
    ck_assert_str_eq(json_string_value(json_object_get(dev, "state")), "ready");
    ck_assert_int_ge(json_integer_value(json_object_get(dev, "resets")), 1);
    json_decref(dev);
    gpu_daemon_check_saxpy(d, &seed, 0);
    gpu_daemon_check_saxpy(d, &seed, 1);
    free(sleeper);
    free(faulty);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_the_devices_setting_serves_the_chosen_gpu_only)
{
    e2e_daemon_t *d = gpu_daemon_start("[gpu]\ndevices = 1\n");
    json_t *info = e2e_json_ok(d, "GET", "/v1/info", NULL, 200);
    json_t *devices = json_object_get(json_object_get(info, "backend"), "devices");
    ck_assert_int_eq(json_array_size(devices), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(devices, 0), "index")), 1);
    json_decref(info);
    unsigned seed = 5;
    ck_assert_int_eq(gpu_daemon_check_saxpy(d, &seed, -1), 1);

    /* A job pinned to a device not served fails with the reason. */
    float x[4] = {1, 2, 3, 4};
    json_t *job = json_pack("{s:s, s:i, s:{s:o, s:o}}", "op", "add", "device", 0, "inputs", "x",
                            gpu_tensor_b64(x, 4), "y", gpu_tensor_b64(x, 4));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_str_eq(e2e_job_state(done), "failed");
    ck_assert_str_eq(e2e_error_code(done), "no_such_device");
    json_decref(done);
    json_decref(job);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    gpu_require_devices(2);
    Suite *s = suite_create("gpu_multi");
    TCase *tc = tcase_create("gpu_multi");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_a_burst_spreads_over_the_gpus_and_pins_hold);
    tcase_add_test(tc, test_resident_buffers_spread_over_the_gpus_and_draw_their_jobs);
    tcase_add_test(tc, test_a_fault_on_one_gpu_fails_only_its_job);
    tcase_add_test(tc, test_the_devices_setting_serves_the_chosen_gpu_only);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
