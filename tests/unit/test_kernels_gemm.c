/* The gemm op on the CPU: validation (each bad input names its field), hand-checked products,
 * and the reference against an independent naive triple loop in f64 over every transpose,
 * batch and broadcast form, beta with c, and i8 -> i32. */
#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "kernels/op.h"
#include "support/op_test.h"

/* Validates gemm(a, b) with c when c is not NULL; returns validate's result. */
static int gemm_call(op_call_t *call, const tensor_desc_t *a, const tensor_desc_t *b,
                     const tensor_desc_t *c, const char *params_json, op_error_t *err)
{
    const tensor_desc_t *in[3] = {a, b, c};
    int r = op_test_validate("gemm", params_json, in, 3, call, err);
    ck_assert_ptr_eq(call->op, &op_gemm); /* registered in the table */
    return r;
}

/* Runs a validated call on the CPU; the output is poisoned first so unwritten elements show. */
static void gemm_run(const op_call_t *call, const void *a, const void *b, const void *c, void *out)
{
    op_test_run_call(call, (const void *[]){a, b, c}, (void *[]){out});
}

START_TEST(test_gemm_f32_hand_checked_with_every_transpose)
{
    /* A = [[1, 2, 3], [4, 5, 6]], B = [[7, 8], [9, 10], [11, 12]]: A B = [[58, 64], [139, 154]] */
    float a[6] = {1, 2, 3, 4, 5, 6}, at[6] = {1, 4, 2, 5, 3, 6};
    float b[6] = {7, 8, 9, 10, 11, 12}, bt[6] = {7, 9, 11, 8, 10, 12};
    const float want[4] = {58, 64, 139, 154};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            tensor_desc_t da = ta ? td(DTYPE_F32, 3, 2) : td(DTYPE_F32, 2, 3);
            tensor_desc_t db = tb ? td(DTYPE_F32, 2, 3) : td(DTYPE_F32, 3, 2);
            char params[64];
            snprintf(params, sizeof params, "{\"trans_a\": %s, \"trans_b\": %s}",
                     ta ? "true" : "false", tb ? "true" : "false");
            op_call_t call;
            op_error_t err;
            ck_assert_int_eq(gemm_call(&call, &da, &db, NULL, params, &err), 0);
            ck_assert_int_eq(call.out[0].ndim, 2);
            ck_assert_int_eq(call.out[0].shape[0], 2);
            ck_assert_int_eq(call.out[0].shape[1], 2);
            float out[4];
            gemm_run(&call, ta ? at : a, tb ? bt : b, NULL, out);
            for (int i = 0; i < 4; i++)
                ck_assert_msg(out[i] == want[i], "ta=%d tb=%d [%d]: %g != %g", ta, tb, i, out[i],
                              want[i]);
        }
}
END_TEST

START_TEST(test_gemm_alpha_beta_with_c_and_i8_to_i32)
{
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {1, 1, 1, -1}, out[4];
    tensor_desc_t d = td(DTYPE_F32, 2, 2);
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(gemm_call(&call, &d, &d, &d, "{\"alpha\": 2, \"beta\": -3}", &err), 0);
    gemm_run(&call, a, b, c, out);
    /* A B = [[19, 22], [43, 50]] */
    const float want[4] = {35, 41, 83, 103};
    for (int i = 0; i < 4; i++)
        ck_assert(out[i] == want[i]);

    int8_t ia[4] = {127, -128, 3, 4}, ib[4] = {127, 1, -128, 2};
    int32_t ic[4] = {10, 20, 30, 40}, iout[4];
    tensor_desc_t di = td(DTYPE_I8, 2, 2);
    tensor_desc_t dc = td(DTYPE_I32, 2, 2);
    ck_assert_int_eq(gemm_call(&call, &di, &di, &dc, "{\"alpha\": 3, \"beta\": 2}", &err), 0);
    ck_assert_int_eq(call.out[0].dtype, DTYPE_I32);
    gemm_run(&call, ia, ib, ic, iout);
    /* A B = [[127*127 + 128*128, 127 - 256], [381 - 512, 3 + 8]] */
    const int32_t iwant[4] = {3 * (16129 + 16384) + 20, 3 * (127 - 256) + 40, 3 * (381 - 512) + 60,
                              3 * 11 + 80};
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(iout[i], iwant[i]);
}
END_TEST

