#include "tensor.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} dtype_info[DTYPE_COUNT] = {
    [DTYPE_F32] = {"f32", 4, true},   [DTYPE_F16] = {"f16", 2, true},
    [DTYPE_BF16] = {"bf16", 2, true}, [DTYPE_F64] = {"f64", 8, true},
    [DTYPE_I8] = {"i8", 1, false},    [DTYPE_I32] = {"i32", 4, false},
    [DTYPE_U32] = {"u32", 4, false},  [DTYPE_I64] = {"i64", 8, false},
};

size_t dtype_size(dtype_t dt)
{
    return dt < DTYPE_COUNT ? dtype_info[dt].size : 0;
}

const char *dtype_name(dtype_t dt)
{
    return dt < DTYPE_COUNT ? dtype_info[dt].name : "invalid";
}

bool dtype_is_float(dtype_t dt)
{
    return dt < DTYPE_COUNT && dtype_info[dt].is_float;
}

int dtype_parse(const char *name, dtype_t *ret)
{
    if (!name) return -EINVAL;
    for (int i = 0; i < DTYPE_COUNT; i++)
        if (strcmp(name, dtype_info[i].name) == 0) {
            *ret = (dtype_t)i;
            return 0;
        }
    return -EINVAL;
}

int size_mul(int64_t a, int64_t b, int64_t *ret)
{
    int64_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return -EOVERFLOW;
    *ret = r;
    return 0;
}

void *size_malloc(int64_t count, int64_t elem_size)
{
    int64_t bytes;
    if (size_mul(count, elem_size, &bytes) < 0 || (uint64_t)bytes > SIZE_MAX) return NULL;
    return malloc(bytes > 0 ? (size_t)bytes : 1);
}

int size_add(int64_t a, int64_t b, int64_t *ret)
{
    int64_t r;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return -EOVERFLOW;
    *ret = r;
    return 0;
}

int size_product(const int64_t *dims, int n, int64_t *ret)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        if (size_mul(p, dims[i], &p) < 0) return -EOVERFLOW;
    *ret = p;
    return 0;
}

int64_t tensor_desc_numel(const tensor_desc_t *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++)
        n *= d->shape[i];
    return n;
}

uint64_t tensor_desc_bytes(const tensor_desc_t *d)
{
    return (uint64_t)tensor_desc_numel(d) * dtype_size(d->dtype);
}

int tensor_desc_check(const tensor_desc_t *d, uint64_t max_bytes)
{
    if (d->dtype >= DTYPE_COUNT || d->ndim < 0 || d->ndim > TENSOR_MAX_DIMS) return -EINVAL;
    int64_t extent = (int64_t)dtype_size(d->dtype);
    bool empty = false;
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] < 0) return -EINVAL;
        if (d->shape[i] == 0)
            empty = true;
        else if (size_mul(extent, d->shape[i], &extent) < 0)
            return -EOVERFLOW;
    }
    uint64_t bytes = empty ? 0 : (uint64_t)extent;
    return bytes > max_bytes ? -E2BIG : 0;
}

bool tensor_desc_equal(const tensor_desc_t *a, const tensor_desc_t *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

char *tensor_shape_str(const tensor_desc_t *d, char *buf, size_t size)
{
    size_t used = 0;
    int n = snprintf(buf, size, "[");
    used = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < d->ndim && used < size; i++) {
        n = snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)d->shape[i]);
        used += n > 0 ? (size_t)n : 0;
    }
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN, sign kept */
    u += 0x7fff + ((u >> 16) & 1);                     /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf or NaN */
        return bits_f32(sign | 0x7f800000 | (man << 13));
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t au = u & 0x7fffffff;
    if (au > 0x7f800000) /* NaN */
        return sign | 0x7e00;
    if (au >= 0x477ff000) /* rounds to >= 65520: infinity */
        return sign | 0x7c00;
    if (au < 0x38800000) {
        /* subnormal or zero in f16: value / 2^-24, rounded to nearest even */
        float v = bits_f32(au) * 16777216.0f; /* exact: scaling by a power of two */
        return sign | (uint16_t)lrintf(v);
    }
    uint32_t r = au - 0x38000000; /* rebias exponent 127 -> 15 */
    r += 0xfff + ((r >> 13) & 1); /* round to nearest even on the 13 dropped bits */
    return sign | (uint16_t)(r >> 13);
}

double tensor_load(dtype_t dt, const void *data, int64_t i)
{
    switch (dt) {
    case DTYPE_F32:
        return ((const float *)data)[i];
    case DTYPE_F16:
        return f16_to_f32(((const uint16_t *)data)[i]);
    case DTYPE_BF16:
        return bf16_to_f32(((const uint16_t *)data)[i]);
    case DTYPE_F64:
        return ((const double *)data)[i];
    case DTYPE_I8:
        return ((const int8_t *)data)[i];
    case DTYPE_I32:
        return ((const int32_t *)data)[i];
    case DTYPE_U32:
        return ((const uint32_t *)data)[i];
    case DTYPE_I64:
        return (double)((const int64_t *)data)[i];
    default:
        return 0;
    }
}

static double clamp(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

void tensor_store(dtype_t dt, void *data, int64_t i, double v)
{
    if (!dtype_is_float(dt) && isnan(v)) v = 0;
    switch (dt) {
    case DTYPE_F32:
        ((float *)data)[i] = (float)v;
        break;
    case DTYPE_F16:
        ((uint16_t *)data)[i] = f32_to_f16((float)v);
        break;
    case DTYPE_BF16:
        ((uint16_t *)data)[i] = f32_to_bf16((float)v);
        break;
    case DTYPE_F64:
        ((double *)data)[i] = v;
        break;
    case DTYPE_I8:
        ((int8_t *)data)[i] = (int8_t)nearbyint(clamp(v, -128, 127));
        break;
    case DTYPE_I32:
        ((int32_t *)data)[i] = (int32_t)nearbyint(clamp(v, INT32_MIN, INT32_MAX));
        break;
    case DTYPE_U32:
        ((uint32_t *)data)[i] = (uint32_t)nearbyint(clamp(v, 0, UINT32_MAX));
        break;
    case DTYPE_I64:
        ((int64_t *)data)[i] = v >= 9.2233720368547758e18    ? INT64_MAX
                               : v <= -9.2233720368547758e18 ? INT64_MIN
                                                             : (int64_t)nearbyint(v);
        break;
    default:
        break;
    }
}
