/* Ephemeral resident buffers (POST /v1/buffers?resident=true&durable=false) on the real daemon:
 * - one serves jobs with the right result, GET and /metrics say what it is, and no file under
 *   the state directory holds its bytes (a durable upload of other bytes is found there, so the
 *   search itself is proved); after a restart it is gone (404) and a job naming it is refused;
 * - durable=false without resident=true is refused naming query.durable;
 * - the owner's resident quota counts it, DELETE gives the quota back, and a job naming it
 *   after the DELETE is refused;
 * - a job queued behind a long one that names it fails with input_unavailable when the daemon
 *   restarts before it runs;
 * - a 256 MiB upload streams into its copy: the daemon's peak RSS grows by the copy's size
 *   (host memory on the CPU backend), not by the body held besides it;
 * - a Content-Length other than dtype and shape need is refused before the body, a chunked
 *   body longer than they need is refused, and a body cut short by the client leaves no buffer
 *   and gives its memory back.
 * The backend is the CPU one unless GPUJOB_E2E_BACKEND says otherwise. */
#define _GNU_SOURCE /* memmem; nftw's FTW_PHYS */
#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* Larger than [store] inline_blob_bytes (64 KiB by default): durable, it would go to a file. */
#define N_FLOATS (64 * 1024)

/* Fills v with n floats whose bytes occur nowhere else: a seeded pattern of small integers and
 * fractions (no NaN, no infinity). */
static void fill_pattern(float *v, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++)
        v[i] = (float)(e2e_rand(&seed) % 20000) / 8.0f - 1250.0f;
}

/* Uploads n floats with the given extra query ("resident=true&durable=false"), asserting the
 * status; returns the body (a new reference). */
static json_t *upload(e2e_daemon_t *d, const float *v, int n, const char *query, long expect)
{
    static const char *const headers[] = {"Content-Type: application/octet-stream", NULL};
    char path[256];
    snprintf(path, sizeof path, "/v1/buffers?dtype=f32&shape=%d&%s", n, query);
    e2e_response_t resp;
    ck_assert_msg(e2e_http_request(d, "POST", path, headers, v, (size_t)n * sizeof *v, &resp) == 0,
                  "POST %s: no HTTP response", path);
    ck_assert_msg(resp.status == expect, "POST %s: status %ld, expected %ld; body: %.2000s", path,
                  resp.status, expect, resp.body);
    json_t *j = resp.json ? json_incref(resp.json) : json_null();
    e2e_response_clear(&resp);
    return j;
}

static json_t *upload_ephemeral(e2e_daemon_t *d, const float *v, int n, long expect)
{
    return upload(d, v, n, "resident=true&durable=false", expect);
}

/* A mul job: x the buffer, y n copies of 2 (so that its output's bytes differ from x's). */
static json_t *mul_by_two(const char *buffer_id, int n)
{
    float *two = malloc((size_t)n * sizeof *two);
    for (int i = 0; i < n; i++)
        two[i] = 2.0f;
    char *b64 = e2e_base64(two, (size_t)n * sizeof *two);
    json_t *job = json_pack("{s:s, s:{s:{s:s}, s:{s:s, s:[i], s:s}}}", "op", "mul", "inputs", "x",
                            "buffer", buffer_id, "y", "dtype", "f32", "shape", n, "b64", b64);
    free(b64);
    free(two);
    return job;
}

/* Submits mul_by_two on the buffer, waits, and checks out = 2 * v. */
static void expect_doubled(e2e_daemon_t *d, const char *buffer_id, const float *v, int n)
{
    json_t *job = mul_by_two(buffer_id, n);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_msg(strcmp(e2e_job_state(done), "succeeded") == 0, "job %s: %s", id,
                  json_dumps(done, JSON_COMPACT));
    float *out = malloc((size_t)n * sizeof *out);
    e2e_output_raw_ok(d, id, "out", out, (size_t)n * sizeof *out);
    for (int i = 0; i < n; i++)
        ck_assert_msg(out[i] == 2.0f * v[i], "out[%d] = %g, expected %g", i, out[i], 2.0f * v[i]);
    free(out);
    json_decref(done);
    free(id);
    json_decref(job);
}

/* Submitting a job that names the buffer is refused with a 4xx naming its input. */
static void expect_job_refused(e2e_daemon_t *d, const char *buffer_id)
{
    json_t *job = mul_by_two(buffer_id, N_FLOATS);
    char *body = json_dumps(job, JSON_COMPACT);
    json_t *err = e2e_json_ok(d, "POST", "/v1/jobs", body, 404);
    ck_assert_str_eq(e2e_error_field(err), "inputs.x.buffer");
    json_decref(err);
    free(body);
    json_decref(job);
}

