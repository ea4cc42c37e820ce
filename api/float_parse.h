/* Decimal text to binary floating point, correctly rounded and independent of the locale: a C
 * face of the fast_float library (float_parse.cc), for the JSON tensor codec. */
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Parses the whole of text[0..len), a JSON number, rounded to nearest: 0 and *ret, or -EINVAL
 * when the text is not a number or has bytes after it. A value too large for the type comes
 * back as an infinity with 0, as IEEE rounding gives it: the caller decides whether that is an
 * error. */
int float_parse_f64(const char *text, size_t len, double *ret);
int float_parse_f32(const char *text, size_t len, float *ret);

/* The same for a number that starts at text and is followed by other text before end: the
 * end of the number, or NULL when text does not start with one. The parser's syntax is wider
 * than JSON's (it takes "1." and "inf"), so the caller must know the text to be JSON (the
 * tensor codec reads data that json_scan() has checked): then the number ends where JSON's
 * does, and the JSON text is lexed once, by the parser itself. */
const char *float_parse_f64_prefix(const char *text, const char *end, double *ret);
const char *float_parse_f32_prefix(const char *text, const char *end, float *ret);

#ifdef __cplusplus
}
#endif
