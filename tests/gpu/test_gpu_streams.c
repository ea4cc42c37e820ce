/* The daemon's CUDA streams run side by side: while a long kernel holds one stream, a saxpy
 * (the first batch of its stream, its op's first use) and a GEMM through cuBLAS run on the
 * others and end in a fraction of its length, with their results right, and the long job is
 * still running after them. The GEMM's kind ran once before the long kernel: cuBLAS's first
 * use of a kernel waits for every kernel running on the device (gpujobd(8), ENVIRONMENT). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/gpu_daemon.h"
#include "support/gpu_support.h"

/* The long kernel, and what the jobs beside it may take at most, together. */
#define LONG_MS 10000
#define BESIDE_S 2.0

/* A GEMM [M,K] x [K,N] of small integers, exact in f32, checked in full. */
#define M 96
#define K 40
#define N 72

static void check_gemm(e2e_daemon_t *d)
{
    static float a[M * K], b[K * N];
    for (int i = 0; i < M * K; i++)
        a[i] = (float)(i % 7 - 3);
    for (int i = 0; i < K * N; i++)
        b[i] = (float)(i % 5 - 2);
    json_t *ta = gpu_tensor_b64(a, M * K), *tb = gpu_tensor_b64(b, K * N);
    json_object_set_new(ta, "shape", json_pack("[i,i]", M, K));
    json_object_set_new(tb, "shape", json_pack("[i,i]", K, N));
    json_t *job = json_pack("{s:s, s:{s:o, s:o}}", "op", "gemm", "inputs", "a", ta, "b", tb);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    static float out[M * N];
    e2e_output_raw_ok(d, id, "out", out, sizeof out);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float want = 0;
            for (int k = 0; k < K; k++)
                want += a[i * K + k] * b[k * N + j];
            ck_assert_msg(out[i * N + j] == want, "gemm [%d,%d]: %g, want %g", i, j, out[i * N + j],
                          want);
        }
    json_decref(done);
    json_decref(job);
    free(id);
}

START_TEST(test_a_long_kernel_holds_up_no_other_stream)
{
    e2e_daemon_t *d = gpu_daemon_start("[gpu]\nstreams_per_device = 4\n");
    check_gemm(d);
    json_t *long_job = e2e_long_job_new(LONG_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 30);
    usleep(500 * 1000); /* its kernel is on the device */

    double t0 = e2e_now();
    unsigned seed = 11;
    gpu_daemon_check_saxpy(d, &seed, -1);
    double saxpy_s = e2e_now() - t0;
    check_gemm(d);
    double both_s = e2e_now() - t0;
    fprintf(stderr, "beside a %d ms kernel: saxpy %.3f s, then gemm %.3f s\n", LONG_MS, saxpy_s,
            both_s - saxpy_s);
    ck_assert_msg(both_s < BESIDE_S, "the jobs beside the long kernel took %.3f s", both_s);

    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", long_id);
    json_t *still = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(still), "running");
    json_decref(still);
    json_t *done = e2e_wait_final_ok(d, long_id, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    json_decref(done);
    json_decref(long_job);
    free(long_id);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    gpu_require();
    Suite *s = suite_create("gpu_streams");
    TCase *tc = tcase_create("streams");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_a_long_kernel_holds_up_no_other_stream);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
