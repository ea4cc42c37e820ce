/* Usage end to end: the real gpujobd with [auth] mode = token, two token users (alice, bob)
 * and an admin (carol). GET /v1/usage's totals equal the sums of the jobs' own run_ms and
 * gpu_ms (as exact integers: the rollup's run_us and gpu_ns), and stay the same after
 * retention has deleted the jobs; another user's usage is the admin's alone; a bad since,
 * until or user answers 400 naming it; a batch's jobs' gpu_ms sum to its batch_gpu_ms; and
 * libgpujob and `gpujob usage --all` report the same rows. A user whose GPU-time budget is
 * spent is refused (429 budget_exceeded naming the key, with the reset time) while another user
 * is not; usage and `gpujob usage` show the budget used, left and its reset; and the budget
 * holds across a restart and follows a reload. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpujob.h"
#include "support/daemon_harness.h"

/* Jobs expire a minute after they end (the shortest retention there is), swept every second. */
#define USAGE_CONFIG                                                                               \
    "[auth]\nmode = token\nadmins = carol\n[store]\nretention_s = 60\ngc_interval_s = 1\n"

#define ADD_JOB                                                                                    \
    "{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[3],\"data\":[1,2,3]},\"y\":{" \
    "\"dtype\":\"f32\",\"shape\":[3],\"data\":[3,4,5]}}}"
#define SAXPY_JOB                                                                                  \
    "{\"op\":\"saxpy\",\"params\":{\"a\":2},\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[2],"   \
    "\"data\":[1,2]},\"y\":{\"dtype\":\"f32\",\"shape\":[2],\"data\":[3,4]}}}"

typedef struct tokens {
    char alice[E2E_TOKEN_SIZE], bob[E2E_TOKEN_SIZE], carol[E2E_TOKEN_SIZE];
} tokens_t;

static void tokens_make(e2e_daemon_t *d, tokens_t *t)
{
    e2e_token_create_ok(d, "alice", NULL, t->alice);
    e2e_token_create_ok(d, "bob", NULL, t->bob);
    e2e_token_create_ok(d, "carol", NULL, t->carol);
}

/* One request as the holder of token (NULL: none) that must answer expect; the answer's JSON
 * (a new reference; json null when it has none). */
static json_t *as_user(e2e_daemon_t *d, const char *token, const char *method, const char *path,
                       const char *body, long expect)
{
    char auth[256];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token ? token : "");
    const char *headers[] = {"Content-Type: application/json", token ? auth : NULL, NULL};
    e2e_response_t r;
    ck_assert_int_eq(e2e_http_request(d, method, path, headers, body, body ? strlen(body) : 0, &r),
                     0);
    ck_assert_msg(r.status == expect, "%s %s: %ld, expected %ld: %s", method, path, r.status,
                  expect, r.body);
    json_t *v = r.json ? json_incref(r.json) : json_null();
    e2e_response_clear(&r);
    return v;
}

/* A number of milliseconds as the exact integer of unit (1e3: µs, 1e6: ns) it was made from. */
static int64_t ms_exact(const json_t *o, const char *key, double unit)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_number(v), "%s is not a number", key);
    return (int64_t)llround(json_number_value(v) * unit);
}

static int64_t int_of(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "%s is not an integer", key);
    return json_integer_value(v);
}

/* What a user's jobs used, summed from the jobs' own answers. */
typedef struct sums {
    int64_t jobs, run_us, gpu_ns;
} sums_t;

/* Submits body as token's holder, waits until the job ends (it must succeed), adds its run_ms
 * and gpu_ms to *s and copies its id into id (64 bytes). */
