#include "tensor_codec.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Explains a tensor_desc_check() failure; field names the shape. */
static int desc_check_error(const tensor_desc_t *d, int r, uint64_t max_bytes, const char *field,
                            op_error_t *err)
{
    if (r == -E2BIG)
        return op_error(err, r, field,
                        "tensor of %" PRIu64 " bytes exceeds the limit of %" PRIu64 " bytes",
                        tensor_desc_bytes(d), max_bytes);
    if (r == -EOVERFLOW) return op_error(err, r, field, "shape's byte size overflows 64 bits");
    return op_error(err, r, field, "invalid shape");
}

int codec_desc_from_json(const json_t *dtype, const json_t *shape, const char *prefix,
                         uint64_t max_bytes, tensor_desc_t *ret, op_error_t *err)
{
    char field[128];
    tensor_desc_t d = {0};

    snprintf(field, sizeof field, "%s.dtype", prefix);
    if (!dtype) return op_error(err, -EINVAL, field, "dtype is required");
    if (!json_is_string(dtype) || dtype_parse(json_string_value(dtype), &d.dtype) < 0)
        return op_error(err, -EINVAL, field,
                        "dtype must be one of f32, f16, bf16, f64, i8, i32, u32, i64");

    snprintf(field, sizeof field, "%s.shape", prefix);
    if (!shape) return op_error(err, -EINVAL, field, "shape is required");
    if (!json_is_array(shape))
        return op_error(err, -EINVAL, field, "shape must be a list of non-negative integers");
    if (json_array_size(shape) > TENSOR_MAX_DIMS)
        return op_error(err, -EINVAL, field, "shape has %zu dims, at most %d are allowed",
                        json_array_size(shape), TENSOR_MAX_DIMS);
    d.ndim = (int)json_array_size(shape);
    for (int i = 0; i < d.ndim; i++) {
        const json_t *dim = json_array_get(shape, (size_t)i);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0)
            return op_error(err, -EINVAL, field, "shape[%d] must be a non-negative integer", i);
        d.shape[i] = json_integer_value(dim);
    }
    int r = tensor_desc_check(&d, max_bytes);
    if (r < 0) return desc_check_error(&d, r, max_bytes, field, err);
    *ret = d;
    return 0;
}

int codec_shape_parse_csv(const char *text, tensor_desc_t *ret, op_error_t *err)
{
    tensor_desc_t d = *ret;
    d.ndim = 0;
    const char *p = text ? text : "";
    while (*p) {
        if (d.ndim == TENSOR_MAX_DIMS)
            return op_error(err, -EINVAL, "query.shape", "at most %d dims are allowed",
                            TENSOR_MAX_DIMS);
        if (*p < '0' || *p > '9')
            return op_error(err, -EINVAL, "query.shape",
                            "shape must be comma-separated non-negative integers, like 2,3");
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno == ERANGE)
            return op_error(err, -EINVAL, "query.shape", "shape[%d] is too large", d.ndim);
        d.shape[d.ndim++] = v;
        if (*end == ',' && end[1] != '\0')
            end++;
        else if (*end != '\0')
            return op_error(err, -EINVAL, "query.shape",
                            "shape must be comma-separated non-negative integers, like 2,3");
        p = end;
    }
    *ret = d;
    return 0;
}

/* --- inline data --- */

/* One element as given: a JSON integer, a JSON real, or a float spelled as a string. */
typedef struct element {
    bool is_int;   /* written as an integer: i holds it exactly */
    bool is_float; /* usable by a float dtype: x holds it */
    json_int_t i;
    double x;
} element_t;

static element_t element_from_json(const json_t *v)
{
    element_t e = {0};
    if (json_is_integer(v)) {
        e = (element_t){.is_int = true, .is_float = true, .i = json_integer_value(v)};
        e.x = (double)e.i;
    } else if (json_is_real(v)) {
        e = (element_t){.is_float = true, .x = json_real_value(v)};
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        e.is_float = true;
        if (strcmp(s, "nan") == 0 || strcmp(s, "NaN") == 0)
            e.x = NAN;
        else if (strcmp(s, "inf") == 0 || strcmp(s, "Infinity") == 0)
            e.x = INFINITY;
        else if (strcmp(s, "-inf") == 0 || strcmp(s, "-Infinity") == 0)
            e.x = -INFINITY;
        else
            e.is_float = false;
    }
    return e;
}

