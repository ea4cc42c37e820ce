/* End-to-end: a submission that waits for its job (POST /v1/jobs?wait=) is answered with the
 * job's end as soon as the end is committed, without waiting for the submission's sync
 * (sched_submit_waited). What that must keep: the answer is the job the store holds
 * afterwards; an answer that carries a job not yet final (the wait ran out) goes only once the
 * job is committed, so that a kill -9 right after it keeps the job; and a kill -9 at any point
 * leaves no job succeeded without its outputs, and loses no job whose end was answered. A
 * retry with the same Idempotency-Key still finds the first job. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/kill9_stream.h"

/* The add job for k as JSON text (malloc'd). */
static char *add_job_text(int k)
{
    json_t *job = e2e_add_job_new(k);
    char *text = json_dumps(job, JSON_COMPACT);
    json_decref(job);
    return text;
}

/* The answer is handed to the HTTP thread before its job's end is committed, in the same
 * wake of the scheduler's loop, but leaves only once the commit is over: a GET and a download
 * of the output right after it, both read from the store, find the end. */
START_TEST(test_a_waited_answer_is_the_job_the_store_holds_afterwards)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    for (int k = 0; k < 20; k++) {
        char *text = add_job_text(k);
        json_t *answer = e2e_json_ok(d, "POST", "/v1/jobs?wait=30", text, 201);
        free(text);
        char why[128];
        ck_assert_msg(e2e_add_result_ok(answer, k, why, sizeof why), "answer %d: %s", k, why);
        json_t *stored = e2e_get_job_ok(d, json_string_value(json_object_get(answer, "id")));
        char *a = json_dumps(answer, JSON_SORT_KEYS | JSON_COMPACT);
        char *b = json_dumps(stored, JSON_SORT_KEYS | JSON_COMPACT);
        ck_assert_msg(json_equal(answer, stored), "answer %s\nstored %s", a, b);
        free(a);
        free(b);
        json_decref(stored);
        /* The output, read from the store, is there as well. */
        char path[160];
        snprintf(path, sizeof path, "/v1/jobs/%s/outputs/out",
                 json_string_value(json_object_get(answer, "id")));
        e2e_response_t out;
        ck_assert(e2e_http_request(d, "GET", path, NULL, NULL, 0, &out) == 0);
        ck_assert_msg(out.status == 200, "download %d: %ld", k, out.status);
        e2e_response_clear(&out);
        json_decref(answer);
    }
    e2e_daemon_free(d);
}
END_TEST

/* A waited submission retried with its Idempotency-Key, after its answer or while its first
 * try still runs, is answered with the first job (200), as it ended: no second job. */
START_TEST(test_a_waited_retry_with_its_key_is_answered_with_the_first_job)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    static const char *const hdrs[] = {"Content-Type: application/json",
                                       "Idempotency-Key: waited-1", NULL};
    char *text = add_job_text(7);
    e2e_response_t first, again;
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs?wait=30", hdrs, text, strlen(text), &first) ==
              0);
    ck_assert_int_eq(first.status, 201);
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs?wait=30", hdrs, text, strlen(text), &again) ==
              0);
    ck_assert_int_eq(again.status, 200);
    ck_assert_msg(json_equal(first.json, again.json), "%s\n%s", first.body, again.body);
    char why[128];
    ck_assert_msg(e2e_add_result_ok(again.json, 7, why, sizeof why), "%s", why);
    e2e_response_clear(&first);
    e2e_response_clear(&again);
    free(text);

    /* The first try still runs when the retry comes: the retry waits for its end. */
    static const char *const long_hdrs[] = {"Content-Type: application/json",
                                            "Idempotency-Key: waited-2", NULL};
    json_t *long_job = e2e_long_job_new(1000);
    text = json_dumps(long_job, JSON_COMPACT);
    json_decref(long_job);
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs?wait=0.05", long_hdrs, text, strlen(text),
                               &first) == 0);
    ck_assert_int_eq(first.status, 201);
    ck_assert(e2e_http_request(d, "POST", "/v1/jobs?wait=30", long_hdrs, text, strlen(text),
                               &again) == 0);
    ck_assert_int_eq(again.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(first.json, "id")),
                     json_string_value(json_object_get(again.json, "id")));
    ck_assert_str_eq(e2e_job_state(again.json), "succeeded");
    e2e_response_clear(&first);
    e2e_response_clear(&again);
    free(text);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 2);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_waited_job_whose_wait_runs_out_survives_a_kill9_right_after_its_answer)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *long_job = e2e_long_job_new(5000);
    char *text = json_dumps(long_job, JSON_COMPACT);
    json_decref(long_job);
    json_t *early = e2e_json_ok(d, "POST", "/v1/jobs?wait=0.05", text, 201);
    free(text);
    e2e_daemon_kill(d);
    const char *state = e2e_job_state(early);
    ck_assert_msg(strcmp(state, "queued") == 0 || strcmp(state, "running") == 0, "state %s", state);
    char *id = strdup(json_string_value(json_object_get(early, "id")));
    json_decref(early);
    ck_assert(e2e_daemon_restart(d) == 0);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    json_decref(done);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

