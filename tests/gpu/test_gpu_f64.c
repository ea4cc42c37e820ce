/* f64 on CUDA against the CPU references, held to the bounds the kernels' headers state:
 * add, mul and saxpy bit for bit (elementwise.h); sum and dot within reduce.h's bound of the
 * exact sum, and the CPU reference within its own; gemm element by element within gemm.h's
 * bound of the long double reference; sort (keys, descending, argsort, values) bit for bit,
 * NaNs, signed zeros and subnormals included. Sizes 1, 7 and 1000003, batches of calls of mixed
 * shapes in one run_cuda (the form the scheduler launches; gemm batches only calls of one shape,
 * as its batch key says), and tensors of the largest size the default limits allow
 * (limits.max_tensor_bytes, 4 GiB: 2^29 elements).
 *
 * Inputs are fresh random f64 with full 53-bit significands and mixed exponents; the seed is
 * printed and GJ_TEST_SEED replays it. Device outputs are poisoned (0xff bytes, a NaN) before
 * every run. Exits 77 (skipped) without a GPU. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/gemm.h"
#include "kernels/op.h"
#include "kernels/sort.h"
#include "support/gpu_support.h"
#include "support/run_suite.h"

#define MAX_CALLS 8
/* The default limits.max_tensor_bytes, and the largest f64 tensor it allows. */
#define MAX_TENSOR_BYTES ((uint64_t)4 << 30)
#define LARGEST_F64 ((int64_t)(MAX_TENSOR_BYTES / 8))

static op_cuda_ctx_t *ctx;
static uint64_t rng; /* xorshift64 state, advanced by every draw */
static unsigned run_seed;

static const double U = 0x1p-53;

/* ------------------------------------------------------------------ random inputs */

static uint64_t rand64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Uniform in [-1, 1) with a full 53-bit significand, scaled by 2^e for e uniform in
 * [-spread, spread]. */
static double rand_f64(int spread)
{
    uint64_t r = rand64();
    double v = (double)(r >> 11) * 0x1p-52 - 1.0;
    int e = spread ? (int)(rand64() % (uint64_t)(2 * spread + 1)) - spread : 0;
    return ldexp(v, e);
}

static void fill_f64(double *x, int64_t n, int spread)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rand_f64(spread);
}

/* Sort keys: random values of mixed exponents, ties (a few values repeated), neighbours an ulp
 * apart, and the special values (NaNs of both signs and with payloads, zeros of both signs,
 * infinities, subnormals, the extremes). */
static void fill_sort_keys(double *x, int64_t n)
{
    static const uint64_t special[10] = {
        0x7ff8000000000000ull, 0xfff8000000000001ull, 0x7ff0000000000001ull, 0x8000000000000000ull,
        0x0000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull, 0x0000000000000001ull,
        0x800fffffffffffffull, 0x7fefffffffffffffull};
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = rand64();
        switch (r % 8) {
        case 0:
            memcpy(&x[i], &special[(r >> 8) % 10], 8);
            break;
        case 1:
        case 2:
            x[i] = (double)((int)((r >> 8) % 64) - 32) / 8; /* ties */
            break;
        case 3:
            x[i] = nextafter((double)((int)((r >> 8) % 64) - 32) / 8, (r >> 20) & 1 ? 1e9 : -1e9);
            break;
        default:
            x[i] = rand_f64(300);
            break;
        }
    }
}

static uint64_t bits_of(double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    return u;
}

/* ------------------------------------------------------------------ jobs */

/* One call: validated, its host inputs (filled by the caller before job_upload), device
 * inputs and poisoned outputs, and the GPU's outputs once run. */
typedef struct f64_job {
    op_call_t call;
    int n_in;
    void *host_in[3];
    void *dev_in[3], *dev_out[2];
    void *got[2];
} f64_job_t;

static void job_init(f64_job_t *job, const char *op_name, const char *params_json, int n_in,
                     const tensor_desc_t *in, const bool *present)
{
    memset(job, 0, sizeof *job);
    op_call_t *call = &job->call;
    call->op = op_find(op_name);
    ck_assert_ptr_nonnull(call->op);
    job->n_in = n_in;
    for (int j = 0; j < n_in; j++) {
        call->in[j] = in[j];
        call->has_in[j] = present ? present[j] : true;
    }
    json_error_t jerr;
    json_t *params = params_json ? json_loads(params_json, 0, &jerr) : NULL;
    ck_assert_msg(!params_json || params, "bad params in the test: %s", params_json);
    op_error_t err;
    int r = op_call_validate(params, MAX_TENSOR_BYTES, call, &err);
    json_decref(params);
    ck_assert_msg(r == 0, "%s: %s: %s", op_name, err.field, err.message);
    for (int j = 0; j < n_in; j++)
        if (call->has_in[j]) {
            size_t bytes = tensor_desc_bytes(&call->in[j]);
            job->host_in[j] = malloc(bytes ? bytes : 1);
            ck_assert_ptr_nonnull(job->host_in[j]);
        }
}

