/* End-to-end: a list of jobs submitted with ?wait= (a waited array) is accepted all or
 * nothing, as any list, and answered once every one of its jobs has ended, with the list of
 * them as they ended, outputs inline (as JSON numbers, or in one binary section); or, when the
 * wait runs out first, with each job as it stands then, still 201. A retry with the same
 * Idempotency-Key waits the same way for the first jobs; a client that goes away ends the
 * wait, not the jobs. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* Job k of a list: add on i32 with x = [k, 2k] and y = [3, 4], so that its out, [k+3, 2k+4],
 * names it. A new reference. */
static json_t *add_job(int k)
{
    json_t *x = json_pack("{s:s, s:[i], s:[i,i]}", "dtype", "i32", "shape", 2, "data", k, 2 * k);
    json_t *y = json_pack("{s:s, s:[i], s:[i,i]}", "dtype", "i32", "shape", 2, "data", 3, 4);
    return json_pack("{s:s, s:{s:o, s:o}}", "op", "add", "inputs", "x", x, "y", y);
}

/* The text of list (taken), malloc'd. */
static char *list_text(json_t *list)
{
    char *text = json_dumps(list, JSON_COMPACT);
    json_decref(list);
    return text;
}

/* The text of a list of n jobs add_job(0..n). */
static char *add_list_text(int n)
{
    json_t *list = json_array();
    for (int k = 0; k < n; k++)
        json_array_append_new(list, add_job(k));
    return list_text(list);
}

/* Asserts that job (as JSON) is add_job(k), succeeded, with its output inline. */
static void assert_add_done(const json_t *job, int k)
{
    json_t *data = json_object_get(json_object_get(json_object_get(job, "outputs"), "out"), "data");
    double out[2];
    ck_assert_msg(strcmp(e2e_job_state(job), "succeeded") == 0, "job %d is %s", k,
                  e2e_job_state(job));
    ck_assert_msg(e2e_json_flatten(data, out, 2) == 2, "job %d has no output inline", k);
    ck_assert_msg(out[0] == k + 3 && out[1] == 2 * k + 4, "job %d: out [%g, %g]", k, out[0],
                  out[1]);
}

static const char *job_id(const json_t *list, size_t i)
{
    return json_string_value(json_object_get(json_array_get(list, i), "id"));
}

/* Every job of the list ends within the wait: the answer is the list, in its order, each job
 * succeeded with its output inline, and each as the store holds it afterwards. */
START_TEST(test_a_waited_list_is_answered_once_every_job_ended)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 64 };
    char *text = add_list_text(N);
    json_t *answer = e2e_json_ok(d, "POST", "/v1/jobs?wait=30", text, 201);
    free(text);
    ck_assert(json_is_array(answer));
    ck_assert_uint_eq(json_array_size(answer), N);
    for (int k = 0; k < N; k++) {
        assert_add_done(json_array_get(answer, (size_t)k), k);
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%s", job_id(answer, (size_t)k));
        json_t *stored = e2e_json_ok(d, "GET", path, NULL, 200);
        ck_assert_msg(json_equal(stored, json_array_get(answer, (size_t)k)), "job %d", k);
        json_decref(stored);
    }
    json_decref(answer);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), N);
    e2e_daemon_free(d);
}
END_TEST

/* Asked for a binary section, the waited list's outputs all go in one section after the JSON,
 * each named by its binary_offset from the section's start. */
START_TEST(test_a_waited_list_in_binary_has_every_output_in_one_section)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    enum { N = 8 };
    char *text = add_list_text(N);
    static const char *const hdrs[] = {"Content-Type: application/json",
                                       "Accept: application/octet-stream", NULL};
    e2e_response_t resp;
    ck_assert_int_eq(
        e2e_http_request(d, "POST", "/v1/jobs?wait=30", hdrs, text, strlen(text), &resp), 0);
    free(text);
    ck_assert_int_eq(resp.status, 201);
    char length[32];
    ck_assert_ptr_nonnull(e2e_response_header(&resp, "Gpujob-Json-Length", length, sizeof length));
    size_t json_len = strtoul(length, NULL, 10);
    json_t *list = json_loadb(resp.body, json_len, 0, NULL);
    ck_assert(json_is_array(list));
    ck_assert_uint_eq(json_array_size(list), N);
    size_t section = resp.body_len - json_len;
    ck_assert_uint_eq(section, N * 2 * sizeof(int32_t));
    for (int k = 0; k < N; k++) {
        json_t *job = json_array_get(list, (size_t)k);
        ck_assert_str_eq(e2e_job_state(job), "succeeded");
        json_t *out = json_object_get(json_object_get(job, "outputs"), "out");
        json_t *at = json_object_get(out, "binary_offset");
        ck_assert_msg(json_is_integer(at), "job %d has no binary_offset", k);
        ck_assert_uint_le((size_t)json_integer_value(at) + 2 * sizeof(int32_t), section);
        int32_t got[2];
        memcpy(got, resp.body + json_len + json_integer_value(at), sizeof got);
        ck_assert_msg(got[0] == k + 3 && got[1] == 2 * k + 4, "job %d: [%d, %d]", k, got[0],
                      got[1]);
    }
    json_decref(list);
    e2e_response_clear(&resp);
    e2e_daemon_free(d);
}
END_TEST

