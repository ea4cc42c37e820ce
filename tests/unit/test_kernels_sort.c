/* The sort op on the CPU: validation, hand-checked orders (floats' special values, ties,
 * descending, rows) and properties on random inputs (ordered, a permutation, stable). */
#include <check.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/sort.h"
#include "kernels/op.h"
#include "support/op_test.h"

/* Validates a sort call; returns validate's result, the call and error filled. */
static int sort_call(op_call_t *call, const tensor_desc_t *keys, const tensor_desc_t *values,
                     const char *params_json, op_error_t *err)
{
    const tensor_desc_t *in[2] = {keys, values};
    int r = op_test_validate("sort", params_json, in, 2, call, err);
    ck_assert_ptr_eq(call->op, &op_sort); /* registered in the table */
    return r;
}

/* Validates and runs on the CPU; outputs are poisoned first so unwritten elements show. */
static void sort_run(const tensor_desc_t *keys, const void *key_data, const tensor_desc_t *values,
                     const void *value_data, const char *params_json, void *out0, void *out1)
{
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(sort_call(&call, keys, values, params_json, &err), 0);
    op_test_run_call(&call, (const void *[]){key_data, value_data}, (void *[]){out0, out1});
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static uint64_t f64_bits(double f)
{
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static double f64_of_bits(uint64_t u)
{
    double f;
    memcpy(&f, &u, sizeof f);
    return f;
}

START_TEST(test_sort_u32_ascending_and_argsort_hand_checked)
{
    tensor_desc_t k = td(DTYPE_U32, 5);
    uint32_t keys[5] = {3, 1, 4000000000u, 1, 0};
    uint32_t out[5];
    int64_t idx[5];
    sort_run(&k, keys, NULL, NULL, "{\"argsort\": true}", out, idx);
    uint32_t want[5] = {0, 1, 1, 3, 4000000000u};
    int64_t want_idx[5] = {4, 1, 3, 0, 2};
    for (int i = 0; i < 5; i++) {
        ck_assert_uint_eq(out[i], want[i]);
        ck_assert_int_eq(idx[i], want_idx[i]);
    }
}
END_TEST

/* -inf < negatives < -0.0 < +0.0 < positives < +inf, NaN last in both directions and
 * canonical; argsort shows which NaN went where (input order: stable). */
START_TEST(test_sort_f32_special_values_order_both_directions)
{
    float nan_neg = -NAN, nan_pos = NAN;
    uint32_t payload_nan = 0x7f800001u; /* a signalling NaN with a payload */
    float keys[9] = {nan_pos, 1.0f, -0.0f, INFINITY, -INFINITY, 0.0f, -2.0f, nan_neg, 0};
    memcpy(&keys[8], &payload_nan, 4);
    tensor_desc_t k = td(DTYPE_F32, 9);
    float out[9];
    int64_t idx[9];

    sort_run(&k, keys, NULL, NULL, "{\"argsort\": true}", out, idx);
    int64_t want_asc[9] = {4, 6, 2, 5, 1, 3, 0, 7, 8};
    for (int i = 0; i < 9; i++)
        ck_assert_int_eq(idx[i], want_asc[i]);
    ck_assert_uint_eq(f32_bits(out[2]), 0x80000000u); /* -0.0 before +0.0 */
    ck_assert_uint_eq(f32_bits(out[3]), 0x00000000u);
    ck_assert(out[0] == -INFINITY && out[1] == -2.0f && out[4] == 1.0f && out[5] == INFINITY);
    for (int i = 6; i < 9; i++)
        ck_assert_uint_eq(f32_bits(out[i]), 0x7fc00000u);

    sort_run(&k, keys, NULL, NULL, "{\"argsort\": true, \"descending\": true}", out, idx);
    int64_t want_desc[9] = {3, 1, 5, 2, 6, 4, 0, 7, 8};
    for (int i = 0; i < 9; i++)
        ck_assert_int_eq(idx[i], want_desc[i]);
    ck_assert_uint_eq(f32_bits(out[2]), 0x00000000u); /* +0.0 before -0.0 */
    ck_assert_uint_eq(f32_bits(out[3]), 0x80000000u);
    for (int i = 6; i < 9; i++)
        ck_assert_uint_eq(f32_bits(out[i]), 0x7fc00000u);
}
END_TEST

/* f64 keys order as f32 keys do: -inf < negatives < -0.0 < +0.0 < positives < +inf, NaNs last
 * in both directions, in input order, and canonical; subnormals, the largest finite values
 * and neighbours one ulp apart (which f32 could not tell apart) all in their places. */
START_TEST(test_sort_f64_special_values_order_both_directions)
{
    const double one_up = nextafter(1.0, 2.0), one_down = nextafter(1.0, 0.0);
    double keys[16] = {NAN, 1.0,    -0.0,    INFINITY, -INFINITY, 0.0, -2.0,   -NAN,
                       0,   5e-324, -5e-324, DBL_MAX,  -DBL_MAX,  1.0, one_up, one_down};
    keys[8] = f64_of_bits(0x7ff0000000000001ull); /* a signalling NaN with a payload */
    tensor_desc_t k = td(DTYPE_F64, 16);
    double out[16];
    int64_t idx[16];

    sort_run(&k, keys, NULL, NULL, "{\"argsort\": true}", out, idx);
    const int64_t want_asc[16] = {4, 12, 6, 10, 2, 5, 9, 15, 1, 13, 14, 11, 3, 0, 7, 8};
    for (int i = 0; i < 16; i++) {
        ck_assert_msg(idx[i] == want_asc[i], "ascending [%d]: index %lld, want %lld", i,
                      (long long)idx[i], (long long)want_asc[i]);
        if (i < 13)
            ck_assert_uint_eq(f64_bits(out[i]), f64_bits(keys[want_asc[i]]));
        else
            ck_assert_uint_eq(f64_bits(out[i]), 0x7ff8000000000000ull);
    }

    sort_run(&k, keys, NULL, NULL, "{\"argsort\": true, \"descending\": true}", out, idx);
    const int64_t want_desc[16] = {3, 11, 14, 1, 13, 15, 9, 5, 2, 10, 6, 12, 4, 0, 7, 8};
    for (int i = 0; i < 16; i++) {
        ck_assert_msg(idx[i] == want_desc[i], "descending [%d]: index %lld, want %lld", i,
                      (long long)idx[i], (long long)want_desc[i]);
        if (i < 13)
            ck_assert_uint_eq(f64_bits(out[i]), f64_bits(keys[want_desc[i]]));
        else
            ck_assert_uint_eq(f64_bits(out[i]), 0x7ff8000000000000ull);
    }
    ck_assert_uint_eq(f64_bits(out[7]), 0x0000000000000000ull); /* +0.0 before -0.0 */
    ck_assert_uint_eq(f64_bits(out[8]), 0x8000000000000000ull);
}
END_TEST

/* f64 keys with values of each size and as rows: values follow their keys, keys-only equals
 * argsort's keys. */
START_TEST(test_sort_f64_rows_with_values)
{
    tensor_desc_t k = td(DTYPE_F64, 2, 4);
    double keys[8] = {0.5, -1e300, 0.5, 1e-300, 3, -0.0, 0.0, -3};
    double out[8];
    tensor_desc_t v = td(DTYPE_F64, 2, 4);
    double vals[8] = {10, 11, 12, 13, 20, 21, 22, 23}, out_vals[8];
    sort_run(&k, keys, &v, vals, "{\"descending\": true}", out, out_vals);
    const double want[8] = {0.5, 0.5, 1e-300, -1e300, 3, 0.0, -0.0, -3};
    const double want_vals[8] = {10, 12, 13, 11, 20, 22, 21, 23};
    for (int i = 0; i < 8; i++) {
        ck_assert_uint_eq(f64_bits(out[i]), f64_bits(want[i]));
        ck_assert(out_vals[i] == want_vals[i]);
    }
    tensor_desc_t v8 = td(DTYPE_I8, 2, 4);
    int8_t bytes[8] = {0, 1, 2, 3, 4, 5, 6, 7}, out_bytes[8];
    sort_run(&k, keys, &v8, bytes, NULL, out, out_bytes);
    const int8_t want_bytes[8] = {1, 3, 0, 2, 7, 5, 6, 4};
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(out_bytes[i], want_bytes[i]);
}
END_TEST

START_TEST(test_sort_descending_argsort_keeps_ties_in_input_order)
{
    tensor_desc_t k = td(DTYPE_I32, 6);
    int32_t keys[6] = {2, 1, 2, 1, 2, 3};
    int32_t out[6];
    int64_t idx[6];
    sort_run(&k, keys, NULL, NULL, "{\"argsort\": true, \"descending\": true}", out, idx);
    int32_t want[6] = {3, 2, 2, 2, 1, 1};
    int64_t want_idx[6] = {5, 0, 2, 4, 1, 3};
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(out[i], want[i]);
        ck_assert_int_eq(idx[i], want_idx[i]);
    }
}
END_TEST

START_TEST(test_sort_signed_extremes_i32_and_i64)
{
    tensor_desc_t k32 = td(DTYPE_I32, 5);
    int32_t keys32[5] = {-5, 3, INT32_MIN, INT32_MAX, 0};
    int32_t out32[5];
    sort_run(&k32, keys32, NULL, NULL, NULL, out32, NULL);
    int32_t want32[5] = {INT32_MIN, -5, 0, 3, INT32_MAX};
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(out32[i], want32[i]);

    tensor_desc_t k64 = td(DTYPE_I64, 5);
    int64_t keys64[5] = {-1, INT64_MAX, 5000000000ll, INT64_MIN, 0};
    int64_t out64[5];
    sort_run(&k64, keys64, NULL, NULL, "{\"descending\": true}", out64, NULL);
    int64_t want64[5] = {INT64_MAX, 5000000000ll, 0, -1, INT64_MIN};
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(out64[i], want64[i]);
}
END_TEST

START_TEST(test_sort_rows_are_sorted_independently)
{
    tensor_desc_t k = td(DTYPE_I32, 2, 1, 3);
    int32_t keys[6] = {3, 2, 1, 0, -1, 5};
    int32_t out[6];
    int64_t idx[6];
    sort_run(&k, keys, NULL, NULL, "{\"argsort\": true}", out, idx);
    int32_t want[6] = {1, 2, 3, -1, 0, 5};
    int64_t want_idx[6] = {2, 1, 0, 1, 0, 2};
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(out[i], want[i]);
        ck_assert_int_eq(idx[i], want_idx[i]);
    }
}
END_TEST

