/* The isolation check: phase 1 fills the daemon's memory with the marker as one user, phase 2
 * runs every op on degenerate shapes as another and checks each output byte (see the header).
 *
 * Phase-2 tensors hold small integers, so every result below is exact in every dtype used and
 * the expected values computed here must equal the daemon's bit for bit, on either backend. */
#define _DEFAULT_SOURCE
#include "support/isolation_cases.h"

#include <check.h>
#include <gpujob.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/tensor.h"

/* ------------------------------------------------------------------ the environment */

void iso_env_init(iso_env_t *env, const char *extra_ini)
{
    snprintf(env->dir, sizeof env->dir, "/tmp/gj-iso-XXXXXX");
    ck_assert_msg(mkdtemp(env->dir) != NULL, "mkdtemp failed");
    snprintf(env->socket_url, sizeof env->socket_url, "unix:%s/gpujobd.sock", env->dir);
    /* mode = none: the socket's peer is the test's account, and every TCP client the user
     * "local", two users with no token between them. */
    int len = snprintf(env->config, sizeof env->config,
                       "[server]\nunix_socket = %s/gpujobd.sock\n[auth]\nmode = none\n%s", env->dir,
                       extra_ini);
    ck_assert(len > 0 && (size_t)len < sizeof env->config);
}

void iso_env_done(iso_env_t *env)
{
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.sock", env->dir);
    unlink(path);
    rmdir(env->dir);
}

/* ------------------------------------------------------------------ phase 1: the marker */

/* Marker tensors: 16 MiB of i32 or f32, and the pieces the jobs below take of it. */
#define ISO_MARK_ELEMS ((int64_t)4 << 20)

/* Describes the first numel(shape) elements of the marker block as a tensor of dt. */
static gpujob_tensor_t iso_marker(void *block, gpujob_dtype_t dt, int ndim, const int64_t *shape)
{
    gpujob_tensor_t t;
    ck_assert_int_eq(gpujob_tensor_init(&t, dt, ndim, shape, block), 0);
    ck_assert(t.nbytes <= (size_t)ISO_MARK_ELEMS * 4);
    return t;
}

/* A new spec of op with marker inputs names[j] of dtypes[j] and shapes[j]. */
static gpujob_spec_t *iso_marker_spec(void *block, const char *op, int n_in,
                                      const char *const *names, const gpujob_dtype_t *dtypes,
                                      const int *ndims, const int64_t (*shapes)[4])
{
    gpujob_spec_t *spec;
    ck_assert_int_eq(gpujob_spec_new(op, &spec), 0);
    for (int j = 0; j < n_in; j++) {
        gpujob_tensor_t t = iso_marker(block, dtypes[j], ndims[j], shapes[j]);
        ck_assert_int_eq(gpujob_spec_input(spec, names[j], &t), 0);
    }
    return spec;
}

/* An add of marker x of n elements (none: x is set by the caller) and a scalar 0: out is
 * marker too. */
static gpujob_spec_t *iso_marker_add(void *block, int64_t n)
{
    static const char *const names[] = {"x"};
    static const gpujob_dtype_t dtypes[] = {GPUJOB_I32};
    static const int ndims[] = {1};
    const int64_t shapes[1][4] = {{n}};
    gpujob_spec_t *spec = iso_marker_spec(block, "add", n ? 1 : 0, names, dtypes, ndims, shapes);
    int32_t zero = 0;
    gpujob_tensor_t y;
    ck_assert_int_eq(gpujob_tensor_init(&y, GPUJOB_I32, 1, (int64_t[]){1}, &zero), 0);
    ck_assert_int_eq(gpujob_spec_input(spec, "y", &y), 0);
    return spec;
}

/* The marker jobs besides the adds: a sort whose keys and values (all equal) come back as
 * marker, and gemm, conv2d and quantize of marker operands, which fill the device pool and the
 * ops' scratch with marker inputs and their repacked copies. */
static int iso_marker_specs(void *block, gpujob_spec_t **specs)
{
    int n = 0;
    static const char *const sort_in[] = {"keys", "values"};
    static const gpujob_dtype_t sort_dt[] = {GPUJOB_I32, GPUJOB_F32};
    static const int mat[] = {2, 2, 2, 2}, img[] = {4, 4};
    const int64_t sort_shape[2][4] = {{64, 4096}, {64, 4096}};
    specs[n++] = iso_marker_spec(block, "sort", 2, sort_in, sort_dt, mat, sort_shape);

    static const char *const gemm_in[] = {"a", "b", "c"};
    static const gpujob_dtype_t f32x3[] = {GPUJOB_F32, GPUJOB_F32, GPUJOB_F32};
    static const gpujob_dtype_t f16x2[] = {GPUJOB_F16, GPUJOB_F16};
    const int64_t sq512[3][4] = {{512, 512}, {512, 512}, {512, 512}};
    const int64_t sq1024[2][4] = {{1024, 1024}, {1024, 1024}};
    specs[n++] = iso_marker_spec(block, "gemm", 3, gemm_in, f32x3, mat, sq512);
    specs[n++] = iso_marker_spec(block, "gemm", 2, gemm_in, f16x2, mat, sq1024);

    static const char *const conv_in[] = {"x", "w"};
    const int64_t conv_shape[2][4] = {{2, 32, 64, 64}, {64, 32, 3, 3}};
    specs[n++] = iso_marker_spec(block, "conv2d", 2, conv_in, f32x3, img, conv_shape);
    ck_assert_int_eq(gpujob_spec_param_int(specs[n - 1], "padding", 1), 0);

    static const char *const quant_in[] = {"x"};
    const int64_t quant_shape[1][4] = {{2048, 2048}};
    specs[n++] = iso_marker_spec(block, "quantize", 1, quant_in, f32x3, mat, quant_shape);
    ck_assert_int_eq(gpujob_spec_param_int(specs[n - 1], "axis", 1), 0);
    return n;
}

