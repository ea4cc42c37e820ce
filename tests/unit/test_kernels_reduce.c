/* CPU tests of sum and dot: hand-checked results, the accumulation and output dtypes, empty
 * inputs, determinism and accuracy on a million elements, batch keys, and validation errors
 * with their field paths. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/reduce.h"
#include "support/op_test.h"

/* How many of (x, y) op takes: sum reads x alone, dot both. */
static int red_n_inputs(const char *op)
{
    return strcmp(op, "dot") == 0 ? 2 : 1;
}

/* Validates op on inputs x (and y for dot) with params (JSON text or NULL). */
static int red_validate_call(const char *op, const char *params, tensor_desc_t x, tensor_desc_t y,
                             op_call_t *call, op_error_t *err)
{
    const tensor_desc_t *in[2] = {&x, &y};
    return op_test_validate(op, params, in, red_n_inputs(op), call, err);
}

static void red_run(const char *op, tensor_desc_t x, const void *xd, tensor_desc_t y,
                    const void *yd, void *out)
{
    const tensor_desc_t *in[2] = {&x, &y};
    op_test_run(op, NULL, in, (const void *[]){xd, yd}, red_n_inputs(op), (void *[]){out});
}

static void expect_error(const char *op, const char *params, tensor_desc_t x, tensor_desc_t y,
                         const char *field)
{
    const tensor_desc_t *in[2] = {&x, &y};
    op_test_expect_error(op, params, in, red_n_inputs(op), -EINVAL, field);
}

START_TEST(test_ops_are_in_the_table)
{
    ck_assert_ptr_eq(op_find("sum"), &op_sum);
    ck_assert_ptr_eq(op_find("dot"), &op_dot);
}
END_TEST

START_TEST(test_sum_f32_hand_checked_with_scalar_output)
{
    float x[] = {1, 2.5f, -3, 4, 0.25f}, out = -1;
    op_call_t call;
    op_error_t err;
    tensor_desc_t d = td(DTYPE_F32, 1, 5);
    ck_assert_int_eq(red_validate_call("sum", NULL, d, d, &call, &err), 0);
    ck_assert_int_eq(call.n_out, 1);
    ck_assert_str_eq(call.out_names[0], "out");
    ck_assert_int_eq(call.out[0].dtype, DTYPE_F32);
    ck_assert_int_eq(call.out[0].ndim, 0);
    red_run("sum", d, x, d, NULL, &out);
    ck_assert_float_eq(out, 4.75f);
}
END_TEST

START_TEST(test_sum_i32_accumulates_and_returns_i64)
{
    int32_t x[] = {INT32_MAX, INT32_MAX, 2, INT32_MIN};
    int64_t out = 0;
    op_call_t call;
    op_error_t err;
    tensor_desc_t d = td(DTYPE_I32, 4);
    ck_assert_int_eq(red_validate_call("sum", NULL, d, d, &call, &err), 0);
    ck_assert_int_eq(call.out[0].dtype, DTYPE_I64);
    red_run("sum", d, x, d, NULL, &out);
    ck_assert_int_eq(out, 2147483648LL); /* 2 * (2^31 - 1) + 2 - 2^31 */
}
END_TEST

START_TEST(test_dot_hand_checked_in_every_dtype_class)
{
    double x[] = {1, 2, 3}, y[] = {4, -5, 6}, out;
    red_run("dot", td(DTYPE_F64, 3), x, td(DTYPE_F64, 3), y, &out);
    ck_assert_double_eq(out, 12);
    /* 100000^2 + 3 * 4 overflows i32 but not the i64 accumulator. */
    int32_t xi[] = {100000, 3}, yi[] = {100000, 4};
    int64_t outi;
    red_run("dot", td(DTYPE_I32, 2), xi, td(DTYPE_I32, 2), yi, &outi);
    ck_assert_int_eq(outi, 10000000012LL);
    uint16_t xh[] = {f32_to_f16(1.5f), f32_to_f16(-2)}, yh[] = {f32_to_f16(2), f32_to_f16(0.25f)};
    float outf;
    red_run("dot", td(DTYPE_F16, 2), xh, td(DTYPE_F16, 2), yh, &outf);
    ck_assert_float_eq(outf, 2.5f);
}
END_TEST

START_TEST(test_16_bit_inputs_accumulate_in_f32)
{
    /* In bf16, 256 + 1 rounds back to 256, so a bf16 accumulator would return 256. */
    uint16_t x[] = {f32_to_bf16(256), f32_to_bf16(1), f32_to_bf16(1)};
    float out = 0;
    tensor_desc_t d = td(DTYPE_BF16, 3);
    red_run("sum", d, x, d, NULL, &out);
    ck_assert_float_eq(out, 258);
    /* In f16, 2048 + 1 rounds back to 2048. */
    uint16_t h[] = {f32_to_f16(2048), f32_to_f16(1), f32_to_f16(1), f32_to_f16(1)};
    tensor_desc_t hd = td(DTYPE_F16, 4);
    red_run("sum", hd, h, hd, NULL, &out);
    ck_assert_float_eq(out, 2051);
}
END_TEST

