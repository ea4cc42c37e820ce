/* End-to-end: the real gpujobd on the CPU backend, driven over HTTP. Every result is checked
 * against a computation done here, in the test, from the same random inputs. */
/* POSIX and XSI (nftw). */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700
#include <arpa/inet.h>
#include <check.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/daemon_harness.h"

static bool is_float_dtype(const char *dtype)
{
    return dtype[0] == 'f' || dtype[0] == 'b';
}

/* {"dtype", "shape", "data": [...]} with n values (integers for integer dtypes). */
static json_t *tensor_inline(const char *dtype, const int64_t *shape, int ndim, const double *v,
                             long n)
{
    json_t *dims = json_array(), *data = json_array();
    for (int i = 0; i < ndim; i++)
        json_array_append_new(dims, json_integer(shape[i]));
    for (long i = 0; i < n; i++)
        json_array_append_new(data, is_float_dtype(dtype) ? json_real(v[i])
                                                          : json_integer((json_int_t)v[i]));
    return json_pack("{s:s, s:o, s:o}", "dtype", dtype, "shape", dims, "data", data);
}

/* A saxpy job (out = a * x + y) on f32 x and y of the given shape, n values each, inline. */
static json_t *saxpy_job(double a, const int64_t *shape, int ndim, const double *x, const double *y,
                         long n)
{
    return json_pack("{s:s, s:{s:f}, s:{s:o, s:o}}", "op", "saxpy", "params", "a", a, "inputs", "x",
                     tensor_inline("f32", shape, ndim, x, n), "y",
                     tensor_inline("f32", shape, ndim, y, n));
}

/* n random values representable in dtype (f32 values rounded to float). */
static void random_values(const char *dtype, double *v, long n, double lo, double hi,
                          uint32_t *seed)
{
    for (long i = 0; i < n; i++) {
        double x = e2e_rand_uniform(seed, lo, hi);
        v[i] = is_float_dtype(dtype) ? (double)(float)x : floor(x);
    }
}

/* The out tensor of a finished job: asserts succeeded, dtype and element count, and returns
 * the values flattened into out (cap values). */
static void job_output(const json_t *job, const char *name, const char *dtype, long n, double *out)
{
    ck_assert_msg(strcmp(e2e_job_state(job), "succeeded") == 0, "job %s: %s (error %s)",
                  json_string_value(json_object_get(job, "id")), e2e_job_state(job),
                  json_dumps(json_object_get(job, "error"), JSON_COMPACT));
    json_t *t = json_object_get(json_object_get(job, "outputs"), name);
    ck_assert_msg(t != NULL, "no output %s", name);
    ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), dtype);
    long got = e2e_json_flatten(json_object_get(t, "data"), out, n);
    ck_assert_msg(got == n, "output %s has %ld values, expected %ld", name, got, n);
    /* An f32 is printed as the shortest text that reads back to it as an f32: read so. */
    if (strcmp(dtype, "f32") == 0)
        for (long i = 0; i < n; i++)
            out[i] = (float)out[i];
}

static bool info_has_op(e2e_daemon_t *d, const char *name)
{
    json_t *info = e2e_json_ok(d, "GET", "/v1/info", NULL, 200);
    json_t *ops = json_object_get(info, "ops");
    bool found = json_object_get(ops, name) != NULL;
    size_t i;
    json_t *op;
    json_array_foreach(ops, i, op) if (json_is_string(json_object_get(op, "name")) &&
                                       strcmp(json_string_value(json_object_get(op, "name")),
                                              name) == 0) found = true;
    json_decref(info);
    return found;
}

/* Runs op on random x (and y) of dtype and checks every output element. */
static void check_elementwise(e2e_daemon_t *d, const char *op, const char *dtype, uint32_t seed)
{
    enum { N = 1000 };
    static const int64_t shape[] = {8, 125};
    double x[N], y[N], got[N];
    bool is_float = is_float_dtype(dtype);
    random_values(dtype, x, N, is_float ? -10 : -1000, is_float ? 10 : 1000, &seed);
    random_values(dtype, y, N, is_float ? -10 : -1000, is_float ? 10 : 1000, &seed);
    double a = is_float ? 2.5 : 3;
    json_t *job =
        json_pack("{s:s, s:{s:o, s:o}}", "op", op, "inputs", "x",
                  tensor_inline(dtype, shape, 2, x, N), "y", tensor_inline(dtype, shape, 2, y, N));
    if (strcmp(op, "saxpy") == 0)
        json_object_set_new(job, "params",
                            json_pack("{s:o}", "a", is_float ? json_real(a) : json_integer(3)));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    job_output(done, "out", dtype, N, got);
    json_t *out_shape =
        json_object_get(json_object_get(json_object_get(done, "outputs"), "out"), "shape");
    ck_assert_int_eq(json_array_size(out_shape), 2);
    ck_assert_int_eq(json_integer_value(json_array_get(out_shape, 0)), 8);
    ck_assert_int_eq(json_integer_value(json_array_get(out_shape, 1)), 125);
    for (int i = 0; i < N; i++) {
        double want, tol = 0;
        if (strcmp(op, "add") == 0) {
            want = is_float ? (double)((float)x[i] + (float)y[i]) : x[i] + y[i];
        } else if (strcmp(op, "mul") == 0) {
            want = is_float ? (double)((float)x[i] * (float)y[i]) : x[i] * y[i];
        } else {
            want = a * x[i] + y[i];
            /* a*x+y in f32, fused or not, is within an ulp or two of the exact value. */
            if (is_float) tol = 3e-7 * (fabs(a * x[i]) + fabs(y[i]));
        }
        ck_assert_msg(fabs(got[i] - want) <= tol, "%s %s [%d]: got %.9g, expected %.9g", op, dtype,
                      i, got[i], want);
    }
    free(id);
    json_decref(job);
    json_decref(done);
}

