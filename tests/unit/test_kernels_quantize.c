/* CPU tests of quantize and dequantize: hand-checked per-tensor and per-channel results with
 * round-to-nearest-even and clamping, given scales, zero channels, NaNs, empty tensors, the
 * quantize -> dequantize round trip, batch keys, and validation errors with their field paths. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/quantize.h"
#include "support/op_test.h"

#define NO_TENSOR ((tensor_desc_t){.ndim = -1})

/* Validates op on its first input t and, when scale.ndim >= 0, a scale input. */
static int q_validate_call(const char *op, const char *params, tensor_desc_t t, tensor_desc_t scale,
                           op_call_t *call, op_error_t *err)
{
    const tensor_desc_t *in[2] = {&t, scale.ndim >= 0 ? &scale : NULL};
    return op_test_validate(op, params, in, 2, call, err);
}

/* quantize x (with the given scale when scale_in is not NULL) into q and scale_out. */
static void quantize(const char *params, tensor_desc_t x, const void *xd, tensor_desc_t s,
                     const float *scale_in, int8_t *q, float *scale_out)
{
    const tensor_desc_t *in[2] = {&x, scale_in ? &s : NULL};
    op_test_run("quantize", params, in, (const void *[]){xd, scale_in}, 2,
                (void *[]){q, scale_out});
}

static void dequantize(const char *params, tensor_desc_t q, const int8_t *qd, tensor_desc_t s,
                       const float *scale, float *out)
{
    const tensor_desc_t *in[2] = {&q, &s};
    op_test_run("dequantize", params, in, (const void *[]){qd, scale}, 2, (void *[]){out});
}

static void expect_error(const char *op, const char *params, tensor_desc_t t, tensor_desc_t s,
                         const char *field)
{
    const tensor_desc_t *in[2] = {&t, s.ndim >= 0 ? &s : NULL};
    op_test_expect_error(op, params, in, 2, -EINVAL, field);
}

START_TEST(test_ops_are_in_the_table)
{
    ck_assert_ptr_eq(op_find("quantize"), &op_quantize);
    ck_assert_ptr_eq(op_find("dequantize"), &op_dequantize);
}
END_TEST

START_TEST(test_quantize_per_tensor_rounds_half_to_even)
{
    /* max |x| = 127 gives scale 1, so q = rne(x): halves go to the even neighbour. */
    float x[] = {0, 1, -2, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -127, 126.6f};
    int8_t q[10];
    float scale = 0;
    op_call_t call;
    op_error_t err;
    tensor_desc_t d = td(DTYPE_F32, 10);
    ck_assert_int_eq(q_validate_call("quantize", NULL, d, NO_TENSOR, &call, &err), 0);
    ck_assert_int_eq(call.n_out, 2);
    ck_assert_str_eq(call.out_names[0], "q");
    ck_assert_str_eq(call.out_names[1], "scale");
    ck_assert_int_eq(call.out[0].dtype, DTYPE_I8);
    ck_assert_int_eq(call.out[0].shape[0], 10);
    ck_assert_int_eq(call.out[1].dtype, DTYPE_F32);
    ck_assert_int_eq(call.out[1].ndim, 0);
    quantize(NULL, d, x, d, NULL, q, &scale);
    ck_assert_float_eq(scale, 1);
    int8_t want[] = {0, 1, -2, 0, 2, 2, 0, -2, -127, 127};
    ck_assert_mem_eq(q, want, sizeof want);
}
END_TEST

START_TEST(test_quantize_scale_is_max_abs_over_127)
{
    float x[] = {254, -3, 1, -254, 5};
    int8_t q[5];
    float scale = 0;
    tensor_desc_t d = td(DTYPE_F32, 5);
    quantize(NULL, d, x, d, NULL, q, &scale);
    ck_assert_float_eq(scale, 2);
    int8_t want[] = {127, -2, 0, -127, 2}; /* -1.5 -> -2, 0.5 -> 0, 2.5 -> 2 */
    ck_assert_mem_eq(q, want, sizeof want);
}
END_TEST

