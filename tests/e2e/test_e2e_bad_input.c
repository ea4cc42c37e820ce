/* End-to-end: malformed requests against the real gpujobd. Each one answers its documented
 * status and error code (and field, where the API names one), creates no job, and leaves the
 * daemon serving. */
/* POSIX and XSI (nftw). */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700
#include <arpa/inet.h>
#include <check.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* Small limits so that the size cases need small bodies; uploads past 1 KiB stream to disk. */
static const char limits_config[] = "[limits]\n"
                                    "max_body_bytes = 65536\n"
                                    "max_tensor_bytes = 4096\n"
                                    "[store]\n"
                                    "inline_blob_bytes = 1024\n";

#define X_F32 "{\"dtype\":\"f32\",\"shape\":[2],\"data\":[1,2]}"
#define Y_F32 "{\"dtype\":\"f32\",\"shape\":[2],\"data\":[3,4]}"
#define ADD_WITH_X(x) "{\"op\":\"add\",\"inputs\":{\"x\":" x ",\"y\":" Y_F32 "}}"
#define GOOD_ADD ADD_WITH_X(X_F32)
#define UNKNOWN_JOB "j000000000000000000000000"
/* A job whose tensors are in the body's binary section (Gpujob-Json-Length), x at 0 and y at
 * 4; with 8 bytes of binary section, y's 8 bytes pass its end. */
#define BIN_JOB(x_at)                                                                              \
    "{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[2],\"binary_offset\":" x_at   \
    "},\"y\":{\"dtype\":\"f32\",\"shape\":[2],\"binary_offset\":4}}}"
#define BIN_BYTES "\0\0\0\0\0\0\0\0"
_Static_assert(sizeof BIN_JOB("0") - 1 == 123 && sizeof BIN_JOB("-4") - 1 == 124,
               "the Gpujob-Json-Length headers below give these lengths");

/* One malformed request and what it must answer. In path, "{JOB}" is replaced by the id of a
 * succeeded job. field: NULL is not checked, "" must be absent, "name*" is a prefix, else
 * exact. */
typedef struct bad_case {
    const char *what;
    const char *method;
    const char *path;
    const char *content_type;
    const char *header; /* one extra header, or NULL */
    const void *body;   /* NULL for none */
    size_t body_len;    /* 0: strlen(body) */
    long status;
    const char *code; /* NULL: any code */
    const char *field;
} bad_case_t;

