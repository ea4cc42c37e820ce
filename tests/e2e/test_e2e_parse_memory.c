/* End-to-end: what a large JSON body costs the real gpujobd in memory while it is parsed. The
 * daemon's peak resident set (VmHWM, reset through /proc/PID/clear_refs just before the
 * request) may rise by at most three times the body's size, for a job whose data list is
 * read and for a list of jobs refused with 413, and by less than one and a half times for an
 * ephemeral buffer's upload, which it holds once. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/daemon_harness.h"

/* About 16 MiB of body: far above the daemon's own footprint, within the default limits. */
#define BODY_BYTES ((size_t)16 << 20)

/* The value of a "Name:   N kB" line of /proc/PID/status, in bytes. */
static long long proc_status_bytes(pid_t pid, const char *name)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "cannot read %s", path);
    long long kib = -1;
    size_t n = strlen(name);
    while (kib < 0 && fgets(line, sizeof line, f))
        if (strncmp(line, name, n) == 0 && line[n] == ':') kib = atoll(line + n + 1);
    fclose(f);
    ck_assert_msg(kib >= 0, "no %s in %s", name, path);
    return kib * 1024;
}

/* Makes the daemon's VmHWM its current VmRSS and returns that. */
static long long peak_reset(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)pid);
    FILE *f = fopen(path, "w");
    ck_assert_msg(f && fputs("5", f) >= 0 && fclose(f) == 0, "cannot reset %s", path);
    return proc_status_bytes(pid, "VmRSS");
}

/* Sends len bytes of body of the given Content-Type header line, asserts the status and returns
 * how far the daemon's peak RSS rose above its RSS before, per byte of body. */
static double peak_per_body_bytes(e2e_daemon_t *d, const char *path, const char *content_type,
                                  const void *body, size_t len, long expect_status)
{
    const char *const headers[] = {content_type, NULL};
    pid_t pid = e2e_daemon_pid(d);
    long long before = peak_reset(pid);
    e2e_response_t resp;
    ck_assert_int_eq(e2e_http_request(d, "POST", path, headers, body, len, &resp), 0);
    ck_assert_msg(resp.status == expect_status, "status %ld: %s", resp.status, resp.body);
    e2e_response_clear(&resp);
    long long peak = proc_status_bytes(pid, "VmHWM");
    double ratio = (double)(peak - before) / (double)len;
    fprintf(stderr, "%s: body %zu bytes, peak RSS +%lld bytes, %.2f per body byte\n", path, len,
            peak - before, ratio);
    return ratio;
}

/* peak_per_body_bytes of a JSON body. */
static double peak_per_body_byte(e2e_daemon_t *d, const char *path, const char *body,
                                 long expect_status)
{
    return peak_per_body_bytes(d, path, "Content-Type: application/json", body, strlen(body),
                               expect_status);
}

/* A warm daemon with config: its threads, arenas and store connections have served a job
 * already. */
static e2e_daemon_t *warm_daemon(const char *config)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    json_decref(e2e_json_ok(d, "POST", "/v1/jobs?wait=10",
                            "{\"op\":\"sum\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[4],"
                            "\"data\":[1,2,3,4]}}}",
                            201));
    return d;
}

