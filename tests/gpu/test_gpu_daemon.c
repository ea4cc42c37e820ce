/* The daemon on its CUDA backend:
 * - a burst of 10,000 tiny jobs submitted in arrays completes, every result equals the
 *   computation done here, and the job rows show that the jobs went out in batched launches
 *   (far fewer launches than jobs) with GPU time recorded; /metrics has the device's gauges;
 * - resident weights serve a pipeline of GEMMs from device memory, a stage's output kept as a
 *   resident buffer feeding the next;
 * - a resident buffer is loaded onto its device as soon as it is stored, in many pieces, byte
 *   for byte, and its first job finds it there;
 * - a job over the device memory cap is refused at submission with a clear error, and the
 *   daemon goes on;
 * - an injected sticky fault loses the device's context: the daemon restarts itself on the
 *   same port to get it back, the faulting job fails with the CUDA error, the job it
 *   interrupted runs again and succeeds, and the device serves again. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/gpu_daemon.h"
#include "support/gpu_support.h"

#define N_JOBS 10000
#define PER_POST 1000
#define N_ELEMS 1000

START_TEST(test_burst_of_tiny_jobs_is_batched_on_the_gpu_and_correct)
{
    e2e_daemon_t *d = gpu_daemon_start("[limits]\nmax_jobs_per_request = 1000\n");

    json_t *info = e2e_json_ok(d, "GET", "/v1/info", NULL, 200);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(info, "backend"), "name")),
                     "cuda");
    json_decref(info);

    unsigned seed = 4242;
    printf("seed %u\n", seed);
    float *x = malloc(sizeof(float) * N_ELEMS * N_JOBS);
    float *y = malloc(sizeof(float) * N_ELEMS * N_JOBS);
    float *a = malloc(sizeof(float) * N_JOBS);
    fill_random(DTYPE_F32, x, (int64_t)N_ELEMS * N_JOBS, -1, 1, &seed);
    fill_random(DTYPE_F32, y, (int64_t)N_ELEMS * N_JOBS, -1, 1, &seed);
    fill_random(DTYPE_F32, a, N_JOBS, -4, 4, &seed);
    char **ids = calloc(N_JOBS, sizeof *ids);

    for (int post = 0; post < N_JOBS / PER_POST; post++) {
        json_t *arr = json_array();
        for (int k = 0; k < PER_POST; k++) {
            int j = post * PER_POST + k;
            json_array_append_new(arr,
                                  json_pack("{s:s, s:{s:f}, s:{s:o, s:o}}", "op", "saxpy", "params",
                                            "a", (double)a[j], "inputs", "x",
                                            gpu_tensor_b64(x + (size_t)j * N_ELEMS, N_ELEMS), "y",
                                            gpu_tensor_b64(y + (size_t)j * N_ELEMS, N_ELEMS)));
        }
        char *body = json_dumps(arr, JSON_COMPACT);
        json_t *res = e2e_json_ok(d, "POST", "/v1/jobs", body, 201);
        ck_assert_int_eq(json_array_size(res), PER_POST);
        for (int k = 0; k < PER_POST; k++)
            ids[post * PER_POST + k] =
                strdup(json_string_value(json_object_get(json_array_get(res, k), "id")));
        json_decref(res);
        free(body);
        json_decref(arr);
    }

    /* Every job succeeds with the right output; launches are counted from the rows. */
    double launches = 0;
    int batched = 0;
    for (int j = 0; j < N_JOBS; j++) {
        json_t *job = e2e_wait_final_ok(d, ids[j], 120);
        ck_assert_str_eq(json_string_value(json_object_get(job, "state")), "succeeded");
        int batch_size = (int)json_integer_value(json_object_get(job, "batch_size"));
        ck_assert_int_ge(batch_size, 1);
        launches += 1.0 / batch_size;
        batched += batch_size > 1;
        ck_assert_int_ge(json_integer_value(json_object_get(job, "run_device")), 0);
        ck_assert(json_real_value(json_object_get(job, "gpu_ms")) >= 0);
        json_t *data =
            json_object_get(json_object_get(json_object_get(job, "outputs"), "out"), "data");
        ck_assert_int_eq(json_array_size(data), N_ELEMS);
        for (int i = 0; i < N_ELEMS; i++) {
            double want = (double)a[j] * x[(size_t)j * N_ELEMS + i] + y[(size_t)j * N_ELEMS + i];
            double got = json_number_value(json_array_get(data, i));
            ck_assert_msg(fabs(got - want) <= 1e-6 * (1 + fabs(want)),
                          "job %d element %d: got %g, want %g", j, i, got, want);
        }
        json_decref(job);
        free(ids[j]);
    }
    printf("%d jobs in about %.0f launches; %d jobs ran batched\n", N_JOBS, launches, batched);
    ck_assert_msg(launches < N_JOBS / 10.0, "%.0f launches for %d jobs", launches, N_JOBS);

    /* The device's gauges, from NVML or else from the worker's memory figures. */
    json_t *dev = gpu_daemon_device(d, 0);
    char sample[160];
    snprintf(sample, sizeof sample, "gpujobd_gpu_memory_total_bytes{device=\"0\",uuid=\"%s\"}",
             json_string_value(json_object_get(dev, "uuid")));
    json_decref(dev);
    double until = e2e_now() + 5, total = 0;
    while ((total = e2e_metric_ok(d, sample)) <= 0 && e2e_now() < until)
        usleep(50000);
    ck_assert_msg(total > 0, "no %s in /metrics", sample);

    free(ids);
    free(x);
    free(y);
    free(a);
    int status = 0;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);
    e2e_daemon_free(d);
}
END_TEST

