/* CPU tests of add, mul, saxpy: hand-checked results, broadcasting, wrapping, rounding of the
 * 16-bit floats, empty tensors, batch keys, and validation errors with their field paths. */
#include <check.h>
#include <errno.h>
#include <stdint.h>

#include "kernels/elementwise.h"
#include "support/op_test.h"

/* Validates op(x, y) with params (JSON text or NULL); returns validate's result. */
static int ew_validate_call(const char *op, const char *params, tensor_desc_t x, tensor_desc_t y,
                            op_call_t *call, op_error_t *err)
{
    const tensor_desc_t *in[2] = {&x, &y};
    return op_test_validate(op, params, in, 2, call, err);
}

/* Validates and runs on the CPU; out must have room for x's elements. */
static void ew_run(const char *op, const char *params, tensor_desc_t x, const void *xd,
                   tensor_desc_t y, const void *yd, void *out)
{
    const tensor_desc_t *in[2] = {&x, &y};
    op_test_run(op, params, in, (const void *[]){xd, yd}, 2, (void *[]){out});
}

static void expect_error(const char *op, const char *params, tensor_desc_t x, tensor_desc_t y,
                         const char *field)
{
    const tensor_desc_t *in[2] = {&x, &y};
    op_test_expect_error(op, params, in, 2, -EINVAL, field);
}

START_TEST(test_ops_are_in_the_table)
{
    ck_assert_ptr_eq(op_find("add"), &op_add);
    ck_assert_ptr_eq(op_find("mul"), &op_mul);
    ck_assert_ptr_eq(op_find("saxpy"), &op_saxpy);
}
END_TEST

START_TEST(test_add_and_mul_f32_hand_checked)
{
    float x[] = {1, 2, -3}, y[] = {10, 0.5f, 4}, out[3];
    ew_run("add", NULL, td(DTYPE_F32, 3), x, td(DTYPE_F32, 3), y, out);
    ck_assert_float_eq(out[0], 11);
    ck_assert_float_eq(out[1], 2.5f);
    ck_assert_float_eq(out[2], 1);
    ew_run("mul", NULL, td(DTYPE_F32, 3), x, td(DTYPE_F32, 3), y, out);
    ck_assert_float_eq(out[0], 10);
    ck_assert_float_eq(out[1], 1);
    ck_assert_float_eq(out[2], -12);
}
END_TEST

START_TEST(test_saxpy_f64_hand_checked)
{
    double x[] = {1, 2, -4}, y[] = {0.5, -1, 0}, out[3];
    ew_run("saxpy", "{\"a\": 2.5}", td(DTYPE_F64, 3), x, td(DTYPE_F64, 3), y, out);
    ck_assert_double_eq(out[0], 3);
    ck_assert_double_eq(out[1], 4);
    ck_assert_double_eq(out[2], -10);
}
END_TEST

/* a * x rounds before y is added, on the CPU as on CUDA (elementwise.h): with
 * a = x = 1 + 2^-30 and y = -(1 + 2^-29), a * x rounds to 1 + 2^-29 and the result is 0,
 * where a fused a * x + y would give 2^-60. add and mul round once, to nearest even. */
START_TEST(test_saxpy_f64_rounds_product_and_sum_separately)
{
    double x[] = {1 + 0x1p-30, 1, 0x1p-1074}, y[] = {-(1 + 0x1p-29), 0x1p-53, 0}, out[3];
    /* 1 + 2^-30, exactly. */
    ew_run("saxpy", "{\"a\": 1.000000000931322574615478515625}", td(DTYPE_F64, 3), x,
           td(DTYPE_F64, 3), y, out);
    ck_assert_double_eq(out[0], 0);
    ck_assert_double_eq(out[1], 1 + 0x1p-30); /* (1 + 2^-30) + 2^-53: the tie rounds to even */
    ck_assert_double_eq(out[2], 0x1p-1074);   /* the least subnormal times a rounds back to it */
    ew_run("add", NULL, td(DTYPE_F64, 3), x, td(DTYPE_F64, 3), y, out);
    ck_assert_double_eq(out[0], -0x1p-30);
    ck_assert_double_eq(out[1], 1); /* 1 + 2^-53 ties to even */
    ew_run("mul", NULL, td(DTYPE_F64, 3), x, td(DTYPE_F64, 3), y, out);
    ck_assert_double_eq(out[0], -(1 + 0x3p-30)); /* -(1 + 3 2^-30 + 2^-59) rounded */
}
END_TEST

