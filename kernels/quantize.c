/* quantize, dequantize: validation, the CPU reference and the op table entries. */
#include "quantize.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { QUANT_IN_X, QUANT_IN_SCALE };
enum { QUANT_OUT_Q, QUANT_OUT_SCALE };

static const char *const quant_inputs[] = {"x", "scale"};
static const char *const dequant_inputs[] = {"q", "scale"};
static const char *const quant_params[] = {"axis", NULL};
static const char *const quant_out_names[] = {"q", "scale"};
static const char *const dequant_out_names[] = {"out"};

#define QUANT_X_DTYPES                                                                             \
    (OP_DTYPE_BIT(DTYPE_F32) | OP_DTYPE_BIT(DTYPE_F16) | OP_DTYPE_BIT(DTYPE_BF16))

static const op_param_sig_t quant_param_sigs[] = {
    {"axis", OP_PARAM_INT, -TENSOR_MAX_DIMS, TENSOR_MAX_DIMS - 1, "null", NULL,
     "The channel dim of a per-channel scale, negative from the last; null: one scale."},
};
static const op_input_sig_t quant_input_sigs[] = {
    {QUANT_X_DTYPES, 0, TENSOR_MAX_DIMS},
    {OP_DTYPE_BIT(DTYPE_F32), 0, 1},
};
static const op_input_sig_t dequant_input_sigs[] = {
    {OP_DTYPE_BIT(DTYPE_I8), 0, TENSOR_MAX_DIMS},
    {OP_DTYPE_BIT(DTYPE_F32), 0, 1},
};
static const op_sig_t quant_sig = {
    .inputs = quant_input_sigs,
    .params = quant_param_sigs,
    .rules = "axis is in [-ndim, ndim) of x and null for a scalar x; scale, when given, is [] "
             "with axis null and [x.shape[axis]] with axis set.",
};
static const op_sig_t dequant_sig = {
    .inputs = dequant_input_sigs,
    .params = quant_param_sigs,
    .rules = "axis is in [-ndim, ndim) of q and null for a scalar q; scale is [] with axis null "
             "and [q.shape[axis]] with axis set.",
};

/* Reads params.axis against the quantized tensor t (named tname in messages): absent or null is
 * per tensor; otherwise an integer in [-ndim, ndim) naming the channel dim. */
static int quant_parse_axis(const json_t *params, const tensor_desc_t *t, const char *tname,
                            quant_params_t *p, op_error_t *err)
{
    const json_t *v = params ? json_object_get(params, "axis") : NULL;
    p->n = tensor_desc_numel(t);
    p->per_channel = false;
    p->axis = -1;
    p->channels = 1;
    p->inner = p->n;
    if (!v || json_is_null(v)) return 0;
    if (t->ndim == 0)
        return op_error(err, -EINVAL, "params.axis",
                        "%s is a scalar: params.axis must be null (per tensor)", tname);
    int64_t axis;
    int r = op_param_int(params, "axis", 0, -t->ndim, t->ndim - 1, &axis, err);
    if (r < 0) return r;
    if (axis < 0) axis += t->ndim;
    p->per_channel = true;
    p->axis = (int)axis;
    p->channels = t->shape[axis];
    if (size_product(&t->shape[axis + 1], t->ndim - (int)axis - 1, &p->inner) < 0)
        return op_error(err, -EOVERFLOW, "params.axis",
                        "the dims of %s after params.axis multiply past 2^63", tname);
    return 0;
}

/* The shape of the scale: [] per tensor, [channels] per channel. */
static tensor_desc_t quant_scale_desc(const quant_params_t *p)
{
    tensor_desc_t d = {.dtype = DTYPE_F32, .ndim = p->per_channel ? 1 : 0};
    d.shape[0] = p->channels;
    return d;
}

