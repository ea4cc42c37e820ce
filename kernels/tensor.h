/* Tensor descriptors and element types shared by every layer of gpujobd.
 *
 * A descriptor says what a tensor is (dtype and shape); where its bytes live is the
 * business of whoever holds them (a host buffer, device memory, a blob in the store). Tensors
 * are dense and row-major (C order); the last dimension is contiguous. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dtype {
    DTYPE_F32,
    DTYPE_F16,
    DTYPE_BF16,
    DTYPE_F64,
    DTYPE_I8,
    DTYPE_I32,
    DTYPE_U32,
    DTYPE_I64,
    DTYPE_COUNT
} dtype_t;

#define TENSOR_MAX_DIMS 8

typedef struct tensor_desc {
    dtype_t dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[TENSOR_MAX_DIMS];
} tensor_desc_t;

/* Size of one element in bytes. */
size_t dtype_size(dtype_t dt);
/* "f32", "bf16", ...; a static string. */
const char *dtype_name(dtype_t dt);
/* Parses a dtype name; 0 or -EINVAL. *ret written only on success. */
int dtype_parse(const char *name, dtype_t *ret);
bool dtype_is_float(dtype_t dt);

/* Overflow-checked size arithmetic. Every size computed from a request's numbers (element
 * counts, bytes, workspace, partial products of a shape) goes through these, so that a hostile
 * shape is refused where it is computed instead of wrapping into a small buffer. Operands must
 * be >= 0. 0 and *ret, or -EOVERFLOW (*ret untouched) when an operand is negative or the result
 * does not fit in int64_t. */
int size_mul(int64_t a, int64_t b, int64_t *ret);
int size_add(int64_t a, int64_t b, int64_t *ret);
/* The product of dims[0..n) with size_mul(); 1 for n = 0. */
int size_product(const int64_t *dims, int n, int64_t *ret);
/* malloc() of count elements of elem_size bytes (at least one byte, so that an empty scratch
 * is not mistaken for a failure), the size through size_mul(): the one way a kernel takes
 * host scratch memory. NULL when the size overflows or memory is short; free() it. */
void *size_malloc(int64_t count, int64_t elem_size);

/* Number of elements (1 for a scalar). The descriptor must have passed tensor_desc_check(). */
int64_t tensor_desc_numel(const tensor_desc_t *d);
/* Bytes of the dense tensor. The descriptor must have passed tensor_desc_check(). */
uint64_t tensor_desc_bytes(const tensor_desc_t *d);
/* Checks ndim in [0, TENSOR_MAX_DIMS], every dim >= 0, that the shape is bounded, and that the
 * byte size does not exceed max_bytes. Bounded means that the element size times the product of
 * the nonzero dims fits in int64_t: so every dim and every partial product of the shape (which
 * ops form when they split it into rows, channels or batches) fits too, wherever a zero is, and
 * [0, 2^62, 2^62] is refused as [2^62, 2^62, 0] is. Returns 0, -EINVAL (bad dims), -EOVERFLOW
 * (unbounded shape) or -E2BIG (too many bytes). */
int tensor_desc_check(const tensor_desc_t *d, uint64_t max_bytes);
bool tensor_desc_equal(const tensor_desc_t *a, const tensor_desc_t *b);
/* Writes "[2, 3]" into buf (always NUL-terminated); returns buf. */
char *tensor_shape_str(const tensor_desc_t *d, char *buf, size_t size);

/* Conversions for the 16-bit float types, round-to-nearest-even, NaN kept NaN. */
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

/* Reads element i of a typed array as a double, and writes a double into element i, rounding
 * to nearest even for floats and saturating for integers. For CPU references and tests. */
double tensor_load(dtype_t dt, const void *data, int64_t i);
void tensor_store(dtype_t dt, void *data, int64_t i, double v);

#ifdef __cplusplus
}
#endif