/* A waited submission of a long job, posted by a thread of its own: its answer's status, 0
 * when the connection failed. */
typedef struct long_waited {
    e2e_daemon_t *d;
    pthread_t thread;
    long status;
} long_waited_t;

static void *long_waited_main(void *arg)
{
    long_waited_t *lw = arg;
    static const char *const hdrs[] = {"Content-Type: application/json", NULL};
    json_t *long_job = e2e_long_job_new(3000);
    char *text = json_dumps(long_job, JSON_COMPACT);
    json_decref(long_job);
    e2e_response_t resp;
    if (e2e_http_request(lw->d, "POST", "/v1/jobs?wait=30", hdrs, text, strlen(text), &resp) == 0) {
        lw->status = resp.status;
        e2e_response_clear(&resp);
    }
    free(text);
    e2e_http_thread_done();
    return NULL;
}

/* Starts lw's waited submission and returns the id of its job once the store lists it
 * running (malloc'd): a waited job's row is written while it runs, not after. */
static char *long_waited_start(long_waited_t *lw, e2e_daemon_t *d)
{
    *lw = (long_waited_t){.d = d};
    ck_assert(pthread_create(&lw->thread, NULL, long_waited_main, lw) == 0);
    for (double until = e2e_now() + 10; e2e_now() < until; usleep(5 * 1000)) {
        json_t *page = e2e_json_ok(d, "GET", "/v1/jobs?state=running", NULL, 200);
        json_t *first = json_array_get(json_object_get(page, "jobs"), 0);
        char *id = first ? strdup(json_string_value(json_object_get(first, "id"))) : NULL;
        json_decref(page);
        if (id) return id;
    }
    ck_abort_msg("the waited job was never listed running");
    return NULL;
}

START_TEST(test_a_waited_jobs_row_is_listed_running_while_it_runs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    long_waited_t lw;
    char *id = long_waited_start(&lw, d);
    /* Read from the store as well: its output is not there yet. */
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/outputs/out", id);
    json_t *conflict = e2e_json_ok(d, "GET", path, NULL, 409);
    json_decref(conflict);
    pthread_join(lw.thread, NULL);
    ck_assert_int_eq(lw.status, 201);
    json_t *done = e2e_get_job_ok(d, id);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    json_decref(done);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

/* A kill -9 while a waited job runs loses none of the jobs acknowledged meanwhile, nor the
 * waited job itself, whose row was written while it ran: it runs again after the restart. */
START_TEST(test_a_kill9_while_a_waited_job_runs_loses_nothing_acknowledged)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    long_waited_t lw;
    char *waited = long_waited_start(&lw, d);
    char *acked[3];
    for (int k = 0; k < 3; k++) {
        char *text = add_job_text(k);
        json_t *answer = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
        free(text);
        acked[k] = strdup(json_string_value(json_object_get(answer, "id")));
        json_decref(answer);
    }
    e2e_daemon_kill(d);
    pthread_join(lw.thread, NULL);
    ck_assert(e2e_daemon_restart(d) == 0);
    for (int k = 0; k < 3; k++) {
        json_t *job = e2e_wait_final_ok(d, acked[k], 60);
        char why[128];
        ck_assert_msg(e2e_add_result_ok(job, k, why, sizeof why), "job %s: %s", acked[k], why);
        json_decref(job);
        free(acked[k]);
    }
    json_t *job = e2e_wait_final_ok(d, waited, 60);
    ck_assert_str_eq(e2e_job_state(job), "succeeded");
    json_decref(job);
    free(waited);
    e2e_daemon_free(d);
}
END_TEST

/* Every job in the store that says succeeded has its output, and every waited answer that
 * carried a success is found succeeded, the same, after the restart. */