START_TEST(test_gemm_k_zero_gives_beta_c)
{
    tensor_desc_t a = td(DTYPE_F32, 2, 0);
    tensor_desc_t b = td(DTYPE_F32, 0, 3);
    tensor_desc_t c = td(DTYPE_F32, 2, 3);
    float cv[6] = {1, 2, 3, 4, 5, 6}, out[6];
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(gemm_call(&call, &a, &b, &c, "{\"beta\": 0.5}", &err), 0);
    gemm_run(&call, NULL, NULL, cv, out);
    for (int i = 0; i < 6; i++)
        ck_assert(out[i] == cv[i] / 2);
    ck_assert_int_eq(gemm_call(&call, &a, &b, NULL, NULL, &err), 0);
    gemm_run(&call, NULL, NULL, NULL, out);
    for (int i = 0; i < 6; i++)
        ck_assert(out[i] == 0);
}
END_TEST

/* An empty output has nothing to compute, however long k and the batch: a shared a of 64 x
 * 512 against b of [2^30, 512, 0] is 2^45 products of a's rows if the loops run, and returns at
 * once if they do not (Check's per-test timeout fails the first). */
START_TEST(test_gemm_with_an_empty_output_computes_nothing)
{
    tensor_desc_t a = td(DTYPE_F32, 64, 512);
    tensor_desc_t b = td(DTYPE_F32, (int64_t)1 << 30, 512, 0);
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(gemm_call(&call, &a, &b, NULL, NULL, &err), 0);
    ck_assert_uint_eq(tensor_desc_bytes(&call.out[0]), 0);
    ck_assert(call.cost.flops == 0);
    float *av = calloc(64 * 512, sizeof *av);
    float none;
    gemm_run(&call, av, &none, NULL, &none);
    free(av);
}
END_TEST

/* The independent check: a naive triple loop in f64 over explicitly strided operands. */
static void naive_gemm(dtype_t dt, const void *a, const void *b, const void *c, double *out,
                       int64_t batch, bool a_batched, bool b_batched, int64_t m, int64_t n,
                       int64_t k, bool ta, bool tb, double alpha, double beta)
{
    dtype_t out_dt = dt == DTYPE_I8 ? DTYPE_I32 : dt;
    for (int64_t z = 0; z < batch; z++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t q = 0; q < k; q++) {
                    int64_t ai = (a_batched ? z * m * k : 0) + (ta ? q * m + i : i * k + q);
                    int64_t bi = (b_batched ? z * k * n : 0) + (tb ? j * k + q : q * n + j);
                    s += tensor_load(dt, a, ai) * tensor_load(dt, b, bi);
                }
                int64_t at = (z * m + i) * n + j;
                out[at] = alpha * s + (c && beta != 0 ? beta * tensor_load(out_dt, c, at) : 0);
            }
}