static void job_run(e2e_daemon_t *d, const char *token, const char *body, sums_t *s, char *id)
{
    json_t *job = as_user(d, token, "POST", "/v1/jobs", body, 201);
    snprintf(id, 64, "%s", json_string_value(json_object_get(job, "id")));
    json_decref(job);
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/wait?timeout=30", id);
    json_decref(as_user(d, token, "GET", path, NULL, 200));
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    job = as_user(d, token, "GET", path, NULL, 200);
    ck_assert_str_eq(e2e_job_state(job), "succeeded");
    s->jobs++;
    s->run_us += ms_exact(job, "run_ms", 1e3);
    s->gpu_ns += ms_exact(job, "gpu_ms", 1e6);
    json_decref(job);
}

/* GET /v1/usage?query as token's holder: the answer (a new reference), whose totals must
 * equal s and agree with the sum of its rows and with its top-level run_ms and gpu_ms. */
static json_t *usage_equals(e2e_daemon_t *d, const char *token, const char *query, const sums_t *s)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/usage%s%s", query[0] ? "?" : "", query);
    json_t *u = as_user(d, token, "GET", path, NULL, 200);
    json_t *totals = json_object_get(u, "totals");
    ck_assert_int_eq(int_of(totals, "jobs"), s->jobs);
    ck_assert_int_eq(int_of(totals, "succeeded"), s->jobs);
    ck_assert_int_eq(int_of(totals, "run_us"), s->run_us);
    ck_assert_int_eq(int_of(totals, "gpu_ns"), s->gpu_ns);
    ck_assert_int_eq(ms_exact(u, "gpu_ms", 1e6), s->gpu_ns);
    ck_assert_int_eq(ms_exact(u, "run_ms", 1e3), s->run_us);
    sums_t rows = {0};
    json_t *days = json_object_get(u, "days"), *row;
    size_t i;
    json_array_foreach(days, i, row)
    {
        rows.jobs += int_of(row, "jobs");
        rows.run_us += int_of(row, "run_us");
        rows.gpu_ns += int_of(row, "gpu_ns");
    }
    ck_assert(rows.jobs == s->jobs && rows.run_us == s->run_us && rows.gpu_ns == s->gpu_ns);
    return u;
}

static void sums_add(sums_t *t, const sums_t *a)
{
    t->jobs += a->jobs;
    t->run_us += a->run_us;
    t->gpu_ns += a->gpu_ns;
}

/* Polls GET /v1/jobs/{id} until retention has deleted the job (404); fails after 120 s. */
static void wait_expired(e2e_daemon_t *d, const char *token, const char *id)
{
    char path[160], auth[256];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    const char *headers[] = {auth, NULL};
    double until = e2e_now() + 120;
    for (;;) {
        e2e_response_t r;
        ck_assert_int_eq(e2e_http_request(d, "GET", path, headers, NULL, 0, &r), 0);
        long status = r.status;
        e2e_response_clear(&r);
        if (status == 404 || status == 410) return;
        ck_assert_int_eq(status, 200);
        ck_assert_msg(e2e_now() < until, "job %s was not deleted by retention", id);
        usleep(500 * 1000);
    }
}

