/* JSON text with shortest reals (gjc_json_dumps): jansson prints every real with 17
 * significant digits, so an f32 0.2 that the daemon sent as "0.2" would come back as
 * 0.20000000000000001. The daemon prints each number shortest for its dtype; a real read from
 * that text into a double has the same shortest text, so printing the shortest text of each
 * double gives back what the daemon sent, in the daemon's form. */
#include <locale.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpujob_internal.h"

/* The shortest decimal that reads back to x (finite): its digits (no trailing zero), their
 * count, and the power of ten of the first one. libc's %e rounds correctly, so the first
 * precision whose text reads back is the shortest, and that text the nearest of its length. */
static int shortest_digits(double x, char *digits, int *ret_exp10)
{
    char text[40];
    for (int precision = 0; precision < 17; precision++) {
        snprintf(text, sizeof text, "%.*e", precision, x);
        if (strtod(text, NULL) == x) break;
    }
    const char *p = text + (*text == '-');
    int len = 0;
    for (; *p != 'e'; p++)
        if (*p != '.') digits[len++] = *p;
    *ret_exp10 = atoi(p + 1);
    while (len > 1 && digits[len - 1] == '0')
        len--;
    return len;
}

static void write_zeros(FILE *f, int n)
{
    while (n-- > 0)
        fputc('0', f);
}

/* Writes the real x to f as the daemon writes one: decimal when its first digit's power of
 * ten is within [-6, 21), with ".0" after an integral value; else one digit, the others after
 * a point, and "e+N" or "e-N". */
static void write_real(FILE *f, double x)
{
    if (x == 0) {
        fputs(signbit(x) ? "-0.0" : "0.0", f);
        return;
    }
    char digits[24];
    int exp10;
    int len = shortest_digits(x, digits, &exp10);
    if (x < 0) fputc('-', f);
    if (exp10 < -6 || exp10 >= 21) {
        fputc(digits[0], f);
        if (len > 1) fprintf(f, ".%.*s", len - 1, digits + 1);
        fprintf(f, "e%c%d", exp10 < 0 ? '-' : '+', abs(exp10));
        return;
    }
    int point = exp10 + 1; /* the digits before the point */
    if (point <= 0) {
        fputs("0.", f);
        write_zeros(f, -point);
        fwrite(digits, 1, (size_t)len, f);
    } else if (point >= len) {
        fwrite(digits, 1, (size_t)len, f);
        write_zeros(f, point - len);
        fputs(".0", f);
    } else {
        fprintf(f, "%.*s.%.*s", point, digits, len - point, digits + point);
    }
}

/* The end of the number at p in jansson's text: a real has a point or an exponent. */
static const char *number_end(const char *p, bool *ret_is_real)
{
    bool is_real = false;
    for (p++; strchr("0123456789+-.eE", *p) && *p; p++)
        if (*p == '.' || *p == 'e' || *p == 'E') is_real = true;
    *ret_is_real = is_real;
    return p;
}

/* The end of the string whose opening quote is at p. */
static const char *string_end(const char *p)
{
    for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && p[1]) p++;
    return *p ? p + 1 : p;
}

char *gjc_json_dumps(const json_t *v, size_t flags)
{
    char *text = json_dumps(v, flags | JSON_REAL_PRECISION(17));
    if (!text) return NULL;
    char *out = NULL;
    size_t out_len = 0;
    FILE *f = open_memstream(&out, &out_len);
    if (!f) {
        free(text);
        return NULL;
    }
    /* jansson writes a '.' whatever the locale; so do %e and strtod in the C locale. */
    locale_t c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    locale_t previous = c_locale ? uselocale(c_locale) : (locale_t)0;
    for (const char *p = text; *p;) {
        const char *q;
        bool is_real = false;
        if (*p == '"')
            q = string_end(p);
        else if (*p == '-' || (*p >= '0' && *p <= '9'))
            q = number_end(p, &is_real);
        else
            q = p + 1;
        if (is_real)
            write_real(f, strtod(p, NULL));
        else
            fwrite(p, 1, (size_t)(q - p), f);
        p = q;
    }
    if (c_locale) {
        uselocale(previous);
        freelocale(c_locale);
    }
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0) failed = true;
    free(text);
    if (failed) {
        free(out);
        return NULL;
    }
    return out;
}
