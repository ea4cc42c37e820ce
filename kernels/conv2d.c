/* conv2d: validation, the CPU reference and the op table entry. The CUDA implementation is in
 * conv2d.cu. */
#include "conv2d.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const conv2d_input_names[CONV2D_N_INPUTS] = {
    "x", "w", "bias", "bn_scale", "bn_shift", "bn_mean", "bn_var",
};

static const char *const conv2d_param_names[] = {
    "stride", "padding", "dilation", "groups", "epilogue", "eps", NULL,
};

static const char *const conv2d_out_names[] = {"out"};

/* Epilogue step names in their required order; index i is bit 1 << i. */
static const char *const conv2d_epi_names[] = {"bias", "batchnorm", "relu", NULL};

/* Largest stride, padding or dilation accepted; far beyond any real network, and small
 * enough that the index arithmetic below stays in 64-bit range. */
#define CONV2D_PARAM_MAX (1 << 30)

/* Parses params.epilogue: null/absent is no epilogue, otherwise a list of step names, each at
 * most once and in the order bias, batchnorm, relu. */
static int conv2d_parse_epilogue(const json_t *params, uint32_t *ret, op_error_t *err)
{
    const json_t *list = params ? json_object_get(params, "epilogue") : NULL;
    if (!list || json_is_null(list)) {
        *ret = 0;
        return 0;
    }
    if (!json_is_array(list))
        return op_error(err, -EINVAL, "params.epilogue",
                        "params.epilogue must be a list of \"bias\", \"batchnorm\", \"relu\"");
    uint32_t bits = 0;
    int last = -1;
    size_t i;
    const json_t *entry;
    json_array_foreach(list, i, entry)
    {
        const char *name = json_string_value(entry);
        int step = -1;
        for (int s = 0; name && conv2d_epi_names[s]; s++)
            if (strcmp(name, conv2d_epi_names[s]) == 0) step = s;
        if (step < 0)
            return op_error(err, -EINVAL, "params.epilogue",
                            "params.epilogue[%zu] must be \"bias\", \"batchnorm\" or \"relu\"", i);
        if (step <= last)
            return op_error(err, -EINVAL, "params.epilogue",
                            "params.epilogue lists each step at most once, in the order "
                            "bias, batchnorm, relu (\"%s\" is out of place)",
                            name);
        last = step;
        bits |= 1u << step;
    }
    *ret = bits;
    return 0;
}

static int conv2d_parse_params(const json_t *params, conv2d_params_t *ret, op_error_t *err)
{
    int64_t stride[2] = {0}, padding[2] = {0}, dilation[2] = {0}, groups = 0;
    double eps = 0;
    uint32_t epilogue = 0;
    int r;
    if ((r = op_param_pair(params, "stride", 1, 1, CONV2D_PARAM_MAX, stride, err)) < 0 ||
        (r = op_param_pair(params, "padding", 0, 0, CONV2D_PARAM_MAX, padding, err)) < 0 ||
        (r = op_param_pair(params, "dilation", 1, 1, CONV2D_PARAM_MAX, dilation, err)) < 0 ||
        (r = op_param_int(params, "groups", 1, 1, INT32_MAX, &groups, err)) < 0 ||
        (r = op_param_double(params, "eps", 1e-5, &eps, err)) < 0 ||
        (r = conv2d_parse_epilogue(params, &epilogue, err)) < 0)
        return r;
    if (eps < 0)
        return op_error(err, -EINVAL, "params.eps", "params.eps must be >= 0 (got %g)", eps);
    conv2d_params_t p = {
        .stride = {(int32_t)stride[0], (int32_t)stride[1]},
        .padding = {(int32_t)padding[0], (int32_t)padding[1]},
        .dilation = {(int32_t)dilation[0], (int32_t)dilation[1]},
        .groups = (int32_t)groups,
        .epilogue = epilogue,
        .eps = eps,
    };
    *ret = p;
    return 0;
}

#define CONV2D_DTYPES (OP_DTYPE_BIT(DTYPE_F32) | OP_DTYPE_BIT(DTYPE_F16) | OP_DTYPE_BIT(DTYPE_BF16))