START_TEST(test_quantize_with_given_scale_clamps_and_copies_scale)
{
    float x[] = {1, 100, -100, 0.25f, 0.75f}, s = 0.5f, scale_out = 0;
    int8_t q[5];
    tensor_desc_t d = td(DTYPE_F32, 5);
    quantize(NULL, d, x, td(DTYPE_F32), &s, q, &scale_out);
    ck_assert_float_eq(scale_out, 0.5f);
    int8_t want[] = {2, 127, -127, 0, 2}; /* 200 and -200 clamp; 0.5 -> 0; 1.5 -> 2 */
    ck_assert_mem_eq(q, want, sizeof want);
}
END_TEST

START_TEST(test_quantize_per_channel_along_first_and_last_axis)
{
    /* axis 0 of [2, 3]: row 0 has max 254 (scale 2), row 1 is all zero (scale 1, q 0). */
    float x[] = {254, -3, 5, 0, 0, 0};
    int8_t q[6];
    float scale[2] = {0};
    tensor_desc_t d = td(DTYPE_F32, 2, 3);
    quantize("{\"axis\": 0}", d, x, d, NULL, q, scale);
    ck_assert_float_eq(scale[0], 2);
    ck_assert_float_eq(scale[1], 1);
    int8_t want0[] = {127, -2, 2, 0, 0, 0};
    ck_assert_mem_eq(q, want0, sizeof want0);
    /* axis -1 of [2, 2]: column 0 has max 254 (scale 2), column 1 max 127 (scale 1). */
    float y[] = {254, -127, 3, 0.4f};
    float scale_c[2];
    tensor_desc_t e = td(DTYPE_F32, 2, 2);
    quantize("{\"axis\": -1}", e, y, e, NULL, q, scale_c);
    ck_assert_float_eq(scale_c[0], 2);
    ck_assert_float_eq(scale_c[1], 1);
    int8_t want1[] = {127, -127, 2, 0};
    ck_assert_mem_eq(q, want1, sizeof want1);
}
END_TEST

START_TEST(test_quantize_per_channel_along_a_middle_axis)
{
    /* [2, 2, 2] along axis 1: channel c holds x[o][c][k] for all o, k. */
    float x[] = {1, -2, 127, 0, 3, 4, -63.5f, 8};
    int8_t q[8];
    float scale[2];
    tensor_desc_t d = td(DTYPE_F32, 2, 2, 2);
    quantize("{\"axis\": 1}", d, x, d, NULL, q, scale);
    ck_assert_float_eq(scale[0], 4.0f / 127); /* max of 1, -2, 3, 4 */
    ck_assert_float_eq(scale[1], 1);          /* max of 127, 0, -63.5, 8 */
    ck_assert_int_eq(q[2], 127);
    ck_assert_int_eq(q[6], -64); /* -63.5 ties to even */
    ck_assert_int_eq(q[5], 127); /* 4 / (4 / 127) */
    ck_assert_int_eq(q[0], 32);  /* 31.75 */
}
END_TEST

START_TEST(test_quantize_f16_and_bf16_inputs)
{
    uint16_t h[] = {f32_to_f16(127), f32_to_f16(-63.5f), f32_to_f16(2.5f)};
    int8_t q[3];
    float scale;
    tensor_desc_t d = td(DTYPE_F16, 3);
    quantize(NULL, d, h, d, NULL, q, &scale);
    ck_assert_float_eq(scale, 1);
    int8_t want[] = {127, -64, 2};
    ck_assert_mem_eq(q, want, sizeof want);
    uint16_t b[] = {f32_to_bf16(-254), f32_to_bf16(3)};
    tensor_desc_t bd = td(DTYPE_BF16, 2);
    quantize(NULL, bd, b, bd, NULL, q, &scale);
    ck_assert_float_eq(scale, 2);
    ck_assert_int_eq(q[0], -127);
    ck_assert_int_eq(q[1], 2);
}
END_TEST

START_TEST(test_quantize_ignores_nan_in_max_and_maps_it_to_zero)
{
    float x[] = {NAN, 127, -1, INFINITY};
    int8_t q[4];
    float scale;
    tensor_desc_t d = td(DTYPE_F32, 3);
    quantize(NULL, d, x, d, NULL, q, &scale);
    ck_assert_float_eq(scale, 1);
    int8_t want[] = {0, 127, -1};
    ck_assert_mem_eq(q, want, sizeof want);
    /* An infinite scale (from an infinite max) quantizes finite values to 0. */
    tensor_desc_t d4 = td(DTYPE_F32, 4);
    quantize(NULL, d4, x, d4, NULL, q, &scale);
    ck_assert(isinf(scale));
    ck_assert_int_eq(q[1], 0);
    ck_assert_int_eq(q[3], 0); /* inf / inf is NaN */
}
END_TEST