/* Waits for each job, which must succeed, and frees it. */
static void iso_wait_all(gpujob_client_t *c, gpujob_job_t **jobs, int n)
{
    for (int i = 0; i < n; i++) {
        gpujob_job_t *done = NULL;
        ck_assert_msg(gpujob_wait(c, gpujob_job_id(jobs[i]), 300, &done) == 0, "wait: %s",
                      gpujob_errmsg(c));
        ck_assert_msg(gpujob_job_state(done) == GPUJOB_SUCCEEDED, "marker job %s (%s): %s",
                      gpujob_job_id(done), gpujob_job_op(done),
                      gpujob_job_error_message(done) ? gpujob_job_error_message(done) : "");
        gpujob_job_free(done);
        gpujob_job_free(jobs[i]);
    }
}

/* The marker output of job id: every byte of it must be the marker, or phase 1 proves
 * nothing. */
static void iso_expect_marker_output(gpujob_client_t *c, const char *id, size_t bytes)
{
    void *data = NULL;
    size_t len = 0;
    ck_assert_msg(gpujob_output_fetch(c, id, "out", GPUJOB_FORMAT_RAW, &data, &len) == 0,
                  "download: %s", gpujob_errmsg(c));
    ck_assert_uint_eq(len, bytes);
    for (size_t i = 0; i < len; i++)
        ck_assert_msg(((unsigned char *)data)[i] == ISO_MARKER_BYTE, "marker output byte %zu", i);
    free(data);
}

/* The user name the daemon gives the caller, from GET /v1/info. */
static char *iso_user_of(const char *info_json)
{
    json_t *info = json_loads(info_json, 0, NULL);
    const char *name = json_string_value(json_object_get(json_object_get(info, "user"), "name"));
    ck_assert_msg(name != NULL, "/v1/info names no user");
    char *copy = strdup(name);
    json_decref(info);
    return copy;
}

/* Phase 1 over the Unix socket; returns the user it ran as (malloc'd). */
static char *iso_fill_with_marker(const char *socket_url)
{
    char errbuf[256];
    gpujob_client_t *c = NULL;
    ck_assert_msg(gpujob_client_new(socket_url, &c, errbuf, sizeof errbuf) == 0, "%s", errbuf);
    /* The daemon opens its Unix socket just after the TCP listener the harness waited for. */
    gpujob_info_t *info = NULL;
    double until = e2e_now() + 30;
    while (gpujob_info(c, &info) < 0 && e2e_now() < until)
        usleep(20000);
    ck_assert_msg(info != NULL, "info: %s", gpujob_errmsg(c));
    char *user = iso_user_of(gpujob_info_json(info));
    gpujob_info_free(info);

    void *block = malloc((size_t)ISO_MARK_ELEMS * 4);
    memset(block, ISO_MARKER_BYTE, (size_t)ISO_MARK_ELEMS * 4);
    gpujob_tensor_t whole = iso_marker(block, GPUJOB_I32, 1, (int64_t[]){ISO_MARK_ELEMS});
    gpujob_buffer_t resident;
    ck_assert_msg(gpujob_buffer_put(c, &whole, true, &resident) == 0, "upload: %s",
                  gpujob_errmsg(c));

    /* Adds of many sizes in one request, so that they run batched; one over the resident
     * buffer; then the other marker ops. */
    enum { N_ADDS = 8, N_JOBS = 16 };
    static const int64_t sizes[N_ADDS] = {1, 5, 64, 1000, 4097, 65536, 300001, 1 << 20};
    gpujob_spec_t *specs[N_JOBS];
    for (int i = 0; i < N_ADDS; i++)
        specs[i] = iso_marker_add(block, sizes[i]);
    gpujob_job_t *jobs[N_JOBS];
    ck_assert_msg(gpujob_submit_many(c, (const gpujob_spec_t *const *)specs, N_ADDS, NULL, jobs) ==
                      0,
                  "submit: %s", gpujob_errmsg(c));
    gpujob_spec_t *big = iso_marker_add(block, 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(big, "x", resident.id), 0);
    int n_more = iso_marker_specs(block, specs + N_ADDS);
    ck_assert_int_eq(gpujob_submit(c, big, &jobs[N_ADDS]), 0);
    for (int i = 0; i < n_more; i++)
        ck_assert_msg(gpujob_submit(c, specs[N_ADDS + i], &jobs[N_ADDS + 1 + i]) == 0, "submit: %s",
                      gpujob_errmsg(c));
    char *last_add = strdup(gpujob_job_id(jobs[N_ADDS - 1]));
    iso_wait_all(c, jobs, N_ADDS + 1 + n_more);
    iso_expect_marker_output(c, last_add, (size_t)sizes[N_ADDS - 1] * 4);

    ck_assert_msg(gpujob_buffer_delete(c, resident.id) == 0, "delete: %s", gpujob_errmsg(c));
    for (int i = 0; i < N_ADDS + n_more; i++)
        gpujob_spec_free(specs[i]);
    gpujob_spec_free(big);
    free(last_add);
    free(block);
    gpujob_client_free(c);
    return user;
}

/* ------------------------------------------------------------------ phase 2: the cases */

typedef struct iso_out {
    const char *name;
    dtype_t dtype;
    int ndim;
    int64_t shape[TENSOR_MAX_DIMS];
    double *want; /* numel(shape) values, owned */
} iso_out_t;

/* One phase-2 job and what it must produce. */
typedef struct iso_case {
    char what[96];
    json_t *job;
    int n_out;
    iso_out_t out[2];
    char *id;
} iso_case_t;