static void job_upload(f64_job_t *job)
{
    const op_call_t *call = &job->call;
    for (int j = 0; j < job->n_in; j++)
        if (call->has_in[j]) {
            size_t bytes = tensor_desc_bytes(&call->in[j]);
            job->dev_in[j] = gpu_alloc_poisoned(bytes);
            gpu_upload(job->dev_in[j], job->host_in[j], bytes);
        }
    for (int j = 0; j < call->n_out; j++) {
        size_t bytes = tensor_desc_bytes(&call->out[j]);
        job->dev_out[j] = gpu_alloc_poisoned(bytes);
        job->got[j] = malloc(bytes ? bytes : 1);
        ck_assert_ptr_nonnull(job->got[j]);
    }
}

/* Runs the n jobs (equal batch keys) as one run_cuda and downloads their outputs. */
static void jobs_run(f64_job_t *jobs, int n, const char *what)
{
    ck_assert_int_le(n, MAX_CALLS);
    const op_call_t *calls[MAX_CALLS] = {0};
    const void *const *ins[MAX_CALLS] = {0};
    void *const *outs[MAX_CALLS] = {0};
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(jobs[i].call.batch_key, jobs[0].call.batch_key);
        calls[i] = &jobs[i].call;
        ins[i] = (const void *const *)jobs[i].dev_in;
        outs[i] = jobs[i].dev_out;
    }
    op_error_t err;
    int r = calls[0]->op->run_cuda(ctx, n, calls, ins, outs, &err);
    ck_assert_msg(r == 0, "%s: run_cuda: %s", what, err.message);
    gpu_sync(ctx);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < jobs[i].call.n_out; j++)
            gpu_download(jobs[i].got[j], jobs[i].dev_out[j],
                         tensor_desc_bytes(&jobs[i].call.out[j]));
}

/* The CPU reference's outputs of a job, in new memory (free each). */
static void job_cpu(const f64_job_t *job, void *ret_want[2])
{
    const op_call_t *call = &job->call;
    for (int j = 0; j < call->n_out; j++) {
        size_t bytes = tensor_desc_bytes(&call->out[j]);
        ret_want[j] = malloc(bytes ? bytes : 1);
        ck_assert_ptr_nonnull(ret_want[j]);
    }
    op_error_t err;
    ck_assert_msg(call->op->run_cpu(call, (const void *const *)job->host_in, ret_want, &err) == 0,
                  "run_cpu: %s", err.message);
}

static void job_free(f64_job_t *job)
{
    for (int j = 0; j < 3; j++) {
        free(job->host_in[j]);
        gpu_free(job->dev_in[j]);
    }
    for (int j = 0; j < 2; j++) {
        free(job->got[j]);
        gpu_free(job->dev_out[j]);
    }
}

/* Output j of the job equals the CPU reference's bit for bit. */
static void job_check_bits(const f64_job_t *job, const char *what)
{
    void *want[2] = {0};
    job_cpu(job, want);
    for (int j = 0; j < job->call.n_out; j++) {
        const tensor_desc_t *d = &job->call.out[j];
        size_t es = dtype_size(d->dtype);
        int64_t n = tensor_desc_numel(d), i = 0;
        while (i < n && memcmp((char *)job->got[j] + i * es, (char *)want[j] + i * es, es) == 0)
            i++;
        char shape[96];
        ck_assert_msg(
            i == n, "%s %s output %s: element %lld of %lld: GPU %.17g, CPU %.17g (seed %u)", what,
            tensor_shape_str(&job->call.in[0], shape, sizeof shape), job->call.out_names[j],
            (long long)i, (long long)n, i < n ? tensor_load(d->dtype, job->got[j], i) : 0,
            i < n ? tensor_load(d->dtype, want[j], i) : 0, run_seed);
        free(want[j]);
    }
}

static tensor_desc_t vec(int64_t n)
{
    return (tensor_desc_t){.dtype = DTYPE_F64, .ndim = 1, .shape = {n}};
}

/* ------------------------------------------------------------------ add, mul, saxpy */