START_TEST(test_gemm_reference_matches_naive_loop_for_all_forms)
{
    const dtype_t dts[5] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_F64, DTYPE_I8};
    /* {batch dims of a, batch dims of b}: none, equal, b shared, a shared */
    const int lead[4][2] = {{0, 0}, {2, 2}, {2, 0}, {0, 2}};
    const int64_t dims[2] = {3, 2};
    unsigned seed = 777;
    printf("test_gemm_reference_matches_naive_loop_for_all_forms: seed %u\n", seed);
    for (int t = 0; t < 5; t++)
        for (int l = 0; l < 4; l++)
            for (int tr = 0; tr < 4; tr++)
                for (int with_c = 0; with_c < 2; with_c++) {
                    dtype_t dt = dts[t], out_dt = dt == DTYPE_I8 ? DTYPE_I32 : dt;
                    bool ta = tr & 1, tb = tr & 2;
                    int64_t m = 5, n = 4, k = 7, batch = 1;
                    tensor_desc_t a = {.dtype = dt, .ndim = lead[l][0] + 2};
                    tensor_desc_t b = {.dtype = dt, .ndim = lead[l][1] + 2};
                    tensor_desc_t c = {.dtype = out_dt, .ndim = (lead[l][0] | lead[l][1]) + 2};
                    for (int i = 0; i < 2; i++) {
                        a.shape[i] = b.shape[i] = c.shape[i] = dims[i];
                        if (i < (lead[l][0] | lead[l][1])) batch *= dims[i];
                    }
                    a.shape[a.ndim - 2] = ta ? k : m;
                    a.shape[a.ndim - 1] = ta ? m : k;
                    b.shape[b.ndim - 2] = tb ? n : k;
                    b.shape[b.ndim - 1] = tb ? k : n;
                    c.shape[c.ndim - 2] = m;
                    c.shape[c.ndim - 1] = n;
                    char params[128];
                    double alpha = dt == DTYPE_I8 ? -2 : 1.5, beta = with_c ? 3 : 0;
                    snprintf(params, sizeof params,
                             "{\"trans_a\": %s, \"trans_b\": %s, \"alpha\": %g, \"beta\": %g}",
                             ta ? "true" : "false", tb ? "true" : "false", alpha, beta);
                    op_call_t call;
                    op_error_t err;
                    int r = gemm_call(&call, &a, &b, with_c ? &c : NULL, params, &err);
                    ck_assert_msg(r == 0, "%s: %s", err.field, err.message);
                    ck_assert(tensor_desc_equal(&call.out[0], &c));
                    void *ha = malloc(tensor_desc_bytes(&a)), *hb = malloc(tensor_desc_bytes(&b));
                    void *hc = malloc(tensor_desc_bytes(&c)), *out = malloc(tensor_desc_bytes(&c));
                    double *want = malloc((size_t)tensor_desc_numel(&c) * sizeof *want);
                    for (int64_t i = 0; i < tensor_desc_numel(&a); i++)
                        tensor_store(dt, ha, i, rand_r(&seed) % 17 - 8);
                    for (int64_t i = 0; i < tensor_desc_numel(&b); i++)
                        tensor_store(dt, hb, i,
                                     (rand_r(&seed) % 17 - 8) / (dt == DTYPE_I8 ? 1 : 4.0));
                    for (int64_t i = 0; i < tensor_desc_numel(&c); i++)
                        tensor_store(out_dt, hc, i, rand_r(&seed) % 9 - 4);
                    gemm_run(&call, ha, hb, with_c ? hc : NULL, out);
                    naive_gemm(dt, ha, hb, with_c ? hc : NULL, want, batch, lead[l][0] > 0,
                               lead[l][1] > 0, m, n, k, ta, tb, alpha, beta);
                    for (int64_t i = 0; i < tensor_desc_numel(&c); i++) {
                        /* The reference rounds the exact f64 result once to the output type. */
                        double rounded_want = want[i];
                        {
                            unsigned char tmp[8];
                            tensor_store(out_dt, tmp, 0, want[i]);
                            rounded_want = tensor_load(out_dt, tmp, 0);
                        }
                        ck_assert_msg(tensor_load(out_dt, out, i) == rounded_want,
                                      "%s lead %d trans %d c %d [%lld]: %g != %g", dtype_name(dt),
                                      l, tr, with_c, (long long)i, tensor_load(out_dt, out, i),
                                      rounded_want);
                    }
                    free(ha);
                    free(hb);
                    free(hc);
                    free(out);
                    free(want);
                }
}
END_TEST

/* f64 validates with an f64 output and c, its own batch key, and f64 alpha and beta kept
 * exactly (no rounding to f32 on the way). */
START_TEST(test_gemm_f64_validates_with_f64_output_and_c)
{
    tensor_desc_t a = td(DTYPE_F64, 2, 5, 3), b = td(DTYPE_F64, 3, 4), c = td(DTYPE_F64, 2, 5, 4);
    tensor_desc_t a32 = td(DTYPE_F32, 2, 5, 3), b32 = td(DTYPE_F32, 3, 4);
    op_call_t call, call32;
    op_error_t err;
    const char *params = "{\"alpha\": 0.1, \"beta\": -0.3}";
    ck_assert_int_eq(gemm_call(&call, &a, &b, &c, params, &err), 0);
    ck_assert_int_eq(call.out[0].dtype, DTYPE_F64);
    ck_assert(tensor_desc_equal(&call.out[0], &c));
    const gemm_params_t *p = OP_PARAMS(&call, const gemm_params_t);
    ck_assert(p->alpha == 0.1 && p->beta == -0.3);
    ck_assert(call.cost.bytes == 8.0 * (2 * 5 * 3 + 3 * 4 + 2 * 2 * 5 * 4));
    ck_assert_int_eq(gemm_call(&call32, &a32, &b32, NULL, params, &err), -EINVAL); /* no c */
    ck_assert_int_eq(gemm_call(&call32, &a32, &b32, NULL, NULL, &err), 0);
    op_call_t call64;
    ck_assert_int_eq(gemm_call(&call64, &a, &b, NULL, NULL, &err), 0);
    ck_assert_str_ne(call32.batch_key, call64.batch_key);
}
END_TEST