/* One job of the list outlasts the wait: the answer (still 201: every job is accepted) comes
 * when the wait runs out, with the jobs that ended as they ended and the slow one as it stands;
 * the slow one ends later, as any job does. */
START_TEST(test_a_waited_list_whose_wait_runs_out_says_which_jobs_are_not_final)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[scheduler]\ncpu_threads = 2\n");
    json_t *list = json_array();
    json_array_append_new(list, e2e_long_job_new(8000));
    json_array_append_new(list, add_job(1));
    json_array_append_new(list, add_job(2));
    char *text = list_text(list);
    double start = e2e_now();
    json_t *answer = e2e_json_ok(d, "POST", "/v1/jobs?wait=3", text, 201);
    double waited = e2e_now() - start;
    free(text);
    ck_assert_uint_eq(json_array_size(answer), 3);
    ck_assert_msg(waited >= 2.9 && waited < 8, "answered after %.2f s", waited);
    const char *state = e2e_job_state(json_array_get(answer, 0));
    ck_assert_msg(strcmp(state, "queued") == 0 || strcmp(state, "running") == 0, "state %s", state);
    for (int k = 1; k <= 2; k++)
        assert_add_done(json_array_get(answer, (size_t)k), k);
    json_t *ended = e2e_wait_final_ok(d, job_id(answer, 0), 30);
    ck_assert_str_eq(e2e_job_state(ended), "succeeded");
    json_decref(ended);
    json_decref(answer);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 3);
    e2e_daemon_free(d);
}
END_TEST

/* A waited list longer than the jobs the daemon keeps whole in memory while queued, behind a
 * long job: the wait runs out with all of them queued, and each is answered as it stands, read
 * back from the store where the queue keeps only its entry; all of them run afterwards. */
START_TEST(test_a_long_waited_list_behind_a_long_job_is_answered_as_it_stands)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    json_t *slow = e2e_long_job_new(3000);
    free(e2e_submit_ok(d, slow));
    json_decref(slow);
    enum { N = 1500 };
    char *text = add_list_text(N);
    json_t *answer = e2e_json_ok(d, "POST", "/v1/jobs?wait=0.5", text, 201);
    free(text);
    ck_assert_uint_eq(json_array_size(answer), N);
    for (size_t i = 0; i < N; i++) {
        json_t *job = json_array_get(answer, i);
        ck_assert_msg(strcmp(e2e_job_state(job), "queued") == 0, "job %zu is %s", i,
                      e2e_job_state(job));
        ck_assert_msg(json_is_object(json_object_get(job, "waiting")), "job %zu: no waiting", i);
    }
    for (size_t i = 0; i < N; i += N - 1) {
        json_t *done = e2e_wait_final_ok(d, job_id(answer, i), 60);
        assert_add_done(done, (int)i);
        json_decref(done);
    }
    json_decref(answer);
    e2e_daemon_free(d);
}
END_TEST

/* A waited list retried with its Idempotency-Key is answered with the first jobs (200): after
 * the first answer, as they ended; while the first try still runs, once they have ended. */