static const char *const ew_ops[3] = {"add", "mul", "saxpy"};
static const char *const ew_params[3] = {NULL, NULL, "{\"a\": -1.2345678901234567}"};

/* An elementwise job on x of shape xs and y of xs (or one element), random inputs. */
static void ew_job(f64_job_t *job, int o, tensor_desc_t xs, bool y_scalar, const char *params)
{
    tensor_desc_t in[2] = {xs, y_scalar ? (tensor_desc_t){.dtype = DTYPE_F64} : xs};
    job_init(job, ew_ops[o], params ? params : ew_params[o], 2, in, NULL);
    fill_f64(job->host_in[0], tensor_desc_numel(&in[0]), 40);
    fill_f64(job->host_in[1], tensor_desc_numel(&in[1]), 40);
    job_upload(job);
}

START_TEST(test_f64_elementwise_bit_identical_at_odd_sizes)
{
    const int64_t sizes[3] = {1, 7, 1000003};
    for (int o = 0; o < 3; o++)
        for (int s = 0; s < 3; s++)
            for (int ys = 0; ys < 2; ys++) {
                f64_job_t job;
                ew_job(&job, o, vec(sizes[s]), ys, NULL);
                jobs_run(&job, 1, ew_ops[o]);
                job_check_bits(&job, ew_ops[o]);
                job_free(&job);
            }
}
END_TEST

/* Calls of mixed shapes and ranks (one empty) in one launch; saxpy's factor differs by call.
 * A one-element x is in the batch of broadcast calls: its y of one element broadcasts. */
START_TEST(test_f64_elementwise_batch_of_mixed_shapes_bit_identical)
{
    tensor_desc_t shapes[6] = {
        vec(1000003), {.dtype = DTYPE_F64, .ndim = 2, .shape = {3, 333}},
        vec(7),       {.dtype = DTYPE_F64, .ndim = 4, .shape = {2, 3, 5, 7}},
        vec(0),       vec(1),
    };
    static const char *const factors[6] = {"{\"a\": 3}",      "{\"a\": -0.1}", "{\"a\": 1e300}",
                                           "{\"a\": 1e-300}", "{\"a\": 0}",    "{\"a\": 2.5}"};
    for (int o = 0; o < 3; o++)
        for (int ys = 0; ys < 2; ys++) {
            shapes[5] = vec(ys ? 1 : 2);
            f64_job_t jobs[6];
            for (int i = 0; i < 6; i++)
                ew_job(&jobs[i], o, shapes[i], ys, o == 2 ? factors[i] : NULL);
            jobs_run(jobs, 6, ew_ops[o]);
            for (int i = 0; i < 6; i++) {
                job_check_bits(&jobs[i], ew_ops[o]);
                job_free(&jobs[i]);
            }
        }
}
END_TEST

/* saxpy, whose kernel both multiplies and adds, on 4 GiB tensors (filling them on the host takes
 * most of the time: one op keeps the suite within ctest's limit). */
START_TEST(test_f64_elementwise_largest_tensor_bit_identical)
{
    f64_job_t job;
    ew_job(&job, 2, vec(LARGEST_F64), false, NULL);
    jobs_run(&job, 1, ew_ops[2]);
    job_check_bits(&job, ew_ops[2]);
    job_free(&job);
}
END_TEST

/* ------------------------------------------------------------------ sum, dot */

/* The exact sum of x (or x * y), as a compensated sum in long double over the exact products
 * (TwoProduct through an FMA): its error is far below the bounds under test. *ret_abs gets
 * sum |terms|. */
static double exact_sum(const double *x, const double *y, int64_t n, double *ret_abs)
{
    long double hi = 0, lo = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        double p = y ? x[i] * y[i] : x[i];
        double terms[2] = {p, y ? fma(x[i], y[i], -p) : 0};
        for (int t = 0; t < 2; t++) {
            long double s = hi + terms[t];
            lo += fabsl(hi) >= fabsl(terms[t]) ? (hi - s) + terms[t] : (terms[t] - s) + hi;
            hi = s;
        }
        mag += fabs(p);
    }
    *ret_abs = (double)mag;
    return (double)(hi + lo);
}

static double gamma_of(double d)
{
    return d * U / (1 - d * U);
}

/* reduce.h's bounds, with room for the exact sum's own rounding (u |exact|). */
static double red_bound_cuda(int64_t n, double exact, double mag)
{
    return gamma_of(64 + ceil((double)n / 2097152.0)) * mag * (1 + 1e-6) + U * fabs(exact);
}

