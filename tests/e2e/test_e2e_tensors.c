/* End-to-end: the real gpujobd on the CPU backend, driven over HTTP: how a job's tensors go in
 * and out: inline, base64, binary sections, .npy, resident buffers within the owner's quota,
 * outputs kept as buffers, downloads in each format, and large uploads streamed to a file. */
#include <arpa/inet.h>
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/e2e_jobs.h"
#include "support/run_suite.h"

/* Uploads raw bytes as a buffer; returns its id (malloc'd). */
static char *upload_raw_buffer(e2e_daemon_t *d, const char *dtype, const char *shape_query,
                               const void *bytes, size_t len)
{
    json_t *meta = e2e_upload_ok(d, dtype, shape_query, bytes, len, false, 201);
    ck_assert_str_eq(json_string_value(json_object_get(meta, "dtype")), dtype);
    ck_assert_int_eq(json_integer_value(json_object_get(meta, "bytes")), (long)len);
    char *id = strdup(json_string_value(json_object_get(meta, "id")));
    json_decref(meta);
    return id;
}

START_TEST(test_b64_and_buffer_inputs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 300 };
    static const int64_t shape[] = {N};
    uint32_t seed = 5;
    double x[N], y[N], got[N];
    float xf[N];
    e2e_jobs_random_values("f32", x, N, -3, 3, &seed);
    e2e_jobs_random_values("f32", y, N, -3, 3, &seed);
    for (int i = 0; i < N; i++)
        xf[i] = (float)x[i];

    /* x as base64 of its little-endian bytes. */
    char *b64 = e2e_base64(xf, sizeof xf);
    json_t *job =
        json_pack("{s:s, s:{s:{s:s, s:[i], s:s}, s:o}}", "op", "add", "inputs", "x", "dtype", "f32",
                  "shape", N, "b64", b64, "y", e2e_jobs_tensor_inline("f32", shape, 1, y, N));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    e2e_jobs_output(done, "out", "f32", N, got);
    for (int i = 0; i < N; i++)
        ck_assert_msg(got[i] == (double)(xf[i] + (float)y[i]), "b64 add [%d]", i);
    free(id);
    free(b64);
    json_decref(job);
    json_decref(done);

    /* x as an uploaded buffer, then referenced by id; its metadata reads back. */
    char *buf = upload_raw_buffer(d, "f32", "300", xf, sizeof xf);
    char path[128];
    snprintf(path, sizeof path, "/v1/buffers/%s", buf);
    json_t *meta = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(json_string_value(json_object_get(meta, "id")), buf);
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(meta, "shape"), 0)), N);
    json_decref(meta);
    job = json_pack("{s:s, s:{s:{s:s}, s:o}}", "op", "mul", "inputs", "x", "buffer", buf, "y",
                    e2e_jobs_tensor_inline("f32", shape, 1, y, N));
    id = e2e_submit_ok(d, job);
    done = e2e_wait_final_ok(d, id, 30);
    e2e_jobs_output(done, "out", "f32", N, got);
    for (int i = 0; i < N; i++)
        ck_assert_msg(got[i] == (double)(xf[i] * (float)y[i]), "buffer mul [%d]", i);
    free(id);
    json_decref(job);
    json_decref(done);

    /* A deleted buffer can no longer be referenced. */
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 200));
    json_decref(e2e_json_ok(d, "GET", path, NULL, 404));
    free(buf);
    e2e_daemon_free(d);
}
END_TEST

/* Tensors in the body's binary section (Content-Type application/octet-stream, with
 * Gpujob-Json-Length): a list of jobs names bytes by offset, shares them, and mixes them with
 * inline data; every result equals the computation here. */
