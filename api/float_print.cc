/* Google's double-conversion library (Debian's libdouble-conversion-dev) behind float_print.h:
 * its shortest modes give the fewest digits that round-trip for doubles and floats, never read
 * the locale and allocate nothing. */
#include "float_print.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <double-conversion/double-to-string.h>

#include "float_parse.h"

using double_conversion::DoubleToStringConverter;
using double_conversion::StringBuilder;

/* JavaScript's form (decimal within [1e-6, 1e21), "e+21" beyond) with a ".0" after integral
 * values, and the sign of -0.0 kept, as Python writes them. */
static const DoubleToStringConverter
    converter(DoubleToStringConverter::EMIT_POSITIVE_EXPONENT_SIGN |
                  DoubleToStringConverter::EMIT_TRAILING_DECIMAL_POINT |
                  DoubleToStringConverter::EMIT_TRAILING_ZERO_AFTER_POINT,
              "inf", "nan", 'e', -6, 21, 0, 0);

/* The builder's text, NUL-terminated, and its length. */
static size_t finish(StringBuilder *sb)
{
    size_t len = (size_t)sb->position();
    sb->Finalize();
    return len;
}

extern "C" size_t float_print_f64(double v, char *buf)
{
    StringBuilder sb(buf, FLOAT_PRINT_MAX);
    converter.ToShortest(v, &sb);
    return finish(&sb);
}

extern "C" size_t float_print_f32(float v, char *buf)
{
    StringBuilder sb(buf, FLOAT_PRINT_MAX);
    converter.ToShortestSingle(v, &sb);
    return finish(&sb);
}

/* The double nearest to the decimal mantissa * 10^exp10, read as the JSON reader reads it. */
static double decimal_value(bool negative, uint64_t mantissa, int exp10)
{
    char text[48];
    int n = snprintf(text, sizeof text, "%s%llue%d", negative ? "-" : "",
                     (unsigned long long)mantissa, exp10);
    double x = 0;
    float_parse_f64(text, (size_t)n, &x);
    return x;
}

/* Whether the double x reads back to v through narrow; compares bits, for -0.0. */
static bool reads_back(double x, double v, double (*narrow)(double))
{
    double y = narrow(x);
    return std::memcmp(&y, &v, sizeof y) == 0;
}

extern "C" size_t float_print_narrow(double v, double (*narrow)(double), char *buf)
{
    if (!std::isfinite(v) || v == 0) return float_print_f64(v, buf);
    /* The decimals that read back to v form an interval around it: with p digits, one lies
     * in it if and only if the p-digit decimal just below v or the one just above does.
     * DoubleToAscii gives the nearest of those two; its neighbour is one unit of the last
     * digit away. The first p that has one is the shortest, and the nearest such is kept. */
    for (int p = 1; p <= 17; p++) {
        char digits[24];
        bool sign;
        int len, point;
        DoubleToStringConverter::DoubleToAscii(v, DoubleToStringConverter::PRECISION, p, digits,
                                               sizeof digits, &sign, &len, &point);
        uint64_t m = 0;
        for (int i = 0; i < p; i++)
            m = m * 10 + (uint64_t)(i < len ? digits[i] - '0' : 0);
        int exp10 = point - p;
        const uint64_t candidates[3] = {m, m - 1, m + 1};
        for (int c = 0; c < 3; c++) {
            double x = decimal_value(sign, candidates[c], exp10);
            if (reads_back(x, v, narrow)) return float_print_f64(x, buf);
        }
    }
    return float_print_f64(v, buf);
}