static const bad_case_t text_cases[] = {
    {"broken JSON", "POST", "/v1/jobs", "application/json", NULL, "{\"op\" \"add\"}", 0, 400,
     "invalid_json", NULL},
    {"truncated JSON", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"f32\"", 0, 400, "invalid_json", NULL},
    {"empty body", "POST", "/v1/jobs", "application/json", NULL, "", 0, 400, "invalid_json", NULL},
    {"JSON number, not an object", "POST", "/v1/jobs", "application/json", NULL, "42", 0, 400,
     "invalid_argument", NULL},
    {"JSON string, not an object", "POST", "/v1/jobs", "application/json", NULL, "\"add\"", 0, 400,
     "invalid_argument", NULL},
    {"JSON null", "POST", "/v1/jobs", "application/json", NULL, "null", 0, 400, "invalid_argument",
     NULL},
    {"unknown op", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"frobnicate\",\"inputs\":{\"x\":" X_F32 "}}", 0, 400, "invalid_argument", "op"},
    {"missing op", "POST", "/v1/jobs", "application/json", NULL,
     "{\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}", 0, 400, "invalid_argument", "op"},
    {"op not a string", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":5,\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}", 0, 400, "invalid_argument", "op"},
    {"wrong dtype name", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"float32\",\"shape\":[2],\"data\":[1,2]}"), 0, 400, "invalid_argument",
     "inputs.x.dtype"},
    {"dtype mismatch between x and y", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"i32\",\"shape\":[2],\"data\":[1,2]}"), 0, 400, "invalid_argument",
     "inputs.y.dtype"},
    {"shape and data count differ", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"f32\",\"shape\":[3],\"data\":[1,2]}"), 0, 400, "invalid_argument",
     "inputs.x*"},
    {"negative dim", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"f32\",\"shape\":[-1],\"data\":[]}"), 0, 400, "invalid_argument",
     "inputs.x.shape"},
    {"overflowing dims", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"f32\",\"shape\":[1099511627776,1099511627776],\"data\":[1]}"), 0, 400,
     "invalid_argument", "inputs.x.shape"},
    {"9 dims", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"f32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data\":[1]}"), 0, 400,
     "invalid_argument", "inputs.x.shape"},
    {"shape not an array", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"f32\",\"shape\":\"2\",\"data\":[1,2]}"), 0, 400, "invalid_argument",
     "inputs.x.shape"},
    {"bad base64", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"f32\",\"shape\":[2],\"b64\":\"@@@@!!!!\"}"), 0, 400,
     "invalid_argument", "inputs.x*"},
    {"base64 length differs from the shape's bytes", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"f32\",\"shape\":[2],\"b64\":\"AAAAAA==\"}"), 0, 400,
     "invalid_argument", "inputs.x*"},
    {"i8 value 300", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"i8\",\"shape\":[2],\"data\":[1,300]},"
     "\"y\":{\"dtype\":\"i8\",\"shape\":[2],\"data\":[1,1]}}}",
     0, 400, "invalid_argument", "inputs.x*"},
    {"float data for an i32 tensor", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"i32\",\"shape\":[2],\"data\":[1.5,2]},"
     "\"y\":{\"dtype\":\"i32\",\"shape\":[2],\"data\":[1,1]}}}",
     0, 400, "invalid_argument", "inputs.x*"},
    {"unknown buffer id", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"buffer\":\"b000000000000000000000000\"}"), 0, 404, "not_found", "inputs.x*"},
    {"unknown top-level key", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"bogus\":1,\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}", 0, 400,
     "invalid_argument", "bogus"},
    {"unknown param", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"saxpy\",\"params\":{\"a\":1,\"b\":2},\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}",
     0, 400, "invalid_argument", "params.b"},
    {"missing required param", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"saxpy\",\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}", 0, 400, "invalid_argument",
     "params.a"},
    {"params not an object", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"saxpy\",\"params\":[1],\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}", 0, 400,
     "invalid_argument", "params"},
    {"missing required input", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"inputs\":{\"x\":" X_F32 "}}", 0, 400, "invalid_argument", "inputs.y"},
    {"unknown input name", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 ",\"z\":" X_F32 "}}", 0, 400,
     "invalid_argument", "inputs.z"},
    {"inputs not an object", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"inputs\":[1]}", 0, 400, "invalid_argument", "inputs"},
    {"array with one bad element", "POST", "/v1/jobs", "application/json", NULL,
     "[" GOOD_ADD "," GOOD_ADD "," GOOD_ADD
     "," ADD_WITH_X("{\"dtype\":\"f99\",\"shape\":[2],\"data\":[1,2]}") "]",
     0, 400, "invalid_argument", "[3].inputs.x.dtype"},
    {"priority out of range", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"priority\":101,\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}", 0, 400,
     "invalid_argument", "priority"},
    {"priority not an integer", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"priority\":\"high\",\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}", 0, 400,
     "invalid_argument", "priority"},
    {"negative deadline_ms", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"deadline_ms\":-5,\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}", 0, 400,
     "invalid_argument", "deadline_ms"},
    {"negative device", "POST", "/v1/jobs", "application/json", NULL,
     "{\"op\":\"add\",\"device\":-2,\"inputs\":{\"x\":" X_F32 ",\"y\":" Y_F32 "}}", 0, 400,
     "invalid_argument", "device"},
    {"idempotency key too long", "POST", "/v1/jobs", "application/json",
     "Idempotency-Key: "
     "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"
     "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
     GOOD_ADD, 0, 400, "invalid_argument", NULL},
    {"malformed job id in the path", "GET", "/v1/jobs/not-an-id", NULL, NULL, NULL, 0, 400,
     "invalid_argument", "id"},
    {"unknown job id", "GET", "/v1/jobs/" UNKNOWN_JOB, NULL, NULL, NULL, 0, 404, "not_found", NULL},
    {"cancel of an unknown job", "DELETE", "/v1/jobs/" UNKNOWN_JOB, NULL, NULL, NULL, 0, 404,
     "not_found", NULL},
    {"wait for an unknown job", "GET", "/v1/jobs/" UNKNOWN_JOB "/wait?timeout=0", NULL, NULL, NULL,
     0, 404, "not_found", NULL},
    {"malformed buffer id in the path", "GET", "/v1/buffers/xyz", NULL, NULL, NULL, 0, 400,
     "invalid_argument", "id"},
    {"list: state=foo", "GET", "/v1/jobs?state=foo", NULL, NULL, NULL, 0, 400, "invalid_argument",
     "query.state"},
    {"list: limit=0", "GET", "/v1/jobs?limit=0", NULL, NULL, NULL, 0, 400, "invalid_argument",
     "query.limit"},
    {"list: limit=abc", "GET", "/v1/jobs?limit=abc", NULL, NULL, NULL, 0, 400, "invalid_argument",
     "query.limit"},
    {"list: limit=1001", "GET", "/v1/jobs?limit=1001", NULL, NULL, NULL, 0, 400, "invalid_argument",
     "query.limit"},
    {"list: unknown op", "GET", "/v1/jobs?op=frobnicate", NULL, NULL, NULL, 0, 400,
     "invalid_argument", "query.op"},
    {"list: bad cursor", "GET", "/v1/jobs?after=%25%25%25", NULL, NULL, NULL, 0, 400,
     "invalid_argument", "query.after"},
    {"wait: timeout=-1", "GET", "/v1/jobs/{JOB}/wait?timeout=-1", NULL, NULL, NULL, 0, 400,
     "invalid_argument", "query.timeout"},
    {"wait: timeout=abc", "GET", "/v1/jobs/{JOB}/wait?timeout=abc", NULL, NULL, NULL, 0, 400,
     "invalid_argument", "query.timeout"},
    {"wait: timeout over max_wait_ms", "GET", "/v1/jobs/{JOB}/wait?timeout=100000", NULL, NULL,
     NULL, 0, 400, "invalid_argument", "query.timeout"},
    {"unknown output name", "GET", "/v1/jobs/{JOB}/outputs/nope", NULL, NULL, NULL, 0, 404,
     "not_found", NULL},
    {"cancel of a finished job", "DELETE", "/v1/jobs/{JOB}", NULL, NULL, NULL, 0, 409, "conflict",
     NULL},
    {"PUT /v1/jobs", "PUT", "/v1/jobs", "application/json", NULL, GOOD_ADD, 0, 405, NULL, NULL},
    {"DELETE /healthz", "DELETE", "/healthz", NULL, NULL, NULL, 0, 405, NULL, NULL},
    {"POST /v1/info", "POST", "/v1/info", "application/json", NULL, "{}", 0, 405, NULL, NULL},
    {"PATCH /v1/jobs/{id}", "PATCH", "/v1/jobs/{JOB}", "application/json", NULL, "{}", 0, 405, NULL,
     NULL},
    {"unknown path", "GET", "/nope", NULL, NULL, NULL, 0, 404, "not_found", NULL},
    {"unknown path under v1", "GET", "/v1/jobs/{JOB}/bogus", NULL, NULL, NULL, 0, 404, "not_found",
     NULL},
    {"binary section: y's bytes pass its end", "POST", "/v1/jobs", "application/octet-stream",
     "Gpujob-Json-Length: 123", BIN_JOB("0") BIN_BYTES, sizeof BIN_JOB("0") - 1 + 8, 400,
     "invalid_argument", "inputs.y.binary_offset"},
    {"binary section: negative binary_offset", "POST", "/v1/jobs", "application/octet-stream",
     "Gpujob-Json-Length: 124", BIN_JOB("-4") BIN_BYTES, sizeof BIN_JOB("-4") - 1 + 8, 400,
     "invalid_argument", "inputs.x.binary_offset"},
    {"binary section sent as application/json", "POST", "/v1/jobs", "application/json",
     "Gpujob-Json-Length: 123", BIN_JOB("0") BIN_BYTES, sizeof BIN_JOB("0") - 1 + 8, 415,
     "unsupported_media_type", "header.Content-Type"},
    {"Gpujob-Json-Length past the body", "POST", "/v1/jobs", "application/octet-stream",
     "Gpujob-Json-Length: 99999", BIN_JOB("0") BIN_BYTES, sizeof BIN_JOB("0") - 1 + 8, 400,
     "invalid_argument", "header.Gpujob-Json-Length"},
    {"Gpujob-Json-Length not a byte count", "POST", "/v1/jobs", "application/octet-stream",
     "Gpujob-Json-Length: 1e2", BIN_JOB("0") BIN_BYTES, sizeof BIN_JOB("0") - 1 + 8, 400,
     "invalid_argument", "header.Gpujob-Json-Length"},
    {"binary_offset without a binary section", "POST", "/v1/jobs", "application/json", NULL,
     BIN_JOB("0"), 0, 400, "invalid_argument", "inputs.x.binary_offset"},
    {"binary_offset and b64 together", "POST", "/v1/jobs", "application/json", NULL,
     ADD_WITH_X("{\"dtype\":\"f32\",\"shape\":[2],\"binary_offset\":0,\"b64\":\"AAAAAAAAAAA=\"}"),
     0, 400, "invalid_argument", "inputs.x"},
    {"raw buffer with a bad dtype", "POST", "/v1/buffers?dtype=f33&shape=2",
     "application/octet-stream", NULL, "\0\0\0\0\0\0\0\0", 8, 400, "invalid_argument",
     "query.dtype"},
    {"raw buffer whose bytes do not match the shape", "POST", "/v1/buffers?dtype=f32&shape=4",
     "application/octet-stream", NULL, "\0\0\0\0\0\0\0\0", 8, 400, "invalid_argument", NULL},
};

