/* End-to-end: the per-user policy. Over loopback TCP a client is the account that runs it (the
 * default auth mode asks the kernel), so a [user.NAME] section of the test's own account is
 * the caller's own: each limit it or [limits] sets is refused with the key that decided it in
 * the error's field and message: the request rate (429 with Retry-After), the largest single
 * job (413), stored bytes (413), queued jobs (429) and a max_queued of 0 (403: the user may
 * not submit); and a queued job's JSON says why it waits. Tokens name other users. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/daemon_harness.h"

/* "user.NAME.key" of the test's own account (a static buffer). */
static const char *my_key(const char *key)
{
    static char buf[128];
    snprintf(buf, sizeof buf, "user.%s.%s", e2e_caller_name(), key);
    return buf;
}

static const char *error_message(const json_t *body)
{
    const char *s = json_string_value(json_object_get(json_object_get(body, "error"), "message"));
    return s ? s : "";
}

START_TEST(test_requests_past_the_rate_get_429_with_retry_after)
{
    char config[256];
    snprintf(config, sizeof config, "[user.%s]\nrate = 1\nburst = 3\n", e2e_caller_name());
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    for (int i = 0; i < 3; i++)
        json_decref(e2e_json_ok(d, "GET", "/v1/jobs", NULL, 200));
    e2e_response_t resp;
    ck_assert_int_eq(e2e_http_request(d, "GET", "/v1/jobs", NULL, NULL, 0, &resp), 0);
    ck_assert_int_eq(resp.status, 429);
    ck_assert_str_eq(e2e_error_code(resp.json), "rate_limited");
    ck_assert_str_eq(e2e_error_field(resp.json), my_key("rate"));
    ck_assert_ptr_nonnull(strstr(error_message(resp.json), my_key("rate")));
    char retry[32];
    ck_assert_ptr_nonnull(e2e_response_header(&resp, "Retry-After", retry, sizeof retry));
    ck_assert_str_eq(retry, "1"); /* one request a second: the next token is < 1 s away */
    e2e_response_clear(&resp);
    /* The probes are not the users' requests: they are never limited. */
    json_decref(e2e_json_ok(d, "GET", "/healthz", NULL, 200));
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_job_past_the_largest_cost_gets_413_naming_the_key)
{
    /* add reads two tensors and writes one: 3 MiB at 1 GB/s is about 3.1 ms. */
    e2e_daemon_t *d = e2e_daemon_start_ok("[limits]\nmax_job_cost_ms = 2\n");
    enum { N = 262144 };
    float *x = calloc(N, sizeof *x);
    json_t *buf = e2e_upload_ok(d, "f32", "262144", x, N * sizeof *x, false, 201);
    const char *id = json_string_value(json_object_get(buf, "id"));
    char body[256];
    snprintf(body, sizeof body,
             "{\"op\": \"add\", \"inputs\": {\"x\": {\"buffer\": \"%s\"}, \"y\": {\"buffer\": "
             "\"%s\"}}}",
             id, id);
    json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", body, 413);
    ck_assert_str_eq(e2e_error_code(refused), "job_too_large");
    ck_assert_str_eq(e2e_error_field(refused), "limits.max_job_cost_ms");
    ck_assert_ptr_nonnull(strstr(error_message(refused), "limits.max_job_cost_ms = 2 ms"));
    json_decref(refused);
    /* A small job of the same op is well under it. */
    json_decref(e2e_json_ok(d, "POST", "/v1/jobs",
                            "{\"op\": \"add\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": "
                            "[2], \"data\": [1, 2]}, \"y\": {\"dtype\": \"f32\", \"shape\": [2], "
                            "\"data\": [3, 4]}}}",
                            201));
    json_decref(buf);
    free(x);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_buffers_past_the_stored_bytes_get_413_naming_the_key)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[limits]\nmax_stored_bytes_per_user = 4KiB\n");
    float x[1024] = {0};
    json_decref(e2e_upload_ok(d, "f32", "1024", x, sizeof x, false, 201));
    json_t *refused = e2e_upload_ok(d, "f32", "1", x, sizeof(float), false, 413);
    ck_assert_str_eq(e2e_error_code(refused), "quota_exceeded");
    ck_assert_str_eq(e2e_error_field(refused), "limits.max_stored_bytes_per_user");
    ck_assert_ptr_nonnull(strstr(error_message(refused), "limits.max_stored_bytes_per_user"));
    json_decref(refused);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_queued_jobs_past_the_users_own_limit_get_429_naming_its_section)
{
    char config[256];
    snprintf(config, sizeof config, E2E_ONE_WORKER_CONFIG "[user.%s]\nmax_queued = 1\n",
             e2e_caller_name());
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS);
    char *running = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, running, "running", 10);
    char *queued = e2e_submit_ok(d, long_job);
    /* The queued job says why it waits: its user runs as many jobs as it may. */
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%s", queued);
    json_t *shown = e2e_json_ok(d, "GET", path, NULL, 200);
    json_t *waiting = json_object_get(shown, "waiting");
    ck_assert_str_eq(json_string_value(json_object_get(waiting, "reason")), "user_limit");
    ck_assert_str_eq(json_string_value(json_object_get(waiting, "limit")),
                     "limits.max_running_per_user");
    ck_assert_int_eq(json_integer_value(json_object_get(waiting, "position")), 0);
    json_decref(shown);
    char *text = json_dumps(long_job, JSON_COMPACT);
    json_t *refused = e2e_json_ok(d, "POST", "/v1/jobs", text, 429);
    ck_assert_str_eq(e2e_error_code(refused), "quota_exceeded");
    ck_assert_str_eq(e2e_error_field(refused), my_key("max_queued"));
    char want[160];
    snprintf(want, sizeof want, "%s = 1", my_key("max_queued"));
    ck_assert_ptr_nonnull(strstr(error_message(refused), want));
    json_decref(refused);
    free(text);
    free(queued);
    free(running);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

