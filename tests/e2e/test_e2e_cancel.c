/* Cancel means free, end to end on the real daemon: a running job that is cancelled ends
 * `cancelled` at once, durably, a wait on it returns at once, the answer says what became of
 * it, and on the CPU backend its worker stops and takes the next job long before the cancelled
 * job's sleep would have ended; on CUDA the dropped kernel runs on and holds its owner's one
 * running slot until it ends. A cancelled job's batch-mates keep their results. What a
 * cancelled job ran is charged to its owner: in its record (gpu_ms), in GET /v1/usage and in
 * fair share alike, on CUDA until its dropped kernel ends.
 *
 * Orders are asserted rather than durations where possible: a cancelled sleep is far longer
 * (LONG_MS) than anything else the test does, so the next job's end before the sleep's would-be
 * end (by the jobs' own timestamps) shows that the worker was freed. */
#include <check.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* The cancelled job's sleep: much longer than the whole test is allowed to take; on CUDA,
 * where it runs to its end, short enough to wait for. */
#define LONG_MS 30000
#define CUDA_LONG_MS 4000

/* True when the suite runs the daemon on CUDA ($GPUJOB_E2E_BACKEND), where a launched kernel
 * runs to its end and a cancel answers "dropped" instead of "stopped". */
static bool on_cuda(void)
{
    const char *b = getenv("GPUJOB_E2E_BACKEND");
    return b && strcmp(b, "cuda") == 0;
}

/* On E2E_ONE_WORKER_CONFIG: a job of long_ms that runs on the only worker, and a short one
 * submitted behind it; their ids (malloc'd) go to ret_long_id and ret_next_id. */
static void long_job_then_next(e2e_daemon_t *d, int long_ms, char **ret_long_id, char **ret_next_id)
{
    json_t *long_job = e2e_long_job_new(long_ms);
    *ret_long_id = e2e_submit_ok(d, long_job);
    json_decref(long_job);
    e2e_wait_state_ok(d, *ret_long_id, "running", 10);
    json_t *small = e2e_long_job_new(0);
    *ret_next_id = e2e_submit_ok(d, small);
    json_decref(small);
}

START_TEST(test_cancelled_running_job_frees_its_worker_for_the_next_job)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    const int long_ms = on_cuda() ? CUDA_LONG_MS : LONG_MS;
    char *long_id, *next_id;
    long_job_then_next(d, long_ms, &long_id, &next_id);
    /* The only worker is busy: the next job waits. */
    char path[128], next_path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", long_id);
    snprintf(next_path, sizeof next_path, "/v1/jobs/%s", next_id);
    json_t *next = e2e_json_ok(d, "GET", next_path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(next), "queued");
    json_decref(next);

    json_t *cancelled = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(cancelled), "cancelled");
    ck_assert_str_eq(json_string_value(json_object_get(cancelled, "cancel")),
                     on_cuda() ? "dropped" : "stopped");
    double long_started = e2e_job_time(cancelled, "started_at");
    ck_assert(long_started > 0);
    json_decref(cancelled);

    /* A wait on it answers at once, with its final state. */
    char wait_path[160];
    snprintf(wait_path, sizeof wait_path, "/v1/jobs/%s/wait?timeout=%d", long_id, long_ms / 1000);
    double before = e2e_now();
    json_t *waited = e2e_json_ok(d, "GET", wait_path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(waited), "cancelled");
    ck_assert_msg(e2e_now() - before < long_ms / 2000.0, "the wait on a cancelled job waited");
    json_decref(waited);

    /* On the CPU, the next job runs on the freed worker, and ends while the cancelled sleep
     * would still have been running. On CUDA it starts once the dropped kernel has ended. */
    json_t *done = e2e_wait_final_ok(d, next_id, long_ms / 1000.0 + 15);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    double next_finished = e2e_job_time(done, "finished_at");
    ck_assert(next_finished > 0);
    if (on_cuda())
        ck_assert_msg(e2e_job_time(done, "started_at") >= long_started + 0.9 * long_ms / 1000.0,
                      "the next job started before the dropped kernel could have ended");
    else
        ck_assert_msg(next_finished < long_started + long_ms / 2000.0,
                      "the next job ended only after the cancelled job's sleep would have");
    json_decref(done);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=cancelled"), 1);
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 409));

    /* The cancel is durable: after a restart the job is still cancelled. (On CUDA the drain
     * waits for the launched sleep, within server.drain_timeout_ms.) */
    int status;
    ck_assert_int_eq(e2e_daemon_stop(d, 60000, &status), 0);
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    json_t *after = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(after), "cancelled");
    json_decref(after);

    free(next_id);
    free(long_id);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_cancel_of_a_queued_job_says_dequeued)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    char *long_id, *id;
    long_job_then_next(d, on_cuda() ? CUDA_LONG_MS : LONG_MS, &long_id, &id);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *job = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "cancelled");
    ck_assert_str_eq(json_string_value(json_object_get(job, "cancel")), "dequeued");
    json_decref(job);
    snprintf(path, sizeof path, "/v1/jobs/%s", long_id);
    json_decref(e2e_json_ok(d, "DELETE", path, NULL, 200));

    free(id);
    free(long_id);
    e2e_daemon_free(d);
}
END_TEST

