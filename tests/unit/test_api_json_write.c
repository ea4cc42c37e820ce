/* The answers' number printer (api/float_print.h), JSON writer (api/json_write.h) and tensor
 * data text (codec_data_to_text): shortest round-trip numbers, byte-identical output to
 * json_dumps(JSON_COMPACT) for everything but reals, raw nodes written verbatim. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/float_parse.h"
#include "api/float_print.h"
#include "api/json_write.h"
#include "api/tensor_codec.h"
#include "support/api_fakes.h"

static const char *p64(double v)
{
    static char buf[FLOAT_PRINT_MAX];
    size_t n = float_print_f64(v, buf);
    ck_assert_uint_eq(n, strlen(buf));
    return buf;
}

static const char *p32(float v)
{
    static char buf[FLOAT_PRINT_MAX];
    size_t n = float_print_f32(v, buf);
    ck_assert_uint_eq(n, strlen(buf));
    return buf;
}

/* A 64-bit xorshift, for reproducible bit patterns. */
static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The significant digits of a printed number: its digits without leading and trailing zeros
 * (of the mantissa; the exponent is not counted). */
static int significant_digits(const char *text)
{
    char digits[64];
    int n = 0;
    for (const char *p = text; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[n++] = *p;
    int lo = 0, hi = n;
    while (lo < hi && digits[lo] == '0')
        lo++;
    while (hi > lo && digits[hi - 1] == '0')
        hi--;
    return hi > lo ? hi - lo : 1;
}

START_TEST(test_printed_forms_are_shortest_and_readable)
{
    ck_assert_str_eq(p32(0.2f), "0.2");
    ck_assert_str_eq(p64(0.2f), "0.20000000298023224"); /* the same value as a double */
    ck_assert_str_eq(p64(0.1), "0.1");
    ck_assert_str_eq(p64(1.3), "1.3");
    ck_assert_str_eq(p32(1e-45f), "1e-45"); /* the smallest subnormal float */
    ck_assert_str_eq(p32(FLT_MAX), "3.4028235e+38");
    ck_assert_str_eq(p64(DBL_MAX), "1.7976931348623157e+308");
    ck_assert_str_eq(p64(5e-324), "5e-324");
    /* Integral values keep ".0", so that a reader still sees a real; -0.0 keeps its sign. */
    ck_assert_str_eq(p64(2.0), "2.0");
    ck_assert_str_eq(p32(-0.0f), "-0.0");
    ck_assert_str_eq(p64(0.0), "0.0");
    /* Decimal within [1e-6, 1e21), an exponent outside. */
    ck_assert_str_eq(p64(1e21), "1e+21");
    ck_assert_str_eq(p64(1e20), "100000000000000000000.0");
    ck_assert_str_eq(p64(1e-7), "1e-7");
    ck_assert_str_eq(p64(1e-6), "0.000001");
    ck_assert_str_eq(p64(-1.5e-7), "-1.5e-7");
    ck_assert_str_eq(p64(NAN), "nan");
    ck_assert_str_eq(p64(-INFINITY), "-inf");
}
END_TEST

/* The text JavaScript gives the value 0.DIGITS * 10^point (digits without a trailing zero),
 * built with string operations alone: decimal when point - 1 is within [-6, 21), ".0" after
 * an integral value, else d.ddde+N. */
static void js_form(const char *digits, int point, bool negative, char *buf, size_t size)
{
    int len = (int)strlen(digits);
    char *p = buf;
    if (negative) *p++ = '-';
    if (point - 1 >= -6 && point - 1 < 21) {
        if (point <= 0)
            p += sprintf(p, "0.%.*s%s", -point, "000000", digits);
        else if (point >= len)
            p += sprintf(p, "%s%.*s.0", digits, point - len, "000000000000000000000");
        else
            p += sprintf(p, "%.*s.%s", point, digits, digits + point);
    } else {
        p += sprintf(p, "%c%s%s", digits[0], len > 1 ? "." : "", digits + 1);
        sprintf(p, "e%c%d", point - 1 < 0 ? '-' : '+', abs(point - 1));
    }
    ck_assert_uint_lt(strlen(buf), size);
}

/* Every count of significant digits (1 to 15, DBL_DIG: the nine-digit form and the longer
 * one; a decimal of at most DBL_DIG digits is the only one of as few that reads back to its
 * double, so it is the shortest) at every place of the point, each form, both signs: the
 * exact text. */
START_TEST(test_every_digit_count_in_every_form)
{
    static const char all[] = "123456789123456";
    for (int len = 1; len <= DBL_DIG; len++)
        for (int point = -9; point <= 24; point++)
            for (int negative = 0; negative < 2; negative++) {
                char digits[24], decimal[64], want[64];
                snprintf(digits, sizeof digits, "%.*s", len, all);
                snprintf(decimal, sizeof decimal, "%s0.%se%d", negative ? "-" : "", digits, point);
                double x = strtod(decimal, NULL);
                js_form(digits, point, negative, want, sizeof want);
                ck_assert_msg(strcmp(p64(x), want) == 0, "%s printed %s, not %s", decimal, p64(x),
                              want);
                if (len <= FLT_DIG) {
                    /* As a float: a decimal of at most six digits is the only one of as few
                     * that reads back to its float, so it is the shortest. */
                    float f = strtof(decimal, NULL);
                    ck_assert_msg(strcmp(p32(f), want) == 0, "f32 %s printed %s, not %s", decimal,
                                  p32(f), want);
                }
            }
}
END_TEST

/* 10^6 random bit patterns of each width read back exactly (an f32 also through a double,
 * as most clients read it); a sample of them is also checked against libc for length: no
 * text with fewer digits reads back. */
START_TEST(test_random_f32_and_f64_round_trip_exactly)
{
    uint64_t seed = 0x9e3779b97f4a7c15ULL;
    char buf[FLOAT_PRINT_MAX], shorter[40];
    for (int i = 0; i < 1000000; i++) {
        uint64_t bits = next_random(&seed);
        uint32_t bits32 = (uint32_t)(bits >> 32);
        float f;
        double x;
        memcpy(&f, &bits32, sizeof f);
        memcpy(&x, &bits, sizeof x);
        if (isfinite(f)) {
            size_t n = float_print_f32(f, buf);
            float back;
            ck_assert_int_eq(float_parse_f32(buf, n, &back), 0);
            ck_assert_msg(memcmp(&back, &f, sizeof f) == 0, "f32 %a printed %s", (double)f, buf);
            /* Read as a double first, as Python's json and then NumPy, or libgpujob, read it. */
            double wide;
            ck_assert_int_eq(float_parse_f64(buf, n, &wide), 0);
            back = (float)wide;
            ck_assert_msg(memcmp(&back, &f, sizeof f) == 0, "f32 %s read via a double", buf);
            int digits = significant_digits(buf);
            if (i % 16 == 0 && digits > 1) {
                snprintf(shorter, sizeof shorter, "%.*e", digits - 2, (double)f);
                ck_assert_msg(strtof(shorter, NULL) != f, "f32 %s: %s is shorter", buf, shorter);
            }
        }
        if (isfinite(x)) {
            size_t n = float_print_f64(x, buf);
            double back;
            ck_assert_int_eq(float_parse_f64(buf, n, &back), 0);
            ck_assert_msg(memcmp(&back, &x, sizeof x) == 0, "f64 %a printed %s", x, buf);
            int digits = significant_digits(buf);
            if (i % 16 == 0 && digits > 1) {
                snprintf(shorter, sizeof shorter, "%.*e", digits - 2, x);
                ck_assert_msg(strtod(shorter, NULL) != x, "f64 %s: %s is shorter", buf, shorter);
            }
        }
    }
}
END_TEST

/* Whether some decimal of digits significant digits reads back to the half value v through
 * the dtype: the one just below v or the one just above (libc's %e gives the nearest, and its
 * neighbour is a unit of the last digit away). */
static bool some_decimal_reads_back(dtype_t dt, double v, int digits)
{
    char text[48];
    snprintf(text, sizeof text, "%.*e", digits - 1, v);
    char *e = strchr(text, 'e');
    int exp10 = atoi(e + 1) - (digits - 1);
    long long m = 0;
    for (const char *p = text; p < e; p++)
        if (*p >= '0' && *p <= '9') m = m * 10 + (*p - '0');
    if (v < 0) m = -m;
    for (long long c = m - 1; c <= m + 1; c++) {
        char cand[48];
        snprintf(cand, sizeof cand, "%llde%d", c, exp10);
        uint16_t h;
        tensor_store(dt, &h, 0, strtod(cand, NULL));
        if (tensor_load(dt, &h, 0) == v) return true;
    }
    return false;
}

/* Every f16 and bf16 bit pattern is printed as text that the daemon's reader stores as the
 * same pattern, with no more digits than needed. */
static void check_every_half(dtype_t dt)
{
    tensor_desc_t d = {.dtype = dt, .ndim = 1, .shape = {65536}};
    uint16_t *all = malloc(65536 * sizeof *all);
    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    char *text;
    size_t len;
    ck_assert_int_eq(codec_data_to_text(&d, all, &text, &len), 0);
    ck_assert_uint_eq(len, strlen(text));
    void *back;
    op_error_t err;
    ck_assert_msg(codec_data_from_text(text, len, &d, "data", &back, &err) == 0, "%s: %s",
                  err.field, err.message);
    const char *p = text + 1;
    for (int i = 0; i < 65536; i++) {
        const char *end = p + strcspn(p, ",]");
        char item[40];
        snprintf(item, sizeof item, "%.*s", (int)(end - p), p);
        p = end + 1;
        double v = tensor_load(dt, all, i), got = tensor_load(dt, back, i);
        if (isnan(v)) {
            ck_assert_str_eq(item, "\"nan\"");
            ck_assert(isnan(got));
            continue;
        }
        ck_assert_msg(((uint16_t *)back)[i] == all[i], "%s %04x printed %s reads back as %04x",
                      dtype_name(dt), i, item, ((uint16_t *)back)[i]);
        if (isinf(v) || v == 0) continue;
        int digits = significant_digits(item);
        ck_assert_msg(digits == 1 || !some_decimal_reads_back(dt, v, digits - 1),
                      "%s %04x printed %s: %d digits is more than needed", dtype_name(dt), i, item,
                      digits);
    }
    free(back);
    free(text);
    free(all);
}

START_TEST(test_every_f16_and_bf16_round_trips_shortest)
{
    check_every_half(DTYPE_F16);
    check_every_half(DTYPE_BF16);
}
END_TEST

START_TEST(test_tensor_text_of_each_dtype)
{
    static const struct {
        dtype_t dt;
        const char *text;
    } cases[] = {
        {DTYPE_F32, "[0.2,1.3,-0.0,3.4028235e+38,1e-45,\"nan\",\"-inf\"]"},
        {DTYPE_F64, "[0.1,2.0,1e+21,1e-7,5e-324,\"inf\",-1.5]"},
        {DTYPE_F16, "[0.2,1.3,65500.0,6e-8,0.0,\"inf\",-1.5]"},
        {DTYPE_BF16, "[0.2,1.3,3.39e+38,9e-41,-0.0,\"nan\",-1.5]"},
        {DTYPE_I8, "[0,-128,127,1,2,3,-1]"},
        {DTYPE_I32, "[0,-2147483648,2147483647,1,2,3,-1]"},
        {DTYPE_U32, "[0,4294967295,7,1,2,3,10]"},
        {DTYPE_I64, "[0,-9223372036854775808,9223372036854775807,1,2,3,-1]"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tensor_desc_t d = {.dtype = cases[c].dt, .ndim = 1, .shape = {7}};
        void *data;
        op_error_t err;
        ck_assert_msg(codec_data_from_text(cases[c].text, strlen(cases[c].text), &d, "data", &data,
                                           &err) == 0,
                      "case %zu: %s", c, err.message);
        char *text;
        size_t len;
        ck_assert_int_eq(codec_data_to_text(&d, data, &text, &len), 0);
        ck_assert_str_eq(text, cases[c].text);
        free(text);
        free(data);
    }
    tensor_desc_t empty = {.dtype = DTYPE_F32, .ndim = 1, .shape = {0}};
    char *text;
    size_t len;
    ck_assert_int_eq(codec_data_to_text(&empty, NULL, &text, &len), 0);
    ck_assert_str_eq(text, "[]");
    free(text);
}
END_TEST

/* --- the writer --- */

static char *written(const json_t *v)
{
    char *text;
    size_t len;
    ck_assert_int_eq(json_write(v, &text, &len), 0);
    ck_assert_uint_eq(len, strlen(text));
    return text;
}

static void assert_like_jansson(const json_t *v)
{
    char *ours = written(v);
    char *theirs = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    ck_assert_ptr_nonnull(theirs);
    ck_assert_str_eq(ours, theirs);
    free(ours);
    free(theirs);
}

/* A random string of valid UTF-8: ASCII with every control character, quotes and
 * backslashes, and characters of two, three and four bytes. */
static json_t *random_string(uint64_t *seed)
{
    char s[64];
    size_t n = 0, want = next_random(seed) % 12;
    for (size_t i = 0; i < want; i++) {
        uint32_t r = (uint32_t)next_random(seed);
        switch (r % 5) {
        case 0:
            s[n++] = (char)(r >> 8 & 0x1f); /* a control character, NUL included */
            break;
        case 1:
            s[n++] = "\"\\/'<>&\x7f"[(r >> 8) % 8];
            break;
        case 2:
            n += (size_t)snprintf(s + n, sizeof s - n, "%s", (r >> 8) & 1 ? "é" : "€");
            break;
        case 3:
            n += (size_t)snprintf(s + n, sizeof s - n, "%s", "😀");
            break;
        default:
            s[n++] = (char)(' ' + (r >> 8) % 95);
            break;
        }
    }
    return json_stringn(s, n);
}

static json_t *random_value(uint64_t *seed, int depth)
{
    uint64_t r = next_random(seed);
    switch (depth > 4 ? r % 5 : r % 7) {
    case 0:
        return random_string(seed);
    case 1:
        return json_integer((json_int_t)next_random(seed) >> (r >> 8) % 64);
    case 2:
        return json_integer(-(json_int_t)(r >> 12));
    case 3:
        return (r >> 8) & 1 ? json_true() : json_false();
    case 4:
        return json_null();
    case 5: {
        json_t *a = json_array();
        for (uint64_t i = next_random(seed) % 5; i > 0; i--)
            json_array_append_new(a, random_value(seed, depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (uint64_t i = next_random(seed) % 6; i > 0; i--) {
            json_t *key = random_string(seed);
            json_object_setn_new(o, json_string_value(key), json_string_length(key),
                                 random_value(seed, depth + 1));
            json_decref(key);
        }
        /* Deleting and adding again moves a key to the end of the order. */
        void *it = json_object_iter(o);
        if (it && (r >> 20) & 1) {
            json_t *first = json_incref(json_object_iter_value(it));
            char key[64];
            size_t len = json_object_iter_key_len(it);
            memcpy(key, json_object_iter_key(it), len);
            json_object_deln(o, key, len);
            json_object_setn_new(o, key, len, first);
        }
        return o;
    }
    }
}

START_TEST(test_writer_matches_jansson_without_reals)
{
    static const char *const corpus[] = {
        "{}",
        "[]",
        "{\"a\":1,\"b\":[true,false,null],\"c\":{\"d\":\"e\"}}",
        "{\"z\":1,\"a\":2,\"m\":3}",
        "[\"tab\\there\",\"nl\\n\",\"cr\\r\",\"\\u0001\\u001f\\b\\f\",\"q\\\"b\\\\s/\"]",
        "{\"ключ\":\"значение\",\"emoji\":\"😀\",\"nul\":\"a\\u0000b\"}",
        "[-9223372036854775808,9223372036854775807,0,-1]",
        "\"just a string\"",
        "42",
        "null",
    };
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) {
        json_error_t jerr;
        json_t *v = json_loads(corpus[i], JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        ck_assert_msg(v != NULL, "corpus %zu: %s", i, jerr.text);
        assert_like_jansson(v);
        json_decref(v);
    }
    /* A key with a NUL in it, which only json_object_setn makes. */
    json_t *nul_key = json_object();
    json_object_setn_new(nul_key, "a\0b", 3, json_integer(1));
    assert_like_jansson(nul_key);
    json_decref(nul_key);
    uint64_t seed = 12345;
    for (int i = 0; i < 2000; i++) {
        json_t *v = random_value(&seed, 0);
        assert_like_jansson(v);
        json_decref(v);
    }
}
END_TEST

START_TEST(test_writer_prints_reals_shortest)
{
    json_t *v = json_pack("{s:f, s:f, s:f, s:f, s:f, s:[f, i]}", "a", 0.1, "queue_ms", 1.3, "two",
                          2.0, "neg_zero", -0.0, "big", 1e21, "mixed", 0.2f, 3);
    char *text = written(v);
    ck_assert_str_eq(text, "{\"a\":0.1,\"queue_ms\":1.3,\"two\":2.0,\"neg_zero\":-0.0,"
                           "\"big\":1e+21,\"mixed\":[0.20000000298023224,3]}");
    free(text);
    json_decref(v);
}
END_TEST

START_TEST(test_raw_nodes_are_written_verbatim_and_only_ours)
{
    json_t *raw = json_raw_new("[0.2,1.3]", 9);
    ck_assert_ptr_nonnull(raw);
    size_t len;
    ck_assert_str_eq(json_raw_text(raw, &len), "[0.2,1.3]");
    ck_assert_uint_eq(len, 9);
    /* What a client could send that looks the same to jansson is an ordinary array. */
    json_t *lookalike = json_pack("[n, s]", "[0.2,1.3]");
    ck_assert_ptr_null(json_raw_text(lookalike, &len));
    json_t *doc =
        json_pack("{s:o, s:o, s:{s:O}}", "data", raw, "echo", lookalike, "nested", "data", raw);
    char *text = written(doc);
    ck_assert_str_eq(text, "{\"data\":[0.2,1.3],\"echo\":[null,\"[0.2,1.3]\"],"
                           "\"nested\":{\"data\":[0.2,1.3]}}");
    free(text);
    /* A raw node is freed with its tree, its marker never. */
    json_t *copy = json_deep_copy(doc);
    json_decref(doc);
    json_decref(copy);
    json_t *again = json_raw_new("[]", 2);
    char *empty = written(again);
    ck_assert_str_eq(empty, "[]");
    free(empty);
    json_decref(again);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("json_write");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_printed_forms_are_shortest_and_readable);
    tcase_add_test(tc, test_every_digit_count_in_every_form);
    tcase_add_test(tc, test_random_f32_and_f64_round_trip_exactly);
    tcase_add_test(tc, test_every_f16_and_bf16_round_trips_shortest);
    tcase_add_test(tc, test_tensor_text_of_each_dtype);
    tcase_add_test(tc, test_writer_matches_jansson_without_reals);
    tcase_add_test(tc, test_writer_prints_reals_shortest);
    tcase_add_test(tc, test_raw_nodes_are_written_verbatim_and_only_ours);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