START_TEST(test_empty_inputs_give_zero)
{
    float dummy = 7, out = -1;
    tensor_desc_t d = td(DTYPE_F32, 3, 0);
    red_run("sum", d, &dummy, d, NULL, &out);
    ck_assert_float_eq(out, 0);
    out = -1;
    red_run("dot", d, &dummy, d, &dummy, &out);
    ck_assert_float_eq(out, 0);
    int64_t outi = -1;
    tensor_desc_t di = td(DTYPE_I32, 0);
    red_run("sum", di, &dummy, di, NULL, &outi);
    ck_assert_int_eq(outi, 0);
}
END_TEST

/* Fills n floats from a fixed linear congruential sequence in [-0.5, 1.5). */
static void fill_floats(float *x, int64_t n, uint32_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.0f * 2.0f - 0.5f;
    }
}

START_TEST(test_sum_f32_is_deterministic_and_accurate_on_a_million_elements)
{
    const int64_t n = (1 << 20) + 3;
    float *x = malloc((size_t)n * sizeof *x), *copy = malloc((size_t)n * sizeof *x);
    ck_assert_ptr_nonnull(x);
    ck_assert_ptr_nonnull(copy);
    fill_floats(x, n, 42);
    memcpy(copy, x, (size_t)n * sizeof *x);
    tensor_desc_t d = td(DTYPE_F32, n);
    float a = 0, b = 1, c = 2;
    red_run("sum", d, x, d, NULL, &a);
    red_run("sum", d, x, d, NULL, &b);
    red_run("sum", d, copy, d, NULL, &c);
    ck_assert_mem_eq(&a, &b, sizeof a);
    ck_assert_mem_eq(&a, &c, sizeof a);
    double exact = 0;
    for (int64_t i = 0; i < n; i++)
        exact += x[i];
    /* Naive f32 accumulation is off by ~1e-4 here; the pairwise reference stays near 1e-7. */
    ck_assert_msg(fabs(a - exact) / fabs(exact) < 1e-6, "sum %.9g vs %.9g", a, exact);
    float dot = 0;
    red_run("dot", d, x, d, copy, &dot);
    double exact_dot = 0;
    for (int64_t i = 0; i < n; i++)
        exact_dot += (double)x[i] * x[i];
    ck_assert_msg(fabs(dot - exact_dot) / exact_dot < 1e-6, "dot %.9g vs %.9g", dot, exact_dot);
    free(x);
    free(copy);
}
END_TEST

/* The exact sum of x (or of x * y) as a double-f64 pair: TwoProduct (an FMA) and TwoSum on
 * every term, so that the check's error (u |sum| + n^2 u^2 sum |terms|) is far below the bound
 * under test. ret_abs gets sum |terms|. */
static double exact_sum_f64(const double *x, const double *y, int64_t n, double *ret_abs)
{
    double hi = 0, lo = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        double p = y ? x[i] * y[i] : x[i], ep = y ? fma(x[i], y[i], -p) : 0;
        double s = hi + p, z = s - hi;
        lo += (hi - (s - z)) + (p - z) + ep;
        hi = s;
        mag += fabs(p);
    }
    *ret_abs = mag;
    return hi + lo;
}

/* reduce.h's CPU bound for f64: gamma(64 + ceil(log2 n)) sum |terms|, plus the check's own
 * error. */
static double cpu_f64_bound(int64_t n, double exact, double mag)
{
    const double u = ldexp(1, -53);
    double d = 64 + ceil(log2((double)n));
    return d * u / (1 - d * u) * mag * (1 + 1e-9) + u * fabs(exact) +
           4 * (double)n * (double)n * u * u * mag;
}

/* f64 sum and dot on a million random elements of mixed signs and exponents (heavy
 * cancellation), within reduce.h's bound of the exact sum. */
START_TEST(test_sum_and_dot_f64_within_the_stated_bound)
{
    const int64_t n = 1000003;
    double *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    unsigned seed = 31337;
    printf("test_sum_and_dot_f64_within_the_stated_bound: seed %u\n", seed);
    for (int64_t i = 0; i < n; i++) {
        x[i] = ldexp((double)rand_r(&seed) / RAND_MAX - 0.5, rand_r(&seed) % 61 - 30);
        y[i] = ldexp((double)rand_r(&seed) / RAND_MAX - 0.5, rand_r(&seed) % 61 - 30);
    }
    tensor_desc_t d = td(DTYPE_F64, n);
    double got, mag, exact = exact_sum_f64(x, NULL, n, &mag);
    red_run("sum", d, x, d, NULL, &got);
    ck_assert_msg(fabs(got - exact) <= cpu_f64_bound(n, exact, mag), "sum %.17g, exact %.17g", got,
                  exact);
    exact = exact_sum_f64(x, y, n, &mag);
    red_run("dot", d, x, d, y, &got);
    ck_assert_msg(fabs(got - exact) <= cpu_f64_bound(n, exact, mag), "dot %.17g, exact %.17g", got,
                  exact);
    free(x);
    free(y);
}
END_TEST

