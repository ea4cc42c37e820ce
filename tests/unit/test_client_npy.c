/* libgpujob without a daemon: dtypes and tensor sizes, .npy files (round trips per dtype,
 * NumPy's exact header layout, every malformed-file error), job specs as JSON, and the 16-bit
 * float conversions used to decode inline outputs, checked against the kernels' reference. */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/gpujob_internal.h"
#include "kernels/tensor.h"

START_TEST(test_dtype_names_sizes_and_parse_round_trip)
{
    static const size_t sizes[] = {4, 2, 2, 8, 1, 4, 4, 8};
    for (int i = 0; i < GPUJOB_DTYPE_COUNT; i++) {
        gpujob_dtype_t dt;
        ck_assert_int_eq(gpujob_dtype_parse(gpujob_dtype_name(i), &dt), 0);
        ck_assert_int_eq(dt, i);
        ck_assert_uint_eq(gpujob_dtype_size(i), sizes[i]);
        /* The client's names are the daemon's names. */
        ck_assert_str_eq(gpujob_dtype_name(i), dtype_name((dtype_t)i));
    }
    gpujob_dtype_t dt = GPUJOB_F64;
    ck_assert_int_eq(gpujob_dtype_parse("float32", &dt), -EINVAL);
    ck_assert_int_eq(gpujob_dtype_parse(NULL, &dt), -EINVAL);
    ck_assert_int_eq(dt, GPUJOB_F64); /* untouched on failure */
    ck_assert_str_eq(gpujob_dtype_name(GPUJOB_DTYPE_COUNT), "?");
}
END_TEST

START_TEST(test_tensor_init_checks_shape_and_overflow)
{
    gpujob_tensor_t t;
    int64_t shape[3] = {2, 3, 4};
    ck_assert_int_eq(gpujob_tensor_init(&t, GPUJOB_F64, 3, shape, NULL), 0);
    ck_assert_uint_eq(t.nbytes, 2 * 3 * 4 * 8);
    ck_assert_int_eq(gpujob_tensor_numel(&t), 24);
    ck_assert_int_eq(gpujob_tensor_init(&t, GPUJOB_F32, 0, NULL, NULL), 0);
    ck_assert_uint_eq(t.nbytes, 4); /* a scalar */
    int64_t negative[1] = {-1};
    ck_assert_int_eq(gpujob_tensor_init(&t, GPUJOB_F32, 1, negative, NULL), -EINVAL);
    int64_t huge[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
    ck_assert_int_eq(gpujob_tensor_init(&t, GPUJOB_F32, 2, huge, NULL), -EOVERFLOW);
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    ck_assert_int_eq(gpujob_tensor_init(&t, GPUJOB_F32, 9, nine, NULL), -EINVAL);
    ck_assert_int_eq(gpujob_tensor_init(&t, GPUJOB_DTYPE_COUNT, 1, shape, NULL), -EINVAL);
    gpujob_tensor_clear(NULL);
}
END_TEST

/* Fills n bytes with a pattern that differs per dtype and position. */
static void fill(void *data, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)data)[i] = (unsigned char)(i * 37 + (size_t)seed * 11 + 5);
}

START_TEST(test_npy_round_trip_every_dtype)
{
    int64_t shape[3] = {3, 1, 5};
    for (int dt = 0; dt < GPUJOB_DTYPE_COUNT; dt++) {
        for (int ndim = 0; ndim <= 3; ndim++) {
            gpujob_tensor_t t, back;
            ck_assert_int_eq(gpujob_tensor_init(&t, dt, ndim, shape, NULL), 0);
            unsigned char data[3 * 5 * 8];
            fill(data, t.nbytes, dt * 10 + ndim);
            t.data = data;
            void *file = NULL;
            size_t len = 0;
            int r = gpujob_npy_format(&t, &file, &len);
            if (dt == GPUJOB_BF16) {
                ck_assert_int_eq(r, -ENOTSUP); /* .npy has no bfloat16 */
                continue;
            }
            ck_assert_int_eq(r, 0);
            /* NumPy aligns the data on 64 bytes and ends the header with a newline. */
            ck_assert_uint_eq((len - t.nbytes) % 64, 0);
            ck_assert_int_eq(((char *)file)[len - t.nbytes - 1], '\n');
            char err[256] = "";
            ck_assert_int_eq(gpujob_npy_parse(file, len, &back, err, sizeof err), 0);
            ck_assert_int_eq(back.dtype, dt);
            ck_assert_int_eq(back.ndim, ndim);
            for (int i = 0; i < ndim; i++)
                ck_assert_int_eq(back.shape[i], shape[i]);
            ck_assert_uint_eq(back.nbytes, t.nbytes);
            ck_assert_mem_eq(back.data, data, t.nbytes);
            gpujob_tensor_clear(&back);
            free(file);
        }
    }
}
END_TEST