/* Builds a .npy with a hand-written header dict (padded to 64 bytes) followed by data_len
 * zero bytes; magic replaces the 6-byte magic when not NULL. */
static void *npy_with_header(const char *magic, const char *dict, size_t data_len, size_t *ret_len)
{
    size_t n = strlen(dict), padded = (10 + n + 1 + 63) / 64 * 64;
    unsigned char *f = calloc(1, padded + data_len);
    ck_assert(f != NULL);
    memcpy(f, magic ? magic : "\x93NUMPY", 6);
    f[6] = 1;
    f[7] = 0;
    f[8] = (unsigned char)((padded - 10) & 0xff);
    f[9] = (unsigned char)((padded - 10) >> 8);
    memset(f + 10, ' ', padded - 10);
    memcpy(f + 10, dict, n);
    f[padded - 1] = '\n';
    *ret_len = padded + data_len;
    return f;
}

/* Mismatches are collected rather than asserted one by one, so that one run reports every
 * case the daemon gets wrong. */
static int n_failures;

static void report(const bad_case_t *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void report(const bad_case_t *c, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s (%s %s): ", c->what, c->method, path);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    n_failures++;
}

static void expect_case(e2e_daemon_t *d, const bad_case_t *c, const char *job_id)
{
    char path[512];
    const char *mark = strstr(c->path, "{JOB}");
    if (mark)
        snprintf(path, sizeof path, "%.*s%s%s", (int)(mark - c->path), c->path, job_id, mark + 5);
    else
        snprintf(path, sizeof path, "%s", c->path);
    char ctype[128];
    const char *hdrs[3] = {NULL, NULL, NULL};
    int nh = 0;
    if (c->content_type) {
        snprintf(ctype, sizeof ctype, "Content-Type: %s", c->content_type);
        hdrs[nh++] = ctype;
    }
    if (c->header) hdrs[nh++] = c->header;
    size_t len = c->body ? (c->body_len ? c->body_len : strlen(c->body)) : 0;
    e2e_response_t resp;
    if (e2e_http_request(d, c->method, path, hdrs, c->body, len, &resp) < 0) {
        report(c, path, "no response");
        return;
    }
    if (resp.status != c->status)
        report(c, path, "status %ld, expected %ld; body %.300s", resp.status, c->status, resp.body);
    const json_t *error = json_object_get(resp.json, "error");
    const char *message = json_string_value(json_object_get(error, "message"));
    const char *code = e2e_error_code(resp.json);
    if (!json_is_object(error))
        report(c, path, "the body is not an error object: %.300s", resp.body);
    else if (!message || !*message)
        report(c, path, "the error has no message");
    if (c->code && strcmp(code, c->code) != 0)
        report(c, path, "code '%s', expected '%s'", code, c->code);
    else if (!c->code && !*code)
        report(c, path, "the error has no code");
    if (c->field) {
        const char *field = e2e_error_field(resp.json);
        size_t n = strlen(c->field);
        bool prefix = n > 0 && c->field[n - 1] == '*';
        bool ok = prefix ? strncmp(field, c->field, n - 1) == 0 : strcmp(field, c->field) == 0;
        if (!ok) report(c, path, "field '%s', expected '%s'", field, c->field);
    }
    char allow[256];
    if (c->status == 405 && !e2e_response_header(&resp, "Allow", allow, sizeof allow))
        report(c, path, "405 without an Allow header");
    e2e_response_clear(&resp);
}

/* Sends a request whose Content-Length promises more than it sends, then closes its side.
 * Returns what came back before the daemon closed (maybe nothing). */
static void send_truncated_body(e2e_daemon_t *d, char *reply, size_t size)
{
    int fd = e2e_raw_post_start_ok(d, "/v1/jobs", "application/json", 1000);
    static const char part[] = "{\"op\":\"add\",\"inputs\":{\"x\":";
    e2e_write_all_ok(fd, part, sizeof part - 1);
    shutdown(fd, SHUT_WR);
    e2e_read_reply(fd, reply, size);
    close(fd);
}

START_TEST(test_malformed_requests_answer_clear_errors)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(limits_config);

    /* A succeeded job for the routes that need one. */
    json_t *good = json_loads(GOOD_ADD, 0, NULL);
    char *job_id = e2e_submit_ok(d, good);
    json_t *done = e2e_wait_final_ok(d, job_id, 30);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    json_decref(done);
    long jobs_before = e2e_count_jobs_ok(d, "");

    int n_cases = 0;
    for (size_t i = 0; i < sizeof text_cases / sizeof text_cases[0]; i++, n_cases++)
        expect_case(d, &text_cases[i], job_id);

    /* Size limits: a tensor over max_tensor_bytes (4096) in a body under max_body_bytes. */
    json_t *data = json_array();
    for (int i = 0; i < 2048; i++)
        json_array_append_new(data, json_integer(1));
    json_t *big = json_pack("{s:s, s:{s:{s:s, s:[i], s:o}, s:{s:s, s:[i], s:[i]}}}", "op", "add",
                            "inputs", "x", "dtype", "f32", "shape", 2048, "data", data, "y",
                            "dtype", "f32", "shape", 1, "data", 1);
    char *big_text = json_dumps(big, JSON_COMPACT);
    bad_case_t tensor_case = {"tensor over max_tensor_bytes",
                              "POST",
                              "/v1/jobs",
                              "application/json",
                              NULL,
                              big_text,
                              0,
                              413,
                              "payload_too_large",
                              "inputs.x*"};
    expect_case(d, &tensor_case, job_id);
    n_cases++;
    /* A body over max_body_bytes (65536). */
    size_t huge_len = 100000;
    char *huge = malloc(huge_len + 1);
    memset(huge, ' ', huge_len);
    memcpy(huge, GOOD_ADD, strlen(GOOD_ADD));
    huge[huge_len] = '\0';
    bad_case_t body_case = {"body over max_body_bytes",
                            "POST",
                            "/v1/jobs",
                            "application/json",
                            NULL,
                            huge,
                            huge_len,
                            413,
                            "payload_too_large",
                            NULL};
    expect_case(d, &body_case, job_id);
    n_cases++;

    /* .npy uploads with lying or unsupported headers. */
    static const struct {
        const char *what, *magic, *dict;
        size_t data_len;
    } npy_cases[] = {
        {"npy: bad magic", "\x93NUMPZ", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
         8},
        {"npy: fortran_order True", NULL,
         "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16},
        {"npy: big-endian", NULL, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8},
        {"npy: header lies about the size", NULL,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (100,), }", 8},
        {"npy: object dtype", NULL, "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16},
        /* Past store.inline_blob_bytes an upload streams to disk as it arrives: the same
         * mistakes are told the same way. */
        {"npy, streamed: bad magic", "\x93NUMPZ",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (1000,), }", 4000},
        {"npy, streamed: big-endian", NULL,
         "{'descr': '>f4', 'fortran_order': False, 'shape': (1000,), }", 4000},
        {"npy, streamed: more data than the header says", NULL,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (100,), }", 4000},
        {"npy, streamed: less data than the header says", NULL,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (1000,), }", 2000},
    };
    for (size_t i = 0; i < sizeof npy_cases / sizeof npy_cases[0]; i++, n_cases++) {
        size_t len;
        void *npy =
            npy_with_header(npy_cases[i].magic, npy_cases[i].dict, npy_cases[i].data_len, &len);
        bad_case_t c = {
            npy_cases[i].what,  "POST", "/v1/buffers", "application/x-npy", NULL, npy, len, 400,
            "invalid_argument", NULL};
        expect_case(d, &c, job_id);
        free(npy);
    }

    /* A body cut short by the client: whatever comes back is not a success. */
    char reply[4096];
    send_truncated_body(d, reply, sizeof reply);
    n_cases++;
    ck_assert_msg(strncmp(reply, "HTTP/1.1 2", 10) != 0 && strncmp(reply, "HTTP/1.0 2", 10) != 0,
                  "a truncated body was accepted: %.200s", reply);

    fprintf(stderr, "%d malformed requests checked, %d mismatches\n", n_cases, n_failures);
    ck_assert_int_ge(n_cases, 40);

    /* Nothing was created, and the daemon still serves. */
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), jobs_before);
    ck_assert_msg(e2e_daemon_alive(d), "gpujobd died");
    json_t *health = e2e_json_ok(d, "GET", "/healthz", NULL, 200);
    ck_assert_str_eq(json_string_value(json_object_get(health, "status")), "ok");
    json_decref(health);
    char *id2 = e2e_submit_ok(d, good);
    done = e2e_wait_final_ok(d, id2, 30);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    double out[2];
    ck_assert_int_eq(
        e2e_json_flatten(
            json_object_get(json_object_get(json_object_get(done, "outputs"), "out"), "data"), out,
            2),
        2);
    ck_assert(out[0] == 4 && out[1] == 6);
    ck_assert_msg(e2e_daemon_alive(d), "gpujobd died");
    ck_assert_msg(n_failures == 0, "%d mismatches with the API's specification (listed above)",
                  n_failures);

    json_decref(done);
    free(id2);
    free(huge);
    free(big_text);
    json_decref(big);
    free(job_id);
    json_decref(good);
    e2e_daemon_free(d);
}
END_TEST

