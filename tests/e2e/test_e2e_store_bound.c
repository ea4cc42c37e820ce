/* End-to-end: a store with a bound ([store] max_bytes) stays under it. Jobs whose outputs
 * together pass the bound several times leave the state directory under the bound plus a
 * stated margin; the oldest outputs are gone (flagged "expired", their download 410) and the
 * newest readable; a running job and an uploaded buffer are untouched; /metrics counts what
 * the test counted. */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700
#include <check.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/daemon_harness.h"

#define BOUND (4u << 20)
/* The bound is checked once a second and trims to 15/16 of it; on top of it come the WAL, up to
 * SQLite's 1000 pages of 4 KiB before a checkpoint copies it back, and the database's free
 * pages: 5 MiB covers them. */
#define MARGIN (5u << 20)
/* gemm [DIM,1] x [1,DIM]: 2 KiB of inputs, a 256 KiB output in a blob file of its own. */
#define DIM 256
#define OUT_BYTES ((long)DIM * DIM * 4)
#define IN_BYTES ((long)DIM * 4 * 2)
#define JOBS 64 /* 16 MiB of outputs: four times the bound */

static long long dir_total;

static int add_file(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)path, (void)ftw;
    if (flag == FTW_F) dir_total += sb->st_size;
    return 0;
}

/* The bytes of the regular files under the daemon's state directory. */
static long long state_bytes(e2e_daemon_t *d)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/state", e2e_daemon_dir(d));
    dir_total = 0;
    ck_assert_int_eq(nftw(path, add_file, 16, FTW_PHYS), 0);
    return dir_total;
}

static json_t *gemm_job(void)
{
    json_t *a = json_array(), *b = json_array();
    for (int i = 0; i < DIM; i++) {
        json_array_append_new(a, json_pack("[f]", 1.0 + i));
        json_array_append_new(b, json_real(2.0));
    }
    return json_pack("{s:s, s:{s:{s:s, s:[i,i], s:o}, s:{s:s, s:[i,i], s:[o]}}}", "op", "gemm",
                     "inputs", "a", "dtype", "f32", "shape", DIM, 1, "data", a, "b", "dtype", "f32",
                     "shape", 1, DIM, "data", b);
}

/* GET of job id's output out, raw: its status. */
static long output_status(e2e_daemon_t *d, const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/outputs/out?format=raw", id);
    e2e_response_t r = {0};
    ck_assert_int_eq(e2e_http_request(d, "GET", path, NULL, NULL, 0, &r), 0);
    long status = r.status;
    if (status == 410) ck_assert_str_eq(e2e_error_code(r.json), "expired");
    if (status == 200) ck_assert_uint_eq(r.body_len, (size_t)OUT_BYTES);
    e2e_response_clear(&r);
    return status;
}

