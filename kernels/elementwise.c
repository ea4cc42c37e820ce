/* add, mul, saxpy: validation, the CPU reference and the op table entries. */
#include "elementwise.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { EW_IN_X, EW_IN_Y };

static const char *const ew_input_names[] = {"x", "y"};
static const char *const ew_no_params[] = {NULL};
static const char *const ew_saxpy_params[] = {"a", NULL};
static const char *const ew_out_names[] = {"out"};

#define EW_DTYPES                                                                                  \
    (OP_DTYPE_BIT(DTYPE_F32) | OP_DTYPE_BIT(DTYPE_F16) | OP_DTYPE_BIT(DTYPE_BF16) |                \
     OP_DTYPE_BIT(DTYPE_F64) | OP_DTYPE_BIT(DTYPE_I32))

static const op_input_sig_t ew_input_sigs[] = {
    {EW_DTYPES, 0, TENSOR_MAX_DIMS},
    {EW_DTYPES, 0, TENSOR_MAX_DIMS},
};
static const char ew_rules[] = "y has x's dtype, and x's shape or a single element.";
static const op_sig_t ew_sig = {.inputs = ew_input_sigs, .rules = ew_rules};
static const op_param_sig_t ew_saxpy_param_sigs[] = {
    {"a", OP_PARAM_NUMBER, -HUGE_VAL, HUGE_VAL, NULL, NULL,
     "The factor of x; an integer for i32 inputs, used modulo 2^32."},
};
static const op_sig_t ew_saxpy_sig = {
    .inputs = ew_input_sigs,
    .params = ew_saxpy_param_sigs,
    .rules = "y has x's dtype, and x's shape or a single element; params.a is an integer for "
             "i32 inputs.",
};

static bool ew_dtype_supported(dtype_t dt)
{
    return EW_DTYPES & OP_DTYPE_BIT(dt);
}

/* saxpy's factor: required, finite; for i32 an integer, used modulo 2^32 like the arithmetic. */
static int ew_parse_a(const json_t *params, dtype_t dt, ew_params_t *p, op_error_t *err)
{
    const json_t *v = params ? json_object_get(params, "a") : NULL;
    if (!v || json_is_null(v))
        return op_error(err, -EINVAL, "params.a", "params.a is required (out = a * x + y)");
    double a;
    int r = op_param_double(params, "a", 0, &a, err);
    if (r < 0) return r;
    p->a = a;
    if (dt != DTYPE_I32) return 0;
    int64_t ai;
    if (json_is_integer(v))
        ai = json_integer_value(v);
    else if (a == trunc(a) && fabs(a) < 9.2e18)
        ai = (int64_t)a;
    else
        return op_error(err, -EINVAL, "params.a", "params.a must be an integer for i32 inputs");
    p->a_u32 = (uint32_t)(uint64_t)ai;
    return 0;
}

static int ew_validate(ew_kind_t kind, const json_t *params, op_call_t *call, op_error_t *err)
{
    int r = op_params_check_keys(call->op, params, err);
    if (r < 0) return r;
    const tensor_desc_t *x = &call->in[EW_IN_X], *y = &call->in[EW_IN_Y];
    if (!ew_dtype_supported(x->dtype))
        return op_error(err, -EINVAL, "inputs.x.dtype",
                        "%s does not take dtype %s (f32, f16, bf16, f64 or i32)", call->op->name,
                        dtype_name(x->dtype));
    if (y->dtype != x->dtype)
        return op_error(err, -EINVAL, "inputs.y.dtype", "y is %s but x is %s: they must match",
                        dtype_name(y->dtype), dtype_name(x->dtype));
    int64_t n = tensor_desc_numel(x);
    bool y_scalar = tensor_desc_numel(y) == 1;
    if (!y_scalar && !tensor_desc_equal(x, y)) {
        char xs[128], ys[128];
        return op_error(err, -EINVAL, "inputs.y.shape",
                        "y has shape %s: it must be x's shape %s or a single element",
                        tensor_shape_str(y, ys, sizeof ys), tensor_shape_str(x, xs, sizeof xs));
    }
    ew_params_t p = {.kind = kind, .dtype = x->dtype, .y_scalar = y_scalar, .n = n};
    if (kind == EW_SAXPY) {
        r = ew_parse_a(params, x->dtype, &p, err);
        if (r < 0) return r;
    }
    memset(call->params.bytes, 0, sizeof call->params.bytes);
    *OP_PARAMS(call, ew_params_t) = p;
    call->n_out = 1;
    call->out_names[0] = ew_out_names[0];
    call->out[0] = *x;
    double size = (double)dtype_size(x->dtype);
    call->cost.bytes = ((double)n * 2 + (y_scalar ? 1 : (double)n)) * size;
    call->cost.flops = (kind == EW_SAXPY ? 2.0 : 1.0) * (double)n;
    /* One kernel handles calls of any sizes, but the dtype and broadcasting are compiled in. */
    snprintf(call->batch_key, sizeof call->batch_key, "%s/%s/%s", call->op->name,
             dtype_name(x->dtype), y_scalar ? "scalar" : "full");
    return 0;
}

