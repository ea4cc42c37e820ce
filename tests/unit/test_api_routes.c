/* The router and the handlers of api/, driven with plain api_request_t values through a fake
 * scheduler and store (api_fakes.c), and the route table checked against api/openapi.yaml. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api_internal.h"
#include "api/tensor_codec.h"
#include "support/api_fakes.h"

static config_t cfg;
static api_env_t env;
static int suspends, resumes;

static store_reader_t *test_reader(api_env_t *e)
{
    return fake_reader();
}

static void test_suspend(api_request_t *req)
{
    suspends++;
}

static void test_resume(api_request_t *req)
{
    resumes++;
}

static const api_conn_ops_t test_conn_ops = {test_suspend, test_resume};

static void setup(void)
{
    config_defaults(&cfg);
    cfg.max_wait_ms = 10000;
    cfg.max_inline_output_bytes = 64;
    cfg.max_tensor_bytes = 1 << 20;
    memset(&env, 0, sizeof env);
    env.cfg = &cfg;
    env.reader = test_reader;
    env.find_op = fake_find_op;
    suspends = resumes = 0;
    fakes_reset();
}

static void teardown(void)
{
    fakes_reset();
}

/* A request as the HTTP adapter would build it; strings live in the struct below. */
typedef struct test_req {
    api_request_t req;
    char url[512];
    char path[512];
} test_req_t;

/* Runs one request through the router as user (admin when the name is "root"). headers:
 * "Name: value" lines for Accept, Content-Type and Idempotency-Key, or NULL. */
static test_req_t *run(const char *user, const char *method, const char *url,
                       const char *const *headers, const void *body, size_t len)
{
    test_req_t *t = calloc(1, sizeof *t);
    api_request_t *req = &t->req;
    req->env = &env;
    req->cfg = env.cfg;
    req->method = method;
    req->conn_ops = &test_conn_ops;
    snprintf(req->user.name, sizeof req->user.name, "%s", user);
    req->user.admin = strcmp(user, "root") == 0;
    snprintf(t->url, sizeof t->url, "%s", url);
    char *q = strchr(t->url, '?');
    if (q) *q++ = '\0';
    snprintf(t->path, sizeof t->path, "%s", t->url);
    req->path = t->path;
    for (char *arg = q; arg && *arg && req->n_query < API_MAX_QUERY;) {
        char *next = strchr(arg, '&');
        if (next) *next++ = '\0';
        char *eq = strchr(arg, '=');
        if (eq) *eq++ = '\0';
        req->query[req->n_query++] = (api_kv_t){arg, eq ? eq : ""};
        arg = next;
    }
    for (const char *const *h = headers; h && *h; h++) {
        const char *value = strchr(*h, ':') + 2;
        if (strncmp(*h, "Accept:", 7) == 0) req->accept = value;
        if (strncmp(*h, "Content-Type:", 13) == 0) req->content_type = value;
        if (strncmp(*h, "Idempotency-Key:", 16) == 0) req->idempotency_key = value;
    }
    if (body) {
        req->body = malloc(len + 1);
        memcpy(req->body, body, len);
        req->body[len] = '\0';
        req->body_len = len;
    }
    int before = suspends;
    int r = api_dispatch(req);
    /* A pending handler suspended once and the (inline) reply resumed it once. */
    ck_assert_int_eq(suspends - before, r == API_PENDING ? 1 : 0);
    ck_assert_int_eq(suspends, resumes);
    ck_assert_int_ne(req->resp.status, 0);
    return t;
}

static test_req_t *run_json(const char *method, const char *url, const char *json)
{
    return run("alice", method, url, NULL, json, json ? strlen(json) : 0);
}

static void done(test_req_t *t)
{
    api_request_cleanup(&t->req);
    free(t->req.body);
    free(t);
}

static const char *error_field(const test_req_t *t)
{
    json_t *f = json_object_get(json_object_get(t->req.resp.json, "error"), "field");
    return f ? json_string_value(f) : "";
}

static const char *error_code(const test_req_t *t)
{
    return json_string_value(json_object_get(json_object_get(t->req.resp.json, "error"), "code"));
}

static const char *header(const test_req_t *t, const char *name)
{
    for (int i = 0; i < t->req.resp.n_headers; i++)
        if (strcmp(t->req.resp.headers[i].name, name) == 0) return t->req.resp.headers[i].value;
    return NULL;
}

/* Expects status (and field when not NULL) from one request, then frees it. */
static void expect(test_req_t *t, int status, const char *field)
{
    ck_assert_msg(t->req.resp.status == status, "%s %s: status %d, want %d", t->req.method, t->url,
                  t->req.resp.status, status);
    if (field) ck_assert_str_eq(error_field(t), field);
    done(t);
}

#define JOB_ID "j0000000000010000aaaaaaaa"
#define OTHER_ID "j0000000000020000bbbbbbbb"
#define BUF_ID "b0000000000010000cccccccc"