START_TEST(test_binary_section_inputs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 257 };
    static const int64_t shape[] = {N};
    uint32_t seed = 9;
    double a[N], b[N], c[N], got[N];
    float section[3 * N];
    e2e_jobs_random_values("f32", a, N, -3, 3, &seed);
    e2e_jobs_random_values("f32", b, N, -3, 3, &seed);
    e2e_jobs_random_values("f32", c, N, -3, 3, &seed);
    for (int i = 0; i < N; i++) {
        section[i] = (float)a[i];
        section[N + i] = (float)b[i];
        section[2 * N + i] = (float)c[i];
    }
    const size_t B = N * sizeof(float);
    json_t *list = json_pack("[{s:s, s:{s:{s:s, s:[i], s:I}, s:{s:s, s:[i], s:I}}},"
                             " {s:s, s:{s:{s:s, s:[i], s:I}, s:{s:s, s:[i], s:I}}},"
                             " {s:s, s:{s:{s:s, s:[i], s:I}, s:o}}]",
                             "op", "add", "inputs", "x", "dtype", "f32", "shape", N,
                             "binary_offset", (json_int_t)0, "y", "dtype", "f32", "shape", N,
                             "binary_offset", (json_int_t)B, "op", "mul", "inputs", "x", "dtype",
                             "f32", "shape", N, "binary_offset", (json_int_t)(2 * B), "y", "dtype",
                             "f32", "shape", N, "binary_offset", (json_int_t)0, "op", "add",
                             "inputs", "x", "dtype", "f32", "shape", N, "binary_offset",
                             (json_int_t)B, "y", e2e_jobs_tensor_inline("f32", shape, 1, c, N));
    ck_assert_ptr_nonnull(list);
    char *text = json_dumps(list, JSON_COMPACT);
    size_t json_len = strlen(text);
    char *body = malloc(json_len + sizeof section);
    memcpy(body, text, json_len);
    memcpy(body + json_len, section, sizeof section);
    char length[64];
    snprintf(length, sizeof length, "Gpujob-Json-Length: %zu", json_len);
    const char *headers[] = {"Content-Type: application/octet-stream", length, NULL};
    e2e_response_t resp;
    ck_assert_int_eq(
        e2e_http_request(d, "POST", "/v1/jobs", headers, body, json_len + sizeof section, &resp),
        0);
    ck_assert_msg(resp.status == 201, "status %ld: %s", resp.status, resp.body);
    ck_assert_int_eq(json_array_size(resp.json), 3);
    for (int k = 0; k < 3; k++) {
        json_t *done = e2e_wait_final_ok(
            d, json_string_value(json_object_get(json_array_get(resp.json, k), "id")), 30);
        e2e_jobs_output(done, "out", "f32", N, got);
        for (int i = 0; i < N; i++) {
            float x = section[(k == 0 ? 0 : k == 1 ? 2 : 1) * N + i];
            float want = k == 0 ? x + (float)b[i] : k == 1 ? x * (float)a[i] : x + (float)c[i];
            ck_assert_msg(got[i] == (double)want, "job %d [%d]: %g, want %g", k, i, got[i],
                          (double)want);
        }
        json_decref(done);
    }
    e2e_response_clear(&resp);
    free(body);
    free(text);
    json_decref(list);
    e2e_daemon_free(d);
}
END_TEST

/* A framed answer (Accept: application/octet-stream): its JSON, whose output "out" names
 * its bytes in the binary section after it instead of carrying them; checks they are want and
 * returns the JSON. */
static json_t *expect_framed_output(const e2e_response_t *resp, const float *want, int n)
{
    char type[64], length[32];
    ck_assert_msg(resp->status == 200 || resp->status == 201, "status %ld", resp->status);
    ck_assert_str_eq(e2e_response_header(resp, "Content-Type", type, sizeof type),
                     "application/octet-stream");
    ck_assert_ptr_nonnull(e2e_response_header(resp, "Gpujob-Json-Length", length, sizeof length));
    size_t json_len = strtoul(length, NULL, 10);
    ck_assert_uint_le(json_len, resp->body_len);
    json_t *job = json_loadb(resp->body, json_len, 0, NULL);
    ck_assert_ptr_nonnull(job);
    ck_assert_str_eq(e2e_job_state(job), "succeeded");
    json_t *out = json_object_get(json_object_get(job, "outputs"), "out");
    ck_assert_ptr_null(json_object_get(out, "data"));
    json_int_t at = json_integer_value(json_object_get(out, "binary_offset"));
    ck_assert(json_is_integer(json_object_get(out, "binary_offset")));
    ck_assert_uint_eq(resp->body_len, json_len + (size_t)at + n * sizeof(float));
    const char *bytes = resp->body + json_len + at;
    for (int i = 0; i < n; i++) {
        float got;
        memcpy(&got, bytes + i * sizeof got, sizeof got);
        ck_assert_msg(got == want[i], "[%d] %g, want %g", i, (double)got, (double)want[i]);
    }
    return job;
}