/* sum and dot: one value of shape [], i32 accumulated exactly into i64, f32 into f32. */
static void check_reduction(e2e_daemon_t *d, const char *op, const char *dtype, uint32_t seed)
{
    enum { N = 1000 };
    static const int64_t shape[] = {N};
    double x[N], y[N], got;
    bool is_float = is_float_dtype(dtype);
    random_values(dtype, x, N, is_float ? -10 : -1000, is_float ? 10 : 1000, &seed);
    random_values(dtype, y, N, is_float ? -10 : -1000, is_float ? 10 : 1000, &seed);
    bool is_dot = strcmp(op, "dot") == 0;
    json_t *inputs = json_pack("{s:o}", "x", tensor_inline(dtype, shape, 1, x, N));
    if (is_dot) json_object_set_new(inputs, "y", tensor_inline(dtype, shape, 1, y, N));
    json_t *job = json_pack("{s:s, s:o}", "op", op, "inputs", inputs);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    job_output(done, "out", is_float ? "f32" : "i64", 1, &got);
    double want = 0, magnitude = 0;
    for (int i = 0; i < N; i++) {
        double term = is_dot ? x[i] * y[i] : x[i];
        want += term;
        magnitude += fabs(term);
    }
    double tol = is_float ? 1e-6 * magnitude : 0;
    ck_assert_msg(fabs(got - want) <= tol, "%s %s: got %.9g, expected %.9g", op, dtype, got, want);
    free(id);
    json_decref(job);
    json_decref(done);
}

START_TEST(test_ops_match_reference_computation)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    static const char *const dtypes[] = {"f32", "i32"};
    static const char *const ew_ops[] = {"add", "mul", "saxpy"};
    for (int t = 0; t < 2; t++) {
        for (int o = 0; o < 3; o++)
            check_elementwise(d, ew_ops[o], dtypes[t], 100 + 10 * t + o);
        check_reduction(d, "sum", dtypes[t], 200 + t);
        check_reduction(d, "dot", dtypes[t], 300 + t);
    }
    e2e_daemon_free(d);
}
END_TEST

static int cmp_int_asc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

