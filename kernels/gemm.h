/* The gemm op: what gemm.c (validation, CPU reference) and gemm.cu (cuBLASLt/cuBLAS) share. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "op.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One validated call (OP_PARAMS(call, gemm_params_t)): out[z] = alpha * op(a[z]) * op(b[z]) +
 * beta * c[z] for z in [0, batch), row-major, where an operand without leading dims is shared
 * by every z (a_batched / b_batched false). */
typedef struct gemm_params {
    dtype_t dtype;     /* of a and b */
    dtype_t out_dtype; /* of out and c: the input dtype, or i32 for i8 */
    bool trans_a, trans_b, tf32, has_c;
    bool a_batched, b_batched;
    double alpha, beta;
    int64_t m, n, k, batch;
} gemm_params_t;

extern const op_def_t op_gemm;

#ifdef GPUJOB_WITH_CUDA
int op_gemm_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                     const void *const *const *in, void *const *const *out, op_error_t *err);
#endif

#ifdef __cplusplus
}
#endif