/* A succeeded tadd job of owner with output out = {4, 5, 6}. */
static job_t *make_job(const char *id, const char *owner, job_state_t state)
{
    job_t *job = job_new();
    snprintf(job->id, sizeof job->id, "%s", id);
    snprintf(job->owner, sizeof job->owner, "%s", owner);
    job->call.op = fake_find_op("tadd");
    job->params_json = strdup("{\"alpha\":2}");
    job->state = state;
    job->created_us = 1700000000000000LL;
    tensor_desc_t d = {.dtype = DTYPE_F32, .ndim = 1, .shape = {3}};
    snprintf(job->in[0].name, sizeof job->in[0].name, "x");
    job->in[0].desc = d;
    job->in[0].nbytes = 12;
    snprintf(job->out[0].name, sizeof job->out[0].name, "out");
    job->out[0].desc = d;
    job->out[0].nbytes = 12;
    if (state == JOB_SUCCEEDED) {
        float out[3] = {4, 5, 6};
        job->out[0].data = malloc(sizeof out);
        memcpy(job->out[0].data, out, sizeof out);
    }
    return job;
}

static void store_job(const char *id, const char *owner, job_state_t state)
{
    job_t *job = make_job(id, owner, state);
    fake_store_add_job(job);
    job_free(job);
}

/* --- routing --- */

START_TEST(test_router_matches_paths_methods_and_parameters)
{
    size_t n;
    const api_route_t *routes = api_routes(&n);
    api_route_match_t m;
    api_route_match(routes, n, "GET", "/v1/jobs/" JOB_ID "/outputs/out", &m);
    ck_assert_int_eq(m.status, 200);
    ck_assert_ptr_eq(m.route->handler, api_handle_job_output);
    ck_assert_int_eq(m.n_params, 2);
    ck_assert_str_eq(m.names[0], "id");
    ck_assert_str_eq(m.values[0], JOB_ID);
    ck_assert_str_eq(m.names[1], "name");
    ck_assert_str_eq(m.values[1], "out");

    api_route_match(routes, n, "DELETE", "/v1/jobs/abc", &m);
    ck_assert_int_eq(m.status, 200);
    ck_assert_ptr_eq(m.route->handler, api_handle_job_cancel);
    api_route_match(routes, n, "GET", "/v1/jobs", &m);
    ck_assert_ptr_eq(m.route->handler, api_handle_jobs_list);
    api_route_match(routes, n, "POST", "/v1/jobs", &m);
    ck_assert_ptr_eq(m.route->handler, api_handle_jobs_submit);

    /* The status page: its index at the root, its session ahead of the files' pattern. */
    api_route_match(routes, n, "GET", "/", &m);
    ck_assert_ptr_eq(m.route->handler, api_handle_ui_index);
    api_route_match(routes, n, "GET", "/ui/session", &m);
    ck_assert_ptr_eq(m.route->handler, api_handle_ui_session);
    api_route_match(routes, n, "GET", "/ui/app.js", &m);
    ck_assert_ptr_eq(m.route->handler, api_handle_ui_file);
    ck_assert_str_eq(m.values[0], "app.js");

    api_route_match(routes, n, "PUT", "/v1/jobs", &m);
    ck_assert_int_eq(m.status, 405);
    ck_assert_str_eq(m.allow, "POST, GET");
    api_route_match(routes, n, "POST", "/v1/jobs/x", &m);
    ck_assert_int_eq(m.status, 405);
    ck_assert_str_eq(m.allow, "GET, DELETE");

    const char *missing[] = {"/v1/nothing",
                             "/v1/jobs/",
                             "/v1/jobs//wait",
                             "/v1/jobs/x/outputs",
                             "/v1/jobs/x/outputs/y/z",
                             "/ui",
                             "/ui/",
                             "/ui/a/b",
                             "",
                             "/healthz/",
                             "/V1/jobs"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        api_route_match(routes, n, "GET", missing[i], &m);
        ck_assert_msg(m.status == 404, "'%s' matched", missing[i]);
    }
}
END_TEST

START_TEST(test_dispatch_answers_404_and_405_with_allow)
{
    test_req_t *t = run_json("GET", "/v2/jobs", NULL);
    ck_assert_int_eq(t->req.resp.status, 404);
    ck_assert_str_eq(error_code(t), "not_found");
    done(t);
    t = run_json("PATCH", "/v1/buffers/" BUF_ID, NULL);
    ck_assert_int_eq(t->req.resp.status, 405);
    ck_assert_str_eq(error_code(t), "method_not_allowed");
    ck_assert_str_eq(header(t, "Allow"), "GET, DELETE");
    done(t);
}
END_TEST

/* The (path, method) pairs of openapi.yaml's `paths:`, read line by line: a path is a key
 * indented by two spaces and starting with '/', a method a key indented by four. */
static int openapi_operations(char ops[][2][96], int max)
{
    const char *src = getenv("GPUJOB_SOURCE_DIR");
    char file[1024];
    snprintf(file, sizeof file, "%s/api/openapi.yaml", src ? src : "..");
    FILE *f = fopen(file, "r");
    ck_assert_msg(f, "cannot open %s", file);
    char line[512], path[96] = "";
    bool in_paths = false;
    int n = 0;
    static const char *const methods[] = {"get", "post", "put", "delete", "patch", "head"};
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] != ' ' && line[0] != '\0' && line[0] != '#')
            in_paths = strcmp(line, "paths:") == 0;
        if (!in_paths) continue;
        if (strncmp(line, "  /", 3) == 0 && line[strlen(line) - 1] == ':') {
            snprintf(path, sizeof path, "%.*s", (int)strlen(line) - 3, line + 2);
            continue;
        }
        for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
            char key[16];
            snprintf(key, sizeof key, "    %s:", methods[m]);
            if (strcmp(line, key) == 0 && path[0] && n < max) {
                snprintf(ops[n][0], sizeof ops[n][0], "%s", path);
                for (size_t k = 0; methods[m][k]; k++)
                    ops[n][1][k] = (char)(methods[m][k] - 'a' + 'A');
                ops[n][1][strlen(methods[m])] = '\0';
                n++;
            }
        }
    }
    fclose(f);
    return n;
}

