/* The sort op: what sort.c (validation, CPU reference) and sort.cu (CUDA) share.
 *
 * Both sides sort "order keys": unsigned integers whose plain ascending order is the order the
 * op promises. A key of any supported dtype maps to one (32 bits for u32/i32/f32, 64 bits for
 * i64); descending order is ascending order of the inverted key, which keeps the sort stable in
 * both directions; floats map so that -inf < negatives < -0.0 < +0.0 < positives < +inf and every
 * NaN maps to the largest key (last in both directions) and comes back as the canonical NaN. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "op.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The parsed params and shape of one validated sort call (OP_PARAMS(call, sort_params_t)). */
typedef struct sort_params {
    dtype_t key_dtype;
    dtype_t value_dtype; /* meaningful only with has_values */
    bool descending;
    bool argsort;
    bool has_values;
    int64_t rows; /* product of the leading dims: independent rows */
    int64_t len;  /* the last dim: elements per row */
} sort_params_t;

/* The bit pattern of a NaN key in the output, whatever NaN came in. */
#define SORT_CANONICAL_NAN_BITS 0x7fc00000u

extern const op_def_t op_sort;

#ifdef GPUJOB_WITH_CUDA
int op_sort_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                     const void *const *const *in, void *const *const *out, op_error_t *err);
#endif

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#define SORT_HD static inline __host__ __device__
#else
#define SORT_HD static inline
#endif

/* Order key of a 32-bit key (u32, i32 or f32 given as its bits). */
SORT_HD uint32_t sort_order_key32(dtype_t dt, uint32_t bits, bool descending)
{
    uint32_t k;
    if (dt == DTYPE_F32) {
        if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu; /* NaN: last either way */
        /* Negative floats order reversed by magnitude; the sign bit puts positives above. */
        k = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    } else if (dt == DTYPE_I32) {
        k = bits ^ 0x80000000u;
    } else {
        k = bits;
    }
    return descending ? ~k : k;
}

/* Inverse of sort_order_key32: the key's bits, NaN canonicalized. */
SORT_HD uint32_t sort_key32_from_order(dtype_t dt, uint32_t k, bool descending)
{
    if (dt == DTYPE_F32) {
        if (k == 0xffffffffu) return SORT_CANONICAL_NAN_BITS;
        if (descending) k = ~k;
        return (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    }
    if (descending) k = ~k;
    return dt == DTYPE_I32 ? k ^ 0x80000000u : k;
}

/* Order key of an i64 key given as its bits, and its inverse. */
SORT_HD uint64_t sort_order_key64(uint64_t bits, bool descending)
{
    uint64_t k = bits ^ 0x8000000000000000ull;
    return descending ? ~k : k;
}

SORT_HD uint64_t sort_key64_from_order(uint64_t k, bool descending)
{
    return (descending ? ~k : k) ^ 0x8000000000000000ull;
}
