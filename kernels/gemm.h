/* The gemm op: what gemm.c (validation, CPU reference) and gemm.cu (cuBLASLt/cuBLAS) share.
 *
 * f64's accuracy bound. On CUDA an f64 gemm is cuBLAS's CUBLAS_COMPUTE_64F (on Hopper, DGEMM on
 * the FP64 tensor cores), which computes every product and sum as an IEEE f64 operation; the
 * emulated compute types (fixed-point f64 on integer tensor cores) are never asked for. Whatever
 * order cuBLAS sums in, each output element is then within
 *     gamma(k + 3) * (|alpha| * sum_q |a[i,q] * b[q,j]| + |beta * c[i,j]|)
 * of the exact value, where gamma(n) = n u / (1 - n u) and u = 2^-53: k products summed in any
 * tree of depth at most k, then the roundings of alpha's product, beta's and their sum. The CPU
 * reference accumulates in long double (a 64-bit significand on x86-64, u = 2^-64) and rounds
 * once to f64, so it lies within u |exact| + gamma_ld(k + 3) times the same magnitude: the
 * GPU's result and the reference differ by at most 1.001 (k + 5) 2^-53 times that magnitude
 * (tests/gpu/test_gpu_f64.c checks every element against the sum of the two bounds, and
 * tests/unit/test_kernels_gemm.c the reference against its own). f32, f16 and bf16 are bounded
 * in tests/gpu/test_gpu_gemm.c by their relative norm error; i8 is exact. */
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