START_TEST(test_route_table_and_openapi_document_agree)
{
    char ops[64][2][96];
    int n_ops = openapi_operations(ops, 64);
    size_t n;
    const api_route_t *routes = api_routes(&n);
    ck_assert_int_ge(n_ops, 1);
    for (size_t i = 0; i < n; i++) {
        bool documented = false;
        for (int k = 0; k < n_ops && !documented; k++)
            documented = strcmp(ops[k][0], routes[i].pattern) == 0 &&
                         strcmp(ops[k][1], routes[i].method) == 0;
        ck_assert_msg(documented, "%s %s is not in openapi.yaml", routes[i].method,
                      routes[i].pattern);
    }
    for (int k = 0; k < n_ops; k++) {
        bool routed = false;
        for (size_t i = 0; i < n && !routed; i++)
            routed = strcmp(ops[k][0], routes[i].pattern) == 0 &&
                     strcmp(ops[k][1], routes[i].method) == 0;
        ck_assert_msg(routed, "openapi.yaml documents %s %s, which is not routed", ops[k][1],
                      ops[k][0]);
    }
    ck_assert_int_eq((int)n, n_ops);
}
END_TEST

/* --- system --- */

START_TEST(test_health_ready_and_metrics)
{
    expect(run_json("GET", "/healthz", NULL), 200, NULL);
    expect(run_json("GET", "/readyz", NULL), 200, NULL);
    /* With devices: ready while one of them serves, each device's state shown. */
    fake_sched.backend_json = "{\"name\": \"cuda\", \"devices\": [{\"index\": 0, \"state\": "
                              "\"resetting\"}, {\"index\": 1, \"state\": \"ready\"}]}";
    test_req_t *t = run_json("GET", "/readyz", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    json_t *body = t->req.resp.json;
    ck_assert_str_eq(json_string_value(json_object_get(body, "status")), "ready");
    json_t *first = json_array_get(json_object_get(body, "devices"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(first, "index")), 0);
    ck_assert_str_eq(json_string_value(json_object_get(first, "state")), "resetting");
    done(t);
    fake_sched.backend_json = "{\"name\": \"cuda\", \"devices\": [{\"index\": 0, \"state\": "
                              "\"resetting\"}, {\"index\": 1, \"state\": \"failed\"}]}";
    t = run_json("GET", "/readyz", NULL);
    ck_assert_int_eq(t->req.resp.status, 503);
    ck_assert_str_eq(json_string_value(json_object_get(t->req.resp.json, "status")), "no_device");
    done(t);
    /* The devices' own gauges, from the backend's description. */
    fake_sched.backend_json =
        "{\"name\": \"cuda\", \"devices\": [{\"index\": 0, \"state\": \"resetting\", "
        "\"resets\": 2, \"resident_bytes\": 4096, \"pool_in_use\": 512}, {\"index\": 1, "
        "\"state\": \"ready\", \"resets\": 0, \"resident_bytes\": 0, \"pool_in_use\": 0}]}";
    t = run_json("GET", "/metrics", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    const char *gauges = t->req.resp.body;
    ck_assert_ptr_nonnull(strstr(gauges, "\ngpujobd_gpu_ready{device=\"0\"} 0\n"));
    ck_assert_ptr_nonnull(strstr(gauges, "\ngpujobd_gpu_ready{device=\"1\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(gauges, "\ngpujobd_gpu_resets_total{device=\"0\"} 2\n"));
    ck_assert_ptr_nonnull(strstr(gauges, "\ngpujobd_gpu_resident_bytes{device=\"0\"} 4096\n"));
    ck_assert_ptr_nonnull(strstr(gauges, "\ngpujobd_gpu_pool_in_use_bytes{device=\"0\"} 512\n"));
    ck_assert_ptr_nonnull(strstr(gauges, "# TYPE gpujobd_gpu_resets_total counter\n"));
    done(t);
    fake_sched.backend_json = NULL;
    fake_sched.stats.accepting = false;
    t = run_json("GET", "/readyz", NULL);
    ck_assert_int_eq(t->req.resp.status, 503);
    ck_assert_str_eq(header(t, "Retry-After"), "1");
    done(t);
    fake_sched.stats.submitted_total = 12345;
    fake_sched.stats.queued = 77;
    atomic_store(&env.responses[429], 3);
    t = run_json("GET", "/metrics", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    const char *text = t->req.resp.body;
    ck_assert_ptr_nonnull(strstr(text, "\ngpujobd_jobs_submitted_total 12345\n"));
    ck_assert_ptr_nonnull(strstr(text, "\ngpujobd_jobs_queued 77\n"));
    ck_assert_ptr_nonnull(strstr(text, "gpujobd_http_requests_total{code=\"429\"} 3\n"));
    ck_assert_ptr_nonnull(strstr(text, "# TYPE gpujobd_batches_total counter"));
    ck_assert_ptr_null(strstr(text, "gpujobd_gpu_")); /* no GPU sampled */
    done(t);
    t = run_json("GET", "/v1/info", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(t->req.resp.json, "version")),
                     GPUJOBD_VERSION);
    ck_assert_int_eq(json_array_size(json_object_get(t->req.resp.json, "dtypes")), DTYPE_COUNT);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(t->req.resp.json, "limits"),
                                                        "max_wait_ms")),
                     10000);
    done(t);
}
END_TEST