START_TEST(test_sort_matches_reference_when_present)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    if (!info_has_op(d, "sort")) {
        fprintf(stderr, "sort is not in /v1/info: skipped\n");
        e2e_daemon_free(d);
        return;
    }
    enum { N = 500 };
    static const int64_t shape[] = {N};
    uint32_t seed = 7;
    double keys[N], got[N], want[N];
    random_values("i32", keys, N, -50, 50, &seed); /* many ties */
    json_t *job = json_pack("{s:s, s:{s:o}}", "op", "sort", "inputs", "keys",
                            tensor_inline("i32", shape, 1, keys, N));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    job_output(done, "keys", "i32", N, got);
    memcpy(want, keys, sizeof want);
    qsort(want, N, sizeof want[0], cmp_int_asc);
    for (int i = 0; i < N; i++)
        ck_assert_msg(got[i] == want[i], "sort [%d]: got %g, expected %g", i, got[i], want[i]);
    free(id);
    json_decref(job);
    json_decref(done);

    /* Descending argsort of f32 keys: indices are the stable permutation. */
    double fkeys[N], idx[N];
    random_values("f32", fkeys, N, -4, 4, &seed);
    for (int i = 0; i < N; i += 7)
        fkeys[i] = 1.0; /* ties, which must keep their input order */
    job = json_pack("{s:s, s:{s:b, s:b}, s:{s:o}}", "op", "sort", "params", "descending", 1,
                    "argsort", 1, "inputs", "keys", tensor_inline("f32", shape, 1, fkeys, N));
    id = e2e_submit_ok(d, job);
    done = e2e_wait_final_ok(d, id, 30);
    job_output(done, "indices", "i64", N, idx);
    job_output(done, "keys", "f32", N, got);
    for (int i = 0; i < N; i++) {
        ck_assert(idx[i] >= 0 && idx[i] < N);
        ck_assert_msg(got[i] == fkeys[(int)idx[i]], "keys[%d] is not keys_in[indices[%d]]", i, i);
        if (i > 0) {
            ck_assert_msg(got[i - 1] >= got[i], "not descending at %d", i);
            if (got[i - 1] == got[i]) ck_assert_msg(idx[i - 1] < idx[i], "tie at %d not stable", i);
        }
    }
    free(id);
    json_decref(job);
    json_decref(done);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_gemm_matches_reference_when_present)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    if (!info_has_op(d, "gemm")) {
        fprintf(stderr, "gemm is not in /v1/info: skipped\n");
        e2e_daemon_free(d);
        return;
    }
    enum { M = 16, K = 24, N = 8 };
    static const int64_t sa[] = {M, K}, sb[] = {K, N};
    uint32_t seed = 99;
    double a[M * K], b[K * N], got[M * N];
    random_values("f32", a, M * K, -1, 1, &seed);
    random_values("f32", b, K * N, -1, 1, &seed);
    json_t *job = json_pack("{s:s, s:{s:o, s:o}}", "op", "gemm", "inputs", "a",
                            tensor_inline("f32", sa, 2, a, M * K), "b",
                            tensor_inline("f32", sb, 2, b, K * N));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    job_output(done, "out", "f32", M * N, got);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                want += a[i * K + k] * b[k * N + j];
                mag += fabs(a[i * K + k] * b[k * N + j]);
            }
            ck_assert_msg(fabs(got[i * N + j] - want) <= 1e-6 * mag + 1e-30,
                          "gemm [%d,%d]: got %.9g, expected %.9g", i, j, got[i * N + j], want);
        }
    free(id);
    json_decref(job);
    json_decref(done);
    e2e_daemon_free(d);
}
END_TEST

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
    random_values("f32", x, N, -3, 3, &seed);
    random_values("f32", y, N, -3, 3, &seed);
    for (int i = 0; i < N; i++)
        xf[i] = (float)x[i];

    /* x as base64 of its little-endian bytes. */
    char *b64 = e2e_base64(xf, sizeof xf);
    json_t *job =
        json_pack("{s:s, s:{s:{s:s, s:[i], s:s}, s:o}}", "op", "add", "inputs", "x", "dtype", "f32",
                  "shape", N, "b64", b64, "y", tensor_inline("f32", shape, 1, y, N));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    job_output(done, "out", "f32", N, got);
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
                    tensor_inline("f32", shape, 1, y, N));
    id = e2e_submit_ok(d, job);
    done = e2e_wait_final_ok(d, id, 30);
    job_output(done, "out", "f32", N, got);
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
    random_values("f32", a, N, -3, 3, &seed);
    random_values("f32", b, N, -3, 3, &seed);
    random_values("f32", c, N, -3, 3, &seed);
    for (int i = 0; i < N; i++) {
        section[i] = (float)a[i];
        section[N + i] = (float)b[i];
        section[2 * N + i] = (float)c[i];
    }
    const size_t B = N * sizeof(float);
    json_t *list = json_pack(
        "[{s:s, s:{s:{s:s, s:[i], s:I}, s:{s:s, s:[i], s:I}}},"
        " {s:s, s:{s:{s:s, s:[i], s:I}, s:{s:s, s:[i], s:I}}},"
        " {s:s, s:{s:{s:s, s:[i], s:I}, s:o}}]",
        "op", "add", "inputs", "x", "dtype", "f32", "shape", N, "binary_offset", (json_int_t)0, "y",
        "dtype", "f32", "shape", N, "binary_offset", (json_int_t)B, "op", "mul", "inputs", "x",
        "dtype", "f32", "shape", N, "binary_offset", (json_int_t)(2 * B), "y", "dtype", "f32",
        "shape", N, "binary_offset", (json_int_t)0, "op", "add", "inputs", "x", "dtype", "f32",
        "shape", N, "binary_offset", (json_int_t)B, "y", tensor_inline("f32", shape, 1, c, N));
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
        job_output(done, "out", "f32", N, got);
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
    random_values("f32", x, N, -4, 4, &seed);
    random_values("f32", y, N, -4, 4, &seed);
    for (int i = 0; i < N; i++)
        want[i] = 2.5f * (float)x[i] + (float)y[i];
    json_t *job = saxpy_job(2.5, shape, 1, x, y, N);
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
        job_output(resp.json, "out", "f32", N, got);
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
    random_values("f32", w, N, -2, 2, &seed);
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
        random_values("f32", y, N, -3, 3, &seed);
        json_t *job = json_pack("{s:s, s:{s:{s:s}, s:o}}", "op", "mul", "inputs", "x", "buffer",
                                ids[0], "y", tensor_inline("f32", shape, 1, y, N));
        char *id = e2e_submit_ok(d, job);
        json_t *done = e2e_wait_final_ok(d, id, 30);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        ck_assert(json_is_null(json_object_get(done, "device")));
        if (on_gpu)
            ck_assert_int_eq(json_integer_value(json_object_get(done, "run_device")),
                             json_integer_value(placed));
        job_output(done, "out", "f32", N, got);
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
    random_values("f32", x, N, -2, 2, &seed);
    random_values("f32", y, N, -2, 2, &seed);
    json_t *job = saxpy_job(2.0, shape, 1, x, y, N);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    job_output(done, "out", "f32", N, first);
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
            random_values("f32", z, N, -3, 3, &seed);
            json_t *next = json_pack("{s:s, s:{s:{s:s}, s:o}}", "op", "add", "inputs", "x",
                                     "buffer", kept[k], "y", tensor_inline("f32", shape, 1, z, N));
            char *next_id = e2e_submit_ok(d, next);
            json_t *ended = e2e_wait_final_ok(d, next_id, 30);
            job_output(ended, "out", "f32", N, got);
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

/* POST /v1/jobs?wait=S answers once the job has ended: 201 with its final state and outputs
 * inline, equal to the computation here; a job longer than the wait is answered as it stands
 * (still 201: it is accepted); a wait out of range answers 400. */