START_TEST(test_i32_arithmetic_wraps_modulo_2_32)
{
    int32_t x[] = {INT32_MAX, 65536, -3}, y[] = {1, 65536, 7}, out[3];
    tensor_desc_t d = td(DTYPE_I32, 3);
    ew_run("add", NULL, d, x, d, y, out);
    ck_assert_int_eq(out[0], INT32_MIN);
    ck_assert_int_eq(out[1], 131072);
    ck_assert_int_eq(out[2], 4);
    ew_run("mul", NULL, d, x, d, y, out);
    ck_assert_int_eq(out[0], INT32_MAX);
    ck_assert_int_eq(out[1], 0); /* 2^32 wraps to 0 */
    ck_assert_int_eq(out[2], -21);
    /* 3 * (2^31 - 1) = 0x17ffffffd, which wraps to 0x7ffffffd. */
    ew_run("saxpy", "{\"a\": 3}", d, x, d, y, out);
    ck_assert_int_eq(out[0], 0x7ffffffd + 1);
    ck_assert_int_eq(out[2], -2);
}
END_TEST

START_TEST(test_saxpy_i32_factor_is_taken_modulo_2_32)
{
    int32_t x[] = {5, -7}, y[] = {1, 1}, out[2];
    tensor_desc_t d = td(DTYPE_I32, 2);
    ew_run("saxpy", "{\"a\": 4294967297}", d, x, d, y, out); /* 2^32 + 1 acts as 1 */
    ck_assert_int_eq(out[0], 6);
    ck_assert_int_eq(out[1], -6);
    ew_run("saxpy", "{\"a\": -2.0}", d, x, d, y, out); /* an integral real is an integer */
    ck_assert_int_eq(out[0], -9);
    ck_assert_int_eq(out[1], 15);
}
END_TEST

START_TEST(test_scalar_y_broadcasts_over_x)
{
    float x[] = {1, 2, 3, 4}, y0 = 10, out[4];
    ew_run("add", NULL, td(DTYPE_F32, 2, 2), x, td(DTYPE_F32), &y0, out);
    for (int i = 0; i < 4; i++)
        ck_assert_float_eq(out[i], x[i] + 10);
    /* A single element of any shape is a scalar too. */
    ew_run("saxpy", "{\"a\": -1}", td(DTYPE_F32, 2, 2), x, td(DTYPE_F32, 1, 1), &y0, out);
    for (int i = 0; i < 4; i++)
        ck_assert_float_eq(out[i], 10 - x[i]);
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(
        ew_validate_call("mul", NULL, td(DTYPE_F32, 2, 2), td(DTYPE_F32, 1), &call, &err), 0);
    ck_assert(tensor_desc_equal(&call.out[0], &call.in[0]));
    ck_assert(OP_PARAMS(&call, ew_params_t)->y_scalar);
}
END_TEST