/* --- jobs --- */

#define TADD_JOB                                                                                   \
    "{\"op\": \"tadd\", \"inputs\": {\"x\": {\"dtype\": \"f32\", \"shape\": [2], \"data\": [1, "   \
    "2]}}}"

START_TEST(test_submit_commits_through_the_scheduler_and_answers_201)
{
    test_req_t *t = run_json("POST", "/v1/jobs", TADD_JOB);
    ck_assert_int_eq(t->req.resp.status, 201);
    ck_assert_int_eq(fake_sched.submits, 1);
    ck_assert_uint_eq(fake_sched.last_n, 1);
    json_t *job = t->req.resp.json;
    ck_assert_str_eq(json_string_value(json_object_get(job, "id")), fake_sched.submitted[0]->id);
    ck_assert_str_eq(json_string_value(json_object_get(job, "state")), "queued");
    ck_assert_str_eq(json_string_value(json_object_get(job, "owner")), "alice");
    ck_assert_str_eq(fake_sched.submitted[0]->owner, "alice");
    done(t);

    t = run_json("POST", "/v1/jobs", "[" TADD_JOB ", " TADD_JOB "]");
    ck_assert_int_eq(t->req.resp.status, 201);
    ck_assert_int_eq(json_array_size(t->req.resp.json), 2);
    done(t);
}
END_TEST

START_TEST(test_submit_refuses_bad_bodies_before_the_scheduler)
{
    test_req_t *t = run_json("POST", "/v1/jobs", "{\"op\": \"tadd\",");
    ck_assert_int_eq(t->req.resp.status, 400);
    ck_assert_str_eq(error_code(t), "invalid_json");
    ck_assert_ptr_nonnull(strstr(
        json_string_value(json_object_get(json_object_get(t->req.resp.json, "error"), "message")),
        "line 1"));
    done(t);
    expect(run_json("POST", "/v1/jobs", "{\"op\": \"tadd\", \"op\": \"tadd\"}"), 400, "body");
    expect(run_json("POST", "/v1/jobs", "{\"op\": \"tadd\", \"inputs\": {\"q\": {}}}"), 400,
           "inputs.q");
    expect(run_json("POST", "/v1/jobs?dry=1", TADD_JOB), 400, "query.dry");
    const char *xml[] = {"Content-Type: text/xml", NULL};
    expect(run("alice", "POST", "/v1/jobs", xml, TADD_JOB, strlen(TADD_JOB)), 415,
           "header.Content-Type");
    char long_key[200] = "Idempotency-Key: ";
    memset(long_key + strlen(long_key), 'k', 128);
    const char *keyed[] = {long_key, NULL};
    expect(run("alice", "POST", "/v1/jobs", keyed, TADD_JOB, strlen(TADD_JOB)), 400,
           "header.Idempotency-Key");
    ck_assert_int_eq(fake_sched.submits, 0);
}
END_TEST

START_TEST(test_submit_refuses_an_op_the_backend_cannot_run)
{
    fake_sched.unsupported_op = "tadd";
    test_req_t *t = run_json("POST", "/v1/jobs", "[" TADD_JOB ", " TADD_JOB "]");
    ck_assert_int_eq(t->req.resp.status, 422);
    ck_assert_str_eq(error_code(t), "unsupported");
    ck_assert_str_eq(error_field(t), "[0].op");
    done(t);
    ck_assert_int_eq(fake_sched.submits, 0);
    fake_sched.unsupported_op = NULL;
    expect(run_json("POST", "/v1/jobs", TADD_JOB), 201, NULL);
}
END_TEST

START_TEST(test_submit_maps_scheduler_errors_to_statuses)
{
    static const struct {
        int err, status;
        const char *code;
    } cases[] = {
        {-EAGAIN, 429, "resource_exhausted"},
        {-ESHUTDOWN, 503, "unavailable"},
        {-ENOSPC, 507, "insufficient_storage"},
        {-EEXIST, 409, "conflict"},
        {-EIO, 500, "internal"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_sched.next_err = cases[i].err;
        fake_sched.next_message = "scripted";
        test_req_t *t = run_json("POST", "/v1/jobs", TADD_JOB);
        ck_assert_int_eq(t->req.resp.status, cases[i].status);
        ck_assert_str_eq(error_code(t), cases[i].code);
        if (cases[i].status == 429 || cases[i].status == 503)
            ck_assert_str_eq(header(t, "Retry-After"), "1");
        done(t);
    }
}
END_TEST

START_TEST(test_idempotent_retry_answers_200_with_the_first_job)
{
    /* The scheduler found the key taken: it replies with the first job. */
    job_t *first = make_job(JOB_ID, "alice", JOB_QUEUED);
    fake_sched.retry_job = first;
    const char *keyed[] = {"Idempotency-Key: abc", NULL};
    test_req_t *t = run("alice", "POST", "/v1/jobs", keyed, TADD_JOB, strlen(TADD_JOB));
    ck_assert_int_eq(t->req.resp.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(t->req.resp.json, "id")), JOB_ID);
    done(t);
    fake_sched.retry_job = NULL;

    /* The store already knows the key. With sync_full its row may not be on disk yet: the
     * scheduler answers, after a sync. */
    snprintf(first->idempotency_key, sizeof first->idempotency_key, "abc");
    fake_store_add_job(first);
    int submits = fake_sched.submits;
    t = run("alice", "POST", "/v1/jobs", keyed, TADD_JOB, strlen(TADD_JOB));
    ck_assert_int_eq(fake_sched.submits, submits + 1);
    done(t);
    /* Without sync_full nothing is synced: answered without the scheduler. */
    cfg.sync_full = false;
    submits = fake_sched.submits;
    t = run("alice", "POST", "/v1/jobs", keyed, TADD_JOB, strlen(TADD_JOB));
    ck_assert_int_eq(t->req.resp.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(t->req.resp.json, "id")), JOB_ID);
    ck_assert_int_eq(fake_sched.submits, submits);
    done(t);
    /* Another user's key is theirs alone. */
    t = run("bob", "POST", "/v1/jobs", keyed, TADD_JOB, strlen(TADD_JOB));
    ck_assert_int_eq(t->req.resp.status, 201);
    done(t);
    job_free(first);
}
END_TEST