typedef struct iso_cases {
    iso_case_t *v;
    int n, cap;
    uint32_t seed;
} iso_cases_t;

static int64_t iso_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

static dtype_t iso_dtype(const char *name)
{
    dtype_t dt = DTYPE_F32;
    ck_assert_msg(dtype_parse(name, &dt) == 0, "dtype %s", name);
    return dt;
}

static double *iso_alloc(int64_t n)
{
    double *v = calloc((size_t)(n ? n : 1), sizeof *v);
    ck_assert(v != NULL);
    return v;
}

/* n random integers in [lo, hi] (malloc'd). */
static double *iso_ints(iso_cases_t *cs, int64_t n, int lo, int hi)
{
    double *v = iso_alloc(n);
    for (int64_t i = 0; i < n; i++)
        v[i] = lo + (int)(e2e_rand(&cs->seed) % (uint32_t)(hi - lo + 1));
    return v;
}

static bool iso_is_marker(const unsigned char *elem, size_t size)
{
    for (size_t b = 0; b < size; b++)
        if (elem[b] != ISO_MARKER_BYTE) return false;
    return true;
}

/* {"dtype", "shape", "b64"} of the values v, numel(shape) of them. A new reference. */
static json_t *iso_tensor(const char *dtype, int ndim, const int64_t *shape, const double *v)
{
    dtype_t dt = iso_dtype(dtype);
    int64_t n = iso_numel(ndim, shape);
    size_t bytes = (size_t)n * dtype_size(dt);
    unsigned char *raw = malloc(bytes ? bytes : 1);
    for (int64_t i = 0; i < n; i++)
        tensor_store(dt, raw, i, v[i]);
    char *b64 = e2e_base64(raw, bytes);
    json_t *dims = json_array();
    for (int i = 0; i < ndim; i++)
        json_array_append_new(dims, json_integer(shape[i]));
    json_t *t = json_pack("{s:s, s:o, s:s}", "dtype", dtype, "shape", dims, "b64", b64);
    free(b64);
    free(raw);
    return t;
}

/* Appends a case for job (stolen), described by the printf-style what. */
static iso_case_t *iso_case_new(iso_cases_t *cs, json_t *job, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static iso_case_t *iso_case_new(iso_cases_t *cs, json_t *job, const char *fmt, ...)
{
    if (cs->n == cs->cap) {
        cs->cap = cs->cap ? 2 * cs->cap : 64;
        cs->v = realloc(cs->v, (size_t)cs->cap * sizeof *cs->v);
        ck_assert(cs->v != NULL);
    }
    iso_case_t *c = &cs->v[cs->n++];
    memset(c, 0, sizeof *c);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->what, sizeof c->what, fmt, ap);
    va_end(ap);
    c->job = job;
    return c;
}

/* Adds output name of dtype and shape to c, with the values it must hold (want, stolen). An
 * expected element made of marker bytes would make the marker check ambiguous: refused. */
static void iso_expect(iso_case_t *c, const char *name, const char *dtype, int ndim,
                       const int64_t *shape, double *want)
{
    ck_assert(c->n_out < 2);
    iso_out_t *o = &c->out[c->n_out++];
    o->name = name;
    o->dtype = iso_dtype(dtype);
    o->ndim = ndim;
    if (ndim > 0) memcpy(o->shape, shape, sizeof *shape * (size_t)ndim);
    o->want = want;
    unsigned char elem[8];
    for (int64_t i = 0; i < iso_numel(ndim, shape); i++) {
        tensor_store(o->dtype, elem, 0, want[i]);
        ck_assert_msg(!iso_is_marker(elem, dtype_size(o->dtype)),
                      "%s: the expected %s[%lld] is the marker; pick other inputs", c->what, name,
                      (long long)i);
    }
}

/* ---- elementwise and reductions */

/* op on x [n] and y [n] (or [1] with y_scalar); saxpy's a is 2. */
static void iso_ew_case(iso_cases_t *cs, const char *op, const char *dtype, int64_t n,
                        bool y_scalar)
{
    int64_t ny = y_scalar ? 1 : n;
    double *x = iso_ints(cs, n, -1000, 1000), *y = iso_ints(cs, ny, -1000, 1000);
    json_t *job = json_pack("{s:s, s:{s:o, s:o}}", "op", op, "inputs", "x",
                            iso_tensor(dtype, 1, &n, x), "y", iso_tensor(dtype, 1, &ny, y));
    bool saxpy = strcmp(op, "saxpy") == 0;
    if (saxpy) json_object_set_new(job, "params", json_pack("{s:f}", "a", 2.0));
    double *want = iso_alloc(n);
    for (int64_t i = 0; i < n; i++) {
        double yi = y[y_scalar ? 0 : i];
        want[i] = saxpy ? 2 * x[i] + yi : strcmp(op, "mul") == 0 ? x[i] * yi : x[i] + yi;
    }
    iso_case_t *c = iso_case_new(cs, job, "%s %s [%lld]%s", op, dtype, (long long)n,
                                 y_scalar ? " with a scalar y" : "");
    iso_expect(c, "out", dtype, 1, &n, want);
    free(x);
    free(y);
}