static const op_input_sig_t conv2d_input_sigs[CONV2D_N_INPUTS] = {
    {CONV2D_DTYPES, 4, 4}, {CONV2D_DTYPES, 4, 4}, {CONV2D_DTYPES, 1, 1}, {CONV2D_DTYPES, 1, 1},
    {CONV2D_DTYPES, 1, 1}, {CONV2D_DTYPES, 1, 1}, {CONV2D_DTYPES, 1, 1},
};
static const op_param_sig_t conv2d_param_sigs[] = {
    {"stride", OP_PARAM_INT_PAIR, 1, CONV2D_PARAM_MAX, "1", NULL, "An integer or [h, w]."},
    {"padding", OP_PARAM_INT_PAIR, 0, CONV2D_PARAM_MAX, "0", NULL, "An integer or [h, w]."},
    {"dilation", OP_PARAM_INT_PAIR, 1, CONV2D_PARAM_MAX, "1", NULL, "An integer or [h, w]."},
    {"groups", OP_PARAM_INT, 1, INT32_MAX, "1", NULL, "Channel groups."},
    {"epilogue", OP_PARAM_NAMES, -HUGE_VAL, HUGE_VAL, "null", conv2d_epi_names,
     "Steps fused after the convolution, each at most once, in the order bias, batchnorm, "
     "relu."},
    {"eps", OP_PARAM_NUMBER, 0, HUGE_VAL, "1e-05", NULL, "batchnorm's epsilon."},
};
static const op_sig_t conv2d_sig = {
    .inputs = conv2d_input_sigs,
    .params = conv2d_param_sigs,
    .rules = "x is [N, C, H, W] and w [K, C/groups, R, S] of x's dtype with R, S >= 1; groups "
             "divides C and K; the dilated filter fits the padded input; bias is given exactly "
             "when the epilogue has bias, and bn_scale, bn_shift, bn_mean, bn_var exactly when it "
             "has batchnorm, each [K] of f32 or x's dtype.",
};

static bool conv2d_dtype_supported(dtype_t dt)
{
    return CONV2D_DTYPES & OP_DTYPE_BIT(dt);
}

/* Checks one epilogue vector: present exactly when its step is in the epilogue, shape [K],
 * dtype f32 or x's dtype. */
static int conv2d_check_vector(const op_call_t *call, int slot, bool needed, const char *step,
                               int64_t k, op_error_t *err)
{
    const char *name = conv2d_input_names[slot];
    char field[64];
    snprintf(field, sizeof field, "inputs.%s", name);
    if (needed && !call->has_in[slot])
        return op_error(err, -EINVAL, field, "params.epilogue has \"%s\", which needs inputs.%s",
                        step, name);
    if (!needed && call->has_in[slot])
        return op_error(err, -EINVAL, field, "inputs.%s is given but params.epilogue has no \"%s\"",
                        name, step);
    if (!needed) return 0;
    const tensor_desc_t *v = &call->in[slot];
    if (v->dtype != DTYPE_F32 && v->dtype != call->in[CONV2D_IN_X].dtype) {
        snprintf(field, sizeof field, "inputs.%s.dtype", name);
        return op_error(err, -EINVAL, field, "inputs.%s must be f32 or %s like inputs.x (got %s)",
                        name, dtype_name(call->in[CONV2D_IN_X].dtype), dtype_name(v->dtype));
    }
    if (v->ndim != 1 || v->shape[0] != k) {
        char shape[96];
        snprintf(field, sizeof field, "inputs.%s.shape", name);
        return op_error(err, -EINVAL, field, "inputs.%s must have shape [%lld] (got %s)", name,
                        (long long)k, tensor_shape_str(v, shape, sizeof shape));
    }
    return 0;
}

/* The extent of a dilated kernel, dil * (ker - 1) + 1, saturated at INT64_MAX: a kernel that
 * large fits no input. */
static int64_t conv2d_dilated(int64_t dil, int64_t ker)
{
    int64_t span;
    if (size_mul(dil, ker - 1, &span) < 0 || size_add(span, 1, &span) < 0) return INT64_MAX;
    return span;
}

/* Output size along one axis of a padded input (at most 2^31 - 1 long); 0 when the dilated
 * kernel does not fit it. */
static int64_t conv2d_out_size(int64_t padded, int64_t dil, int64_t ker, int64_t stride)
{
    int64_t span = conv2d_dilated(dil, ker);
    return span > padded ? 0 : (padded - span) / stride + 1;
}

/* Checks inputs.x and inputs.w: dtypes, [N, C, H, W] and [K, C/groups, R, S] shapes, and that
 * params.groups divides both channel counts. */