START_TEST(test_sort_values_of_every_size_follow_their_keys)
{
    tensor_desc_t k = td(DTYPE_U32, 2, 3);
    uint32_t keys[6] = {30, 10, 20, 5, 5, 1};
    uint32_t out_keys[6];
    /* f64 (8 bytes), f32 (4), bf16 (2) and i8 (1): each size has its own path on CUDA. */
    const dtype_t dts[4] = {DTYPE_F64, DTYPE_F32, DTYPE_BF16, DTYPE_I8};
    const double in_vals[6] = {3, 1, 2, -5, -6, 7};
    const double want[6] = {1, 2, 3, 7, -5, -6};
    for (int t = 0; t < 4; t++) {
        tensor_desc_t v = td(dts[t], 2, 3);
        unsigned char vals[48], out_vals[48];
        for (int i = 0; i < 6; i++)
            tensor_store(dts[t], vals, i, in_vals[i]);
        sort_run(&k, keys, &v, vals, NULL, out_keys, out_vals);
        for (int i = 0; i < 6; i++)
            ck_assert_msg(tensor_load(dts[t], out_vals, i) == want[i], "%s value %d: %g != %g",
                          dtype_name(dts[t]), i, tensor_load(dts[t], out_vals, i), want[i]);
    }
    uint32_t want_keys[6] = {10, 20, 30, 1, 5, 5};
    for (int i = 0; i < 6; i++)
        ck_assert_uint_eq(out_keys[i], want_keys[i]);
}
END_TEST