/* Asserts that got, m x n values of an answered gemm job's output, is the product of a (m x k)
 * and b (k x n) to f32 precision, against the product in double here; what names the job. */
static void expect_product(const double *got, const float *a, const float *b, int m, int k, int n,
                           const char *what)
{
    for (int i = 0; i < m; i++)
        for (int q = 0; q < n; q++) {
            double want = 0, mag = 0;
            for (int p = 0; p < k; p++) {
                want += (double)a[i * k + p] * b[p * n + q];
                mag += fabs((double)a[i * k + p] * b[p * n + q]);
            }
            ck_assert_msg(fabs(got[i * n + q] - want) <= 1e-5 * mag + 1e-6,
                          "%s [%d,%d]: %g, want %g", what, i, q, got[i * n + q], want);
        }
}

START_TEST(test_resident_weights_serve_a_pipeline_of_gemms)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    enum { M = 64, K = 256, N = 128, P = 32, JOBS = 40 };
    unsigned seed = 777;
    printf("seed %u\n", seed);
    float *w = malloc(sizeof(float) * K * N), *a = malloc(sizeof(float) * JOBS * M * K);
    fill_random(DTYPE_F32, w, K * N, -1, 1, &seed);
    fill_random(DTYPE_F32, a, (int64_t)JOBS * M * K, -1, 1, &seed);
    char shape[32];
    snprintf(shape, sizeof shape, "%d,%d", K, N);
    json_t *meta = e2e_upload_ok(d, "f32", shape, w, sizeof(float) * K * N, true, 201);
    ck_assert_int_eq(json_integer_value(json_object_get(meta, "device")), 0);
    char *weights = strdup(json_string_value(json_object_get(meta, "id")));
    json_decref(meta);

    char *ids[JOBS];
    for (int j = 0; j < JOBS; j++) {
        char *b64 = e2e_base64(a + (size_t)j * M * K, sizeof(float) * M * K);
        json_t *job = json_pack("{s:s, s:{s:b}, s:{s:{s:s, s:[i, i], s:s}, s:{s:s}}}", "op", "gemm",
                                "params", "tf32", 0, "inputs", "a", "dtype", "f32", "shape", M, K,
                                "b64", b64, "b", "buffer", weights);
        ids[j] = e2e_submit_ok(d, job);
        json_decref(job);
        free(b64);
    }
    double *got = malloc(sizeof(double) * M * N);
    float *h = malloc(sizeof(float) * M * N); /* job 0's output, as the daemon answered it */
    for (int j = 0; j < JOBS; j++) {
        json_t *done = e2e_wait_final_ok(d, ids[j], 60);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        ck_assert_int_eq(json_integer_value(json_object_get(done, "run_device")), 0);
        json_t *data =
            json_object_get(json_object_get(json_object_get(done, "outputs"), "out"), "data");
        ck_assert_int_eq(e2e_json_flatten(data, got, M * N), M * N);
        char what[32];
        snprintf(what, sizeof what, "job %d", j);
        expect_product(got, a + (size_t)j * M * K, w, M, K, N, what);
        if (j == 0)
            for (int i = 0; i < M * N; i++)
                h[i] = (float)got[i];
        json_decref(done);
        if (j > 0) free(ids[j]);
    }
    /* Loaded once, held in device memory. */
    json_t *dev = gpu_daemon_device(d, 0);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_buffers")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_bytes")),
                     (json_int_t)sizeof(float) * K * N);
    json_decref(dev);

    /* The next stage: job 0's output kept as a resident buffer (POST /v1/buffers?job=&output=),
     * times a second resident weight, equals the same product of the answered output here. */
    float *w2 = malloc(sizeof(float) * N * P);
    fill_random(DTYPE_F32, w2, N * P, -1, 1, &seed);
    snprintf(shape, sizeof shape, "%d,%d", N, P);
    meta = e2e_upload_ok(d, "f32", shape, w2, sizeof(float) * N * P, true, 201);
    char *weights2 = strdup(json_string_value(json_object_get(meta, "id")));
    json_decref(meta);
    char path[160];
    snprintf(path, sizeof path, "/v1/buffers?job=%s&output=out&resident=true", ids[0]);
    meta = e2e_json_ok(d, "POST", path, NULL, 201);
    ck_assert(json_is_true(json_object_get(meta, "resident")));
    char *kept = strdup(json_string_value(json_object_get(meta, "id")));
    json_decref(meta);
    json_t *job = json_pack("{s:s, s:{s:b}, s:{s:{s:s}, s:{s:s}}}", "op", "gemm", "params", "tf32",
                            0, "inputs", "a", "buffer", kept, "b", "buffer", weights2);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(done, "run_device")), 0);
    json_t *data =
        json_object_get(json_object_get(json_object_get(done, "outputs"), "out"), "data");
    ck_assert_int_eq(e2e_json_flatten(data, got, M * P), M * P);
    expect_product(got, h, w2, M, N, P, "stage 2");
    json_decref(done);
    json_decref(job);
    dev = gpu_daemon_device(d, 0);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_buffers")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_bytes")),
                     (json_int_t)sizeof(float) * (K * N + N * P + M * N));
    json_decref(dev);

    /* Each freed with its buffer. */
    const char *const buffers[] = {weights, weights2, kept};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "/v1/buffers/%s", buffers[k]);
        json_decref(e2e_json_ok(d, "DELETE", path, NULL, 200));
    }
    gpu_daemon_wait_device(d, 0, "resident_buffers", 0, 5);
    gpu_daemon_wait_device(d, 0, "resident_bytes", 0, 5);

    free(ids[0]);
    free(id);
    free(kept);
    free(weights2);
    free(w2);
    free(h);
    free(got);
    free(weights);
    free(w);
    free(a);
    e2e_daemon_free(d);
}
END_TEST

