/* sum, dot: validation, the CPU reference and the op table entries. */
#include "reduce.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { RED_IN_X, RED_IN_Y };

static const char *const red_sum_inputs[] = {"x"};
static const char *const red_dot_inputs[] = {"x", "y"};
static const char *const red_no_params[] = {NULL};
static const char *const red_out_names[] = {"out"};

/* The dtypes red_out_dtype() takes. */
#define RED_DTYPES                                                                                 \
    (OP_DTYPE_BIT(DTYPE_F32) | OP_DTYPE_BIT(DTYPE_F16) | OP_DTYPE_BIT(DTYPE_BF16) |                \
     OP_DTYPE_BIT(DTYPE_F64) | OP_DTYPE_BIT(DTYPE_I32))

static const op_input_sig_t red_input_sigs[] = {
    {RED_DTYPES, 0, TENSOR_MAX_DIMS},
    {RED_DTYPES, 0, TENSOR_MAX_DIMS},
};
static const op_sig_t red_sum_sig = {.inputs = red_input_sigs, .rules = ""};
static const op_sig_t red_dot_sig = {.inputs = red_input_sigs,
                                     .rules = "y has x's dtype and shape."};

/* The output (and accumulation) dtype of an input dtype, or -EINVAL for one we do not reduce. */
static int red_out_dtype(dtype_t in, dtype_t *ret)
{
    switch (in) {
    case DTYPE_F32:
    case DTYPE_F16:
    case DTYPE_BF16:
        *ret = DTYPE_F32;
        return 0;
    case DTYPE_F64:
        *ret = DTYPE_F64;
        return 0;
    case DTYPE_I32:
        *ret = DTYPE_I64;
        return 0;
    default:
        return -EINVAL;
    }
}

static int red_validate(red_kind_t kind, const json_t *params, op_call_t *call, op_error_t *err)
{
    int r = op_params_check_keys(call->op, params, err);
    if (r < 0) return r;
    const tensor_desc_t *x = &call->in[RED_IN_X];
    red_params_t p = {.kind = kind, .dtype = x->dtype, .n = tensor_desc_numel(x)};
    if (red_out_dtype(x->dtype, &p.out_dtype) < 0)
        return op_error(err, -EINVAL, "inputs.x.dtype",
                        "%s does not take dtype %s (f32, f16, bf16, f64 or i32)", call->op->name,
                        dtype_name(x->dtype));
    if (kind == RED_DOT) {
        const tensor_desc_t *y = &call->in[RED_IN_Y];
        if (y->dtype != x->dtype)
            return op_error(err, -EINVAL, "inputs.y.dtype", "y is %s but x is %s: they must match",
                            dtype_name(y->dtype), dtype_name(x->dtype));
        if (!tensor_desc_equal(x, y)) {
            char xs[128], ys[128];
            return op_error(err, -EINVAL, "inputs.y.shape",
                            "y has shape %s: it must be x's shape %s",
                            tensor_shape_str(y, ys, sizeof ys), tensor_shape_str(x, xs, sizeof xs));
        }
    }
    memset(call->params.bytes, 0, sizeof call->params.bytes);
    *OP_PARAMS(call, red_params_t) = p;
    call->n_out = 1;
    call->out_names[0] = red_out_names[0];
    call->out[0] = (tensor_desc_t){.dtype = p.out_dtype, .ndim = 0};
    double inputs = kind == RED_DOT ? 2 : 1;
    call->cost.bytes =
        inputs * (double)p.n * (double)dtype_size(x->dtype) + (double)dtype_size(p.out_dtype);
    call->cost.flops = inputs * (double)p.n;
    /* The segmented kernels take calls of any sizes; only the dtype is compiled in. */
    snprintf(call->batch_key, sizeof call->batch_key, "%s/%s", call->op->name,
             dtype_name(x->dtype));
    return 0;
}

static int red_sum_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    return red_validate(RED_SUM, params, call, err);
}

