/* Size arithmetic of the op catalog: the overflow-checked helpers, the one shape rule
 * (tensor_desc_check) whatever the position of a zero, op_call_validate() refusing outputs that
 * wrap or pass the byte limit, and every op's output sizes against a 128-bit recomputation over
 * random shapes, huge dims included. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/op_test.h"

#define MIB ((uint64_t)1 << 20)
#define P62 ((int64_t)1 << 62)

START_TEST(test_size_helpers_refuse_overflow_and_negatives)
{
    int64_t r = 7;
    ck_assert_int_eq(size_mul(INT64_MAX / 2, 2, &r), 0);
    ck_assert_int_eq(r, INT64_MAX - 1);
    r = 7;
    ck_assert_int_eq(size_mul(P62, 2, &r), -EOVERFLOW);
    ck_assert_int_eq(size_mul(4, P62 + 1, &r), -EOVERFLOW);
    ck_assert_int_eq(size_mul(-1, 2, &r), -EOVERFLOW);
    ck_assert_int_eq(size_add(INT64_MAX, 1, &r), -EOVERFLOW);
    ck_assert_int_eq(size_add(3, -1, &r), -EOVERFLOW);
    ck_assert_int_eq(r, 7); /* untouched on failure */
    ck_assert_int_eq(size_add(INT64_MAX - 1, 1, &r), 0);
    ck_assert_int_eq(r, INT64_MAX);
    const int64_t dims[] = {0, P62, P62};
    ck_assert_int_eq(size_product(dims, 3, &r), 0); /* the plain product is 0 */
    ck_assert_int_eq(r, 0);
    ck_assert_int_eq(size_product(dims + 1, 2, &r), -EOVERFLOW);
    ck_assert_int_eq(size_product(dims, 0, &r), 0);
    ck_assert_int_eq(r, 1);
}
END_TEST

/* Host scratch of a kernel: a size that wraps is refused (NULL), never a small buffer; an empty
 * one is a real allocation. */
START_TEST(test_size_malloc_refuses_a_size_that_wraps)
{
    ck_assert_ptr_null(size_malloc(P62 + 1, 4)); /* 4 * (2^62 + 1) wraps to 4 */
    ck_assert_ptr_null(size_malloc(INT64_MAX, 16));
    ck_assert_ptr_null(size_malloc(-1, 8));
    void *empty = size_malloc(0, 8);
    ck_assert_ptr_nonnull(empty);
    free(empty);
    double *d = size_malloc(3, sizeof *d);
    ck_assert_ptr_nonnull(d);
    d[2] = 1.0;
    free(d);
}
END_TEST

/* A shape of three dims with a zero at position zero_at and the other two equal to dim. */
static tensor_desc_t three_dims(dtype_t dt, int zero_at, int64_t dim)
{
    tensor_desc_t d = {.dtype = dt, .ndim = 3};
    for (int i = 0; i < 3; i++)
        d.shape[i] = i == zero_at ? 0 : dim;
    return d;
}