/* A stored resident buffer is loaded before any job asks for it, in pieces through two halves
 * of pinned staging (exec_cuda.c): with several pieces and a ragged end, x + x over the
 * resident copy must come back as exactly 2x, every element in its place, and the job must
 * not load it again. */
START_TEST(test_a_large_resident_buffer_loads_byte_for_byte)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    enum { N = 5 * (4 << 20) + 12345 }; /* 80 MiB and a bit of f32: five 16 MiB pieces, more */
    const size_t bytes = (size_t)N * sizeof(float);
    unsigned seed = (unsigned)time(NULL);
    printf("seed %u\n", seed);
    float *x = malloc(bytes);
    fill_random(DTYPE_F32, x, N, -100, 100, &seed);
    char shape[32];
    snprintf(shape, sizeof shape, "%d", N);
    json_t *meta = e2e_upload_ok(d, "f32", shape, x, bytes, true, 201);
    const char *buf = json_string_value(json_object_get(meta, "id"));
    gpu_daemon_wait_device(d, 0, "resident_loaded_bytes", (long)bytes, 30);
    gpu_daemon_wait_device(d, 0, "resident_buffers", 1, 1);

    json_t *job = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}}", "op", "add", "inputs", "x", "buffer",
                            buf, "y", "buffer", buf);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(done, "run_device")), 0);
    json_t *dev = gpu_daemon_device(d, 0);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_buffers")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_loaded_bytes")),
                     (json_int_t)bytes);
    ck_assert(json_real_value(json_object_get(dev, "resident_load_seconds")) > 0);
    json_decref(dev);

    float *got = malloc(bytes);
    e2e_output_raw_ok(d, id, "out", got, bytes);
    for (int i = 0; i < N; i++) /* doubling is exact */
        ck_assert_msg(got[i] == 2 * x[i], "[%d]: %g, expected %g", i, got[i], 2 * x[i]);

    free(got);
    free(id);
    json_decref(done);
    json_decref(job);
    json_decref(meta);
    free(x);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_job_over_the_device_memory_cap_is_refused_and_the_daemon_goes_on)
{
    e2e_daemon_t *d = gpu_daemon_start("[gpu]\ndevice_memory_cap = 16MiB\n");
    enum { N = 4 << 20 }; /* x, y and out: 48 MiB on the device */
    float *x = calloc(N, sizeof *x);
    char shape[32];
    snprintf(shape, sizeof shape, "%d", N);
    char *ids[2];
    for (int k = 0; k < 2; k++) {
        json_t *meta = e2e_upload_ok(d, "f32", shape, x, sizeof(float) * N, false, 201);
        ids[k] = strdup(json_string_value(json_object_get(meta, "id")));
        json_decref(meta);
    }
    json_t *job = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}}", "op", "add", "inputs", "x", "buffer",
                            ids[0], "y", "buffer", ids[1]);
    /* It could never start: refused at submission, naming the key that sets the pool. */
    char *text = json_dumps(job, JSON_COMPACT);
    json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", text, 413);
    ck_assert_str_eq(e2e_error_code(refused), "exceeds_device_memory");
    ck_assert_str_eq(e2e_error_field(refused), "gpu.device_memory_cap");
    json_decref(refused);
    free(text);
    json_decref(job);

    unsigned seed = 99;
    gpu_daemon_check_saxpy(d, &seed, -1);
    json_decref(e2e_json_ok(d, "GET", "/readyz", NULL, 200));
    for (int k = 0; k < 2; k++)
        free(ids[k]);
    free(x);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_an_injected_sticky_fault_resets_the_device_and_work_goes_on)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    unsigned seed = 31337;
    gpu_daemon_check_saxpy(d, &seed, -1);

    /* A long job holds one stream; the fault on another kills the context under both. Both
     * are pinned to GPU 0, so that the test means the same on a machine with more. */
    char *sleeper, *faulty;
    gpu_daemon_fault_beside_sleeper(d, 2000, 0, 0, &sleeper, &faulty);

    /* Neither can be told the culprit at first: both run again, each alone on the device.
     * The faulting job then fails with the CUDA error; the long job succeeds. */
    json_t *done = e2e_wait_final_ok(d, faulty, 120);
    ck_assert_str_eq(e2e_job_state(done), "failed");
    json_t *error = json_object_get(done, "error");
    ck_assert_str_eq(json_string_value(json_object_get(error, "code")), "cuda_error");
    ck_assert_msg(strstr(json_string_value(json_object_get(error, "message")), "illegal"),
                  "message: %s", json_string_value(json_object_get(error, "message")));
    ck_assert_int_eq(json_integer_value(json_object_get(done, "attempts")), 2);
    json_decref(done);
    done = e2e_wait_final_ok(d, sleeper, 120);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(done, "attempts")), 2);
    double out[4];
    ck_assert_int_eq(
        e2e_json_flatten(
            json_object_get(json_object_get(json_object_get(done, "outputs"), "out"), "data"), out,
            4),
        4);
    for (int i = 0; i < 4; i++)
        ck_assert(out[i] == i + 1);
    json_decref(done);

    /* The daemon restarted twice, on the same port, each time resetting the device; it serves
     * again. */
    json_decref(e2e_json_until(d, "GET", "/readyz", 200, e2e_now() + 60));
    json_t *dev = gpu_daemon_device(d, 0);
    ck_assert_str_eq(json_string_value(json_object_get(dev, "state")), "ready");
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resets")), 2);
    json_decref(dev);
    gpu_daemon_check_saxpy(d, &seed, -1);

    free(sleeper);
    free(faulty);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    gpu_require();
    Suite *s = suite_create("gpu_daemon");
    TCase *tc = tcase_create("gpu_daemon");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_burst_of_tiny_jobs_is_batched_on_the_gpu_and_correct);
    tcase_add_test(tc, test_resident_weights_serve_a_pipeline_of_gemms);
    tcase_add_test(tc, test_a_large_resident_buffer_loads_byte_for_byte);
    tcase_add_test(tc, test_a_job_over_the_device_memory_cap_is_refused_and_the_daemon_goes_on);
    tcase_add_test(tc, test_an_injected_sticky_fault_resets_the_device_and_work_goes_on);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
