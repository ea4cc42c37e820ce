#include "json_scan.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/vec.h"
#include "float_parse.h"

/* Where a value sits in a job document, which decides what the scanner does with it: a job,
 * the inputs object of a job, one tensor of inputs, and anything else. */
typedef enum scan_role { ROLE_OTHER, ROLE_JOB, ROLE_INPUTS, ROLE_TENSOR } scan_role_t;

/* What a key of an object with a given role leads to; CUT_* values are cut out. */
typedef enum scan_key {
    KEY_OTHER,
    KEY_INPUTS,
    KEY_TENSOR,
    KEY_DTYPE,
    KEY_CUT_DATA,
    KEY_CUT_B64
} scan_key_t;

typedef struct scanner {
    const char *text, *end;
    json_scan_t *out;
    json_scan_error_t *err;
    const char *copied; /* the text before this is in the skeleton, or cut */
    size_t cap;         /* of out->skeleton */
    uint64_t max_values_bytes;
    bool counting; /* past max_jobs: only the list's length is wanted */
    bool oom;
} scanner_t;

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Records why the document is not JSON, at p; returns NULL for the caller to return. */
static const char *scan_fail(scanner_t *s, const char *p, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *scan_fail(scanner_t *s, const char *p, const char *fmt, ...)
{
    s->err->offset = (size_t)(p - s->text);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err->text, sizeof s->err->text, fmt, ap);
    va_end(ap);
    return NULL;
}

void json_scan_position(const char *text, size_t offset, int *ret_line, int *ret_column)
{
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < offset; i++)
        if (text[i] == '\n') line++, line_start = i + 1;
    *ret_line = line;
    *ret_column = (int)(offset - line_start + 1);
}

/* --- lexers --- */

/* The first byte at or after p that is not a digit (or end). Eight bytes at a time while eight
 * remain, for the long runs of digits that tensor data is made of: a byte is a digit when its
 * high nibble is 3 and adding 6 leaves it so (fast_float's test). */
static const char *lex_digits(const char *p, const char *end)
{
    while (end - p >= 8) {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        if (((v & 0xF0F0F0F0F0F0F0F0u) |
             (((v + 0x0606060606060606u) & 0xF0F0F0F0F0F0F0F0u) >> 4)) != 0x3333333333333333u)
            break;
        p += 8;
    }
    while (p < end && is_digit(*p))
        p++;
    return p;
}

const char *json_lex_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

const char *json_lex_number(const char *p, const char *end, bool *ret_is_int)
{
    bool is_int = true;
    if (p < end && *p == '-') p++;
    if (p >= end || !is_digit(*p)) return NULL;
    p = *p == '0' ? p + 1 : lex_digits(p, end);
    if (p < end && *p == '.') {
        if (++p >= end || !is_digit(*p)) return NULL;
        p = lex_digits(p, end);
        is_int = false;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        if (++p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || !is_digit(*p)) return NULL;
        while (p < end && is_digit(*p))
            p++;
        is_int = false;
    }
    *ret_is_int = is_int;
    return p;
}

const char *json_lex_string(const char *p, const char *end, bool *ret_plain)
{
    bool plain = true;
    for (p++; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            *ret_plain = plain;
            return p + 1;
        }
        if (c == '\\') {
            plain = false;
            if (++p >= end) return NULL;
        } else if (c < 0x20 || c >= 0x7f) {
            plain = false;
        }
    }
    return NULL;
}

const char *json_lex_skip(const char *p, const char *end)
{
    size_t depth = 0;
    while (p < end) {
        char c = *p;
        if (c == '"') {
            bool plain;
            p = json_lex_string(p, end, &plain);
            if (!p) return NULL;
            continue;
        }
        if (c == '[' || c == '{') {
            depth++;
        } else if (c == ']' || c == '}') {
            if (depth == 0) return p;
            depth--;
        } else if (c == ',' && depth == 0) {
            return p;
        }
        p++;
    }
    return depth == 0 ? p : NULL;
}

/* --- checking a cut value as jansson would --- */

/* Checks text[p..q) with jansson itself: strings with escapes or non-ASCII bytes and objects
 * are rare in tensor data, and jansson then says exactly what it would have said. */