START_TEST(test_usage_totals_equal_the_jobs_and_outlive_their_retention)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(USAGE_CONFIG);
    tokens_t t;
    tokens_make(d, &t);
    sums_t alice = {0}, bob = {0}, all = {0};
    char ids[5][64];
    job_run(d, t.alice, ADD_JOB, &alice, ids[0]);
    job_run(d, t.alice, SAXPY_JOB, &alice, ids[1]);
    job_run(d, t.alice, ADD_JOB, &alice, ids[2]);
    job_run(d, t.bob, SAXPY_JOB, &bob, ids[3]);
    job_run(d, t.bob, ADD_JOB, &bob, ids[4]);
    sums_add(&all, &alice);
    sums_add(&all, &bob);
    ck_assert_int_gt(alice.gpu_ns, 0);

    json_t *before[4] = {usage_equals(d, t.alice, "", &alice), usage_equals(d, t.bob, "", &bob),
                         usage_equals(d, t.carol, "user=alice", &alice),
                         usage_equals(d, t.carol, "user=all", &all)};
    /* The admin's view of alice is alice's own; user=all holds both users' rows. */
    ck_assert_str_eq(json_string_value(json_object_get(before[2], "owner")), "alice");
    ck_assert(json_equal(json_object_get(before[0], "days"), json_object_get(before[2], "days")));
    ck_assert_str_eq(json_string_value(json_object_get(before[3], "owner")), "*");
    bool seen_bob = false;
    json_t *row;
    size_t i;
    json_array_foreach(json_object_get(before[3], "days"), i, row) seen_bob |=
        strcmp(json_string_value(json_object_get(row, "user")), "bob") == 0;
    ck_assert(seen_bob);

    for (int k = 0; k < 5; k++)
        wait_expired(d, k < 3 ? t.alice : t.bob, ids[k]);
    json_t *after[4] = {usage_equals(d, t.alice, "", &alice), usage_equals(d, t.bob, "", &bob),
                        usage_equals(d, t.carol, "user=alice", &alice),
                        usage_equals(d, t.carol, "user=all", &all)};
    for (int k = 0; k < 4; k++) {
        ck_assert(
            json_equal(json_object_get(before[k], "totals"), json_object_get(after[k], "totals")));
        ck_assert(
            json_equal(json_object_get(before[k], "days"), json_object_get(after[k], "days")));
        json_decref(before[k]);
        json_decref(after[k]);
    }
    e2e_daemon_free(d);
}
END_TEST

/* The field of an error answer to GET /v1/usage?query as token's holder, which must be
 * expect; a static copy. */
static const char *usage_error_field(e2e_daemon_t *d, const char *token, const char *query,
                                     long expect)
{
    static char field[64];
    char path[256];
    snprintf(path, sizeof path, "/v1/usage?%s", query);
    json_t *e = as_user(d, token, "GET", path, NULL, expect);
    snprintf(field, sizeof field, "%s", e2e_error_field(e));
    json_decref(e);
    return field;
}

