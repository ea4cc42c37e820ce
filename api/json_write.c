/* The answers' JSON writer (json_write.h): a walk of the json_t tree into one growing buffer. */
#include "json_write.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/vec.h"
#include "float_print.h"

/* The marker of raw nodes: a null of our own, never freed, which jansson's json_incref and
 * json_decref (inline in jansson.h) leave alone because its count is (size_t)-1, as for
 * jansson's own true, false and null. A raw node is the array [&raw_marker, "text"]. */
static json_t raw_marker = {JSON_NULL, (size_t)-1};

json_t *json_raw_new(const char *text, size_t len)
{
    json_t *node = json_array();
    if (!node) return NULL;
    if (json_array_append_new(node, &raw_marker) < 0 ||
        json_array_append_new(node, json_stringn_nocheck(text, len)) < 0) {
        json_decref(node);
        return NULL;
    }
    return node;
}

const char *json_raw_text(const json_t *node, size_t *ret_len)
{
    if (!json_is_array(node) || json_array_size(node) != 2 ||
        json_array_get(node, 0) != &raw_marker)
        return NULL;
    const json_t *text = json_array_get(node, 1);
    *ret_len = json_string_length(text);
    return json_string_value(text);
}

typedef struct writer {
    char *buf;
    size_t len, cap;
    bool failed; /* out of memory: the rest is skipped */
} writer_t;

/* Makes room for n more bytes and a NUL: false when memory ran out. */
static bool wr_reserve(writer_t *w, size_t n)
{
    if (w->failed) return false;
    if (n >= SIZE_MAX - w->len || vec_grow((void **)&w->buf, &w->cap, w->len + n + 1, 1, 256) < 0)
        w->failed = true;
    return !w->failed;
}

static void wr_put(writer_t *w, const char *s, size_t n)
{
    if (!wr_reserve(w, n)) return;
    memcpy(w->buf + w->len, s, n);
    w->len += n;
}

static void wr_char(writer_t *w, char c)
{
    if (!wr_reserve(w, 1)) return;
    w->buf[w->len++] = c;
}

/* A string, quoted and escaped as jansson escapes it: the quote, the backslash and control
 * characters (\b \f \n \r \t by name, the rest as \u00XX in capitals); UTF-8 as it is. */
static void wr_string(writer_t *w, const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    wr_char(w, '"');
    size_t run = 0; /* the start of the bytes not yet written */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        wr_put(w, s + run, i - run);
        run = i + 1;
        char esc[6] = {'\\', 0};
        size_t len = 2;
        switch (c) {
        case '"':
        case '\\':
            esc[1] = (char)c;
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            len = 6;
            break;
        }
        wr_put(w, esc, len);
    }
    wr_put(w, s + run, n - run);
    wr_char(w, '"');
}

size_t json_format_integer(int64_t v, char *buf)
{
    char digits[JSON_INTEGER_MAX];
    size_t n = 0;
    /* Through unsigned, so that the most negative value negates without overflow. */
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        digits[sizeof digits - 1 - n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) digits[sizeof digits - 1 - n++] = '-';
    memcpy(buf, digits + sizeof digits - n, n);
    buf[n] = '\0';
    return n;
}

static void wr_value(writer_t *w, const json_t *v);

static void wr_array(writer_t *w, const json_t *v)
{
    size_t raw_len;
    const char *raw = json_raw_text(v, &raw_len);
    if (raw) {
        wr_put(w, raw, raw_len);
        return;
    }
    wr_char(w, '[');
    size_t n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        if (i) wr_char(w, ',');
        wr_value(w, json_array_get(v, i));
    }
    wr_char(w, ']');
}

/* Keys in the order of json_object_iter, which is json_dumps's without JSON_SORT_KEYS. */
static void wr_object(writer_t *w, const json_t *v)
{
    wr_char(w, '{');
    bool first = true;
    for (void *it = json_object_iter((json_t *)v); it;
         it = json_object_iter_next((json_t *)v, it)) {
        if (!first) wr_char(w, ',');
        first = false;
        wr_string(w, json_object_iter_key(it), json_object_iter_key_len(it));
        wr_char(w, ':');
        wr_value(w, json_object_iter_value(it));
    }
    wr_char(w, '}');
}

static void wr_value(writer_t *w, const json_t *v)
{
    char num[FLOAT_PRINT_MAX];
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        wr_object(w, v);
        break;
    case JSON_ARRAY:
        wr_array(w, v);
        break;
    case JSON_STRING:
        wr_string(w, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        wr_put(w, num, json_format_integer(json_integer_value(v), num));
        break;
    case JSON_REAL:
        /* jansson holds only finite reals. */
        wr_put(w, num, float_print_f64(json_real_value(v), num));
        break;
    case JSON_TRUE:
        wr_put(w, "true", 4);
        break;
    case JSON_FALSE:
        wr_put(w, "false", 5);
        break;
    case JSON_NULL:
        wr_put(w, "null", 4);
        break;
    }
}

int json_write(const json_t *root, char **ret_text, size_t *ret_len)
{
    writer_t w = {0};
    wr_value(&w, root);
    if (!wr_reserve(&w, 0)) {
        free(w.buf);
        return -ENOMEM;
    }
    w.buf[w.len] = '\0';
    *ret_text = w.buf;
    *ret_len = w.len;
    return 0;
}
