/* api/ codecs and job JSON: inline data, base64 and .npy (api/tensor_codec.c), and the parsing
 * of POST /v1/jobs bodies into jobs with exact error fields (api/job_json.c). */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/job_json.h"
#include "api/tensor_codec.h"
#include "support/api_fakes.h"
#include "support/b64_ref.h"

static json_t *parse(const char *text)
{
    json_error_t jerr;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &jerr);
    ck_assert_msg(v, "bad test JSON '%s': %s", text, jerr.text);
    return v;
}

static tensor_desc_t desc2(dtype_t dt, int ndim, int64_t d0, int64_t d1)
{
    tensor_desc_t d = {.dtype = dt, .ndim = ndim, .shape = {d0, d1}};
    return d;
}

/* Parses data text for d; returns the codec's result and keeps the bytes in *ret. */
static int data_parse(const char *text, tensor_desc_t d, void **ret, op_error_t *err)
{
    json_t *v = parse(text);
    *ret = NULL;
    int r = codec_data_from_json(v, &d, "inputs.x.data", ret, err);
    json_decref(v);
    return r;
}

/* The JSON list of a tensor's data as an answer carries it. */
static json_t *data_as_sent(const tensor_desc_t *d, const void *data)
{
    json_t *node = codec_data_to_json(d, data);
    ck_assert_ptr_nonnull(node);
    json_t *back = fake_as_sent(node);
    json_decref(node);
    return back;
}

/* --- inline data --- */

START_TEST(test_inline_flat_and_nested_agree_for_every_dtype)
{
    for (int dt = 0; dt < DTYPE_COUNT; dt++) {
        tensor_desc_t d = desc2((dtype_t)dt, 2, 2, 3);
        void *flat, *nested;
        op_error_t err;
        ck_assert_int_eq(data_parse("[1, -2, 3, 4, 5, 100]", d, &flat, &err),
                         dt == DTYPE_U32 ? -EINVAL : 0);
        if (dt == DTYPE_U32) {
            ck_assert_str_eq(err.field, "inputs.x.data[1]");
            ck_assert_int_eq(data_parse("[1, 2, 3, 4, 5, 100]", d, &flat, &err), 0);
        }
        const char *nested_text =
            dt == DTYPE_U32 ? "[[1, 2, 3], [4, 5, 100]]" : "[[1, -2, 3], [4, 5, 100]]";
        ck_assert_int_eq(data_parse(nested_text, d, &nested, &err), 0);
        ck_assert_int_eq(memcmp(flat, nested, tensor_desc_bytes(&d)), 0);
        ck_assert(tensor_load((dtype_t)dt, flat, 5) == 100.0);
        ck_assert(tensor_load((dtype_t)dt, flat, 1) == (dt == DTYPE_U32 ? 2.0 : -2.0));
        json_t *back = data_as_sent(&d, flat);
        ck_assert_int_eq(json_array_size(back), 6);
        ck_assert(json_number_value(json_array_get(back, 5)) == 100.0);
        json_decref(back);
        free(flat);
        free(nested);
    }
}
END_TEST