/* Job answers carry inline outputs in a binary section for a client that asks for one first in
 * its Accept header, as JSON numbers for any other. */
START_TEST(test_binary_section_outputs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 300 };
    static const int64_t shape[] = {N};
    uint32_t seed = 12;
    double x[N], y[N], got[N];
    float want[N];
    e2e_jobs_random_values("f32", x, N, -4, 4, &seed);
    e2e_jobs_random_values("f32", y, N, -4, 4, &seed);
    for (int i = 0; i < N; i++)
        want[i] = 2.5f * (float)x[i] + (float)y[i];
    json_t *job = e2e_jobs_saxpy(2.5, shape, 1, x, y, N);
    char *text = json_dumps(job, JSON_COMPACT);
    const char *binary[] = {"Content-Type: application/json",
                            "Accept: application/octet-stream, application/json", NULL};
    e2e_response_t resp;
    ck_assert_int_eq(
        e2e_http_request(d, "POST", "/v1/jobs?wait=30", binary, text, strlen(text), &resp), 0);
    json_t *first = expect_framed_output(&resp, want, N);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", json_string_value(json_object_get(first, "id")));
    json_decref(first);
    e2e_response_clear(&resp);

    for (int k = 0; k < 2; k++) {
        if (k) strcat(path, "/wait");
        ck_assert_int_eq(e2e_http_request(d, "GET", path, binary + 1, NULL, 0, &resp), 0);
        json_decref(expect_framed_output(&resp, want, N));
        e2e_response_clear(&resp);
    }

    /* JSON first, or no Accept at all: the data as numbers. */
    const char *json_first[] = {"Accept: application/json, application/octet-stream", NULL};
    for (int k = 0; k < 2; k++) {
        char type[64];
        ck_assert_int_eq(e2e_http_request(d, "GET", path, k ? NULL : json_first, NULL, 0, &resp),
                         0);
        ck_assert_int_eq(resp.status, 200);
        ck_assert_str_eq(e2e_response_header(&resp, "Content-Type", type, sizeof type),
                         "application/json");
        e2e_jobs_output(resp.json, "out", "f32", N, got);
        for (int i = 0; i < N; i++)
            ck_assert_msg(got[i] == (double)want[i], "[%d]", i);
        e2e_response_clear(&resp);
    }
    /* Errors stay JSON. */
    ck_assert_int_eq(e2e_http_request(d, "GET", "/v1/jobs/j000000000000000000000000", binary + 1,
                                      NULL, 0, &resp),
                     0);
    ck_assert_int_eq(resp.status, 404);
    ck_assert_str_eq(e2e_error_code(resp.json), "not_found");
    e2e_response_clear(&resp);
    free(text);
    json_decref(job);
    e2e_daemon_free(d);
}
END_TEST

/* Uploads n floats as a resident buffer, asserting the status; returns the body. */
static json_t *upload_resident(e2e_daemon_t *d, const float *v, int n, long expect_status)
{
    char shape[32];
    snprintf(shape, sizeof shape, "%d", n);
    return e2e_upload_ok(d, "f32", shape, v, (size_t)n * sizeof *v, true, expect_status);
}

/* A count the CUDA backend keeps per device (resident_buffers, resident_bytes), summed over
 * its devices, from /v1/info; -1 on the CPU. */
static long sum_over_devices(e2e_daemon_t *d, const char *key)
{
    json_t *info = e2e_json_ok(d, "GET", "/v1/info", NULL, 200);
    json_t *backend = json_object_get(info, "backend");
    json_t *devices = json_object_get(backend, "devices");
    long n = strcmp(json_string_value(json_object_get(backend, "name")), "cuda") == 0 ? 0 : -1;
    for (size_t k = 0; k < json_array_size(devices); k++)
        n += (long)json_integer_value(json_object_get(json_array_get(devices, k), key));
    json_decref(info);
    return n;
}

