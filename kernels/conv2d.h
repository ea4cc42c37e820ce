/* conv2d: 2-D convolution over NCHW tensors with a fused bias / batchnorm / relu epilogue.
 *
 * Shared between kernels/conv2d.c (validation, CPU reference, op table entry) and
 * kernels/conv2d.cu (the CUDA implementation). The shapes live in the call's descriptors:
 * x [N, C, H, W], w [K, C/groups, R, S], out [N, K, P, Q]. The epilogue vectors (bias, bn_*)
 * are each [K] and each either f32 or the dtype of x; whatever their dtype, the epilogue is
 * computed in f32 (CUDA) or f64 (CPU) before the single rounding to the output dtype. */
#pragma once

#include <stdint.h>

#include "op.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Slots of conv2d's inputs, in the order of op_conv2d.input_names. */
enum {
    CONV2D_IN_X,
    CONV2D_IN_W,
    CONV2D_IN_BIAS,
    CONV2D_IN_BN_SCALE,
    CONV2D_IN_BN_SHIFT,
    CONV2D_IN_BN_MEAN,
    CONV2D_IN_BN_VAR,
    CONV2D_N_INPUTS
};

/* Bits of conv2d_params_t.epilogue; the steps always apply in this order. */
enum {
    CONV2D_EPI_BIAS = 1u << 0,
    CONV2D_EPI_BATCHNORM = 1u << 1,
    CONV2D_EPI_RELU = 1u << 2,
};

/* The parsed params of one call (OP_PARAMS(call, conv2d_params_t)). Index 0 is the height
 * direction, 1 the width direction. */
typedef struct conv2d_params {
    int32_t stride[2];
    int32_t padding[2];
    int32_t dilation[2];
    int32_t groups;
    uint32_t epilogue; /* CONV2D_EPI_* bits */
    double eps;
} conv2d_params_t;

extern const op_def_t op_conv2d;

#ifdef GPUJOB_WITH_CUDA
/* The CUDA entry of op_conv2d (kernels/conv2d.cu); see op_def_t.run_cuda. */
int op_conv2d_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                       const void *const *const *in, void *const *const *out, op_error_t *err);
#endif

#ifdef __cplusplus
}
#endif
