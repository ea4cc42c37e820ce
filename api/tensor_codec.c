#include "tensor_codec.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/vec.h"
#include "float_parse.h"
#include "float_print.h"
#include "json_write.h"
#include "json_scan.h"

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
    bool has_f;    /* f holds the text rounded to f32 directly, not through x */
    int64_t i;
    double x;
    float f;
} element_t;

/* The integer text[p..q) (a JSON integer), exactly: 0, or -ERANGE outside int64. */
static int int64_from_text(const char *p, const char *q, int64_t *ret)
{
    bool neg = *p == '-';
    uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (p += neg; p < q; p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (v > (limit - digit) / 10) return -ERANGE;
        v = v * 10 + digit;
    }
    *ret = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/* The float a string names: "nan", "inf", "-inf" (and JavaScript's spellings). */
static bool element_from_string(const char *p, const char *q, element_t *e)
{
    bool plain;
    json_lex_string(p, q, &plain);
    json_t *decoded = plain ? NULL : json_loadb(p, (size_t)(q - p), JSON_DECODE_ANY, NULL);
    char s[16] = "";
    if (plain && (size_t)(q - p) - 2 < sizeof s)
        memcpy(s, p + 1, (size_t)(q - p) - 2);
    else if (json_is_string(decoded) && json_string_length(decoded) < sizeof s)
        memcpy(s, json_string_value(decoded), json_string_length(decoded) + 1);
    json_decref(decoded);
    if (strcmp(s, "nan") == 0 || strcmp(s, "NaN") == 0)
        e->x = NAN;
    else if (strcmp(s, "inf") == 0 || strcmp(s, "Infinity") == 0)
        e->x = INFINITY;
    else if (strcmp(s, "-inf") == 0 || strcmp(s, "-Infinity") == 0)
        e->x = -INFINITY;
    else
        return false;
    return true;
}

/* The kind of value an element's text is. */
typedef enum element_kind {
    ELEMENT_OTHER,
    ELEMENT_STRING,
    ELEMENT_INT,
    ELEMENT_REAL
} element_kind_t;

/* The element whose text is text[p..q), of kind, read for dtype dt. Integers are read exactly,
 * reals with a correctly rounding parser: f32 straight from the text, x then being that float
 * (or, when the text is too large for f32, the double, for the range error). */
static element_t element_from_text(const char *p, const char *q, element_kind_t kind, dtype_t dt)
{
    element_t e = {0};
    if (kind == ELEMENT_STRING) {
        e.is_float = element_from_string(p, q, &e);
    } else if (kind == ELEMENT_OTHER) {
        /* a list, an object or a literal: neither kind of number */
    } else if (kind == ELEMENT_INT) {
        e.is_int = e.is_float = int64_from_text(p, q, &e.i) == 0;
        e.x = (double)e.i;
    } else if (dt == DTYPE_F32) {
        e.is_float = e.has_f = float_parse_f32(p, (size_t)(q - p), &e.f) == 0;
        e.x = e.f;
        if (e.is_float && isinf(e.f)) e.is_float = float_parse_f64(p, (size_t)(q - p), &e.x) == 0;
    } else {
        e.is_float = float_parse_f64(p, (size_t)(q - p), &e.x) == 0;
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
        float f = v->has_f ? v->f : (float)v->x;
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
    int64_t x = v->i;
    int64_t lo, hi;
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
                        "%" PRId64 " is out of range for dtype %s [%" PRId64 ", %" PRId64 "]", x,
                        dtype_name(dt), lo, hi);
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
        ((int64_t *)data)[i] = x;
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

/* A cursor over the text of a data value, which is JSON (checked by json_scan, or written
 * by jansson). Errors are found in the order of a walk that checks each list's length before
 * its values: a value's error is kept until the length of a list around it proves wrong, so
 * the text is still read once, front to back. */
typedef struct data_reader {
    const char *p, *end;
    const tensor_desc_t *d;
    void *data;
    int64_t next; /* the flat index of the next element */
    int r;        /* the first error, in err; nothing is stored once there is one */
    const char *field;
    size_t idx[TENSOR_MAX_DIMS];
    op_error_t *err;
} data_reader_t;

static char data_peek(data_reader_t *rd)
{
    rd->p = json_lex_ws(rd->p, rd->end);
    return rd->p < rd->end ? *rd->p : '\0';
}

/* Moves past the value at the cursor. */
static void data_skip(data_reader_t *rd)
{
    const char *q = json_lex_skip(rd->p, rd->end);
    rd->p = q ? q : rd->end;
}

/* Records the first error, at the index path idx[0..dim). */
static void data_fail(data_reader_t *rd, int r, int dim)
{
    rd->r = r;
    element_field(rd->err, rd->field, rd->idx, dim);
}

/* An f32 or f64 element written as a JSON number, the bulk of inline data, read straight
 * into the typed block by one pass of the parser over its text (which is JSON, so the
 * parser's end is the number's). False, with nothing done, for any other element or a value
 * out of the dtype's range: the general path then reads it and says why. */
static bool data_read_real(data_reader_t *rd)
{
    const char *p = rd->p, *q = NULL;
    if (p >= rd->end || !(*p == '-' || (*p >= '0' && *p <= '9'))) return false;
    if (rd->d->dtype == DTYPE_F32) {
        float f;
        q = float_parse_f32_prefix(p, rd->end, &f);
        if (!q || isinf(f)) return false;
        ((float *)rd->data)[rd->next] = f;
    } else if (rd->d->dtype == DTYPE_F64) {
        double x;
        q = float_parse_f64_prefix(p, rd->end, &x);
        if (!q || isinf(x)) return false;
        ((double *)rd->data)[rd->next] = x;
    } else {
        return false;
    }
    rd->next++;
    rd->p = q;
    return true;
}

/* The element at the cursor, into flat index next. */
static void data_read_element(data_reader_t *rd, int dim)
{
    if (rd->r == 0 && data_read_real(rd)) return;
    const char *p = rd->p, *q = NULL;
    bool is_int, plain;
    element_kind_t kind = ELEMENT_OTHER;
    if (p >= rd->end) {
        q = p;
    } else if (*p == '"') {
        q = json_lex_string(p, rd->end, &plain);
        kind = ELEMENT_STRING;
    } else if (*p == '-' || (*p >= '0' && *p <= '9')) {
        q = json_lex_number(p, rd->end, &is_int);
        kind = is_int ? ELEMENT_INT : ELEMENT_REAL;
    }
    if (!q) {
        q = json_lex_skip(p, rd->end);
        kind = ELEMENT_OTHER;
    }
    if (!q) q = rd->end;
    if (rd->r == 0) {
        element_t e = element_from_text(p, q, kind, rd->d->dtype);
        int r = store_element(&e, rd->d->dtype, rd->data, rd->next, rd->err);
        if (r < 0) data_fail(rd, r, dim);
    }
    rd->next++;
    rd->p = q;
}

/* The leading run of a flat list's f32 or f64 numbers, at most limit of them, read in one
 * tight loop (data_read_real each) with the cursor at the list's first value: how many. It
 * stops, with nothing of the stopping element consumed, at the first element it does not
 * take; *ret_more tells whether the cursor is then at an element (after a comma) or at what
 * follows the last one (the closing bracket). */
static size_t data_read_reals(data_reader_t *rd, int64_t limit, bool *ret_more)
{
    size_t count = 0;
    *ret_more = true;
    while ((int64_t)count < limit && data_read_real(rd)) {
        count++;
        if (data_peek(rd) != ',') {
            *ret_more = false;
            break;
        }
        rd->p++;
        data_peek(rd);
    }
    return count;
}

/* Reads the list's values at the cursor with visit until its closing bracket: the number of
 * values. visit is skipped (the value only counted) from index limit on or after an error. */
static size_t data_read_list(data_reader_t *rd, int64_t limit, int dim,
                             void (*visit)(data_reader_t *rd, int dim))
{
    size_t count = 0;
    rd->p++;
    if (data_peek(rd) == ']') {
        rd->p++;
        return 0;
    }
    if (visit == data_read_element && rd->r == 0) {
        bool more;
        count = data_read_reals(rd, limit, &more);
        if (!more) {
            if (rd->p < rd->end) rd->p++;
            return count;
        }
    }
    for (;;) {
        data_peek(rd);
        rd->idx[dim] = count;
        if ((int64_t)count < limit && rd->r == 0)
            visit(rd, dim + 1);
        else
            data_skip(rd);
        count++;
        char c = data_peek(rd);
        if (rd->p < rd->end) rd->p++;
        if (c != ',') return count;
    }
}

/* The level dim of lists nested like the shape, at the cursor. */
static void data_read_nested(data_reader_t *rd, int dim)
{
    const tensor_desc_t *d = rd->d;
    if (dim == d->ndim) {
        data_read_element(rd, dim);
        return;
    }
    bool failed_before = rd->r != 0;
    if (data_peek(rd) != '[') {
        if (!failed_before)
            data_fail(rd,
                      op_error(rd->err, -EINVAL, NULL, "must be a list of %" PRId64 " values",
                               d->shape[dim]),
                      dim);
        data_skip(rd);
        return;
    }
    size_t count = data_read_list(rd, d->shape[dim], dim, data_read_nested);
    if ((int64_t)count != d->shape[dim] && !failed_before)
        data_fail(rd,
                  op_error(rd->err, -EINVAL, NULL, "has %zu values where shape[%d] is %" PRId64,
                           count, dim, d->shape[dim]),
                  dim);
}

/* The error for a flat list whose length is not the tensor's element count. */
static int count_mismatch(const tensor_desc_t *d, size_t count, const char *field, op_error_t *err)
{
    char shape[96];
    return op_error(err, -EINVAL, field, "data has %zu values but shape %s needs %" PRId64, count,
                    tensor_shape_str(d, shape, sizeof shape), tensor_desc_numel(d));
}

int codec_data_from_text(const char *text, size_t len, const tensor_desc_t *d, const char *field,
                         void **ret_data, op_error_t *err)
{
    int64_t numel = tensor_desc_numel(d);
    uint64_t nbytes = tensor_desc_bytes(d);
    data_reader_t rd = {.p = text, .end = text + len, .d = d, .field = field, .err = err};

    bool is_list = data_peek(&rd) == '[';
    if (!is_list && d->ndim != 0) return op_error(err, -EINVAL, field, "data must be a list");
    rd.data = malloc(nbytes ? nbytes : 1);
    if (!rd.data) return op_error(err, -ENOMEM, field, "out of memory");
    if (!is_list) {
        data_read_element(&rd, 0);
    } else {
        /* A list whose first value is not itself a list is taken as flat. */
        const char *open = rd.p;
        rd.p++;
        bool flat = data_peek(&rd) != '[';
        rd.p = open;
        if (!flat) {
            data_read_nested(&rd, 0);
        } else {
            size_t count = data_read_list(&rd, numel, 0, data_read_element);
            if ((int64_t)count != numel) rd.r = count_mismatch(d, count, field, err);
        }
    }
    if (rd.r < 0) {
        free(rd.data);
        return rd.r;
    }
    *ret_data = rd.data;
    return 0;
}

int codec_data_from_json(const json_t *data, const tensor_desc_t *d, const char *field,
                         void **ret_data, op_error_t *err)
{
    /* Read as text: jansson writes integers exactly and reals with 17 digits, which give back
     * the same double, so both ways in share one reader. */
    char *text = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return op_error(err, -ENOMEM, field, "out of memory");
    int r = codec_data_from_text(text, strlen(text), d, field, ret_data, err);
    free(text);
    return r;
}

/* A value rounded to f16 or bf16 the way the reader stores one (tensor_store), for
 * float_print_narrow. */
static double narrow_f16(double x)
{
    return f16_to_f32(f32_to_f16((float)x));
}

static double narrow_bf16(double x)
{
    return bf16_to_f32(f32_to_bf16((float)x));
}

/* Element i's JSON text into buf (FLOAT_PRINT_MAX bytes): its length. Floats are shortest for
 * their dtype; the non-finite ones, which JSON lacks, are the strings "nan", "inf", "-inf". */
static size_t element_text(dtype_t dt, const void *data, int64_t i, char *buf)
{
    /* A finite f32, most answers' data, straight to its printer. */
    if (dt == DTYPE_F32 && isfinite(((const float *)data)[i]))
        return float_print_f32(((const float *)data)[i], buf);
    double x;
    switch (dt) {
    case DTYPE_I8:
        return json_format_integer(((const int8_t *)data)[i], buf);
    case DTYPE_I32:
        return json_format_integer(((const int32_t *)data)[i], buf);
    case DTYPE_U32:
        return json_format_integer(((const uint32_t *)data)[i], buf);
    case DTYPE_I64:
        return json_format_integer(((const int64_t *)data)[i], buf);
    default:
        x = tensor_load(dt, data, i);
        break;
    }
    if (!isfinite(x)) {
        const char *s = isnan(x) ? "\"nan\"" : x > 0 ? "\"inf\"" : "\"-inf\"";
        size_t n = strlen(s);
        memcpy(buf, s, n + 1);
        return n;
    }
    switch (dt) {
    case DTYPE_F32:
        return float_print_f32((float)x, buf);
    case DTYPE_F16:
        return float_print_narrow(x, narrow_f16, buf);
    case DTYPE_BF16:
        return float_print_narrow(x, narrow_bf16, buf);
    default:
        return float_print_f64(x, buf);
    }
}

int codec_data_to_text(const tensor_desc_t *d, const void *data, char **ret_text, size_t *ret_len)
{
    int64_t numel = tensor_desc_numel(d);
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (int64_t i = 0;; i++) {
        /* Room for an element, the comma before it, the closing bracket and the NUL. */
        if (vec_grow((void **)&text, &cap, len + FLOAT_PRINT_MAX + 3, 1,
                     (size_t)numel * 8 + FLOAT_PRINT_MAX) < 0) {
            free(text);
            return -ENOMEM;
        }
        if (i == numel) break;
        text[len++] = i ? ',' : '[';
        len += element_text(d->dtype, data, i, text + len);
    }
    if (numel == 0) text[len++] = '[';
    text[len++] = ']';
    text[len] = '\0';
    *ret_text = text;
    *ret_len = len;
    return 0;
}

json_t *codec_data_to_json(const tensor_desc_t *d, const void *data)
{
    char *text;
    size_t len;
    if (codec_data_to_text(d, data, &text, &len) < 0) return NULL;
    json_t *node = json_raw_new(text, len);
    free(text);
    return node;
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
