/* What the fuzz targets share: a reader of the fuzzer's bytes, and the size check every op
 * output must pass. A failed check traps (__builtin_trap), which libFuzzer reports as a crash
 * with the input that caused it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/op.h"

/* The fuzzer's input, consumed from the front; reads past its end give zeros. */
typedef struct fuzz_bytes {
    const uint8_t *p;
    size_t left;
} fuzz_bytes_t;

static inline uint64_t fuzz_take(fuzz_bytes_t *b, int nbytes)
{
    uint64_t v = 0;
    for (int i = 0; i < nbytes && b->left; i++, b->p++, b->left--)
        v |= (uint64_t)*b->p << (8 * i);
    return v;
}

/* Traps unless d is a descriptor whose byte size, recomputed in 128 bits as numel times the
 * dtype's size, fits in 64 bits and equals what tensor_desc_bytes() says. Every accepted
 * tensor, input or output, must pass: a size that wraps is a buffer overrun later. */
static inline void fuzz_check_desc(const tensor_desc_t *d)
{
    if ((unsigned)d->dtype >= DTYPE_COUNT || d->ndim < 0 || d->ndim > TENSOR_MAX_DIMS)
        __builtin_trap();
    unsigned __int128 bytes = dtype_size(d->dtype);
    bool zero = false;
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] < 0) __builtin_trap();
        zero = zero || d->shape[i] == 0;
    }
    /* A zero dimension makes every other one harmless; otherwise the product must fit. */
    for (int i = 0; i < d->ndim && !zero; i++) {
        bytes *= (uint64_t)d->shape[i];
        if (bytes > UINT64_MAX) __builtin_trap();
    }
    if (zero) bytes = 0;
    if (bytes != tensor_desc_bytes(d)) __builtin_trap();
}

/* Checks every output of a validated call, and that its cost is a number. */
static inline void fuzz_check_call(const op_call_t *call)
{
    if (call->n_out < 0 || call->n_out > OP_MAX_TENSORS) __builtin_trap();
    for (int j = 0; j < call->n_out; j++)
        fuzz_check_desc(&call->out[j]);
    if (!(call->cost.bytes >= 0) || !(call->cost.flops >= 0)) __builtin_trap();
    if (memchr(call->batch_key, '\0', sizeof call->batch_key) == NULL) __builtin_trap();
}
