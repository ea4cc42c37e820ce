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

#ifdef __cplusplus
}
#endif
