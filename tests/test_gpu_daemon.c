/* The daemon on its CUDA backend: a burst of 10,000 tiny jobs submitted in arrays completes,
 * every result equals the computation done here, and the job rows show that the jobs went out
 * in batched launches (far fewer launches than jobs) with GPU time recorded. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/daemon_harness.h"
#include "support/gpu_support.h"

#define N_JOBS 10000
#define PER_POST 1000
#define N_ELEMS 1000

static char *b64_encode(const void *data, size_t n)
{
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = data;
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = p[i] << 16 | (i + 1 < n ? p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *o++ = tbl[v >> 18 & 63];
        *o++ = tbl[v >> 12 & 63];
        *o++ = i + 1 < n ? tbl[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? tbl[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

static json_t *tensor_b64(const float *v, int n)
{
    char *b64 = b64_encode(v, (size_t)n * sizeof *v);
    json_t *t = json_pack("{s:s, s:[i], s:s}", "dtype", "f32", "shape", n, "b64", b64);
    free(b64);
    return t;
}

START_TEST(test_burst_of_tiny_jobs_is_batched_on_the_gpu_and_correct)
{
    gpu_require();
    setenv("GPUJOB_E2E_BACKEND", "cuda", 1);
    e2e_daemon_t *d = e2e_daemon_start_ok("[limits]\nmax_jobs_per_request = 1000\n");

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
            json_array_append_new(
                arr, json_pack("{s:s, s:{s:f}, s:{s:o, s:o}}", "op", "saxpy", "params", "a",
                               (double)a[j], "inputs", "x",
                               tensor_b64(x + (size_t)j * N_ELEMS, N_ELEMS), "y",
                               tensor_b64(y + (size_t)j * N_ELEMS, N_ELEMS)));
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
        ck_assert_int_eq(json_integer_value(json_object_get(job, "run_device")), 0);
        ck_assert(json_real_value(json_object_get(job, "gpu_ms")) >= 0);
        json_t *data = json_object_get(json_object_get(json_object_get(job, "outputs"), "out"),
                                       "data");
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

    free(ids);
    free(x);
    free(y);
    free(a);
    int status = 0;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);
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
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