START_TEST(test_inline_integer_ranges_are_enforced)
{
    static const struct {
        dtype_t dt;
        const char *text;
        int bad_index; /* -1: accepted */
    } cases[] = {
        {DTYPE_I8, "[127, -128]", -1},      {DTYPE_I8, "[1, 300]", 1},
        {DTYPE_I8, "[-129, 0]", 0},         {DTYPE_U32, "[4294967295, 0]", -1},
        {DTYPE_U32, "[0, 4294967296]", 1},  {DTYPE_U32, "[-1, 0]", 0},
        {DTYPE_I32, "[2147483647, 0]", -1}, {DTYPE_I32, "[0, 2147483648]", 1},
        {DTYPE_I32, "[1.5, 0]", 0},         {DTYPE_I64, "[1, 2.0]", 1},
        {DTYPE_I8, "[true, 0]", 0},         {DTYPE_I32, "[\"1\", 0]", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *data;
        op_error_t err = {0};
        int r = data_parse(cases[i].text, desc2(cases[i].dt, 1, 2, 0), &data, &err);
        if (cases[i].bad_index < 0) {
            ck_assert_msg(r == 0, "case %zu: %s", i, err.message);
            free(data);
            continue;
        }
        ck_assert_msg(r == -EINVAL, "case %zu accepted", i);
        char field[64];
        snprintf(field, sizeof field, "inputs.x.data[%d]", cases[i].bad_index);
        ck_assert_str_eq(err.field, field);
        ck_assert_ptr_null(data);
    }
}
END_TEST

/* codec_data_from_text of text, which must be JSON, as the scanner hands data over. */
static int text_parse(const char *text, tensor_desc_t d, void **ret, op_error_t *err)
{
    *ret = NULL;
    return codec_data_from_text(text, strlen(text), &d, "inputs.x.data", ret, err);
}

/* f32 and f64 numbers are read in a run of their own until an element that is not one: the
 * elements after it, and the errors, are the general reader's, with the same indices. */
START_TEST(test_inline_float_runs_hand_over_at_any_element)
{
    void *data;
    op_error_t err = {0};
    ck_assert_int_eq(
        text_parse("[0.5, \"inf\", -0.25 , 3]", desc2(DTYPE_F32, 1, 4, 0), &data, &err), 0);
    const float *f = data;
    ck_assert(f[0] == 0.5f && isinf(f[1]) && f[2] == -0.25f && f[3] == 3.0f);
    free(data);
    ck_assert_int_eq(text_parse("[-0, 0.1]", desc2(DTYPE_F64, 1, 2, 0), &data, &err), 0);
    ck_assert(signbit(((double *)data)[0]) && ((double *)data)[1] == 0.1);
    free(data);
    ck_assert_int_eq(
        text_parse("[0.5, \"inf\", -0.25, 1e39]", desc2(DTYPE_F32, 1, 4, 0), &data, &err), -EINVAL);
    ck_assert_str_eq(err.field, "inputs.x.data[3]");
    ck_assert_int_eq(text_parse("[0.5, 1.5, 2.5]", desc2(DTYPE_F32, 1, 2, 0), &data, &err),
                     -EINVAL);
    ck_assert_str_eq(err.field, "inputs.x.data");
    ck_assert_int_eq(text_parse("[0.5, true]", desc2(DTYPE_F64, 1, 2, 0), &data, &err), -EINVAL);
    ck_assert_str_eq(err.field, "inputs.x.data[1]");
}
END_TEST

START_TEST(test_inline_i64_is_exact_and_floats_check_their_range)
{
    void *data;
    op_error_t err;
    ck_assert_int_eq(data_parse("[9007199254740993, -9223372036854775808]",
                                desc2(DTYPE_I64, 1, 2, 0), &data, &err),
                     0);
    ck_assert(((int64_t *)data)[0] == 9007199254740993LL);
    ck_assert(((int64_t *)data)[1] == INT64_MIN);
    free(data);

    ck_assert_int_eq(data_parse("[1, 70000]", desc2(DTYPE_F16, 1, 2, 0), &data, &err), -EINVAL);
    ck_assert_str_eq(err.field, "inputs.x.data[1]");
    ck_assert_int_eq(data_parse("[1e39]", desc2(DTYPE_F32, 1, 1, 0), &data, &err), -EINVAL);
    ck_assert_int_eq(data_parse("[1e39]", desc2(DTYPE_F64, 1, 1, 0), &data, &err), 0);
    free(data);
    ck_assert_int_eq(
        data_parse("[\"nan\", \"-inf\", 65504]", desc2(DTYPE_F16, 1, 3, 0), &data, &err), 0);
    ck_assert(isnan(tensor_load(DTYPE_F16, data, 0)));
    ck_assert(tensor_load(DTYPE_F16, data, 1) == -INFINITY);
    ck_assert(tensor_load(DTYPE_F16, data, 2) == 65504.0);
    tensor_desc_t d = desc2(DTYPE_F16, 1, 3, 0);
    json_t *back = data_as_sent(&d, data);
    ck_assert_str_eq(json_string_value(json_array_get(back, 0)), "nan");
    ck_assert_str_eq(json_string_value(json_array_get(back, 1)), "-inf");
    json_decref(back);
    free(data);
    ck_assert_int_eq(data_parse("[\"one\"]", desc2(DTYPE_F32, 1, 1, 0), &data, &err), -EINVAL);
}
END_TEST

START_TEST(test_inline_counts_and_nesting_must_match_the_shape)
{
    void *data;
    op_error_t err;
    ck_assert_int_eq(data_parse("[1, 2, 3, 4, 5]", desc2(DTYPE_F32, 2, 2, 3), &data, &err),
                     -EINVAL);
    ck_assert_str_eq(err.field, "inputs.x.data");
    ck_assert_int_eq(data_parse("[[1, 2], [3, 4], [5, 6]]", desc2(DTYPE_F32, 2, 2, 3), &data, &err),
                     -EINVAL);
    ck_assert_str_eq(err.field, "inputs.x.data");
    ck_assert_int_eq(data_parse("[[1, 2, 3], [4, 5]]", desc2(DTYPE_F32, 2, 2, 3), &data, &err),
                     -EINVAL);
    ck_assert_str_eq(err.field, "inputs.x.data[1]");
    ck_assert_int_eq(data_parse("[[1, 2, 3], [4, 5, [6]]]", desc2(DTYPE_F32, 2, 2, 3), &data, &err),
                     -EINVAL);
    ck_assert_str_eq(err.field, "inputs.x.data[1][2]");
    /* A scalar takes a bare number or a one-element list; an empty tensor an empty list. */
    tensor_desc_t scalar = {.dtype = DTYPE_F64, .ndim = 0};
    ck_assert_int_eq(data_parse("2.5", scalar, &data, &err), 0);
    ck_assert(*(double *)data == 2.5);
    free(data);
    ck_assert_int_eq(data_parse("[2.5]", scalar, &data, &err), 0);
    free(data);
    ck_assert_int_eq(data_parse("[]", desc2(DTYPE_F32, 2, 0, 3), &data, &err), 0);
    free(data);
    ck_assert_int_eq(data_parse("{}", desc2(DTYPE_F32, 1, 1, 0), &data, &err), -EINVAL);
}
END_TEST

START_TEST(test_desc_from_json_checks_dtype_dims_and_limits)
{
    static const struct {
        const char *dtype, *shape;
        uint64_t max;
        int r;
        const char *field;
    } cases[] = {
        {"\"f32\"", "[2, 3]", 1024, 0, NULL},
        {"\"f33\"", "[2]", 1024, -EINVAL, "t.dtype"},
        {"3", "[2]", 1024, -EINVAL, "t.dtype"},
        {"\"f32\"", "[2, -1]", 1024, -EINVAL, "t.shape"},
        {"\"f32\"", "[1,1,1,1,1,1,1,1,1]", 1024, -EINVAL, "t.shape"},
        {"\"f32\"", "[1,1,1,1,1,1,1,1]", 1024, 0, NULL},
        {"\"f32\"", "[2.5]", 1024, -EINVAL, "t.shape"},
        {"\"f32\"", "\"2,3\"", 1024, -EINVAL, "t.shape"},
        {"\"f32\"", "[257]", 1024, -E2BIG, "t.shape"},
        {"\"f64\"", "[4294967296, 4294967296]", UINT64_MAX, -EOVERFLOW, "t.shape"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *dtype = parse(cases[i].dtype), *shape = parse(cases[i].shape);
        tensor_desc_t d = {0};
        op_error_t err = {0};
        int r = codec_desc_from_json(dtype, shape, "t", cases[i].max, &d, &err);
        ck_assert_msg(r == cases[i].r, "case %zu: got %d (%s)", i, r, err.message);
        if (cases[i].field) ck_assert_str_eq(err.field, cases[i].field);
        json_decref(dtype);
        json_decref(shape);
    }
}
END_TEST

START_TEST(test_shape_csv_parses_sizes_and_refuses_junk)
{
    tensor_desc_t d = {.dtype = DTYPE_I32};
    op_error_t err;
    ck_assert_int_eq(codec_shape_parse_csv("2,3", &d, &err), 0);
    ck_assert_int_eq(d.ndim, 2);
    ck_assert(d.shape[0] == 2 && d.shape[1] == 3 && d.dtype == DTYPE_I32);
    ck_assert_int_eq(codec_shape_parse_csv("", &d, &err), 0);
    ck_assert_int_eq(d.ndim, 0);
    const char *bad[] = {"2,", ",2", "2,,3", "-1", "2;3", "1,1,1,1,1,1,1,1,1", "x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(codec_shape_parse_csv(bad[i], &d, &err) == -EINVAL, "'%s' accepted", bad[i]);
        ck_assert_str_eq(err.field, "query.shape");
    }
}
END_TEST

/* --- base64 --- */

START_TEST(test_b64_round_trips_every_length)
{
    unsigned char bytes[64];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char)(i * 37 + 11);
    for (size_t len = 0; len <= sizeof bytes; len++) {
        char *text = b64_ref_encode(bytes, len);
        ck_assert_uint_eq(strlen(text), (len + 2) / 3 * 4);
        void *back;
        size_t back_len;
        ck_assert_int_eq(codec_b64_decode(text, strlen(text), &back, &back_len, NULL), 0);
        ck_assert_uint_eq(back_len, len);
        ck_assert_int_eq(memcmp(back, bytes, len), 0);
        free(back);
        free(text);
    }
    void *back;
    size_t back_len;
    ck_assert_int_eq(codec_b64_decode("AACAPw==", 8, &back, &back_len, NULL), 0);
    ck_assert_uint_eq(back_len, 4);
    float one;
    memcpy(&one, back, 4);
    ck_assert(one == 1.0f);
    free(back);
}
END_TEST

START_TEST(test_b64_refuses_bad_text)
{
    const char *bad[] = {"AAA", "AA=A", "A===", "AA*A", "AAAA AAA", "=AAA"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *back = NULL;
        size_t len;
        op_error_t err;
        ck_assert_msg(codec_b64_decode(bad[i], strlen(bad[i]), &back, &len, &err) == -EINVAL,
                      "'%s' accepted", bad[i]);
        ck_assert_ptr_null(back);
        ck_assert(strlen(err.message) > 0);
    }
}
END_TEST

/* --- .npy --- */

START_TEST(test_npy_write_then_parse_round_trips_every_dtype)
{
    const tensor_desc_t shapes[] = {{.ndim = 0},
                                    {.ndim = 1, .shape = {5}},
                                    {.ndim = 3, .shape = {2, 3, 4}},
                                    {.ndim = 2, .shape = {0, 7}}};
    for (int dt = 0; dt < DTYPE_COUNT; dt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            tensor_desc_t d = shapes[s];
            d.dtype = (dtype_t)dt;
            uint64_t nbytes = tensor_desc_bytes(&d);
            unsigned char *data = malloc(nbytes + 1);
            for (uint64_t i = 0; i < nbytes; i++)
                data[i] = (unsigned char)(i * 7 + (uint64_t)dt);
            void *file;
            size_t len;
            int r = codec_npy_write(&d, data, &file, &len);
            if (dt == DTYPE_BF16) {
                ck_assert_int_eq(r, -ENOTSUP);
                free(data);
                continue;
            }
            ck_assert_int_eq(r, 0);
            ck_assert_uint_eq((len - nbytes) % 64, 0);
            tensor_desc_t back;
            size_t offset;
            op_error_t err;
            r = codec_npy_parse(file, len, UINT64_MAX, &back, &offset, &err);
            ck_assert_msg(r == 0, "%s %zu: %s", dtype_name(d.dtype), s, err.message);
            ck_assert(tensor_desc_equal(&back, &d));
            ck_assert_uint_eq(offset + nbytes, len);
            ck_assert_int_eq(memcmp((char *)file + offset, data, nbytes), 0);
            free(file);
            free(data);
        }
}
END_TEST

/* A .npy file with this header dict (padded as numpy does) and nbytes of data. */
static void *npy_make(int major, const char *dict, size_t nbytes, size_t *ret_len)
{
    size_t prefix = major == 1 ? 10 : 12;
    size_t hlen = (prefix + strlen(dict) + 1 + 63) / 64 * 64 - prefix;
    unsigned char *f = calloc(1, prefix + hlen + nbytes);
    memcpy(f, "\x93NUMPY", 6);
    f[6] = (unsigned char)major;
    f[7] = 0;
    f[8] = (unsigned char)(hlen & 0xff);
    f[9] = (unsigned char)(hlen >> 8);
    memcpy(f + prefix, dict, strlen(dict));
    memset(f + prefix + strlen(dict), ' ', hlen - strlen(dict) - 1);
    f[prefix + hlen - 1] = '\n';
    *ret_len = prefix + hlen + nbytes;
    return f;
}

START_TEST(test_npy_accepts_versions_2_and_3)
{
    for (int major = 2; major <= 3; major++) {
        size_t len;
        void *f =
            npy_make(major, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", 24, &len);
        tensor_desc_t d;
        size_t offset;
        op_error_t err;
        ck_assert_int_eq(codec_npy_parse(f, len, UINT64_MAX, &d, &offset, &err), 0);
        ck_assert_int_eq(d.dtype, DTYPE_I64);
        ck_assert_int_eq(d.ndim, 1);
        ck_assert(d.shape[0] == 3);
        free(f);
    }
}
END_TEST

START_TEST(test_npy_refuses_bad_headers_and_lengths)
{
    static const struct {
        const char *dict;
        size_t nbytes;
        const char *why; /* a word the message must contain */
    } cases[] = {
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, "big-endian"},
        {"{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16, "not supported"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16, "not supported"},
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8, "fortran"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20, "truncated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12, "after"},
        {"{'descr': '<f4', 'shape': (2,), }", 8, "must give"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8, "non-negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, "dims"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4, "structured"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", 8, "unexpected"},
        {"['descr']", 8, "dict"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        void *f = npy_make(1, cases[i].dict, cases[i].nbytes, &len);
        tensor_desc_t d;
        size_t offset;
        op_error_t err = {0};
        ck_assert_msg(codec_npy_parse(f, len, UINT64_MAX, &d, &offset, &err) == -EINVAL,
                      "case %zu accepted", i);
        ck_assert_msg(strstr(err.message, cases[i].why), "case %zu: '%s' lacks '%s'", i,
                      err.message, cases[i].why);
        free(f);
    }
}
END_TEST

START_TEST(test_npy_refuses_bad_magic_version_truncation_and_size)
{
    size_t len;
    unsigned char *f =
        npy_make(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1024,), }", 4096, &len);
    tensor_desc_t d;
    size_t offset;
    op_error_t err;
    ck_assert_int_eq(codec_npy_parse(f, len, 4095, &d, &offset, &err), -E2BIG);
    ck_assert_int_eq(codec_npy_parse(f, len, 4096, &d, &offset, &err), 0);
    ck_assert_int_eq(codec_npy_parse(f, 40, 4096, &d, &offset, &err), -EINVAL);
    ck_assert(strstr(err.message, "truncated"));
    ck_assert_int_eq(codec_npy_parse(f, 8, 4096, &d, &offset, &err), -EINVAL);
    f[6] = 4;
    ck_assert_int_eq(codec_npy_parse(f, len, 4096, &d, &offset, &err), -EINVAL);
    ck_assert(strstr(err.message, "version"));
    f[6] = 1;
    f[1] = 'X';
    ck_assert_int_eq(codec_npy_parse(f, len, 4096, &d, &offset, &err), -EINVAL);
    ck_assert(strstr(err.message, "magic"));
    free(f);
}
END_TEST

/* A streamed upload: where the data starts, told from the first bytes as they arrive, then the
 * header from the bytes up to there and the data's length from the file. */
START_TEST(test_npy_data_offset_and_header_from_the_first_bytes)
{
    for (int major = 1; major <= 2; major++) {
        size_t len;
        unsigned char *f = npy_make(
            major, "{'descr': '<f4', 'fortran_order': False, 'shape': (1024,), }", 4096, &len);
        size_t data_at = len - 4096, offset = 0;
        size_t prefix = major == 1 ? 10 : 12;
        for (size_t have = 0; have < prefix; have++)
            ck_assert_int_eq(codec_npy_data_offset(f, have, &offset), -EAGAIN);
        ck_assert_int_eq(codec_npy_data_offset(f, prefix, &offset), 0);
        ck_assert_uint_eq(offset, data_at);

        tensor_desc_t d;
        op_error_t err;
        ck_assert_int_eq(codec_npy_parse_header(f, data_at, 4096, &d, &offset, &err), 0);
        ck_assert_uint_eq(offset, data_at);
        ck_assert_int_eq(d.dtype, DTYPE_F32);
        ck_assert_int_eq(d.shape[0], 1024);
        ck_assert_int_eq(codec_npy_check_data_bytes(&d, 4096, &err), 0);
        ck_assert_int_eq(codec_npy_check_data_bytes(&d, 4095, &err), -EINVAL);
        ck_assert(strstr(err.message, "truncated"));
        ck_assert_int_eq(codec_npy_check_data_bytes(&d, 4097, &err), -EINVAL);
        ck_assert_int_eq(codec_npy_parse_header(f, data_at - 1, 4096, &d, &offset, &err), -EINVAL);
        ck_assert(strstr(err.message, "truncated inside its header"));

        f[1] = 'X';
        ck_assert_int_eq(codec_npy_data_offset(f, 6, &offset), -EINVAL);
        free(f);
    }
}
END_TEST

/* --- job JSON --- */

static const config_t *test_config(void)
{
    static config_t cfg;
    config_defaults(&cfg);
    cfg.max_tensor_bytes = 1 << 20;
    cfg.max_jobs_per_request = 4;
    cfg.default_deadline_ms = 0;
    return &cfg;
}

static const char *known_buffer = "b0123456789abcdef01234567";
static const char *resident_buffer = "b0123456789abcdef0123450d"; /* on device 2 */

/* Buffers for the parser: known_buffer and resident_buffer are alice's f32 [3]; everything
 * else is missing. */
static int test_buffer_desc(void *ud, const char *owner, const char *id, tensor_desc_t *ret,
                            int *ret_device)
{
    bool resident = strcmp(id, resident_buffer) == 0;
    if ((strcmp(id, known_buffer) != 0 && !resident) || strcmp(owner, "alice") != 0) return -ENOENT;
    *ret = (tensor_desc_t){.dtype = DTYPE_F32, .ndim = 1, .shape = {3}};
    *ret_device = resident ? 2 : -1;
    return 0;
}

static job_json_env_t test_env(void)
{
    return (job_json_env_t){.cfg = test_config(),
                            .owner = "alice",
                            .now_us = 1700000000000000LL,
                            .find_op = fake_find_op,
                            .buffer_desc = test_buffer_desc};
}

/* The jobs and error of job_json_parse_body() on text, which must match exactly those of
 * job_json_parse_request() on its tree: the two read data by different roads. */
static void body_parse_agrees(const char *text, const char *key, int r, job_t **jobs, size_t n,
                              const api_error_t *err)
{
    job_json_env_t env = test_env();
    job_t **body_jobs = NULL;
    size_t body_n = 0;
    bool is_list;
    api_error_t body_err = {0};
    ck_assert_int_eq(job_json_parse_body(text, strlen(text), &env, key, &body_jobs, &body_n,
                                         &is_list, &body_err),
                     r);
    if (r < 0) {
        ck_assert_int_eq(body_err.status, err->status);
        ck_assert_str_eq(body_err.code, err->code);
        ck_assert_str_eq(body_err.field, err->field);
        ck_assert_str_eq(body_err.message, err->message);
        return;
    }
    ck_assert_uint_eq(body_n, n);
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < OP_MAX_TENSORS; j++) {
            const job_tensor_t *a = &jobs[i]->in[j], *b = &body_jobs[i]->in[j];
            ck_assert_uint_eq(a->nbytes, b->nbytes);
            ck_assert_int_eq(!a->data, !b->data);
            if (a->data) ck_assert_int_eq(memcmp(a->data, b->data, a->nbytes), 0);
        }
    job_json_free_jobs(body_jobs, body_n);
}

/* Parses a request body; returns the parser's result, the jobs in *ret (freed by the caller
 * with job_json_free_jobs) and the error in *err. */
static int request_parse(const char *text, const char *key, job_t ***ret, size_t *ret_n,
                         api_error_t *err)
{
    json_t *root = parse(text);
    job_json_env_t env = test_env();
    bool is_list;
    *ret = NULL;
    *ret_n = 0;
    int r = job_json_parse_request(root, &env, key, ret, ret_n, &is_list, err);
    json_decref(root);
    body_parse_agrees(text, key, r, *ret, *ret_n, err);
    return r;
}

/* job_json_parse_body() alone, with cfg for limits (NULL: the tests' own). */
static int body_parse(const char *text, const config_t *cfg, job_t ***ret, size_t *ret_n,
                      api_error_t *err)
{
    job_json_env_t env = test_env();
    if (cfg) env.cfg = cfg;
    bool is_list;
    *ret = NULL;
    *ret_n = 0;
    return job_json_parse_body(text, strlen(text), &env, NULL, ret, ret_n, &is_list, err);
}

#define X3 "\"x\": {\"dtype\": \"f32\", \"shape\": [3], \"data\": [1, 2, 3]}"

START_TEST(test_job_parse_rejects_bad_fields_with_exact_paths)
{
    static const struct {
        const char *body;
        int status;
        const char *field;
    } cases[] = {
        {"[]", 400, ""},
        {"42", 400, ""},
        {"{\"inputs\": {" X3 "}}", 400, "op"},
        {"{\"op\": 3, \"inputs\": {" X3 "}}", 400, "op"},
        {"{\"op\": \"nope\", \"inputs\": {" X3 "}}", 400, "op"},
        {"{\"op\": \"tadd\", \"inputs\": {" X3 "}, \"colour\": 1}", 400, "colour"},
        {"{\"op\": \"tadd\", \"params\": [], \"inputs\": {" X3 "}}", 400, "params"},
        {"{\"op\": \"tadd\", \"params\": {\"beta\": 1}, \"inputs\": {" X3 "}}", 400, "params.beta"},
        {"{\"op\": \"tadd\", \"params\": {\"alpha\": \"x\"}, \"inputs\": {" X3 "}}", 400,
         "params.alpha"},
        {"{\"op\": \"tadd\", \"priority\": 101, \"inputs\": {" X3 "}}", 400, "priority"},
        {"{\"op\": \"tadd\", \"priority\": 1.5, \"inputs\": {" X3 "}}", 400, "priority"},
        {"{\"op\": \"tadd\", \"device\": -1, \"inputs\": {" X3 "}}", 400, "device"},
        {"{\"op\": \"tadd\", \"device\": \"0\", \"inputs\": {" X3 "}}", 400, "device"},
        {"{\"op\": \"tadd\", \"deadline_ms\": 0, \"inputs\": {" X3 "}}", 400, "deadline_ms"},
        {"{\"op\": \"tadd\", \"deadline_ms\": -5, \"inputs\": {" X3 "}}", 400, "deadline_ms"},
        {"{\"op\": \"tadd\"}", 400, "inputs"},
        {"{\"op\": \"tadd\", \"inputs\": []}", 400, "inputs"},
        {"{\"op\": \"tadd\", \"inputs\": {}}", 400, "inputs.x"},
        {"{\"op\": \"tadd\", \"inputs\": {" X3 ", \"z\": {}}}", 400, "inputs.z"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": 5}}", 400, "inputs.x"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [3]}}}", 400,
         "inputs.x"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [1], \"data\": "
         "[1], \"b64\": \"AACAPw==\"}}}",
         400, "inputs.x"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f31\", \"shape\": [1], \"data\": "
         "[1]}}}",
         400, "inputs.x.dtype"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"shape\": [1], \"data\": [1]}}}", 400,
         "inputs.x.dtype"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [1, -1], "
         "\"data\": []}}}",
         400, "inputs.x.shape"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [1048576], "
         "\"b64\": \"\"}}}",
         413, "inputs.x.shape"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [2], \"data\": "
         "[1, 2, 3]}}}",
         400, "inputs.x.data"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f16\", \"shape\": [2], \"data\": "
         "[1, 1e6]}}}",
         400, "inputs.x.data[1]"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [2], \"b64\": "
         "\"AACAPw==\"}}}",
         400, "inputs.x.b64"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [1], \"b64\": "
         "\"AAC*Pw==\"}}}",
         400, "inputs.x.b64"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [1], \"b64\": "
         "7}}}",
         400, "inputs.x.b64"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"buffer\": \"nope\"}}}", 400, "inputs.x.buffer"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"buffer\": \"b00000000000000000000000f\"}}}",
         404, "inputs.x.buffer"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"buffer\": \"b0123456789abcdef01234567\", "
         "\"dtype\": \"f32\"}}}",
         400, "inputs.x.dtype"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [1], \"data\": "
         "[1], \"size\": 1}}}",
         400, "inputs.x.size"},
        {"{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"i32\", \"shape\": [1], \"data\": "
         "[1]}}}",
         400, "inputs.x.dtype"},
        {"{\"op\": \"tadd\", \"inputs\": {" X3 ", \"y\": {\"dtype\": \"f32\", \"shape\": [2], "
         "\"data\": [1, 2]}}}",
         400, "inputs.y.shape"},
        {"[{\"op\": \"tadd\", \"inputs\": {" X3 "}}, {\"op\": \"tadd\", \"inputs\": {" X3
         "}}, {\"op\": \"tadd\", \"inputs\": {" X3 "}}, {\"op\": \"tadd\", \"inputs\": {\"x\": "
         "{\"dtype\": \"f64\", \"shape\": [1], \"data\": [1]}, \"y\": {\"dtype\": \"bf17\", "
         "\"shape\": [1], \"data\": [1]}}}]",
         400, "[3].inputs.y.dtype"},
        {"[{\"op\": \"tadd\", \"inputs\": {" X3 "}}, 7]", 400, "[1]"},
        {"[{\"op\": \"tadd\", \"inputs\": {" X3 "}}, {\"op\": \"tadd\", \"inputs\": {" X3
         "}, \"priority\": \"high\"}]",
         400, "[1].priority"},
        {"[{}, {}, {}, {}, {}]", 413, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        job_t **jobs;
        size_t n;
        api_error_t err = {0};
        int r = request_parse(cases[i].body, NULL, &jobs, &n, &err);
        ck_assert_msg(r < 0, "case %zu accepted: %s", i, cases[i].body);
        ck_assert_ptr_null(jobs);
        ck_assert_msg(err.status == cases[i].status, "case %zu: status %d, want %d (%s)", i,
                      err.status, cases[i].status, err.message);
        ck_assert_msg(strcmp(err.field, cases[i].field) == 0, "case %zu: field '%s', want '%s'", i,
                      err.field, cases[i].field);
        ck_assert_msg(strlen(err.message) > 0, "case %zu: no message", i);
    }
}
END_TEST