/* sum or dot over x (and y) of shape; out has shape [] in the accumulation dtype. */
static void iso_reduce_case(iso_cases_t *cs, const char *op, const char *dtype, int ndim,
                            const int64_t *shape)
{
    int64_t n = iso_numel(ndim, shape);
    bool dot = strcmp(op, "dot") == 0;
    double *x = iso_ints(cs, n, -10, 10), *y = iso_ints(cs, n, -10, 10);
    json_t *inputs = json_pack("{s:o}", "x", iso_tensor(dtype, ndim, shape, x));
    if (dot) json_object_set_new(inputs, "y", iso_tensor(dtype, ndim, shape, y));
    double *want = iso_alloc(1);
    for (int64_t i = 0; i < n; i++)
        want[0] += dot ? x[i] * y[i] : x[i];
    const char *out_dtype = strcmp(dtype, "i32") == 0   ? "i64"
                            : strcmp(dtype, "f64") == 0 ? "f64"
                                                        : "f32";
    iso_case_t *c = iso_case_new(cs, json_pack("{s:s, s:o}", "op", op, "inputs", inputs),
                                 "%s %s of %lld elements", op, dtype, (long long)n);
    iso_expect(c, "out", out_dtype, 0, NULL, want);
    free(x);
    free(y);
}

static void iso_elementwise_and_reduce_cases(iso_cases_t *cs)
{
    static const int64_t add_sizes[] = {0, 1, 3, 1000, 4097, 65541};
    static const int64_t mul_sizes[] = {0, 2, 777};
    static const int64_t saxpy_sizes[] = {0, 1, 7, 300};
    for (size_t i = 0; i < sizeof add_sizes / sizeof *add_sizes; i++)
        iso_ew_case(cs, "add", "f32", add_sizes[i], false);
    for (size_t i = 0; i < sizeof mul_sizes / sizeof *mul_sizes; i++)
        iso_ew_case(cs, "mul", "i32", mul_sizes[i], false);
    for (size_t i = 0; i < sizeof saxpy_sizes / sizeof *saxpy_sizes; i++)
        iso_ew_case(cs, "saxpy", "f32", saxpy_sizes[i], true);

    static const int64_t sum_sizes[] = {0, 1, 5, 5000};
    for (size_t i = 0; i < sizeof sum_sizes / sizeof *sum_sizes; i++)
        iso_reduce_case(cs, "sum", "f32", 1, &sum_sizes[i]);
    iso_reduce_case(cs, "sum", "f32", 2, (int64_t[]){0, 3});
    iso_reduce_case(cs, "sum", "i32", 1, (int64_t[]){0});
    iso_reduce_case(cs, "sum", "i32", 1, (int64_t[]){3});
    iso_reduce_case(cs, "sum", "f64", 1, (int64_t[]){0});
    iso_reduce_case(cs, "dot", "f32", 1, (int64_t[]){0});
    iso_reduce_case(cs, "dot", "f32", 1, (int64_t[]){10});
    iso_reduce_case(cs, "dot", "f32", 2, (int64_t[]){0, 7});
}

/* ---- sort */

/* Stable ascending sort of each row of keys; follow (values, or the indices when is_index)
 * moves with them. */
static void iso_sort_rows(double *keys, double *follow, bool is_index, int64_t rows, int64_t len)
{
    for (int64_t r = 0; r < rows; r++) {
        double *k = keys + r * len, *f = follow + r * len;
        for (int64_t j = 0; j < len; j++)
            if (is_index) f[j] = (double)j;
        for (int64_t j = 1; j < len; j++) /* insertion sort: stable */
            for (int64_t i = j; i > 0 && k[i - 1] > k[i]; i--) {
                double t = k[i];
                k[i] = k[i - 1], k[i - 1] = t;
                t = f[i];
                f[i] = f[i - 1], f[i - 1] = t;
            }
    }
}

/* sort of keys of key_dtype and shape, with values of values_dtype (or NULL), or argsort. */
static void iso_sort_case(iso_cases_t *cs, const char *key_dtype, const char *values_dtype,
                          bool argsort, bool descending, int ndim, const int64_t *shape)
{
    int64_t n = iso_numel(ndim, shape), len = ndim ? shape[ndim - 1] : 1;
    int64_t rows = len ? n / len : 0;
    double *keys = iso_ints(cs, n, -20, 20), *values = iso_ints(cs, n, -100, 100);
    json_t *inputs = json_pack("{s:o}", "keys", iso_tensor(key_dtype, ndim, shape, keys));
    if (values_dtype)
        json_object_set_new(inputs, "values", iso_tensor(values_dtype, ndim, shape, values));
    json_t *job = json_pack("{s:s, s:o, s:{s:b, s:b}}", "op", "sort", "inputs", inputs, "params",
                            "descending", descending, "argsort", argsort);
    /* Descending order is ascending order of the negated keys, ties kept in input order. */
    for (int64_t i = 0; descending && i < n; i++)
        keys[i] = -keys[i];
    iso_sort_rows(keys, values, !values_dtype, rows, len);
    for (int64_t i = 0; descending && i < n; i++)
        keys[i] = -keys[i];
    iso_case_t *c = iso_case_new(cs, job, "sort %s of %lld rows of %lld%s%s", key_dtype,
                                 (long long)rows, (long long)len,
                                 values_dtype ? " with values" : "", argsort ? " (argsort)" : "");
    iso_expect(c, "keys", key_dtype, ndim, shape, keys);
    if (values_dtype)
        iso_expect(c, "values", values_dtype, ndim, shape, values);
    else if (argsort)
        iso_expect(c, "indices", "i64", ndim, shape, values);
    else
        free(values);
}

