/* End-to-end: SIGHUP reloads the configuration file. Limits, users, admins and the auth mode
 * change for the next request without a connection dropped or a job lost, also while clients
 * submit and wait; a file that does not check out is refused with its reason logged and the
 * old settings stay; a key that changes only at restart is warned about and kept. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* Writes ini over the daemon's configuration file, sends SIGHUP and waits until the daemon has
 * logged one more line containing outcome ("reloaded the configuration" or "reload
 * refused"). */
static void reload_ok(e2e_daemon_t *d, const char *ini, const char *outcome)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/gpujobd.conf", e2e_daemon_dir(d));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    FILE *f = fopen(tmp, "w");
    ck_assert_ptr_nonnull(f);
    fputs(ini, f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(rename(tmp, path), 0); /* as an editor saves it: never half-written */
    int before = e2e_daemon_log_count(d, outcome);
    ck_assert_int_eq(kill(e2e_daemon_pid(d), SIGHUP), 0);
    for (int i = 0; i < 1000 && e2e_daemon_log_count(d, outcome) == before; i++)
        usleep(10000);
    ck_assert_int_gt(e2e_daemon_log_count(d, outcome), before);
}

/* POST /v1/jobs with a token (NULL: none); the status, and the job's id into id (64 bytes)
 * when it is 201. */
static long submit(e2e_daemon_t *d, const char *token, const json_t *job, char *id, char *field)
{
    char auth[E2E_TOKEN_SIZE + 32];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token ? token : "");
    const char *headers[] = {"Content-Type: application/json", token ? auth : NULL, NULL};
    char *body = json_dumps(job, 0);
    e2e_response_t resp;
    long status = -1;
    if (e2e_http_request(d, "POST", "/v1/jobs", headers, body, strlen(body), &resp) == 0) {
        status = resp.status;
        if (status == 201 && id)
            snprintf(id, 64, "%s", json_string_value(json_object_get(resp.json, "id")));
        if (field) snprintf(field, 128, "%s", e2e_error_field(resp.json));
        e2e_response_clear(&resp);
    }
    free(body);
    return status;
}

/* GET path with a token (NULL: none): the status. */
static long get_status(e2e_daemon_t *d, const char *token, const char *path, const char **state)
{
    char auth[E2E_TOKEN_SIZE + 32];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token ? token : "");
    const char *headers[] = {token ? auth : NULL, NULL};
    e2e_response_t resp;
    if (e2e_http_request(d, "GET", path, headers, NULL, 0, &resp) < 0) return -1;
    long status = resp.status;
    static __thread char st[32];
    snprintf(st, sizeof st, "%s", e2e_job_state(resp.json));
    if (state) *state = st;
    e2e_response_clear(&resp);
    return status;
}

/* Whether job id ended succeeded, waiting at most 60 s. */
static bool ends_succeeded(e2e_daemon_t *d, const char *token, const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/wait?timeout=30", id);
    for (int i = 0; i < 2; i++) {
        const char *state = "";
        if (get_status(d, token, path, &state) != 200) return false;
        if (strcmp(state, "succeeded") == 0) return true;
        if (strcmp(state, "queued") != 0 && strcmp(state, "running") != 0) return false;
    }
    return false;
}

/* Waits (at most 10 s) until job id runs. */
static void wait_running_ok(e2e_daemon_t *d, const char *token, const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    const char *state = "";
    for (int i = 0; i < 1000; i++) {
        ck_assert_int_eq(get_status(d, token, path, &state), 200);
        if (strcmp(state, "running") == 0) return;
        usleep(10000);
    }
    ck_abort_msg("job %s is %s, not running", id, state);
}

typedef struct load {
    e2e_daemon_t *d;
    const char *token;
    atomic_bool stop;
    atomic_long done, failed;
} load_t;

/* A client that submits a short job and waits for its end, again and again: every request
 * must succeed and every job end succeeded. */
static void *load_thread(void *arg)
{
    load_t *l = arg;
    json_t *job = e2e_long_job_new(1);
    while (!atomic_load(&l->stop)) {
        char id[64];
        if (submit(l->d, l->token, job, id, NULL) != 201 || !ends_succeeded(l->d, l->token, id))
            atomic_fetch_add(&l->failed, 1);
        else
            atomic_fetch_add(&l->done, 1);
    }
    json_decref(job);
    e2e_http_thread_done();
    return NULL;
}

#define LOAD_CONFIG(prober_queued)                                                                 \
    "[auth]\nmode = token\n[scheduler]\ncpu_threads = 2\n[user.prober]\nmax_running = 1\n"         \
    "max_queued = " prober_queued "\n"