/* The exact bytes NumPy 1.x writes for np.save(f, np.zeros((2, 3), '<f4')) up to the data. */
START_TEST(test_npy_header_matches_numpy_layout)
{
    float zeros[6] = {0};
    int64_t shape[2] = {2, 3};
    gpujob_tensor_t t;
    gpujob_tensor_init(&t, GPUJOB_F32, 2, shape, zeros);
    void *file = NULL;
    size_t len = 0;
    ck_assert_int_eq(gpujob_npy_format(&t, &file, &len), 0);
    const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    ck_assert_uint_eq(len, 128 + sizeof zeros);
    ck_assert_mem_eq(file, "\x93NUMPY\x01\x00\x76\x00", 10); /* header length 118 */
    ck_assert_mem_eq((char *)file + 10, dict, strlen(dict));
    free(file);

    int64_t one[1] = {7};
    gpujob_tensor_t v;
    unsigned char bytes[7] = {0};
    gpujob_tensor_init(&v, GPUJOB_I8, 1, one, bytes);
    ck_assert_int_eq(gpujob_npy_format(&v, &file, &len), 0);
    const char dict1[] = "{'descr': '|i1', 'fortran_order': False, 'shape': (7,), }";
    ck_assert_mem_eq((char *)file + 10, dict1, strlen(dict1));
    free(file);
}
END_TEST

/* Builds a .npy v1.0 file with an arbitrary header dict and data. */
static void *npy_build(const char *dict, const void *data, size_t data_len, size_t *ret_len)
{
    size_t n = strlen(dict), total = (10 + n + 1 + 63) / 64 * 64, hlen = total - 10;
    char *file = malloc(total + data_len);
    memcpy(file, "\x93NUMPY\x01\x00", 8);
    file[8] = (char)(hlen & 0xff);
    file[9] = (char)(hlen >> 8);
    memcpy(file + 10, dict, n);
    memset(file + 10 + n, ' ', hlen - n - 1);
    file[total - 1] = '\n';
    memcpy(file + total, data, data_len);
    *ret_len = total + data_len;
    return file;
}

static int parse_dict(const char *dict, size_t data_len, char *err, size_t err_size)
{
    unsigned char data[64] = {0};
    size_t len;
    void *file = npy_build(dict, data, data_len, &len);
    gpujob_tensor_t t = {0};
    int r = gpujob_npy_parse(file, len, &t, err, err_size);
    gpujob_tensor_clear(&t);
    free(file);
    return r;
}

START_TEST(test_npy_parse_rejects_malformed_files)
{
    char err[256];
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 12,
                                err, sizeof err),
                     0);
    /* Big-endian, objects, and types we do not have. */
    ck_assert_int_eq(parse_dict("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", 12,
                                err, sizeof err),
                     -ENOTSUP);
    ck_assert_ptr_nonnull(strstr(err, "'>f4'"));
    ck_assert_int_eq(
        parse_dict("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", 24, err, sizeof err),
        -ENOTSUP);
    ck_assert_int_eq(
        parse_dict("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", 6, err, sizeof err),
        -ENOTSUP);
    ck_assert_int_eq(
        parse_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", 12, err, sizeof err),
        -ENOTSUP);
    ck_assert_ptr_nonnull(strstr(err, "Fortran"));
    /* The header lies about the data: too little, too much. */
    ck_assert_int_eq(
        parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8, err, sizeof err),
        -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "8 data bytes"));
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 16,
                                err, sizeof err),
                     -EINVAL);
    /* Missing keys, bad shapes. */
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'shape': (3,), }", 12, err, sizeof err), -EINVAL);
    ck_assert_int_eq(
        parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': [3], }", 12, err, sizeof err),
        -EINVAL);
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }", 12,
                                err, sizeof err),
                     -EINVAL);
    ck_assert_int_eq(
        parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4,
                   err, sizeof err),
        -EINVAL);

    /* Bad magic, unknown version, truncated header. */
    size_t len;
    void *file =
        npy_build("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", "\0\0\0\0", 4, &len);
    gpujob_tensor_t t = {0};
    ck_assert_int_eq(gpujob_npy_parse(file, len, &t, err, sizeof err), 0);
    ck_assert_int_eq(t.ndim, 0);
    gpujob_tensor_clear(&t);
    ((char *)file)[1] = 'X';
    ck_assert_int_eq(gpujob_npy_parse(file, len, &t, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "magic"));
    ((char *)file)[1] = 'N';
    ((char *)file)[6] = 9;
    ck_assert_int_eq(gpujob_npy_parse(file, len, &t, err, sizeof err), -EINVAL);
    ((char *)file)[6] = 1;
    ck_assert_int_eq(gpujob_npy_parse(file, 40, &t, err, sizeof err), -EINVAL);
    ck_assert_int_eq(gpujob_npy_parse(file, 5, &t, err, sizeof err), -EINVAL);
    ck_assert_int_eq(t.data == NULL && t.nbytes == 0, 1); /* untouched on failure */
    free(file);
}
END_TEST

