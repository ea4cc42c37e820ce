/* Binary floating point to the shortest decimal text that reads back to the same value, for
 * the JSON answers: a C face of the dragonbox and double-conversion libraries (float_print.cc).
 *
 * The text is JSON's number syntax in the form JavaScript and Python print: decimal from 1e-6
 * up to 1e21, an exponent outside ("1e-7", "1e+21"), and a ".0" after an integral value
 * ("2.0", "-0.0") so that a JSON reader still sees a real. NaN and the infinities, which JSON
 * lacks, come out as "nan", "inf" and "-inf": the caller quotes them or refuses them. */
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The room a printed number needs at most, its terminating NUL included. */
#define FLOAT_PRINT_MAX 32

/* Each writes the text of v into buf (FLOAT_PRINT_MAX bytes), NUL-terminated, and returns its
 * length. _f64 is shortest among the texts that read back to the same double, _f32 among
 * those that read back (as a float, correctly rounded) to the same float. */
size_t float_print_f64(double v, char *buf);
size_t float_print_f32(float v, char *buf);

/* The shortest text that reads back to v through narrow, for types narrower than a float
 * (f16, bf16) that double-conversion has no shortest mode for: v must be a value of that type,
 * and narrow(x) must round a double x to the nearest value of the type, monotonically (the
 * way the JSON reader stores it). Among the texts of fewest digits, the one nearest to v. */
size_t float_print_narrow(double v, double (*narrow)(double), char *buf);

#ifdef __cplusplus
}
#endif