START_TEST(test_job_parse_builds_a_validated_job)
{
    job_t **jobs;
    size_t n;
    api_error_t err;
    ck_assert_int_eq(request_parse("{\"op\": \"tadd\", \"params\": {\"alpha\": 2}, \"priority\": "
                                   "-7, \"device\": 1, \"deadline_ms\": 1500, \"inputs\": {" X3
                                   ", \"y\": {\"buffer\": \"b0123456789abcdef01234567\"}}}",
                                   "key-1", &jobs, &n, &err),
                     0);
    ck_assert_uint_eq(n, 1);
    job_t *job = jobs[0];
    ck_assert(id_valid('j', job->id));
    ck_assert_str_eq(job->owner, "alice");
    ck_assert_str_eq(job->idempotency_key, "key-1");
    ck_assert_str_eq(job->params_json, "{\"alpha\":2}");
    ck_assert_int_eq(job->priority, -7);
    ck_assert_int_eq(job->device, 1);
    ck_assert_int_eq(job->state, JOB_QUEUED);
    ck_assert(job->deadline_us == 1700000000000000LL + 1500 * 1000);
    ck_assert(job->created_us == 1700000000000000LL);
    ck_assert_str_eq(job->in[0].name, "x");
    ck_assert(job->call.has_in[0] && job->call.has_in[1]);
    ck_assert_uint_eq(job->in[0].nbytes, 12);
    ck_assert(((float *)job->in[0].data)[2] == 3.0f);
    ck_assert_str_eq(job->in[1].buffer_id, known_buffer);
    ck_assert_ptr_null(job->in[1].data);
    ck_assert_int_eq(job->call.n_out, 1);
    ck_assert_str_eq(job->out[0].name, "out");
    ck_assert_uint_eq(job->out[0].nbytes, 12);
    double alpha;
    memcpy(&alpha, job->call.params.bytes, sizeof alpha);
    ck_assert(alpha == 2.0);
    job_json_free_jobs(jobs, n);

    /* A list: every job gets its key and index apart (JOB_IDEM_LIST_SEP); no deadline when
     * null. */
    ck_assert_int_eq(request_parse("[{\"op\": \"tadd\", \"inputs\": {" X3 "}}, {\"op\": \"tadd\", "
                                   "\"deadline_ms\": null, \"inputs\": {\"x\": {\"dtype\": "
                                   "\"f64\", \"shape\": [1], \"b64\": "
                                   "\"AAAAAAAA8D8=\"}}}]",
                                   "k", &jobs, &n, &err),
                     0);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(jobs[0]->idempotency_key, "k\x1f"
                                               "0");
    ck_assert_str_eq(jobs[1]->idempotency_key, "k\x1f"
                                               "1");
    ck_assert_str_eq(jobs[1]->params_json, "{}");
    ck_assert(jobs[1]->deadline_us == 0);
    ck_assert(*(double *)jobs[1]->in[0].data == 1.0);
    ck_assert_str_ne(jobs[0]->id, jobs[1]->id);
    job_json_free_jobs(jobs, n);
}
END_TEST