static int conv2d_check_x_w(const op_call_t *call, const conv2d_params_t *p, op_error_t *err)
{
    const tensor_desc_t *x = &call->in[CONV2D_IN_X], *w = &call->in[CONV2D_IN_W];
    char shape[96];
    if (!conv2d_dtype_supported(x->dtype))
        return op_error(err, -EINVAL, "inputs.x.dtype",
                        "inputs.x must be f32, f16 or bf16 (got %s)", dtype_name(x->dtype));
    if (x->ndim != 4)
        return op_error(err, -EINVAL, "inputs.x.shape", "inputs.x must be [N, C, H, W] (got %s)",
                        tensor_shape_str(x, shape, sizeof shape));
    if (w->dtype != x->dtype)
        return op_error(err, -EINVAL, "inputs.w.dtype",
                        "inputs.w must be %s like inputs.x (got %s)", dtype_name(x->dtype),
                        dtype_name(w->dtype));
    if (w->ndim != 4 || w->shape[2] < 1 || w->shape[3] < 1)
        return op_error(err, -EINVAL, "inputs.w.shape",
                        "inputs.w must be [K, C/groups, R, S] with R, S >= 1 (got %s)",
                        tensor_shape_str(w, shape, sizeof shape));
    int64_t c = x->shape[1], k = w->shape[0];
    if (c % p->groups != 0)
        return op_error(err, -EINVAL, "params.groups",
                        "params.groups (%d) must divide the input channels C = %lld", p->groups,
                        (long long)c);
    if (k % p->groups != 0)
        return op_error(err, -EINVAL, "params.groups",
                        "params.groups (%d) must divide the output channels K = %lld", p->groups,
                        (long long)k);
    if (w->shape[1] != c / p->groups)
        return op_error(err, -EINVAL, "inputs.w.shape",
                        "inputs.w must be [K, C/groups = %lld, R, S] (got %s)",
                        (long long)(c / p->groups), tensor_shape_str(w, shape, sizeof shape));
    return 0;
}

/* Checks the epilogue's vectors (bias, then the four batchnorm ones) against the epilogue and
 * the K output channels. */
static int conv2d_check_epilogue_inputs(const op_call_t *call, uint32_t epilogue, int64_t k,
                                        op_error_t *err)
{
    bool bias = epilogue & CONV2D_EPI_BIAS, bn = epilogue & CONV2D_EPI_BATCHNORM;
    int r;
    if ((r = conv2d_check_vector(call, CONV2D_IN_BIAS, bias, "bias", k, err)) < 0) return r;
    for (int slot = CONV2D_IN_BN_SCALE; slot <= CONV2D_IN_BN_VAR; slot++)
        if ((r = conv2d_check_vector(call, slot, bn, "batchnorm", k, err)) < 0) return r;
    return 0;
}

/* Computes the output [N, K, P, Q] of checked x and w, refusing an empty output and any size
 * the CUDA kernels cannot index. 0 and *ret_out, or a negative errno with err filled. */
static int conv2d_output_desc(const tensor_desc_t *x, const tensor_desc_t *w,
                              const conv2d_params_t *p, tensor_desc_t *ret_out, op_error_t *err)
{
    int64_t n = x->shape[0], h = x->shape[2], wd = x->shape[3];
    int64_t k = w->shape[0], kr = w->shape[2], ks = w->shape[3];
    /* The CUDA kernels index within int32; keep every coordinate they form inside it. h and
     * wd passed tensor_desc_check() with elements of 2 bytes or more, so the sums fit. */
    int64_t padded_h = h + 2 * (int64_t)p->padding[0], padded_w = wd + 2 * (int64_t)p->padding[1];
    if (padded_h > INT32_MAX || padded_w > INT32_MAX)
        return op_error(err, -EINVAL, "params.padding",
                        "params.padding makes the padded input larger than 2^31");
    int64_t out_p = conv2d_out_size(padded_h, p->dilation[0], kr, p->stride[0]);
    int64_t out_q = conv2d_out_size(padded_w, p->dilation[1], ks, p->stride[1]);
    if (out_p < 1 || out_q < 1)
        return op_error(err, -EINVAL, "params",
                        "the output would be empty (P = %lld, Q = %lld): the dilated kernel "
                        "(%lld x %lld) is larger than the padded input (%lld x %lld); check "
                        "params.padding, params.dilation and params.stride",
                        (long long)out_p, (long long)out_q,
                        (long long)conv2d_dilated(p->dilation[0], kr),
                        (long long)conv2d_dilated(p->dilation[1], ks), (long long)padded_h,
                        (long long)padded_w);

    tensor_desc_t out = {.dtype = x->dtype, .ndim = 4, .shape = {n, k, out_p, out_q}};
    if (tensor_desc_numel(x) > INT32_MAX || tensor_desc_numel(w) > INT32_MAX)
        return op_error(err, -E2BIG,
                        tensor_desc_numel(x) > INT32_MAX ? "inputs.x.shape" : "inputs.w.shape",
                        "conv2d takes tensors of at most 2^31 - 1 elements");
    int64_t numel;
    if (size_product(out.shape, 4, &numel) < 0 || numel > INT32_MAX)
        return op_error(err, -E2BIG, "outputs.out",
                        "the output [%lld, %lld, %lld, %lld] would exceed 2^31 - 1 elements",
                        (long long)n, (long long)k, (long long)out_p, (long long)out_q);
    *ret_out = out;
    return 0;
}