/* Stores element i; the value must be representable in dt. On failure the message is set and
 * the field left to the caller, which names the element only then: formatting a path for every
 * element would cost more than decoding it. */
static int store_element(const element_t *v, dtype_t dt, void *data, int64_t i, op_error_t *err)
{
    /* f32 and f64 carry most inline data: stored here directly, with the same check as
     * below (a finite value must stay finite), without tensor_store's and tensor_load's
     * dtype switches for every element. */
    if (dt == DTYPE_F32 && v->is_float) {
        float f = (float)v->x;
        if (isfinite(v->x) && !isfinite(f))
            return op_error(err, -EINVAL, NULL, "%g is out of range for dtype %s", v->x,
                            dtype_name(dt));
        ((float *)data)[i] = f;
        return 0;
    }
    if (dt == DTYPE_F64 && v->is_float) {
        ((double *)data)[i] = v->x;
        return 0;
    }
    if (dtype_is_float(dt)) {
        if (!v->is_float)
            return op_error(err, -EINVAL, NULL, "must be a number for dtype %s", dtype_name(dt));
        tensor_store(dt, data, i, v->x);
        /* A finite value that became infinite did not fit the dtype. */
        if (isfinite(v->x) && !isfinite(tensor_load(dt, data, i)))
            return op_error(err, -EINVAL, NULL, "%g is out of range for dtype %s", v->x,
                            dtype_name(dt));
        return 0;
    }
    if (!v->is_int)
        return op_error(err, -EINVAL, NULL, "must be an integer for dtype %s", dtype_name(dt));
    json_int_t x = v->i;
    json_int_t lo, hi;
    switch (dt) {
    case DTYPE_I8:
        lo = INT8_MIN, hi = INT8_MAX;
        break;
    case DTYPE_I32:
        lo = INT32_MIN, hi = INT32_MAX;
        break;
    case DTYPE_U32:
        lo = 0, hi = UINT32_MAX;
        break;
    default:
        lo = INT64_MIN, hi = INT64_MAX;
        break;
    }
    if (x < lo || x > hi)
        return op_error(err, -EINVAL, NULL,
                        "%" JSON_INTEGER_FORMAT
                        " is out of range for dtype %s [%" JSON_INTEGER_FORMAT
                        ", %" JSON_INTEGER_FORMAT "]",
                        x, dtype_name(dt), lo, hi);
    /* Integers are written exactly, not through a double: i64 needs all 64 bits. */
    switch (dt) {
    case DTYPE_I8:
        ((int8_t *)data)[i] = (int8_t)x;
        break;
    case DTYPE_I32:
        ((int32_t *)data)[i] = (int32_t)x;
        break;
    case DTYPE_U32:
        ((uint32_t *)data)[i] = (uint32_t)x;
        break;
    default:
        ((int64_t *)data)[i] = (int64_t)x;
        break;
    }
    return 0;
}

/* Names the element at index path idx[0..n) under base in err->field ("data[1][2]"). */
static void element_field(op_error_t *err, const char *base, const size_t *idx, int n)
{
    if (!err) return;
    size_t len = (size_t)snprintf(err->field, sizeof err->field, "%s", base);
    for (int k = 0; k < n && len < sizeof err->field; k++)
        len += (size_t)snprintf(err->field + len, sizeof err->field - len, "[%zu]", idx[k]);
}

/* Walks lists nested like d's shape from dimension dim; *next is the flat index and idx the
 * index path so far (for error fields only). */