START_TEST(test_sort_scalar_and_empty_keys)
{
    tensor_desc_t scalar = td(DTYPE_F32);
    float key = -3.5f, out = 0;
    int64_t idx = -1;
    sort_run(&scalar, &key, NULL, NULL, "{\"argsort\": true}", &out, &idx);
    ck_assert(out == -3.5f);
    ck_assert_int_eq(idx, 0);

    const int64_t shapes[2][2] = {{0, 0}, {3, 0}};
    for (int s = 0; s < 2; s++) {
        tensor_desc_t k = op_test_desc(DTYPE_I64, s + 1, shapes[s]);
        op_call_t call;
        op_error_t err;
        ck_assert_int_eq(sort_call(&call, &k, NULL, "{\"argsort\": true}", &err), 0);
        ck_assert_int_eq(call.n_out, 2);
        ck_assert_int_eq(tensor_desc_numel(&call.out[1]), 0);
        const void *in[2] = {NULL, NULL};
        void *outp[2] = {NULL, NULL};
        ck_assert_int_eq(call.op->run_cpu(&call, in, outp, &err), 0);
    }
}
END_TEST

START_TEST(test_sort_outputs_and_batch_key)
{
    tensor_desc_t k = td(DTYPE_F32, 4, 7);
    tensor_desc_t k2 = td(DTYPE_F32, 100);
    tensor_desc_t v = td(DTYPE_I8, 4, 7);
    op_call_t a, b, c;
    op_error_t err;
    ck_assert_int_eq(sort_call(&a, &k, NULL, "{\"argsort\": true}", &err), 0);
    ck_assert_int_eq(a.n_out, 2);
    ck_assert_str_eq(a.out_names[0], "keys");
    ck_assert_str_eq(a.out_names[1], "indices");
    ck_assert_int_eq(a.out[1].dtype, DTYPE_I64);
    ck_assert(tensor_desc_equal(&a.out[0], &k));
    /* Other sizes batch together (segmented sort); another direction does not. */
    ck_assert_int_eq(sort_call(&b, &k2, NULL, "{\"argsort\": true}", &err), 0);
    ck_assert_str_eq(a.batch_key, b.batch_key);
    ck_assert_int_eq(sort_call(&b, &k2, NULL, "{\"argsort\": true, \"descending\": true}", &err),
                     0);
    ck_assert_str_ne(a.batch_key, b.batch_key);
    ck_assert_int_eq(sort_call(&c, &k, &v, NULL, &err), 0);
    ck_assert_int_eq(c.n_out, 2);
    ck_assert_str_eq(c.out_names[1], "values");
    ck_assert_int_eq(c.out[1].dtype, DTYPE_I8);
    ck_assert_str_ne(a.batch_key, c.batch_key);
    ck_assert(c.cost.bytes > 0);
}
END_TEST