START_TEST(test_others_usage_is_the_admins_and_bad_ranges_name_their_field)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(USAGE_CONFIG);
    tokens_t t;
    tokens_make(d, &t);
    usage_error_field(d, t.alice, "user=bob", 403);
    usage_error_field(d, t.alice, "user=all", 403);
    usage_error_field(d, t.alice, "user=*", 403);
    json_decref(as_user(d, NULL, "GET", "/v1/usage", NULL, 401));
    json_decref(as_user(d, t.alice, "GET", "/v1/usage?user=alice", NULL, 200));
    json_decref(as_user(d, t.carol, "GET", "/v1/usage?user=bob", NULL, 200));

    ck_assert_str_eq(usage_error_field(d, t.alice, "since=yesterday", 400), "query.since");
    ck_assert_str_eq(usage_error_field(d, t.alice, "since=2026-02-30", 400), "query.since");
    ck_assert_str_eq(usage_error_field(d, t.alice, "until=2026-01-01T25:00:00Z", 400),
                     "query.until");
    ck_assert_str_eq(usage_error_field(d, t.alice, "since=2026-03-02&until=2026-03-01", 400),
                     "query.until");
    ck_assert_str_eq(usage_error_field(d, t.carol, "user=", 400), "query.user");
    ck_assert_str_eq(usage_error_field(d, t.alice, "day=2026-03-01", 400), "query.day");

    /* A range is echoed as days; an RFC 3339 time counts from its UTC day. */
    json_t *u = as_user(d, t.alice, "GET",
                        "/v1/usage?since=2026-03-01T23:30:00-02:00&until=2026-03-05", NULL, 200);
    ck_assert_str_eq(json_string_value(json_object_get(u, "since")), "2026-03-02");
    ck_assert_str_eq(json_string_value(json_object_get(u, "until")), "2026-03-05");
    json_decref(u);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_batchs_jobs_gpu_ms_sum_to_its_batch_gpu_ms)
{
    /* One worker and a second's wait for company: the list's jobs run as one batch. */
    e2e_daemon_t *d = e2e_daemon_start_ok("[scheduler]\ncpu_threads = 1\nmax_delay_us = 1000000\n");
    enum { N = 8 };
    char list[N * 200] = "[";
    for (int i = 0; i < N; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list),
                 "%s{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[4],\"data\":"
                 "[%d,2,3,4]},\"y\":{\"dtype\":\"f32\",\"shape\":[4],\"data\":[1,1,1,1]}}}",
                 i ? "," : "", i);
    strcat(list, "]");
    json_t *made = e2e_json_ok(d, "POST", "/v1/jobs", list, 201);
    json_t *jobs = json_is_array(made) ? made : json_object_get(made, "jobs");
    ck_assert_int_eq(json_array_size(jobs), N);
    int64_t sum_ns = 0, batch_ns = -1, batch_size = 0;
    json_t *j;
    size_t i;
    json_array_foreach(jobs, i, j)
    {
        json_t *job = e2e_wait_final_ok(d, json_string_value(json_object_get(j, "id")), 30);
        ck_assert_str_eq(e2e_job_state(job), "succeeded");
        if (batch_ns < 0) {
            batch_ns = ms_exact(job, "batch_gpu_ms", 1e6);
            batch_size = int_of(job, "batch_size");
        }
        ck_assert_int_eq(ms_exact(job, "batch_gpu_ms", 1e6), batch_ns);
        ck_assert_int_eq(int_of(job, "batch_size"), batch_size);
        sum_ns += ms_exact(job, "gpu_ms", 1e6);
        json_decref(job);
    }
    json_decref(made);
    ck_assert_int_eq(batch_size, N);
    ck_assert_int_gt(batch_ns, 0);
    ck_assert_int_eq(sum_ns, batch_ns);
    /* And the rollup counts the batch's time once, whole. */
    json_t *u = e2e_json_ok(d, "GET", "/v1/usage", NULL, 200);
    ck_assert_int_eq(int_of(json_object_get(u, "totals"), "gpu_ns"), batch_ns);
    json_decref(u);
    e2e_daemon_free(d);
}
END_TEST