START_TEST(test_submit_waits_for_its_job_when_asked)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 257 };
    static const int64_t shape[] = {N};
    uint32_t seed = 31;
    double x[N], y[N], got[N];
    random_values("f32", x, N, -4, 4, &seed);
    random_values("f32", y, N, -4, 4, &seed);
    json_t *job = saxpy_job(1.5, shape, 1, x, y, N);
    char *text = json_dumps(job, JSON_COMPACT);
    json_t *done = e2e_json_ok(d, "POST", "/v1/jobs?wait=1e9", text, 201); /* cut to the limit */
    job_output(done, "out", "f32", N, got);
    for (int i = 0; i < N; i++)
        ck_assert_msg(got[i] == (double)(1.5f * (float)x[i] + (float)y[i]), "[%d]", i);
    json_decref(done);

    /* A wait shorter than the job: answered as it stands, then it ends as any job does. */
    json_t *long_job = e2e_long_job_new(1500);
    char *long_text = json_dumps(long_job, JSON_COMPACT);
    json_t *early = e2e_json_ok(d, "POST", "/v1/jobs?wait=0.2", long_text, 201);
    const char *state = e2e_job_state(early);
    ck_assert_msg(strcmp(state, "queued") == 0 || strcmp(state, "running") == 0, "state %s", state);
    json_t *ended = e2e_wait_final_ok(d, json_string_value(json_object_get(early, "id")), 30);
    ck_assert_str_eq(e2e_job_state(ended), "succeeded");
    json_decref(ended);
    json_decref(early);

    static const char *const bad_waits[] = {"-1", "abc", "inf", ""};
    for (size_t i = 0; i < sizeof bad_waits / sizeof bad_waits[0]; i++) {
        char path[64];
        snprintf(path, sizeof path, "/v1/jobs?wait=%s", bad_waits[i]);
        json_t *bad = e2e_json_ok(d, "POST", path, text, 400);
        ck_assert_str_eq(e2e_error_field(bad), "query.wait");
        json_decref(bad);
    }

    free(long_text);
    json_decref(long_job);
    free(text);
    json_decref(job);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_array_of_100_jobs_in_one_post)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    /* 4 KiB tensors: the array's inputs, and each batch's outputs, come to more than 64 KiB, so
     * that they are written together to files of their own (store_blob_pack), which the
     * answers read back. */
    enum { JOBS = 100, N = 1024 };
    static const int64_t shape[] = {N};
    static double x[JOBS][N], y[JOBS][N];
    uint32_t seed = 11;
    json_t *array = json_array();
    for (int j = 0; j < JOBS; j++) {
        const char *dtype = j % 2 ? "i32" : "f32";
        random_values(dtype, x[j], N, -100, 100, &seed);
        random_values(dtype, y[j], N, -100, 100, &seed);
        json_array_append_new(array,
                              json_pack("{s:s, s:{s:o, s:o}}", "op", j % 3 ? "add" : "mul",
                                        "inputs", "x", tensor_inline(dtype, shape, 1, x[j], N), "y",
                                        tensor_inline(dtype, shape, 1, y[j], N)));
    }
    char *text = json_dumps(array, JSON_COMPACT);
    json_t *created = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
    free(text);
    ck_assert_msg(json_is_array(created), "an array POST answers an array");
    ck_assert_int_eq(json_array_size(created), JOBS);
    for (int j = 0; j < JOBS; j++) {
        const char *id = json_string_value(json_object_get(json_array_get(created, j), "id"));
        ck_assert(id != NULL);
        for (int k = 0; k < j; k++)
            ck_assert_str_ne(id,
                             json_string_value(json_object_get(json_array_get(created, k), "id")));
        json_t *done = e2e_wait_final_ok(d, id, 30);
        double got[N];
        job_output(done, "out", j % 2 ? "i32" : "f32", N, got);
        for (int i = 0; i < N; i++) {
            double want = j % 3 ? (double)((float)x[j][i] + (float)y[j][i])
                                : (double)((float)x[j][i] * (float)y[j][i]);
            if (j % 2) want = j % 3 ? x[j][i] + y[j][i] : x[j][i] * y[j][i];
            ck_assert_msg(got[i] == want, "job %d [%d]: got %g, expected %g", j, i, got[i], want);
        }
        json_decref(done);
    }
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), JOBS);
    json_decref(created);
    json_decref(array);
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
    random_values("f32", x, N, -10, 10, &seed);
    random_values("f32", y, N, -10, 10, &seed);
    json_t *job = saxpy_job(0.75, shape, 2, x, y, N);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    job_output(done, "out", "f32", N, inline_out);
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

static json_t *small_add_job(int value)
{
    return json_pack("{s:s, s:{s:{s:s, s:[i], s:[i,i]}, s:{s:s, s:[i], s:[i,i]}}}", "op", "add",
                     "inputs", "x", "dtype", "i32", "shape", 2, "data", value, value + 1, "y",
                     "dtype", "i32", "shape", 2, "data", 1, 1);
}