/* Waits up to 5 s for sum_over_devices(key) to be n; asserts it is. */
static void expect_on_devices(e2e_daemon_t *d, const char *key, long n)
{
    double until = e2e_now() + 5;
    while (sum_over_devices(d, key) != n && e2e_now() < until)
        usleep(20000);
    ck_assert_int_eq(sum_over_devices(d, key), n);
}

START_TEST(test_resident_buffers_serve_jobs_within_the_owner_quota)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[limits]\nmax_resident_bytes_per_user = 4KiB\n");
    enum { N = 512 }; /* 2 KiB of f32: two fill the quota */
    static const int64_t shape[] = {N};
    uint32_t seed = 11;
    double w[N], y[N], got[N];
    float wf[N];
    e2e_jobs_random_values("f32", w, N, -2, 2, &seed);
    for (int i = 0; i < N; i++)
        wf[i] = (float)w[i];

    char *ids[2];
    json_t *placed = NULL;
    for (int k = 0; k < 2; k++) {
        json_t *meta = upload_resident(d, wf, N, 201);
        ck_assert(json_is_true(json_object_get(meta, "resident")));
        ids[k] = strdup(json_string_value(json_object_get(meta, "id")));
        if (k == 0) placed = json_incref(json_object_get(meta, "device"));
        json_decref(meta);
    }
    /* On the CPU a resident buffer lives nowhere in particular; on CUDA, on a device. */
    bool on_gpu = sum_over_devices(d, "resident_buffers") >= 0;
    ck_assert(on_gpu ? json_integer_value(placed) >= 0 : json_is_null(placed));

    /* The quota is full: one more resident float is refused, the same bytes not resident are
     * not. */
    json_t *refused = upload_resident(d, wf, 1, 413);
    ck_assert_str_eq(e2e_error_code(refused), "quota_exceeded");
    ck_assert_str_eq(e2e_error_field(refused), "limits.max_resident_bytes_per_user");
    json_decref(refused);
    free(upload_raw_buffer(d, "f32", "1", wf, sizeof(float)));
    json_t *usage = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "resident_bytes")), 2 * N * 4);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "resident_limit_bytes")), 4096);
    json_decref(usage);

    /* Jobs read the resident buffer (loaded once, then from device memory) and run where it
     * lives, unpinned. */
    for (int round = 0; round < 3; round++) {
        e2e_jobs_random_values("f32", y, N, -3, 3, &seed);
        json_t *job = json_pack("{s:s, s:{s:{s:s}, s:o}}", "op", "mul", "inputs", "x", "buffer",
                                ids[0], "y", e2e_jobs_tensor_inline("f32", shape, 1, y, N));
        char *id = e2e_submit_ok(d, job);
        json_t *done = e2e_wait_final_ok(d, id, 30);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        ck_assert(json_is_null(json_object_get(done, "device")));
        if (on_gpu)
            ck_assert_int_eq(json_integer_value(json_object_get(done, "run_device")),
                             json_integer_value(placed));
        e2e_jobs_output(done, "out", "f32", N, got);
        for (int i = 0; i < N; i++)
            ck_assert_msg(got[i] == (double)(wf[i] * (float)y[i]), "round %d [%d]", round, i);
        free(id);
        json_decref(job);
        json_decref(done);
    }
    /* Both were loaded as they were stored, the one no job read as well. */
    if (on_gpu) expect_on_devices(d, "resident_buffers", 2);

    /* Deleting a resident buffer frees its quota and its device memory. */
    char path[128];
    snprintf(path, sizeof path, "/v1/buffers/%s", ids[0]);
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 200));
    json_decref(upload_resident(d, wf, 1, 201));
    if (on_gpu) /* ids[1] and the new float: ids[0]'s copy is gone */
        expect_on_devices(d, "resident_bytes", (long)(N * sizeof(float) + sizeof(float)));
    free(ids[0]);
    free(ids[1]);
    json_decref(placed);
    e2e_daemon_free(d);
}
END_TEST

/* Asserts that POST /v1/buffers?query (with body, or none) answers status, naming field. */
static void expect_keep_refused(e2e_daemon_t *d, const char *query, const char *body, long status,
                                const char *field)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/buffers?%s", query);
    json_t *err = e2e_json_ok(d, "POST", path, body, status);
    ck_assert_msg(strcmp(e2e_error_field(err), field) == 0, "%s: field %s, expected %s", query,
                  e2e_error_field(err), field);
    json_decref(err);
}