/* The waiting object of a job's JSON says reason, names limit and sits at position. */
static void assert_waits(const json_t *job, const char *reason, const char *limit, long position)
{
    ck_assert_str_eq(e2e_job_state(job), "queued");
    json_t *waiting = json_object_get(job, "waiting");
    ck_assert_msg(json_is_object(waiting), "a queued job without \"waiting\"");
    ck_assert_str_eq(json_string_value(json_object_get(waiting, "reason")), reason);
    ck_assert_str_eq(json_string_value(json_object_get(waiting, "limit")), limit);
    ck_assert_int_eq(json_integer_value(json_object_get(waiting, "position")), position);
}

/* Every answer that shows a queued job says why it waits: the submission's (with and without
 * ?wait=) and the lists', all of them, while the job that runs says nothing of the kind. */
START_TEST(test_every_answer_showing_a_queued_job_says_why_it_waits)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    json_t *long_job = e2e_long_job_new(5000);
    char *running = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, running, "running", 10);
    char *text = json_dumps(long_job, JSON_COMPACT);
    const char *limit = "limits.max_running_per_user";
    json_t *first = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
    assert_waits(first, "user_limit", limit, 0);
    json_t *second = e2e_json_ok(d, "POST", "/v1/jobs?wait=0.2", text, 201);
    assert_waits(second, "user_limit", limit, 1);

    json_t *page = e2e_json_ok(d, "GET", "/v1/jobs?state=queued", NULL, 200);
    json_t *jobs = json_object_get(page, "jobs");
    ck_assert_int_eq(json_array_size(jobs), 2);
    long seen = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *job = json_array_get(jobs, i);
        const char *id = json_string_value(json_object_get(job, "id"));
        bool is_first = strcmp(id, json_string_value(json_object_get(first, "id"))) == 0;
        assert_waits(job, "user_limit", limit, is_first ? 0 : 1);
        seen |= is_first ? 1 : 2;
    }
    ck_assert_int_eq(seen, 3);
    json_decref(page);
    page = e2e_json_ok(d, "GET", "/v1/jobs", NULL, 200);
    jobs = json_object_get(page, "jobs");
    ck_assert_int_eq(json_array_size(jobs), 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *job = json_array_get(jobs, i);
        bool queued = strcmp(e2e_job_state(job), "queued") == 0;
        ck_assert_int_eq(json_object_get(job, "waiting") != NULL, queued);
    }
    json_decref(page);
    json_decref(first);
    json_decref(second);
    free(text);
    free(running);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