static void expect_error(const tensor_desc_t *keys, const tensor_desc_t *values, const char *params,
                         int code, const char *field)
{
    op_test_expect_error("sort", params, (const tensor_desc_t *[]){keys, values}, 2, code, field);
}

START_TEST(test_sort_rejects_bad_input_naming_the_field)
{
    tensor_desc_t k = td(DTYPE_U32, 2, 3);
    tensor_desc_t f16 = td(DTYPE_F16, 2, 3);
    tensor_desc_t i8 = td(DTYPE_I8, 3);
    tensor_desc_t v_wrong = td(DTYPE_F32, 3, 2);
    tensor_desc_t v_rank = td(DTYPE_F32, 6);
    tensor_desc_t v_ok = td(DTYPE_F32, 2, 3);
    tensor_desc_t huge = td(DTYPE_U32, 1 << 20, 1 << 13);
    expect_error(&f16, NULL, NULL, -EINVAL, "inputs.keys.dtype");
    expect_error(&i8, NULL, NULL, -EINVAL, "inputs.keys.dtype");
    expect_error(&k, &v_wrong, NULL, -EINVAL, "inputs.values.shape");
    expect_error(&k, &v_rank, NULL, -EINVAL, "inputs.values.shape");
    expect_error(&k, &v_ok, "{\"argsort\": true}", -EINVAL, "params.argsort");
    expect_error(&k, NULL, "{\"descending\": 1}", -EINVAL, "params.descending");
    expect_error(&k, NULL, "{\"argsort\": \"yes\"}", -EINVAL, "params.argsort");
    expect_error(&k, NULL, "{\"axis\": 0}", -EINVAL, "params.axis");
    expect_error(&k, NULL, "[1]", -EINVAL, "params");
    expect_error(&huge, NULL, NULL, -E2BIG, "inputs.keys.shape");
}
END_TEST