/* One submission whose output the daemon must refuse at the door: its status, code and field,
 * and a message that names the limit when it is the limit that refuses. */
typedef struct output_case {
    const char *what;
    const char *body;
    long status;
    const char *field;
    bool names_limit;
} output_case_t;

/* Outputs computed from small inputs: each over limits.max_tensor_bytes (1 MiB below), or too
 * large to count in 64 bits. */
static const output_case_t output_cases[] = {
    {"quantize of an empty x whose scale's bytes wrap",
     "{\"op\":\"quantize\",\"params\":{\"axis\":1},\"inputs\":{\"x\":{\"dtype\":\"f32\","
     "\"shape\":[0,4611686018427387905],\"data\":[]}}}",
     400, "inputs.x.shape", false},
    {"quantize of an empty f16 x whose scale's bytes overflow",
     "{\"op\":\"quantize\",\"params\":{\"axis\":1},\"inputs\":{\"x\":{\"dtype\":\"f16\","
     "\"shape\":[0,2305843009213693953],\"data\":[]}}}",
     413, "outputs.scale", false},
    {"quantize with 2^20 channels",
     "{\"op\":\"quantize\",\"params\":{\"axis\":1},\"inputs\":{\"x\":{\"dtype\":\"f32\","
     "\"shape\":[0,1048576],\"data\":[]}}}",
     413, "outputs.scale", true},
    {"gemm with k = 0",
     "{\"op\":\"gemm\",\"inputs\":{\"a\":{\"dtype\":\"f32\",\"shape\":[1024,0],\"data\":[]},"
     "\"b\":{\"dtype\":\"f32\",\"shape\":[0,1024],\"data\":[]}}}",
     413, "outputs.out", true},
    {"batched gemm with k = 0",
     "{\"op\":\"gemm\",\"inputs\":{\"a\":{\"dtype\":\"f32\",\"shape\":[16,256,0],\"data\":[]},"
     "\"b\":{\"dtype\":\"f32\",\"shape\":[16,0,256],\"data\":[]}}}",
     413, "outputs.out", true},
    {"conv2d with padding 600",
     "{\"op\":\"conv2d\",\"params\":{\"padding\":600},\"inputs\":{\"x\":{\"dtype\":\"f32\","
     "\"shape\":[1,1,1,1],\"data\":[1]},\"w\":{\"dtype\":\"f32\",\"shape\":[1,1,1,1],"
     "\"data\":[1]}}}",
     413, "outputs.out", true},
    {"conv2d with padding 23000 (8.5 GB)",
     "{\"op\":\"conv2d\",\"params\":{\"padding\":23000},\"inputs\":{\"x\":{\"dtype\":\"f32\","
     "\"shape\":[1,1,1,1],\"data\":[1]},\"w\":{\"dtype\":\"f32\",\"shape\":[1,1,1,1],"
     "\"data\":[1]}}}",
     413, "outputs.out", true},
    {"a list whose second job's output is over the limit",
     "[" GOOD_ADD ",{\"op\":\"gemm\",\"inputs\":{\"a\":{\"dtype\":\"f32\",\"shape\":[1024,0],"
     "\"data\":[]},\"b\":{\"dtype\":\"f32\",\"shape\":[0,1024],\"data\":[]}}}]",
     413, "[1].outputs.out", true},
};