static int parse_nested(const json_t *v, const tensor_desc_t *d, int dim, const char *field,
                        size_t *idx, void *data, int64_t *next, op_error_t *err)
{
    if (dim == d->ndim) {
        element_t e = element_from_json(v);
        int r = store_element(&e, d->dtype, data, (*next)++, err);
        if (r < 0) element_field(err, field, idx, dim);
        return r;
    }
    int r = 0;
    if (!json_is_array(v))
        r = op_error(err, -EINVAL, NULL, "must be a list of %" PRId64 " values", d->shape[dim]);
    else if ((int64_t)json_array_size(v) != d->shape[dim])
        r = op_error(err, -EINVAL, NULL, "has %zu values where shape[%d] is %" PRId64,
                     json_array_size(v), dim, d->shape[dim]);
    if (r < 0) {
        element_field(err, field, idx, dim);
        return r;
    }
    for (size_t k = 0; k < json_array_size(v); k++) {
        idx[dim] = k;
        r = parse_nested(json_array_get(v, k), d, dim + 1, field, idx, data, next, err);
        if (r < 0) return r;
    }
    return 0;
}

/* The error for a flat list whose length is not the tensor's element count. */
static int count_mismatch(const tensor_desc_t *d, size_t count, const char *field, op_error_t *err)
{
    char shape[96];
    return op_error(err, -EINVAL, field, "data has %zu values but shape %s needs %" PRId64, count,
                    tensor_shape_str(d, shape, sizeof shape), tensor_desc_numel(d));
}

int codec_data_from_json(const json_t *data, const tensor_desc_t *d, const char *field,
                         void **ret_data, op_error_t *err)
{
    int64_t numel = tensor_desc_numel(d);
    uint64_t nbytes = tensor_desc_bytes(d);

    /* A list whose first value is not itself a list is taken as flat. */
    bool flat = json_is_array(data) &&
                (json_array_size(data) == 0 || !json_is_array(json_array_get(data, 0)));
    if (!json_is_array(data) && d->ndim != 0)
        return op_error(err, -EINVAL, field, "data must be a list");
    if (flat && (int64_t)json_array_size(data) != numel)
        return count_mismatch(d, json_array_size(data), field, err);

    void *buf = malloc(nbytes ? nbytes : 1);
    if (!buf) return op_error(err, -ENOMEM, field, "out of memory");
    int r = 0;
    if (!json_is_array(data)) {
        element_t e = element_from_json(data);
        r = store_element(&e, d->dtype, buf, 0, err);
        if (r < 0) element_field(err, field, NULL, 0);
    } else if (flat) {
        for (size_t k = 0; r == 0 && k < json_array_size(data); k++) {
            element_t e = element_from_json(json_array_get(data, k));
            r = store_element(&e, d->dtype, buf, (int64_t)k, err);
            if (r < 0) element_field(err, field, &k, 1);
        }
    } else {
        size_t idx[TENSOR_MAX_DIMS] = {0};
        int64_t next = 0;
        r = parse_nested(data, d, 0, field, idx, buf, &next, err);
    }
    if (r < 0) {
        free(buf);
        return r;
    }
    *ret_data = buf;
    return 0;
}

static json_t *float_to_json(double x)
{
    if (isnan(x)) return json_string("nan");
    if (isinf(x)) return json_string(x > 0 ? "inf" : "-inf");
    return json_real(x);
}

json_t *codec_data_to_json(const tensor_desc_t *d, const void *data)
{
    json_t *list = json_array();
    int64_t numel = tensor_desc_numel(d);
    for (int64_t i = 0; list && i < numel; i++) {
        json_t *v;
        switch (d->dtype) {
        case DTYPE_I8:
            v = json_integer(((const int8_t *)data)[i]);
            break;
        case DTYPE_I32:
            v = json_integer(((const int32_t *)data)[i]);
            break;
        case DTYPE_U32:
            v = json_integer(((const uint32_t *)data)[i]);
            break;
        case DTYPE_I64:
            v = json_integer(((const int64_t *)data)[i]);
            break;
        default:
            v = float_to_json(tensor_load(d->dtype, data, i));
            break;
        }
        if (json_array_append_new(list, v) < 0) {
            json_decref(list);
            return NULL;
        }
    }
    return list;
}