/* The f64 reference accumulates in long double: 1 + 2^-60 - 1 gives 2^-60 (f64 sums give 0),
 * and with alpha, beta and c the result is rounded once. */
START_TEST(test_gemm_f64_reference_accumulates_past_f64)
{
#if LDBL_MANT_DIG >= 64
    tensor_desc_t a = td(DTYPE_F64, 1, 3), b = td(DTYPE_F64, 3, 1), c = td(DTYPE_F64, 1, 1);
    double av[3] = {1, ldexp(1, -60), -1}, bv[3] = {1, 1, 1}, cv[1] = {ldexp(1, -62)}, out[1];
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(gemm_call(&call, &a, &b, NULL, NULL, &err), 0);
    gemm_run(&call, av, bv, NULL, out);
    ck_assert(out[0] == ldexp(1, -60));
    /* 3 * 2^-60 + 2 * 2^-62 = 2^-58 + 2^-59 + ... exactly 3.5 * 2^-60 */
    ck_assert_int_eq(gemm_call(&call, &a, &b, &c, "{\"alpha\": 3, \"beta\": 2}", &err), 0);
    gemm_run(&call, av, bv, cv, out);
    ck_assert(out[0] == 3.5 * ldexp(1, -60));
#else
    fprintf(stderr, "long double is no wider than double here: skipped\n");
#endif
}
END_TEST

/* x * y + s exactly as an unevaluated pair (hi, lo): Ogita, Rump and Oishi's TwoProduct and
 * TwoSum, so that the test's reference owes nothing to long double. */
static void dot2_step(double x, double y, double *hi, double *lo)
{
    double p = x * y, ep = fma(x, y, -p);
    double s = *hi + p, z = s - *hi, es = (*hi - (s - z)) + (p - z);
    *hi = s;
    *lo += es + ep;
}

/* The f64 reference against an independent compensated dot product in f64 (as accurate as a
 * sum in twice the precision): within gemm.h's bound, u |exact| + gamma_ld(k + 3) times
 * |alpha| sum |a b| + |beta c| (and the check's own rounding), on random inputs of mixed signs
 * and exponents, every transpose and a shared operand. An f64 accumulation misses this bound:
 * gamma_ld(k + 3) is 2^-11 of f64's. */