static double red_bound_cpu(int64_t n, double exact, double mag)
{
    return gamma_of(64 + ceil(log2((double)(n > 1 ? n : 1)))) * mag * (1 + 1e-6) + U * fabs(exact);
}

/* A sum or dot job on x of shape xs, random mixed-sign inputs over 2^±spread. */
static void red_job(f64_job_t *job, bool dot, tensor_desc_t xs, int spread)
{
    tensor_desc_t in[2] = {xs, xs};
    job_init(job, dot ? "dot" : "sum", NULL, dot ? 2 : 1, in, NULL);
    for (int j = 0; j < (dot ? 2 : 1); j++)
        fill_f64(job->host_in[j], tensor_desc_numel(&xs), spread);
    job_upload(job);
}

/* The job's GPU result and its CPU reference, each within its bound of the exact sum. */
static void red_check(const f64_job_t *job, bool dot, const char *what)
{
    int64_t n = tensor_desc_numel(&job->call.in[0]);
    double mag, exact = exact_sum(job->host_in[0], dot ? job->host_in[1] : NULL, n, &mag);
    double got = *(const double *)job->got[0];
    void *want[2] = {0};
    job_cpu(job, want);
    double cpu = *(double *)want[0];
    free(want[0]);
    ck_assert_msg(fabs(got - exact) <= red_bound_cuda(n, exact, mag),
                  "%s %s of %lld: GPU %.17g, exact %.17g, bound %g (seed %u)", what,
                  dot ? "dot" : "sum", (long long)n, got, exact, red_bound_cuda(n, exact, mag),
                  run_seed);
    ck_assert_msg(fabs(cpu - exact) <= red_bound_cpu(n, exact, mag),
                  "%s %s of %lld: CPU %.17g, exact %.17g (seed %u)", what, dot ? "dot" : "sum",
                  (long long)n, cpu, exact, run_seed);
    if (n == 0) ck_assert_uint_eq(bits_of(got), 0);
}

START_TEST(test_f64_sum_and_dot_within_bound_at_odd_sizes)
{
    const int64_t sizes[3] = {1, 7, 1000003};
    for (int dot = 0; dot < 2; dot++)
        for (int s = 0; s < 3; s++)
            for (int spread = 0; spread <= 60; spread += 60) {
                f64_job_t job;
                red_job(&job, dot, vec(sizes[s]), spread);
                jobs_run(&job, 1, "single");
                red_check(&job, dot, spread ? "mixed exponents" : "uniform");
                job_free(&job);
            }
}
END_TEST

START_TEST(test_f64_sum_and_dot_batch_of_mixed_shapes_within_bound)
{
    const tensor_desc_t shapes[7] = {
        vec(1000003),
        vec(0),
        {.dtype = DTYPE_F64, .ndim = 0},
        vec(7),
        {.dtype = DTYPE_F64, .ndim = 3, .shape = {3, 5, 7}},
        {.dtype = DTYPE_F64, .ndim = 2, .shape = {70, 1000}},
        vec(8193),
    };
    for (int dot = 0; dot < 2; dot++) {
        f64_job_t jobs[7];
        for (int i = 0; i < 7; i++)
            red_job(&jobs[i], dot, shapes[i], 30);
        jobs_run(jobs, 7, "batch");
        for (int i = 0; i < 7; i++) {
            red_check(&jobs[i], dot, "batch");
            job_free(&jobs[i]);
        }
    }
}
END_TEST

START_TEST(test_f64_sum_and_dot_largest_tensor_within_bound)
{
    for (int dot = 0; dot < 2; dot++) {
        f64_job_t job;
        red_job(&job, dot, vec(LARGEST_F64), 20);
        jobs_run(&job, 1, "largest");
        red_check(&job, dot, "largest");
        job_free(&job);
    }
}
END_TEST

/* ------------------------------------------------------------------ gemm */

/* op(x)[i][j] of a row-major matrix stored as rows x cols when not transposed. */
static double mat_at(const double *x, bool trans, int64_t i, int64_t j, int64_t rows_op,
                     int64_t cols_op)
{
    return trans ? x[j * rows_op + i] : x[i * cols_op + j];
}

/* gemm.h's bound on |GPU - reference| for one element of magnitude mag (|alpha| sum |a b| +
 * |beta c|): gamma(k + 3) for the GPU, u + gamma_ld(k + 3) for the long double reference. */