static void iso_sort_cases(iso_cases_t *cs)
{
    iso_sort_case(cs, "i32", "f32", false, false, 2, (int64_t[]){3, 0});
    iso_sort_case(cs, "i32", "f32", false, false, 1, (int64_t[]){1});
    iso_sort_case(cs, "i32", "f32", false, false, 1, (int64_t[]){5});
    iso_sort_case(cs, "i32", "f32", false, false, 2, (int64_t[]){2, 7});
    iso_sort_case(cs, "i32", "f32", false, false, 1, (int64_t[]){1000});
    iso_sort_case(cs, "f32", NULL, true, true, 1, (int64_t[]){0});
    iso_sort_case(cs, "f32", NULL, true, true, 1, (int64_t[]){4});
    iso_sort_case(cs, "f32", NULL, true, true, 2, (int64_t[]){3, 3});
    iso_sort_case(cs, "f32", NULL, true, true, 2, (int64_t[]){1, 2049});
    iso_sort_case(cs, "i64", NULL, false, false, 2, (int64_t[]){0, 5});
    iso_sort_case(cs, "i64", NULL, false, false, 1, (int64_t[]){6});
    iso_sort_case(cs, "i64", NULL, false, false, 0, NULL);
    iso_sort_case(cs, "f64", "f64", false, true, 2, (int64_t[]){3, 5});
    iso_sort_case(cs, "f64", NULL, true, true, 2, (int64_t[]){2, 4097});
    iso_sort_case(cs, "f64", NULL, true, true, 1, (int64_t[]){0});
}

/* ---- quantize, dequantize */

/* x of shape with integers in [-4, 4], every non-empty channel's first element 4 (so its
 * scale is 4/127 and no q can be -91, the marker) except channel 1 when zero_channel_1, which
 * is all zeros (its scale is then 1). */
static double *iso_quant_x(iso_cases_t *cs, int64_t n, int64_t channels, int64_t inner,
                           bool zero_channel_1)
{
    double *x = iso_ints(cs, n, -4, 4);
    for (int64_t i = 0; i < n; i++) {
        int64_t c = (i / inner) % channels;
        if (zero_channel_1 && c == 1)
            x[i] = 0;
        else if (i / inner < channels && i % inner == 0)
            x[i] = 4;
    }
    return x;
}

/* quantize of x of dtype and shape along axis (-1: per tensor), with the given scale (NULL:
 * found from x). */
static void iso_quant_case(iso_cases_t *cs, const char *dtype, int axis, int ndim,
                           const int64_t *shape, const double *scale, bool zero_channel_1)
{
    int64_t n = iso_numel(ndim, shape), channels = axis < 0 ? 1 : shape[axis];
    int64_t inner = axis < 0 ? n : iso_numel(ndim - axis - 1, shape + axis + 1);
    double *x = iso_quant_x(cs, n, channels, inner ? inner : 1, zero_channel_1);
    double *want_scale = iso_alloc(channels), *q = iso_alloc(n);
    float *max = calloc((size_t)(channels ? channels : 1), sizeof *max);
    for (int64_t i = 0; i < n; i++)
        max[(i / inner) % channels] = fmaxf(max[(i / inner) % channels], fabsf((float)x[i]));
    for (int64_t c = 0; c < channels; c++) {
        float s = scale ? (float)scale[c] : max[c] / 127.0f;
        want_scale[c] = s == 0.0f ? 1.0f : s;
    }
    for (int64_t i = 0; i < n; i++)
        q[i] =
            fminf(127, fmaxf(-127, rintf((float)x[i] / (float)want_scale[(i / inner) % channels])));
    json_t *inputs = json_pack("{s:o}", "x", iso_tensor(dtype, ndim, shape, x));
    int64_t scale_shape[1] = {channels};
    if (scale)
        json_object_set_new(inputs, "scale",
                            iso_tensor("f32", axis < 0 ? 0 : 1, scale_shape, scale));
    json_t *job = json_pack("{s:s, s:o, s:{s:o}}", "op", "quantize", "inputs", inputs, "params",
                            "axis", axis < 0 ? json_null() : json_integer(axis));
    iso_case_t *c = iso_case_new(cs, job, "quantize %s of %lld elements, %lld channels%s", dtype,
                                 (long long)n, (long long)channels, scale ? ", scale given" : "");
    iso_expect(c, "q", "i8", ndim, shape, q);
    iso_expect(c, "scale", "f32", axis < 0 ? 0 : 1, scale_shape, want_scale);
    free(max);
    free(x);
}

/* dequantize of q of shape along axis (-1: per tensor) with scale. */
static void iso_dequant_case(iso_cases_t *cs, int axis, int ndim, const int64_t *shape,
                             const double *scale)
{
    int64_t n = iso_numel(ndim, shape), channels = axis < 0 ? 1 : shape[axis];
    int64_t inner = axis < 0 ? n : iso_numel(ndim - axis - 1, shape + axis + 1);
    double *q = iso_ints(cs, n, -100, 100), *want = iso_alloc(n);
    for (int64_t i = 0; i < n; i++)
        want[i] = q[i] * scale[(i / inner) % channels];
    int64_t scale_shape[1] = {channels};
    json_t *job = json_pack("{s:s, s:{s:o, s:o}, s:{s:o}}", "op", "dequantize", "inputs", "q",
                            iso_tensor("i8", ndim, shape, q), "scale",
                            iso_tensor("f32", axis < 0 ? 0 : 1, scale_shape, scale), "params",
                            "axis", axis < 0 ? json_null() : json_integer(axis));
    iso_case_t *c = iso_case_new(cs, job, "dequantize of %lld elements, %lld channels",
                                 (long long)n, (long long)channels);
    iso_expect(c, "out", "f32", ndim, shape, want);
    free(q);
}