/* Runs `gpujob ARGS` against d with GPUJOB_TOKEN=token; its exit status, stdout into out. */
static int cli_run(e2e_daemon_t *d, const char *token, const char *args, char *out, size_t size)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "GPUJOB_TOKEN='%s' '%s' --url '%s' %s 2>/dev/null", token,
             getenv("GPUJOB_CLI"), e2e_daemon_url(d), args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_library_and_cli_report_every_users_rows_to_the_admin)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(USAGE_CONFIG);
    tokens_t t;
    tokens_make(d, &t);
    sums_t alice = {0}, bob = {0};
    char id[64];
    job_run(d, t.alice, ADD_JOB, &alice, id);
    job_run(d, t.bob, SAXPY_JOB, &bob, id);

    setenv("GPUJOB_TOKEN", t.carol, 1);
    gpujob_client_t *c = NULL;
    char err[256];
    ck_assert_int_eq(gpujob_client_new(e2e_daemon_url(d), &c, err, sizeof err), 0);
    gpujob_usage_report_t *report = NULL;
    gpujob_usage_query_t q = {.user = "all"};
    ck_assert_int_eq(gpujob_usage_report(c, &q, &report), 0);
    ck_assert_int_eq(report->n_rows, 2);
    ck_assert_str_eq(report->rows[0].user, "alice");
    ck_assert_str_eq(report->rows[0].op, "add");
    ck_assert_int_eq(report->rows[0].gpu_ns, alice.gpu_ns);
    ck_assert_str_eq(report->rows[1].user, "bob");
    ck_assert_int_eq(report->rows[1].run_us, bob.run_us);
    ck_assert_int_eq(report->totals.gpu_ns, alice.gpu_ns + bob.gpu_ns);
    ck_assert_int_eq(strlen(report->rows[0].date), 10);
    gpujob_usage_report_free(report);
    q = (gpujob_usage_query_t){.since = "someday"};
    ck_assert_int_eq(gpujob_usage_report(c, &q, &report), -EINVAL);
    ck_assert_str_eq(gpujob_error_field(c), "query.since");
    gpujob_client_free(c);
    setenv("GPUJOB_TOKEN", t.alice, 1);
    ck_assert_int_eq(gpujob_client_new(e2e_daemon_url(d), &c, err, sizeof err), 0);
    q = (gpujob_usage_query_t){.user = "bob"};
    ck_assert_int_eq(gpujob_usage_report(c, &q, &report), -EACCES);
    gpujob_client_free(c);
    unsetenv("GPUJOB_TOKEN");

    static char out[16384];
    ck_assert_int_eq(cli_run(d, t.carol, "usage --all", out, sizeof out), 0);
    ck_assert_msg(strstr(out, "user:      all users") && strstr(out, "alice") &&
                      strstr(out, "bob") && strstr(out, "saxpy") && strstr(out, "total"),
                  "%s", out);
    ck_assert_int_eq(cli_run(d, t.alice, "usage --all", out, sizeof out), 3);
    ck_assert_int_eq(cli_run(d, t.alice, "usage --user bob --all", out, sizeof out), 2);
    ck_assert_int_eq(cli_run(d, t.alice, "usage --since 2000-01-01 --json", out, sizeof out), 0);
    json_t *u = json_loads(out, 0, NULL);
    ck_assert_ptr_nonnull(u);
    ck_assert_str_eq(json_string_value(json_object_get(u, "since")), "2000-01-01");
    ck_assert_int_eq(int_of(json_object_get(u, "totals"), "gpu_ns"), alice.gpu_ns);
    json_decref(u);
    e2e_daemon_free(d);
}
END_TEST

/* Budgets: alice may use 0.0003 GPU-hours (1.08 s) a day, bob 100 a month. */
#define BUDGET_CONFIG                                                                              \
    "[auth]\nmode = token\nadmins = carol\n[scheduler]\ncpu_threads = 2\n"                         \
    "[user.alice]\ngpu_hours_per_day = 0.0003\n[user.bob]\ngpu_hours_per_month = 100\n"

/* The RFC 3339 time the API writes for 00:00:00 UTC of y-m-d. */
static void midnight_text(int y, int m, int d, char *buf, size_t size)
{
    snprintf(buf, size, "%04d-%02d-%02dT00:00:00.000000Z", y, m, d);
}

/* Tomorrow's and next month's first midnight (UTC), as the API writes them, and the first in
 * seconds since the epoch. */
static time_t resets_utc(char *day, char *month, size_t size)
{
    time_t now = time(NULL);
    struct tm tm;
    time_t tomorrow = (now / 86400 + 1) * 86400;
    gmtime_r(&tomorrow, &tm);
    midnight_text(tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, day, size);
    gmtime_r(&now, &tm);
    int y = tm.tm_year + 1900, m = tm.tm_mon + 2;
    if (m == 13) y++, m = 1;
    midnight_text(y, m, 1, month, size);
    return tomorrow;
}

/* GET /v1/usage as token's holder: its budgets array (a new reference), which must hold n. */
static json_t *budgets_of(e2e_daemon_t *d, const char *token, size_t n)
{
    json_t *u = as_user(d, token, "GET", "/v1/usage", NULL, 200);
    json_t *b = json_incref(json_object_get(u, "budgets"));
    json_decref(u);
    ck_assert_msg(json_is_array(b) && json_array_size(b) == n, "budgets: expected %zu", n);
    return b;
}

/* A submission as token's holder refused by a spent budget: 429 budget_exceeded naming key,
 * with the reset time reset_at in the body and the seconds until it in Retry-After. */