/* dequantize of an i8 q of 2^20 zeros (1 MiB, within the limit) into 4 MiB of f32. */
static char *dequantize_body(void)
{
    size_t n = (size_t)1 << 20;
    void *zeros = calloc(n, 1);
    char *b64 = e2e_base64(zeros, n);
    size_t size = strlen(b64) + 256;
    char *body = malloc(size);
    snprintf(body, size,
             "{\"op\":\"dequantize\",\"inputs\":{\"q\":{\"dtype\":\"i8\",\"shape\":[1048576],"
             "\"b64\":\"%s\"},\"scale\":{\"dtype\":\"f32\",\"shape\":[],\"data\":1}}}",
             b64);
    free(b64);
    free(zeros);
    return body;
}

static void expect_output_refused(e2e_daemon_t *d, const output_case_t *c)
{
    e2e_response_t resp;
    const char *hdrs[] = {"Content-Type: application/json", NULL};
    ck_assert_int_eq(e2e_http_request(d, "POST", "/v1/jobs", hdrs, c->body, strlen(c->body), &resp),
                     0);
    const char *message =
        json_string_value(json_object_get(json_object_get(resp.json, "error"), "message"));
    ck_assert_msg(resp.status == c->status && !strcmp(e2e_error_field(resp.json), c->field),
                  "%s: status %ld field '%s', expected %ld '%s'; body %.300s", c->what, resp.status,
                  e2e_error_field(resp.json), c->status, c->field, resp.body);
    ck_assert_str_eq(e2e_error_code(resp.json),
                     c->status == 413 ? "payload_too_large" : "invalid_argument");
    ck_assert_msg(message && (!c->names_limit || strstr(message, "1048576")),
                  "%s: the message does not name the limit: %s", c->what, message);
    e2e_response_clear(&resp);
}

START_TEST(test_outputs_over_the_tensor_limit_are_refused_at_submission)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[limits]\nmax_tensor_bytes = 1048576\n");
    for (size_t i = 0; i < sizeof output_cases / sizeof output_cases[0]; i++)
        expect_output_refused(d, &output_cases[i]);
    char *deq = dequantize_body();
    output_case_t deq_case = {"dequantize into 4 MiB", deq, 413, "outputs.out", true};
    expect_output_refused(d, &deq_case);
    free(deq);

    /* Nothing was created, and the daemon still runs jobs. */
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 0);
    ck_assert_msg(e2e_daemon_alive(d), "gpujobd died");
    json_t *good = json_loads(GOOD_ADD, 0, NULL);
    char *id = e2e_submit_ok(d, good);
    json_t *done = e2e_wait_final_ok(d, id, 30);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    json_decref(done);
    free(id);
    json_decref(good);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_bad_input");
    TCase *tc = tcase_create("bad_input");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_malformed_requests_answer_clear_errors);
    tcase_add_test(tc, test_outputs_over_the_tensor_limit_are_refused_at_submission);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