/* The first job of text parsed with env: 0 and its time limit in *ret_ms, or the error. */
static int time_limit_parse(const job_json_env_t *env, const char *text, int64_t *ret_ms,
                            api_error_t *err)
{
    job_t **jobs = NULL;
    size_t n = 0;
    bool is_list;
    int r = job_json_parse_body(text, strlen(text), env, NULL, &jobs, &n, &is_list, err);
    if (r == 0) *ret_ms = jobs[0]->time_limit_ms;
    job_json_free_jobs(jobs, n);
    return r;
}

/* A job's time limit: the default within the user's bound when it gives none; refused past the
 * bound (or asking for none under one) with 422 naming the bound's key; 400 on its field when
 * malformed. Where the backend cannot stop a running job, a limit under the op's cost estimate
 * (tadd: alpha ms) is refused too, on the job's own field; where it can, it is taken. */
START_TEST(test_job_time_limits_follow_the_users_bound_and_the_backend)
{
    config_t cfg = *test_config();
    job_json_env_t env = test_env();
    env.cfg = &cfg;
    env.max_time_limit_ms = 1000;
    env.max_time_limit_key = "user.alice.max_time_limit_ms";
    int64_t ms = -1;
    api_error_t err = {0};
    const char *plain = "{\"op\": \"tadd\", \"inputs\": {" X3 "}}";
    ck_assert_int_eq(time_limit_parse(&env, plain, &ms, &err), 0);
    ck_assert_int_eq(ms, 1000);
    cfg.default_time_limit_ms = 300;
    ck_assert_int_eq(time_limit_parse(&env, plain, &ms, &err), 0);
    ck_assert_int_eq(ms, 300);
    cfg.default_time_limit_ms = 5000;
    ck_assert_int_eq(time_limit_parse(&env, plain, &ms, &err), 0);
    ck_assert_int_eq(ms, 1000);
    ck_assert_int_eq(time_limit_parse(&env,
                                      "[{\"op\": \"tadd\", \"inputs\": {" X3 "}}, {\"op\": "
                                      "\"tadd\", \"time_limit_ms\": 1001, \"inputs\": {" X3 "}}]",
                                      &ms, &err),
                     -EINVAL);
    ck_assert_int_eq(err.status, 422);
    ck_assert_str_eq(err.code, "time_limit_too_long");
    ck_assert_str_eq(err.field, "user.alice.max_time_limit_ms");
    ck_assert_ptr_nonnull(strstr(err.message, "[1].time_limit_ms = 1001 ms"));
    const char *none = "{\"op\": \"tadd\", \"time_limit_ms\": null, \"inputs\": {" X3 "}}";
    ck_assert_int_eq(time_limit_parse(&env, none, &ms, &err), -EINVAL);
    ck_assert_int_eq(err.status, 422);
    static const char *const bad[] = {"0", "-1", "1.5", "\"9\"", "1000000000001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        snprintf(text, sizeof text,
                 "{\"op\": \"tadd\", \"time_limit_ms\": %s, \"inputs\": {" X3 "}}", bad[i]);
        ck_assert_int_eq(time_limit_parse(&env, text, &ms, &err), -EINVAL);
        ck_assert_int_eq(err.status, 400);
        ck_assert_str_eq(err.field, "time_limit_ms");
    }
    /* Without a bound, null is no limit, and the default 0 gives none. */
    env.max_time_limit_ms = 0;
    cfg.default_time_limit_ms = 0;
    ck_assert_int_eq(time_limit_parse(&env, none, &ms, &err), 0);
    ck_assert_int_eq(ms, 0);
    ck_assert_int_eq(time_limit_parse(&env, plain, &ms, &err), 0);
    ck_assert_int_eq(ms, 0);

    /* tadd with alpha 3 is estimated at 3 ms. */
    const char *costly = "{\"op\": \"tadd\", \"params\": {\"alpha\": 3}, \"time_limit_ms\": 2, "
                         "\"inputs\": {" X3 "}}";
    ck_assert_int_eq(time_limit_parse(&env, costly, &ms, &err), 0);
    ck_assert_int_eq(ms, 2);
    env.time_limit_by_cost = true;
    ck_assert_int_eq(time_limit_parse(&env, costly, &ms, &err), -EINVAL);
    ck_assert_int_eq(err.status, 422);
    ck_assert_str_eq(err.code, "time_limit_too_short");
    ck_assert_str_eq(err.field, "time_limit_ms");
    ck_assert_ptr_nonnull(strstr(err.message, "estimated at 3 ms"));
    ck_assert_int_eq(time_limit_parse(&env,
                                      "{\"op\": \"tadd\", \"params\": {\"alpha\": 3}, "
                                      "\"time_limit_ms\": 3, \"inputs\": {" X3 "}}",
                                      &ms, &err),
                     0);
    /* A job without a limit is never refused for its cost. */
    ck_assert_int_eq(time_limit_parse(&env,
                                      "{\"op\": \"tadd\", \"params\": {\"alpha\": 3}, "
                                      "\"inputs\": {" X3 "}}",
                                      &ms, &err),
                     0);
    ck_assert_int_eq(ms, 0);
}
END_TEST