/* What the file search looks for, and whether it was found. */
static const void *needle;
static size_t needle_len;
static char found_in[4096];

static int search_file(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type != FTW_F || st->st_size <= 0) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char *data = malloc((size_t)st->st_size);
    size_t n = data ? fread(data, 1, (size_t)st->st_size, f) : 0;
    fclose(f);
    bool hit = n >= needle_len && memmem(data, n, needle, needle_len);
    free(data);
    if (hit) snprintf(found_in, sizeof found_in, "%s", path);
    return hit; /* stops the walk */
}

/* Whether any file under the daemon's state directory contains the len bytes at bytes. */
static bool state_dir_holds(e2e_daemon_t *d, const void *bytes, size_t len)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/state", e2e_daemon_dir(d));
    needle = bytes;
    needle_len = len;
    found_in[0] = '\0';
    return nftw(dir, search_file, 16, FTW_PHYS) == 1;
}

static double ephemeral_gauge(e2e_daemon_t *d)
{
    return e2e_metric_ok(d, "gpujobd_buffer_ephemeral_bytes");
}

START_TEST(test_ephemeral_buffer_serves_jobs_never_reaches_disk_and_is_gone_after_restart)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    static float eph[N_FLOATS], dur[N_FLOATS];
    fill_pattern(eph, N_FLOATS, 2511);
    fill_pattern(dur, N_FLOATS, 977);

    json_t *meta = upload_ephemeral(d, eph, N_FLOATS, 201);
    ck_assert(json_is_true(json_object_get(meta, "resident")));
    ck_assert(json_is_false(json_object_get(meta, "durable")));
    char *id = strdup(json_string_value(json_object_get(meta, "id")));
    json_decref(meta);
    char path[128];
    snprintf(path, sizeof path, "/v1/buffers/%s", id);
    json_t *got = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert(json_is_false(json_object_get(got, "durable")));
    ck_assert_int_eq(json_integer_value(json_object_get(got, "bytes")), sizeof eph);
    json_decref(got);

    expect_doubled(d, id, eph, N_FLOATS);
    expect_doubled(d, id, eph, N_FLOATS);
    ck_assert_double_eq(ephemeral_gauge(d), (double)sizeof eph);
    json_t *usage = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "resident_bytes")), sizeof eph);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "buffer_bytes")), 0);
    json_decref(usage);

    /* A durable upload's bytes are on disk where the search looks, an ephemeral one's are not
     * (its first KiB is searched for: 256 pseudo-random floats). */
    json_t *durable = upload(d, dur, N_FLOATS, "resident=true", 201);
    ck_assert(json_is_true(json_object_get(durable, "durable")));
    json_decref(durable);
    ck_assert_msg(state_dir_holds(d, dur, 1024), "the durable buffer's bytes are in no file");
    ck_assert_msg(!state_dir_holds(d, eph, 1024), "the ephemeral buffer's bytes are in %s",
                  found_in);

    int status = 0;
    ck_assert(e2e_daemon_stop(d, 60000, &status) == 0);
    ck_assert_msg(!state_dir_holds(d, eph, 1024), "after the stop, the bytes are in %s", found_in);
    ck_assert(e2e_daemon_restart(d) == 0);
    json_t *gone = e2e_json_ok(d, "GET", path, NULL, 404);
    ck_assert_str_eq(e2e_error_field(gone), "id");
    json_decref(gone);
    expect_job_refused(d, id);
    ck_assert_double_eq(ephemeral_gauge(d), 0);
    ck_assert_int_eq(e2e_daemon_log_count(d, "1 ephemeral buffer(s) of the last run forgotten"), 1);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_durable_false_needs_resident_true)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    float v[4] = {1, 2, 3, 4};
    static const char *const refused[] = {"durable=false", "resident=false&durable=false",
                                          "resident=true&durable=no"};
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        json_t *err = upload(d, v, 4, refused[k], 400);
        ck_assert_str_eq(e2e_error_field(err), "query.durable");
        json_decref(err);
    }
    ck_assert_double_eq(ephemeral_gauge(d), 0);
    json_decref(upload(d, v, 4, "resident=true&durable=true", 201));
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_resident_quota_counts_ephemeral_buffers_and_delete_frees_them)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[limits]\nmax_resident_bytes_per_user = 4KiB\n");
    enum { N = 512 }; /* 2 KiB: two fill the quota */
    float v[N];
    fill_pattern(v, N, 31);
    char *ids[2];
    for (int k = 0; k < 2; k++) {
        json_t *meta = upload_ephemeral(d, v, N, 201);
        ids[k] = strdup(json_string_value(json_object_get(meta, "id")));
        json_decref(meta);
    }
    json_t *over = upload_ephemeral(d, v, 1, 413);
    ck_assert_str_eq(e2e_error_code(over), "quota_exceeded");
    ck_assert_str_eq(e2e_error_field(over), "limits.max_resident_bytes_per_user");
    json_decref(over);
    ck_assert_double_eq(ephemeral_gauge(d), 2.0 * sizeof v);

    char path[128];
    snprintf(path, sizeof path, "/v1/buffers/%s", ids[0]);
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 200));
    json_decref(e2e_json_ok(d, "GET", path, NULL, 404));
    ck_assert_double_eq(ephemeral_gauge(d), (double)sizeof v);
    json_decref(upload_ephemeral(d, v, 1, 201));
    expect_job_refused(d, ids[0]);

    /* The other one still serves. */
    expect_doubled(d, ids[1], v, N);
    free(ids[0]);
    free(ids[1]);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_queued_job_naming_an_ephemeral_buffer_fails_cleanly_after_a_restart)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    enum { N = 256 };
    float v[N];
    fill_pattern(v, N, 7);
    json_t *meta = upload_ephemeral(d, v, N, 201);
    char *buf_id = strdup(json_string_value(json_object_get(meta, "id")));
    json_decref(meta);

    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);
    json_t *job = mul_by_two(buf_id, N);
    char *id = e2e_submit_ok(d, job);
    e2e_wait_state_ok(d, id, "queued", 10);

    int status = 0;
    ck_assert(e2e_daemon_stop(d, 60000, &status) == 0);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status 0x%x", status);
    ck_assert(e2e_daemon_restart(d) == 0);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_str_eq(e2e_job_state(done), "failed");
    json_t *error = json_object_get(done, "error");
    ck_assert_str_eq(json_string_value(json_object_get(error, "code")), "input_unavailable");
    ck_assert_msg(strstr(json_string_value(json_object_get(error, "message")), buf_id),
                  "the message names the buffer: %s",
                  json_string_value(json_object_get(error, "message")));
    json_decref(done);
    /* The daemon goes on. */
    json_t *long_done = e2e_wait_final_ok(d, long_id, 60);
    ck_assert_str_eq(e2e_job_state(long_done), "succeeded");
    json_decref(long_done);
    free(id);
    free(long_id);
    free(buf_id);
    json_decref(job);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

