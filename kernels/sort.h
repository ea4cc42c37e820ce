/* The sort op: what sort.c (validation, CPU reference) and sort.cu (CUDA) share.
 *
 * Both sides sort "order keys": unsigned integers whose plain ascending order is the order the
 * op promises. A key of any supported dtype maps to one (32 bits for u32/i32/f32, 64 bits for
 * i64/f64); descending order is ascending order of the inverted key, which keeps the sort stable
 * in both directions; floats (f32 and f64 alike) map so that -inf < negatives < -0.0 < +0.0 <
 * positives < +inf and every NaN maps to the largest key (last in both directions, in input
 * order) and comes back as the canonical NaN of its dtype. The map is a bijection on everything
 * but NaNs, so every other key comes back bit for bit. */
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

/* The bit pattern of a NaN key in the output, whatever NaN came in: f32, f64. */
#define SORT_CANONICAL_NAN_BITS 0x7fc00000u
#define SORT_CANONICAL_NAN64_BITS 0x7ff8000000000000ull

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

/* Whether keys of dtype dt have 64-bit order keys (i64, f64) rather than 32-bit ones. */
SORT_HD bool sort_key_is_wide(dtype_t dt)
{
    return dt == DTYPE_I64 || dt == DTYPE_F64;
}

/* Order key of a 64-bit key (i64 or f64 given as its bits): f64 as f32 is mapped in
 * sort_order_key32, with the 64-bit sign, exponent and NaN patterns. */
SORT_HD uint64_t sort_order_key64(dtype_t dt, uint64_t bits, bool descending)
{
    uint64_t k;
    if (dt == DTYPE_F64) {
        if ((bits & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
            return 0xffffffffffffffffull; /* NaN: last either way */
        k = (bits & 0x8000000000000000ull) ? ~bits : (bits | 0x8000000000000000ull);
    } else {
        k = bits ^ 0x8000000000000000ull;
    }
    return descending ? ~k : k;
}

/* Inverse of sort_order_key64: the key's bits, NaN canonicalized. */
SORT_HD uint64_t sort_key64_from_order(dtype_t dt, uint64_t k, bool descending)
{
    if (dt == DTYPE_F64) {
        if (k == 0xffffffffffffffffull) return SORT_CANONICAL_NAN64_BITS;
        if (descending) k = ~k;
        return (k & 0x8000000000000000ull) ? (k & 0x7fffffffffffffffull) : ~k;
    }
    return (descending ? ~k : k) ^ 0x8000000000000000ull;
}