/* A job's output kept as a buffer (POST /v1/buffers?job=&output=) has the output's dtype,
 * shape and bytes and serves the next job, resident or not, across a kill -9 and a restart;
 * resident, it counts against the quota. A job that has not succeeded (running, cancelled), a
 * missing output, and a body or dtype beside them are refused with the field at fault. */
START_TEST(test_job_output_kept_as_a_buffer_serves_the_next_job)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[limits]\nmax_resident_bytes_per_user = 4KiB\n");
    enum { N = 512 }; /* 2 KiB of f32: two resident copies fill the quota */
    static const int64_t shape[] = {N};
    uint32_t seed = 29;
    double x[N], y[N], z[N], first[N], got[N];
    e2e_jobs_random_values("f32", x, N, -2, 2, &seed);
    e2e_jobs_random_values("f32", y, N, -2, 2, &seed);
    json_t *job = e2e_jobs_saxpy(2.0, shape, 1, x, y, N);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    e2e_jobs_output(done, "out", "f32", N, first);
    json_decref(done);
    json_decref(job);

    char query[160], path[200];
    char *kept[3];
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "/v1/buffers?job=%s&output=out%s", id,
                 k ? "&resident=true" : "");
        json_t *meta = e2e_json_ok(d, "POST", path, NULL, 201);
        ck_assert_str_eq(json_string_value(json_object_get(meta, "dtype")), "f32");
        json_t *dims = json_object_get(meta, "shape");
        ck_assert_int_eq(json_array_size(dims), 1);
        ck_assert_int_eq(json_integer_value(json_array_get(dims, 0)), N);
        ck_assert_int_eq(json_integer_value(json_object_get(meta, "bytes")), N * 4);
        ck_assert(json_is_true(json_object_get(meta, "resident")) == (k > 0));
        kept[k] = strdup(json_string_value(json_object_get(meta, "id")));
        json_decref(meta);
    }
    /* Two resident copies fill the quota: a third is refused. */
    snprintf(query, sizeof query, "job=%s&output=out&resident=true", id);
    expect_keep_refused(d, query, NULL, 413, "limits.max_resident_bytes_per_user");
    json_t *usage = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "resident_bytes")), 2 * N * 4);
    json_decref(usage);

    /* Each kept buffer holds the first job's output: add(kept, z) is first + z, computed in f32,
     * before and after a restart. */
    for (int round = 0; round < 2; round++) {
        if (round == 1) { /* kill -9: a kept buffer's 201 means it is durable */
            e2e_daemon_kill(d);
            ck_assert_int_eq(e2e_daemon_restart(d), 0);
        }
        for (int k = 0; k < 3; k++) {
            e2e_jobs_random_values("f32", z, N, -3, 3, &seed);
            json_t *next =
                json_pack("{s:s, s:{s:{s:s}, s:o}}", "op", "add", "inputs", "x", "buffer", kept[k],
                          "y", e2e_jobs_tensor_inline("f32", shape, 1, z, N));
            char *next_id = e2e_submit_ok(d, next);
            json_t *ended = e2e_wait_final_ok(d, next_id, 30);
            e2e_jobs_output(ended, "out", "f32", N, got);
            for (int i = 0; i < N; i++)
                ck_assert_msg(got[i] == (double)((float)first[i] + (float)z[i]),
                              "round %d, buffer %d [%d]: %g", round, k, i, got[i]);
            json_decref(ended);
            json_decref(next);
            free(next_id);
        }
    }

    /* What is refused, and the field that says why. */
    snprintf(query, sizeof query, "job=%s", id);
    expect_keep_refused(d, query, NULL, 400, "query.output");
    expect_keep_refused(d, "output=out", NULL, 400, "query.job");
    snprintf(query, sizeof query, "job=%s&output=nope", id);
    expect_keep_refused(d, query, NULL, 404, "query.output");
    expect_keep_refused(d, "job=j0&output=out", NULL, 400, "query.job");
    expect_keep_refused(d, "job=j000000000000000000000000&output=out", NULL, 404, "query.job");
    snprintf(query, sizeof query, "job=%s&output=out&dtype=f32", id);
    expect_keep_refused(d, query, NULL, 400, "query.dtype");
    snprintf(query, sizeof query, "job=%s&output=out", id);
    expect_keep_refused(d, query, "{}", 400, "body");
    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    snprintf(query, sizeof query, "job=%s&output=out", long_id);
    expect_keep_refused(d, query, NULL, 409, "query.job");
    snprintf(path, sizeof path, "/v1/jobs/%s", long_id);
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 200));
    e2e_wait_state_ok(d, long_id, "cancelled", 30);
    expect_keep_refused(d, query, NULL, 409, "query.job");
    /* None of the refusals left a buffer behind. */
    usage = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(usage, "buffers")), 3);
    json_decref(usage);

    json_decref(long_job);
    free(long_id);
    for (int k = 0; k < 3; k++)
        free(kept[k]);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

