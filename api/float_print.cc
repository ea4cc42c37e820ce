/* The answers' floats as text. Shortest round trip for doubles and floats comes from
 * dragonbox (Debian's libdragonbox-dev, header-only): it gives the fewest digits, the nearest
 * of them, as an integer and a power of ten, several times faster than double-conversion's
 * Grisu, which matters because an answer may hold thousands of them. The text around those
 * digits is written here, in one pass into the caller's buffer. Google's double-conversion
 * (libdouble-conversion-dev) remains for f16 and bf16, for its fixed-precision digits. Neither
 * reads the locale or allocates. */
#include "float_print.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <double-conversion/double-to-string.h>
#include <dragonbox/dragonbox.h>

#include "float_parse.h"

using double_conversion::DoubleToStringConverter;

/* Writes value = significand * 10^exponent (the digits of significand being the shortest,
 * no trailing zero) in JavaScript's form: decimal when the leading digit's power of ten is
 * within [-6, 21), with ".0" after an integral value; else one digit, the rest after a point,
 * and "e+N" or "e-N". Returns the length of the text, NUL-terminated. */
static size_t print_decimal(bool negative, uint64_t significand, int exponent, char *buf)
{
    static const char pairs[] = "00010203040506070809101112131415161718192021222324"
                                "25262728293031323334353637383940414243444546474849"
                                "50515253545556575859606162636465666768697071727374"
                                "75767778798081828384858687888990919293949596979899";
    int len = 1;
    for (uint64_t bound = 10; len < 20 && significand >= bound; bound *= 10)
        len++;
    /* The digits from the last, two at a time. */
    char digits[24];
    int i = len;
    for (; significand >= 100; significand /= 100) {
        i -= 2;
        std::memcpy(digits + i, pairs + 2 * (significand % 100), 2);
    }
    if (significand >= 10) {
        i -= 2;
        std::memcpy(digits + i, pairs + 2 * significand, 2);
    } else {
        digits[--i] = (char)('0' + significand);
    }
    int point = len + exponent; /* value = 0.digits * 10^point */
    char *p = buf;
    if (negative) *p++ = '-';
    if (point - 1 >= -6 && point - 1 < 21) {
        if (point <= 0) {
            *p++ = '0';
            *p++ = '.';
            std::memset(p, '0', (size_t)-point);
            p += -point;
            std::memcpy(p, digits, (size_t)len);
            p += len;
        } else if (point >= len) {
            std::memcpy(p, digits, (size_t)len);
            p += len;
            std::memset(p, '0', (size_t)(point - len));
            p += point - len;
            *p++ = '.';
            *p++ = '0';
        } else {
            std::memcpy(p, digits, (size_t)point);
            p += point;
            *p++ = '.';
            std::memcpy(p, digits + point, (size_t)(len - point));
            p += len - point;
        }
    } else {
        int e = point - 1;
        *p++ = digits[0];
        if (len > 1) {
            *p++ = '.';
            std::memcpy(p, digits + 1, (size_t)(len - 1));
            p += len - 1;
        }
        *p++ = 'e';
        *p++ = e < 0 ? '-' : '+';
        if (e < 0) e = -e;
        char exp_digits[4];
        int n = 0;
        do {
            exp_digits[n++] = (char)('0' + e % 10);
            e /= 10;
        } while (e);
        while (n)
            *p++ = exp_digits[--n];
    }
    *p = '\0';
    return (size_t)(p - buf);
}

/* Zero, the infinities and NaN, which dragonbox does not take: their text, or 0 for any other
 * value. */
template <typename T> static size_t print_special(T v, char *buf)
{
    const char *text;
    if (std::isnan(v))
        text = "nan";
    else if (std::isinf(v))
        text = v < 0 ? "-inf" : "inf";
    else if (v == 0)
        text = std::signbit(v) ? "-0.0" : "0.0";
    else
        return 0;
    size_t n = std::strlen(text);
    std::memcpy(buf, text, n + 1);
    return n;
}

template <typename T> static size_t print_shortest(T v, char *buf)
{
    size_t n = print_special(v, buf);
    if (n) return n;
    auto d = jkj::dragonbox::to_decimal(v);
    return print_decimal(d.is_negative, d.significand, d.exponent, buf);
}

extern "C" size_t float_print_f64(double v, char *buf)
{
    return print_shortest(v, buf);
}

extern "C" size_t float_print_f32(float v, char *buf)
{
    return print_shortest(v, buf);
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
