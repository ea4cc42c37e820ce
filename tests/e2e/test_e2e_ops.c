/* End-to-end: the real gpujobd on the CPU backend, driven over HTTP: the ops' results, each
 * checked against a computation done here, in the test, from the same random inputs (f64 gemm
 * and sort too, f64 values exact through the JSON both ways), and the numbers of the answers
 * printed shortest for their dtype. */
#include <check.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/daemon_harness.h"
#include "support/e2e_jobs.h"
#include "support/run_suite.h"

/* Runs op on random x (and y) of dtype and checks every output element. */
static void check_elementwise(e2e_daemon_t *d, const char *op, const char *dtype, uint32_t seed)
{
    enum { N = 1000 };
    static const int64_t shape[] = {8, 125};
    double x[N], y[N], got[N];
    bool is_float = e2e_jobs_is_float_dtype(dtype);
    e2e_jobs_random_values(dtype, x, N, is_float ? -10 : -1000, is_float ? 10 : 1000, &seed);
    e2e_jobs_random_values(dtype, y, N, is_float ? -10 : -1000, is_float ? 10 : 1000, &seed);
    double a = is_float ? 2.5 : 3;
    json_t *job = json_pack("{s:s, s:{s:o, s:o}}", "op", op, "inputs", "x",
                            e2e_jobs_tensor_inline(dtype, shape, 2, x, N), "y",
                            e2e_jobs_tensor_inline(dtype, shape, 2, y, N));
    if (strcmp(op, "saxpy") == 0)
        json_object_set_new(job, "params",
                            json_pack("{s:o}", "a", is_float ? json_real(a) : json_integer(3)));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    e2e_jobs_output(done, "out", dtype, N, got);
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
    bool is_float = e2e_jobs_is_float_dtype(dtype);
    e2e_jobs_random_values(dtype, x, N, is_float ? -10 : -1000, is_float ? 10 : 1000, &seed);
    e2e_jobs_random_values(dtype, y, N, is_float ? -10 : -1000, is_float ? 10 : 1000, &seed);
    bool is_dot = strcmp(op, "dot") == 0;
    json_t *inputs = json_pack("{s:o}", "x", e2e_jobs_tensor_inline(dtype, shape, 1, x, N));
    if (is_dot) json_object_set_new(inputs, "y", e2e_jobs_tensor_inline(dtype, shape, 1, y, N));
    json_t *job = json_pack("{s:s, s:o}", "op", op, "inputs", inputs);
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    e2e_jobs_output(done, "out", is_float ? "f32" : "i64", 1, &got);
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
    if (!e2e_jobs_info_has_op(d, "sort")) {
        fprintf(stderr, "sort is not in /v1/info: skipped\n");
        e2e_daemon_free(d);
        return;
    }
    enum { N = 500 };
    static const int64_t shape[] = {N};
    uint32_t seed = 7;
    double keys[N], got[N], want[N];
    e2e_jobs_random_values("i32", keys, N, -50, 50, &seed); /* many ties */
    json_t *job = json_pack("{s:s, s:{s:o}}", "op", "sort", "inputs", "keys",
                            e2e_jobs_tensor_inline("i32", shape, 1, keys, N));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    e2e_jobs_output(done, "keys", "i32", N, got);
    memcpy(want, keys, sizeof want);
    qsort(want, N, sizeof want[0], cmp_int_asc);
    for (int i = 0; i < N; i++)
        ck_assert_msg(got[i] == want[i], "sort [%d]: got %g, expected %g", i, got[i], want[i]);
    free(id);
    json_decref(job);
    json_decref(done);

    /* Descending argsort of f32 keys: indices are the stable permutation. */
    double fkeys[N], idx[N];
    e2e_jobs_random_values("f32", fkeys, N, -4, 4, &seed);
    for (int i = 0; i < N; i += 7)
        fkeys[i] = 1.0; /* ties, which must keep their input order */
    job = json_pack("{s:s, s:{s:b, s:b}, s:{s:o}}", "op", "sort", "params", "descending", 1,
                    "argsort", 1, "inputs", "keys",
                    e2e_jobs_tensor_inline("f32", shape, 1, fkeys, N));
    id = e2e_submit_ok(d, job);
    done = e2e_wait_final_ok(d, id, 30);
    e2e_jobs_output(done, "indices", "i64", N, idx);
    e2e_jobs_output(done, "keys", "f32", N, got);
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
    if (!e2e_jobs_info_has_op(d, "gemm")) {
        fprintf(stderr, "gemm is not in /v1/info: skipped\n");
        e2e_daemon_free(d);
        return;
    }
    enum { M = 16, K = 24, N = 8 };
    static const int64_t sa[] = {M, K}, sb[] = {K, N};
    uint32_t seed = 99;
    double a[M * K], b[K * N], got[M * N];
    e2e_jobs_random_values("f32", a, M * K, -1, 1, &seed);
    e2e_jobs_random_values("f32", b, K * N, -1, 1, &seed);
    json_t *job = json_pack("{s:s, s:{s:o, s:o}}", "op", "gemm", "inputs", "a",
                            e2e_jobs_tensor_inline("f32", sa, 2, a, M * K), "b",
                            e2e_jobs_tensor_inline("f32", sb, 2, b, K * N));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    e2e_jobs_output(done, "out", "f32", M * N, got);
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

/* A random f64 with a full 53-bit significand: [-1, 1) times 2^e, e in [-spread, spread]. */
static double rand_f64(uint32_t *seed, int spread)
{
    uint64_t bits = (uint64_t)e2e_rand(seed) << 21 ^ e2e_rand(seed) >> 11;
    int e = (int)(e2e_rand(seed) % (uint32_t)(2 * spread + 1)) - spread;
    return ldexp((double)bits * 0x1p-52 - 1, e);
}

/* An f64 element as JSON: a number, or "nan", "inf", "-inf" (the daemon's spellings). */
static json_t *f64_json(double v)
{
    if (isnan(v)) return json_string("nan");
    if (isinf(v)) return json_string(v > 0 ? "inf" : "-inf");
    return json_real(v);
}

static json_t *f64_tensor(const int64_t *shape, int ndim, const double *v, long n)
{
    json_t *dims = json_array(), *data = json_array();
    for (int i = 0; i < ndim; i++)
        json_array_append_new(dims, json_integer(shape[i]));
    for (long i = 0; i < n; i++)
        json_array_append_new(data, f64_json(v[i]));
    return json_pack("{s:s, s:o, s:o}", "dtype", "f64", "shape", dims, "data", data);
}

/* Output `name` of a succeeded job: asserts its dtype and n elements, flattened into out with
 * the non-finite strings read back. */
static void f64_output(const json_t *job, const char *name, const char *dtype, long n, double *out)
{
    const json_t *t = json_object_get(json_object_get(job, "outputs"), name);
    ck_assert_msg(strcmp(e2e_job_state(job), "succeeded") == 0 && t, "job %s: %s, no output %s",
                  json_string_value(json_object_get(job, "id")), e2e_job_state(job), name);
    ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), dtype);
    const json_t *data = json_object_get(t, "data");
    long got = 0;
    /* Rows come nested like the shape: walk one level of nesting at most. */
    size_t i, j;
    const json_t *e, *f;
    json_array_foreach(data, i, e)
    {
        const json_t *row = json_is_array(e) ? e : NULL;
        size_t len = row ? json_array_size(row) : 1;
        for (j = 0; j < len; j++) {
            f = row ? json_array_get(row, j) : e;
            double v = json_number_value(f);
            if (json_is_string(f)) {
                const char *str = json_string_value(f);
                v = strcmp(str, "nan") == 0 ? NAN : strcmp(str, "inf") == 0 ? INFINITY : -INFINITY;
            }
            ck_assert_msg(json_is_number(f) || json_is_string(f), "%s[%ld] is not a number", name,
                          got);
            if (got < n) out[got] = v;
            got++;
        }
    }
    ck_assert_msg(got == n, "output %s has %ld values, expected %ld", name, got, n);
}