/* The answers that show a running job from the loop's copy (a wait that runs out, the cancel)
 * carry what its submission gave: its params, idempotency key and limits, as a read from the
 * store does. */
START_TEST(test_answers_about_a_running_job_carry_its_params)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    const int long_ms = on_cuda() ? CUDA_LONG_MS : LONG_MS;
    json_t *long_job = e2e_long_job_new(long_ms);
    char *body = json_dumps(long_job, JSON_COMPACT);
    const char *headers[] = {"Content-Type: application/json", "Idempotency-Key: params-1", NULL};
    e2e_response_t r = {0};
    ck_assert_int_eq(e2e_http_request(d, "POST", "/v1/jobs", headers, body, strlen(body), &r), 0);
    ck_assert_int_eq(r.status, 201);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
    e2e_response_clear(&r);
    e2e_wait_state_ok(d, id, "running", 10);

    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/wait?timeout=0.1", id);
    json_t *waited = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(waited), "running");
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *cancelled = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(cancelled), "cancelled");
    json_t *stored = e2e_json_ok(d, "GET", path, NULL, 200);
    json_t *const shown[] = {waited, cancelled, stored};
    for (int i = 0; i < 3; i++) {
        json_t *params = json_object_get(shown[i], "params");
        ck_assert_msg(json_integer_value(json_object_get(params, "ms")) == long_ms,
                      "answer %d shows params %s", i, json_dumps(params, JSON_COMPACT));
        ck_assert_str_eq(json_string_value(json_object_get(shown[i], "idempotency_key")),
                         "params-1");
        ck_assert(json_equal(json_object_get(shown[i], "time_limit_ms"),
                             json_object_get(stored, "time_limit_ms")));
    }
    json_decref(stored);
    json_decref(cancelled);
    json_decref(waited);
    free(body);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

/* A time field of a job or of usage in ms (gpu_ms, run_ms), as the exact integer of ns (or, with
 * unit 1e3, µs) the daemon made it from. */
static int64_t ms_exact(const json_t *o, const char *key, double unit)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_number(v), "%s is not a number", key);
    return (int64_t)llround(json_number_value(v) * unit);
}

/* GET /v1/usage's totals.gpu_ns. */
static int64_t usage_gpu_ns(e2e_daemon_t *d)
{
    json_t *u = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    int64_t ns = json_integer_value(json_object_get(json_object_get(u, "totals"), "gpu_ns"));
    json_decref(u);
    return ns;
}

/* The fair-share usage (µs) the daemon saved for owner (its fair_share table, written at its
 * stop); -1 when it saved none. */