START_TEST(test_shape_rule_ignores_the_position_of_a_zero)
{
    static const struct {
        dtype_t dt;
        int64_t dim;
        int expect;
    } rows[] = {
        {DTYPE_F32, P62, -EOVERFLOW},
        {DTYPE_I8, (int64_t)1 << 32, -EOVERFLOW},
        {DTYPE_I8, (int64_t)1 << 31, 0},
        {DTYPE_F32, (int64_t)1 << 30, 0},
        {DTYPE_F64, (int64_t)1 << 30, -EOVERFLOW},
        {DTYPE_F32, 3, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (int zero_at = 0; zero_at < 3; zero_at++) {
            tensor_desc_t d = three_dims(rows[i].dt, zero_at, rows[i].dim);
            char s[128];
            ck_assert_msg(tensor_desc_check(&d, UINT64_MAX) == rows[i].expect,
                          "%s %s: %d, expected %d", dtype_name(d.dtype),
                          tensor_shape_str(&d, s, sizeof s), tensor_desc_check(&d, UINT64_MAX),
                          rows[i].expect);
            /* Empty tensors take no bytes, so no byte limit refuses them. */
            if (rows[i].expect == 0) ck_assert_int_eq(tensor_desc_check(&d, 0), 0);
        }
    /* The reproducer: 4 * (2^62 + 1) bytes per row wraps to 4. */
    tensor_desc_t x = td(DTYPE_F32, 0, P62 + 1);
    ck_assert_int_eq(tensor_desc_check(&x, UINT64_MAX), -EOVERFLOW);
    tensor_desc_t y = td(DTYPE_F32, P62 + 1, 0);
    ck_assert_int_eq(tensor_desc_check(&y, UINT64_MAX), -EOVERFLOW);
}
END_TEST

/* op_call_validate() of op on inputs (slots in order, NULL for absent) with params as JSON
 * text; call and err are cleared first. */
static int validate_sized(const char *op, const char *params_json, const tensor_desc_t *const in[],
                          int n, uint64_t max_bytes, op_call_t *call, op_error_t *err)
{
    memset(call, 0, sizeof *call);
    memset(err, 0, sizeof *err);
    call->op = op_find(op);
    ck_assert_ptr_nonnull(call->op);
    for (int j = 0; j < n; j++)
        if (in[j]) {
            call->in[j] = *in[j];
            call->has_in[j] = true;
            ck_assert_int_eq(tensor_desc_check(in[j], max_bytes), 0);
        }
    json_t *params = params_json ? json_loads(params_json, 0, NULL) : NULL;
    ck_assert(!params_json || params);
    int r = op_call_validate(params, max_bytes, call, err);
    json_decref(params);
    return r;
}

static void expect_output_refused(const char *op, const char *params,
                                  const tensor_desc_t *const in[], int n, uint64_t max_bytes,
                                  int code, const char *field)
{
    op_call_t call;
    op_error_t err;
    int r = validate_sized(op, params, in, n, max_bytes, &call, &err);
    ck_assert_msg(r == code && strcmp(err.field, field) == 0,
                  "%s %s: %d '%s' (%s), expected %d '%s'", op, params ? params : "", r, err.field,
                  err.message, code, field);
    ck_assert(err.message[0]);
}

START_TEST(test_quantize_refuses_a_scale_whose_bytes_overflow)
{
    /* x is empty and bounded (2 * (2^61 + 1) bytes per row fit), but its scale of 2^61 + 1
     * floats does not: refused, never a wrapped 4-byte scale. */
    tensor_desc_t x = td(DTYPE_F16, 0, ((int64_t)1 << 61) + 1);
    expect_output_refused("quantize", "{\"axis\": 1}", (const tensor_desc_t *[]){&x}, 1, UINT64_MAX,
                          -EOVERFLOW, "outputs.scale");
    tensor_desc_t xf = td(DTYPE_F32, 0, (int64_t)1 << 40);
    expect_output_refused("quantize", "{\"axis\": -1}", (const tensor_desc_t *[]){&xf}, 1, 4 * MIB,
                          -E2BIG, "outputs.scale");
}
END_TEST

START_TEST(test_outputs_over_the_byte_limit_are_refused)
{
    tensor_desc_t a = td(DTYPE_F32, 1024, 0), b = td(DTYPE_F32, 0, 1024);
    expect_output_refused("gemm", NULL, (const tensor_desc_t *[]){&a, &b}, 2, MIB, -E2BIG,
                          "outputs.out");
    tensor_desc_t ab = td(DTYPE_F32, 16, 256, 0), bb = td(DTYPE_F32, 16, 0, 256);
    expect_output_refused("gemm", NULL, (const tensor_desc_t *[]){&ab, &bb}, 2, MIB, -E2BIG,
                          "outputs.out");
    tensor_desc_t one = td(DTYPE_F32, 1, 1, 1, 1);
    expect_output_refused("conv2d", "{\"padding\": 600}", (const tensor_desc_t *[]){&one, &one}, 2,
                          MIB, -E2BIG, "outputs.out");
    /* 46001 x 46001 floats: 8.5 GB from 8 bytes of input, over the default limit of 4 GiB. */
    expect_output_refused("conv2d", "{\"padding\": 23000}", (const tensor_desc_t *[]){&one, &one},
                          2, (uint64_t)4 << 30, -E2BIG, "outputs.out");
    tensor_desc_t x = td(DTYPE_F32, 0, 1 << 20);
    expect_output_refused("quantize", "{\"axis\": 1}", (const tensor_desc_t *[]){&x}, 1, MIB,
                          -E2BIG, "outputs.scale");
    tensor_desc_t q = td(DTYPE_I8, 1 << 20), s = td(DTYPE_F32);
    expect_output_refused("dequantize", NULL, (const tensor_desc_t *[]){&q, &s}, 2, MIB, -E2BIG,
                          "outputs.out");
    /* The same calls within the limit pass. */
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(validate_sized("dequantize", NULL, (const tensor_desc_t *[]){&q, &s}, 2,
                                    4 * MIB, &call, &err),
                     0);
}
END_TEST

/* --- random shapes against a 128-bit recomputation --- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A dim: mostly small, often 0, sometimes near a power of two up to 2^62. */
static int64_t rnd_dim(void)
{
    unsigned pick = (unsigned)(rnd() % 100);
    if (pick < 15) return 0;
    if (pick < 70) return (int64_t)(rnd() % 9);
    int shift = 16 + (int)(rnd() % 47);
    return ((int64_t)1 << shift) + (int64_t)(rnd() % 3) - 1;
}

static tensor_desc_t rnd_desc(dtype_t dt, int min_ndim, int max_ndim)
{
    tensor_desc_t d = {.dtype = dt,
                       .ndim = min_ndim + (int)(rnd() % (unsigned)(max_ndim - min_ndim + 1))};
    for (int i = 0; i < d.ndim; i++)
        d.shape[i] = rnd_dim();
    return d;
}

/* Random inputs and params for one call of op that have a fair chance to validate: the
 * operands' shapes agree as the op requires, their dims drawn by rnd_dim(). Writes the params'
 * JSON text into params; false for an op this test does not know. */
static bool rnd_call(const op_def_t *op, tensor_desc_t in[OP_MAX_TENSORS], bool has[OP_MAX_TENSORS],
                     char *params, size_t size)
{
    const char *name = op->name;
    memset(has, 0, sizeof(bool) * OP_MAX_TENSORS);
    snprintf(params, size, "{}");
    has[0] = true;
    if (!strcmp(name, "add") || !strcmp(name, "mul") || !strcmp(name, "saxpy") ||
        !strcmp(name, "dot") || !strcmp(name, "sum")) {
        in[0] = rnd_desc(rnd() % 2 ? DTYPE_F32 : DTYPE_I32, 0, 4);
        in[1] = rnd() % 4 || !strcmp(name, "dot") ? in[0] : td(in[0].dtype, 1);
        has[1] = strcmp(name, "sum") != 0;
        if (!strcmp(name, "saxpy")) snprintf(params, size, "{\"a\": 2}");
    } else if (!strcmp(name, "sort")) {
        in[0] = rnd_desc(DTYPE_F32, 0, 3);
        in[1] = in[0];
        in[1].dtype = DTYPE_F64;
        has[1] = rnd() % 2;
        if (!has[1] && rnd() % 2) snprintf(params, size, "{\"argsort\": true}");
    } else if (!strcmp(name, "gemm")) {
        int lead = (int)(rnd() % 3);
        in[0] = rnd_desc(DTYPE_F32, lead + 2, lead + 2);
        in[1] = rnd() % 2 ? in[0] : td(DTYPE_F32, 0, 0);
        in[1].shape[in[1].ndim - 2] = in[0].shape[in[0].ndim - 1];
        in[1].shape[in[1].ndim - 1] = rnd_dim();
        has[1] = true;
    } else if (!strcmp(name, "conv2d")) {
        in[0] = rnd_desc(DTYPE_F32, 4, 4);
        in[0].shape[1] = 1 + (int64_t)(rnd() % 2);
        in[1] = td(DTYPE_F32, rnd_dim(), in[0].shape[1], 1 + (int64_t)(rnd() % 3), rnd_dim());
        static const long pads[] = {0, 1, 600, 23000, 1 << 20, 1 << 30};
        snprintf(params, size, "{\"padding\": %ld, \"stride\": %d, \"dilation\": %ld}",
                 pads[rnd() % 6], 1 + (int)(rnd() % 2), rnd() % 4 ? 1L : 1L << 30);
        has[1] = true;
    } else if (!strcmp(name, "quantize") || !strcmp(name, "dequantize")) {
        bool deq = name[0] == 'd';
        in[0] = rnd_desc(deq ? DTYPE_I8 : (rnd() % 2 ? DTYPE_F32 : DTYPE_F16), 1, 3);
        int axis = (int)(rnd() % (unsigned)in[0].ndim);
        bool per_channel = rnd() % 4 != 0;
        in[1] = per_channel ? td(DTYPE_F32, in[0].shape[axis]) : td(DTYPE_F32);
        has[1] = deq || rnd() % 2;
        if (per_channel) snprintf(params, size, "{\"axis\": %d}", axis);
    } else if (!strncmp(name, "debug_", 6)) {
        in[0] = rnd_desc(DTYPE_F32, 0, 4);
        if (!strcmp(name, "debug_sleep")) snprintf(params, size, "{\"ms\": 0}");
    } else {
        return false;
    }
    return true;
}

/* The exact bytes of d, and whether d obeys the shape rule, in 128 bits. */
static unsigned __int128 bytes128(const tensor_desc_t *d, bool *ret_bounded)
{
    unsigned __int128 all = dtype_size(d->dtype), nonzero = all;
    for (int i = 0; i < d->ndim; i++) {
        all *= (unsigned __int128)d->shape[i];
        if (d->shape[i]) nonzero *= (unsigned __int128)d->shape[i];
        if (nonzero > (unsigned __int128)INT64_MAX) nonzero = (unsigned __int128)INT64_MAX + 1;
    }
    *ret_bounded = nonzero <= (unsigned __int128)INT64_MAX;
    return all;
}

/* Checks the outputs of a validated call: bounded, and their 64-bit sizes exact. */
static void check_outputs(const op_call_t *call, const char *params)
{
    for (int j = 0; j < call->n_out; j++) {
        const tensor_desc_t *d = &call->out[j];
        bool bounded;
        unsigned __int128 want = bytes128(d, &bounded);
        char s[160], in0[160];
        tensor_shape_str(d, s, sizeof s);
        tensor_shape_str(&call->in[0], in0, sizeof in0);
        ck_assert_msg(bounded && want == tensor_desc_bytes(d),
                      "%s %s on %s: output '%s' %s %s takes %llu bytes by 64-bit arithmetic, "
                      "but %s",
                      call->op->name, params, in0, call->out_names[j], dtype_name(d->dtype), s,
                      (unsigned long long)tensor_desc_bytes(d),
                      bounded ? "differs from the exact size" : "its nonzero dims overflow");
    }
    ck_assert(isfinite(call->cost.bytes) && call->cost.bytes >= 0);
    ck_assert(isfinite(call->cost.flops) && call->cost.flops >= 0);
}

START_TEST(test_every_op_output_size_matches_a_128_bit_recomputation)
{
    op_table_enable_test_ops(true);
    for (int i = 0; i < op_count(); i++) {
        const op_def_t *op = op_at(i);
        int accepted = 0, tried = 0;
        for (int iter = 0; iter < 20000; iter++) {
            tensor_desc_t in[OP_MAX_TENSORS] = {0};
            bool has[OP_MAX_TENSORS];
            char params[160];
            ck_assert_msg(rnd_call(op, in, has, params, sizeof params),
                          "op '%s' has no random call generator here", op->name);
            op_call_t call = {.op = op};
            bool inputs_ok = true;
            for (int j = 0; j < op->n_inputs; j++) {
                if (!has[j]) continue;
                call.in[j] = in[j];
                call.has_in[j] = true;
                inputs_ok = inputs_ok && tensor_desc_check(&in[j], UINT64_MAX) == 0;
            }
            if (!inputs_ok) continue; /* refused at the door, as the daemon does */
            tried++;
            json_t *pj = json_loads(params, 0, NULL);
            op_error_t err = {0};
            int r = op_call_validate(pj, UINT64_MAX, &call, &err);
            json_decref(pj);
            if (r < 0) continue;
            accepted++;
            check_outputs(&call, params);
        }
        ck_assert_msg(accepted > 100, "%s: %d of %d calls accepted", op->name, accepted, tried);
    }
    op_table_enable_test_ops(false);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels_sizes");
    TCase *tc = tcase_create("sizes");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_size_helpers_refuse_overflow_and_negatives);
    tcase_add_test(tc, test_size_malloc_refuses_a_size_that_wraps);
    tcase_add_test(tc, test_shape_rule_ignores_the_position_of_a_zero);
    tcase_add_test(tc, test_quantize_refuses_a_scale_whose_bytes_overflow);
    tcase_add_test(tc, test_outputs_over_the_byte_limit_are_refused);
    tcase_add_test(tc, test_every_op_output_size_matches_a_128_bit_recomputation);
    suite_add_tcase(s, tc);
    return op_test_run_suite(s);
}