/* ------------------------------------------------------------------ properties */

/* Whether key i is a NaN (floats only). */
static bool key_is_nan(dtype_t dt, const void *keys, int64_t i)
{
    if (dt == DTYPE_F32) return isnan(((const float *)keys)[i]);
    if (dt == DTYPE_F64) return isnan(((const double *)keys)[i]);
    return false;
}

/* The promised total order, written independently of the kernels' order keys: -1, 0, 1. */
static int order_cmp(dtype_t dt, const void *keys, int64_t i, int64_t j)
{
    switch (dt) {
    case DTYPE_F64: {
        double a = ((const double *)keys)[i], b = ((const double *)keys)[j];
        if (isnan(a) || isnan(b)) return (isnan(a) != 0) - (isnan(b) != 0);
        if (a == b) return (signbit(b) != 0) - (signbit(a) != 0); /* -0.0 < +0.0 */
        return a < b ? -1 : 1;
    }
    case DTYPE_F32: {
        float a = ((const float *)keys)[i], b = ((const float *)keys)[j];
        if (isnan(a) || isnan(b)) return (isnan(a) != 0) - (isnan(b) != 0);
        if (a == b) return (signbit(b) != 0) - (signbit(a) != 0); /* -0.0 < +0.0 */
        return a < b ? -1 : 1;
    }
    case DTYPE_I32: {
        int32_t a = ((const int32_t *)keys)[i], b = ((const int32_t *)keys)[j];
        return (a > b) - (a < b);
    }
    case DTYPE_U32: {
        uint32_t a = ((const uint32_t *)keys)[i], b = ((const uint32_t *)keys)[j];
        return (a > b) - (a < b);
    }
    default: {
        int64_t a = ((const int64_t *)keys)[i], b = ((const int64_t *)keys)[j];
        return (a > b) - (a < b);
    }
    }
}

/* Random keys with many ties (a small range) and, for floats, NaNs and signed zeros. */
static void fill_keys(dtype_t dt, void *keys, int64_t n, unsigned *seed)
{
    for (int64_t i = 0; i < n; i++) {
        int r = rand_r(seed) % 41 - 20;
        switch (dt) {
        case DTYPE_F32: {
            float f = (float)r / 4;
            int pick = rand_r(seed) % 16;
            if (pick == 0) f = NAN;
            if (pick == 1) f = -NAN;
            if (pick == 2) f = -0.0f;
            if (pick == 3) f = (rand_r(seed) & 1) ? INFINITY : -INFINITY;
            ((float *)keys)[i] = f;
            break;
        }
        case DTYPE_F64: {
            /* Quarters, and neighbours of them an ulp or two away: f32's order keys would tie
             * these. */
            double f = (double)r / 4;
            int pick = rand_r(seed) % 16;
            if (pick == 0) f = NAN;
            if (pick == 1) f = -NAN;
            if (pick == 2) f = -0.0;
            if (pick == 3) f = (rand_r(seed) & 1) ? INFINITY : -INFINITY;
            if (pick == 4) f = nextafter(f, INFINITY);
            if (pick == 5) f = nextafter(nextafter(f, -INFINITY), -INFINITY);
            ((double *)keys)[i] = f;
            break;
        }
        case DTYPE_I32:
            ((int32_t *)keys)[i] = r * 100000000;
            break;
        case DTYPE_U32:
            ((uint32_t *)keys)[i] = (uint32_t)(r + 20) * 100000000u;
            break;
        default:
            ((int64_t *)keys)[i] = (int64_t)r * 400000000000000000ll;
            break;
        }
    }
}