START_TEST(test_a_waited_list_retried_with_its_key_waits_for_the_first_jobs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    static const char *const hdrs[] = {"Content-Type: application/json",
                                       "Idempotency-Key: waited-list-1", NULL};
    char *text = add_list_text(3);
    e2e_response_t first, again;
    ck_assert_int_eq(
        e2e_http_request(d, "POST", "/v1/jobs?wait=30", hdrs, text, strlen(text), &first), 0);
    ck_assert_int_eq(first.status, 201);
    ck_assert_int_eq(
        e2e_http_request(d, "POST", "/v1/jobs?wait=30", hdrs, text, strlen(text), &again), 0);
    ck_assert_int_eq(again.status, 200);
    ck_assert_msg(json_equal(first.json, again.json), "%s\n%s", first.body, again.body);
    for (int k = 0; k < 3; k++)
        assert_add_done(json_array_get(again.json, (size_t)k), k);
    e2e_response_clear(&first);
    e2e_response_clear(&again);
    free(text);

    /* The first try's wait runs out while its slow job runs: the retry waits for its end. */
    static const char *const slow_hdrs[] = {"Content-Type: application/json",
                                            "Idempotency-Key: waited-list-2", NULL};
    json_t *list = json_array();
    json_array_append_new(list, e2e_long_job_new(1500));
    json_array_append_new(list, add_job(5));
    text = list_text(list);
    ck_assert_int_eq(
        e2e_http_request(d, "POST", "/v1/jobs?wait=0.05", slow_hdrs, text, strlen(text), &first),
        0);
    ck_assert_int_eq(first.status, 201);
    ck_assert_str_ne(e2e_job_state(json_array_get(first.json, 0)), "succeeded");
    ck_assert_int_eq(
        e2e_http_request(d, "POST", "/v1/jobs?wait=30", slow_hdrs, text, strlen(text), &again), 0);
    ck_assert_int_eq(again.status, 200);
    for (size_t i = 0; i < 2; i++)
        ck_assert_str_eq(job_id(first.json, i), job_id(again.json, i));
    ck_assert_str_eq(e2e_job_state(json_array_get(again.json, 0)), "succeeded");
    assert_add_done(json_array_get(again.json, 1), 5);
    e2e_response_clear(&first);
    e2e_response_clear(&again);
    free(text);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 5);
    e2e_daemon_free(d);
}
END_TEST

static double tcp_connections(e2e_daemon_t *d)
{
    return e2e_metric_ok(d, "gpujobd_http_connections{listener=\"tcp\"}");
}

/* The client of a waited list goes away while its jobs run: the wait ends at once (the daemon
 * lets the connection go rather than hold it until the jobs end), and the jobs run on to
 * their ends. */
START_TEST(test_a_waited_list_whose_client_goes_away_still_runs_its_jobs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *list = json_array();
    for (int i = 0; i < 2; i++)
        json_array_append_new(list, e2e_long_job_new(6000));
    char *text = list_text(list);
    int fd = e2e_raw_post_start_ok(d, "/v1/jobs?wait=300", "application/json", strlen(text));
    e2e_write_all_ok(fd, text, strlen(text));
    free(text);
    double until = e2e_now() + 10;
    while (e2e_count_jobs_ok(d, "state=running") < 2 && e2e_now() < until)
        usleep(20 * 1000);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=running"), 2);
    ck_assert_double_ge(tcp_connections(d), 2); /* this one's and the waiting client's */
    close(fd);
    until = e2e_now() + 4;
    while (tcp_connections(d) > 1 && e2e_now() < until)
        usleep(50 * 1000);
    ck_assert_double_le(tcp_connections(d), 1);
    json_t *page = e2e_json_ok(d, "GET", "/v1/jobs", NULL, 200);
    json_t *jobs = json_object_get(page, "jobs");
    ck_assert_uint_eq(json_array_size(jobs), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *done = e2e_wait_final_ok(d, job_id(jobs, i), 30);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        json_decref(done);
    }
    json_decref(page);
    e2e_daemon_free(d);
}
END_TEST

/* A bad job refuses the whole waited list, naming the job and its field: nothing is stored. */
START_TEST(test_a_waited_list_with_a_bad_job_is_refused_whole)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *list = json_array();
    json_array_append_new(list, add_job(0));
    json_t *bad = add_job(1);
    json_array_append_new(
        json_object_get(json_object_get(json_object_get(bad, "inputs"), "x"), "data"),
        json_integer(7)); /* three values for a shape of [2] */
    json_array_append_new(list, bad);
    json_array_append_new(list, add_job(2));
    char *text = list_text(list);
    json_t *err = e2e_json_ok(d, "POST", "/v1/jobs?wait=30", text, 400);
    free(text);
    ck_assert_msg(strncmp(e2e_error_field(err), "[1].inputs.x", 12) == 0, "field %s",
                  e2e_error_field(err));
    json_decref(err);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 0);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_waited_arrays");
    TCase *tc = tcase_create("waited_arrays");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_a_waited_list_is_answered_once_every_job_ended);
    tcase_add_test(tc, test_a_waited_list_in_binary_has_every_output_in_one_section);
    tcase_add_test(tc, test_a_waited_list_whose_wait_runs_out_says_which_jobs_are_not_final);
    tcase_add_test(tc, test_a_long_waited_list_behind_a_long_job_is_answered_as_it_stands);
    tcase_add_test(tc, test_a_waited_list_retried_with_its_key_waits_for_the_first_jobs);
    tcase_add_test(tc, test_a_waited_list_whose_client_goes_away_still_runs_its_jobs);
    tcase_add_test(tc, test_a_waited_list_with_a_bad_job_is_refused_whole);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