/* --- base64 --- */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int codec_b64_decode(const char *text, size_t len, void **ret_data, size_t *ret_len,
                     op_error_t *err)
{
    if (len % 4 != 0)
        return op_error(err, -EINVAL, NULL,
                        "base64 length %zu is not a multiple of 4 (padding '=' is required)", len);
    size_t pad = 0;
    if (len >= 1 && text[len - 1] == '=') pad++;
    if (len >= 2 && text[len - 2] == '=') pad++;
    size_t out_len = len / 4 * 3 - pad;
    unsigned char *out = malloc(out_len ? out_len : 1);
    if (!out) return op_error(err, -ENOMEM, NULL, "out of memory");
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        uint32_t quad = 0;
        for (size_t k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)text[i + k];
            int v = b64_value(c);
            bool is_pad = c == '=' && i + k >= len - pad;
            if (v < 0 && !is_pad) {
                free(out);
                return op_error(err, -EINVAL, NULL, "invalid base64 character at offset %zu",
                                i + k);
            }
            quad = quad << 6 | (uint32_t)(v < 0 ? 0 : v);
        }
        unsigned char bytes[3] = {(unsigned char)(quad >> 16), (unsigned char)(quad >> 8),
                                  (unsigned char)quad};
        for (size_t k = 0; k < 3 && o < out_len; k++)
            out[o++] = bytes[k];
    }
    *ret_data = out;
    *ret_len = out_len;
    return 0;
}

/* --- .npy --- */

static const char *const npy_descrs[DTYPE_COUNT] = {
    [DTYPE_F32] = "<f4", [DTYPE_F16] = "<f2", [DTYPE_BF16] = NULL, [DTYPE_F64] = "<f8",
    [DTYPE_I8] = "|i1",  [DTYPE_I32] = "<i4", [DTYPE_U32] = "<u4", [DTYPE_I64] = "<i8",
};

/* The npy descr of a dtype ("<f4"), or NULL for bf16. */
static const char *codec_npy_descr(dtype_t dt)
{
    return dt < DTYPE_COUNT ? npy_descrs[dt] : NULL;
}

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

int codec_npy_write(const tensor_desc_t *d, const void *data, void **ret_file, size_t *ret_len)
{
    const char *descr = codec_npy_descr(d->dtype);
    if (!descr) return -ENOTSUP;
    char dict[512];
    int n =
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < d->ndim; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%s%" PRId64, i ? ", " : "", d->shape[i]);
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%s), }", d->ndim == 1 ? "," : "");
    /* Pad with spaces and a final newline so that the data starts 64-byte aligned. */
    size_t header_len = ((size_t)10 + (size_t)n + 1 + 63) / 64 * 64 - 10;
    uint64_t nbytes = tensor_desc_bytes(d);
    size_t total = 10 + header_len + nbytes;
    unsigned char *file = malloc(total);
    if (!file) return -ENOMEM;
    memcpy(file, npy_magic, sizeof npy_magic);
    file[6] = 1;
    file[7] = 0;
    file[8] = (unsigned char)(header_len & 0xff);
    file[9] = (unsigned char)(header_len >> 8);
    memcpy(file + 10, dict, (size_t)n);
    memset(file + 10 + n, ' ', header_len - (size_t)n - 1);
    file[10 + header_len - 1] = '\n';
    if (nbytes) memcpy(file + 10 + header_len, data, nbytes);
    *ret_file = file;
    *ret_len = total;
    return 0;
}

/* A cursor over the header's Python dict literal. */
typedef struct npy_lexer {
    const char *p, *end;
} npy_lexer_t;

static void npy_skip_space(npy_lexer_t *lx)
{
    while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r'))
        lx->p++;
}

static bool npy_accept(npy_lexer_t *lx, char c)
{
    npy_skip_space(lx);
    if (lx->p < lx->end && *lx->p == c) {
        lx->p++;
        return true;
    }
    return false;
}

/* A quoted string ('...' or "...", no escapes) into buf. */
static int npy_string(npy_lexer_t *lx, char *buf, size_t size)
{
    npy_skip_space(lx);
    if (lx->p >= lx->end || (*lx->p != '\'' && *lx->p != '"')) return -EINVAL;
    char quote = *lx->p++;
    const char *start = lx->p;
    while (lx->p < lx->end && *lx->p != quote)
        lx->p++;
    if (lx->p >= lx->end || (size_t)(lx->p - start) >= size) return -EINVAL;
    memcpy(buf, start, (size_t)(lx->p - start));
    buf[lx->p - start] = '\0';
    lx->p++;
    return 0;
}