START_TEST(test_quantize_empty_tensors_still_write_the_scale)
{
    float dummy = 0, scale = 0;
    int8_t q = 0;
    tensor_desc_t d = td(DTYPE_F32, 0);
    quantize(NULL, d, &dummy, d, NULL, &q, &scale);
    ck_assert_float_eq(scale, 1);
    /* [0, 3] per channel along axis 1: three empty channels, each of scale 1. */
    float scales[3] = {0};
    tensor_desc_t e = td(DTYPE_F32, 0, 3);
    quantize("{\"axis\": 1}", e, &dummy, e, NULL, &q, scales);
    for (int c = 0; c < 3; c++)
        ck_assert_float_eq(scales[c], 1);
    float out = 0;
    int8_t qd = 0;
    dequantize(NULL, td(DTYPE_I8, 0), &qd, td(DTYPE_F32), &scale, &out);
}
END_TEST

START_TEST(test_dequantize_hand_checked)
{
    int8_t q[] = {-127, 0, 5, 1};
    float s = 0.5f, out[4];
    dequantize(NULL, td(DTYPE_I8, 4), q, td(DTYPE_F32), &s, out);
    ck_assert_float_eq(out[0], -63.5f);
    ck_assert_float_eq(out[1], 0);
    ck_assert_float_eq(out[2], 2.5f);
    ck_assert_float_eq(out[3], 0.5f);
    float sc[] = {1, 2};
    dequantize("{\"axis\": 1}", td(DTYPE_I8, 2, 2), q, td(DTYPE_F32, 2), sc, out);
    ck_assert_float_eq(out[0], -127);
    ck_assert_float_eq(out[1], 0);
    ck_assert_float_eq(out[2], 5);
    ck_assert_float_eq(out[3], 2);
}
END_TEST

/* Checks |dequantize(quantize(x)) - x| <= scale / 2 for every element of x viewed as
 * [outer, channels, inner]; the f32 rounding of x / scale and q * scale may add an ulp. */
static void check_round_trip(const char *params, tensor_desc_t d, int64_t channels, int64_t inner)
{
    int64_t n = tensor_desc_numel(&d);
    float *x = malloc((size_t)n * sizeof *x), *back = malloc((size_t)n * sizeof *x);
    int8_t *q = malloc((size_t)n);
    float *scale = malloc((size_t)channels * sizeof *scale);
    uint32_t seed = 7;
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 20.0f;
    }
    quantize(params, d, x, d, NULL, q, scale);
    tensor_desc_t sd = {.dtype = DTYPE_F32, .ndim = params ? 1 : 0, .shape = {channels}};
    tensor_desc_t qd = d;
    qd.dtype = DTYPE_I8;
    dequantize(params, qd, q, sd, scale, back);
    for (int64_t i = 0; i < n; i++) {
        float s = scale[(i / inner) % channels];
        float bound = s / 2 + 4 * fabsf(x[i]) * 1.2e-7f;
        ck_assert_msg(fabsf(back[i] - x[i]) <= bound, "element %lld: %g -> %d -> %g (scale %g)",
                      (long long)i, x[i], q[i], back[i], s);
    }
    free(x);
    free(back);
    free(q);
    free(scale);
}

START_TEST(test_round_trip_error_is_at_most_half_a_scale)
{
    check_round_trip(NULL, td(DTYPE_F32, 10007), 1, 10007);
    check_round_trip("{\"axis\": 1}", td(DTYPE_F32, 8, 16, 5), 16, 5);
    check_round_trip("{\"axis\": 0}", td(DTYPE_F32, 9, 100), 9, 100);
    check_round_trip("{\"axis\": 1}", td(DTYPE_F32, 100, 9), 9, 1);
}
END_TEST