START_TEST(test_a_large_json_job_costs_at_most_three_times_its_body)
{
    e2e_daemon_t *d = warm_daemon("");
    /* f32 numbers of six decimals, nine bytes each with their comma. */
    size_t n = (BODY_BYTES - 128) / 9, cap = BODY_BYTES + 1;
    char *body = malloc(cap);
    size_t len = (size_t)snprintf(body, cap,
                                  "{\"op\":\"sum\",\"inputs\":{\"x\":{\"dtype\":\"f32\","
                                  "\"shape\":[%zu],\"data\":[",
                                  n);
    uint32_t seed = 12345;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        len += (size_t)snprintf(body + len, cap - len, "%s0.%06u", i ? "," : "",
                                (seed >> 8) % 1000000u);
    }
    snprintf(body + len, cap - len, "]}}}");
    double ratio = peak_per_body_byte(d, "/v1/jobs?wait=30", body, 201);
    ck_assert_msg(ratio <= 3.0, "a %zu-byte job raised the peak by %.2f bytes per body byte",
                  strlen(body), ratio);
    free(body);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_list_refused_with_413_is_not_parsed_first)
{
    e2e_daemon_t *d = warm_daemon("");
    static const char job[] =
        "{\"op\":\"sum\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[4],\"data\":[1,2,3,4]}}}";
    size_t cap = BODY_BYTES + sizeof job + 2, len = 1;
    char *body = malloc(cap);
    body[0] = '[';
    while (len + sizeof job + 1 < BODY_BYTES) {
        if (len > 1) body[len++] = ',';
        memcpy(body + len, job, sizeof job - 1);
        len += sizeof job - 1;
    }
    body[len++] = ']';
    body[len] = '\0';
    double ratio = peak_per_body_byte(d, "/v1/jobs", body, 413);
    ck_assert_msg(ratio <= 3.0,
                  "a %zu-byte list refused with 413 raised the peak by %.2f bytes "
                  "per body byte",
                  len, ratio);
    free(body);
    e2e_daemon_free(d);
}
END_TEST

/* Tensor data the scanner cannot read itself (objects inside data) goes to jansson within the
 * same budget as the rest: a large one is refused with 413 once the budget (8 MiB here) is
 * spent, not built into a tree of twenty times its size first. */
START_TEST(test_objects_inside_data_are_parsed_within_the_budget)
{
    e2e_daemon_t *d = warm_daemon("[limits]\nmax_json_tree_bytes = 8388608\n");
    size_t cap = BODY_BYTES + 64;
    char *body = malloc(cap);
    size_t len =
        (size_t)snprintf(body, cap,
                         "{\"op\":\"sum\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[1],"
                         "\"data\":{\"a\":[0");
    while (len + 16 < BODY_BYTES)
        len += (size_t)snprintf(body + len, cap - len, ",0");
    snprintf(body + len, cap - len, "]}}}}");
    double ratio = peak_per_body_byte(d, "/v1/jobs", body, 413);
    ck_assert_msg(ratio <= 3.0,
                  "a %zu-byte job with an object in its data raised the peak by %.2f bytes "
                  "per body byte",
                  strlen(body), ratio);
    free(body);
    e2e_daemon_free(d);
}
END_TEST

/* An ephemeral buffer's body (POST /v1/buffers?resident=true&durable=false) is held whole in
 * the daemon's memory, once: allocated for its Content-Length as it starts, never grown by
 * copying (which would hold it twice at the last step), and on the CPU backend kept as the
 * buffer's resident copy. */
START_TEST(test_an_ephemeral_upload_is_held_in_memory_once)
{
    e2e_daemon_t *d = warm_daemon("");
    size_t len = (size_t)64 << 20;
    char *body = malloc(len);
    for (size_t i = 0; i < len; i++)
        body[i] = (char)(i * 2654435761u >> 24);
    char path[160];
    snprintf(path, sizeof path, "/v1/buffers?dtype=u32&shape=%zu&resident=true&durable=false",
             len / 4);
    double ratio =
        peak_per_body_bytes(d, path, "Content-Type: application/octet-stream", body, len, 201);
    ck_assert_msg(ratio < 1.5, "peak RSS rose by %.2f times the body", ratio);
    free(body);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_parse_memory");
    TCase *tc = tcase_create("parse_memory");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_a_large_json_job_costs_at_most_three_times_its_body);
    tcase_add_test(tc, test_a_list_refused_with_413_is_not_parsed_first);
    tcase_add_test(tc, test_objects_inside_data_are_parsed_within_the_budget);
    tcase_add_test(tc, test_an_ephemeral_upload_is_held_in_memory_once);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
