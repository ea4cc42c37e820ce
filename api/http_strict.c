/* Strict request lines and header fields (http_strict.h). */
#include "http_strict.h"

#include <stdint.h>
#include <string.h>

static bool byte_is_control(unsigned char c)
{
    return c < 0x20 || c == 0x7f;
}

static bool byte_is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

bool http_is_token(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!byte_is_tchar((unsigned char)s[i])) return false;
    return n > 0;
}

bool http_value_has_control(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != '\t' && byte_is_control((unsigned char)s[i])) return true;
    return false;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

bool http_target_is_bad(const char *target)
{
    for (const char *p = target; *p; p++) {
        int hi = *p == '%' ? hex_digit(p[1]) : -1, lo = hi >= 0 ? hex_digit(p[2]) : -1;
        unsigned char c = (unsigned char)*p,
                      escaped = lo >= 0 ? (unsigned char)(hi * 16 + lo) : 'x';
        if (byte_is_control(c) || c == ' ' || byte_is_control(escaped) || escaped == ' ')
            return true;
    }
    return false;
}

/* Addresses as integers: a folded field's name lies outside the head, and comparing pointers
 * into different objects is not defined. */
static uintptr_t at(const char *p)
{
    return (uintptr_t)p;
}

/* Whether [p, p + n) lies within the head. */
static bool in_head(const http_head_walk_t *w, const char *p, size_t n)
{
    return at(p) >= at(w->start) && at(p) <= at(w->end) && n <= at(w->end) - at(p);
}

/* Whether the walk's next bytes, up to p, are between min and max NULs: a line's end. Moves
 * next to p. */
static void skip_line_end(http_head_walk_t *w, const char *p, size_t min, size_t max)
{
    if (w->hidden) return;
    size_t gap = at(p) - at(w->next);
    if (at(p) < at(w->next) || gap < min || gap > max || !in_head(w, w->next, gap)) {
        w->hidden = true;
        return;
    }
    for (size_t i = 0; i < gap; i++)
        if (w->next[i]) w->hidden = true;
    w->next = p;
}

void http_head_walk_begin(http_head_walk_t *w, const char *method, size_t head_size,
                          const char *url, size_t target_len, const char *version)
{
    *w = (http_head_walk_t){.start = method, .end = method + head_size, .next = method};
    /* "METHOD SP target SP version", each space a NUL now. */
    size_t method_len = strnlen(method, head_size);
    w->hidden = at(url) != at(method) + method_len + 1 || !in_head(w, url, target_len + 1) ||
                at(version) != at(url) + target_len + 1;
    if (w->hidden) return;
    size_t version_len = strnlen(version, at(w->end) - at(version));
    w->next = version + version_len;
}

void http_head_walk_field(http_head_walk_t *w, const char *name, size_t name_len, const char *value,
                          size_t value_len)
{
    skip_line_end(w, name, 1, 2);
    if (w->hidden) return;
    /* The name, its colon, then only the spaces and tabs before the value. */
    const char *after_colon = name + name_len + 1;
    if (!in_head(w, name, name_len + 1) || at(value) < at(after_colon) ||
        !in_head(w, value, value_len)) {
        w->hidden = true;
        return;
    }
    for (const char *p = after_colon; at(p) < at(value); p++)
        if (*p != ' ' && *p != '\t') w->hidden = true;
    w->next = value + value_len;
}

bool http_head_walk_end(http_head_walk_t *w)
{
    /* The last line's end and the empty line's: LF LF to CR LF CR LF. */
    skip_line_end(w, w->end, 2, 4);
    return w->hidden;
}