START_TEST(test_body_data_positions_cannot_be_forged)
{
    job_t **jobs;
    size_t n;
    api_error_t err;
    /* The integer 0 a client writes as data is the number 0, never the first cut span. */
    ck_assert_int_eq(request_parse("{\"op\": \"tadd\", \"inputs\": {" X3 ", \"y\": {\"dtype\": "
                                   "\"f32\", \"shape\": [3], \"data\": 0}}}",
                                   NULL, &jobs, &n, &err),
                     -EINVAL);
    ck_assert_str_eq(err.field, "inputs.y.data");
    ck_assert_str_eq(err.message, "data must be a list");
    ck_assert_int_eq(body_parse("{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", "
                                "\"shape\": [], \"data\": 0}}}",
                                NULL, &jobs, &n, &err),
                     0);
    ck_assert(*(float *)jobs[0]->in[0].data == 0.0f);
    job_json_free_jobs(jobs, n);
    /* Escaped keys name what they decode to: this data and b64 are cut out like any other. */
    ck_assert_int_eq(request_parse("{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", "
                                   "\"shape\": [2], \"d\\u0061ta\": [1.5, \"-inf\"]}, \"y\": "
                                   "{\"dtype\": \"f32\", \"shape\": [2], \"b\\u0036\\u0034\": "
                                   "\"AADAPwAAgL8\\u003d\"}}}",
                                   NULL, &jobs, &n, &err),
                     0);
    ck_assert(((float *)jobs[0]->in[0].data)[0] == 1.5f);
    ck_assert(isinf(((float *)jobs[0]->in[0].data)[1]));
    ck_assert(((float *)jobs[0]->in[1].data)[0] == 1.5f);
    ck_assert(((float *)jobs[0]->in[1].data)[1] == -1.0f);
    job_json_free_jobs(jobs, n);
}
END_TEST