static const char *scan_check_with_jansson(scanner_t *s, const char *p, const char *q)
{
    json_error_t jerr;
    json_t *v = json_loadb(p, (size_t)(q - p), JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (!v) return scan_fail(s, p + (jerr.position > 0 ? jerr.position - 1 : 0), "%s", jerr.text);
    json_decref(v);
    return q;
}

/* The long integer text[p..q) (a JSON integer of 19 digits or more, sign apart): refused as
 * jansson refuses one outside json_int_t (long long). */
static const char *scan_check_long_integer(scanner_t *s, const char *p, const char *q)
{
    bool neg = *p == '-';
    char buf[32];
    if (q - p >= (ptrdiff_t)sizeof buf)
        return scan_fail(s, p, neg ? "too big negative integer" : "too big integer");
    memcpy(buf, p, (size_t)(q - p));
    buf[q - p] = '\0';
    errno = 0;
    (void)strtoll(buf, NULL, 10);
    if (errno == ERANGE)
        return scan_fail(s, p, neg ? "too big negative integer" : "too big integer");
    return q;
}

/* An integer jansson holds in a json_int_t (long long); a real that does not overflow a
 * double: jansson refuses the others as invalid JSON, and so does the scanner. One pass over
 * the text, which for tensor data is most of the document: the digits before the point and
 * the exponent are counted as it goes, since only a value of at least 10^300 can overflow. */
static const char *scan_check_number(scanner_t *s, const char *p)
{
    const char *q = p, *end = s->end;
    if (*q == '-') q++;
    const char *digits = q;
    if (q >= end || !is_digit(*q)) return scan_fail(s, p, "invalid token");
    q = *q == '0' ? q + 1 : lex_digits(q, end);
    long int_digits = (long)(q - digits), exp10 = 0;
    bool is_int = true;
    if (q < end && *q == '.') {
        if (++q >= end || !is_digit(*q)) return scan_fail(s, p, "invalid token");
        q = lex_digits(q, end);
        is_int = false;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        bool exp_neg = false;
        if (++q < end && (*q == '+' || *q == '-')) exp_neg = *q++ == '-';
        if (q >= end || !is_digit(*q)) return scan_fail(s, p, "invalid token");
        for (; q < end && is_digit(*q); q++)
            if (exp10 < 100000) exp10 = exp10 * 10 + (*q - '0');
        if (exp_neg) exp10 = -exp10;
        is_int = false;
    }
    if (is_int) return int_digits < 19 ? q : scan_check_long_integer(s, p, q);
    double x;
    if (int_digits + exp10 > 300 && (float_parse_f64(p, (size_t)(q - p), &x) < 0 || isinf(x)))
        return scan_fail(s, p, "real number overflow");
    return q;
}

static const char *scan_check_scalar(scanner_t *s, const char *p)
{
    static const char *const literals[] = {"true", "false", "null"};
    const char *end = s->end;
    if (*p == '-' || is_digit(*p)) return scan_check_number(s, p);
    if (*p == '"') {
        bool plain;
        const char *q = json_lex_string(p, end, &plain);
        if (!q) return scan_fail(s, p, "premature end of input");
        return plain ? q : scan_check_with_jansson(s, p, q);
    }
    if (*p == '{') {
        const char *q = json_lex_skip(p, end);
        if (!q) return scan_fail(s, p, "premature end of input");
        return scan_check_with_jansson(s, p, q);
    }
    for (size_t i = 0; i < sizeof literals / sizeof *literals; i++) {
        size_t n = strlen(literals[i]);
        if ((size_t)(end - p) >= n && memcmp(p, literals[i], n) == 0) return p + n;
    }
    return scan_fail(s, p, "invalid token");
}

/* Checks the value at p, nested lists included, and returns its end (NULL: not JSON). */
static const char *scan_check_value(scanner_t *s, const char *p)
{
    const char *end = s->end;
    int depth = 0;
    for (;;) {
        p = json_lex_ws(p, end);
        if (p >= end) return scan_fail(s, p, "premature end of input");
        if (*p == '[') {
            if (++depth > JSON_SCAN_MAX_DEPTH)
                return scan_fail(s, p, "maximum parsing depth reached");
            p = json_lex_ws(p + 1, end);
            if (p >= end || *p != ']') continue; /* a first element follows */
            p++;
            depth--;
        } else {
            p = scan_check_scalar(s, p);
            if (!p) return NULL;
        }
        /* After a value: close lists until one takes another element. */
        for (;;) {
            if (depth == 0) return p;
            p = json_lex_ws(p, end);
            if (p < end && *p == ',') {
                p++;
                break;
            }
            if (p >= end || *p != ']') return scan_fail(s, p, "',' or ']' expected");
            p++;
            depth--;
        }
    }
}

/* --- the skeleton --- */

static bool scan_append(scanner_t *s, const char *bytes, size_t n)
{
    json_scan_t *out = s->out;
    if (s->cap - out->skeleton_len <= n) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap - out->skeleton_len <= n)
            cap *= 2;
        char *grown = realloc(out->skeleton, cap);
        if (!grown) return s->oom = true, false;
        out->skeleton = grown;
        s->cap = cap;
    }
    memcpy(out->skeleton + out->skeleton_len, bytes, n);
    out->skeleton_len += n;
    out->skeleton[out->skeleton_len] = '\0';
    return true;
}