START_TEST(test_sort_random_rows_are_ordered_stable_permutations)
{
    const dtype_t dts[5] = {DTYPE_U32, DTYPE_I32, DTYPE_F32, DTYPE_I64, DTYPE_F64};
    const int64_t shapes[4][2] = {{1, 1}, {1, 1000}, {7, 129}, {64, 3}};
    unsigned seed = 20240611;
    printf("test_sort_random_rows_are_ordered_stable_permutations: seed %u\n", seed);
    for (int t = 0; t < 5; t++)
        for (int s = 0; s < 4; s++)
            for (int descending = 0; descending < 2; descending++) {
                dtype_t dt = dts[t];
                tensor_desc_t k = op_test_desc(dt, 2, shapes[s]);
                int64_t n = tensor_desc_numel(&k), len = shapes[s][1];
                size_t bytes = tensor_desc_bytes(&k);
                void *keys = malloc(bytes), *out = malloc(bytes), *plain = malloc(bytes);
                int64_t *idx = malloc((size_t)n * sizeof *idx);
                fill_keys(dt, keys, n, &seed);
                const char *params = descending ? "{\"argsort\": true, \"descending\": true}"
                                                : "{\"argsort\": true}";
                sort_run(&k, keys, NULL, NULL, params, out, idx);
                sort_run(&k, keys, NULL, NULL, descending ? "{\"descending\": true}" : NULL, plain,
                         NULL);
                ck_assert_mem_eq(out, plain, bytes); /* keys-only = argsort's keys */
                size_t es = dtype_size(dt);
                for (int64_t row = 0; row < n / len; row++) {
                    char *seen = calloc((size_t)len, 1);
                    for (int64_t j = 0; j < len; j++) {
                        int64_t at = row * len + j, src = row * len + idx[at];
                        ck_assert(idx[at] >= 0 && idx[at] < len && !seen[idx[at]]);
                        seen[idx[at]] = 1;
                        /* The output key is the input key it claims to be (NaN canonical). */
                        if (dt == DTYPE_F32 && isnan(((float *)keys)[src]))
                            ck_assert_uint_eq(f32_bits(((float *)out)[at]), 0x7fc00000u);
                        else if (dt == DTYPE_F64 && isnan(((double *)keys)[src]))
                            ck_assert_uint_eq(f64_bits(((double *)out)[at]), 0x7ff8000000000000ull);
                        else
                            ck_assert_mem_eq((char *)out + at * es, (char *)keys + src * es, es);
                        if (j == 0) continue;
                        int64_t prev = row * len + idx[at - 1];
                        int c = order_cmp(dt, keys, prev, src);
                        bool nan_tie = key_is_nan(dt, keys, prev) && key_is_nan(dt, keys, src);
                        bool nan_last = key_is_nan(dt, keys, prev) || key_is_nan(dt, keys, src);
                        if (descending && !nan_last) c = -c;
                        ck_assert_msg(c <= 0, "%s row %lld: out of order at %lld", dtype_name(dt),
                                      (long long)row, (long long)j);
                        if (c == 0 || nan_tie)
                            ck_assert_msg(idx[at - 1] < idx[at], "%s: tie not stable at %lld",
                                          dtype_name(dt), (long long)j);
                    }
                    free(seen);
                }
                free(keys);
                free(out);
                free(plain);
                free(idx);
            }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels_sort");
    TCase *tc = tcase_create("sort");
    tcase_add_test(tc, test_sort_u32_ascending_and_argsort_hand_checked);
    tcase_add_test(tc, test_sort_f32_special_values_order_both_directions);
    tcase_add_test(tc, test_sort_f64_special_values_order_both_directions);
    tcase_add_test(tc, test_sort_f64_rows_with_values);
    tcase_add_test(tc, test_sort_descending_argsort_keeps_ties_in_input_order);
    tcase_add_test(tc, test_sort_signed_extremes_i32_and_i64);
    tcase_add_test(tc, test_sort_rows_are_sorted_independently);
    tcase_add_test(tc, test_sort_values_of_every_size_follow_their_keys);
    tcase_add_test(tc, test_sort_scalar_and_empty_keys);
    tcase_add_test(tc, test_sort_outputs_and_batch_key);
    tcase_add_test(tc, test_sort_rejects_bad_input_naming_the_field);
    tcase_add_test(tc, test_sort_random_rows_are_ordered_stable_permutations);
    suite_add_tcase(s, tc);
    return op_test_run_suite(s);
}