START_TEST(test_batch_keys_separate_layout_and_scale_source)
{
    op_call_t a, b, c;
    op_error_t err;
    tensor_desc_t small = td(DTYPE_F32, 3), big = td(DTYPE_F32, 100, 7);
    tensor_desc_t s0 = td(DTYPE_F32);
    ck_assert_int_eq(q_validate_call("quantize", NULL, small, NO_TENSOR, &a, &err), 0);
    ck_assert_int_eq(q_validate_call("quantize", NULL, big, NO_TENSOR, &b, &err), 0);
    ck_assert_str_eq(a.batch_key, b.batch_key);
    ck_assert_int_eq(q_validate_call("quantize", NULL, small, s0, &c, &err), 0);
    ck_assert_str_ne(a.batch_key, c.batch_key);
    ck_assert_int_eq(q_validate_call("quantize", "{\"axis\": 0}", big, NO_TENSOR, &c, &err), 0);
    ck_assert_str_ne(b.batch_key, c.batch_key);
    ck_assert_int_eq(c.out[1].ndim, 1);
    ck_assert_int_eq(c.out[1].shape[0], 100);
    /* Without a scale, x is read twice. */
    ck_assert(a.cost.bytes == 2 * 3 * 4 + 3 + 4);
}
END_TEST

START_TEST(test_bad_inputs_and_params_name_their_field)
{
    tensor_desc_t x = td(DTYPE_F32, 4, 3), q = td(DTYPE_I8, 4, 3);
    tensor_desc_t s0 = td(DTYPE_F32);
    expect_error("quantize", NULL, td(DTYPE_I32, 3), NO_TENSOR, "inputs.x.dtype");
    expect_error("quantize", NULL, td(DTYPE_F64, 3), NO_TENSOR, "inputs.x.dtype");
    expect_error("quantize", "{\"axis\": 2}", x, NO_TENSOR, "params.axis");
    expect_error("quantize", "{\"axis\": -3}", x, NO_TENSOR, "params.axis");
    expect_error("quantize", "{\"axis\": \"0\"}", x, NO_TENSOR, "params.axis");
    expect_error("quantize", "{\"axis\": 0.5}", x, NO_TENSOR, "params.axis");
    expect_error("quantize", "{\"axis\": 0}", td(DTYPE_F32), NO_TENSOR, "params.axis");
    expect_error("quantize", "{\"per_channel\": true}", x, NO_TENSOR, "params.per_channel");
    expect_error("quantize", NULL, x, td(DTYPE_F16), "inputs.scale.dtype");
    expect_error("quantize", NULL, x, td(DTYPE_F32, 1), "inputs.scale.shape");
    expect_error("quantize", "{\"axis\": 1}", x, s0, "inputs.scale.shape");
    expect_error("quantize", "{\"axis\": 1}", x, td(DTYPE_F32, 4), "inputs.scale.shape");
    expect_error("dequantize", NULL, x, s0, "inputs.q.dtype");
    expect_error("dequantize", NULL, q, td(DTYPE_I32), "inputs.scale.dtype");
    expect_error("dequantize", "{\"axis\": 0}", q, td(DTYPE_F32, 3), "inputs.scale.shape");
    expect_error("dequantize", "{\"axis\": 0}", q, td(DTYPE_F32, 4, 1), "inputs.scale.shape");
    expect_error("dequantize", "{\"axis\": 5}", q, td(DTYPE_F32, 4), "params.axis");
    expect_error("dequantize", "{\"scale\": 1}", q, s0, "params.scale");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels_quantize");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, test_ops_are_in_the_table);
    tcase_add_test(tc, test_quantize_per_tensor_rounds_half_to_even);
    tcase_add_test(tc, test_quantize_scale_is_max_abs_over_127);
    tcase_add_test(tc, test_quantize_with_given_scale_clamps_and_copies_scale);
    tcase_add_test(tc, test_quantize_per_channel_along_first_and_last_axis);
    tcase_add_test(tc, test_quantize_per_channel_along_a_middle_axis);
    tcase_add_test(tc, test_quantize_f16_and_bf16_inputs);
    tcase_add_test(tc, test_quantize_ignores_nan_in_max_and_maps_it_to_zero);
    tcase_add_test(tc, test_quantize_empty_tensors_still_write_the_scale);
    tcase_add_test(tc, test_dequantize_hand_checked);
    tcase_add_test(tc, test_round_trip_error_is_at_most_half_a_scale);
    tcase_add_test(tc, test_batch_keys_separate_layout_and_scale_source);
    tcase_add_test(tc, test_bad_inputs_and_params_name_their_field);
    suite_add_tcase(s, tc);
    return op_test_run_suite(s);
}