START_TEST(test_post_after_stop_intake_answers_503)
{
    atomic_store(&env.intake_stopped, true);
    test_req_t *t = run_json("POST", "/v1/jobs", TADD_JOB);
    ck_assert_int_eq(t->req.resp.status, 503);
    ck_assert_str_eq(error_code(t), "unavailable");
    done(t);
    expect(run("alice", "POST", "/v1/buffers?dtype=f32&shape=1", NULL, "abcd", 4), 503, NULL);
    ck_assert_int_eq(fake_sched.submits + fake_sched.buffer_puts, 0);
    /* Reads still work. */
    expect(run_json("GET", "/healthz", NULL), 200, NULL);
}
END_TEST

START_TEST(test_get_job_checks_id_owner_and_inlines_outputs)
{
    store_job(JOB_ID, "alice", JOB_SUCCEEDED);
    store_job(OTHER_ID, "bob", JOB_SUCCEEDED);
    expect(run_json("GET", "/v1/jobs/not-an-id", NULL), 400, "id");
    expect(run_json("GET", "/v1/jobs/j0000000000030000cccccccc", NULL), 404, "id");
    expect(run_json("GET", "/v1/jobs/" OTHER_ID, NULL), 404, "id");
    test_req_t *t = run_json("GET", "/v1/jobs/" JOB_ID, NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    json_t *sent = fake_as_sent(t->req.resp.json);
    json_t *out = json_object_get(json_object_get(sent, "outputs"), "out");
    ck_assert(json_number_value(json_array_get(json_object_get(out, "data"), 1)) == 5.0);
    json_decref(sent);
    done(t);
    /* An admin sees every owner's jobs. */
    expect(run("root", "GET", "/v1/jobs/" OTHER_ID, NULL, NULL, 0), 200, NULL);
}
END_TEST

START_TEST(test_list_validates_its_query_and_pages)
{
    store_job(JOB_ID, "alice", JOB_SUCCEEDED);
    store_job("j0000000000015000aaaaaaaa", "bob", JOB_QUEUED);
    store_job(OTHER_ID, "alice", JOB_QUEUED);
    expect(run_json("GET", "/v1/jobs?limit=0", NULL), 400, "query.limit");
    expect(run_json("GET", "/v1/jobs?limit=1001", NULL), 400, "query.limit");
    expect(run_json("GET", "/v1/jobs?limit=5x", NULL), 400, "query.limit");
    expect(run_json("GET", "/v1/jobs?state=done", NULL), 400, "query.state");
    expect(run_json("GET", "/v1/jobs?op=nope", NULL), 400, "query.op");
    expect(run_json("GET", "/v1/jobs?after=xyz", NULL), 400, "query.after");
    expect(run_json("GET", "/v1/jobs?sort=id", NULL), 400, "query.sort");

    test_req_t *t = run_json("GET", "/v1/jobs?limit=1", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    json_t *jobs = json_object_get(t->req.resp.json, "jobs");
    ck_assert_int_eq(json_array_size(jobs), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(jobs, 0), "id")), JOB_ID);
    ck_assert_str_eq(json_string_value(json_object_get(t->req.resp.json, "next")), JOB_ID);
    done(t);
    /* The next page skips bob's job: owners see only their own. */
    t = run_json("GET", "/v1/jobs?limit=1&after=" JOB_ID, NULL);
    jobs = json_object_get(t->req.resp.json, "jobs");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(jobs, 0), "id")), OTHER_ID);
    done(t);
    t = run_json("GET", "/v1/jobs?state=queued&op=tadd", NULL);
    ck_assert_int_eq(json_array_size(json_object_get(t->req.resp.json, "jobs")), 1);
    ck_assert(json_is_null(json_object_get(t->req.resp.json, "next")));
    done(t);
}
END_TEST