static void iso_quant_cases(iso_cases_t *cs)
{
    static const double scale4[] = {0.5, 1, 2, 4}, scale3[] = {0.5, 2, 0.25}, half[] = {0.5};
    iso_quant_case(cs, "f32", 1, 2, (int64_t[]){0, 6}, NULL, false);
    iso_quant_case(cs, "f32", 0, 3, (int64_t[]){2, 0, 3}, NULL, false);
    iso_quant_case(cs, "f32", 0, 2, (int64_t[]){3, 4}, NULL, true);
    iso_quant_case(cs, "f32", 1, 2, (int64_t[]){5, 300}, NULL, false);
    iso_quant_case(cs, "f16", -1, 1, (int64_t[]){0}, NULL, false);
    iso_quant_case(cs, "f16", -1, 1, (int64_t[]){7}, NULL, false);
    iso_quant_case(cs, "f32", 1, 2, (int64_t[]){0, 4}, scale4, false);
    iso_quant_case(cs, "f32", 1, 2, (int64_t[]){2, 4}, scale4, false);
    iso_dequant_case(cs, 1, 2, (int64_t[]){0, 4}, scale4);
    iso_dequant_case(cs, 1, 2, (int64_t[]){2, 3}, scale3);
    iso_dequant_case(cs, -1, 1, (int64_t[]){0}, half);
    iso_dequant_case(cs, -1, 1, (int64_t[]){5}, half);
}

/* ---- gemm */

typedef struct iso_gemm {
    const char *dtype;
    int nda, ndb;
    int64_t a[3], b[3];
    bool trans_a, trans_b, with_c;
    double alpha, beta;
} iso_gemm_t;

/* out[z] = alpha * op(a[z]) op(b[z]) + beta * c[z], in double: exact for these integers. */
static double *iso_gemm_want(const iso_gemm_t *g, const double *a, const double *b, const double *c,
                             int64_t batch, int64_t m, int64_t n, int64_t k)
{
    double *out = iso_alloc(batch * m * n);
    for (int64_t z = 0; z < batch; z++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                const double *az = a + (g->nda > 2 ? z * m * k : 0);
                const double *bz = b + (g->ndb > 2 ? z * k * n : 0);
                double acc = 0;
                for (int64_t q = 0; q < k; q++)
                    acc += az[g->trans_a ? q * m + i : i * k + q] *
                           bz[g->trans_b ? j * k + q : q * n + j];
                int64_t at = (z * m + i) * n + j;
                out[at] = g->alpha * acc + (g->with_c ? g->beta * c[at] : 0);
            }
    return out;
}

static void iso_gemm_case(iso_cases_t *cs, const iso_gemm_t *g)
{
    const int64_t *a_mk = g->a + g->nda - 2, *b_kn = g->b + g->ndb - 2;
    int64_t m = a_mk[g->trans_a], k = a_mk[!g->trans_a], n = b_kn[!g->trans_b];
    int64_t out_shape[3], batch = 1;
    int n_lead = g->nda > 2 || g->ndb > 2 ? 1 : 0;
    if (n_lead) out_shape[0] = batch = g->nda > 2 ? g->a[0] : g->b[0];
    out_shape[n_lead] = m;
    out_shape[n_lead + 1] = n;
    const char *out_dtype = strcmp(g->dtype, "i8") == 0 ? "i32" : g->dtype;
    double *a = iso_ints(cs, iso_numel(g->nda, g->a), -3, 3);
    double *b = iso_ints(cs, iso_numel(g->ndb, g->b), -3, 3);
    double *c = iso_ints(cs, batch * m * n, -50, 50);
    json_t *inputs = json_pack("{s:o, s:o}", "a", iso_tensor(g->dtype, g->nda, g->a, a), "b",
                               iso_tensor(g->dtype, g->ndb, g->b, b));
    if (g->with_c)
        json_object_set_new(inputs, "c", iso_tensor(out_dtype, n_lead + 2, out_shape, c));
    json_t *job =
        json_pack("{s:s, s:o, s:{s:b, s:b, s:f, s:f}}", "op", "gemm", "inputs", inputs, "params",
                  "trans_a", g->trans_a, "trans_b", g->trans_b, "alpha", g->alpha, "beta", g->beta);
    iso_case_t *cc =
        iso_case_new(cs, job, "gemm %s %lldx%lldx%lld x%lld%s", g->dtype, (long long)m,
                     (long long)n, (long long)k, (long long)batch, g->with_c ? " with c" : "");
    iso_expect(cc, "out", out_dtype, n_lead + 2, out_shape,
               iso_gemm_want(g, a, b, c, batch, m, n, k));
    free(a);
    free(b);
    free(c);
}