static double gemm_bound(int64_t k, double mag)
{
    const double u_ld = LDBL_EPSILON / 2, d = (double)k + 3;
    return (gamma_of(d) + U + d * u_ld / (1 - d * u_ld)) * mag * (1 + 1e-6);
}

/* Checks out[z][i][j] of a job's GPU output against want (the reference's value there) with
 * gemm_bound, the magnitude computed here. */
static void gemm_check_element(const f64_job_t *job, int64_t z, int64_t i, int64_t j, double want,
                               const char *what)
{
    const gemm_params_t *p = OP_PARAMS(&job->call, const gemm_params_t);
    const double *a = job->host_in[0], *b = job->host_in[1], *c = job->host_in[2];
    const double *A = a + (p->a_batched ? z * p->m * p->k : 0);
    const double *B = b + (p->b_batched ? z * p->k * p->n : 0);
    int64_t at = (z * p->m + i) * p->n + j;
    double mag = 0;
    for (int64_t q = 0; q < p->k; q++)
        mag +=
            fabs(mat_at(A, p->trans_a, i, q, p->m, p->k) * mat_at(B, p->trans_b, q, j, p->k, p->n));
    mag = fabs(p->alpha) * mag + (p->has_c ? fabs(p->beta * c[at]) : 0);
    double got = ((const double *)job->got[0])[at];
    if (!(fabs(got - want) <= gemm_bound(p->k, mag)))
        ck_abort_msg(
            "%s m=%lld n=%lld k=%lld: out[%lld][%lld][%lld] = %.17g, reference %.17g, bound %g "
            "(seed %u)",
            what, (long long)p->m, (long long)p->n, (long long)p->k, (long long)z, (long long)i,
            (long long)j, got, want, gemm_bound(p->k, mag), run_seed);
}

/* Every element of the job's output against the CPU reference. */
static void gemm_check_all(const f64_job_t *job, const char *what)
{
    const gemm_params_t *p = OP_PARAMS(&job->call, const gemm_params_t);
    void *want[2] = {0};
    job_cpu(job, want);
    for (int64_t z = 0; z < p->batch; z++)
        for (int64_t i = 0; i < p->m; i++)
            for (int64_t j = 0; j < p->n; j++)
                gemm_check_element(job, z, i, j, ((double *)want[0])[(z * p->m + i) * p->n + j],
                                   what);
    free(want[0]);
}

/* The corners of every matrix of the job's output and `samples` random elements, each against
 * the reference computed here as gemm_run_cpu computes it (long double, rounded once), for calls
 * whose whole CPU reference would take too long. */
static void gemm_check_samples(const f64_job_t *job, int samples, const char *what)
{
    const gemm_params_t *p = OP_PARAMS(&job->call, const gemm_params_t);
    const double *a = job->host_in[0], *b = job->host_in[1], *c = job->host_in[2];
    for (int s = 0; s < 4 * p->batch + samples; s++) {
        bool corner = s < 4 * p->batch;
        int64_t z = corner ? s / 4 : (int64_t)(rand64() % (uint64_t)p->batch);
        int64_t i = corner ? (s & 1) * (p->m - 1) : (int64_t)(rand64() % (uint64_t)p->m);
        int64_t j = corner ? (s >> 1 & 1) * (p->n - 1) : (int64_t)(rand64() % (uint64_t)p->n);
        const double *A = a + (p->a_batched ? z * p->m * p->k : 0);
        const double *B = b + (p->b_batched ? z * p->k * p->n : 0);
        long double acc = 0;
        for (int64_t q = 0; q < p->k; q++)
            acc += (long double)mat_at(A, p->trans_a, i, q, p->m, p->k) *
                   mat_at(B, p->trans_b, q, j, p->k, p->n);
        long double w = (long double)p->alpha * acc;
        if (p->has_c && p->beta != 0) w += (long double)p->beta * c[(z * p->m + i) * p->n + j];
        gemm_check_element(job, z, i, j, (double)w, what);
    }
}

typedef struct gemm_case {
    int64_t m, n, k;
    bool ta, tb, with_c;
    int lead_a, lead_b; /* leading dims of a, b: 0 or 2 ([2, 3, ...]) */
    double alpha, beta;
} gemm_case_t;