START_TEST(test_wait_and_cancel_go_through_the_scheduler)
{
    job_t *job = make_job(JOB_ID, "alice", JOB_SUCCEEDED);
    fake_sched.reply_job = job;
    expect(run_json("GET", "/v1/jobs/" JOB_ID "/wait?timeout=10.5", NULL), 400, "query.timeout");
    expect(run_json("GET", "/v1/jobs/" JOB_ID "/wait?timeout=-1", NULL), 400, "query.timeout");
    expect(run_json("GET", "/v1/jobs/bad/wait", NULL), 400, "id");
    ck_assert_int_eq(fake_sched.waits, 0);
    test_req_t *t = run_json("GET", "/v1/jobs/" JOB_ID "/wait?timeout=2.5", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    ck_assert_int_eq(fake_sched.last_timeout_ms, 2500);
    ck_assert_str_eq(fake_sched.last_owner, "alice");
    ck_assert_str_eq(fake_sched.last_id, JOB_ID);
    ck_assert_str_eq(json_string_value(json_object_get(t->req.resp.json, "state")), "succeeded");
    done(t);
    expect(run_json("GET", "/v1/jobs/" JOB_ID "/wait", NULL), 200, NULL);
    ck_assert_int_eq(fake_sched.last_timeout_ms, 10000); /* 30 s capped at max_wait_ms */

    expect(run("root", "DELETE", "/v1/jobs/" JOB_ID, NULL, NULL, 0), 200, NULL);
    ck_assert(fake_sched.last_owner_was_null);
    fake_sched.next_err = -EBUSY;
    expect(run_json("DELETE", "/v1/jobs/" JOB_ID, NULL), 409, NULL);
    fake_sched.next_err = -ENOENT;
    expect(run_json("DELETE", "/v1/jobs/" JOB_ID, NULL), 404, "id");
    ck_assert_int_eq(fake_sched.cancels, 3);
    job_free(job);
}
END_TEST

START_TEST(test_wait_for_an_ended_job_is_answered_from_the_store)
{
    store_job(JOB_ID, "alice", JOB_SUCCEEDED);
    store_job(OTHER_ID, "alice", JOB_RUNNING);
    test_req_t *t = run_json("GET", "/v1/jobs/" JOB_ID "/wait?timeout=5", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(t->req.resp.json, "state")), "succeeded");
    ck_assert_ptr_nonnull(json_object_get(json_object_get(t->req.resp.json, "outputs"), "out"));
    done(t);
    ck_assert_int_eq(fake_sched.waits, 0);
    /* A job still running, or another user's, is the scheduler's to answer. */
    job_t *running = make_job(OTHER_ID, "alice", JOB_RUNNING);
    fake_sched.reply_job = running;
    expect(run_json("GET", "/v1/jobs/" OTHER_ID "/wait?timeout=5", NULL), 200, NULL);
    ck_assert_int_eq(fake_sched.waits, 1);
    fake_sched.next_err = -ENOENT;
    expect(run("bob", "GET", "/v1/jobs/" JOB_ID "/wait?timeout=5", NULL, NULL, 0), 404, "id");
    ck_assert_int_eq(fake_sched.waits, 2);
    job_free(running);
}
END_TEST