/* x * y added to the pair (hi, lo) exactly: TwoProduct (an FMA) and TwoSum. */
static void dot2_step(double x, double y, double *hi, double *lo)
{
    double p = x * y, ep = fma(x, y, -p);
    double s = *hi + p, z = s - *hi;
    *lo += (*hi - (s - z)) + (p - z) + ep;
    *hi = s;
}

/* An f64 gemm (b transposed, alpha, beta with c) through the API on the CPU backend: every
 * element within gemm.h's bound for the long double reference, u |exact| + gamma_ld(k + 3)
 * times |alpha| sum |a b| + |beta c|, of the exact value computed here. */
START_TEST(test_f64_gemm_through_the_api_within_its_bound)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { M = 5, N = 4, K = 300 };
    static const int64_t sa[] = {M, K}, sb[] = {N, K}, sc[] = {M, N};
    uint32_t seed = 6464;
    static double a[M * K], b[N * K], c[M * N], got[M * N];
    for (int i = 0; i < M * K; i++)
        a[i] = rand_f64(&seed, 20);
    for (int i = 0; i < N * K; i++)
        b[i] = rand_f64(&seed, 20);
    for (int i = 0; i < M * N; i++)
        c[i] = rand_f64(&seed, 20);
    /* A power of two for alpha keeps alpha * a exact in the sum below. */
    const double alpha = -0.5, beta = 1.5;
    json_t *job =
        json_pack("{s:s, s:{s:b, s:f, s:f}, s:{s:o, s:o, s:o}}", "op", "gemm", "params", "trans_b",
                  1, "alpha", alpha, "beta", beta, "inputs", "a", f64_tensor(sa, 2, a, M * K), "b",
                  f64_tensor(sb, 2, b, N * K), "c", f64_tensor(sc, 2, c, M * N));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    f64_output(done, "out", "f64", M * N, got);
    const double u = 0x1p-53, u_ld = LDBL_EPSILON / 2, g = (K + 3) * u_ld / (1 - (K + 3) * u_ld);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double hi = 0, lo = 0, mag = 0;
            for (int q = 0; q < K; q++) {
                dot2_step(alpha * a[i * K + q], b[j * K + q], &hi, &lo);
                mag += fabs(alpha * a[i * K + q] * b[j * K + q]);
            }
            dot2_step(beta, c[i * N + j], &hi, &lo);
            mag += fabs(beta * c[i * N + j]);
            double exact = hi + lo;
            double bound = 2 * u * fabs(exact) + g * mag * (1 + 1e-6) + 4 * K * K * u * u * mag;
            ck_assert_msg(fabs(got[i * N + j] - exact) <= bound,
                          "gemm f64 [%d,%d]: got %.17g, exact %.17g, bound %g", i, j,
                          got[i * N + j], exact, bound);
        }
    free(id);
    json_decref(job);
    json_decref(done);
    e2e_daemon_free(d);
}
END_TEST