/* 1 followed by 2^20 - 1 halves of an ulp of 1: a sum in order keeps 1 (each half rounds
 * away), an error of 2^20 u; the stated bound is (64 + 21) u. */
START_TEST(test_sum_f64_keeps_the_small_terms_an_ordered_sum_drops)
{
    const int64_t n = 1 << 20;
    double *x = malloc((size_t)n * sizeof *x);
    x[0] = 1;
    for (int64_t i = 1; i < n; i++)
        x[i] = ldexp(1, -53);
    double got, mag, exact = exact_sum_f64(x, NULL, n, &mag);
    ck_assert(exact == 1 + (double)(n - 1) * ldexp(1, -53));
    red_run("sum", td(DTYPE_F64, n), x, td(DTYPE_F64, n), NULL, &got);
    ck_assert_msg(fabs(got - exact) <= cpu_f64_bound(n, exact, mag), "sum %.17g, exact %.17g", got,
                  exact);
    free(x);
}
END_TEST

START_TEST(test_batch_key_ignores_size_but_not_dtype)
{
    op_call_t a, b, c;
    op_error_t err;
    tensor_desc_t small = td(DTYPE_F32, 3), big = td(DTYPE_F32, 1000, 7);
    ck_assert_int_eq(red_validate_call("sum", NULL, small, small, &a, &err), 0);
    ck_assert_int_eq(red_validate_call("sum", NULL, big, big, &b, &err), 0);
    ck_assert_str_eq(a.batch_key, b.batch_key);
    ck_assert_int_eq(red_validate_call("sum", NULL, td(DTYPE_F64, 3), small, &c, &err), 0);
    ck_assert_str_ne(a.batch_key, c.batch_key);
    ck_assert_int_eq(red_validate_call("dot", NULL, small, small, &c, &err), 0);
    ck_assert_str_ne(a.batch_key, c.batch_key);
    ck_assert(c.cost.bytes == 3 * 4 * 2 + 4);
    ck_assert(c.cost.flops == 6);
}
END_TEST

START_TEST(test_bad_inputs_and_params_name_their_field)
{
    tensor_desc_t f = td(DTYPE_F32, 3);
    expect_error("sum", NULL, td(DTYPE_I8, 3), f, "inputs.x.dtype");
    expect_error("sum", NULL, td(DTYPE_I64, 3), f, "inputs.x.dtype");
    expect_error("dot", NULL, td(DTYPE_U32, 3), td(DTYPE_U32, 3), "inputs.x.dtype");
    expect_error("dot", NULL, f, td(DTYPE_BF16, 3), "inputs.y.dtype");
    expect_error("dot", NULL, f, td(DTYPE_F32, 4), "inputs.y.shape");
    expect_error("dot", NULL, td(DTYPE_F32, 2, 3), td(DTYPE_F32, 3, 2), "inputs.y.shape");
    /* dot never broadcasts, not even a scalar y. */
    expect_error("dot", NULL, f, td(DTYPE_F32), "inputs.y.shape");
    expect_error("sum", "{\"axis\": 0}", f, f, "params.axis");
    expect_error("dot", "{\"alpha\": 1}", f, f, "params.alpha");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels_reduce");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_ops_are_in_the_table);
    tcase_add_test(tc, test_sum_f32_hand_checked_with_scalar_output);
    tcase_add_test(tc, test_sum_i32_accumulates_and_returns_i64);
    tcase_add_test(tc, test_dot_hand_checked_in_every_dtype_class);
    tcase_add_test(tc, test_16_bit_inputs_accumulate_in_f32);
    tcase_add_test(tc, test_empty_inputs_give_zero);
    tcase_add_test(tc, test_sum_f32_is_deterministic_and_accurate_on_a_million_elements);
    tcase_add_test(tc, test_sum_and_dot_f64_within_the_stated_bound);
    tcase_add_test(tc, test_sum_f64_keeps_the_small_terms_an_ordered_sum_drops);
    tcase_add_test(tc, test_batch_key_ignores_size_but_not_dtype);
    tcase_add_test(tc, test_bad_inputs_and_params_name_their_field);
    suite_add_tcase(s, tc);
    return op_test_run_suite(s);
}
