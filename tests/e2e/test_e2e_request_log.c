/* End-to-end: every HTTP request gets one info line in the daemon's log, naming its method,
 * its route pattern (not the raw path), its user, status, body bytes and duration, and the id
 * that its answer carried in X-Request-Id; in both log formats, and in json format every line
 * of the log is one JSON object. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* Sends a request and returns its answer's X-Request-Id (into id, 64 bytes), its status and
 * its body length. */
static long request_with_id(e2e_daemon_t *d, const char *method, const char *path,
                            const char *json_body, char *id, size_t *ret_bytes)
{
    const char *headers[] = {"Content-Type: application/json", NULL};
    e2e_response_t resp;
    ck_assert_int_eq(e2e_http_request(d, method, path, headers, json_body,
                                      json_body ? strlen(json_body) : 0, &resp),
                     0);
    ck_assert_ptr_nonnull(e2e_response_header(&resp, "X-Request-Id", id, 64));
    ck_assert_uint_eq(strlen(id), 16);
    ck_assert_uint_eq(strspn(id, "0123456789abcdef"), 16);
    long status = resp.status;
    *ret_bytes = resp.body_len;
    e2e_response_clear(&resp);
    return status;
}

/* The log line that holds text, copied into line (4096 bytes); waits up to 5 s, since the
 * daemon writes it after the answer is queued. */
static void log_line_with(e2e_daemon_t *d, const char *text, char *line)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/gpujobd.log", e2e_daemon_dir(d));
    for (int tries = 0; tries < 500; tries++) {
        FILE *f = fopen(path, "r");
        ck_assert_ptr_nonnull(f);
        bool found = false;
        while (!found && fgets(line, 4096, f))
            found = strstr(line, text) != NULL;
        fclose(f);
        if (found) return;
        usleep(10000);
    }
    ck_abort_msg("no log line holds '%s'", text);
}

START_TEST(test_text_line_names_route_user_status_bytes_and_the_answers_id)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    char id[64], line[4096], want[512];
    size_t bytes;
    long status = request_with_id(d, "GET", "/v1/jobs/j0000000000000000000000ff", NULL, id, &bytes);
    ck_assert_int_eq(status, 404);
    char key[80];
    snprintf(key, sizeof key, "request_id=%s", id);
    log_line_with(d, key, line);
    snprintf(want, sizeof want,
             " info request method=GET route=/v1/jobs/{id} user=%s status=404 bytes=%zu us=",
             e2e_caller_name(), bytes);
    ck_assert_msg(strstr(line, want), "line '%s' lacks '%s'", line, want);
    /* The id is the request's own: a second request gets another, on a line of its own. */
    char id2[64];
    request_with_id(d, "GET", "/nowhere", NULL, id2, &bytes);
    ck_assert_str_ne(id, id2);
    snprintf(key, sizeof key, "request_id=%s", id2);
    log_line_with(d, key, line);
    snprintf(want, sizeof want, "method=GET route=- user=%s status=404", e2e_caller_name());
    ck_assert_msg(strstr(line, want), "line '%s' lacks '%s'", line, want);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_json_line_parses_and_carries_the_fields_of_the_request)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[server]\nlog_format = json\n");
    char id[64], line[4096];
    size_t bytes;
    const char *job = "{\"op\": \"add\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [2], "
                      "\"data\": [1, 2]}, \"y\": {\"dtype\": \"f32\", \"shape\": [2], \"data\": "
                      "[3, 4]}}}";
    ck_assert_int_eq(request_with_id(d, "POST", "/v1/jobs?wait=5", job, id, &bytes), 201);
    log_line_with(d, id, line);
    json_error_t jerr;
    json_t *o = json_loads(line, 0, &jerr);
    ck_assert_msg(o, "line '%s' is not JSON: %s", line, jerr.text);
    ck_assert_str_eq(json_string_value(json_object_get(o, "level")), "info");
    ck_assert_str_eq(json_string_value(json_object_get(o, "msg")), "request");
    ck_assert_uint_eq(strlen(json_string_value(json_object_get(o, "ts"))), 24);
    ck_assert_str_eq(json_string_value(json_object_get(o, "method")), "POST");
    ck_assert_str_eq(json_string_value(json_object_get(o, "route")), "/v1/jobs");
    ck_assert_str_eq(json_string_value(json_object_get(o, "user")), e2e_caller_name());
    ck_assert_int_eq(json_integer_value(json_object_get(o, "status")), 201);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "bytes")), (json_int_t)bytes);
    ck_assert(json_is_integer(json_object_get(o, "us")));
    ck_assert_int_ge(json_integer_value(json_object_get(o, "us")), 0);
    ck_assert_str_eq(json_string_value(json_object_get(o, "request_id")), id);
    json_decref(o);

    /* Every line the daemon wrote, the startup ones too, is one JSON object with ts, level
     * and msg. */
    char path[4096];
    snprintf(path, sizeof path, "%s/gpujobd.log", e2e_daemon_dir(d));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        o = json_loads(line, 0, &jerr);
        ck_assert_msg(json_is_object(o), "line '%s' is not a JSON object: %s", line, jerr.text);
        ck_assert(json_is_string(json_object_get(o, "ts")));
        ck_assert(json_is_string(json_object_get(o, "level")));
        ck_assert(json_is_string(json_object_get(o, "msg")));
        json_decref(o);
        lines++;
    }
    fclose(f);
    ck_assert_int_gt(lines, 2);
    e2e_daemon_free(d);
}
END_TEST

static Suite *request_log_suite(void)
{
    Suite *s = suite_create("e2e_request_log");
    TCase *tc = tcase_create("request_log");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_text_line_names_route_user_status_bytes_and_the_answers_id);
    tcase_add_test(tc, test_json_line_parses_and_carries_the_fields_of_the_request);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(request_log_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