static void gemm_job(f64_job_t *job, const gemm_case_t *g)
{
    tensor_desc_t in[3] = {{.dtype = DTYPE_F64}, {.dtype = DTYPE_F64}, {.dtype = DTYPE_F64}};
    const int64_t lead[2] = {2, 3};
    int lead_c = g->lead_a > g->lead_b ? g->lead_a : g->lead_b;
    in[0].ndim = g->lead_a + 2;
    in[1].ndim = g->lead_b + 2;
    in[2].ndim = lead_c + 2;
    for (int i = 0; i < 2; i++)
        in[0].shape[i] = in[1].shape[i] = in[2].shape[i] = lead[i];
    in[0].shape[g->lead_a] = g->ta ? g->k : g->m;
    in[0].shape[g->lead_a + 1] = g->ta ? g->m : g->k;
    in[1].shape[g->lead_b] = g->tb ? g->n : g->k;
    in[1].shape[g->lead_b + 1] = g->tb ? g->k : g->n;
    in[2].shape[lead_c] = g->m;
    in[2].shape[lead_c + 1] = g->n;
    bool present[3] = {true, true, g->with_c};
    char params[256];
    snprintf(params, sizeof params,
             "{\"trans_a\": %s, \"trans_b\": %s, \"alpha\": %.17g, \"beta\": %.17g}",
             g->ta ? "true" : "false", g->tb ? "true" : "false", g->alpha, g->beta);
    job_init(job, "gemm", params, 3, in, present);
    for (int j = 0; j < 3; j++)
        if (present[j]) fill_f64(job->host_in[j], tensor_desc_numel(&job->call.in[j]), 10);
    job_upload(job);
}

/* Odd sizes with 1, 7 and 1000003 in each of m, n and k, every transpose, alpha and beta with
 * c, leading dims (strided batch, a shared, b shared), and k = 0. */
