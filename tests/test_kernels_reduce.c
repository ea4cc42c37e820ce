/* CPU tests of sum and dot: hand-checked results, the accumulation and output dtypes, empty
 * inputs, determinism and accuracy on a million elements, batch keys, and validation errors
 * with their field paths. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/reduce.h"

static tensor_desc_t desc(dtype_t dt, int ndim, int64_t d0, int64_t d1)
{
    tensor_desc_t d = {.dtype = dt, .ndim = ndim};
    d.shape[0] = d0;
    d.shape[1] = d1;
    return d;
}

/* Validates op on inputs x (and y for dot) with params (JSON text or NULL). */
static int red_validate_call(const char *op, const char *params, tensor_desc_t x, tensor_desc_t y,
                             op_call_t *call, op_error_t *err)
{
    memset(call, 0, sizeof *call);
    memset(err, 0, sizeof *err);
    call->op = op_find(op);
    ck_assert_ptr_nonnull(call->op);
    for (int j = 0; j < call->op->n_inputs; j++) {
        call->in[j] = j == 0 ? x : y;
        call->has_in[j] = true;
    }
    json_error_t jerr;
    json_t *p = params ? json_loads(params, 0, &jerr) : NULL;
    int r = call->op->validate(p, call, err);
    json_decref(p);
    return r;
}

static void red_run(const char *op, tensor_desc_t x, const void *xd, tensor_desc_t y,
                    const void *yd, void *out)
{
    op_call_t call;
    op_error_t err;
    int r = red_validate_call(op, NULL, x, y, &call, &err);
    ck_assert_msg(r == 0, "%s: %s: %s", op, err.field, err.message);
    const void *in[2] = {xd, yd};
    void *outs[1] = {out};
    ck_assert_int_eq(call.op->run_cpu(&call, in, outs, &err), 0);
}

static void expect_error(const char *op, const char *params, tensor_desc_t x, tensor_desc_t y,
                         const char *field)
{
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(red_validate_call(op, params, x, y, &call, &err), -EINVAL);
    ck_assert_str_eq(err.field, field);
    ck_assert(err.message[0] != '\0');
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
    tensor_desc_t d = desc(DTYPE_F32, 2, 1, 5);
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
    tensor_desc_t d = desc(DTYPE_I32, 1, 4, 0);
    ck_assert_int_eq(red_validate_call("sum", NULL, d, d, &call, &err), 0);
    ck_assert_int_eq(call.out[0].dtype, DTYPE_I64);
    red_run("sum", d, x, d, NULL, &out);
    ck_assert_int_eq(out, 2147483648LL); /* 2 * (2^31 - 1) + 2 - 2^31 */
}
END_TEST

START_TEST(test_dot_hand_checked_in_every_dtype_class)
{
    double x[] = {1, 2, 3}, y[] = {4, -5, 6}, out;
    red_run("dot", desc(DTYPE_F64, 1, 3, 0), x, desc(DTYPE_F64, 1, 3, 0), y, &out);
    ck_assert_double_eq(out, 12);
    /* 100000^2 + 3 * 4 overflows i32 but not the i64 accumulator. */
    int32_t xi[] = {100000, 3}, yi[] = {100000, 4};
    int64_t outi;
    red_run("dot", desc(DTYPE_I32, 1, 2, 0), xi, desc(DTYPE_I32, 1, 2, 0), yi, &outi);
    ck_assert_int_eq(outi, 10000000012LL);
    uint16_t xh[] = {f32_to_f16(1.5f), f32_to_f16(-2)}, yh[] = {f32_to_f16(2), f32_to_f16(0.25f)};
    float outf;
    red_run("dot", desc(DTYPE_F16, 1, 2, 0), xh, desc(DTYPE_F16, 1, 2, 0), yh, &outf);
    ck_assert_float_eq(outf, 2.5f);
}
END_TEST