static double saved_fair_share_us(e2e_daemon_t *d, const char *owner)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/state/gpujobd.db", e2e_daemon_dir(d));
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *stmt = NULL;
    ck_assert_int_eq(
        sqlite3_prepare_v2(db, "SELECT usage_us FROM fair_share WHERE owner = ?1", -1, &stmt, NULL),
        SQLITE_OK);
    sqlite3_bind_text(stmt, 1, owner, -1, SQLITE_TRANSIENT);
    double us = sqlite3_step(stmt) == SQLITE_ROW ? sqlite3_column_double(stmt, 0) : -1;
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return us;
}

/* A job that runs for a while is cancelled after more than a second: the cancel's answer
 * charges it at least that second; once its launch returns (the next job behind it has run),
 * its record, the usage rollup and fair share all hold the same device time, the cancelled
 * job's and the next job's. On CUDA the dropped kernel runs to its end, and is charged for
 * all of it. */
START_TEST(test_a_cancelled_running_job_is_charged_the_time_it_ran)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    const int long_ms = on_cuda() ? CUDA_LONG_MS : LONG_MS;
    char *long_id, *next_id;
    long_job_then_next(d, long_ms, &long_id, &next_id);
    usleep(1100 * 1000);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", long_id);
    json_t *cancelled = e2e_json_ok(d, "DELETE", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(cancelled), "cancelled");
    int64_t at_cancel_ns = ms_exact(cancelled, "gpu_ms", 1e6);
    ck_assert_msg(at_cancel_ns >= INT64_C(1000000000),
                  "a job cancelled after 1.1 s of running was charged %.3f ms", at_cancel_ns / 1e6);
    json_decref(cancelled);

    /* The next job runs once the cancelled launch has returned (its owner's one running slot
     * is held until then), whose end is charged before the next one's. */
    json_t *next = e2e_wait_final_ok(d, next_id, long_ms / 1000.0 + 15);
    ck_assert_str_eq(e2e_job_state(next), "succeeded");
    int64_t next_ns = ms_exact(next, "gpu_ms", 1e6);
    char owner[128];
    snprintf(owner, sizeof owner, "%s", json_string_value(json_object_get(next, "owner")));
    json_decref(next);
    json_t *job = e2e_json_ok(d, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "cancelled");
    int64_t charged_ns = ms_exact(job, "gpu_ms", 1e6);
    ck_assert_int_ge(charged_ns, at_cancel_ns);
    if (on_cuda())
        ck_assert_msg(charged_ns >= INT64_C(900000) * long_ms,
                      "the dropped kernel of %d ms was charged %.3f ms", long_ms, charged_ns / 1e6);
    json_decref(job);
    ck_assert_int_eq(usage_gpu_ns(d), charged_ns + next_ns);

    /* Fair share was charged the same (saved at the stop; a week's half-life takes next to
     * nothing off over the test). */
    int status;
    ck_assert_int_eq(e2e_daemon_stop(d, 60000, &status), 0);
    double fair_us = saved_fair_share_us(d, owner), want_us = (charged_ns + next_ns) / 1e3;
    ck_assert_msg(fabs(fair_us - want_us) <= want_us * 1e-4 + 1,
                  "fair share holds %.0f us of '%s', the jobs' records %.0f us", fair_us, owner,
                  want_us);

    free(next_id);
    free(long_id);
    e2e_daemon_free(d);
}
END_TEST

/* Rows and columns of the batch's GEMMs: large enough that a batch of them runs for a while on
 * one CPU worker, which runs its jobs in turn. */
#define GEMM_N 512
#define BATCH 4

/* A gemm of two uploaded buffers. */
static json_t *gemm_job(const char *a_id, const char *b_id)
{
    return json_pack("{s:s, s:{s:{s:s}, s:{s:s}}}", "op", "gemm", "inputs", "a", "buffer", a_id,
                     "b", "buffer", b_id);
}

/* One array of BATCH equal GEMMs goes out as one batch; the last one is cancelled while the
 * batch runs. The others succeed with the right result, and the cancelled one ends
 * `cancelled` with no output. */