static int red_dot_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    return red_validate(RED_DOT, params, call, err);
}

/* Leaves of the pairwise summation: short enough for plain accumulation to stay accurate. */
#define RED_LEAF 64

static float red_load_f32(dtype_t dt, const void *p, int64_t i)
{
    if (dt == DTYPE_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    if (dt == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Pairwise summation in f32 of x[lo, lo + n) (or of x * y): its error grows with log n rather
 * than n, so the f32 result stays a good reference for millions of elements. */
static float red_pairwise_f32(dtype_t dt, const void *x, const void *y, int64_t lo, int64_t n)
{
    if (n > RED_LEAF) {
        int64_t half = n / 2;
        float a = red_pairwise_f32(dt, x, y, lo, half);
        float b = red_pairwise_f32(dt, x, y, lo + half, n - half);
        return a + b;
    }
    float acc = 0;
    for (int64_t i = lo; i < lo + n; i++)
        acc = y ? fmaf(red_load_f32(dt, x, i), red_load_f32(dt, y, i), acc)
                : acc + red_load_f32(dt, x, i);
    return acc;
}

static double red_pairwise_f64(const double *x, const double *y, int64_t lo, int64_t n)
{
    if (n > RED_LEAF) {
        int64_t half = n / 2;
        return red_pairwise_f64(x, y, lo, half) + red_pairwise_f64(x, y, lo + half, n - half);
    }
    double acc = 0;
    for (int64_t i = lo; i < lo + n; i++)
        acc = y ? fma(x[i], y[i], acc) : acc + x[i];
    return acc;
}

/* Integers sum exactly; unsigned arithmetic makes the (far-off) wrap modulo 2^64 defined. */
static int64_t red_sum_i32(const int32_t *x, const int32_t *y, int64_t n)
{
    uint64_t acc = 0;
    for (int64_t i = 0; i < n; i++)
        acc += y ? (uint64_t)((int64_t)x[i] * y[i]) : (uint64_t)(int64_t)x[i];
    return (int64_t)acc;
}

static int red_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                       op_error_t *err)
{
    const red_params_t *p = OP_PARAMS(call, const red_params_t);
    const void *x = in[RED_IN_X];
    const void *y = p->kind == RED_DOT ? in[RED_IN_Y] : NULL;
    switch (p->dtype) {
    case DTYPE_F32:
    case DTYPE_F16:
    case DTYPE_BF16:
        *(float *)out[0] = red_pairwise_f32(p->dtype, x, y, 0, p->n);
        return 0;
    case DTYPE_F64:
        *(double *)out[0] = red_pairwise_f64(x, y, 0, p->n);
        return 0;
    case DTYPE_I32:
        *(int64_t *)out[0] = red_sum_i32(x, y, p->n);
        return 0;
    default:
        return op_error(err, -EINVAL, "inputs.x.dtype", "unsupported dtype %s",
                        dtype_name(p->dtype));
    }
}

const op_def_t op_sum = {
    .name = "sum",
    .summary = "out = the sum of x's elements (f32 accumulation or wider), shape []",
    .n_inputs = 1,
    .input_names = red_sum_inputs,
    .required_inputs = 0x1,
    .param_names = red_no_params,
    .sig = &red_sum_sig,
    .validate = red_sum_validate,
    .run_cpu = red_run_cpu,
    .run_cuda = OP_CUDA(op_sum_run_cuda),
};

const op_def_t op_dot = {
    .name = "dot",
    .summary = "out = the sum of x * y over all elements (f32 accumulation or wider), shape []",
    .n_inputs = 2,
    .input_names = red_dot_inputs,
    .required_inputs = 0x3,
    .param_names = red_no_params,
    .sig = &red_dot_sig,
    .validate = red_dot_validate,
    .run_cpu = red_run_cpu,
    .run_cuda = OP_CUDA(op_dot_run_cuda),
};