START_TEST(test_a_kill9_among_waited_jobs_leaves_none_succeeded_without_outputs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    e2e_kill9_stream_t st;
    e2e_kill9_stream_start_ok(&st, d, "/v1/jobs?wait=30", 60, 100000);
    e2e_kill9_stream_wait_ok(&st, 1.0, 20);
    e2e_kill9_stream_kill_ok(&st);

    ck_assert(e2e_daemon_restart(d) == 0);
    int ended = e2e_kill9_stream_verify_ok(&st, NULL, NULL);
    ck_assert_msg(ended > 0, "no waited answer carried its job's end");
    /* The jobs nobody was answered for (the one in flight at the kill): succeeded ones have
     * their outputs too. */
    json_t *page = e2e_json_ok(d, "GET", "/v1/jobs?state=succeeded&limit=1000", NULL, 200);
    size_t k;
    json_t *listed;
    json_array_foreach(json_object_get(page, "jobs"), k, listed)
    {
        json_t *job = e2e_get_job_ok(d, json_string_value(json_object_get(listed, "id")));
        json_t *data =
            json_object_get(json_object_get(json_object_get(job, "outputs"), "out"), "data");
        double out[2];
        ck_assert_msg(e2e_json_flatten(data, out, 2) == 2, "job %s succeeded without its output",
                      json_string_value(json_object_get(job, "id")));
        ck_assert(out[1] == out[0] + 1);
        json_decref(job);
    }
    json_decref(page);
    e2e_kill9_stream_clear(&st);
    e2e_daemon_free(d);
}
END_TEST

/* A waited job submitted while more than QUEUED_IN_MEMORY (1,024) jobs are queued has its job
 * stowed at its commit, before its wait begins: the queue keeps only its entry, the job is in
 * the store alone. Its wait holds the entry; when the wait runs out the answer is the job read
 * back from the store, queued, and a second waited job behind the same queue is answered with
 * its end. The daemon serves on throughout. */
START_TEST(test_a_waited_job_behind_more_than_1024_queued_jobs_waits_on_its_stowed_entry)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    json_t *slow = e2e_long_job_new(4000);
    free(e2e_submit_ok(d, slow));
    json_decref(slow);
    enum { N = 1100 };
    json_t *list = json_array();
    for (int k = 0; k < N; k++)
        json_array_append_new(list, e2e_add_job_new(k));
    char *text = json_dumps(list, JSON_COMPACT);
    json_decref(list);
    json_t *queued = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
    free(text);
    ck_assert_uint_eq(json_array_size(queued), N);
    json_decref(queued);

    text = add_job_text(N);
    json_t *early = e2e_json_ok(d, "POST", "/v1/jobs?wait=0.5", text, 201);
    free(text);
    ck_assert_msg(strcmp(e2e_job_state(early), "queued") == 0, "state %s", e2e_job_state(early));
    ck_assert_msg(json_is_object(json_object_get(early, "waiting")), "no waiting");
    char *id = strdup(json_string_value(json_object_get(early, "id")));
    json_decref(early);

    text = add_job_text(N + 1);
    json_t *ended = e2e_json_ok(d, "POST", "/v1/jobs?wait=60", text, 201);
    free(text);
    char why[128];
    ck_assert_msg(e2e_add_result_ok(ended, N + 1, why, sizeof why), "%s", why);
    json_decref(ended);

    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_msg(e2e_add_result_ok(done, N, why, sizeof why), "%s", why);
    json_decref(done);
    free(id);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=succeeded"), N + 3);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_waited");
    TCase *tc = tcase_create("waited");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_a_waited_answer_is_the_job_the_store_holds_afterwards);
    tcase_add_test(tc, test_a_waited_retry_with_its_key_is_answered_with_the_first_job);
    tcase_add_test(tc,
                   test_a_waited_job_whose_wait_runs_out_survives_a_kill9_right_after_its_answer);
    tcase_add_test(tc, test_a_kill9_among_waited_jobs_leaves_none_succeeded_without_outputs);
    tcase_add_test(tc, test_a_waited_jobs_row_is_listed_running_while_it_runs);
    tcase_add_test(tc, test_a_kill9_while_a_waited_job_runs_loses_nothing_acknowledged);
    tcase_add_test(tc,
                   test_a_waited_job_behind_more_than_1024_queued_jobs_waits_on_its_stowed_entry);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