/* Parses the integers of an X-Shape value, whatever its punctuation ("8,125" or "[8, 125]"). */
static int parse_shape_header(const char *s, int64_t *dims, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        if (*s >= '0' && *s <= '9') {
            char *end;
            dims[n++] = strtoll(s, &end, 10);
            s = end;
        } else {
            s++;
        }
    }
    return n;
}

START_TEST(test_output_download_json_raw_and_npy)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 1000 };
    static const int64_t shape[] = {8, 125};
    uint32_t seed = 21;
    double x[N], y[N], inline_out[N];
    e2e_jobs_random_values("f32", x, N, -10, 10, &seed);
    e2e_jobs_random_values("f32", y, N, -10, 10, &seed);
    json_t *job = e2e_jobs_saxpy(0.75, shape, 2, x, y, N);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    e2e_jobs_output(done, "out", "f32", N, inline_out);
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/outputs/out", id);

    /* JSON */
    static const char *const accept_json[] = {"Accept: application/json", NULL};
    e2e_response_t resp;
    ck_assert(e2e_http_request(d, "GET", path, accept_json, NULL, 0, &resp) == 0);
    ck_assert_msg(resp.status == 200, "GET %s (json): %ld %s", path, resp.status, resp.body);
    double got[N];
    ck_assert_str_eq(json_string_value(json_object_get(resp.json, "dtype")), "f32");
    ck_assert_int_eq(e2e_json_flatten(json_object_get(resp.json, "data"), got, N), N);
    for (int i = 0; i < N; i++)
        ck_assert((float)got[i] == inline_out[i]);
    e2e_response_clear(&resp);

    /* Raw bytes: exactly the floats the JSON printed. */
    static const char *const accept_raw[] = {"Accept: application/octet-stream", NULL};
    ck_assert(e2e_http_request(d, "GET", path, accept_raw, NULL, 0, &resp) == 0);
    ck_assert_msg(resp.status == 200, "GET %s (raw): %ld", path, resp.status);
    ck_assert_int_eq(resp.body_len, N * sizeof(float));
    char hv[128];
    ck_assert_msg(e2e_response_header(&resp, "X-Dtype", hv, sizeof hv), "no X-Dtype header");
    ck_assert_str_eq(hv, "f32");
    ck_assert_msg(e2e_response_header(&resp, "X-Shape", hv, sizeof hv), "no X-Shape header");
    int64_t dims[8];
    ck_assert_int_eq(parse_shape_header(hv, dims, 8), 2);
    ck_assert(dims[0] == 8 && dims[1] == 125);
    float raw[N];
    memcpy(raw, resp.body, sizeof raw);
    for (int i = 0; i < N; i++)
        ck_assert_msg((double)raw[i] == inline_out[i], "raw [%d]", i);
    e2e_response_clear(&resp);

    /* .npy: a valid file whose data are the same bytes. */
    static const char *const accept_npy[] = {"Accept: application/x-npy", NULL};
    ck_assert(e2e_http_request(d, "GET", path, accept_npy, NULL, 0, &resp) == 0);
    ck_assert_msg(resp.status == 200, "GET %s (npy): %ld", path, resp.status);
    char descr[16];
    int ndim = 0;
    size_t off = 0;
    ck_assert_msg(e2e_npy_parse(resp.body, resp.body_len, descr, dims, &ndim, &off) == 0,
                  "the .npy download does not parse");
    ck_assert_str_eq(descr, "<f4");
    ck_assert_int_eq(ndim, 2);
    ck_assert(dims[0] == 8 && dims[1] == 125);
    ck_assert(memcmp(resp.body + off, raw, sizeof raw) == 0);
    e2e_response_clear(&resp);

    free(id);
    json_decref(job);
    json_decref(done);
    e2e_daemon_free(d);
}
END_TEST