static void iso_gemm_cases(iso_cases_t *cs)
{
    static const iso_gemm_t cases[] = {
        /* k = 0: out is beta * c, or zeros; twice, so that the pair runs batched. */
        {"f32", 2, 2, {4, 0}, {0, 5}, false, false, false, 3, 0},
        {"f32", 2, 2, {4, 0}, {0, 5}, false, false, false, 3, 0},
        {"f32", 2, 2, {4, 0}, {0, 5}, false, false, true, 3, 2},
        {"i8", 2, 2, {4, 0}, {0, 5}, false, false, false, 1, 0},
        {"i8", 2, 2, {4, 0}, {0, 5}, false, false, true, 1, -3},
        {"f16", 3, 2, {3, 4, 0}, {0, 5}, false, false, false, 1, 0},
        {"bf16", 2, 2, {0, 4}, {0, 6}, true, false, false, 1, 0},
        /* Zero-size m, n and batch: empty outputs. */
        {"f32", 2, 2, {0, 3}, {3, 5}, false, false, false, 1, 0},
        {"f32", 2, 2, {2, 3}, {3, 0}, false, false, false, 1, 0},
        {"f32", 3, 3, {0, 2, 3}, {0, 3, 4}, false, false, false, 1, 0},
        /* Partial tiles, batched pairs, and i8 off the tensor-core alignment. */
        {"f32", 2, 2, {17, 33}, {33, 19}, false, false, true, 1, 1},
        {"f32", 2, 2, {17, 33}, {33, 19}, false, false, true, 1, 1},
        {"i8", 2, 2, {5, 6}, {6, 7}, false, false, false, 1, 0},
        {"f16", 2, 2, {9, 10}, {11, 10}, false, true, false, 1, 0},
        /* f64: k = 0 with c, and a batched pair with c (c copied into out as 8-byte words). */
        {"f64", 2, 2, {4, 0}, {0, 5}, false, false, true, 3, 2},
        {"f64", 2, 2, {17, 33}, {33, 19}, false, false, true, 1, 1},
        {"f64", 2, 2, {17, 33}, {33, 19}, false, false, true, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        iso_gemm_case(cs, &cases[i]);
}

/* ---- conv2d */

typedef struct iso_conv {
    const char *dtype;
    int64_t x[4], w[4];
    int pad, stride, dil, groups;
    bool bias_relu;
} iso_conv_t;

/* The direct convolution in double (exact for these integers), then bias and relu. */
static double *iso_conv_want(const iso_conv_t *v, const double *x, const double *w,
                             const double *bias, const int64_t *o)
{
    const int64_t c_in = v->x[1], h = v->x[2], wd = v->x[3], cg = v->w[1], r = v->w[2], s = v->w[3],
                  kg = v->w[0] / v->groups;
    double *out = iso_alloc(iso_numel(4, o));
    for (int64_t i = 0; i < iso_numel(4, o); i++) {
        int64_t q = i % o[3], p = i / o[3] % o[2], k = i / o[3] / o[2] % o[1];
        int64_t n = i / o[3] / o[2] / o[1];
        double acc = 0;
        for (int64_t c = 0; c < cg; c++)
            for (int64_t ri = 0; ri < r; ri++)
                for (int64_t si = 0; si < s; si++) {
                    int64_t ih = p * v->stride - v->pad + ri * v->dil;
                    int64_t iw = q * v->stride - v->pad + si * v->dil;
                    if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                    acc += x[((n * c_in + k / kg * cg + c) * h + ih) * wd + iw] *
                           w[((k * cg + c) * r + ri) * s + si];
                }
        if (v->bias_relu) acc = fmax(acc + bias[k], 0);
        out[i] = acc;
    }
    return out;
}

static void iso_conv_case(iso_cases_t *cs, const iso_conv_t *v)
{
    int64_t o[4] = {v->x[0], v->w[0], 0, 0};
    for (int d = 0; d < 2; d++)
        o[2 + d] = (v->x[2 + d] + 2 * v->pad - v->dil * (v->w[2 + d] - 1) - 1) / v->stride + 1;
    double *x = iso_ints(cs, iso_numel(4, v->x), -2, 2),
           *w = iso_ints(cs, iso_numel(4, v->w), -1, 1);
    double *bias = iso_ints(cs, v->w[0], -3, 3);
    json_t *inputs = json_pack("{s:o, s:o}", "x", iso_tensor(v->dtype, 4, v->x, x), "w",
                               iso_tensor(v->dtype, 4, v->w, w));
    json_t *params = json_pack("{s:i, s:i, s:i, s:i}", "padding", v->pad, "stride", v->stride,
                               "dilation", v->dil, "groups", v->groups);
    if (v->bias_relu) {
        json_object_set_new(inputs, "bias", iso_tensor("f32", 1, v->w, bias));
        json_object_set_new(params, "epilogue", json_pack("[s, s]", "bias", "relu"));
    }
    json_t *job = json_pack("{s:s, s:o, s:o}", "op", "conv2d", "inputs", inputs, "params", params);
    iso_case_t *c =
        iso_case_new(cs, job, "conv2d %s x [%lld, %lld, %lld, %lld] padding %d%s", v->dtype,
                     (long long)v->x[0], (long long)v->x[1], (long long)v->x[2], (long long)v->x[3],
                     v->pad, v->bias_relu ? " bias relu" : "");
    iso_expect(c, "out", v->dtype, 4, o, iso_conv_want(v, x, w, bias, o));
    free(x);
    free(w);
    free(bias);
}

static void iso_conv_cases(iso_cases_t *cs)
{
    static const iso_conv_t cases[] = {
        /* Padding larger than the input: most outputs see no input at all. */
        {"f32", {1, 1, 1, 1}, {2, 1, 1, 1}, 3, 1, 1, 1, true},
        {"f32", {1, 8, 2, 3}, {16, 8, 1, 1}, 4, 3, 1, 1, false},
        {"f32", {1, 8, 3, 3}, {16, 8, 3, 3}, 6, 1, 1, 1, true},
        {"f32", {1, 4, 3, 3}, {4, 1, 3, 3}, 5, 1, 1, 4, true},
        /* Three of one shape on the implicit GEMM's path, batched. */
        {"f16", {2, 16, 5, 5}, {32, 16, 3, 3}, 4, 1, 2, 1, false},
        {"f16", {2, 16, 5, 5}, {32, 16, 3, 3}, 4, 1, 2, 1, false},
        {"f16", {2, 16, 5, 5}, {32, 16, 3, 3}, 4, 1, 2, 1, false},
        /* No input channels (out is the epilogue of 0) and no images. */
        {"f32", {1, 0, 3, 3}, {2, 0, 1, 1}, 0, 1, 1, 1, true},
        {"f32", {0, 1, 4, 4}, {2, 1, 3, 3}, 0, 1, 1, 1, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        iso_conv_case(cs, &cases[i]);
}

/* ------------------------------------------------------------------ phase 2: the checks */

/* Every op the daemon lists (but its test-only debug_ ops) must have a case. */
static void iso_check_every_op_has_a_case(const json_t *info, const iso_cases_t *cs)
{
    size_t i;
    const json_t *op;
    json_array_foreach(json_object_get(info, "ops"), i, op)
    {
        const char *name = json_string_value(json_object_get(op, "name"));
        ck_assert(name != NULL);
        if (strncmp(name, "debug_", 6) == 0) continue;
        bool found = false;
        for (int k = 0; k < cs->n && !found; k++)
            found = strcmp(json_string_value(json_object_get(cs->v[k].job, "op")), name) == 0;
        ck_assert_msg(found, "op %s has no isolation case", name);
    }
}

/* Submits every case in one request, so that compatible jobs run batched. */
static void iso_submit(e2e_daemon_t *d, iso_cases_t *cs)
{
    json_t *jobs = json_array();
    for (int k = 0; k < cs->n; k++)
        json_array_append(jobs, cs->v[k].job);
    char *body = json_dumps(jobs, JSON_COMPACT);
    json_t *resp = e2e_json_ok(d, "POST", "/v1/jobs", body, 201);
    ck_assert_int_eq(json_array_size(resp), cs->n);
    for (int k = 0; k < cs->n; k++)
        cs->v[k].id = strdup(json_string_value(json_object_get(json_array_get(resp, k), "id")));
    json_decref(resp);
    free(body);
    json_decref(jobs);
}

/* One output of a finished job: its dtype and shape as expected, then its raw bytes: no
 * element made of marker bytes, and every value the expected one. */
static void iso_check_output(e2e_daemon_t *d, const iso_case_t *c, const json_t *job,
                             const iso_out_t *o)
{
    const json_t *t = json_object_get(json_object_get(job, "outputs"), o->name);
    ck_assert_msg(t != NULL, "%s: no output %s", c->what, o->name);
    ck_assert_msg(strcmp(json_string_value(json_object_get(t, "dtype")), dtype_name(o->dtype)) == 0,
                  "%s: %s is %s", c->what, o->name, json_string_value(json_object_get(t, "dtype")));
    const json_t *shape = json_object_get(t, "shape");
    ck_assert_msg(json_array_size(shape) == (size_t)o->ndim, "%s: %s has %zu dims", c->what,
                  o->name, json_array_size(shape));
    for (int i = 0; i < o->ndim; i++)
        ck_assert_msg(json_integer_value(json_array_get(shape, i)) == o->shape[i],
                      "%s: %s dim %d is %lld", c->what, o->name, i,
                      (long long)json_integer_value(json_array_get(shape, i)));
    int64_t n = iso_numel(o->ndim, o->shape);
    size_t es = dtype_size(o->dtype);
    unsigned char *raw = malloc((size_t)n * es + 1);
    e2e_output_raw_ok(d, c->id, o->name, raw, (size_t)n * es);
    int64_t marked = 0, wrong = 0, first_marked = -1, first_wrong = -1;
    for (int64_t i = 0; i < n; i++) {
        if (iso_is_marker(raw + i * es, es) && marked++ == 0) first_marked = i;
        if (tensor_load(o->dtype, raw, i) != o->want[i] && wrong++ == 0) first_wrong = i;
    }
    ck_assert_msg(marked == 0,
                  "%s: %lld of %lld elements of %s carry the marker, bytes the op never wrote "
                  "(the first at %lld)",
                  c->what, (long long)marked, (long long)n, o->name, (long long)first_marked);
    ck_assert_msg(wrong == 0, "%s: %lld of %lld elements of %s differ; [%lld] is %g, expected %g",
                  c->what, (long long)wrong, (long long)n, o->name, (long long)first_wrong,
                  first_wrong < 0 ? 0 : tensor_load(o->dtype, raw, first_wrong),
                  first_wrong < 0 ? 0 : o->want[first_wrong]);
    free(raw);
}

/* Waits for the case's job, which must succeed, checks its outputs and returns its batch
 * size. */
static int iso_check_case(e2e_daemon_t *d, const iso_case_t *c)
{
    json_t *job = e2e_wait_final_ok(d, c->id, 300);
    const json_t *error = json_object_get(job, "error");
    ck_assert_msg(strcmp(e2e_job_state(job), "succeeded") == 0, "%s: %s (%s)", c->what,
                  e2e_job_state(job), json_string_value(json_object_get(error, "message")));
    ck_assert_int_eq(json_object_size(json_object_get(job, "outputs")), c->n_out);
    for (int k = 0; k < c->n_out; k++)
        iso_check_output(d, c, job, &c->out[k]);
    int batch = (int)json_integer_value(json_object_get(job, "batch_size"));
    json_decref(job);
    return batch;
}

static void iso_cases_free(iso_cases_t *cs)
{
    for (int k = 0; k < cs->n; k++) {
        json_decref(cs->v[k].job);
        free(cs->v[k].id);
        for (int j = 0; j < cs->v[k].n_out; j++)
            free(cs->v[k].out[j].want);
    }
    free(cs->v);
}

void iso_check_daemon(e2e_daemon_t *d, const iso_env_t *env)
{
    char *marker_user = iso_fill_with_marker(env->socket_url);
    json_t *info = e2e_json_ok(d, "GET", "/v1/info", NULL, 200);
    const char *user = json_string_value(json_object_get(json_object_get(info, "user"), "name"));
    ck_assert_msg(user && strcmp(user, marker_user) != 0, "phase 2 runs as %s too", marker_user);

    iso_cases_t cs = {.seed = 2323};
    iso_elementwise_and_reduce_cases(&cs);
    iso_sort_cases(&cs);
    iso_quant_cases(&cs);
    iso_gemm_cases(&cs);
    iso_conv_cases(&cs);
    iso_check_every_op_has_a_case(info, &cs);
    iso_submit(d, &cs);
    int batched = 0;
    for (int k = 0; k < cs.n; k++)
        batched += iso_check_case(d, &cs.v[k]) > 1;
    printf("%d jobs of %s after the marker jobs of %s; %d of them ran batched\n", cs.n, user,
           marker_user, batched);
    ck_assert_msg(batched > 0, "no job ran batched");

    iso_cases_free(&cs);
    json_decref(info);
    free(marker_user);
}