static int quant_check_scale(const tensor_desc_t *s, const quant_params_t *p, op_error_t *err)
{
    if (s->dtype != DTYPE_F32)
        return op_error(err, -EINVAL, "inputs.scale.dtype", "scale must be f32, not %s",
                        dtype_name(s->dtype));
    tensor_desc_t want = quant_scale_desc(p);
    if (!tensor_desc_equal(s, &want)) {
        char got[128], exp[128];
        return op_error(err, -EINVAL, "inputs.scale.shape", "scale has shape %s: %s takes shape %s",
                        tensor_shape_str(s, got, sizeof got),
                        p->per_channel ? "per-channel (params.axis set)"
                                       : "per-tensor (params.axis null)",
                        tensor_shape_str(&want, exp, sizeof exp));
    }
    return 0;
}

static int quant_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    int r = op_params_check_keys(call->op, params, err);
    if (r < 0) return r;
    const tensor_desc_t *x = &call->in[QUANT_IN_X];
    if (!(QUANT_X_DTYPES & OP_DTYPE_BIT(x->dtype)))
        return op_error(err, -EINVAL, "inputs.x.dtype",
                        "quantize does not take dtype %s (f32, f16 or bf16)", dtype_name(x->dtype));
    quant_params_t p = {.dtype = x->dtype, .has_scale = call->has_in[QUANT_IN_SCALE]};
    r = quant_parse_axis(params, x, "x", &p, err);
    if (r < 0) return r;
    if (p.has_scale) {
        r = quant_check_scale(&call->in[QUANT_IN_SCALE], &p, err);
        if (r < 0) return r;
    }
    memset(call->params.bytes, 0, sizeof call->params.bytes);
    *OP_PARAMS(call, quant_params_t) = p;
    call->n_out = 2;
    call->out_names[QUANT_OUT_Q] = quant_out_names[QUANT_OUT_Q];
    call->out_names[QUANT_OUT_SCALE] = quant_out_names[QUANT_OUT_SCALE];
    call->out[QUANT_OUT_Q] = *x;
    call->out[QUANT_OUT_Q].dtype = DTYPE_I8;
    call->out[QUANT_OUT_SCALE] = quant_scale_desc(&p);
    /* Without a given scale, x is read twice: once for the max, once to quantize. */
    double n = (double)p.n, c = (double)p.channels, size = (double)dtype_size(x->dtype);
    call->cost.bytes = (p.has_scale ? 1 : 2) * n * size + n + (p.has_scale ? 2 : 1) * 4 * c;
    call->cost.flops = (p.has_scale ? 2 : 3) * n;
    snprintf(call->batch_key, sizeof call->batch_key, "quantize/%s/%s/%s", dtype_name(x->dtype),
             p.per_channel ? "channel" : "tensor", p.has_scale ? "given" : "auto");
    return 0;
}

static int dequant_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    int r = op_params_check_keys(call->op, params, err);
    if (r < 0) return r;
    const tensor_desc_t *q = &call->in[QUANT_IN_X];
    if (q->dtype != DTYPE_I8)
        return op_error(err, -EINVAL, "inputs.q.dtype", "q must be i8, not %s",
                        dtype_name(q->dtype));
    quant_params_t p = {.dtype = DTYPE_I8, .has_scale = true};
    r = quant_parse_axis(params, q, "q", &p, err);
    if (r < 0) return r;
    r = quant_check_scale(&call->in[QUANT_IN_SCALE], &p, err);
    if (r < 0) return r;
    memset(call->params.bytes, 0, sizeof call->params.bytes);
    *OP_PARAMS(call, quant_params_t) = p;
    call->n_out = 1;
    call->out_names[0] = dequant_out_names[0];
    call->out[0] = *q;
    call->out[0].dtype = DTYPE_F32;
    call->cost.bytes = (double)p.n * (1 + 4) + 4 * (double)p.channels;
    call->cost.flops = (double)p.n;
    snprintf(call->batch_key, sizeof call->batch_key, "dequantize/%s",
             p.per_channel ? "channel" : "tensor");
    return 0;
}