START_TEST(test_gemm_f64_reference_within_its_bound)
{
    const int64_t m = 9, n = 7, k = 301;
    unsigned seed = 4242;
    printf("test_gemm_f64_reference_within_its_bound: seed %u\n", seed);
    const double u = ldexp(1, -53), u_ld = LDBL_EPSILON / 2;
    for (int tr = 0; tr < 4; tr++) {
        bool ta = tr & 1, tb = tr & 2;
        tensor_desc_t a = ta ? td(DTYPE_F64, k, m) : td(DTYPE_F64, m, k);
        tensor_desc_t b = tb ? td(DTYPE_F64, 2, n, k) : td(DTYPE_F64, 2, k, n);
        tensor_desc_t c = td(DTYPE_F64, 2, m, n);
        double *av = malloc(sizeof(double) * m * k), *bv = malloc(sizeof(double) * 2 * k * n);
        double cv[2 * 9 * 7], out[2 * 9 * 7];
        for (int64_t i = 0; i < m * k; i++)
            av[i] = ldexp((double)rand_r(&seed) / RAND_MAX - 0.5, rand_r(&seed) % 41 - 20);
        for (int64_t i = 0; i < 2 * k * n; i++)
            bv[i] = ldexp((double)rand_r(&seed) / RAND_MAX - 0.5, rand_r(&seed) % 41 - 20);
        for (int64_t i = 0; i < 2 * m * n; i++)
            cv[i] = (double)rand_r(&seed) / RAND_MAX - 0.5;
        /* A power of two for alpha keeps alpha * a exact in the check's own sum. */
        const double alpha = -0.5, beta = 0.7;
        char params[128];
        snprintf(params, sizeof params,
                 "{\"trans_a\": %s, \"trans_b\": %s, \"alpha\": %.17g, \"beta\": %.17g}",
                 ta ? "true" : "false", tb ? "true" : "false", alpha, beta);
        op_call_t call;
        op_error_t err;
        ck_assert_int_eq(gemm_call(&call, &a, &b, &c, params, &err), 0);
        gemm_run(&call, av, bv, cv, out);
        for (int64_t z = 0; z < 2; z++)
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double hi = 0, lo = 0, mag = 0;
                    for (int64_t q = 0; q < k; q++) {
                        double x = av[ta ? q * m + i : i * k + q];
                        double y = bv[z * k * n + (tb ? j * k + q : q * n + j)];
                        dot2_step(alpha * x, y, &hi, &lo);
                        mag += fabs(x * y);
                    }
                    int64_t at = (z * m + i) * n + j;
                    dot2_step(beta, cv[at], &hi, &lo);
                    double exact = hi + lo; /* within u |exact| + k^2 u^2 mag */
                    mag = fabs(alpha) * mag + fabs(beta * cv[at]);
                    double bound = 2 * u * fabs(exact) +
                                   (k + 3) * u_ld / (1 - (k + 3) * u_ld) * mag * (1 + 1e-6) +
                                   4 * (k + 1) * (k + 1) * u * u * mag;
                    ck_assert_msg(fabs(out[at] - exact) <= bound,
                                  "trans %d [%lld, %lld, %lld]: %.17g, exact %.17g, bound %g", tr,
                                  (long long)z, (long long)i, (long long)j, out[at], exact, bound);
                }
        free(av);
        free(bv);
    }
}
END_TEST

START_TEST(test_gemm_outputs_cost_and_batch_key)
{
    tensor_desc_t a = td(DTYPE_BF16, 4, 64, 32);
    tensor_desc_t b = td(DTYPE_BF16, 32, 16);
    tensor_desc_t b2 = td(DTYPE_BF16, 32, 8);
    op_call_t x, y, z;
    op_error_t err;
    ck_assert_int_eq(gemm_call(&x, &a, &b, NULL, NULL, &err), 0);
    ck_assert_int_eq(x.n_out, 1);
    ck_assert_str_eq(x.out_names[0], "out");
    ck_assert_int_eq(x.out[0].dtype, DTYPE_BF16);
    ck_assert_int_eq(x.out[0].ndim, 3);
    ck_assert_int_eq(x.out[0].shape[0], 4);
    ck_assert_int_eq(x.out[0].shape[1], 64);
    ck_assert_int_eq(x.out[0].shape[2], 16);
    ck_assert(x.cost.flops == 2.0 * 4 * 64 * 16 * 32);
    ck_assert(strlen(x.batch_key) > 0);
    ck_assert_int_eq(gemm_call(&y, &a, &b, NULL, "{\"alpha\": 1}", &err), 0);
    ck_assert_str_eq(x.batch_key, y.batch_key); /* the default spelled out */
    ck_assert_int_eq(gemm_call(&y, &a, &b, NULL, "{\"alpha\": 0.5}", &err), 0);
    ck_assert_str_ne(x.batch_key, y.batch_key);
    ck_assert_int_eq(gemm_call(&z, &a, &b2, NULL, NULL, &err), 0);
    ck_assert_str_ne(x.batch_key, z.batch_key);
}
END_TEST

static void expect_error(const tensor_desc_t *a, const tensor_desc_t *b, const tensor_desc_t *c,
                         const char *params, int code, const char *field)
{
    op_test_expect_error("gemm", params, (const tensor_desc_t *[]){a, b, c}, 3, code, field);
}