START_TEST(test_limits_changed_by_sighup_under_load_apply_with_no_failed_request)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(LOAD_CONFIG("1000"));
    char loader[E2E_TOKEN_SIZE], prober[E2E_TOKEN_SIZE];
    e2e_token_create_ok(d, "loader", NULL, loader);
    e2e_token_create_ok(d, "prober", NULL, prober);
    load_t l = {.d = d, .token = loader};
    enum { CLIENTS = 3 };
    pthread_t threads[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        ck_assert_int_eq(pthread_create(&threads[i], NULL, load_thread, &l), 0);

    reload_ok(d, LOAD_CONFIG("2"), "reloaded the configuration");
    /* The prober's long job runs (max_running = 1); two more wait, the limit's worth. */
    json_t *long_job = e2e_long_job_new(5000), *short_job = e2e_long_job_new(1);
    char ids[4][64], field[128];
    ck_assert_int_eq(submit(d, prober, long_job, ids[0], NULL), 201);
    wait_running_ok(d, prober, ids[0]);
    ck_assert_int_eq(submit(d, prober, short_job, ids[1], NULL), 201);
    ck_assert_int_eq(submit(d, prober, short_job, ids[2], NULL), 201);
    ck_assert_int_eq(submit(d, prober, short_job, ids[3], field), 429);
    ck_assert_str_eq(field, "user.prober.max_queued");

    reload_ok(d, LOAD_CONFIG("1000"), "reloaded the configuration");
    ck_assert_int_eq(submit(d, prober, short_job, ids[3], NULL), 201);
    const char *state = "";
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", ids[0]);
    ck_assert_int_eq(get_status(d, prober, path, &state), 200);
    ck_assert_str_eq(state, "running"); /* the raised limit, not a drained queue, let it in */

    atomic_store(&l.stop, true);
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(ends_succeeded(d, prober, ids[i]), "job %s did not succeed", ids[i]);
    ck_assert_int_eq(atomic_load(&l.failed), 0);
    ck_assert_int_gt(atomic_load(&l.done), 0);
    json_decref(long_job);
    json_decref(short_job);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_admins_and_auth_mode_change_at_reload)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[auth]\nmode = token\n");
    char alice[E2E_TOKEN_SIZE];
    e2e_token_create_ok(d, "alice", NULL, alice);
    ck_assert_int_eq(get_status(d, alice, "/metrics", NULL), 403);
    reload_ok(d, "[auth]\nmode = token\nadmins = alice\n", "reloaded the configuration");
    ck_assert_int_eq(get_status(d, alice, "/metrics", NULL), 200);
    /* Token mode: a request without one is refused; with mode = none it is "local"'s. */
    ck_assert_int_eq(get_status(d, NULL, "/v1/jobs", NULL), 401);
    reload_ok(d, "[auth]\nmode = none\n", "reloaded the configuration");
    ck_assert_int_eq(get_status(d, NULL, "/v1/jobs", NULL), 200);
    e2e_daemon_free(d);
}
END_TEST

/* One worker, one running job per user, and QUEUED more at most. */
#define QUEUE_OF(queued)                                                                           \
    "[scheduler]\ncpu_threads = 1\n[limits]\nmax_running_per_user = 1\nmax_queued_per_user "       \
    "= " queued "\n"
#define QUEUE_OF_TWO QUEUE_OF("2")

/* With the daemon on QUEUE_OF_TWO: a long job runs, two wait, and a third is refused naming
 * limits.max_queued_per_user. Returns the ids of the three accepted jobs in ids. */
static void queue_of_two_holds(e2e_daemon_t *d, char ids[3][64])
{
    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS), *short_job = e2e_long_job_new(1);
    char field[128];
    ck_assert_int_eq(submit(d, NULL, long_job, ids[0], NULL), 201);
    wait_running_ok(d, NULL, ids[0]);
    ck_assert_int_eq(submit(d, NULL, short_job, ids[1], NULL), 201);
    ck_assert_int_eq(submit(d, NULL, short_job, ids[2], NULL), 201);
    ck_assert_int_eq(submit(d, NULL, short_job, NULL, field), 429);
    ck_assert_str_eq(field, "limits.max_queued_per_user");
    json_decref(long_job);
    json_decref(short_job);
}

START_TEST(test_an_invalid_file_is_refused_and_the_old_limits_stay)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(QUEUE_OF_TWO);
    reload_ok(d, QUEUE_OF("banana"), "reload refused");
    ck_assert_int_eq(e2e_daemon_log_count(d, "max_queued_per_user: expected an integer"), 1);
    reload_ok(d, QUEUE_OF("1000") "no_such_key = 1\n", "reload refused");
    ck_assert_int_eq(e2e_daemon_log_count(d, "unknown key 'no_such_key'"), 1);
    /* Not even the valid line of the refused file applies: the limit is still two. */
    char ids[3][64];
    queue_of_two_holds(d, ids);
    for (int i = 0; i < 3; i++)
        ck_assert(ends_succeeded(d, NULL, ids[i]));
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_restart_only_key_is_warned_about_and_kept)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(QUEUE_OF_TWO);
    reload_ok(d, QUEUE_OF_TWO "[server]\nhttp_threads = 3\n[store]\nretention_s = 120\n",
              "reloaded the configuration");
    ck_assert_int_eq(e2e_daemon_log_count(d, "server.http_threads changes only at restart; kept"),
                     1);
    ck_assert_int_eq(e2e_daemon_log_count(d, "store.retention_s changes only at restart; kept"), 1);
    /* The rest of the file applied, and the daemon serves on. */
    char ids[3][64];
    queue_of_two_holds(d, ids);
    for (int i = 0; i < 3; i++)
        ck_assert(ends_succeeded(d, NULL, ids[i]));
    e2e_daemon_free(d);
}
END_TEST

static Suite *reload_suite(void)
{
    Suite *s = suite_create("e2e_reload");
    TCase *tc = tcase_create("reload");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_limits_changed_by_sighup_under_load_apply_with_no_failed_request);
    tcase_add_test(tc, test_admins_and_auth_mode_change_at_reload);
    tcase_add_test(tc, test_an_invalid_file_is_refused_and_the_old_limits_stay);
    tcase_add_test(tc, test_a_restart_only_key_is_warned_about_and_kept);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(reload_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