static bool npy_word(npy_lexer_t *lx, const char *word)
{
    npy_skip_space(lx);
    size_t n = strlen(word);
    if ((size_t)(lx->end - lx->p) >= n && memcmp(lx->p, word, n) == 0) {
        lx->p += n;
        return true;
    }
    return false;
}

/* A tuple of non-negative integers: (), (3,), (2, 3). */
static int npy_shape(npy_lexer_t *lx, tensor_desc_t *d, op_error_t *err)
{
    if (!npy_accept(lx, '('))
        return op_error(err, -EINVAL, "body", "npy header: shape must be a tuple");
    d->ndim = 0;
    for (;;) {
        if (npy_accept(lx, ')')) return 0;
        npy_skip_space(lx);
        if (lx->p >= lx->end || *lx->p < '0' || *lx->p > '9')
            return op_error(err, -EINVAL, "body",
                            "npy header: shape must hold non-negative integers");
        if (d->ndim == TENSOR_MAX_DIMS)
            return op_error(err, -EINVAL, "body", "npy header: at most %d dims are allowed",
                            TENSOR_MAX_DIMS);
        int64_t v = 0;
        while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9') {
            if (v > (INT64_MAX - 9) / 10)
                return op_error(err, -EOVERFLOW, "body", "npy header: a dim is too large");
            v = v * 10 + (*lx->p++ - '0');
        }
        npy_skip_space(lx);
        if (lx->p < lx->end && *lx->p == 'L') lx->p++; /* Python 2 longs */
        d->shape[d->ndim++] = v;
        if (!npy_accept(lx, ',')) {
            if (npy_accept(lx, ')')) return 0;
            return op_error(err, -EINVAL, "body", "npy header: malformed shape tuple");
        }
    }
}

static int npy_descr_dtype(const char *descr, dtype_t *ret, op_error_t *err)
{
    for (int i = 0; i < DTYPE_COUNT; i++)
        if (npy_descrs[i] && strcmp(npy_descrs[i], descr) == 0) {
            *ret = (dtype_t)i;
            return 0;
        }
    if (descr[0] == '>')
        return op_error(err, -EINVAL, "body",
                        "npy descr '%s' is big-endian; only "
                        "little-endian data is accepted",
                        descr);
    return op_error(err, -EINVAL, "body",
                    "npy descr '%s' is not supported (accepted: <f4, <f2, <f8, |i1, <i4, "
                    "<u4, <i8)",
                    descr);
}

/* The magic, version and header length at the start of a .npy file: 0 with the length of the
 * fixed prefix and of the header; -EAGAIN when len is too short to hold them (err says so);
 * -EINVAL when they are wrong. */
