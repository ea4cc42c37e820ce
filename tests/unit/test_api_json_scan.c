/* The scanner of POST /v1/jobs bodies (api/json_scan.c): the data lists it reads into typed
 * blocks as it checks them, the numbers it must refuse as jansson does, and the jobs that
 * job_json_parse_body() builds from its spans, which must hold what the codec would read. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/float_parse.h"
#include "api/job_json.h"
#include "api/json_scan.h"
#include "support/api_fakes.h"
#include "support/run_suite.h"

/* A job document whose tensor x is {"dtype": DTYPE, "shape": [n], "data": DATA}, with the
 * dtype written before the data (before) or after it. */
static void tensor_doc(char *buf, size_t size, const char *dtype, long n, const char *data,
                       bool before)
{
    if (before)
        snprintf(buf, size,
                 "{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"%s\", \"shape\": [%ld], "
                 "\"data\": %s}}}",
                 dtype, n, data);
    else
        snprintf(buf, size,
                 "{\"op\": \"tadd\", \"inputs\": {\"x\": {\"shape\": [%ld], \"data\": %s, "
                 "\"dtype\": \"%s\"}}}",
                 n, data, dtype);
}

/* Scans text, which must be JSON with exactly one data span. */
static json_scan_t scan_ok(const char *text, uint64_t max_values_bytes)
{
    json_scan_t s;
    json_scan_error_t err;
    int r = json_scan(text, strlen(text), 4, max_values_bytes, &s, &err);
    ck_assert_msg(r == 0, "%s: %d %s", text, r, err.text);
    ck_assert_uint_eq(s.n_spans, 1);
    return s;
}

/* --- the scanner's own reading --- */

/* Each number of a flat list, for f32 and f64 named before the data, is read into the span's
 * block exactly as the correctly rounding parser reads that number alone. */
START_TEST(test_scan_reads_a_flat_list_of_reals_as_it_checks_it)
{
    /* The last two are out of f32's range or below its least value: f64 only. */
    static const char *const numbers[] = {"0",
                                          "-0",
                                          "0.1",
                                          "-1.5e-3",
                                          "1E+2",
                                          "123456789",
                                          "16777217",
                                          "1e-45",
                                          "1e-50",
                                          "3.4028235e38",
                                          "0.30000001192",
                                          "2.5E-1",
                                          "9007199254740993",
                                          "-0.0",
                                          "1234567890123456789e-18",
                                          "1e308",
                                          "4.9e-324"};
    for (int wide = 0; wide < 2; wide++) {
        size_t n = sizeof numbers / sizeof *numbers - (wide ? 0 : 2);
        char data[1024] = "[", doc[2048];
        for (size_t i = 0; i < n; i++)
            snprintf(data + strlen(data), sizeof data - strlen(data), "%s%s", i ? " ,\n\t" : " ",
                     numbers[i]);
        strcat(data, " ]");
        tensor_doc(doc, sizeof doc, wide ? "f64" : "f32", (long)n, data, true);
        json_scan_t s = scan_ok(doc, 1 << 20);
        const json_span_t *span = &s.spans[0];
        ck_assert_ptr_nonnull(span->values);
        ck_assert_uint_eq(span->n_values, n);
        ck_assert_int_eq(span->values_dtype, wide ? DTYPE_F64 : DTYPE_F32);
        ck_assert_uint_eq(span->len, strlen(data));
        ck_assert_int_eq(memcmp(doc + span->off, data, span->len), 0);
        for (size_t i = 0; i < n; i++) {
            if (wide) {
                double want, got = ((const double *)span->values)[i];
                ck_assert_int_eq(float_parse_f64(numbers[i], strlen(numbers[i]), &want), 0);
                ck_assert_msg(memcmp(&want, &got, sizeof got) == 0, "f64 %s read as %a", numbers[i],
                              got);
            } else {
                float want, got = ((const float *)span->values)[i];
                ck_assert_int_eq(float_parse_f32(numbers[i], strlen(numbers[i]), &want), 0);
                ck_assert_msg(memcmp(&want, &got, sizeof got) == 0, "f32 %s read as %a", numbers[i],
                              (double)got);
            }
        }
        if (wide) {
            /* The block is the caller's once taken, and taken once. */
            void *values = json_scan_take_values(&s, 0);
            ck_assert_ptr_nonnull(values);
            ck_assert_ptr_null(s.spans[0].values);
            ck_assert_ptr_null(json_scan_take_values(&s, 0));
            ck_assert_ptr_null(json_scan_take_values(&s, 1));
            free(values);
        }
        json_scan_done(&s);
    }
}
END_TEST