START_TEST(test_16_bit_floats_compute_in_f32_and_round_once)
{
    /* bf16 has 8 significant bits: 256 + 1 = 257 lies halfway between 256 and 258 and rounds
     * to the even 256; 256 + 3 = 259 rounds to 260. */
    uint16_t x[] = {f32_to_bf16(256), f32_to_bf16(256), f32_to_bf16(1.5f)};
    uint16_t y[] = {f32_to_bf16(1), f32_to_bf16(3), f32_to_bf16(2.25f)}, out[3];
    tensor_desc_t d = td(DTYPE_BF16, 3);
    ew_run("add", NULL, d, x, d, y, out);
    ck_assert_float_eq(bf16_to_f32(out[0]), 256);
    ck_assert_float_eq(bf16_to_f32(out[1]), 260);
    ck_assert_float_eq(bf16_to_f32(out[2]), 3.75f);
    /* a = 1 + 2^-8 is not a bf16 (it would round to 1), but a * x + y is computed in f32:
     * 1.00390625 * 1 - 1 = 2^-8, which is a bf16. */
    uint16_t bx = f32_to_bf16(1), by = f32_to_bf16(-1), bout;
    tensor_desc_t b1 = td(DTYPE_BF16, 1);
    ew_run("saxpy", "{\"a\": 1.00390625}", b1, &bx, b1, &by, &bout);
    ck_assert_float_eq(bf16_to_f32(bout), 0.00390625f);
    /* f16: 0.5 * 2048 + 0.5 = 1024.5 lies halfway between two f16 values and ties to even. */
    uint16_t hx[] = {f32_to_f16(2048), f32_to_f16(3)}, hy[] = {f32_to_f16(0.5f), f32_to_f16(1)};
    uint16_t hout[2];
    tensor_desc_t hd = td(DTYPE_F16, 2);
    ew_run("saxpy", "{\"a\": 0.5}", hd, hx, hd, hy, hout);
    ck_assert_float_eq(f16_to_f32(hout[0]), 1024);
    ck_assert_float_eq(f16_to_f32(hout[1]), 2.5f);
}
END_TEST

START_TEST(test_empty_tensors_validate_and_run)
{
    float dummy = 0;
    const char *ops[] = {"add", "mul", "saxpy"};
    for (int k = 0; k < 3; k++) {
        op_call_t call;
        op_error_t err;
        const char *params = k == 2 ? "{\"a\": 1}" : NULL;
        ck_assert_int_eq(
            ew_validate_call(ops[k], params, td(DTYPE_F32, 0, 5), td(DTYPE_F32, 0, 5), &call, &err),
            0);
        ck_assert_int_eq(call.out[0].ndim, 2);
        ck_assert_int_eq(call.out[0].shape[0], 0);
        ck_assert_int_eq(call.out[0].shape[1], 5);
        ck_assert(call.cost.bytes == 0);
        const void *in[2] = {&dummy, &dummy};
        void *out[1] = {&dummy};
        ck_assert_int_eq(call.op->run_cpu(&call, in, out, &err), 0);
        /* An empty x with a scalar y is fine too. */
        ck_assert_int_eq(
            ew_validate_call(ops[k], params, td(DTYPE_F32, 0), td(DTYPE_F32), &call, &err), 0);
    }
}
END_TEST

START_TEST(test_batch_key_ignores_size_but_not_dtype_or_broadcast)
{
    op_call_t a, b, c, d;
    op_error_t err;
    tensor_desc_t f3 = td(DTYPE_F32, 3), f7 = td(DTYPE_F32, 7, 9);
    ck_assert_int_eq(ew_validate_call("add", NULL, f3, f3, &a, &err), 0);
    ck_assert_int_eq(ew_validate_call("add", NULL, f7, f7, &b, &err), 0);
    ck_assert_str_eq(a.batch_key, b.batch_key);
    ck_assert_int_eq(ew_validate_call("add", NULL, f7, td(DTYPE_F32), &c, &err), 0);
    ck_assert_str_ne(a.batch_key, c.batch_key);
    tensor_desc_t h3 = td(DTYPE_F16, 3);
    ck_assert_int_eq(ew_validate_call("add", NULL, h3, h3, &d, &err), 0);
    ck_assert_str_ne(a.batch_key, d.batch_key);
    ck_assert_int_eq(ew_validate_call("mul", NULL, f3, f3, &d, &err), 0);
    ck_assert_str_ne(a.batch_key, d.batch_key);
    /* saxpy's factor travels per call, so calls with different factors still batch. */
    ck_assert_int_eq(ew_validate_call("saxpy", "{\"a\": 1}", f3, f3, &a, &err), 0);
    ck_assert_int_eq(ew_validate_call("saxpy", "{\"a\": -3}", f7, f7, &b, &err), 0);
    ck_assert_str_eq(a.batch_key, b.batch_key);
}
END_TEST

