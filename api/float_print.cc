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

/* The powers of ten that fit in 64 bits. */
struct pow10_table {
    uint64_t v[20];
    constexpr pow10_table() : v()
    {
        uint64_t x = 1;
        for (int i = 0; i < 20; i++, x *= 10)
            v[i] = x;
    }
};
static constexpr pow10_table pow10;

/* The number of decimal digits of v (1 to 20), from its bit length: log10(2) is about
 * 1233 / 4096, which gives the count or one more. */
static int decimal_length(uint64_t v)
{
    int bits = 64 - __builtin_clzll(v | 1);
    int len = ((bits * 1233) >> 12) + 1;
    return len - (v < pow10.v[len - 1]);
}

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

/* The eight decimal digits of v < 10^8, leading zeros included, as the bytes of a
 * little-endian word, first digit lowest: the halves, quarters and digits are split in
 * parallel lanes of the word (v / 10^4 and v % 10^4 in 32-bit lanes, then / 100 in each, then
 * / 10 in 16-bit lanes), each division a multiplication by a reciprocal exact in its range. */
static uint64_t eight_digits(uint32_t v)
{
    uint64_t halves = (uint64_t)(v / 10000) | (uint64_t)(v % 10000) << 32;
    uint64_t hundreds = ((halves * 10486) >> 20) & 0x0000007F0000007Fu;
    uint64_t quarters = (halves - 100 * hundreds) << 16 | hundreds;
    uint64_t tens = ((quarters * 103) >> 10) & 0x000F000F000F000Fu;
    uint64_t digits = (quarters - 10 * tens) << 8 | tens;
    return digits | 0x3030303030303030u;
}

static void store_word(char *p, uint64_t w)
{
    std::memcpy(p, &w, sizeof w);
}

/* print_decimal for a significand of at most nine digits, every float's and most doubles'
 * (0.1, 2.5, a time in seconds): the digits stay in a register and go to buf in whole words,
 * each text in a few stores, where print_decimal's byte-wise copies would read back what it
 * just wrote. Writes at most 30 bytes of buf. */
static size_t print_decimal_short(bool negative, uint32_t significand, int exponent, char *buf)
{
    static const char pairs[] = "00010203040506070809101112131415161718192021222324"
                                "25262728293031323334353637383940414243444546474849"
                                "50515253545556575859606162636465666768697071727374"
                                "75767778798081828384858687888990919293949596979899";
    int len = decimal_length(significand);
    int point = len + exponent; /* value = 0.digits * 10^point */
    /* The digits: a ninth one first (lead) when there are nine, then the rest (word, its
     * width bytes, first digit lowest). */
    uint64_t word = eight_digits(significand % 100000000);
    char lead = (char)('0' + significand / 100000000);
    int width = len == 9 ? 8 : len;
    if (len < 8) word >>= 8 * (8 - len);
    char *p = buf;
    *p = '-';
    p += negative;
    if (point - 1 >= -6 && point - 1 < 21) {
        int before = point; /* digits before the point, lead apart */
        if (point <= 0) {
            store_word(p, 0x3030303030302e30u); /* "0.000000" */
            p += 2 - point;
        }
        if (len == 9) {
            *p++ = lead;
            before--;
        }
        store_word(p, word);
        if (point > 0 && point < len) {
            store_word(p + before + 1, word >> (8 * before));
            p[before] = '.';
            p += width + 1;
        } else if (point >= len) {
            std::memset(p + width, '0', 20);
            p += width + (point - len);
            std::memcpy(p, ".0", 2);
            p += 2;
        } else {
            p += width;
        }
    } else {
        int e = point - 1;
        char first = len == 9 ? lead : (char)word;
        if (len < 9) word >>= 8;
        p[0] = first;
        p[1] = '.';
        store_word(p + 2, word);
        p += len > 1 ? len + 1 : 1;
        *p++ = 'e';
        *p++ = e < 0 ? '-' : '+';
        if (e < 0) e = -e;
        if (e >= 100) *p++ = (char)('0' + e / 100);
        if (e >= 10) *p++ = pairs[2 * (e % 100)];
        *p++ = pairs[2 * (e % 100) + 1];
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
    if (d.significand < 1000000000)
        return print_decimal_short(d.is_negative, (uint32_t)d.significand, d.exponent, buf);
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