/* Uploads a .npy, adds 0 to it in a job, downloads the result as .npy: the data bytes come back
 * unchanged, for f32 and i32, kept in memory (800 bytes) and streamed to disk as it arrives
 * (120,000 bytes, past store.inline_blob_bytes). */
START_TEST(test_npy_buffer_round_trip)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    static const char *const descrs[] = {"<f4", "<i4"};
    static const char *const dtypes[] = {"f32", "i32"};
    static const char *const npy_hdr[] = {"Content-Type: application/x-npy", NULL};
    static const int rows[] = {4, 300};
    for (int t = 0; t < 4; t++) {
        const int R = rows[t / 2], C = 100 / (t < 2 ? 2 : 1);
        int64_t shape[] = {R, C};
        uint32_t seed = 31 + t;
        size_t data_bytes = (size_t)R * C * 4;
        uint32_t *data = malloc(data_bytes);
        for (int i = 0; i < R * C; i++) {
            float f = (float)e2e_rand_uniform(&seed, 0.5, 100);
            int32_t v = (int32_t)e2e_rand_uniform(&seed, -1e6, 1e6);
            memcpy(&data[i], t % 2 == 0 ? (void *)&f : (void *)&v, 4);
        }
        size_t len;
        void *npy = e2e_npy_build(descrs[t % 2], shape, 2, data, data_bytes, &len);
        e2e_response_t resp;
        ck_assert(e2e_http_request(d, "POST", "/v1/buffers", npy_hdr, npy, len, &resp) == 0);
        ck_assert_msg(resp.status == 201, "npy upload: %ld %s", resp.status, resp.body);
        ck_assert_str_eq(json_string_value(json_object_get(resp.json, "dtype")), dtypes[t % 2]);
        json_t *rshape = json_object_get(resp.json, "shape");
        ck_assert(json_array_size(rshape) == 2 &&
                  json_integer_value(json_array_get(rshape, 0)) == R &&
                  json_integer_value(json_array_get(rshape, 1)) == C);
        ck_assert_int_eq(json_integer_value(json_object_get(resp.json, "bytes")), data_bytes);
        char *buf = strdup(json_string_value(json_object_get(resp.json, "id")));
        e2e_response_clear(&resp);
        free(npy);

        json_t *job =
            json_pack("{s:s, s:{s:{s:s}, s:{s:s, s:[], s:[i]}}}", "op", "add", "inputs", "x",
                      "buffer", buf, "y", "dtype", dtypes[t % 2], "shape", "data", 0);
        char *id = e2e_submit_ok(d, job);
        json_t *done = e2e_wait_final_ok(d, id, 30);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        char path[256];
        snprintf(path, sizeof path, "/v1/jobs/%s/outputs/out", id);
        static const char *const accept_npy[] = {"Accept: application/x-npy", NULL};
        ck_assert(e2e_http_request(d, "GET", path, accept_npy, NULL, 0, &resp) == 0);
        ck_assert_int_eq(resp.status, 200);
        char descr[16];
        int64_t dims[8];
        int ndim;
        size_t off;
        ck_assert(e2e_npy_parse(resp.body, resp.body_len, descr, dims, &ndim, &off) == 0);
        ck_assert_str_eq(descr, descrs[t % 2]);
        ck_assert(ndim == 2 && dims[0] == R && dims[1] == C);
        ck_assert_int_eq(resp.body_len - off, data_bytes);
        ck_assert_msg(memcmp(resp.body + off, data, data_bytes) == 0,
                      "%s, %zu bytes: downloaded bytes differ from the uploaded ones",
                      dtypes[t % 2], data_bytes);
        e2e_response_clear(&resp);
        free(buf);
        free(id);
        json_decref(job);
        json_decref(done);
        free(data);
    }
    e2e_daemon_free(d);
}
END_TEST