static float quant_load(dtype_t dt, const void *x, int64_t i)
{
    if (dt == DTYPE_F16) return f16_to_f32(((const uint16_t *)x)[i]);
    if (dt == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)x)[i]);
    return ((const float *)x)[i];
}

/* rne(v) clamped to [-127, 127]; NaN gives 0 (as the GPU's float-to-int conversion does). */
static int8_t quant_round(float v)
{
    if (isnan(v)) return 0;
    if (v >= 127.0f) return 127;
    if (v <= -127.0f) return -127;
    return (int8_t)rintf(v);
}

static float quant_auto_scale(float max_abs)
{
    float s = max_abs / 127.0f;
    return s == 0.0f ? 1.0f : s;
}

/* Visits x in row-major order as [outer, channels, inner], so the channel of each element is
 * known without a division. */
#define QUANT_FOR_EACH(p, i, c, BODY)                                                              \
    do {                                                                                           \
        int64_t per_outer_ = (p)->channels * (p)->inner;                                           \
        int64_t outer_ = per_outer_ ? (p)->n / per_outer_ : 0;                                     \
        int64_t i = 0;                                                                             \
        for (int64_t o_ = 0; o_ < outer_; o_++)                                                    \
            for (int64_t c = 0; c < (p)->channels; c++)                                            \
                for (int64_t k_ = 0; k_ < (p)->inner; k_++, i++) {                                 \
                    BODY;                                                                          \
                }                                                                                  \
    } while (0)

static int quant_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                         op_error_t *err)
{
    const quant_params_t *p = OP_PARAMS(call, const quant_params_t);
    const void *x = in[QUANT_IN_X];
    int8_t *q = out[QUANT_OUT_Q];
    float *scale = out[QUANT_OUT_SCALE];
    if (in[QUANT_IN_SCALE]) {
        memcpy(scale, in[QUANT_IN_SCALE], (size_t)p->channels * sizeof *scale);
    } else {
        /* The output scale holds each channel's max |x| until it becomes the scale. A NaN
         * compares false, so it never becomes the max. */
        for (int64_t c = 0; c < p->channels; c++)
            scale[c] = 0;
        QUANT_FOR_EACH(p, i, c, {
            float a = fabsf(quant_load(p->dtype, x, i));
            if (a > scale[c]) scale[c] = a;
        });
        for (int64_t c = 0; c < p->channels; c++)
            scale[c] = quant_auto_scale(scale[c]);
    }
    QUANT_FOR_EACH(p, i, c, q[i] = quant_round(quant_load(p->dtype, x, i) / scale[c]));
    (void)err;
    return 0;
}

static int dequant_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                           op_error_t *err)
{
    const quant_params_t *p = OP_PARAMS(call, const quant_params_t);
    const int8_t *q = in[QUANT_IN_X];
    const float *scale = in[QUANT_IN_SCALE];
    float *o = out[0];
    QUANT_FOR_EACH(p, i, c, o[i] = (float)q[i] * scale[c]);
    (void)err;
    return 0;
}

const op_def_t op_quantize = {
    .name = "quantize",
    .summary = "symmetric int8 quantization per tensor or per channel: q = clamp(rne(x / scale), "
               "-127, 127), scale = max|x| / 127 unless given",
    .n_inputs = 2,
    .input_names = quant_inputs,
    .required_inputs = 0x1,
    .param_names = quant_params,
    .sig = &quant_sig,
    .validate = quant_validate,
    .run_cpu = quant_run_cpu,
    .run_cuda = OP_CUDA(op_quantize_run_cuda),
};

const op_def_t op_dequantize = {
    .name = "dequantize",
    .summary = "out = q * scale in f32, per tensor or per channel along params.axis",
    .n_inputs = 2,
    .input_names = dequant_inputs,
    .required_inputs = 0x3,
    .param_names = quant_params,
    .sig = &dequant_sig,
    .validate = dequant_validate,
    .run_cpu = dequant_run_cpu,
    .run_cuda = OP_CUDA(op_dequantize_run_cuda),
};