START_TEST(test_body_data_that_is_not_json_is_invalid_json)
{
    static const char *const bad_data[] = {"[1, 2,]",
                                           "[1, 2 3]",
                                           "[01, 2, 3]",
                                           "[1, 99999999999999999999, 3]",
                                           "[1, 2e400, 3]",
                                           "[1, 2, \"\\x\"]",
                                           "[1, 2, {\"a\": 1, \"a\": 2}]",
                                           "[1, 2, tru]",
                                           "[1, 2, 3"};
    for (size_t i = 0; i < sizeof bad_data / sizeof *bad_data; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": "
                 "[3], \"data\": %s}}}",
                 bad_data[i]);
        job_t **jobs;
        size_t n;
        api_error_t err;
        ck_assert_msg(body_parse(body, NULL, &jobs, &n, &err) == -EINVAL, "%s", bad_data[i]);
        ck_assert_int_eq(err.status, 400);
        ck_assert_str_eq(err.code, "invalid_json");
        ck_assert_str_eq(err.field, "body");
    }
}
END_TEST

START_TEST(test_body_limits_refuse_before_building_a_tree)
{
    job_t **jobs;
    size_t n;
    api_error_t err;
    /* Five jobs where four are allowed: refused on the count, the broken fifth never read. */
    ck_assert_int_eq(body_parse("[{}, {}, {}, {}, {\"op\": tru}]", NULL, &jobs, &n, &err), -E2BIG);
    ck_assert_int_eq(err.status, 413);
    ck_assert_str_eq(err.message, "5 jobs in one request; at most 4 are allowed");

    /* Params whose tree passes max_json_tree_bytes. */
    config_t cfg = *test_config();
    cfg.max_json_tree_bytes = 64 << 10;
    size_t len = 0, cap = 1 << 20;
    char *body = malloc(cap);
    len += (size_t)snprintf(body, cap, "{\"op\": \"tadd\", \"params\": {\"list\": [0");
    while (len < cap - 256)
        len += (size_t)snprintf(body + len, cap - len, ",0");
    snprintf(body + len, cap - len, "]}, \"inputs\": {" X3 "}}");
    ck_assert_int_eq(body_parse(body, &cfg, &jobs, &n, &err), -E2BIG);
    ck_assert_int_eq(err.status, 413);
    ck_assert_str_eq(err.field, "body");
    ck_assert_msg(strstr(err.message, "max_json_tree_bytes"), "%s", err.message);
    free(body);
    /* The same limit holds no tensor data: a megabyte of it parses within 64 KiB. */
    body = malloc(cap + 256);
    len = (size_t)snprintf(body, cap,
                           "{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": "
                           "\"f64\", \"shape\": [%zu], \"data\": [0.5",
                           cap / 8);
    for (size_t i = 1; i < cap / 8; i++)
        len += (size_t)snprintf(body + len, cap + 256 - len, ",%zu", i);
    snprintf(body + len, cap + 256 - len, "]}}}");
    cfg.max_tensor_bytes = 1 << 30;
    ck_assert_int_eq(body_parse(body, &cfg, &jobs, &n, &err), 0);
    ck_assert(((double *)jobs[0]->in[0].data)[0] == 0.5);
    ck_assert(((double *)jobs[0]->in[0].data)[cap / 8 - 1] == (double)(cap / 8 - 1));
    job_json_free_jobs(jobs, n);
    free(body);
}
END_TEST