START_TEST(test_outputs_download_as_json_raw_and_npy)
{
    store_job(JOB_ID, "alice", JOB_SUCCEEDED);
    store_job(OTHER_ID, "alice", JOB_RUNNING);
    expect(run_json("GET", "/v1/jobs/" OTHER_ID "/outputs/out", NULL), 409, "id");
    expect(run_json("GET", "/v1/jobs/" JOB_ID "/outputs/nope", NULL), 404, "name");
    expect(run_json("GET", "/v1/jobs/" JOB_ID "/outputs/out?format=csv", NULL), 400,
           "query.format");
    const char *html[] = {"Accept: text/html", NULL};
    expect(run("alice", "GET", "/v1/jobs/" JOB_ID "/outputs/out", html, NULL, 0), 406,
           "header.Accept");

    test_req_t *t = run_json("GET", "/v1/jobs/" JOB_ID "/outputs/out", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    json_t *sent = fake_as_sent(t->req.resp.json);
    ck_assert(json_number_value(json_array_get(json_object_get(sent, "data"), 2)) == 6.0);
    json_decref(sent);
    done(t);

    const char *raw[] = {"Accept: application/octet-stream", NULL};
    t = run("alice", "GET", "/v1/jobs/" JOB_ID "/outputs/out", raw, NULL, 0);
    ck_assert_int_eq(t->req.resp.status, 200);
    ck_assert_uint_eq(t->req.resp.body_len, 12);
    ck_assert(((float *)t->req.resp.body)[0] == 4.0f);
    ck_assert_str_eq(header(t, "X-Dtype"), "f32");
    ck_assert_str_eq(header(t, "X-Shape"), "3");
    done(t);

    const char *npy[] = {"Accept: text/html, application/x-npy;q=0.9", NULL};
    t = run("alice", "GET", "/v1/jobs/" JOB_ID "/outputs/out", npy, NULL, 0);
    ck_assert_int_eq(t->req.resp.status, 200);
    ck_assert_str_eq(t->req.resp.content_type, "application/x-npy");
    tensor_desc_t d;
    size_t offset;
    ck_assert_int_eq(
        codec_npy_parse(t->req.resp.body, t->req.resp.body_len, UINT64_MAX, &d, &offset, NULL), 0);
    ck_assert(d.dtype == DTYPE_F32 && d.ndim == 1 && d.shape[0] == 3);
    ck_assert(((float *)((char *)t->req.resp.body + offset))[1] == 5.0f);
    done(t);
}
END_TEST

/* --- buffers and usage --- */

START_TEST(test_buffer_uploads_raw_and_npy)
{
    float values[6] = {1, 2, 3, 4, 5, 6};
    const char *raw[] = {"Content-Type: application/octet-stream", NULL};
    expect(run("alice", "POST", "/v1/buffers?dtype=f32&shape=2,2", raw, values, sizeof values), 400,
           "body");
    expect(run("alice", "POST", "/v1/buffers?dtype=f31&shape=6", raw, values, sizeof values), 400,
           "query.dtype");
    expect(run("alice", "POST", "/v1/buffers?dtype=f32", raw, values, sizeof values), 400,
           "query.shape");
    expect(run("alice", "POST", "/v1/buffers?dtype=f32&shape=6&resident=yes", raw, values,
               sizeof values),
           400, "query.resident");
    expect(run("alice", "POST", "/v1/buffers?dtype=f32&shape=6", NULL, values, sizeof values), 415,
           "header.Content-Type");
    expect(run("alice", "POST", "/v1/buffers?dtype=f32&shape=1048576", raw, values, sizeof values),
           413, "query.shape");
    ck_assert_int_eq(fake_sched.buffer_puts, 0);

    test_req_t *t = run("alice", "POST", "/v1/buffers?dtype=f32&shape=2,3&resident=true", raw,
                        values, sizeof values);
    ck_assert_int_eq(t->req.resp.status, 201);
    buffer_t *b = fake_sched.last_buffer;
    ck_assert(id_valid('b', b->id));
    ck_assert_str_eq(b->owner, "alice");
    ck_assert(b->resident);
    ck_assert_uint_eq(b->nbytes, 24);
    ck_assert_int_eq(memcmp(b->data, values, 24), 0);
    ck_assert_str_eq(json_string_value(json_object_get(t->req.resp.json, "id")), b->id);
    ck_assert_int_eq(json_integer_value(json_object_get(t->req.resp.json, "bytes")), 24);
    done(t);

    tensor_desc_t d = {.dtype = DTYPE_F32, .ndim = 2, .shape = {3, 2}};
    void *file;
    size_t len;
    ck_assert_int_eq(codec_npy_write(&d, values, &file, &len), 0);
    const char *npy[] = {"Content-Type: application/x-npy", NULL};
    t = run("alice", "POST", "/v1/buffers", npy, file, len);
    ck_assert_int_eq(t->req.resp.status, 201);
    b = fake_sched.last_buffer;
    ck_assert(tensor_desc_equal(&b->desc, &d));
    ck_assert_int_eq(memcmp(b->data, values, 24), 0);
    done(t);
    expect(run("alice", "POST", "/v1/buffers", npy, file, len - 1), 400, "body");
    expect(run("alice", "POST", "/v1/buffers?dtype=f32", npy, file, len), 400, "query.dtype");
    free(file);
}
END_TEST

/* A job's output kept as a buffer: the caller's own job that succeeded (any user's for an
 * admin); another user's answers 404, as if it did not exist. The buffer is the caller's, with
 * the output's descriptor and bytes. */
START_TEST(test_buffer_kept_from_a_job_output_respects_owners)
{
    store_job(JOB_ID, "alice", JOB_SUCCEEDED);
    store_job(OTHER_ID, "alice", JOB_RUNNING);
    expect(run("bob", "POST", "/v1/buffers?job=" JOB_ID "&output=out", NULL, NULL, 0), 404,
           "query.job");
    expect(run_json("POST", "/v1/buffers?job=" OTHER_ID "&output=out", NULL), 409, "query.job");
    expect(run_json("POST", "/v1/buffers?job=" JOB_ID "&output=nope", NULL), 404, "query.output");
    expect(run_json("POST", "/v1/buffers?job=" JOB_ID "&output=out&shape=3", NULL), 400,
           "query.shape");
    ck_assert_int_eq(fake_sched.buffer_puts, 0);

    static const float want[3] = {4, 5, 6}; /* make_job's output */
    const char *const users[] = {"alice", "root"};
    for (int k = 0; k < 2; k++) {
        test_req_t *t = run(users[k], "POST", "/v1/buffers?job=" JOB_ID "&output=out&resident=true",
                            NULL, NULL, 0);
        ck_assert_int_eq(t->req.resp.status, 201);
        buffer_t *b = fake_sched.last_buffer;
        ck_assert_str_eq(b->owner, users[k]);
        ck_assert(b->resident);
        ck_assert(b->desc.dtype == DTYPE_F32 && b->desc.ndim == 1 && b->desc.shape[0] == 3);
        ck_assert_uint_eq(b->nbytes, sizeof want);
        ck_assert_int_eq(memcmp(b->data, want, sizeof want), 0);
        done(t);
    }
    ck_assert_int_eq(fake_sched.buffer_puts, 2);
}
END_TEST

START_TEST(test_buffer_metadata_delete_and_usage_respect_owners)
{
    buffer_t buf = {.id = BUF_ID, .owner = "bob", .nbytes = 8, .created_us = 1};
    buf.desc = (tensor_desc_t){.dtype = DTYPE_I32, .ndim = 1, .shape = {2}};
    fake_store_add_buffer(&buf);
    expect(run_json("GET", "/v1/buffers/nope", NULL), 400, "id");
    expect(run_json("GET", "/v1/buffers/" BUF_ID, NULL), 404, "id");
    test_req_t *t = run("bob", "GET", "/v1/buffers/" BUF_ID, NULL, NULL, 0);
    ck_assert_int_eq(t->req.resp.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(t->req.resp.json, "dtype")), "i32");
    done(t);

    /* A job may not use another owner's buffer: 404 naming the input. */
    const char *job = "{\"op\": \"tadd\", \"inputs\": {\"x\": {\"buffer\": \"" BUF_ID "\"}}}";
    expect(run_json("POST", "/v1/jobs", job), 404, "inputs.x.buffer");

    expect(run("bob", "DELETE", "/v1/buffers/" BUF_ID, NULL, NULL, 0), 200, NULL);
    ck_assert_str_eq(fake_sched.last_owner, "bob");
    fake_sched.next_err = -ENOENT;
    expect(run_json("DELETE", "/v1/buffers/" BUF_ID, NULL), 404, "id");

    t = run("bob", "GET", "/v1/usage", NULL, NULL, 0);
    ck_assert_int_eq(t->req.resp.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(t->req.resp.json, "buffers")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(t->req.resp.json, "buffer_bytes")), 8);
    done(t);
}
END_TEST