/* Large uploads: bodies up to 512 MiB. */
#define BIG_CONFIG "[limits]\nmax_body_bytes = 512MiB\n"

START_TEST(test_a_256_mib_upload_streams_into_its_copy_without_holding_the_body)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(BIG_CONFIG);
    const int n = 64 << 20; /* 256 MiB of f32 */
    const size_t bytes = (size_t)n * sizeof(float);
    float *v = malloc(bytes);
    ck_assert(v);
    fill_pattern(v, n, 4099);
    long before = e2e_daemon_status_kib(d, "VmHWM");
    json_t *meta = upload_ephemeral(d, v, n, 201);
    long grew = e2e_daemon_status_kib(d, "VmHWM") - before;
    ck_assert_int_eq(json_integer_value(json_object_get(meta, "bytes")), (json_int_t)bytes);
    ck_assert(json_is_false(json_object_get(meta, "durable")));
    json_decref(meta);
    ck_assert_double_eq(ephemeral_gauge(d), (double)bytes);
    /* The CPU backend's copy is host memory of the buffer's size; the body held whole besides
     * it (and copied at its end) would add as much again. */
    printf("peak RSS grew by %ld KiB for a %zu KiB upload\n", grew, bytes >> 10);
    ck_assert_msg(grew < (long)(bytes >> 10) + (64 << 10), "peak RSS grew by %ld KiB", grew);
    free(v);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_body_of_another_length_is_refused_and_leaves_no_buffer)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    float v[101];
    fill_pattern(v, 101, 7);
    /* A Content-Length one float short of, or past, what dtype and shape need. */
    static const char *const shapes[] = {"resident=true&durable=false&shape=102",
                                         "resident=true&durable=false&shape=100"};
    for (int k = 0; k < 2; k++) {
        static const char *const headers[] = {"Content-Type: application/octet-stream", NULL};
        char path[160];
        snprintf(path, sizeof path, "/v1/buffers?dtype=f32&%s", shapes[k]);
        e2e_response_t resp;
        ck_assert(e2e_http_request(d, "POST", path, headers, v, sizeof v, &resp) == 0);
        ck_assert_msg(resp.status == 400, "%s: status %ld", path, resp.status);
        ck_assert_str_eq(e2e_error_field(resp.json), "body");
        e2e_response_clear(&resp);
    }
    /* Refused once the headers are in, before any of the body is sent. */
    int fd = e2e_raw_connect_ok(d);
    static const char early[] = "POST /v1/buffers?dtype=f32&shape=1&resident=true&durable=false "
                                "HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                "application/octet-stream\r\nContent-Length: 1048576\r\n\r\n";
    e2e_write_all_ok(fd, early, sizeof early - 1);
    char reply[4096];
    ssize_t got = read(fd, reply, sizeof reply - 1);
    reply[got > 0 ? got : 0] = '\0';
    close(fd);
    ck_assert_msg(strncmp(reply, "HTTP/1.1 400", 12) == 0, "reply before the body: %.300s", reply);
    /* A chunked body longer than they need. */
    fd = e2e_raw_connect_ok(d);
    static const char chunked[] = "POST /v1/buffers?dtype=f32&shape=1&resident=true&durable=false "
                                  "HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                  "application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  "8\r\n01234567\r\n0\r\n\r\n";
    e2e_write_all_ok(fd, chunked, sizeof chunked - 1);
    e2e_read_reply(fd, reply, sizeof reply);
    close(fd);
    ck_assert_msg(strncmp(reply, "HTTP/1.1 400", 12) == 0, "reply: %.300s", reply);
    ck_assert_msg(strstr(reply, "\"field\": \"body\"") || strstr(reply, "\"field\":\"body\""),
                  "reply: %.600s", reply);
    ck_assert_double_eq(ephemeral_gauge(d), 0);
    json_t *usage = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "resident_bytes")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "buffers")), 0);
    json_decref(usage);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_body_cut_short_leaves_no_buffer_and_gives_its_memory_back)
{
    /* The copy this measures is the CPU backend's, in host memory; a CUDA copy is in device
     * memory, whose release tests/gpu/test_gpu_ephemeral.c checks. */
    const char *backend = getenv("GPUJOB_E2E_BACKEND");
    if (backend && strcmp(backend, "cpu") != 0) {
        printf("skipped: the host copy of a cut upload is the CPU backend's\n");
        return;
    }
    e2e_daemon_t *d = e2e_daemon_start_ok(BIG_CONFIG);
    const size_t declared = (size_t)256 << 20, sent = (size_t)128 << 20;
    long rss = e2e_daemon_status_kib(d, "VmRSS"), hwm = e2e_daemon_status_kib(d, "VmHWM");
    char path[128];
    snprintf(path, sizeof path, "/v1/buffers?dtype=u32&shape=%zu&resident=true&durable=false",
             declared / 4);
    int fd = e2e_raw_post_start_ok(d, path, "application/octet-stream", declared);
    char *part = malloc(sent);
    memset(part, 0x5a, sent);
    e2e_write_all_ok(fd, part, sent);
    free(part);
    /* Once the daemon holds most of what was sent, the client goes away. */
    double deadline = e2e_now() + 30;
    while (e2e_daemon_status_kib(d, "VmHWM") - hwm < (long)(sent >> 10) * 3 / 4 &&
           e2e_now() < deadline)
        usleep(10000);
    ck_assert_msg(e2e_daemon_status_kib(d, "VmHWM") - hwm >= (long)(sent >> 10) * 3 / 4,
                  "the daemon never held the bytes sent");
    close(fd);
    long now = e2e_daemon_status_kib(d, "VmRSS");
    for (deadline = e2e_now() + 30; now - rss > (32 << 10) && e2e_now() < deadline;
         now = e2e_daemon_status_kib(d, "VmRSS"))
        usleep(10000);
    ck_assert_msg(now - rss <= (32 << 10), "RSS stays %ld KiB above its start", now - rss);
    ck_assert_double_eq(ephemeral_gauge(d), 0);
    json_t *usage = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "buffers")), 0);
    json_decref(usage);
    float v[4] = {1, 2, 3, 4};
    json_decref(upload_ephemeral(d, v, 4, 201));
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_ephemeral");
    TCase *tc = tcase_create("ephemeral");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc,
                   test_ephemeral_buffer_serves_jobs_never_reaches_disk_and_is_gone_after_restart);
    tcase_add_test(tc, test_durable_false_needs_resident_true);
    tcase_add_test(tc, test_resident_quota_counts_ephemeral_buffers_and_delete_frees_them);
    tcase_add_test(tc, test_a_queued_job_naming_an_ephemeral_buffer_fails_cleanly_after_a_restart);
    tcase_add_test(tc, test_a_256_mib_upload_streams_into_its_copy_without_holding_the_body);
    tcase_add_test(tc, test_a_body_of_another_length_is_refused_and_leaves_no_buffer);
    tcase_add_test(tc, test_a_body_cut_short_leaves_no_buffer_and_gives_its_memory_back);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