START_TEST(test_batch_mates_of_a_cancelled_job_keep_their_results)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[scheduler]\ncpu_threads = 1\n");
    float *ones = malloc(sizeof(float) * GEMM_N * GEMM_N);
    for (int i = 0; i < GEMM_N * GEMM_N; i++)
        ones[i] = 1;
    char shape[32];
    snprintf(shape, sizeof shape, "%d,%d", GEMM_N, GEMM_N);
    json_t *a = e2e_upload_ok(d, "f32", shape, ones, sizeof(float) * GEMM_N * GEMM_N, false, 201);
    const char *a_id = json_string_value(json_object_get(a, "id"));
    json_t *arr = json_array();
    for (int i = 0; i < BATCH; i++)
        json_array_append_new(arr, gemm_job(a_id, a_id));
    char *body = json_dumps(arr, JSON_COMPACT);
    json_t *jobs = e2e_json_ok(d, "POST", "/v1/jobs", body, 201);
    ck_assert_int_eq(json_array_size(jobs), BATCH);
    const char *victim = json_string_value(json_object_get(json_array_get(jobs, BATCH - 1), "id"));
    e2e_wait_state_ok(d, victim, "running", 10);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", victim);
    e2e_response_t r = {0};
    ck_assert_int_eq(e2e_http_request(d, "DELETE", path, NULL, NULL, 0, &r), 0);
    /* 409 only if the whole batch ended first: then there is nothing to show. */
    if (r.status == 200) {
        const char *what = json_string_value(json_object_get(r.json, "cancel"));
        ck_assert_msg(what && (!strcmp(what, "dequeued") || !strcmp(what, "stopped") ||
                               !strcmp(what, "dropped")),
                      "cancel: %s", what ? what : "(none)");
        ck_assert_str_eq(e2e_job_state(r.json), "cancelled");
    } else {
        ck_assert_int_eq(r.status, 409);
        fprintf(stderr, "the batch ended before its cancel: nothing was cancelled\n");
    }
    e2e_response_clear(&r);

    float *out = malloc(sizeof(float) * GEMM_N * GEMM_N);
    int64_t sum_ns = 0; /* the jobs' charges, the cancelled one's included */
    for (int i = 0; i < BATCH; i++) {
        const char *id = json_string_value(json_object_get(json_array_get(jobs, i), "id"));
        json_t *done = e2e_wait_final_ok(d, id, 120);
        if (i == BATCH - 1 && strcmp(e2e_job_state(done), "succeeded") != 0) {
            ck_assert_str_eq(e2e_job_state(done), "cancelled");
            /* Its record says what it was charged once the batch returned. */
            json_decref(done);
            done = e2e_get_job_ok(d, id);
            sum_ns += ms_exact(done, "gpu_ms", 1e6);
            json_decref(done);
            continue;
        }
        sum_ns += ms_exact(done, "gpu_ms", 1e6);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        ck_assert_int_eq(json_integer_value(json_object_get(done, "batch_size")), BATCH);
        e2e_output_raw_ok(d, id, "out", out, sizeof(float) * GEMM_N * GEMM_N);
        for (int k = 0; k < GEMM_N * GEMM_N; k++)
            ck_assert_msg(out[k] == GEMM_N, "job %d out[%d] = %g", i, k, out[k]);
        json_decref(done);
    }
    /* The usage rollup holds exactly what the jobs' records say. */
    ck_assert_int_eq(usage_gpu_ns(d), sum_ns);
    free(out);
    free(body);
    free(ones);
    json_decref(arr);
    json_decref(jobs);
    json_decref(a);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_cancel");
    TCase *tc = tcase_create("cancel");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cancelled_running_job_frees_its_worker_for_the_next_job);
    tcase_add_test(tc, test_cancel_of_a_queued_job_says_dequeued);
    tcase_add_test(tc, test_answers_about_a_running_job_carry_its_params);
    tcase_add_test(tc, test_batch_mates_of_a_cancelled_job_keep_their_results);
    tcase_add_test(tc, test_a_cancelled_running_job_is_charged_the_time_it_ran);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