START_TEST(test_job_prefers_the_device_of_its_resident_input)
{
    job_t **jobs;
    size_t n;
    api_error_t err;
    ck_assert_int_eq(request_parse("[{\"op\": \"tadd\", \"inputs\": {" X3
                                   ", \"y\": {\"buffer\": \"b0123456789abcdef0123450d\"}}},"
                                   " {\"op\": \"tadd\", \"device\": 1, \"inputs\": {" X3
                                   ", \"y\": {\"buffer\": \"b0123456789abcdef0123450d\"}}},"
                                   " {\"op\": \"tadd\", \"inputs\": {" X3
                                   ", \"y\": {\"buffer\": \"b0123456789abcdef01234567\"}}}]",
                                   NULL, &jobs, &n, &err),
                     0);
    ck_assert_uint_eq(n, 3);
    /* A preference, not a pin: the job runs elsewhere when device 2 has no room. */
    ck_assert_int_eq(jobs[0]->device, -1);
    ck_assert_int_eq(jobs[0]->preferred_device, 2);
    ck_assert_int_eq(jobs[1]->device, 1);
    ck_assert_int_eq(jobs[2]->device, -1);
    ck_assert_int_eq(jobs[2]->preferred_device, -1);
    job_json_free_jobs(jobs, n);
}
END_TEST

