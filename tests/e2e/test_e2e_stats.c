/* End-to-end: GET /v1/stats counts each user's jobs queued and running as the scheduler holds
 * them at the moment of the request (its loop answers for them), not as a snapshot taken
 * earlier: right after a submission its jobs are counted, right after the queue drains they are
 * gone. The rows add up to the totals; a user sees only their own row, and the totals. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/daemon_harness.h"
#include "support/kill9_stream.h"
#include "support/run_suite.h"

/* A request as the holder of token, with a JSON body or none; asserts expect and returns the
 * answer's JSON (a new reference). */
static json_t *json_as(e2e_daemon_t *d, const char *token, const char *method, const char *path,
                       const char *body, long expect)
{
    char auth[256];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    const char *headers[] = {auth, "Content-Type: application/json", NULL};
    e2e_response_t r;
    ck_assert_int_eq(e2e_http_request(d, method, path, headers, body, body ? strlen(body) : 0, &r),
                     0);
    ck_assert_msg(r.status == expect, "%s %s: %ld %s", method, path, r.status, r.body);
    json_t *j = json_incref(r.json);
    e2e_response_clear(&r);
    return j;
}

/* Submits job (borrowed) as token; its id (malloc'd). */
static char *submit_as(e2e_daemon_t *d, const char *token, const json_t *job)
{
    char *text = json_dumps(job, JSON_COMPACT);
    json_t *answer = json_as(d, token, "POST", "/v1/jobs", text, 201);
    free(text);
    char *id = strdup(json_string_value(json_object_get(answer, "id")));
    json_decref(answer);
    return id;
}

/* Asserts that token's GET /v1/stats shows the totals queued and running, and exactly the rows
 * want (a JSON array of {"queued", "running", "user"}, in order), complete. */
static void assert_queue(e2e_daemon_t *d, const char *token, long queued, long running,
                         const char *want_rows)
{
    json_t *stats = json_as(d, token, "GET", "/v1/stats", NULL, 200);
    json_t *q = json_object_get(stats, "queue");
    ck_assert_int_eq(json_integer_value(json_object_get(q, "queued")), queued);
    ck_assert_int_eq(json_integer_value(json_object_get(q, "running")), running);
    ck_assert(json_is_true(json_object_get(q, "complete")));
    json_t *want = json_loads(want_rows, 0, NULL);
    ck_assert_ptr_nonnull(want);
    char *got = json_dumps(json_object_get(q, "users"), JSON_SORT_KEYS | JSON_COMPACT);
    ck_assert_msg(json_equal(json_object_get(q, "users"), want), "users %s, expected %s", got,
                  want_rows);
    free(got);
    json_decref(want);
    json_decref(stats);
}

START_TEST(test_stats_count_each_users_jobs_as_they_stand)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[auth]\nmode = token\nadmins = carol\n"
                                          "[limits]\nmax_running_per_user = 1\n"
                                          "[scheduler]\ncpu_threads = 1\n");
    char alice[E2E_TOKEN_SIZE], bob[E2E_TOKEN_SIZE], carol[E2E_TOKEN_SIZE];
    e2e_token_create_ok(d, "alice", NULL, alice);
    e2e_token_create_ok(d, "bob", NULL, bob);
    e2e_token_create_ok(d, "carol", NULL, carol);
    assert_queue(d, carol, 0, 0, "[]");

    /* alice's long job holds the one worker (long enough to outlast the reads below on a
     * loaded machine); her three and bob's two jobs queue behind it. */
    json_t *long_job = e2e_long_job_new(5000);
    char *long_id = submit_as(d, alice, long_job);
    char *ids[5];
    for (int i = 0; i < 5; i++) {
        json_t *job = e2e_add_job_new(i);
        ids[i] = submit_as(d, i < 3 ? alice : bob, job);
        json_decref(job);
    }
    /* Counted at once, the long job as running once it is. */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", long_id);
    for (double until = e2e_now() + 10; e2e_now() < until;) {
        json_t *job = json_as(d, alice, "GET", path, NULL, 200);
        bool running = strcmp(e2e_job_state(job), "running") == 0;
        json_decref(job);
        if (running) break;
    }
    assert_queue(d, carol, 5, 1,
                 "[{\"queued\": 3, \"running\": 1, \"user\": \"alice\"},"
                 " {\"queued\": 2, \"running\": 0, \"user\": \"bob\"}]");
    assert_queue(d, bob, 5, 1, "[{\"queued\": 2, \"running\": 0, \"user\": \"bob\"}]");

    /* Once every job has ended, right away: nobody has a row. */
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "/v1/jobs/%s/wait?timeout=60", ids[i]);
        json_t *job = json_as(d, i < 3 ? alice : bob, "GET", path, NULL, 200);
        char why[128];
        ck_assert_msg(e2e_add_result_ok(job, i, why, sizeof why), "job %d: %s", i, why);
        json_decref(job);
        free(ids[i]);
    }
    snprintf(path, sizeof path, "/v1/jobs/%s/wait?timeout=60", long_id);
    json_decref(json_as(d, alice, "GET", path, NULL, 200));
    assert_queue(d, carol, 0, 0, "[]");
    assert_queue(d, alice, 0, 0, "[]");

    free(long_id);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_stats");
    TCase *tc = tcase_create("stats");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_stats_count_each_users_jobs_as_they_stand);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