static int npy_preamble(const unsigned char *b, size_t len, size_t *ret_prefix,
                        size_t *ret_header_len, op_error_t *err)
{
    if (len >= sizeof npy_magic && memcmp(b, npy_magic, sizeof npy_magic) != 0)
        return op_error(err, -EINVAL, "body", "not a .npy file (bad magic)");
    if (len < 10) return op_error(err, -EAGAIN, "body", "not a .npy file (too short)");
    unsigned major = b[6], minor = b[7];
    if (major < 1 || major > 3 || minor != 0)
        return op_error(err, -EINVAL, "body", "npy version %u.%u is not supported", major, minor);
    size_t prefix = major == 1 ? 10 : 12;
    if (len < prefix) return op_error(err, -EAGAIN, "body", "npy file is truncated");
    *ret_prefix = prefix;
    *ret_header_len =
        major == 1 ? (size_t)b[8] | (size_t)b[9] << 8
                   : (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    return 0;
}

int codec_npy_data_offset(const void *file, size_t len, size_t *ret_offset)
{
    size_t prefix, header_len;
    op_error_t err;
    int r = npy_preamble(file, len, &prefix, &header_len, &err);
    if (r == 0) *ret_offset = prefix + header_len;
    return r;
}

int codec_npy_parse(const void *file, size_t len, uint64_t max_bytes, tensor_desc_t *ret_desc,
                    size_t *ret_data_offset, op_error_t *err)
{
    tensor_desc_t d;
    size_t offset;
    int r = codec_npy_parse_header(file, len, max_bytes, &d, &offset, err);
    if (r < 0) return r;
    r = codec_npy_check_data_bytes(&d, len - offset, err);
    if (r < 0) return r;
    *ret_desc = d;
    *ret_data_offset = offset;
    return 0;
}

int codec_npy_parse_header(const void *file, size_t len, uint64_t max_bytes,
                           tensor_desc_t *ret_desc, size_t *ret_data_offset, op_error_t *err)
{
    const unsigned char *b = file;
    size_t prefix, header_len;
    int r = npy_preamble(b, len, &prefix, &header_len, err);
    if (r == -EAGAIN) r = -EINVAL; /* the whole file is here: too short is wrong */
    if (r < 0) return r;
    if (header_len > len - prefix)
        return op_error(err, -EINVAL, "body", "npy file is truncated inside its header");
    for (size_t i = 0; i < header_len; i++)
        if (b[prefix + i] < 0x20 && b[prefix + i] != '\n' && b[prefix + i] != '\t')
            return op_error(err, -EINVAL, "body", "npy header holds a control character");

    npy_lexer_t lx = {(const char *)b + prefix, (const char *)b + prefix + header_len};
    tensor_desc_t d = {0};
    bool have_descr = false, have_order = false, have_shape = false;
    if (!npy_accept(&lx, '{')) return op_error(err, -EINVAL, "body", "npy header is not a dict");
    while (!npy_accept(&lx, '}')) {
        char key[32], descr[32];
        if (npy_string(&lx, key, sizeof key) < 0 || !npy_accept(&lx, ':'))
            return op_error(err, -EINVAL, "body", "npy header: malformed dict");
        if (strcmp(key, "descr") == 0 && !have_descr) {
            if (npy_string(&lx, descr, sizeof descr) < 0)
                return op_error(err, -EINVAL, "body",
                                "npy header: descr must be a dtype string (structured "
                                "dtypes are not supported)");
            int r = npy_descr_dtype(descr, &d.dtype, err);
            if (r < 0) return r;
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (npy_word(&lx, "True"))
                return op_error(err, -EINVAL, "body",
                                "npy fortran_order True is not supported; save C-ordered "
                                "data");
            if (!npy_word(&lx, "False"))
                return op_error(err, -EINVAL, "body",
                                "npy header: fortran_order must be True or False");
            have_order = true;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            int r = npy_shape(&lx, &d, err);
            if (r < 0) return r;
            have_shape = true;
        } else {
            return op_error(err, -EINVAL, "body", "npy header: unexpected or repeated key '%s'",
                            key);
        }
        if (!npy_accept(&lx, ',')) {
            if (npy_accept(&lx, '}')) break;
            return op_error(err, -EINVAL, "body", "npy header: malformed dict");
        }
    }
    npy_skip_space(&lx);
    if (lx.p != lx.end) return op_error(err, -EINVAL, "body", "npy header: junk after the dict");
    if (!have_descr || !have_order || !have_shape)
        return op_error(err, -EINVAL, "body",
                        "npy header must give descr, fortran_order and shape");
    r = tensor_desc_check(&d, max_bytes);
    if (r < 0) return desc_check_error(&d, r, max_bytes, "body", err);
    *ret_desc = d;
    *ret_data_offset = prefix + header_len;
    return 0;
}

int codec_npy_check_data_bytes(const tensor_desc_t *d, uint64_t have, op_error_t *err)
{
    uint64_t want = tensor_desc_bytes(d);
    if (have < want)
        return op_error(err, -EINVAL, "body",
                        "npy data is truncated: its header needs %" PRIu64
                        " bytes, the file holds %" PRIu64,
                        want, have);
    if (have > want)
        return op_error(err, -EINVAL, "body",
                        "npy file has %" PRIu64 " bytes after the %" PRIu64 " its header describes",
                        have - want, want);
    return 0;
}
