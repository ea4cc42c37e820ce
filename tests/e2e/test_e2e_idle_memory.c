/* End-to-end: an idle gpujobd gives back what a burst of submissions left in its allocator.
 * Arrays of jobs are parsed, built and committed by the HTTP threads and the loop, and most of
 * those bytes are freed once the jobs are queued; 30 s after the burst, with nothing happening,
 * the daemon's resident set must be within IDLE_SLACK_MIB of a daemon started afresh on the
 * same queue, which holds the queue alone. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/run_suite.h"

#define ARRAYS 6
#define ARRAY_JOBS 10000
#define IDLE_S 30
#define IDLE_SLACK_MIB 128

/* An array of n one-element add jobs (malloc'd JSON text). */
static char *add_array_new(int n)
{
    static const char job[] =
        "{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[1],"
        "\"data\":[1]},\"y\":{\"dtype\":\"f32\",\"shape\":[1],\"data\":[2]}}}";
    size_t cap = (size_t)n * sizeof job + 2, len = 0;
    char *text = malloc(cap);
    ck_assert_ptr_nonnull(text);
    text[len++] = '[';
    for (int i = 0; i < n; i++) {
        if (i) text[len++] = ',';
        memcpy(text + len, job, sizeof job - 1);
        len += sizeof job - 1;
    }
    text[len++] = ']';
    text[len] = '\0';
    return text;
}

static void wait_ready(e2e_daemon_t *d)
{
    double until = e2e_now() + 60;
    for (;;) {
        e2e_response_t r = {0};
        long status = e2e_http_request(d, "GET", "/readyz", NULL, NULL, 0, &r) == 0 ? r.status : 0;
        e2e_response_clear(&r);
        if (status == 200) return;
        ck_assert_msg(e2e_now() < until, "not ready 60 s after its start (readyz %ld)", status);
        usleep(100 * 1000);
    }
}

START_TEST(test_an_idle_daemon_gives_back_what_a_burst_left)
{
    /* One worker held by long jobs (three minutes of them): everything submitted after them
     * stays queued. A short drain, so that the stop below does not wait for the one running. */
    e2e_daemon_t *d =
        e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG "[server]\ndrain_timeout_ms = 100\n");
    json_t *sleep_job = e2e_long_job_new(60000);
    char *sleep_ids[3];
    for (int i = 0; i < 3; i++)
        sleep_ids[i] = e2e_submit_ok(d, sleep_job);
    json_decref(sleep_job);
    e2e_wait_state_ok(d, sleep_ids[0], "running", 30);
    for (int i = 0; i < 3; i++)
        free(sleep_ids[i]);

    char *array = add_array_new(ARRAY_JOBS);
    const char *const json_type[] = {"Content-Type: application/json", NULL};
    for (int i = 0; i < ARRAYS; i++) {
        e2e_response_t r = {0};
        ck_assert_int_eq(
            e2e_http_request(d, "POST", "/v1/jobs", json_type, array, strlen(array), &r), 0);
        ck_assert_msg(r.status == 201, "array %d: %ld %.200s", i, r.status, r.body);
        e2e_response_clear(&r);
    }
    free(array);
    long burst_kib = e2e_daemon_status_kib(d, "VmRSS");
    sleep(IDLE_S);
    long idle_kib = e2e_daemon_status_kib(d, "VmRSS");

    /* The same queue in a daemon started afresh. */
    int status;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    wait_ready(d);
    long fresh_kib = e2e_daemon_status_kib(d, "VmRSS");
    fprintf(stderr,
            "RSS: %ld MiB right after %d jobs, %ld MiB %d s later, %ld MiB in a daemon started "
            "on that queue\n",
            burst_kib / 1024, ARRAYS * ARRAY_JOBS, idle_kib / 1024, IDLE_S, fresh_kib / 1024);
    ck_assert_msg(idle_kib - fresh_kib <= IDLE_SLACK_MIB * 1024,
                  "idle for %d s after the burst, the daemon holds %ld MiB, %ld MiB more than a "
                  "daemon started on the same queue",
                  IDLE_S, idle_kib / 1024, (idle_kib - fresh_kib) / 1024);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_idle_memory");
    TCase *tc = tcase_create("idle_memory");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_an_idle_daemon_gives_back_what_a_burst_left);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