START_TEST(test_job_json_reports_times_states_and_inline_outputs)
{
    job_t **jobs;
    size_t n;
    api_error_t err;
    ck_assert_int_eq(
        request_parse("{\"op\": \"tadd\", \"inputs\": {" X3 "}}", NULL, &jobs, &n, &err), 0);
    job_t *job = jobs[0];
    json_t *o = job_json_from_job(job, 1024, NULL, NULL, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(o, "state")), "queued");
    ck_assert_str_eq(json_string_value(json_object_get(o, "op")), "tadd");
    ck_assert_str_eq(json_string_value(json_object_get(o, "created_at")),
                     "2023-11-14T22:13:20.000000Z");
    ck_assert(json_is_null(json_object_get(o, "started_at")));
    ck_assert(json_is_null(json_object_get(o, "error")));
    ck_assert(json_is_null(json_object_get(o, "device")));
    ck_assert_int_eq(json_object_size(json_object_get(o, "outputs")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(
                         json_object_get(json_object_get(o, "inputs"), "x"), "bytes")),
                     12);
    json_decref(o);

    job->state = JOB_SUCCEEDED;
    job->started_us = job->created_us + 2500;
    job->finished_us = job->started_us + 1000000;
    job->gpu_ns = 3000000;
    float out[3] = {4, 5, 6};
    job->out[0].data = malloc(sizeof out);
    memcpy(job->out[0].data, out, sizeof out);
    o = job_json_from_job(job, 12, NULL, NULL, NULL);
    ck_assert(json_real_value(json_object_get(o, "queue_ms")) == 2.5);
    ck_assert(json_real_value(json_object_get(o, "run_ms")) == 1000.0);
    ck_assert(json_real_value(json_object_get(o, "gpu_ms")) == 3.0);
    json_t *sent = fake_as_sent(o);
    json_t *data =
        json_object_get(json_object_get(json_object_get(sent, "outputs"), "out"), "data");
    ck_assert_int_eq(json_array_size(data), 3);
    ck_assert(json_number_value(json_array_get(data, 2)) == 6.0);
    json_decref(sent);
    json_decref(o);
    /* With a section the bytes go there, after what it held, named by binary_offset. */
    job_json_section_t section = {0};
    o = job_json_from_job(job, 12, NULL, NULL, &section);
    json_t *out_o = json_object_get(json_object_get(o, "outputs"), "out");
    ck_assert_ptr_null(json_object_get(out_o, "data"));
    ck_assert_int_eq(json_integer_value(json_object_get(out_o, "binary_offset")), 0);
    ck_assert_uint_eq(section.len, sizeof out);
    ck_assert_mem_eq(section.bytes, out, sizeof out);
    json_decref(o);
    o = job_json_from_job(job, 12, NULL, NULL, &section);
    out_o = json_object_get(json_object_get(o, "outputs"), "out");
    ck_assert_int_eq(json_integer_value(json_object_get(out_o, "binary_offset")), sizeof out);
    ck_assert_uint_eq(section.len, 2 * sizeof out);
    ck_assert_mem_eq(section.bytes + sizeof out, out, sizeof out);
    json_decref(o);
    free(section.bytes);
    /* Over the inline limit the output is described without data. */
    o = job_json_from_job(job, 11, NULL, NULL, NULL);
    ck_assert_ptr_null(
        json_object_get(json_object_get(json_object_get(o, "outputs"), "out"), "data"));
    json_decref(o);

    job->state = JOB_FAILED;
    job_set_error(job, "deadline_exceeded", "too late");
    o = job_json_from_job(job, 12, NULL, NULL, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(o, "error"), "code")),
                     "deadline_exceeded");
    json_decref(o);
    job_json_free_jobs(jobs, n);
}
END_TEST

static Suite *api_codec_suite(void)
{
    Suite *s = suite_create("api_codec");
    TCase *tc = tcase_create("codec");
    tcase_add_test(tc, test_inline_flat_and_nested_agree_for_every_dtype);
    tcase_add_test(tc, test_inline_integer_ranges_are_enforced);
    tcase_add_test(tc, test_inline_float_runs_hand_over_at_any_element);
    tcase_add_test(tc, test_inline_i64_is_exact_and_floats_check_their_range);
    tcase_add_test(tc, test_inline_counts_and_nesting_must_match_the_shape);
    tcase_add_test(tc, test_desc_from_json_checks_dtype_dims_and_limits);
    tcase_add_test(tc, test_shape_csv_parses_sizes_and_refuses_junk);
    tcase_add_test(tc, test_b64_round_trips_every_length);
    tcase_add_test(tc, test_b64_refuses_bad_text);
    tcase_add_test(tc, test_npy_write_then_parse_round_trips_every_dtype);
    tcase_add_test(tc, test_npy_accepts_versions_2_and_3);
    tcase_add_test(tc, test_npy_refuses_bad_headers_and_lengths);
    tcase_add_test(tc, test_npy_refuses_bad_magic_version_truncation_and_size);
    tcase_add_test(tc, test_npy_data_offset_and_header_from_the_first_bytes);
    suite_add_tcase(s, tc);
    TCase *jobs = tcase_create("job_json");
    tcase_add_test(jobs, test_job_parse_rejects_bad_fields_with_exact_paths);
    tcase_add_test(jobs, test_job_parse_builds_a_validated_job);
    tcase_add_test(jobs, test_job_prefers_the_device_of_its_resident_input);
    tcase_add_test(jobs, test_job_time_limits_follow_the_users_bound_and_the_backend);
    tcase_add_test(jobs, test_body_data_positions_cannot_be_forged);
    tcase_add_test(jobs, test_body_data_that_is_not_json_is_invalid_json);
    tcase_add_test(jobs, test_body_limits_refuse_before_building_a_tree);
    tcase_add_test(jobs, test_job_json_reports_times_states_and_inline_outputs);
    suite_add_tcase(s, jobs);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(api_codec_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