static void refused_by_budget(e2e_daemon_t *d, const char *token, const char *key,
                              const char *reset_at, time_t reset)
{
    char auth[256];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    const char *headers[] = {"Content-Type: application/json", auth, NULL};
    e2e_response_t r;
    ck_assert_int_eq(e2e_http_request(d, "POST", "/v1/jobs", headers, ADD_JOB, strlen(ADD_JOB), &r),
                     0);
    ck_assert_msg(r.status == 429, "%ld: %s", r.status, r.body);
    json_t *error = json_object_get(r.json, "error");
    ck_assert_str_eq(json_string_value(json_object_get(error, "code")), "budget_exceeded");
    ck_assert_str_eq(json_string_value(json_object_get(error, "field")), key);
    ck_assert_str_eq(json_string_value(json_object_get(error, "reset_at")), reset_at);
    ck_assert_str_eq(json_string_value(json_object_get(error, "window")), "day");
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(error, "message")), key));
    char retry[32];
    ck_assert_ptr_nonnull(e2e_response_header(&r, "Retry-After", retry, sizeof retry));
    long want = (long)(reset - time(NULL)), got = atol(retry);
    ck_assert_msg(got >= want - 5 && got <= want + 5, "Retry-After %s, reset in %ld s", retry,
                  want);
    e2e_response_clear(&r);
}