START_TEST(test_npy_parse_accepts_version_2)
{
    const char dict[] = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
    size_t n = strlen(dict), total = (12 + n + 1 + 63) / 64 * 64, hlen = total - 12;
    int64_t values[2] = {-5, INT64_C(1) << 62};
    unsigned char *file = calloc(1, total + sizeof values);
    memcpy(file, "\x93NUMPY\x02\x00", 8);
    file[8] = (unsigned char)(hlen & 0xff);
    file[9] = (unsigned char)(hlen >> 8);
    memcpy(file + 12, dict, n);
    memset(file + 12 + n, ' ', hlen - n - 1);
    file[total - 1] = '\n';
    memcpy(file + total, values, sizeof values);
    gpujob_tensor_t t;
    ck_assert_int_eq(gpujob_npy_parse(file, total + sizeof values, &t, NULL, 0), 0);
    ck_assert_int_eq(t.dtype, GPUJOB_I64);
    ck_assert_mem_eq(t.data, values, sizeof values);
    gpujob_tensor_clear(&t);
    free(file);
}
END_TEST

START_TEST(test_npy_save_and_load_file)
{
    char dir[] = "/tmp/gjc-npy-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/a.npy", dir);
    double values[4] = {1.5, -2.25, 1e300, 0};
    int64_t shape[2] = {2, 2};
    gpujob_tensor_t t, back;
    gpujob_tensor_init(&t, GPUJOB_F64, 2, shape, values);
    ck_assert_int_eq(gpujob_npy_save(path, &t), 0);
    char err[256];
    ck_assert_int_eq(gpujob_npy_load(path, &back, err, sizeof err), 0);
    ck_assert_mem_eq(back.data, values, sizeof values);
    gpujob_tensor_clear(&back);
    unlink(path);
    ck_assert_int_eq(gpujob_npy_load(path, &back, err, sizeof err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, path)); /* the message names the file */
    rmdir(dir);
}
END_TEST

START_TEST(test_spec_json_carries_typed_inputs_params_and_options)
{
    gpujob_spec_t *spec = NULL;
    ck_assert_int_eq(gpujob_spec_new("", &spec), -EINVAL);
    ck_assert_int_eq(gpujob_spec_new("saxpy", &spec), 0);
    int32_t x[3] = {1, -2, 300000};
    int64_t shape[1] = {3};
    gpujob_tensor_t t;
    gpujob_tensor_init(&t, GPUJOB_I32, 1, shape, x);
    ck_assert_int_eq(gpujob_spec_input(spec, "x", &t), 0);
    ck_assert_int_eq(gpujob_spec_input(spec, "x", &t), -EEXIST);
    ck_assert_int_eq(gpujob_spec_input_buffer(spec, "y", "buf-1"), 0);
    gpujob_tensor_t lying = t;
    lying.nbytes = 8;
    ck_assert_int_eq(gpujob_spec_input(spec, "z", &lying), -EINVAL);
    ck_assert_int_eq(gpujob_spec_param_double(spec, "a", 2.5), 0);
    ck_assert_int_eq(gpujob_spec_param_json(spec, "stride", "[1, 2]"), 0);
    ck_assert_int_eq(gpujob_spec_param_json(spec, "bad", "[1,"), -EINVAL);
    ck_assert_int_eq(gpujob_spec_param_bool(spec, "descending", true), 0);
    ck_assert_int_eq(gpujob_spec_param_string(spec, "mode", "fast"), 0);
    ck_assert_int_eq(gpujob_spec_param_int(spec, "axis", -1), 0);
    gpujob_spec_set_priority(spec, 7);
    gpujob_spec_set_device(spec, 1);
    gpujob_spec_set_deadline_ms(spec, 5000);
    gpujob_spec_set_time_limit_ms(spec, 700);

    char *text = gpujob_spec_json(spec);
    json_t *o = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(o);
    ck_assert_str_eq(json_string_value(json_object_get(o, "op")), "saxpy");
    json_t *in = json_object_get(json_object_get(o, "inputs"), "x");
    ck_assert_str_eq(json_string_value(json_object_get(in, "dtype")), "i32");
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(in, "shape"), 0)), 3);
    char *b64 = gjc_base64(x, sizeof x);
    ck_assert_str_eq(json_string_value(json_object_get(in, "b64")), b64);
    free(b64);
    ck_assert_str_eq(json_string_value(json_object_get(
                         json_object_get(json_object_get(o, "inputs"), "y"), "buffer")),
                     "buf-1");
    ck_assert_ptr_null(json_object_get(json_object_get(o, "inputs"), "z"));
    json_t *params = json_object_get(o, "params");
    ck_assert_double_eq(json_real_value(json_object_get(params, "a")), 2.5);
    ck_assert_int_eq(json_array_size(json_object_get(params, "stride")), 2);
    ck_assert(json_is_true(json_object_get(params, "descending")));
    ck_assert_str_eq(json_string_value(json_object_get(params, "mode")), "fast");
    ck_assert_int_eq(json_integer_value(json_object_get(params, "axis")), -1);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "priority")), 7);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "device")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "deadline_ms")), 5000);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "time_limit_ms")), 700);
    json_decref(o);
    free(text);

    /* Back to "any device", "the daemon's deadline" and its time limit: the keys disappear. */
    gpujob_spec_set_device(spec, -1);
    gpujob_spec_set_deadline_ms(spec, 0);
    gpujob_spec_set_time_limit_ms(spec, 0);
    text = gpujob_spec_json(spec);
    ck_assert_ptr_null(strstr(text, "\"device\""));
    ck_assert_ptr_null(strstr(text, "deadline_ms"));
    ck_assert_ptr_null(strstr(text, "time_limit_ms"));
    free(text);
    gpujob_spec_free(spec);
}
END_TEST

