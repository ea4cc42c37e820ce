/* The reductions sum and dot: what reduce.c (validation, CPU reference) and reduce.cu (CUDA)
 * share.
 *
 * f32, f16 and bf16 inputs accumulate in f32 and give f32; f64 accumulates in f64; i32
 * accumulates in i64 (wrapping modulo 2^64, which takes more than 2^32 elements to reach) and
 * gives i64. The output is one element of shape []. Both implementations sum in a fixed order
 * that depends only on the number of elements, so a result is reproducible bit for bit.
 *
 * f64's accuracy bound. Each element (dot: each product, through an FMA) reaches the result
 * through at most d rounded additions, so the result is within gamma(d) * sum_i |x_i| (dot:
 * sum_i |x_i y_i|) of the exact sum, gamma(d) = d u / (1 - d u), u = 2^-53. The CPU reference
 * sums pairwise (leaves of at most 64 elements summed in order, then halves):
 * d = 64 + ceil(log2 n). CUDA sums 32 elements per thread, a block's 256 threads in a tree of
 * 10 levels, each call's tile partials 256 ways in order and then in the same tree, with tiles
 * of 8192 elements: d = 52 + ceil(n / 2^21), stated as 64 + ceil(n / 2^21). Both stay below
 * 2^-44 sum |x_i| for every size up to 2^29 elements (4 GiB of f64). tests/unit holds the CPU
 * reference, tests/gpu both, to these bounds around an exact sum computed with compensation
 * (error-free products and sums). */
#pragma once

#include <stdint.h>

#include "op.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum red_kind { RED_SUM, RED_DOT } red_kind_t;

/* The parsed shape of one validated call (OP_PARAMS(call, red_params_t)). */
typedef struct red_params {
    red_kind_t kind;
    dtype_t dtype;     /* of the inputs */
    dtype_t out_dtype; /* f32, f64 or i64 */
    int64_t n;         /* elements of x (and y) */
} red_params_t;

/* The op table entries (also reachable through op_find()). */
extern const op_def_t op_sum;
extern const op_def_t op_dot;

#ifdef GPUJOB_WITH_CUDA
int op_sum_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                    const void *const *const *in, void *const *const *out, op_error_t *err);
int op_dot_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                    const void *const *const *in, void *const *const *out, op_error_t *err);
#endif

#ifdef __cplusplus
}
#endif
