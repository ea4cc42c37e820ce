/* Ephemeral resident buffers on the CUDA backend: an upload of a few MiB with
 * ?resident=true&durable=false goes through pinned staging in several pieces (cuda_ephemeral.c)
 * into device memory, where a job finds it byte for byte (x + x comes back as exactly 2x) on
 * the device that holds it, without any load from the store; DELETE frees its device memory,
 * and a job naming it afterwards is refused. A 256 MiB upload, many times the staging, streams
 * into device memory as it arrives: its content is exact and the daemon's peak RSS grows by far
 * less than its size; one whose client goes away halfway leaves no buffer and gives its device
 * memory back. Skips without a GPU. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/gpu_daemon.h"
#include "support/gpu_support.h"

START_TEST(test_an_ephemeral_buffer_goes_to_device_memory_and_serves_a_job)
{
    e2e_daemon_t *d = gpu_daemon_start("");
    enum { N = 5 * (1 << 20) + 12345 }; /* 20 MiB and a bit of f32: three 8 MiB pieces, ragged */
    const size_t bytes = (size_t)N * sizeof(float);
    unsigned seed = (unsigned)time(NULL);
    printf("seed %u\n", seed);
    float *x = malloc(bytes);
    fill_random(DTYPE_F32, x, N, -100, 100, &seed);

    static const char *const headers[] = {"Content-Type: application/octet-stream", NULL};
    char path[160];
    snprintf(path, sizeof path, "/v1/buffers?dtype=f32&shape=%d&resident=true&durable=false", N);
    e2e_response_t resp;
    ck_assert(e2e_http_request(d, "POST", path, headers, x, bytes, &resp) == 0);
    ck_assert_msg(resp.status == 201, "status %ld: %.500s", resp.status, resp.body);
    ck_assert(json_is_false(json_object_get(resp.json, "durable")));
    json_int_t device = json_integer_value(json_object_get(resp.json, "device"));
    char *buf = strdup(json_string_value(json_object_get(resp.json, "id")));
    e2e_response_clear(&resp);

    /* Resident on its device as soon as the upload is answered, never loaded from the store. */
    json_t *dev = gpu_daemon_device(d, (int)device);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_buffers")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_bytes")), (json_int_t)bytes);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_loaded_bytes")), 0);
    json_decref(dev);

    json_t *job = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}}", "op", "add", "inputs", "x", "buffer",
                            buf, "y", "buffer", buf);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(done, "run_device")), device);
    float *got = malloc(bytes);
    e2e_output_raw_ok(d, id, "out", got, bytes);
    for (int i = 0; i < N; i++) /* doubling is exact */
        ck_assert_msg(got[i] == 2 * x[i], "[%d]: %g, expected %g", i, got[i], 2 * x[i]);
    dev = gpu_daemon_device(d, (int)device);
    ck_assert_int_eq(json_integer_value(json_object_get(dev, "resident_loaded_bytes")), 0);
    json_decref(dev);
    ck_assert(e2e_metric_ok(d, "gpujobd_buffer_ephemeral_bytes") == (double)bytes);

    snprintf(path, sizeof path, "/v1/buffers/%s", buf);
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 200));
    gpu_daemon_wait_device(d, (int)device, "resident_buffers", 0, 10);
    gpu_daemon_wait_device(d, (int)device, "resident_bytes", 0, 1);
    char *body = json_dumps(job, JSON_COMPACT);
    json_decref(e2e_json_ok(d, "POST", "/v1/jobs", body, 404));

    free(body);
    free(got);
    free(id);
    free(buf);
    json_decref(done);
    json_decref(job);
    free(x);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_large_upload_streams_to_the_device_without_holding_its_body)
{
    e2e_daemon_t *d = gpu_daemon_start("[limits]\nmax_body_bytes = 512MiB\n");
    const int n = 64 << 20; /* 256 MiB of f32: 32 pieces of the 8 MiB staging halves */
    const size_t bytes = (size_t)n * sizeof(float);
    unsigned seed = (unsigned)time(NULL);
    printf("seed %u\n", seed);
    float *x = malloc(bytes);
    fill_random(DTYPE_F32, x, n, -100, 100, &seed);
    x[n - 1] = 12345.5f; /* the last byte of the last piece counts too */

    static const char *const headers[] = {"Content-Type: application/octet-stream", NULL};
    char path[160];
    snprintf(path, sizeof path, "/v1/buffers?dtype=f32&shape=%d&resident=true&durable=false", n);
    long hwm = e2e_daemon_status_kib(d, "VmHWM");
    e2e_response_t resp;
    ck_assert(e2e_http_request(d, "POST", path, headers, x, bytes, &resp) == 0);
    ck_assert_msg(resp.status == 201, "status %ld: %.500s", resp.status, resp.body);
    long grew = e2e_daemon_status_kib(d, "VmHWM") - hwm;
    printf("peak RSS grew by %ld KiB for a %zu KiB upload\n", grew, bytes >> 10);
    ck_assert_msg(grew < (long)(bytes >> 10) / 4, "peak RSS grew by %ld KiB", grew);
    json_int_t device = json_integer_value(json_object_get(resp.json, "device"));
    char *buf = strdup(json_string_value(json_object_get(resp.json, "id")));
    e2e_response_clear(&resp);

    json_t *job = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}}", "op", "add", "inputs", "x", "buffer",
                            buf, "y", "buffer", buf);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 120);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    float *got = malloc(bytes);
    e2e_output_raw_ok(d, id, "out", got, bytes);
    for (int i = 0; i < n; i++) /* doubling is exact */
        if (got[i] != 2 * x[i]) ck_abort_msg("[%d]: %g, expected %g", i, got[i], 2 * x[i]);
    snprintf(path, sizeof path, "/v1/buffers/%s", buf);
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 200));
    printf("deleted: its device memory goes back\n");
    fflush(stdout);
    gpu_daemon_wait_device(d, (int)device, "resident_bytes", 0, 10);

    /* Half of a body, then the client goes away: its device memory, taken at the headers, is
     * given back, and no buffer exists. */
    snprintf(path, sizeof path, "/v1/buffers?dtype=f32&shape=%d&resident=true&durable=false", n);
    int fd = e2e_raw_post_start_ok(d, path, "application/octet-stream", bytes);
    e2e_write_all_ok(fd, x, bytes / 2);
    gpu_daemon_wait_device(d, (int)device, "resident_bytes", (long)bytes, 10);
    close(fd);
    printf("cut off: its device memory goes back\n");
    fflush(stdout);
    gpu_daemon_wait_device(d, (int)device, "resident_bytes", 0, 10);
    ck_assert(e2e_metric_ok(d, "gpujobd_buffer_ephemeral_bytes") == 0);

    free(got);
    free(id);
    free(buf);
    json_decref(done);
    json_decref(job);
    free(x);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    gpu_require();
    Suite *s = suite_create("gpu_ephemeral");
    TCase *tc = tcase_create("ephemeral");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_an_ephemeral_buffer_goes_to_device_memory_and_serves_a_job);
    tcase_add_test(tc, test_a_large_upload_streams_to_the_device_without_holding_its_body);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