/* Replaces text[p..q) by the index of a new span in the skeleton. */
static bool scan_cut_span(scanner_t *s, const char *p, const char *q, json_span_t span)
{
    json_scan_t *out = s->out;
    if (out->n_spans == out->spans_cap) {
        size_t cap = out->spans_cap ? out->spans_cap * 2 : 16;
        json_span_t *grown = realloc(out->spans, cap * sizeof *grown);
        if (!grown) return s->oom = true, false;
        out->spans = grown;
        out->spans_cap = cap;
    }
    char index[24];
    int n = snprintf(index, sizeof index, "%zu", out->n_spans);
    if (!scan_append(s, s->copied, (size_t)(p - s->copied)) || !scan_append(s, index, (size_t)n))
        return false;
    span.skel_off = out->skeleton_len - (size_t)n;
    span.skel_len = (size_t)n;
    span.cut_end = (size_t)(q - s->text);
    out->spans[out->n_spans++] = span;
    s->copied = q;
    return true;
}

/* --- a data list read as it is checked --- */

/* The number at p, read into *out as dtype (f32 or f64) by one pass of the parser over its
 * text: its end, or NULL when p does not start a number that JSON and jansson take and that
 * is finite in dtype. fast_float's syntax is wider than JSON's, so what it takes that JSON
 * refuses is looked for in the text it took: a leading zero ("01"), a point without a digit
 * after it ("1.", "1.e5"), and what jansson refuses besides, an integer of 19 digits or more,
 * which may not fit its long long. Texts such as "1e" or "1.5.2" make it stop where JSON's
 * number would not end, which the list around it finds. */
static const char *scan_real(const char *p, const char *end, dtype_t dtype, void *out)
{
    const char *s = p < end && *p == '-' ? p + 1 : p;
    if (s >= end || !is_digit(*s)) return NULL;
    const char *q;
    if (dtype == DTYPE_F32) {
        float f;
        q = float_parse_f32_prefix(p, end, &f);
        if (!q || isinf(f)) return NULL;
        memcpy(out, &f, sizeof f);
    } else {
        double x;
        q = float_parse_f64_prefix(p, end, &x);
        if (!q || isinf(x)) return NULL;
        memcpy(out, &x, sizeof x);
    }
    /* r: the end of the integer part, which a leading zero ends at once. */
    const char *r = s + 1;
    if (*s != '0')
        while (r < q && is_digit(*r))
            r++;
    if (r == q) return q - s < 19 ? q : NULL;
    if (is_digit(*r) || (*r == '.' && (r + 1 == q || !is_digit(r[1])))) return NULL;
    return q;
}

/* The data value at p when it is a flat list of numbers and dtype f32 or f64: read into a
 * typed block (span->values) while it is checked, the parse of each number being its lexer,
 * so that its text is read once. Its end; NULL, with nothing kept, at anything else (nested
 * lists, strings, a number out of the dtype's range or whose text JSON may refuse, a block
 * over max_values_bytes): the caller then checks the value the general way, which finds what
 * jansson would say, and the codec reads it and says what does not fit the tensor. */