/* Submits job_text with token (NULL: as the test's own account) and returns the answer. */
static long submit_as(e2e_daemon_t *d, const char *token, const char *job_text, json_t **ret)
{
    char auth[E2E_TOKEN_SIZE + 32];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token ? token : "");
    const char *headers[] = {"Content-Type: application/json", token ? auth : NULL, NULL};
    e2e_response_t resp;
    ck_assert_int_eq(
        e2e_http_request(d, "POST", "/v1/jobs", headers, job_text, strlen(job_text), &resp), 0);
    long status = resp.status;
    *ret = resp.json ? json_incref(resp.json) : json_null();
    e2e_response_clear(&resp);
    return status;
}

/* A max_queued of 0 keeps a user out of submitting: 403 (no wait makes room, unlike 429),
 * naming the key that decided, from the user's own section, a group's or the default, while
 * users the key lets in submit. */
START_TEST(test_max_queued_zero_keeps_a_user_out_of_submitting)
{
    char config[256];
    snprintf(config, sizeof config,
             "[limits]\nmax_queued_per_user = 0\n[user.%s]\nmax_queued = 10\n"
             "[user.bob]\nmax_queued = 0\n",
             e2e_caller_name());
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    char bob[E2E_TOKEN_SIZE], carol[E2E_TOKEN_SIZE];
    e2e_token_create_ok(d, "bob", NULL, bob);
    e2e_token_create_ok(d, "carol", NULL, carol);
    const char *job = "{\"op\": \"sum\", \"inputs\": {\"x\": {\"dtype\": \"f32\", "
                      "\"shape\": [2], \"data\": [1, 2]}}}";
    json_t *answer = NULL;
    ck_assert_int_eq(submit_as(d, NULL, job, &answer), 201);
    json_decref(answer);
    const struct {
        const char *token, *user, *key;
    } refused[] = {{bob, "bob", "user.bob.max_queued"},
                   {carol, "carol", "limits.max_queued_per_user"}};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(submit_as(d, refused[i].token, job, &answer), 403);
        ck_assert_str_eq(e2e_error_code(answer), "forbidden");
        ck_assert_str_eq(e2e_error_field(answer), refused[i].key);
        char want[160];
        snprintf(want, sizeof want, "'%s' may not submit jobs: %s = 0", refused[i].user,
                 refused[i].key);
        ck_assert_msg(strstr(error_message(answer), want), "%s", error_message(answer));
        json_decref(answer);
    }
    /* A list of jobs is refused whole, and nothing of it was queued. */
    char list[512];
    snprintf(list, sizeof list, "[%s, %s]", job, job);
    ck_assert_int_eq(submit_as(d, bob, list, &answer), 403);
    json_decref(answer);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 1);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_policy");
    TCase *tc = tcase_create("policy");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_requests_past_the_rate_get_429_with_retry_after);
    tcase_add_test(tc, test_a_job_past_the_largest_cost_gets_413_naming_the_key);
    tcase_add_test(tc, test_buffers_past_the_stored_bytes_get_413_naming_the_key);
    tcase_add_test(tc, test_queued_jobs_past_the_users_own_limit_get_429_naming_its_section);
    tcase_add_test(tc, test_every_answer_showing_a_queued_job_says_why_it_waits);
    tcase_add_test(tc, test_max_queued_zero_keeps_a_user_out_of_submitting);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