/* The scheduler's cost of a validated call: the convolution's multiply-adds and the epilogue's
 * per-element steps, and the bytes of every tensor read or written. */
static void conv2d_set_cost(op_call_t *call, const conv2d_params_t *p)
{
    const tensor_desc_t *x = &call->in[CONV2D_IN_X], *w = &call->in[CONV2D_IN_W];
    const tensor_desc_t *out = &call->out[0];
    int64_t c = x->shape[1], kr = w->shape[2], ks = w->shape[3];
    bool bias = p->epilogue & CONV2D_EPI_BIAS, bn = p->epilogue & CONV2D_EPI_BATCHNORM;
    double macs = (double)tensor_desc_numel(out) * (double)(c / p->groups) * kr * ks;
    double epi_flops = (bias ? 1 : 0) + (bn ? 2 : 0) + ((p->epilogue & CONV2D_EPI_RELU) ? 1 : 0);
    double vec_bytes = 0;
    for (int slot = CONV2D_IN_BIAS; slot < CONV2D_N_INPUTS; slot++)
        if (call->has_in[slot]) vec_bytes += (double)tensor_desc_bytes(&call->in[slot]);
    call->cost.flops = 2 * macs + epi_flops * (double)tensor_desc_numel(out);
    call->cost.bytes = (double)tensor_desc_bytes(x) + (double)tensor_desc_bytes(w) + vec_bytes +
                       (double)tensor_desc_bytes(out);
}

/* Calls batch when the kernel's shape and params agree; eps and the epilogue vectors' dtypes
 * are read per call. A key that does not fit is left empty: never batched, rather than batched
 * wrongly on a truncated key. */
static void conv2d_set_batch_key(op_call_t *call, const conv2d_params_t *p)
{
    const tensor_desc_t *x = &call->in[CONV2D_IN_X], *w = &call->in[CONV2D_IN_W];
    int len = snprintf(call->batch_key, sizeof call->batch_key,
                       "conv2d/%s/%lldx%lldx%lldx%lld/%lldx%lldx%lldx%lld/s%dx%d/p%dx%d/d%dx%d/"
                       "g%d/e%u",
                       dtype_name(x->dtype), (long long)x->shape[0], (long long)x->shape[1],
                       (long long)x->shape[2], (long long)x->shape[3], (long long)w->shape[0],
                       (long long)w->shape[1], (long long)w->shape[2], (long long)w->shape[3],
                       p->stride[0], p->stride[1], p->padding[0], p->padding[1], p->dilation[0],
                       p->dilation[1], p->groups, p->epilogue);
    if (len < 0 || (size_t)len >= sizeof call->batch_key) call->batch_key[0] = '\0';
}

static int conv2d_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    int r = op_params_check_keys(&op_conv2d, params, err);
    if (r < 0) return r;
    conv2d_params_t p;
    if ((r = conv2d_parse_params(params, &p, err)) < 0) return r;
    if ((r = conv2d_check_x_w(call, &p, err)) < 0) return r;
    const tensor_desc_t *x = &call->in[CONV2D_IN_X], *w = &call->in[CONV2D_IN_W];
    if ((r = conv2d_check_epilogue_inputs(call, p.epilogue, w->shape[0], err)) < 0) return r;
    tensor_desc_t out;
    if ((r = conv2d_output_desc(x, w, &p, &out, err)) < 0) return r;

    memset(call->params.bytes, 0, sizeof call->params.bytes);
    *OP_PARAMS(call, conv2d_params_t) = p;
    call->n_out = 1;
    call->out_names[0] = conv2d_out_names[0];
    call->out[0] = out;
    conv2d_set_cost(call, &p);
    conv2d_set_batch_key(call, &p);
    return 0;
}

/* Copies n elements of a typed tensor into a new array of doubles; NULL when out of memory. */
static double *conv2d_load_doubles(dtype_t dt, const void *data, int64_t n)
{
    double *d = size_malloc(n, sizeof *d);
    for (int64_t i = 0; d && i < n; i++)
        d[i] = tensor_load(dt, data, i);
    return d;
}