static const char *scan_read_reals(scanner_t *s, const char *p, dtype_t dtype, json_span_t *span)
{
    const char *end = s->end;
    size_t size = dtype == DTYPE_F32 ? sizeof(float) : sizeof(double);
    if ((dtype != DTYPE_F32 && dtype != DTYPE_F64) || p >= end || *p != '[') return NULL;
    p = json_lex_ws(p + 1, end);
    char *values = NULL;
    size_t n = 0, cap = 0;
    while (p < end && *p != ']') {
        if ((uint64_t)(n + 1) * size > s->max_values_bytes ||
            vec_grow((void **)&values, &cap, n + 1, size, 64) < 0)
            break;
        const char *q = scan_real(p, end, dtype, values + n * size);
        if (!q) break;
        n++;
        p = json_lex_ws(q, end);
        if (p < end && *p == ']') {
            /* The block as long as the list (it grew by doubling): shrinking keeps it. */
            void *fitted = n < cap ? realloc(values, n * size) : NULL;
            if (fitted) values = fitted;
            *span = (json_span_t){.off = span->off,
                                  .kind = JSON_SPAN_VALUE,
                                  .values = values,
                                  .n_values = n,
                                  .values_dtype = dtype};
            return p + 1;
        }
        if (p >= end || *p != ',') break;
        p = json_lex_ws(p + 1, end);
    }
    free(values);
    return NULL;
}

/* --- cutting --- */

/* Cuts the value at p (of a data key, or of a b64 key when b64): a string without escapes
 * under b64 becomes a JSON_SPAN_B64 span of its characters, anything else a checked
 * JSON_SPAN_VALUE span, which holds the values of a flat list of numbers already read when
 * dtype (the tensor's, DTYPE_COUNT when not known yet) is f32 or f64. */
static const char *scan_cut(scanner_t *s, const char *p, bool b64, dtype_t dtype)
{
    json_span_t span = {.off = (size_t)(p - s->text), .kind = JSON_SPAN_VALUE};
    const char *q = NULL;
    bool plain = false;
    if (b64 && p < s->end && *p == '"') q = json_lex_string(p, s->end, &plain);
    if (q && plain) {
        span =
            (json_span_t){.off = span.off + 1, .len = (size_t)(q - p) - 2, .kind = JSON_SPAN_B64};
    } else {
        if (!b64 && !s->counting) q = scan_read_reals(s, p, dtype, &span);
        if (!q) q = scan_check_value(s, p);
        if (!q) return NULL;
        span.len = (size_t)(q - p);
    }
    if (s->counting) return q;
    if (scan_cut_span(s, p, q, span)) return q;
    free(span.values);
    return NULL;
}

/* The dtype that the value at p of a tensor's "dtype" key names, when it is a plain string
 * naming one; DTYPE_COUNT otherwise (jansson and the codec judge the value later). */
static dtype_t scan_dtype(const scanner_t *s, const char *p)
{
    char name[8];
    bool plain = false;
    const char *q = p < s->end && *p == '"' ? json_lex_string(p, s->end, &plain) : NULL;
    size_t n = q ? (size_t)(q - p) - 2 : sizeof name;
    dtype_t dt;
    if (!plain || n >= sizeof name) return DTYPE_COUNT;
    memcpy(name, p + 1, n);
    name[n] = '\0';
    return dtype_parse(name, &dt) == 0 ? dt : DTYPE_COUNT;
}

/* What the key text[k..q) (quotes included) of an object with role leads to. */
static scan_key_t scan_key(const char *k, const char *q, bool plain, scan_role_t role)
{
    if (role == ROLE_INPUTS) return KEY_TENSOR;
    char name[8];
    size_t n = (size_t)(q - k) - 2;
    if (plain) {
        if (n >= sizeof name) return KEY_OTHER;
        memcpy(name, k + 1, n);
        name[n] = '\0';
    } else {
        /* An escaped key ("d\u0061ta") names what jansson decodes it to. */
        json_t *v = json_loadb(k, (size_t)(q - k), JSON_DECODE_ANY, NULL);
        bool fits = json_is_string(v) && json_string_length(v) < sizeof name;
        if (fits) memcpy(name, json_string_value(v), json_string_length(v) + 1);
        json_decref(v);
        if (!fits) return KEY_OTHER;
    }
    if (role == ROLE_JOB) return strcmp(name, "inputs") == 0 ? KEY_INPUTS : KEY_OTHER;
    if (strcmp(name, "data") == 0) return KEY_CUT_DATA;
    if (strcmp(name, "dtype") == 0) return KEY_DTYPE;
    return strcmp(name, "b64") == 0 ? KEY_CUT_B64 : KEY_OTHER;
}

static const char *scan_value(scanner_t *s, const char *p, scan_role_t role);