START_TEST(test_16_bit_inputs_accumulate_in_f32)
{
    /* In bf16, 256 + 1 rounds back to 256, so a bf16 accumulator would return 256. */
    uint16_t x[] = {f32_to_bf16(256), f32_to_bf16(1), f32_to_bf16(1)};
    float out = 0;
    tensor_desc_t d = desc(DTYPE_BF16, 1, 3, 0);
    red_run("sum", d, x, d, NULL, &out);
    ck_assert_float_eq(out, 258);
    /* In f16, 2048 + 1 rounds back to 2048. */
    uint16_t h[] = {f32_to_f16(2048), f32_to_f16(1), f32_to_f16(1), f32_to_f16(1)};
    tensor_desc_t hd = desc(DTYPE_F16, 1, 4, 0);
    red_run("sum", hd, h, hd, NULL, &out);
    ck_assert_float_eq(out, 2051);
}
END_TEST

START_TEST(test_empty_inputs_give_zero)
{
    float dummy = 7, out = -1;
    tensor_desc_t d = desc(DTYPE_F32, 2, 3, 0);
    red_run("sum", d, &dummy, d, NULL, &out);
    ck_assert_float_eq(out, 0);
    out = -1;
    red_run("dot", d, &dummy, d, &dummy, &out);
    ck_assert_float_eq(out, 0);
    int64_t outi = -1;
    tensor_desc_t di = desc(DTYPE_I32, 1, 0, 0);
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
    tensor_desc_t d = desc(DTYPE_F32, 1, n, 0);
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

START_TEST(test_batch_key_ignores_size_but_not_dtype)
{
    op_call_t a, b, c;
    op_error_t err;
    tensor_desc_t small = desc(DTYPE_F32, 1, 3, 0), big = desc(DTYPE_F32, 2, 1000, 7);
    ck_assert_int_eq(red_validate_call("sum", NULL, small, small, &a, &err), 0);
    ck_assert_int_eq(red_validate_call("sum", NULL, big, big, &b, &err), 0);
    ck_assert_str_eq(a.batch_key, b.batch_key);
    ck_assert_int_eq(red_validate_call("sum", NULL, desc(DTYPE_F64, 1, 3, 0), small, &c, &err), 0);
    ck_assert_str_ne(a.batch_key, c.batch_key);
    ck_assert_int_eq(red_validate_call("dot", NULL, small, small, &c, &err), 0);
    ck_assert_str_ne(a.batch_key, c.batch_key);
    ck_assert(c.cost.bytes == 3 * 4 * 2 + 4);
    ck_assert(c.cost.flops == 6);
}
END_TEST

START_TEST(test_bad_inputs_and_params_name_their_field)
{
    tensor_desc_t f = desc(DTYPE_F32, 1, 3, 0);
    expect_error("sum", NULL, desc(DTYPE_I8, 1, 3, 0), f, "inputs.x.dtype");
    expect_error("sum", NULL, desc(DTYPE_I64, 1, 3, 0), f, "inputs.x.dtype");
    expect_error("dot", NULL, desc(DTYPE_U32, 1, 3, 0), desc(DTYPE_U32, 1, 3, 0), "inputs.x.dtype");
    expect_error("dot", NULL, f, desc(DTYPE_BF16, 1, 3, 0), "inputs.y.dtype");
    expect_error("dot", NULL, f, desc(DTYPE_F32, 1, 4, 0), "inputs.y.shape");
    expect_error("dot", NULL, desc(DTYPE_F32, 2, 2, 3), desc(DTYPE_F32, 2, 3, 2), "inputs.y.shape");
    /* dot never broadcasts, not even a scalar y. */
    expect_error("dot", NULL, f, desc(DTYPE_F32, 0, 0, 0), "inputs.y.shape");
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
    tcase_add_test(tc, test_batch_key_ignores_size_but_not_dtype);
    tcase_add_test(tc, test_bad_inputs_and_params_name_their_field);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