START_TEST(test_cancel_queued_job_never_runs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);

    json_t *small = small_add_job(5);
    char *id = e2e_submit_ok(d, small);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *job = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "queued");
    json_decref(job);

    job = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "cancelled");
    json_decref(job);

    json_t *long_done = e2e_wait_final_ok(d, long_id, 60);
    ck_assert_str_eq(e2e_job_state(long_done), "succeeded");
    /* The worker was free after the long job: a job left in the queue would have run by now. */
    char *after_id = e2e_submit_ok(d, small);
    json_decref(e2e_wait_final_ok(d, after_id, 30));
    free(after_id);
    job = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "cancelled");
    ck_assert_msg(json_is_null(json_object_get(job, "started_at")), "a cancelled job started");
    json_decref(job);
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 409));
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=cancelled"), 1);

    free(id);
    free(long_id);
    json_decref(small);
    json_decref(long_job);
    json_decref(long_done);
    e2e_daemon_free(d);
}
END_TEST

static int blob_files;
static off_t blob_bytes;
static int count_blob_file(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    blob_files += type == FTW_F;
    if (type == FTW_F) blob_bytes += sb->st_size;
    return 0;
}

/* Files under the daemon's blobs/ directory. */
static int count_blob_files(e2e_daemon_t *d)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/state/blobs", e2e_daemon_dir(d));
    blob_files = 0;
    blob_bytes = 0;
    nftw(path, count_blob_file, 16, FTW_PHYS);
    return blob_files;
}

/* Waits up to 10 s for the daemon's blobs/ to hold n files; asserts it does. */
static void expect_blob_files(e2e_daemon_t *d, int n, const char *why)
{
    double until = e2e_now() + 10;
    while (count_blob_files(d) != n && e2e_now() < until)
        usleep(10000);
    ck_assert_msg(count_blob_files(d) == n, "%s: %d blob files, expected %d", why,
                  count_blob_files(d), n);
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
    random_values("f32", v, N, -100, 100, &seed);
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
    while (count_blob_files(d) == 1 && blob_bytes < (1 << 20) && e2e_now() < until)
        usleep(10000);
    ck_assert_msg(blob_bytes >= (1 << 20), "%lld bytes of 1.4 MB sent are in the file",
                  (long long)blob_bytes);
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
    ck_assert_int_eq(count_blob_files(d), 1);
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

START_TEST(test_cancel_running_job_keeps_nothing_of_its_result)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    enum { N = 100000 }; /* 400 KB: the input buffer and the output each get a file */
    float *x = calloc(N, sizeof *x);
    json_t *meta = e2e_upload_ok(d, "f32", "100000", x, N * sizeof *x, false, 201);
    json_t *job =
        json_pack("{s:s, s:{s:i}, s:{s:{s:s}}}", "op", "debug_sleep", "params", "ms", 1000,
                  "inputs", "x", "buffer", json_string_value(json_object_get(meta, "id")));
    ck_assert_int_eq(count_blob_files(d), 1);
    char *id = e2e_submit_ok(d, job);
    e2e_wait_state_ok(d, id, "running", 10);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *cancelled = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(cancelled), "cancelled");
    json_decref(cancelled);

    /* The run ends; its result is discarded, and so is the file written for its output. */
    double until = e2e_now() + 10;
    while (e2e_metric_ok(d, "gpujobd_jobs_running") > 0 && e2e_now() < until)
        usleep(20000);
    ck_assert(e2e_metric_ok(d, "gpujobd_jobs_running") == 0);
    ck_assert_int_eq(count_blob_files(d), 1);
    json_t *now = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(now), "cancelled");
    json_decref(now);

    free(id);
    free(x);
    json_decref(job);
    json_decref(meta);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_deadline_passes_while_queued)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);

    json_t *small = small_add_job(1);
    json_object_set_new(small, "deadline_ms", json_integer(200));
    char *id = e2e_submit_ok(d, small);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    ck_assert_str_eq(e2e_job_state(done), "failed");
    ck_assert_str_eq(e2e_error_code(done), "deadline_exceeded");
    ck_assert(json_is_null(json_object_get(done, "started_at")));
    /* It failed while the long job still held the only worker. */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", long_id);
    json_t *long_now = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(long_now), "running");
    json_decref(long_now);

    json_decref(e2e_wait_final_ok(d, long_id, 60));
    free(id);
    free(long_id);
    json_decref(done);
    json_decref(small);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_idempotent_resubmission_returns_first_job)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *job = small_add_job(3);
    char *text = json_dumps(job, JSON_COMPACT);
    const char *hdrs[] = {"Content-Type: application/json", "Idempotency-Key: e2e-key-1", NULL};
    e2e_response_t first, again;
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", hdrs, text, strlen(text), &first) == 0);
    ck_assert_msg(first.status == 201, "first: %ld %s", first.status, first.body);
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", hdrs, text, strlen(text), &again) == 0);
    ck_assert_msg(again.status == 200, "retry: %ld %s", again.status, again.body);
    const char *id1 = json_string_value(json_object_get(first.json, "id"));
    const char *id2 = json_string_value(json_object_get(again.json, "id"));
    ck_assert(id1 && id2);
    ck_assert_str_eq(id1, id2);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 1);

    /* Another key is another job. */
    const char *hdrs2[] = {"Content-Type: application/json", "Idempotency-Key: e2e-key-2", NULL};
    e2e_response_t other;
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", hdrs2, text, strlen(text), &other) == 0);
    ck_assert_int_eq(other.status, 201);
    ck_assert_str_ne(json_string_value(json_object_get(other.json, "id")), id1);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 2);
    e2e_response_clear(&first);
    e2e_response_clear(&again);
    e2e_response_clear(&other);
    free(text);
    json_decref(job);
    e2e_daemon_free(d);
}
END_TEST