START_TEST(test_gemm_rejects_bad_input_naming_the_field)
{
    tensor_desc_t a = td(DTYPE_F32, 4, 3);
    tensor_desc_t b = td(DTYPE_F32, 3, 5);
    tensor_desc_t b_k = td(DTYPE_F32, 4, 5);
    tensor_desc_t c = td(DTYPE_F32, 4, 5);
    tensor_desc_t c_shape = td(DTYPE_F32, 5, 4);
    tensor_desc_t vec = td(DTYPE_F32, 3);
    tensor_desc_t a64 = td(DTYPE_I64, 4, 3);
    tensor_desc_t f64 = td(DTYPE_F64, 4, 3), f64_b = td(DTYPE_F64, 3, 5);
    tensor_desc_t b16 = td(DTYPE_F16, 3, 5);
    tensor_desc_t a8 = td(DTYPE_I8, 4, 3);
    tensor_desc_t b8 = td(DTYPE_I8, 3, 5);
    tensor_desc_t a_b2 = td(DTYPE_F32, 2, 4, 3);
    tensor_desc_t b_b3 = td(DTYPE_F32, 3, 3, 5);
    tensor_desc_t huge_a = td(DTYPE_F32, 1ll << 40, 0);
    tensor_desc_t huge_b = td(DTYPE_F32, 0, 1ll << 40);

    expect_error(&a, &b_k, NULL, NULL, -EINVAL, "inputs.b.shape"); /* k mismatch */
    expect_error(&a, &b, NULL, "{\"trans_b\": true}", -EINVAL, "inputs.b.shape");
    expect_error(&a_b2, &b_b3, NULL, NULL, -EINVAL, "inputs.b.shape"); /* batch mismatch */
    expect_error(&vec, &b, NULL, NULL, -EINVAL, "inputs.a.shape");
    expect_error(&a, &vec, NULL, NULL, -EINVAL, "inputs.b.shape");
    expect_error(&a64, &b, NULL, NULL, -EINVAL, "inputs.a.dtype");
    expect_error(&a, &b16, NULL, NULL, -EINVAL, "inputs.b.dtype");
    expect_error(&a, &b, NULL, "{\"beta\": 1}", -EINVAL, "params.beta");
    expect_error(&a, &b, &c_shape, "{\"beta\": 1}", -EINVAL, "inputs.c.shape");
    expect_error(&a8, &b8, &c, "{\"beta\": 1}", -EINVAL, "inputs.c.dtype");
    expect_error(&f64, &f64_b, &c, "{\"beta\": 1}", -EINVAL, "inputs.c.dtype"); /* c f32 */
    expect_error(&f64, &b, NULL, NULL, -EINVAL, "inputs.b.dtype");
    expect_error(&f64, &f64_b, NULL, "{\"tf32\": true}", -EINVAL, "params.tf32");
    expect_error(&a8, &b8, NULL, "{\"alpha\": 1.5}", -EINVAL, "params.alpha");
    expect_error(&a8, &b8, NULL, "{\"alpha\": 1e12}", -EINVAL, "params.alpha");
    expect_error(&b16, &b16, NULL, "{\"tf32\": true, \"trans_a\": true}", -EINVAL, "params.tf32");
    expect_error(&a, &b, NULL, "{\"trans_a\": 1}", -EINVAL, "params.trans_a");
    expect_error(&a, &b, NULL, "{\"alpha\": \"two\"}", -EINVAL, "params.alpha");
    expect_error(&a, &b, NULL, "{\"gamma\": 1}", -EINVAL, "params.gamma");
    expect_error(&huge_a, &huge_b, NULL, NULL, -E2BIG, "inputs.b.shape");
    /* And the valid neighbours of those: c with beta 0 is allowed, tf32 with f32 too. */
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(gemm_call(&call, &a, &b, &c, NULL, &err), 0);
    ck_assert_int_eq(gemm_call(&call, &a, &b, NULL, "{\"tf32\": true}", &err), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels_gemm");
    TCase *tc = tcase_create("gemm");
    tcase_add_test(tc, test_gemm_f32_hand_checked_with_every_transpose);
    tcase_add_test(tc, test_gemm_alpha_beta_with_c_and_i8_to_i32);
    tcase_add_test(tc, test_gemm_k_zero_gives_beta_c);
    tcase_add_test(tc, test_gemm_with_an_empty_output_computes_nothing);
    tcase_add_test(tc, test_gemm_reference_matches_naive_loop_for_all_forms);
    tcase_add_test(tc, test_gemm_f64_validates_with_f64_output_and_c);
    tcase_add_test(tc, test_gemm_f64_reference_accumulates_past_f64);
    tcase_add_test(tc, test_gemm_f64_reference_within_its_bound);
    tcase_add_test(tc, test_gemm_outputs_cost_and_batch_key);
    tcase_add_test(tc, test_gemm_rejects_bad_input_naming_the_field);
    suite_add_tcase(s, tc);
    return op_test_run_suite(s);
}