/* Waits up to 10 s for the daemon's blobs/ to hold n files; asserts it does. */
static void expect_blob_files(e2e_daemon_t *d, int n, const char *why)
{
    double until = e2e_now() + 10;
    while (e2e_jobs_count_blob_files(d) != n && e2e_now() < until)
        usleep(10000);
    ck_assert_msg(e2e_jobs_count_blob_files(d) == n, "%s: %d blob files, expected %d", why,
                  e2e_jobs_count_blob_files(d), n);
}

/* A raw upload too large for a row is written to its blob file as it arrives: the file is
 * there before the body has ended; a client that goes away mid-body, or a body that does not
 * match its shape, leaves no file behind; and a job reads the stored bytes back unchanged.
 * (libmicrohttpd 0.9.75 at times notices a client's close mid-body only when the connection
 * has sat idle for server.idle_timeout_s: the file goes then.) */
START_TEST(test_large_upload_streams_to_its_file)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[server]\nidle_timeout_s = 2\n");
    enum { N = 700000 }; /* 2.8 MB of f32, past store.inline_blob_bytes (64 KiB) */
    const size_t bytes = N * sizeof(float);
    float *x = malloc(bytes), *got = malloc(bytes);
    double *v = malloc(N * sizeof *v);
    uint32_t seed = 23;
    e2e_jobs_random_values("f32", v, N, -100, 100, &seed);
    for (int i = 0; i < N; i++)
        x[i] = (float)v[i];

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert(fd >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(e2e_daemon_port(d))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert(connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/buffers?dtype=f32&shape=%d HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/octet-stream\r\nContent-Length: %zu\r\n\r\n",
                     N, bytes);
    ck_assert(write(fd, head, (size_t)n) == n);
    ck_assert(write(fd, x, bytes / 2) == (ssize_t)(bytes / 2));
    expect_blob_files(d, 1, "half of an upload sent");
    /* On disk already, past the stream's 1 MiB buffer, before the body has ended. */
    double until = e2e_now() + 10;
    while (e2e_jobs_count_blob_files(d) == 1 && e2e_jobs_blob_bytes < (1 << 20) &&
           e2e_now() < until)
        usleep(10000);
    ck_assert_msg(e2e_jobs_blob_bytes >= (1 << 20), "%lld bytes of 1.4 MB sent are in the file",
                  (long long)e2e_jobs_blob_bytes);
    close(fd);
    expect_blob_files(d, 0, "the client gone mid-body");

    char shape[32];
    snprintf(shape, sizeof shape, "%d", N + 1);
    json_t *bad = e2e_upload_ok(d, "f32", shape, x, bytes, false, 400);
    ck_assert_str_eq(e2e_error_field(bad), "body");
    json_decref(bad);
    expect_blob_files(d, 0, "a body short of its shape");

    snprintf(shape, sizeof shape, "%d", N);
    json_t *meta = e2e_upload_ok(d, "f32", shape, x, bytes, false, 201);
    ck_assert_int_eq(json_integer_value(json_object_get(meta, "bytes")), (long)bytes);
    ck_assert_int_eq(e2e_jobs_count_blob_files(d), 1);
    const char *buf = json_string_value(json_object_get(meta, "id"));
    json_t *job = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}}", "op", "add", "inputs", "x", "buffer",
                            buf, "y", "buffer", buf);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    e2e_output_raw_ok(d, id, "out", got, bytes);
    for (int i = 0; i < N; i++) /* doubling is exact */
        ck_assert_msg(got[i] == 2 * x[i], "[%d]: %g, expected %g", i, got[i], 2 * x[i]);

    free(id);
    json_decref(job);
    json_decref(done);
    json_decref(meta);
    free(v);
    free(got);
    free(x);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_tensors");
    TCase *tc = tcase_create("jobs");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_b64_and_buffer_inputs);
    tcase_add_test(tc, test_binary_section_inputs);
    tcase_add_test(tc, test_binary_section_outputs);
    tcase_add_test(tc, test_resident_buffers_serve_jobs_within_the_owner_quota);
    tcase_add_test(tc, test_job_output_kept_as_a_buffer_serves_the_next_job);
    tcase_add_test(tc, test_output_download_json_raw_and_npy);
    tcase_add_test(tc, test_npy_buffer_round_trip);
    tcase_add_test(tc, test_large_upload_streams_to_its_file);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