/* A list's elements and single jobs never share a key: a single job keyed "x:0" is not the
 * first element of a list keyed "x", and each retry replays its own jobs. */
START_TEST(test_a_list_key_never_names_a_single_job)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *job = small_add_job(3);
    char *single = json_dumps(job, JSON_COMPACT);
    json_t *list_json = json_pack("[O,O]", job, job);
    char *list = json_dumps(list_json, JSON_COMPACT);
    const char *single_key[] = {"Content-Type: application/json", "Idempotency-Key: x:0", NULL};
    const char *list_key[] = {"Content-Type: application/json", "Idempotency-Key: x", NULL};
    e2e_response_t one, many, one_again, many_again;
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", single_key, single, strlen(single), &one) ==
              0);
    ck_assert_msg(one.status == 201, "single: %ld %s", one.status, one.body);
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", list_key, list, strlen(list), &many) == 0);
    ck_assert_msg(many.status == 201, "list: %ld %s", many.status, many.body);
    const char *single_id = json_string_value(json_object_get(one.json, "id"));
    json_t *jobs = many.json;
    ck_assert_int_eq(json_array_size(jobs), 2);
    const char *list_ids[2];
    for (int i = 0; i < 2; i++) {
        list_ids[i] = json_string_value(json_object_get(json_array_get(jobs, (size_t)i), "id"));
        ck_assert_ptr_nonnull(list_ids[i]);
        ck_assert_msg(strcmp(list_ids[i], single_id) != 0,
                      "the list's element %d is the single job keyed x:0", i);
    }
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 3);

    /* Retries replay their own jobs. */
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", list_key, list, strlen(list), &many_again) ==
              0);
    ck_assert_msg(many_again.status == 200, "list retry: %ld %s", many_again.status,
                  many_again.body);
    jobs = many_again.json;
    ck_assert_int_eq(json_array_size(jobs), 2);
    for (int i = 0; i < 2; i++)
        ck_assert_str_eq(json_string_value(json_object_get(json_array_get(jobs, (size_t)i), "id")),
                         list_ids[i]);
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", single_key, single, strlen(single),
                               &one_again) == 0);
    ck_assert_msg(one_again.status == 200, "single retry: %ld %s", one_again.status,
                  one_again.body);
    ck_assert_str_eq(json_string_value(json_object_get(one_again.json, "id")), single_id);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 3);
    e2e_response_clear(&one);
    e2e_response_clear(&many);
    e2e_response_clear(&one_again);
    e2e_response_clear(&many_again);
    free(single);
    free(list);
    json_decref(list_json);
    json_decref(job);
    e2e_daemon_free(d);
}
END_TEST

/* A retry of an accepted submission is answered with its job even while the user's queue is
 * full (it adds nothing to the queue); a new job is refused then, 429. */
START_TEST(test_idempotent_retry_is_answered_while_the_queue_is_full)
{
    e2e_daemon_t *d =
        e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG "[limits]\nmax_queued_per_user = 2\n");
    json_t *long_job = e2e_long_job_new(3000);
    char *text = json_dumps(long_job, JSON_COMPACT);
    char *running = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, running, "running", 10);
    const char *keyed[] = {"Content-Type: application/json", "Idempotency-Key: full-queue", NULL};
    e2e_response_t first, retry;
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", keyed, text, strlen(text), &first) == 0);
    ck_assert_msg(first.status == 201, "first: %ld %s", first.status, first.body);
    char *second = e2e_submit_ok(d, long_job); /* the queue holds two now: full */
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs", keyed, text, strlen(text), &retry) == 0);
    ck_assert_msg(retry.status == 200, "retry: %ld %s", retry.status, retry.body);
    ck_assert_str_eq(json_string_value(json_object_get(retry.json, "id")),
                     json_string_value(json_object_get(first.json, "id")));
    json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", text, 429);
    ck_assert_str_eq(e2e_error_code(refused), "quota_exceeded");
    ck_assert_str_eq(e2e_error_field(refused), "limits.max_queued_per_user");
    json_decref(refused);
    e2e_response_clear(&first);
    e2e_response_clear(&retry);
    free(second);
    free(running);
    free(text);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

static bool id_in(const char *id, char **ids, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(ids[i], id) == 0) return true;
    return false;
}