static int fake_gpu_memory(int index, uint64_t *ret_free, uint64_t *ret_total, void *ud)
{
    *ret_free = 1000;
    *ret_total = 4000;
    return 0;
}

START_TEST(test_metrics_show_per_user_gauges_with_escaped_names)
{
    fake_sched.user_gauges[0] = (sched_user_gauge_t){.user = "alice", .queued = 5, .running = 1};
    fake_sched.user_gauges[1] =
        (sched_user_gauge_t){.user = "b\"o\\b\nx", .queued = 2, .running = 0};
    fake_sched.n_user_gauges = 2;
    fake_sched.users_with_jobs = 140;
    test_req_t *t = run_json("GET", "/metrics", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    static const char *const want[] = {
        "# TYPE gpujobd_user_jobs_queued gauge\n",
        "\ngpujobd_user_jobs_queued{user=\"alice\"} 5\n",
        "\ngpujobd_user_jobs_running{user=\"alice\"} 1\n",
        "\ngpujobd_user_jobs_queued{user=\"b\\\"o\\\\b\\nx\"} 2\n",
        "\ngpujobd_user_jobs_running{user=\"b\\\"o\\\\b\\nx\"} 0\n",
        "\ngpujobd_users_with_jobs 140\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(t->req.resp.body, want[i]), "/metrics has no '%s'", want[i]);
    done(t);
}
END_TEST

START_TEST(test_metrics_add_the_gpu_gauges_once_sampled)
{
    const gpu_metrics_device_t devices[] = {{.index = 2, .uuid = "GPU-not-a-real-one"}};
    gpu_metrics_t *m = NULL;
    ck_assert_int_eq(gpu_metrics_start(devices, 1, 100, fake_gpu_memory, NULL, &m), 0);
    gpu_sample_t sample;
    for (int i = 0; i < 2500 && gpu_metrics_snapshot(m, &sample, 1) == 0; i++)
        usleep(2000);
    ck_assert_int_eq(gpu_metrics_snapshot(m, &sample, 1), 1);
    env.gpu_metrics = m;
    test_req_t *t = run_json("GET", "/metrics", NULL);
    ck_assert_int_eq(t->req.resp.status, 200);
    const char *text = t->req.resp.body;
    ck_assert_ptr_nonnull(strstr(text, "\ngpujobd_jobs_queued "));
    ck_assert_ptr_nonnull(strstr(
        text, "\ngpujobd_gpu_memory_used_bytes{device=\"2\",uuid=\"GPU-not-a-real-one\"} 3000\n"));
    ck_assert_ptr_nonnull(strstr(
        text, "\ngpujobd_gpu_memory_total_bytes{device=\"2\",uuid=\"GPU-not-a-real-one\"} 4000\n"));
    ck_assert_ptr_null(strstr(text, "gpujobd_gpu_temperature_celsius"));
    done(t);
    env.gpu_metrics = NULL;
    gpu_metrics_stop(m);
}
END_TEST

static Suite *api_routes_suite(void)
{
    Suite *s = suite_create("api_routes");
    TCase *tc = tcase_create("routes");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_router_matches_paths_methods_and_parameters);
    tcase_add_test(tc, test_dispatch_answers_404_and_405_with_allow);
    tcase_add_test(tc, test_route_table_and_openapi_document_agree);
    tcase_add_test(tc, test_health_ready_and_metrics);
    tcase_add_test(tc, test_metrics_add_the_gpu_gauges_once_sampled);
    tcase_add_test(tc, test_metrics_show_per_user_gauges_with_escaped_names);
    tcase_add_test(tc, test_submit_commits_through_the_scheduler_and_answers_201);
    tcase_add_test(tc, test_submit_refuses_bad_bodies_before_the_scheduler);
    tcase_add_test(tc, test_submit_refuses_an_op_the_backend_cannot_run);
    tcase_add_test(tc, test_submit_maps_scheduler_errors_to_statuses);
    tcase_add_test(tc, test_idempotent_retry_answers_200_with_the_first_job);
    tcase_add_test(tc, test_post_after_stop_intake_answers_503);
    tcase_add_test(tc, test_get_job_checks_id_owner_and_inlines_outputs);
    tcase_add_test(tc, test_list_validates_its_query_and_pages);
    tcase_add_test(tc, test_wait_and_cancel_go_through_the_scheduler);
    tcase_add_test(tc, test_wait_for_an_ended_job_is_answered_from_the_store);
    tcase_add_test(tc, test_outputs_download_as_json_raw_and_npy);
    tcase_add_test(tc, test_buffer_uploads_raw_and_npy);
    tcase_add_test(tc, test_buffer_kept_from_a_job_output_respects_owners);
    tcase_add_test(tc, test_buffer_metadata_delete_and_usage_respect_owners);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(api_routes_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