START_TEST(test_base64_matches_rfc4648_vectors)
{
    static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const coded[] = {"",         "Zg==",     "Zm8=",    "Zm9v",
                                        "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char *b = gjc_base64(plain[i], strlen(plain[i]));
        ck_assert_str_eq(b, coded[i]);
        free(b);
    }
}
END_TEST

/* The client decodes inline f16/bf16 outputs with its own conversion: it must agree with the
 * daemon's, bit for bit, on every class of value. */
START_TEST(test_f16_and_bf16_conversions_match_the_kernels)
{
    uint32_t seed = 12345;
    for (long i = 0; i < 2000000; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        float f;
        uint32_t bits = seed;
        /* Half the samples land in f16's range (and its subnormals), where rounding matters. */
        if (i % 2) bits = (bits & 0x807fffff) | ((uint32_t)(100 + (seed >> 8) % 60) << 23);
        memcpy(&f, &bits, sizeof f);
        uint16_t mine = gjc_f32_to_f16(f), ref = f32_to_f16(f);
        if (f != f)
            ck_assert((mine & 0x7c00) == 0x7c00 && (mine & 0x3ff) != 0);
        else
            ck_assert_msg(mine == ref, "f16 of %a (0x%08x): 0x%04x, want 0x%04x", f, bits, mine,
                          ref);
        uint16_t mine_b = gjc_f32_to_bf16(f), ref_b = f32_to_bf16(f);
        if (f != f)
            ck_assert((mine_b & 0x7f80) == 0x7f80 && (mine_b & 0x7f) != 0);
        else
            ck_assert_msg(mine_b == ref_b, "bf16 of %a: 0x%04x, want 0x%04x", f, mine_b, ref_b);
    }
    static const float edges[] = {0.0f,           -0.0f,          65504.0f,       65519.0f,
                                  65520.0f,       6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f,
                                  2.9802326e-08f, 1e-10f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        ck_assert_uint_eq(gjc_f32_to_f16(edges[i]), f32_to_f16(edges[i]));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_offline");
    TCase *tc = tcase_create("offline");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_dtype_names_sizes_and_parse_round_trip);
    tcase_add_test(tc, test_tensor_init_checks_shape_and_overflow);
    tcase_add_test(tc, test_npy_round_trip_every_dtype);
    tcase_add_test(tc, test_npy_header_matches_numpy_layout);
    tcase_add_test(tc, test_npy_parse_rejects_malformed_files);
    tcase_add_test(tc, test_npy_parse_accepts_version_2);
    tcase_add_test(tc, test_npy_save_and_load_file);
    tcase_add_test(tc, test_spec_json_carries_typed_inputs_params_and_options);
    tcase_add_test(tc, test_base64_matches_rfc4648_vectors);
    tcase_add_test(tc, test_f16_and_bf16_conversions_match_the_kernels);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