/* What the scanner leaves to the codec: it still checks and cuts the value, and reads none. */
START_TEST(test_scan_leaves_other_data_to_the_codec)
{
    static const struct {
        const char *dtype, *data;
        bool before;
        uint64_t limit;
    } cases[] = {
        {"f32", "[1, 2]", false, 1 << 20},       /* the dtype comes after the data */
        {"i32", "[1, 2]", true, 1 << 20},        /* integers: the codec reads them exactly */
        {"f16", "[1, 2]", true, 1 << 20},        /* narrow floats: the codec's rounding */
        {"f\\u003332", "[1, 2]", true, 1 << 20}, /* an escaped dtype: jansson decodes it */
        {"f32", "[[1], [2]]", true, 1 << 20},    /* nested lists */
        {"f32", "[1, \"nan\"]", true, 1 << 20},  /* a float spelled as a string */
        {"f32", "[1, null]", true, 1 << 20},
        {"f32", "[]", true, 1 << 20},
        {"f32", "2", true, 1 << 20}, /* a bare scalar */
        {"f32", "[1, 2]", true, 7},  /* over the byte limit */
        {"f64", "[1, 2]", true, 15},
        {"f32", "[1, 1e39]", true, 1 << 20}, /* out of f32's range, for the codec to say */
        {"f32", "[1, 1234567890123456789]", true, 1 << 20}, /* 19 integer digits */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char doc[512];
        tensor_doc(doc, sizeof doc, cases[i].dtype, 2, cases[i].data, cases[i].before);
        json_scan_t s = scan_ok(doc, cases[i].limit);
        ck_assert_msg(!s.spans[0].values, "%s read by the scanner", doc);
        ck_assert_uint_eq(s.spans[0].len, strlen(cases[i].data));
        json_scan_done(&s);
    }
    /* At the limit exactly, the list is read. */
    char doc[512];
    tensor_doc(doc, sizeof doc, "f32", 2, "[1, 2]", true);
    json_scan_t s = scan_ok(doc, 8);
    ck_assert_ptr_nonnull(s.spans[0].values);
    json_scan_done(&s);
}
END_TEST

/* Numbers that JSON (and jansson) refuse, which the parser alone would take or read
 * differently: the document is not JSON, with the error and offset that the scanner's general
 * check gives, whatever the dtype. */
