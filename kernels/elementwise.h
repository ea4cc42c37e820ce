/* The elementwise ops add, mul and saxpy: what elementwise.c (validation, CPU reference) and
 * elementwise.cu (CUDA) share.
 *
 * out = x + y, x * y, or a * x + y, elementwise over x's shape, y either of x's shape or a
 * single element broadcast over all of x. Floats of 16 bits compute in f32 and round once;
 * products and sums are rounded separately (never fused into an FMA), so the CPU reference and
 * the CUDA kernels give the same bits (as long as the host compiler does not contract a * x + y
 * itself, which it cannot for the baseline x86-64 target). i32 arithmetic wraps modulo 2^32.
 *
 * Accuracy: every result is the correctly rounded IEEE operation of its compute type, bit for
 * bit the same on the CPU and on CUDA. f64 computes in f64: add and mul are within half an ulp
 * of the exact x + y, x * y; saxpy rounds a * x and then the sum, so it is within
 * u (|a x| + |a x + y|) + u^2 |a x| of the exact a x + y (u = 2^-53), and never the FMA's single
 * rounding. tests/gpu/test_gpu_elementwise.c and test_gpu_f64.c hold CUDA's f64 to this
 * reference bit for bit. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "op.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ew_kind { EW_ADD, EW_MUL, EW_SAXPY } ew_kind_t;

/* The parsed params and shape of one validated call (OP_PARAMS(call, ew_params_t)). */
typedef struct ew_params {
    ew_kind_t kind;
    dtype_t dtype;
    bool y_scalar;  /* y is one element, broadcast over x */
    int64_t n;      /* elements of x and out */
    double a;       /* saxpy's factor (floats use it rounded to the compute type) */
    uint32_t a_u32; /* saxpy's factor for i32, reduced modulo 2^32 */
} ew_params_t;

/* The op table entries (also reachable through op_find()). */
extern const op_def_t op_add;
extern const op_def_t op_mul;
extern const op_def_t op_saxpy;

#ifdef GPUJOB_WITH_CUDA
int op_add_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                    const void *const *const *in, void *const *const *out, op_error_t *err);
int op_mul_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                    const void *const *const *in, void *const *const *out, op_error_t *err);
int op_saxpy_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                      const void *const *const *in, void *const *const *out, op_error_t *err);
#endif

#ifdef __cplusplus
}
#endif