/* The promised order of f64 keys (sort.h): -inf < ... < -0.0 < +0.0 < ... < +inf, NaNs last;
 * -1, 0, 1. */
static int f64_order(double a, double b)
{
    if (isnan(a) || isnan(b)) return (isnan(a) != 0) - (isnan(b) != 0);
    if (a == b) return (signbit(b) != 0) - (signbit(a) != 0);
    return a < b ? -1 : 1;
}

static int f64_order_qsort(const void *a, const void *b)
{
    return f64_order(*(const double *)a, *(const double *)b);
}

static uint64_t f64_bits(double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    return u;
}

/* f64 keys through the API: NaNs (sent as "nan"), infinities, signed zeros, subnormals, ties and
 * neighbours an ulp apart. Ascending keys-only equals the keys sorted here; a descending argsort
 * of rows is, row by row, the stable permutation. */
START_TEST(test_f64_sort_through_the_api_orders_special_values)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { R = 4, L = 50, N = R * L };
    static const int64_t shape[] = {R, L}, flat[] = {N};
    const double special[9] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, 5e-324, -5e-324, DBL_MAX, 1};
    uint32_t seed = 646464;
    double keys[N], got[N], want[N], idx[N];
    for (int i = 0; i < N; i++) {
        uint32_t r = e2e_rand(&seed) % 4;
        keys[i] = r == 0   ? special[e2e_rand(&seed) % 9]
                  : r == 1 ? (double)((int)(e2e_rand(&seed) % 8) - 4) / 4
                  : r == 2 ? nextafter(1.0, e2e_rand(&seed) & 1 ? 2.0 : 0.0)
                           : rand_f64(&seed, 300);
    }
    json_t *job =
        json_pack("{s:s, s:{s:o}}", "op", "sort", "inputs", "keys", f64_tensor(flat, 1, keys, N));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    f64_output(done, "keys", "f64", N, got);
    memcpy(want, keys, sizeof want);
    qsort(want, N, sizeof want[0], f64_order_qsort);
    for (int i = 0; i < N; i++)
        ck_assert_msg(isnan(want[i]) ? isnan(got[i]) : f64_bits(got[i]) == f64_bits(want[i]),
                      "sort f64 [%d]: got %.17g, expected %.17g", i, got[i], want[i]);
    free(id);
    json_decref(job);
    json_decref(done);

    job = json_pack("{s:s, s:{s:b, s:b}, s:{s:o}}", "op", "sort", "params", "descending", 1,
                    "argsort", 1, "inputs", "keys", f64_tensor(shape, 2, keys, N));
    id = e2e_submit_ok(d, job);
    done = e2e_wait_final_ok(d, id, 30);
    f64_output(done, "indices", "i64", N, idx);
    f64_output(done, "keys", "f64", N, got);
    for (int r = 0; r < R; r++) {
        bool seen[L] = {false};
        for (int j = 0; j < L; j++) {
            int at = r * L + j, src = (int)idx[at];
            ck_assert_msg(src >= 0 && src < L && !seen[src], "row %d: indices not a permutation",
                          r);
            seen[src] = true;
            double in = keys[r * L + src];
            ck_assert_msg(isnan(in) ? isnan(got[at]) : f64_bits(got[at]) == f64_bits(in),
                          "keys[%d] is not keys_in[indices[%d]]", at, at);
            if (j == 0) continue;
            double prev = keys[r * L + (int)idx[at - 1]];
            /* Descending, NaNs still last; equal keys in input order. */
            int c = isnan(prev) || isnan(in) ? f64_order(prev, in) : -f64_order(prev, in);
            ck_assert_msg(c <= 0, "row %d: %.17g before %.17g", r, prev, in);
            if (c == 0) ck_assert_msg(idx[at - 1] < idx[at], "row %d: tie at %d not stable", r, j);
        }
    }
    free(id);
    json_decref(job);
    json_decref(done);
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
    Suite *s = suite_create("e2e_ops");
    TCase *tc = tcase_create("jobs");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_ops_match_reference_computation);
    tcase_add_test(tc, test_answers_print_numbers_shortest_for_their_dtype);
    tcase_add_test(tc, test_sort_matches_reference_when_present);
    tcase_add_test(tc, test_gemm_matches_reference_when_present);
    tcase_add_test(tc, test_f64_gemm_through_the_api_within_its_bound);
    tcase_add_test(tc, test_f64_sort_through_the_api_orders_special_values);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