/* The reference: a direct loop over every output, accumulating in double, then the epilogue
 * in double and one rounding to the output dtype. */
static int conv2d_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                          op_error_t *err)
{
    const conv2d_params_t *p = OP_PARAMS(call, const conv2d_params_t);
    const tensor_desc_t *xd = &call->in[CONV2D_IN_X], *wd = &call->in[CONV2D_IN_W];
    const tensor_desc_t *od = &call->out[0];
    const int64_t n_img = xd->shape[0], c_in = xd->shape[1], h = xd->shape[2], w = xd->shape[3];
    const int64_t k_out = wd->shape[0], cg = wd->shape[1], kr = wd->shape[2], ks = wd->shape[3];
    const int64_t out_p = od->shape[2], out_q = od->shape[3];
    const int64_t kg = k_out / p->groups;

    double *x = conv2d_load_doubles(xd->dtype, in[CONV2D_IN_X], tensor_desc_numel(xd));
    double *wt = conv2d_load_doubles(wd->dtype, in[CONV2D_IN_W], tensor_desc_numel(wd));
    /* The epilogue vectors in double, NULL when absent (slots CONV2D_IN_BIAS onwards). */
    double *vec[CONV2D_N_INPUTS] = {0};
    int r = 0;
    bool oom = !x || !wt;
    for (int slot = CONV2D_IN_BIAS; slot < CONV2D_N_INPUTS; slot++)
        if (in[slot]) {
            vec[slot] = conv2d_load_doubles(call->in[slot].dtype, in[slot], k_out);
            oom |= !vec[slot];
        }
    if (oom) {
        r = op_error(err, -ENOMEM, "", "conv2d: out of host memory");
        goto out;
    }

    const bool bias = p->epilogue & CONV2D_EPI_BIAS, bn = p->epilogue & CONV2D_EPI_BATCHNORM;
    const bool relu = p->epilogue & CONV2D_EPI_RELU;
    for (int64_t n = 0; n < n_img && r == 0; n++)
        for (int64_t k = 0; k < k_out; k++) {
            /* A cancelled run stops between output planes. */
            if (op_call_cancelled(call)) {
                r = op_error_cancelled(err);
                break;
            }
            const int64_t c0 = (k / kg) * cg;
            for (int64_t op = 0; op < out_p; op++)
                for (int64_t oq = 0; oq < out_q; oq++) {
                    double acc = 0;
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t i = 0; i < kr; i++) {
                            int64_t ih = op * p->stride[0] - p->padding[0] + i * p->dilation[0];
                            if (ih < 0 || ih >= h) continue;
                            const double *xrow = x + ((n * c_in + c0 + c) * h + ih) * w;
                            const double *wrow = wt + ((k * cg + c) * kr + i) * ks;
                            for (int64_t j = 0; j < ks; j++) {
                                int64_t iw = oq * p->stride[1] - p->padding[1] + j * p->dilation[1];
                                if (iw >= 0 && iw < w) acc += xrow[iw] * wrow[j];
                            }
                        }
                    double y = acc;
                    if (bias) y += vec[CONV2D_IN_BIAS][k];
                    if (bn)
                        y = (y - vec[CONV2D_IN_BN_MEAN][k]) /
                                sqrt(vec[CONV2D_IN_BN_VAR][k] + p->eps) *
                                vec[CONV2D_IN_BN_SCALE][k] +
                            vec[CONV2D_IN_BN_SHIFT][k];
                    if (relu && y < 0) y = 0;
                    tensor_store(od->dtype, out[0], ((n * k_out + k) * out_p + op) * out_q + oq, y);
                }
        }
out:
    free(x);
    free(wt);
    for (int slot = 0; slot < CONV2D_N_INPUTS; slot++)
        free(vec[slot]);
    return r;
}

const op_def_t op_conv2d = {
    .name = "conv2d",
    .summary = "2-D convolution over NCHW (stride, padding, dilation, groups) with a fused "
               "bias / batchnorm / relu epilogue",
    .n_inputs = CONV2D_N_INPUTS,
    .input_names = conv2d_input_names,
    .required_inputs = (1u << CONV2D_IN_X) | (1u << CONV2D_IN_W),
    .param_names = conv2d_param_names,
    .sig = &conv2d_sig,
    .validate = conv2d_validate,
    .run_cpu = conv2d_run_cpu,
    .run_cuda = OP_CUDA(op_conv2d_run_cuda),
};