static int ew_add_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    return ew_validate(EW_ADD, params, call, err);
}

static int ew_mul_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    return ew_validate(EW_MUL, params, call, err);
}

static int ew_saxpy_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    return ew_validate(EW_SAXPY, params, call, err);
}

/* The product and the sum are separate statements so that each is rounded on its own, as the
 * CUDA kernels do with __fmul_rn/__fadd_rn. */
static float ew_apply_f32(ew_kind_t kind, float a, float x, float y)
{
    if (kind == EW_ADD) return x + y;
    if (kind == EW_MUL) return x * y;
    float ax = a * x;
    return ax + y;
}

static double ew_apply_f64(ew_kind_t kind, double a, double x, double y)
{
    if (kind == EW_ADD) return x + y;
    if (kind == EW_MUL) return x * y;
    double ax = a * x;
    return ax + y;
}

/* Unsigned arithmetic: wrapping modulo 2^32 is defined there, and gives i32's two's complement
 * results bit for bit. */
static uint32_t ew_apply_u32(ew_kind_t kind, uint32_t a, uint32_t x, uint32_t y)
{
    if (kind == EW_ADD) return x + y;
    if (kind == EW_MUL) return x * y;
    return a * x + y;
}

/* The whole loop per dtype, so that the conversion is not chosen per element. yi is 0 for a
 * broadcast y. */
#define EW_LOOP(T, LOAD, STORE, APPLY, A)                                                          \
    do {                                                                                           \
        const T *xs = in[EW_IN_X], *ys = in[EW_IN_Y];                                              \
        T *os = out[0];                                                                            \
        for (int64_t i = 0; i < p->n; i++)                                                         \
            os[i] = STORE(APPLY(p->kind, A, LOAD(xs[i]), LOAD(ys[p->y_scalar ? 0 : i])));          \
    } while (0)

#define EW_SAME(v) (v)
#define EW_TO_U32(v) ((uint32_t)(v))
#define EW_TO_I32(v) ((int32_t)(v))

static int ew_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                      op_error_t *err)
{
    const ew_params_t *p = OP_PARAMS(call, const ew_params_t);
    float a32 = (float)p->a;
    switch (p->dtype) {
    case DTYPE_F32:
        EW_LOOP(float, EW_SAME, EW_SAME, ew_apply_f32, a32);
        break;
    case DTYPE_F16:
        EW_LOOP(uint16_t, f16_to_f32, f32_to_f16, ew_apply_f32, a32);
        break;
    case DTYPE_BF16:
        EW_LOOP(uint16_t, bf16_to_f32, f32_to_bf16, ew_apply_f32, a32);
        break;
    case DTYPE_F64:
        EW_LOOP(double, EW_SAME, EW_SAME, ew_apply_f64, p->a);
        break;
    case DTYPE_I32:
        EW_LOOP(int32_t, EW_TO_U32, EW_TO_I32, ew_apply_u32, p->a_u32);
        break;
    default:
        return op_error(err, -EINVAL, "inputs.x.dtype", "unsupported dtype %s",
                        dtype_name(p->dtype));
    }
    return 0;
}

const op_def_t op_add = {
    .name = "add",
    .summary = "out = x + y, elementwise; y of x's shape or a single element",
    .n_inputs = 2,
    .input_names = ew_input_names,
    .required_inputs = 0x3,
    .param_names = ew_no_params,
    .sig = &ew_sig,
    .validate = ew_add_validate,
    .run_cpu = ew_run_cpu,
    .run_cuda = OP_CUDA(op_add_run_cuda),
};

const op_def_t op_mul = {
    .name = "mul",
    .summary = "out = x * y, elementwise; y of x's shape or a single element",
    .n_inputs = 2,
    .input_names = ew_input_names,
    .required_inputs = 0x3,
    .param_names = ew_no_params,
    .sig = &ew_sig,
    .validate = ew_mul_validate,
    .run_cpu = ew_run_cpu,
    .run_cuda = OP_CUDA(op_mul_run_cuda),
};

const op_def_t op_saxpy = {
    .name = "saxpy",
    .summary = "out = a * x + y, elementwise; y of x's shape or a single element",
    .n_inputs = 2,
    .input_names = ew_input_names,
    .required_inputs = 0x3,
    .param_names = ew_saxpy_params,
    .sig = &ew_saxpy_sig,
    .validate = ew_saxpy_validate,
    .run_cpu = ew_run_cpu,
    .run_cuda = OP_CUDA(op_saxpy_run_cuda),
};