START_TEST(test_a_spent_budget_refuses_its_user_until_it_resets)
{
    /* The test's day must not end while it runs. */
    time_t now = time(NULL);
    if (86400 - now % 86400 < 120) sleep((unsigned)(86400 - now % 86400) + 1);
    e2e_daemon_t *d = e2e_daemon_start_ok(BUDGET_CONFIG);
    tokens_t t;
    tokens_make(d, &t);
    char day_reset[64], month_reset[64];
    time_t reset = resets_utc(day_reset, month_reset, sizeof day_reset);

    /* Before any job: the whole budget is left. */
    json_t *b = budgets_of(d, t.alice, 1), *g = json_array_get(b, 0);
    ck_assert_str_eq(json_string_value(json_object_get(g, "window")), "day");
    ck_assert_str_eq(json_string_value(json_object_get(g, "key")), "user.alice.gpu_hours_per_day");
    ck_assert_double_eq_tol(json_real_value(json_object_get(g, "gpu_ms")), 1080, 1e-6);
    ck_assert_double_eq_tol(json_real_value(json_object_get(g, "left_gpu_ms")), 1080, 1e-6);
    ck_assert(json_is_false(json_object_get(g, "exceeded")));
    ck_assert_str_eq(json_string_value(json_object_get(g, "reset_at")), day_reset);
    json_decref(b);

    /* A job of 1.3 s spends it; alice's next submission is refused, bob's is not. */
    json_t *sleeper = e2e_long_job_new(1300);
    char *body = json_dumps(sleeper, JSON_COMPACT);
    sums_t alice = {0}, bob = {0};
    char id[64];
    job_run(d, t.alice, body, &alice, id);
    ck_assert_int_ge(alice.gpu_ns, INT64_C(1300000000));
    refused_by_budget(d, t.alice, "user.alice.gpu_hours_per_day", day_reset, reset);
    job_run(d, t.bob, body, &bob, id);
    job_run(d, t.bob, ADD_JOB, &bob, id);

    /* Usage says so: all of it used, none left, and when it resets; bob's month is open. */
    b = budgets_of(d, t.alice, 1);
    g = json_array_get(b, 0);
    ck_assert_int_eq(ms_exact(g, "used_gpu_ms", 1e6), alice.gpu_ns);
    ck_assert_double_eq(json_real_value(json_object_get(g, "left_gpu_ms")), 0);
    ck_assert(json_is_true(json_object_get(g, "exceeded")));
    json_decref(b);
    b = budgets_of(d, t.bob, 1);
    g = json_array_get(b, 0);
    ck_assert_str_eq(json_string_value(json_object_get(g, "window")), "month");
    ck_assert_str_eq(json_string_value(json_object_get(g, "key")), "user.bob.gpu_hours_per_month");
    ck_assert_int_eq(ms_exact(g, "used_gpu_ms", 1e6), bob.gpu_ns);
    ck_assert(json_is_false(json_object_get(g, "exceeded")));
    ck_assert_str_eq(json_string_value(json_object_get(g, "reset_at")), month_reset);
    json_decref(b);
    /* The admin sees alice's budget as alice does; every user's report has none. */
    json_t *u = as_user(d, t.carol, "GET", "/v1/usage?user=alice", NULL, 200);
    ck_assert_int_eq(json_array_size(json_object_get(u, "budgets")), 1);
    json_decref(u);
    u = as_user(d, t.carol, "GET", "/v1/usage?user=all", NULL, 200);
    ck_assert_int_eq(json_array_size(json_object_get(u, "budgets")), 0);
    json_decref(u);

    static char out[16384];
    ck_assert_int_eq(cli_run(d, t.alice, "usage", out, sizeof out), 0);
    ck_assert_msg(strstr(out, "budget:    day") && strstr(out, "user.alice.gpu_hours_per_day") &&
                      strstr(out, "spent") && strstr(out, day_reset),
                  "%s", out);
    /* `gpujob run` does not wait a day for the budget to reset: it is refused at once (exit 3,
     * the daemon's error). */
    char npy[4200], args[8600];
    snprintf(npy, sizeof npy, "%s/x.npy", e2e_daemon_dir(d));
    float one = 1;
    gpujob_tensor_t x;
    ck_assert_int_eq(gpujob_tensor_init(&x, GPUJOB_F32, 1, (int64_t[]){1}, &one), 0);
    ck_assert_int_eq(gpujob_npy_save(npy, &x), 0);
    snprintf(args, sizeof args, "run add -i x='%s' -i y='%s'", npy, npy);
    double before = e2e_now();
    ck_assert_int_eq(cli_run(d, t.alice, args, out, sizeof out), 3);
    ck_assert_double_lt(e2e_now() - before, 30);

    /* The budget's sums come back from the usage rollup after a restart. */
    int wait_status;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &wait_status), 0);
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    refused_by_budget(d, t.alice, "user.alice.gpu_hours_per_day", day_reset, reset);

    /* A reload that raises the budget lets alice in again. */
    char path[4096];
    snprintf(path, sizeof path, "%s/gpujobd.conf", e2e_daemon_dir(d));
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("[auth]\nmode = token\nadmins = carol\n[scheduler]\ncpu_threads = 2\n"
          "[user.alice]\ngpu_hours_per_day = 1\n",
          f);
    ck_assert_int_eq(fclose(f), 0);
    int reloads = e2e_daemon_log_count(d, "reloaded the configuration");
    ck_assert_int_eq(kill(e2e_daemon_pid(d), SIGHUP), 0);
    for (int i = 0; i < 1000 && e2e_daemon_log_count(d, "reloaded the configuration") == reloads;
         i++)
        usleep(10000);
    job_run(d, t.alice, ADD_JOB, &alice, id);
    b = budgets_of(d, t.alice, 1);
    ck_assert(json_is_false(json_object_get(json_array_get(b, 0), "exceeded")));
    json_decref(b);

    free(body);
    json_decref(sleeper);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_usage");
    TCase *tc = tcase_create("usage");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_usage_totals_equal_the_jobs_and_outlive_their_retention);
    tcase_add_test(tc, test_others_usage_is_the_admins_and_bad_ranges_name_their_field);
    tcase_add_test(tc, test_a_batchs_jobs_gpu_ms_sum_to_its_batch_gpu_ms);
    tcase_add_test(tc, test_library_and_cli_report_every_users_rows_to_the_admin);
    tcase_add_test(tc, test_a_spent_budget_refuses_its_user_until_it_resets);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