/* The members of the object at p, whose role is not ROLE_OTHER. */
static const char *scan_object(scanner_t *s, const char *p, scan_role_t role)
{
    const char *end = s->end;
    dtype_t dtype = DTYPE_COUNT; /* a tensor's, once its dtype key is passed */
    p = json_lex_ws(p + 1, end);
    if (p < end && *p == '}') return p + 1;
    for (;;) {
        p = json_lex_ws(p, end);
        if (p >= end || *p != '"') return scan_fail(s, p, "string or '}' expected");
        bool plain;
        const char *q = json_lex_string(p, end, &plain);
        if (!q) return scan_fail(s, p, "premature end of input");
        scan_key_t key = scan_key(p, q, plain, role);
        p = json_lex_ws(q, end);
        if (p >= end || *p != ':') return scan_fail(s, p, "':' expected");
        p = json_lex_ws(p + 1, end);
        if (key == KEY_DTYPE) dtype = scan_dtype(s, p);
        if (key == KEY_CUT_DATA || key == KEY_CUT_B64)
            p = scan_cut(s, p, key == KEY_CUT_B64, dtype);
        else
            p = scan_value(s, p,
                           key == KEY_INPUTS   ? ROLE_INPUTS
                           : key == KEY_TENSOR ? ROLE_TENSOR
                                               : ROLE_OTHER);
        if (!p) return NULL;
        p = json_lex_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == '}') return p + 1;
        return scan_fail(s, p, "',' or '}' expected");
    }
}

/* A value with role: an object whose role matters is walked, anything else skipped (and
 * left for jansson to check). */
static const char *scan_value(scanner_t *s, const char *p, scan_role_t role)
{
    if (role != ROLE_OTHER && p < s->end && *p == '{') return scan_object(s, p, role);
    const char *q = json_lex_skip(p, s->end);
    return q ? q : scan_fail(s, p, "premature end of input");
}

/* A top-level list of jobs at p: counts them, and once past max_jobs only counts. */
static const char *scan_list(scanner_t *s, const char *p, size_t max_jobs)
{
    const char *end = s->end;
    s->out->is_list = true;
    s->out->n_jobs = 0;
    p = json_lex_ws(p + 1, end);
    if (p < end && *p == ']') return p + 1;
    for (;;) {
        if (s->out->n_jobs++ == max_jobs) s->counting = true;
        p = json_lex_ws(p, end);
        p = s->counting ? json_lex_skip(p, end) : scan_value(s, p, ROLE_JOB);
        if (!p) return s->counting ? scan_fail(s, end, "premature end of input") : NULL;
        p = json_lex_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == ']') return p + 1;
        return scan_fail(s, p, "',' or ']' expected");
    }
}

int json_scan(const char *text, size_t len, size_t max_jobs, uint64_t max_values_bytes,
              json_scan_t *ret, json_scan_error_t *err)
{
    json_scan_t out = {.text = text, .n_jobs = 1};
    scanner_t s = {.text = text,
                   .end = text + len,
                   .out = &out,
                   .err = err,
                   .copied = text,
                   .max_values_bytes = max_values_bytes};
    const char *p = json_lex_ws(text, s.end);
    if (p < s.end && *p == '[')
        p = scan_list(&s, p, max_jobs);
    else
        p = scan_value(&s, p, ROLE_JOB);
    if (p && !s.counting) scan_append(&s, s.copied, (size_t)(s.end - s.copied));
    if (!p || s.oom || s.counting) {
        json_scan_done(&out);
        if (s.oom) return -ENOMEM;
        if (!p) return -EINVAL;
        out = (json_scan_t){.text = text, .n_jobs = out.n_jobs, .is_list = true};
    }
    *ret = out;
    return 0;
}

size_t json_scan_text_offset(const json_scan_t *s, size_t skel_offset)
{
    size_t shift_from = 0, shift_to = 0;
    for (size_t i = 0; i < s->n_spans && s->spans[i].skel_off <= skel_offset; i++) {
        const json_span_t *span = &s->spans[i];
        if (skel_offset < span->skel_off + span->skel_len) return span->cut_end;
        shift_from = span->skel_off + span->skel_len;
        shift_to = span->cut_end;
    }
    return skel_offset - shift_from + shift_to;
}

void *json_scan_take_values(json_scan_t *s, size_t i)
{
    if (i >= s->n_spans) return NULL;
    void *values = s->spans[i].values;
    s->spans[i].values = NULL;
    return values;
}

void json_scan_done(json_scan_t *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n_spans; i++)
        free(s->spans[i].values);
    free(s->skeleton);
    free(s->spans);
    s->skeleton = NULL;
    s->spans = NULL;
}
