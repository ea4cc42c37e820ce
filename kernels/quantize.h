/* quantize and dequantize: what quantize.c (validation, CPU reference) and quantize.cu (CUDA)
 * share.
 *
 * Symmetric int8 quantization, per tensor or per channel along one axis:
 *     scale = max|x| / 127 over the tensor or channel (1 for an all-zero channel, or when the
 *             quotient underflows to 0), unless the caller gives the scale;
 *     q     = clamp(rne(x / scale), -127, 127), with a NaN quotient giving 0;
 *     out   = q * scale (dequantize), in f32.
 * NaNs in x are ignored by the max. Both implementations compute each value with the same
 * correctly rounded f32 operations, so they agree bit for bit. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "op.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The parsed params and shape of one validated call (OP_PARAMS(call, quant_params_t)). x (or q)
 * is viewed as [outer, channels, inner]; per tensor, channels is 1 and inner is n. */
typedef struct quant_params {
    dtype_t dtype; /* of x for quantize; i8 for dequantize */
    bool per_channel;
    bool has_scale; /* quantize: the scale input was given */
    int axis;       /* normalized to [0, ndim); -1 per tensor */
    int64_t n;
    int64_t channels;
    int64_t inner;
} quant_params_t;

/* The op table entries (also reachable through op_find()). */
extern const op_def_t op_quantize;
extern const op_def_t op_dequantize;

#ifdef GPUJOB_WITH_CUDA
int op_quantize_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                         const void *const *const *in, void *const *const *out, op_error_t *err);
int op_dequantize_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                           const void *const *const *in, void *const *const *out, op_error_t *err);
#endif

#ifdef __cplusplus
}
#endif