START_TEST(test_cost_counts_bytes_and_flops)
{
    op_call_t call;
    op_error_t err;
    tensor_desc_t d = td(DTYPE_F32, 1000);
    ck_assert_int_eq(ew_validate_call("saxpy", "{\"a\": 2}", d, d, &call, &err), 0);
    ck_assert(call.cost.bytes == 12000);
    ck_assert(call.cost.flops == 2000);
    ck_assert_int_eq(ew_validate_call("add", NULL, d, td(DTYPE_F32), &call, &err), 0);
    ck_assert(call.cost.bytes == 8004);
}
END_TEST

START_TEST(test_bad_dtypes_name_their_field)
{
    tensor_desc_t f = td(DTYPE_F32, 3);
    expect_error("add", NULL, td(DTYPE_I8, 3), td(DTYPE_I8, 3), "inputs.x.dtype");
    expect_error("mul", NULL, td(DTYPE_U32, 3), td(DTYPE_U32, 3), "inputs.x.dtype");
    expect_error("add", NULL, f, td(DTYPE_F64, 3), "inputs.y.dtype");
    expect_error("saxpy", "{\"a\": 1}", f, td(DTYPE_F16, 3), "inputs.y.dtype");
}
END_TEST

START_TEST(test_mismatched_shapes_name_y_shape)
{
    expect_error("add", NULL, td(DTYPE_F32, 3), td(DTYPE_F32, 4), "inputs.y.shape");
    expect_error("mul", NULL, td(DTYPE_F32, 2, 3), td(DTYPE_F32, 3, 2), "inputs.y.shape");
    expect_error("add", NULL, td(DTYPE_F32, 6), td(DTYPE_F32, 2, 3), "inputs.y.shape");
    /* y is never broadcast the other way round: a larger y is an error. */
    expect_error("add", NULL, td(DTYPE_F32), td(DTYPE_F32, 2), "inputs.y.shape");
    expect_error("saxpy", "{\"a\": 1}", td(DTYPE_I32, 3), td(DTYPE_I32, 0), "inputs.y.shape");
}
END_TEST

START_TEST(test_bad_params_name_their_field)
{
    tensor_desc_t f = td(DTYPE_F32, 3), i = td(DTYPE_I32, 3);
    expect_error("saxpy", NULL, f, f, "params.a");
    expect_error("saxpy", "{}", f, f, "params.a");
    expect_error("saxpy", "{\"a\": null}", f, f, "params.a");
    expect_error("saxpy", "{\"a\": \"two\"}", f, f, "params.a");
    expect_error("saxpy", "{\"a\": [2]}", f, f, "params.a");
    expect_error("saxpy", "{\"a\": 2.5}", i, i, "params.a");
    expect_error("saxpy", "{\"a\": 1e300}", i, i, "params.a");
    expect_error("saxpy", "{\"a\": 1, \"alpha\": 2}", f, f, "params.alpha");
    expect_error("add", "{\"a\": 1}", f, f, "params.a");
    expect_error("mul", "[1]", f, f, "params");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels_elementwise");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, test_ops_are_in_the_table);
    tcase_add_test(tc, test_add_and_mul_f32_hand_checked);
    tcase_add_test(tc, test_saxpy_f64_hand_checked);
    tcase_add_test(tc, test_saxpy_f64_rounds_product_and_sum_separately);
    tcase_add_test(tc, test_i32_arithmetic_wraps_modulo_2_32);
    tcase_add_test(tc, test_saxpy_i32_factor_is_taken_modulo_2_32);
    tcase_add_test(tc, test_scalar_y_broadcasts_over_x);
    tcase_add_test(tc, test_16_bit_floats_compute_in_f32_and_round_once);
    tcase_add_test(tc, test_empty_tensors_validate_and_run);
    tcase_add_test(tc, test_batch_key_ignores_size_but_not_dtype_or_broadcast);
    tcase_add_test(tc, test_cost_counts_bytes_and_flops);
    tcase_add_test(tc, test_bad_dtypes_name_their_field);
    tcase_add_test(tc, test_mismatched_shapes_name_y_shape);
    tcase_add_test(tc, test_bad_params_name_their_field);
    suite_add_tcase(s, tc);
    return op_test_run_suite(s);
}
