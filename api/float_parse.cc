/* The fast_float library (Debian's libfast-float-dev, header-only) behind float_parse.h: it
 * rounds correctly (to the nearest, ties to even, for float directly rather than through a
 * double), never reads the locale and allocates nothing. */
#include "float_parse.h"

#include <cerrno>
#include <fast_float/fast_float.h>

template <typename T> static int float_parse(const char *text, size_t len, T *ret)
{
    T value;
    const char *end = text + len;
    fast_float::from_chars_result res = fast_float::from_chars(text, end, value);
    if (res.ec != std::errc() || res.ptr != end) return -EINVAL;
    *ret = value;
    return 0;
}

extern "C" int float_parse_f64(const char *text, size_t len, double *ret)
{
    return float_parse(text, len, ret);
}

extern "C" int float_parse_f32(const char *text, size_t len, float *ret)
{
    return float_parse(text, len, ret);
}

template <typename T>
static const char *float_parse_prefix(const char *text, const char *end, T *ret)
{
    T value;
    fast_float::from_chars_result res = fast_float::from_chars(text, end, value);
    if (res.ec != std::errc()) return nullptr;
    *ret = value;
    return res.ptr;
}

extern "C" const char *float_parse_f64_prefix(const char *text, const char *end, double *ret)
{
    return float_parse_prefix(text, end, ret);
}

extern "C" const char *float_parse_f32_prefix(const char *text, const char *end, float *ret)
{
    return float_parse_prefix(text, end, ret);
}