START_TEST(test_scan_refuses_malformed_numbers_as_jansson_does)
{
    static const struct {
        const char *data;
        int at; /* the error's offset in data */
        const char *why;
    } cases[] = {
        {"[01, 2]", 2, "',' or ']' expected"},
        {"[-01, 2]", 3, "',' or ']' expected"},
        {"[00, 2]", 2, "',' or ']' expected"},
        {"[-, 2]", 1, "invalid token"},
        {"[1., 2]", 1, "invalid token"},
        {"[1, 2.]", 4, "invalid token"},
        {"[.5, 2]", 1, "invalid token"},
        {"[-.5, 2]", 1, "invalid token"},
        {"[+1, 2]", 1, "invalid token"},
        {"[1e, 2]", 1, "invalid token"},
        {"[1e+, 2]", 1, "invalid token"},
        {"[1.e5, 2]", 1, "invalid token"},
        {"[1.5.2, 2]", 4, "',' or ']' expected"},
        {"[1e5e5, 2]", 4, "',' or ']' expected"},
        {"[0x1, 2]", 2, "',' or ']' expected"},
        {"[NaN, 2]", 1, "invalid token"},
        {"[Infinity, 2]", 1, "invalid token"},
        {"[-Infinity, 2]", 1, "invalid token"},
        {"[1, inf]", 4, "invalid token"},
        {"[1, 1e999999]", 4, "real number overflow"},
        {"[1, -2e400]", 4, "real number overflow"},
        {"[1, 99999999999999999999]", 4, "too big integer"},
        {"[1, -9223372036854775809]", 4, "too big negative integer"},
        {"[1 2]", 3, "',' or ']' expected"},
        {"[1, 2,]", 6, "invalid token"},
        {"[1, 2", 5, "',' or ']' expected"},
    };
    static const char *const dtypes[] = {"f32", "f64", "i32"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (size_t k = 0; k < 3; k++) {
            char doc[512];
            tensor_doc(doc, sizeof doc, dtypes[k], 2, cases[i].data, true);
            size_t data_at = (size_t)(strstr(doc, "\"data\": ") + 8 - doc);
            json_scan_t s;
            json_scan_error_t err;
            int r = json_scan(doc, strlen(doc), 4, 1 << 20, &s, &err);
            ck_assert_msg(r == -EINVAL, "%s (%s): %d", cases[i].data, dtypes[k], r);
            ck_assert_str_eq(err.text, cases[i].why);
            ck_assert_msg(err.offset == data_at + (size_t)cases[i].at, "%s: error at %zu",
                          cases[i].data, err.offset - data_at);
            /* jansson refuses the same document. */
            json_error_t jerr;
            json_t *v = json_loads(doc, 0, &jerr);
            ck_assert_msg(!v, "jansson takes %s", doc);
        }
}
END_TEST

/* --- the jobs built from the spans --- */

/* The daemon's defaults: a tensor of up to 256 MiB, 4,096 jobs a request. */
static const config_t *test_config(void)
{
    static config_t cfg;
    if (!cfg.max_tensor_bytes) config_defaults(&cfg);
    return &cfg;
}

/* job_json_parse_body() of text against job_json_parse_request() of jansson's tree of it: the
 * same result, the same error, the same tensor bytes. Returns the result. */
static int parse_both(const char *text, api_error_t *ret_err)
{
    job_json_env_t env = {.cfg = test_config(),
                          .owner = "alice",
                          .now_us = 1700000000000000LL,
                          .find_op = fake_find_op};
    job_t **jobs = NULL, **tree_jobs = NULL;
    size_t n = 0, tree_n = 0;
    bool is_list;
    api_error_t err = {0}, tree_err = {0};
    int r = job_json_parse_body(text, strlen(text), &env, NULL, &jobs, &n, &is_list, &err);
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_DECODE_ANY, &jerr);
    ck_assert_msg(root, "%s: %s", text, jerr.text);
    int tree_r = job_json_parse_request(root, &env, NULL, &tree_jobs, &tree_n, &is_list, &tree_err);
    json_decref(root);
    ck_assert_int_eq(r, tree_r);
    if (r < 0) {
        ck_assert_str_eq(err.code, tree_err.code);
        ck_assert_str_eq(err.field, tree_err.field);
        ck_assert_str_eq(err.message, tree_err.message);
        *ret_err = err;
        return r;
    }
    ck_assert_uint_eq(n, tree_n);
    /* Each job's x and y (tadd's two inputs; an absent one has no bytes), byte for byte. */
    for (size_t k = 0; k < 2 * n; k++) {
        const job_tensor_t *t = &jobs[k / 2]->in[k % 2], *tree_t = &tree_jobs[k / 2]->in[k % 2];
        ck_assert_uint_eq(t->nbytes, tree_t->nbytes);
        ck_assert(!t->nbytes || memcmp(t->data, tree_t->data, t->nbytes) == 0);
    }
    job_json_free_jobs(jobs, n);
    job_json_free_jobs(tree_jobs, tree_n);
    return 0;
}

/* Values the scanner read become the tensor when they fit it; when they do not (their count,
 * a dtype that jansson decodes to another), the codec reads the text and says why, as it
 * says for the tree. */