START_TEST(test_list_pagination_and_filters)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { JOBS = 25, MULS = 10 };
    char *ids[JOBS];
    for (int i = 0; i < JOBS; i++) {
        json_t *job = small_add_job(i);
        if (i >= JOBS - MULS) json_object_set_new(job, "op", json_string("mul"));
        ids[i] = e2e_submit_ok(d, job);
        json_decref(job);
    }
    for (int i = 0; i < JOBS; i++)
        json_decref(e2e_wait_final_ok(d, ids[i], 30));

    char *seen[JOBS + 1];
    int n_seen = 0, pages = 0;
    char cursor[128] = "";
    for (;;) {
        char path[256];
        snprintf(path, sizeof path, "/v1/jobs?limit=10%s%s", *cursor ? "&after=" : "", cursor);
        json_t *page = e2e_json_ok(d, "GET", path, NULL, 200);
        json_t *jobs = json_object_get(page, "jobs");
        pages++;
        ck_assert_int_eq(json_array_size(jobs), pages < 3 ? 10 : 5);
        size_t i;
        json_t *j;
        json_array_foreach(jobs, i, j)
        {
            const char *id = json_string_value(json_object_get(j, "id"));
            ck_assert_msg(id && !id_in(id, seen, n_seen), "page %d repeats %s", pages, id);
            ck_assert_msg(id_in(id, ids, JOBS), "listed %s was never submitted", id);
            ck_assert(n_seen < JOBS);
            seen[n_seen++] = strdup(id);
        }
        json_t *next = json_object_get(page, "next");
        bool more = json_is_string(next);
        if (more) snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
        ck_assert_msg(more == (pages < 3), "page %d: next is %s", pages, more ? "set" : "null");
        json_decref(page);
        if (!more) break;
    }
    ck_assert_int_eq(n_seen, JOBS);

    /* op filter: exactly the mul jobs. */
    json_t *muls = e2e_json_ok(d, "GET", "/v1/jobs?op=mul&limit=100", NULL, 200);
    json_t *list = json_object_get(muls, "jobs");
    ck_assert_int_eq(json_array_size(list), MULS);
    size_t i;
    json_t *j;
    json_array_foreach(list, i, j)
    {
        ck_assert_str_eq(json_string_value(json_object_get(j, "op")), "mul");
        ck_assert(id_in(json_string_value(json_object_get(j, "id")), ids + JOBS - MULS, MULS));
    }
    json_decref(muls);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=succeeded"), JOBS);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=failed"), 0);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=queued"), 0);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=succeeded&op=add"), JOBS - MULS);

    for (int k = 0; k < JOBS; k++)
        free(ids[k]);
    for (int k = 0; k < n_seen; k++)
        free(seen[k]);
    e2e_daemon_free(d);
}
END_TEST

/* The integer value of key anywhere in v (depth first), or -1. */
static json_int_t find_int(const json_t *v, const char *key)
{
    const char *k;
    json_t *e;
    size_t i;
    if (json_is_object(v)) {
        json_t *direct = json_object_get(v, key);
        if (json_is_integer(direct)) return json_integer_value(direct);
        json_object_foreach((json_t *)v, k, e)
        {
            json_int_t r = find_int(e, key);
            if (r >= 0) return r;
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, e)
        {
            json_int_t r = find_int(e, key);
            if (r >= 0) return r;
        }
    }
    return -1;
}

START_TEST(test_health_metrics_usage_and_info)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *health = e2e_json_ok(d, "GET", "/healthz", NULL, 200);
    ck_assert_str_eq(json_string_value(json_object_get(health, "status")), "ok");
    json_decref(health);
    json_decref(e2e_json_ok(d, "GET", "/readyz", NULL, 200));

    json_t *info = e2e_json_ok(d, "GET", "/v1/info", NULL, 200);
    ck_assert(json_is_string(json_object_get(info, "version")));
    json_decref(info);
    ck_assert(info_has_op(d, "saxpy"));

    const char *m201 = "gpujobd_http_requests_total{code=\"201\"}";
    double submitted0 = e2e_metric_ok(d, "gpujobd_jobs_submitted_total");
    double succeeded0 = e2e_metric_ok(d, "gpujobd_jobs_succeeded_total");
    double created0 = e2e_metric_ok(d, m201);
    enum { JOBS = 3 };
    for (int i = 0; i < JOBS; i++) {
        json_t *job = small_add_job(i);
        char *id = e2e_submit_ok(d, job);
        json_decref(e2e_wait_final_ok(d, id, 30));
        free(id);
        json_decref(job);
    }
    ck_assert_int_eq((long)(e2e_metric_ok(d, "gpujobd_jobs_submitted_total") - submitted0), JOBS);
    ck_assert_int_eq((long)(e2e_metric_ok(d, "gpujobd_jobs_succeeded_total") - succeeded0), JOBS);
    ck_assert_int_eq((long)(e2e_metric_ok(d, m201) - created0), JOBS);
    /* The gauges are updated on the scheduler's loop after the job's reply went out, so they
     * may lag the wait by a moment. */
    double until = e2e_now() + 2;
    while ((e2e_metric_ok(d, "gpujobd_jobs_queued") != 0 ||
            e2e_metric_ok(d, "gpujobd_jobs_running") != 0) &&
           e2e_now() < until)
        usleep(10 * 1000);
    ck_assert(e2e_metric_ok(d, "gpujobd_jobs_queued") == 0);
    ck_assert(e2e_metric_ok(d, "gpujobd_jobs_running") == 0);
    ck_assert(e2e_metric_ok(d, "gpujobd_batches_total") >= 1);

    json_t *usage = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_msg(json_is_object(usage), "usage is not an object");
    ck_assert_msg(find_int(usage, "succeeded") == JOBS, "usage: %s",
                  json_dumps(usage, JSON_COMPACT));
    json_decref(usage);
    e2e_daemon_free(d);
}
END_TEST

/* The JSON number text that follows "key": in text, into buf; false when the key is absent or
 * its value is not a number. */