START_TEST(test_store_past_its_bound_expires_the_oldest_outputs_first)
{
    char config[256];
    snprintf(config, sizeof config, "[store]\nmax_bytes = %u\n[scheduler]\ncpu_threads = 2\n",
             BOUND);
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    static float buffer_bytes[DIM * DIM];
    for (int i = 0; i < DIM * DIM; i++)
        buffer_bytes[i] = (float)i;
    json_t *buf = e2e_upload_ok(d, "f32", "65536", buffer_bytes, sizeof buffer_bytes, false, 201);
    char buffer_id[64];
    snprintf(buffer_id, sizeof buffer_id, "%s", json_string_value(json_object_get(buf, "id")));
    json_decref(buf);
    /* One GEMM before the long job: on CUDA, cuBLAS's first use of a kernel would wait for the
     * long one (gpujobd(8), ENVIRONMENT). */
    json_t *job = gemm_job();
    char *first = e2e_submit_ok(d, job);
    json_decref(e2e_wait_final_ok(d, first, 30));
    json_t *long_job = e2e_long_job_new(30000);
    char *long_id = e2e_submit_ok(d, long_job);
    json_decref(long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);

    char *ids[JOBS];
    for (int i = 0; i < JOBS; i++) {
        ids[i] = e2e_submit_ok(d, job);
        json_t *done = e2e_wait_final_ok(d, ids[i], 30);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        json_decref(done);
    }
    json_decref(job);
    /* The bound is checked every second: wait for a check after the last job. */
    for (int tries = 0; tries < 100; tries++) {
        if (e2e_metric_ok(d, "gpujobd_store_bytes") <= BOUND &&
            e2e_metric_ok(d, "gpujobd_store_expired_early_jobs_total") > 0)
            break;
        usleep(100 * 1000);
    }
    usleep(1500 * 1000);
    long long on_disk = state_bytes(d);
    fprintf(stderr, "store bound %u: state directory %lld bytes, gpujobd_store_bytes %.0f\n", BOUND,
            on_disk, e2e_metric_ok(d, "gpujobd_store_bytes"));
    ck_assert_double_le(e2e_metric_ok(d, "gpujobd_store_bytes"), BOUND);
    ck_assert_int_le(on_disk, (long long)BOUND + MARGIN);
    ck_assert_double_eq(e2e_metric_ok(d, "gpujobd_store_max_bytes"), BOUND);

    /* Oldest first: the jobs read deleted (404), then expired (410), then whole (200). */
    long gone = 0, expired = 0, kept = 0;
    for (int i = 0; i < JOBS; i++) {
        long status = output_status(d, ids[i]);
        ck_assert_msg(status == 404 || status == 410 || status == 200, "job %d: %ld", i, status);
        if (status == 404)
            ck_assert_msg(expired == 0 && kept == 0, "job %d deleted out of order", i);
        if (status == 410) ck_assert_msg(kept == 0, "job %d expired after a kept one", i);
        if (status == 410) {
            char path[128];
            snprintf(path, sizeof path, "/v1/jobs/%s", ids[i]);
            json_t *j = e2e_json_ok(d, "GET", path, NULL, 200);
            json_t *out = json_object_get(json_object_get(j, "outputs"), "out");
            ck_assert(json_is_true(json_object_get(out, "expired")));
            ck_assert_ptr_null(json_object_get(out, "data"));
            ck_assert_int_eq(json_integer_value(json_object_get(out, "bytes")), OUT_BYTES);
            json_decref(j);
        }
        gone += status == 404;
        expired += status == 410;
        kept += status == 200;
    }
    /* The GEMM before the long job is the oldest of all. */
    long first_status = output_status(d, first);
    ck_assert_msg(first_status == 404 || first_status == 410, "first job: %ld", first_status);
    gone += first_status == 404;
    expired += first_status == 410;
    free(first);
    fprintf(stderr, "store bound: %ld deleted, %ld expired, %ld kept\n", gone, expired, kept);
    ck_assert_int_gt(expired, JOBS / 2);
    ck_assert_int_gt(kept, 0);
    ck_assert_int_eq(output_status(d, ids[JOBS - 1]), 200);
    ck_assert_double_eq(e2e_metric_ok(d, "gpujobd_store_expired_early_jobs_total"),
                        (double)(expired + gone));
    ck_assert_double_eq(e2e_metric_ok(d, "gpujobd_store_deleted_early_jobs_total"), (double)gone);
    ck_assert_double_eq(e2e_metric_ok(d, "gpujobd_store_expired_early_bytes_total"),
                        (double)((expired + gone) * OUT_BYTES + gone * IN_BYTES));

    /* The running job and the buffer were not touched. */
    json_t *copy = json_pack("{s:s, s:{s:i}, s:{s:{s:s}}}", "op", "debug_sleep", "params", "ms", 1,
                             "inputs", "x", "buffer", buffer_id);
    char *copy_id = e2e_submit_ok(d, copy);
    json_decref(copy);
    json_t *copied = e2e_wait_final_ok(d, copy_id, 30);
    ck_assert_str_eq(e2e_job_state(copied), "succeeded");
    json_decref(copied);
    static float back[DIM * DIM];
    e2e_output_raw_ok(d, copy_id, "out", back, sizeof back);
    ck_assert_int_eq(memcmp(back, buffer_bytes, sizeof back), 0);
    free(copy_id);
    json_t *done = e2e_wait_final_ok(d, long_id, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    json_decref(done);
    float out[4];
    e2e_output_raw_ok(d, long_id, "out", out, sizeof out);
    ck_assert(out[0] == 1 && out[3] == 4);

    for (int i = 0; i < JOBS; i++)
        free(ids[i]);
    free(long_id);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_store_bound");
    TCase *tc = tcase_create("store_bound");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_store_past_its_bound_expires_the_oldest_outputs_first);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