START_TEST(test_body_jobs_hold_what_the_codec_would_read)
{
    static const struct {
        const char *x, *field, *message; /* field NULL: accepted */
    } cases[] = {
        {"{\"dtype\": \"f32\", \"shape\": [3], \"data\": [0.1, -2.5e-3, 1e-50]}", NULL, NULL},
        {"{\"dtype\": \"f64\", \"shape\": [3], \"data\": [0.1, -2.5e-3, 1e-320]}", NULL, NULL},
        {"{\"dtype\": \"f32\", \"shape\": [2, 2], \"data\": [1, 2, 3, 4]}", NULL, NULL},
        {"{\"dtype\": \"f32\", \"shape\": [], \"data\": [7.5]}", NULL, NULL},
        {"{\"shape\": [2], \"data\": [0.1, 0.2], \"dtype\": \"f32\"}", NULL, NULL},
        {"{\"dtype\": \"f32\", \"shape\": [2], \"data\": [1.5, \"-inf\"]}", NULL, NULL},
        {"{\"dtype\": \"f32\", \"shape\": [3], \"data\": [1, 2]}", "inputs.x.data",
         "data has 2 values but shape [3] needs 3"},
        {"{\"dtype\": \"f32\", \"shape\": [1], \"data\": [1, 2]}", "inputs.x.data",
         "data has 2 values but shape [1] needs 1"},
        {"{\"dtype\": \"f32\", \"shape\": [2], \"data\": [1, 3.5e38]}", "inputs.x.data[1]",
         "3.5e+38 is out of range for dtype f32"},
        {"{\"dtype\": \"f32\", \"shape\": [2], \"data\": [-1e39, 1]}", "inputs.x.data[0]",
         "-1e+39 is out of range for dtype f32"},
        {"{\"dtype\": \"f16\", \"shape\": [2], \"data\": [1, 70000]}", "inputs.x.data[1]",
         "70000 is out of range for dtype f16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char doc[512];
        snprintf(doc, sizeof doc, "{\"op\": \"tadd\", \"inputs\": {\"x\": %s}}", cases[i].x);
        api_error_t err;
        int r = parse_both(doc, &err);
        if (!cases[i].field) {
            ck_assert_msg(r == 0, "%s: %s %s", doc, err.field, err.message);
            continue;
        }
        ck_assert_msg(r == -EINVAL, "%s accepted", doc);
        ck_assert_str_eq(err.field, cases[i].field);
        ck_assert_str_eq(err.message, cases[i].message);
    }
    /* A repeated key, which jansson refuses in the skeleton after the scanner read the data
     * (a tree built without that check would take it): not JSON, the block freed. */
    static const char dup[] = "{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", "
                              "\"shape\": [2], \"data\": [1, 2], \"dtype\": \"f64\"}}}";
    job_json_env_t env = {.cfg = test_config(), .owner = "alice", .find_op = fake_find_op};
    job_t **jobs;
    size_t n;
    bool is_list;
    api_error_t err;
    ck_assert_int_eq(job_json_parse_body(dup, strlen(dup), &env, NULL, &jobs, &n, &is_list, &err),
                     -EINVAL);
    ck_assert_str_eq(err.code, "invalid_json");
}
END_TEST

/* A list of jobs, each tensor's block its own; a later job's error frees the earlier blocks
 * (the sanitizers and valgrind would see a leak). */
START_TEST(test_body_lists_read_each_tensor)
{
    api_error_t err;
    ck_assert_int_eq(
        parse_both("[{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [2], "
                   "\"data\": [1, 2]}, \"y\": {\"dtype\": \"f32\", \"shape\": [2], \"data\": "
                   "[3, 4]}}}, {\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f64\", "
                   "\"shape\": [1], \"data\": [0.1]}}}]",
                   &err),
        0);
    ck_assert_int_eq(
        parse_both("[{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [2], "
                   "\"data\": [1, 2]}}}, {\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": "
                   "\"f32\", \"shape\": [2], \"data\": [1, 2, 3]}}}]",
                   &err),
        -EINVAL);
    ck_assert_str_eq(err.field, "[1].inputs.x.data");
}
END_TEST

static Suite *json_scan_suite(void)
{
    Suite *s = suite_create("api_json_scan");
    TCase *scan = tcase_create("scan");
    tcase_add_test(scan, test_scan_reads_a_flat_list_of_reals_as_it_checks_it);
    tcase_add_test(scan, test_scan_leaves_other_data_to_the_codec);
    tcase_add_test(scan, test_scan_refuses_malformed_numbers_as_jansson_does);
    suite_add_tcase(s, scan);
    TCase *jobs = tcase_create("jobs");
    tcase_add_test(jobs, test_body_jobs_hold_what_the_codec_would_read);
    tcase_add_test(jobs, test_body_lists_read_each_tensor);
    suite_add_tcase(s, jobs);
    return s;
}

int main(void)
{
    return run_suite(json_scan_suite());
}