static bool number_text_after(const char *text, const char *key, char *buf, size_t size)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *p = strstr(text, pattern);
    if (!p) return false;
    p += strlen(pattern);
    size_t n = strspn(p, "-+.0123456789eE");
    if (n == 0 || n >= size) return false;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return true;
}

/* Asserts that a number's text is the shortest that reads back to its double: no text of one
 * significant digit fewer does. */
static void assert_shortest(const char *what, const char *text)
{
    double v = strtod(text, NULL);
    int digits = 0;
    bool leading = true;
    for (const char *p = text; *p && *p != 'e' && *p != 'E'; p++) {
        if (*p < '0' || *p > '9') continue;
        if (*p == '0' && leading) continue;
        leading = false;
        digits++;
    }
    /* Trailing zeros ("2.0") are not significant. */
    for (const char *p = text + strcspn(text, "eE"); p > text && (p[-1] == '0' || p[-1] == '.');
         p--)
        if (p[-1] == '0' && digits > 1) digits--;
    char shorter[48];
    if (digits > 1) {
        snprintf(shorter, sizeof shorter, "%.*e", digits - 2, v);
        ck_assert_msg(strtod(shorter, NULL) != v, "%s is %s, but %s reads back the same", what,
                      text, shorter);
    }
    ck_assert_msg(digits <= 15, "%s is %s: a 17-digit tail", what, text);
}

/* Answers print numbers as Python or NumPy would: an f32 output 0.2 as 0.2, params and the
 * timing fields shortest for their doubles. */
START_TEST(test_answers_print_numbers_shortest_for_their_dtype)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_error_t jerr;
    json_t *job = json_loads("{\"op\": \"saxpy\", \"params\": {\"a\": 1.3},"
                             " \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [2],"
                             " \"data\": [0, 1]}, \"y\": {\"dtype\": \"f32\", \"shape\": [2],"
                             " \"data\": [0.2, 0]}}}",
                             0, &jerr);
    ck_assert_ptr_nonnull(job);
    char *id = e2e_submit_ok(d, job);
    json_decref(e2e_wait_final_ok(d, id, 30));

    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    e2e_response_t resp;
    ck_assert(e2e_http_request(d, "GET", path, NULL, NULL, 0, &resp) == 0);
    ck_assert_int_eq(resp.status, 200);
    /* 1.3*0 + 0.2 and 1.3*1 + 0 in f32: the f32 values nearest 0.2 and 1.3. */
    ck_assert_msg(strstr(resp.body, "\"data\":[0.2,1.3]"), "answer: %s", resp.body);
    ck_assert_msg(strstr(resp.body, "\"params\":{\"a\":1.3}"), "answer: %s", resp.body);
    static const char *const timings[] = {"queue_ms", "run_ms", "gpu_ms", "batch_gpu_ms"};
    for (size_t i = 0; i < sizeof timings / sizeof timings[0]; i++) {
        char num[64];
        ck_assert_msg(number_text_after(resp.body, timings[i], num, sizeof num), "no %s in %s",
                      timings[i], resp.body);
        assert_shortest(timings[i], num);
    }
    e2e_response_clear(&resp);

    static const char *const accept_json[] = {"Accept: application/json", NULL};
    snprintf(path, sizeof path, "/v1/jobs/%s/outputs/out", id);
    ck_assert(e2e_http_request(d, "GET", path, accept_json, NULL, 0, &resp) == 0);
    ck_assert_int_eq(resp.status, 200);
    ck_assert_msg(strstr(resp.body, "\"data\":[0.2,1.3]"), "output: %s", resp.body);
    e2e_response_clear(&resp);
    free(id);
    json_decref(job);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_jobs");
    TCase *tc = tcase_create("jobs");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_ops_match_reference_computation);
    tcase_add_test(tc, test_answers_print_numbers_shortest_for_their_dtype);
    tcase_add_test(tc, test_sort_matches_reference_when_present);
    tcase_add_test(tc, test_gemm_matches_reference_when_present);
    tcase_add_test(tc, test_b64_and_buffer_inputs);
    tcase_add_test(tc, test_binary_section_inputs);
    tcase_add_test(tc, test_binary_section_outputs);
    tcase_add_test(tc, test_resident_buffers_serve_jobs_within_the_owner_quota);
    tcase_add_test(tc, test_job_output_kept_as_a_buffer_serves_the_next_job);
    tcase_add_test(tc, test_submit_waits_for_its_job_when_asked);
    tcase_add_test(tc, test_array_of_100_jobs_in_one_post);
    tcase_add_test(tc, test_output_download_json_raw_and_npy);
    tcase_add_test(tc, test_npy_buffer_round_trip);
    tcase_add_test(tc, test_cancel_queued_job_never_runs);
    tcase_add_test(tc, test_cancel_running_job_keeps_nothing_of_its_result);
    tcase_add_test(tc, test_large_upload_streams_to_its_file);
    tcase_add_test(tc, test_deadline_passes_while_queued);
    tcase_add_test(tc, test_idempotent_resubmission_returns_first_job);
    tcase_add_test(tc, test_a_list_key_never_names_a_single_job);
    tcase_add_test(tc, test_idempotent_retry_is_answered_while_the_queue_is_full);
    tcase_add_test(tc, test_list_pagination_and_filters);
    tcase_add_test(tc, test_health_metrics_usage_and_info);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