START_TEST(test_f64_gemm_within_bound_at_odd_sizes)
{
    const gemm_case_t cases[] = {
        {1, 1, 1, false, false, false, 0, 0, 1, 0},
        {7, 7, 7, true, false, true, 0, 0, -1.25, 0.5},
        {1, 1, 1000003, false, true, false, 0, 0, 0.1, 0},
        {7, 1, 1000003, true, false, true, 0, 0, -3, 0.25},
        {1000003, 1, 7, false, false, true, 0, 0, 1, -1},
        {1, 1000003, 7, true, true, false, 0, 0, 2, 0},
        {33, 17, 129, false, false, true, 2, 2, 0.75, 2},
        {33, 17, 129, true, true, true, 2, 0, 0.75, 2},
        {33, 17, 129, false, true, false, 0, 2, -0.5, 0},
        {129, 65, 1, true, false, true, 2, 0, 1, 1},
        {17, 5, 0, false, false, true, 0, 0, 1, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        f64_job_t job;
        gemm_job(&job, &cases[c]);
        jobs_run(&job, 1, "gemm");
        gemm_check_all(&job, "single");
        job_free(&job);
    }
}
END_TEST

/* n calls of one shape in one run_cuda: the pointer-array form (with c copied into out first,
 * f64 alpha and beta), leading dims inside each call, and calls of 2^30 products that go one
 * by one (checked on samples). */
START_TEST(test_f64_gemm_batched_calls_within_bound)
{
    const struct {
        gemm_case_t g;
        int calls;
    } cases[] = {
        {{64, 64, 64, false, false, false, 0, 0, 1, 0}, 7},
        {{17, 129, 33, true, false, true, 0, 0, 1.25, -1}, 5},
        {{20, 12, 8, false, true, true, 2, 0, -0.3, 0.7}, 3},
        {{1, 7, 1000003, false, false, true, 0, 0, 1, 1}, 3},
        {{1024, 1024, 1024, false, false, false, 0, 0, 1, 0}, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        f64_job_t jobs[7];
        for (int i = 0; i < cases[c].calls; i++)
            gemm_job(&jobs[i], &cases[c].g);
        jobs_run(jobs, cases[c].calls, "gemm batch");
        const gemm_case_t *g = &cases[c].g;
        for (int i = 0; i < cases[c].calls; i++) {
            if (g->m * g->n * g->k >= ((int64_t)1 << 30))
                gemm_check_samples(&jobs[i], 2000, "batched");
            else
                gemm_check_all(&jobs[i], "batched");
            job_free(&jobs[i]);
        }
    }
}
END_TEST

/* An output (and c) of the largest size the limits allow, 23170^2 elements (just under 4 GiB),
 * with beta c: checked on samples (the whole CPU reference would take minutes), and c
 * unchanged. */
START_TEST(test_f64_gemm_largest_output_within_bound_on_samples)
{
    const gemm_case_t g = {23170, 23170, 64, false, true, true, 0, 0, -0.75, 1.5};
    f64_job_t job;
    gemm_job(&job, &g);
    jobs_run(&job, 1, "largest gemm");
    gemm_check_samples(&job, 2000, "largest");
    const double *c = job.host_in[2];
    size_t c_bytes = tensor_desc_bytes(&job.call.in[2]);
    double *c_after = malloc(c_bytes);
    ck_assert_ptr_nonnull(c_after);
    gpu_download(c_after, job.dev_in[2], c_bytes);
    ck_assert_msg(memcmp(c_after, c, c_bytes) == 0, "c changed");
    free(c_after);
    job_free(&job);
}
END_TEST

/* ------------------------------------------------------------------ sort */

static const char *const flavours[4] = {NULL, "{\"descending\": true}", "{\"argsort\": true}",
                                        "{\"argsort\": true, \"descending\": true}"};

/* A sort job on f64 keys of shape ks, with values of dtype vdt when with_values. */
static void sort_job(f64_job_t *job, tensor_desc_t ks, bool with_values, dtype_t vdt,
                     const char *params)
{
    tensor_desc_t in[2] = {ks, ks};
    in[1].dtype = vdt;
    bool present[2] = {true, with_values};
    job_init(job, "sort", params, 2, in, present);
    fill_sort_keys(job->host_in[0], tensor_desc_numel(&ks));
    if (with_values) {
        size_t bytes = tensor_desc_bytes(&in[1]);
        for (size_t i = 0; i < bytes; i += 8) {
            uint64_t r = rand64();
            memcpy((char *)job->host_in[1] + i, &r, bytes - i < 8 ? bytes - i : 8);
        }
    }
    job_upload(job);
}

static tensor_desc_t rows(int64_t r, int64_t len)
{
    return (tensor_desc_t){.dtype = DTYPE_F64, .ndim = 2, .shape = {r, len}};
}

START_TEST(test_f64_sort_bit_identical_at_odd_sizes_and_on_every_path)
{
    /* One row (one radix sort), short rows (segmented), rows over 4096 (segmented for 64-bit
     * keys) and a few rows over 2^20 (one radix sort per row). */
    const tensor_desc_t shapes[7] = {
        vec(1),         vec(7),         vec(1000003),          rows(1000, 7),
        rows(64, 1000), rows(33, 4097), rows(3, (1 << 20) + 3)};
    for (int s = 0; s < 7; s++)
        for (int f = 0; f < 4; f++) {
            f64_job_t job;
            sort_job(&job, shapes[s], false, DTYPE_F64, flavours[f]);
            jobs_run(&job, 1, "sort");
            job_check_bits(&job, flavours[f] ? flavours[f] : "ascending");
            job_free(&job);
        }
}
END_TEST

/* Values of 8 bytes (gathered through the row-local index), 4 bytes (carried beside the key)
 * and 1 byte follow their keys. */
START_TEST(test_f64_sort_values_follow_keys)
{
    const dtype_t vdts[3] = {DTYPE_F64, DTYPE_U32, DTYPE_I8};
    const tensor_desc_t shapes[3] = {vec(1000003), rows(100, 37), rows(5, 9000)};
    for (int v = 0; v < 3; v++)
        for (int s = 0; s < 3; s++) {
            f64_job_t job;
            sort_job(&job, shapes[s], true, vdts[v], (s & 1) ? flavours[1] : NULL);
            jobs_run(&job, 1, "sort values");
            job_check_bits(&job, dtype_name(vdts[v]));
            job_free(&job);
        }
}
END_TEST

/* Calls of mixed shapes (one empty, a scalar) in one run_cuda: one segmented sort of all their
 * rows, or a radix sort per long row. */
START_TEST(test_f64_sort_batch_of_mixed_shapes_bit_identical)
{
    const tensor_desc_t small[6] = {rows(3, 5),    rows(1, 1), rows(0, 4),
                                    rows(17, 100), vec(7),     {.dtype = DTYPE_F64, .ndim = 0}};
    const tensor_desc_t mixed[5] = {vec(1000003), rows(2, 7), rows(4, 70000), vec(1),
                                    rows(1000, 7)};
    const struct {
        const tensor_desc_t *shapes;
        int n;
    } groups[2] = {{small, 6}, {mixed, 5}};
    for (int g = 0; g < 2; g++)
        for (int f = 0; f < 5; f++) {
            f64_job_t jobs[6];
            for (int i = 0; i < groups[g].n; i++)
                sort_job(&jobs[i], groups[g].shapes[i], f == 4, DTYPE_F64,
                         f < 4 ? flavours[f] : NULL);
            jobs_run(jobs, groups[g].n, "sort batch");
            for (int i = 0; i < groups[g].n; i++) {
                job_check_bits(&jobs[i], f < 4 && flavours[f] ? flavours[f] : "batch");
                job_free(&jobs[i]);
            }
        }
}
END_TEST

/* 2^29 keys (4 GiB), descending argsort, checked by the properties that make a stable sort
 * unique (qsort of the CPU reference would take minutes): the indices are a permutation, each
 * output key is the input key it names (NaNs canonical), keys are in order, and equal keys keep
 * their input order. Each element's checks call Check only when they fail: a passing ck_assert
 * writes its place to Check's pipe, a system call per check. */
START_TEST(test_f64_sort_largest_tensor_is_the_stable_order)
{
    f64_job_t job;
    sort_job(&job, vec(LARGEST_F64), false, DTYPE_F64, flavours[3]);
    jobs_run(&job, 1, "largest sort");
    const double *in = job.host_in[0], *out = job.got[0];
    const int64_t *idx = job.got[1];
    const int64_t n = LARGEST_F64;
    uint8_t *seen = calloc((size_t)n / 8, 1);
    ck_assert_ptr_nonnull(seen);
    for (int64_t i = 0; i < n; i++) {
        int64_t src = idx[i];
        if (src < 0 || src >= n || (seen[src / 8] >> (src % 8) & 1))
            ck_abort_msg("indices[%lld] = %lld: not a permutation", (long long)i, (long long)src);
        seen[src / 8] |= (uint8_t)(1u << (src % 8));
        bool nan = isnan(in[src]);
        if (bits_of(out[i]) != (nan ? SORT_CANONICAL_NAN64_BITS : bits_of(in[src])))
            ck_abort_msg("keys[%lld] is not keys_in[%lld]", (long long)i, (long long)src);
        if (i == 0) continue;
        double prev = out[i - 1], cur = out[i];
        /* Descending: NaNs last; otherwise larger first, +0.0 before -0.0. */
        int order;
        if (isnan(prev) || isnan(cur))
            order = (isnan(cur) != 0) - (isnan(prev) != 0);
        else if (prev == cur)
            order = (signbit(cur) != 0) - (signbit(prev) != 0);
        else
            order = prev > cur ? 1 : -1;
        if (order < 0)
            ck_abort_msg("out of order at %lld: %.17g then %.17g", (long long)i, prev, cur);
        if (order == 0 && bits_of(prev) == bits_of(cur) && idx[i - 1] >= idx[i])
            ck_abort_msg("equal keys out of input order at %lld", (long long)i);
    }
    free(seen);
    job_free(&job);
}
END_TEST

int main(void)
{
    ctx = gpu_ctx_new(); /* exits 77 without a GPU */
    const char *seed_env = getenv("GJ_TEST_SEED");
    run_seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : (unsigned)time(NULL);
    rng = 0x9e3779b97f4a7c15ull ^ run_seed;
    printf("test_gpu_f64: seed %u (GJ_TEST_SEED=%u replays it)\n", run_seed, run_seed);
    Suite *s = suite_create("gpu_f64");
    TCase *tc = tcase_create("f64");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_f64_elementwise_bit_identical_at_odd_sizes);
    tcase_add_test(tc, test_f64_elementwise_batch_of_mixed_shapes_bit_identical);
    tcase_add_test(tc, test_f64_elementwise_largest_tensor_bit_identical);
    tcase_add_test(tc, test_f64_sum_and_dot_within_bound_at_odd_sizes);
    tcase_add_test(tc, test_f64_sum_and_dot_batch_of_mixed_shapes_within_bound);
    tcase_add_test(tc, test_f64_sum_and_dot_largest_tensor_within_bound);
    tcase_add_test(tc, test_f64_gemm_within_bound_at_odd_sizes);
    tcase_add_test(tc, test_f64_gemm_batched_calls_within_bound);
    tcase_add_test(tc, test_f64_gemm_largest_output_within_bound_on_samples);
    tcase_add_test(tc, test_f64_sort_bit_identical_at_odd_sizes_and_on_every_path);
    tcase_add_test(tc, test_f64_sort_values_follow_keys);
    tcase_add_test(tc, test_f64_sort_batch_of_mixed_shapes_bit_identical);
    tcase_add_test(tc, test_f64_sort_largest_tensor_is_the_stable_order);
    suite_add_tcase(s, tc);
    int status = run_suite_nofork(s);
    gpu_ctx_free(ctx);
    return status;
}
