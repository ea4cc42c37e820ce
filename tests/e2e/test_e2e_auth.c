/* Tokens and auth modes end to end: the real gpujobd with [auth] mode = token, two token users
 * (alice, bob) and an admin (carol, named in [auth] admins) over TCP. One table lists every
 * route of api/openapi.yaml with the status each caller gets; each is tried. Then: the
 * tokens' secrets are nowhere in the state directory or the daemon's log, a revoked token
 * and an expired one are refused on their next request, mode = none on a listener beyond
 * loopback does not start, and a request another site's page may have sent is not taken as
 * the local account. */
#define _GNU_SOURCE /* memmem */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/daemon_harness.h"

#define TOKEN_MAX E2E_TOKEN_SIZE

typedef struct users {
    char owner[TOKEN_MAX], other[TOKEN_MAX], admin[TOKEN_MAX];
} users_t;

/* One request as the holder of token (NULL: anonymous); the status. */
static long request_as(e2e_daemon_t *d, const char *token, const char *method, const char *path,
                       const char *type, const char *body)
{
    char auth[256], ctype[128];
    const char *headers[3] = {NULL};
    int n = 0;
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        headers[n++] = auth;
    }
    if (type) {
        snprintf(ctype, sizeof ctype, "Content-Type: %s", type);
        headers[n++] = ctype;
    }
    e2e_response_t r;
    ck_assert_int_eq(e2e_http_request(d, method, path, headers, body, body ? strlen(body) : 0, &r),
                     0);
    long status = r.status;
    if (status == 401) {
        char www[128];
        ck_assert_ptr_nonnull(e2e_response_header(&r, "WWW-Authenticate", www, sizeof www));
        ck_assert_msg(strncmp(www, "Bearer realm=\"gpujobd\"", 22) == 0, "%s", www);
        ck_assert_str_eq(e2e_error_code(r.json), "unauthorized");
    }
    e2e_response_clear(&r);
    return status;
}

/* A field of the JSON answer to a request as token, which must answer expect. Static. */
static const char *made_by(e2e_daemon_t *d, const char *token, const char *path, const char *type,
                           const char *body, const char *field)
{
    static char value[128];
    char auth[256];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    char ctype[128];
    snprintf(ctype, sizeof ctype, "Content-Type: %s", type);
    const char *headers[] = {auth, ctype, NULL};
    e2e_response_t r;
    ck_assert_int_eq(e2e_http_request(d, "POST", path, headers, body, strlen(body), &r), 0);
    ck_assert_msg(r.status == 201, "POST %s: %ld %s", path, r.status, r.body);
    snprintf(value, sizeof value, "%s", json_string_value(json_object_get(r.json, field)));
    e2e_response_clear(&r);
    return value;
}

#define JOB_BODY                                                                                   \
    "{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[2],\"data\":[1,2]},\"y\":{"   \
    "\"dtype\":\"f32\",\"shape\":[2],\"data\":[3,4]}}}"
#define LONG_JOB_BODY                                                                              \
    "{\"op\":\"debug_sleep\",\"params\":{\"ms\":3000},\"inputs\":{\"x\":{\"dtype\":\"f32\","       \
    "\"shape\":[1],\"data\":[1]}}}"
#define RAW_TYPE "application/octet-stream"

/* The owner's resources that the table's paths name: {job}, {buf}, {tok}. */
typedef struct owned {
    char job[64], buf[64], tok[64];
} owned_t;

/* A route as the table tries it. fresh: the resource is made anew (by the owner) before each
 * caller's try, for routes that delete it. */
typedef struct route_case {
    const char *method, *path, *type, *body;
    char fresh; /* 'j' a long job, 'b' a buffer, 't' a token; 0 for none */
    long owner, other, admin, anon;
} route_case_t;

static const route_case_t routes[] = {
    {"GET", "/healthz", NULL, NULL, 0, 200, 200, 200, 200},
    {"GET", "/readyz", NULL, NULL, 0, 200, 200, 200, 200},
    {"GET", "/metrics", NULL, NULL, 0, 403, 403, 200, 401},
    {"GET", "/v1/info", NULL, NULL, 0, 200, 200, 200, 401},
    {"POST", "/v1/jobs", "application/json", JOB_BODY, 0, 201, 201, 201, 401},
    {"GET", "/v1/jobs", NULL, NULL, 0, 200, 200, 200, 401},
    {"GET", "/v1/jobs/{job}", NULL, NULL, 0, 200, 404, 200, 401},
    {"DELETE", "/v1/jobs/{job}", NULL, NULL, 'j', 200, 404, 200, 401},
    {"GET", "/v1/jobs/{job}/wait?timeout=5", NULL, NULL, 0, 200, 404, 200, 401},
    {"GET", "/v1/jobs/{job}/outputs/out", NULL, NULL, 0, 200, 404, 200, 401},
    {"POST", "/v1/buffers?dtype=f32&shape=1", RAW_TYPE, "abcd", 0, 201, 201, 201, 401},
    {"GET", "/v1/buffers/{buf}", NULL, NULL, 0, 200, 404, 200, 401},
    {"DELETE", "/v1/buffers/{buf}", NULL, NULL, 'b', 200, 404, 200, 401},
    {"GET", "/v1/usage", NULL, NULL, 0, 200, 200, 200, 401},
    {"POST", "/v1/tokens", "application/json", "{\"name\":\"x\"}", 0, 403, 403, 403, 401},
    {"GET", "/v1/tokens", NULL, NULL, 0, 200, 200, 200, 401},
    {"GET", "/v1/tokens?user=alice", NULL, NULL, 0, 200, 403, 200, 401},
    {"DELETE", "/v1/tokens/{tok}", NULL, NULL, 't', 200, 404, 200, 401},
    {"GET", "/v1/jobs?user=alice", NULL, NULL, 0, 200, 403, 200, 401},
    {"GET", "/v1/stats", NULL, NULL, 0, 200, 200, 200, 401},
    {"GET", "/", NULL, NULL, 0, 200, 200, 200, 200},
    {"GET", "/ui/session", NULL, NULL, 0, 200, 200, 200, 200},
    {"GET", "/ui/app.js", NULL, NULL, 0, 200, 200, 200, 200},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

/* Makes the resource of kind for the owner (a token made by the CLI: its id). */
static void owned_make(e2e_daemon_t *d, const char *owner_token, char kind, owned_t *o)
{
    if (kind == 'j')
        snprintf(o->job, sizeof o->job, "%s",
                 made_by(d, owner_token, "/v1/jobs", "application/json", LONG_JOB_BODY, "id"));
    if (kind == 'b')
        snprintf(o->buf, sizeof o->buf, "%s",
                 made_by(d, owner_token, "/v1/buffers?dtype=f32&shape=1", RAW_TYPE, "abcd", "id"));
    if (kind == 't') {
        char token[TOKEN_MAX];
        e2e_token_create_ok(d, "alice", NULL, token);
        snprintf(o->tok, sizeof o->tok, "%.12s", token + 3);
    }
}

/* path with {job}, {buf} and {tok} replaced. */
static void path_fill(const char *path, const owned_t *o, char *out, size_t size)
{
    static const char *const names[] = {"{job}", "{buf}", "{tok}"};
    const char *values[] = {o->job, o->buf, o->tok};
    out[0] = '\0';
    while (*path) {
        size_t used = strlen(out);
        int k = -1;
        for (int i = 0; i < 3; i++)
            if (strncmp(path, names[i], 5) == 0) k = i;
        if (k >= 0) {
            snprintf(out + used, size - used, "%s", values[k]);
            path += 5;
        } else {
            snprintf(out + used, size - used, "%c", *path++);
        }
    }
}

/* Every "  /path:" of api/openapi.yaml with each of its methods is in the table. */
static void table_covers_openapi(void)
{
    char file[1024], line[512], path[256] = "";
    snprintf(file, sizeof file, "%s/api/openapi.yaml", getenv("GPUJOB_SOURCE_DIR"));
    FILE *f = fopen(file, "r");
    ck_assert_ptr_nonnull(f);
    bool in_paths = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "paths:", 6) == 0) in_paths = true;
        if (strncmp(line, "components:", 11) == 0) in_paths = false;
        if (in_paths && strncmp(line, "  /", 3) == 0) sscanf(line, " %255[^:]", path);
        char method[16];
        if (!in_paths || strncmp(line, "    ", 4) != 0 || line[4] == ' ' ||
            sscanf(line + 4, "%15[a-z]:", method) != 1)
            continue;
        for (char *c = method; *c; c++)
            *c = (char)(*c - 'a' + 'A');
        bool found = false;
        for (size_t i = 0; i < N_ROUTES && !found; i++) {
            char shape[256];
            snprintf(shape, sizeof shape, "%s", routes[i].path);
            shape[strcspn(shape, "?")] = '\0';
            /* {job}, {buf}, {tok} stand for the document's {id}. */
            char doc[256];
            path_fill(shape, &(owned_t){"{id}", "{id}", "{id}"}, doc, sizeof doc);
            char *out = strstr(doc, "/outputs/out");
            if (out) snprintf(out, sizeof doc - (size_t)(out - doc), "/outputs/{name}");
            if (strcmp(doc, "/ui/app.js") == 0) snprintf(doc, sizeof doc, "/ui/{file}");
            found = strcmp(routes[i].method, method) == 0 && strcmp(doc, path) == 0;
        }
        ck_assert_msg(found, "%s %s of api/openapi.yaml is not in the table", method, path);
    }
    fclose(f);
}

START_TEST(test_every_route_answers_owner_other_admin_and_anonymous_as_the_table_says)
{
    table_covers_openapi();
    e2e_daemon_t *d = e2e_daemon_start_ok("[auth]\nmode = token\nadmins = carol\n");
    users_t u;
    e2e_token_create_ok(d, "alice", NULL, u.owner);
    e2e_token_create_ok(d, "bob", NULL, u.other);
    e2e_token_create_ok(d, "carol", NULL, u.admin);
    owned_t o = {0};
    snprintf(o.job, sizeof o.job, "%s",
             made_by(d, u.owner, "/v1/jobs?wait=10", "application/json", JOB_BODY, "id"));
    owned_make(d, u.owner, 'b', &o);
    for (size_t i = 0; i < N_ROUTES; i++) {
        const route_case_t *rc = &routes[i];
        const char *who[] = {u.owner, u.other, u.admin, NULL};
        const long want[] = {rc->owner, rc->other, rc->admin, rc->anon};
        static const char *const names[] = {"owner", "other user", "admin", "anonymous"};
        for (int k = 0; k < 4; k++) {
            if (rc->fresh) owned_make(d, u.owner, rc->fresh, &o);
            char path[512];
            path_fill(rc->path, &o, path, sizeof path);
            long got = request_as(d, who[k], rc->method, path, rc->type, rc->body);
            ck_assert_msg(got == want[k], "%s %s as %s: %ld, expected %ld", rc->method, path,
                          names[k], got, want[k]);
        }
    }
    e2e_daemon_free(d);
}
END_TEST

/* Whether file holds needle (len bytes). */
static bool file_holds(const char *file, const void *needle, size_t len)
{
    FILE *f = fopen(file, "rb");
    if (!f) return false;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    bool found = memmem(buf, n, needle, len) != NULL;
    free(buf);
    return found;
}

START_TEST(test_secrets_are_nowhere_and_revoked_or_expired_tokens_are_refused)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[auth]\nmode = token\n[server]\nlog_level = debug\n");
    char token[TOKEN_MAX], short_lived[TOKEN_MAX];
    e2e_token_create_ok(d, "alice", NULL, token);
    e2e_token_create_ok(d, "alice", "1s", short_lived);
    ck_assert_int_eq(request_as(d, token, "POST", "/v1/jobs?wait=10", "application/json", JOB_BODY),
                     201);
    ck_assert_int_eq(request_as(d, token, "GET", "/v1/jobs", NULL, NULL), 200);
    char bad[TOKEN_MAX];
    snprintf(bad, sizeof bad, "%s", token);
    bad[70] = bad[70] == 'a' ? 'b' : 'a';
    ck_assert_int_eq(request_as(d, bad, "GET", "/v1/jobs", NULL, NULL), 401);

    /* Expired: refused once its second has passed. */
    sleep(2);
    ck_assert_int_eq(request_as(d, short_lived, "GET", "/v1/jobs", NULL, NULL), 401);
    /* Revoked: refused on the very next request. */
    char args[64];
    snprintf(args, sizeof args, "revoke %.12s", token + 3);
    e2e_token_cli_ok(d, args);
    ck_assert_int_eq(request_as(d, token, "GET", "/v1/jobs", NULL, NULL), 401);

    /* The secrets' text, in every file of the daemon's directory: state and log. */
    int st;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &st), 0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "find '%s' -type f", e2e_daemon_dir(d));
    FILE *p = popen(cmd, "r");
    char file[1024];
    int files = 0;
    while (fgets(file, sizeof file, p)) {
        file[strcspn(file, "\n")] = '\0';
        files++;
        const char *secrets[] = {token + 16, short_lived + 16, bad + 16};
        for (int i = 0; i < 3; i++)
            ck_assert_msg(!file_holds(file, secrets[i], 64), "'%s' holds a token's secret", file);
    }
    pclose(p);
    ck_assert_int_ge(files, 3); /* the log, the job store and the token store at least */
    e2e_daemon_free(d);
}
END_TEST

/* The status of one request with the given extra headers (NULL-terminated, at most 4). */
static long status_with(e2e_daemon_t *d, const char *method, const char *path,
                        const char *const *extra, const char *body)
{
    const char *headers[6] = {"Content-Type: application/json"};
    for (int i = 0; extra[i]; i++)
        headers[i + 1] = extra[i];
    e2e_response_t r;
    ck_assert_int_eq(e2e_http_request(d, method, path, headers, body, body ? strlen(body) : 0, &r),
                     0);
    long status = r.status;
    if (status == 403) {
        ck_assert_str_eq(e2e_error_code(r.json), "forbidden");
        ck_assert_str_eq(e2e_error_field(r.json), "headers.Origin");
    }
    e2e_response_clear(&r);
    return status;
}

/* A request that no token identifies is taken as the loopback client's account (or as
 * "local" with mode none) only when no web page of another site can have sent it: a foreign
 * Origin, a Host that is not this host's loopback name (DNS rebinding) or Sec-Fetch-Site
 * saying cross-site answers 403 and submits nothing, in both modes; the same request from the
 * daemon's own origin, or from curl (no such headers), is served, and a Bearer token is taken
 * whatever the headers say. */
START_TEST(test_another_sites_page_is_not_taken_as_the_local_account)
{
    const char *modes[] = {"token,peercred", "none"};
    for (int m = 0; m < 2; m++) {
        char config[128];
        snprintf(config, sizeof config, "[auth]\nmode = %s\n", modes[m]);
        e2e_daemon_t *d = e2e_daemon_start_ok(config);
        char own_host[64], own_origin[96], localhost_origin[96], rebound[64], localhost[64];
        snprintf(own_host, sizeof own_host, "Host: 127.0.0.1:%d", e2e_daemon_port(d));
        snprintf(own_origin, sizeof own_origin, "Origin: http://127.0.0.1:%d", e2e_daemon_port(d));
        snprintf(localhost, sizeof localhost, "Host: localhost:%d", e2e_daemon_port(d));
        snprintf(localhost_origin, sizeof localhost_origin, "Origin: http://localhost:%d",
                 e2e_daemon_port(d));
        snprintf(rebound, sizeof rebound, "Host: attacker.example:%d", e2e_daemon_port(d));
        const char *foreign_origin[] = {"Origin: http://attacker.example", NULL};
        const char *null_origin[] = {"Origin: null", NULL};
        const char *rebinding[] = {rebound, NULL};
        const char *fetch_cross[] = {"Sec-Fetch-Site: cross-site", NULL};
        const char *other_port[] = {"Origin: http://127.0.0.1:1", NULL};
        const char *same_origin[] = {own_host, own_origin, "Sec-Fetch-Site: same-origin", NULL};
        const char *by_name[] = {localhost, localhost_origin, NULL};
        const char *plain[] = {NULL};
        const char *const *refused[] = {foreign_origin, null_origin, rebinding, fetch_cross,
                                        other_port};
        for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
            ck_assert_int_eq(status_with(d, "POST", "/v1/jobs", refused[i], JOB_BODY), 403);
            ck_assert_int_eq(status_with(d, "GET", "/v1/jobs", refused[i], NULL), 403);
        }
        ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 0);
        ck_assert_int_eq(status_with(d, "POST", "/v1/jobs", same_origin, JOB_BODY), 201);
        ck_assert_int_eq(status_with(d, "POST", "/v1/jobs", by_name, JOB_BODY), 201);
        ck_assert_int_eq(status_with(d, "POST", "/v1/jobs", plain, JOB_BODY), 201);
        if (m == 0) {
            char token[TOKEN_MAX], auth[TOKEN_MAX + 32];
            e2e_token_create_ok(d, "alice", NULL, token);
            snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
            const char *with_token[] = {auth, "Origin: http://attacker.example", rebound, NULL};
            ck_assert_int_eq(status_with(d, "POST", "/v1/jobs", with_token, JOB_BODY), 201);
        }
        ck_assert_int_eq(e2e_count_jobs_ok(d, ""), m == 0 ? 4 : 3);
        e2e_daemon_free(d);
    }
}
END_TEST

START_TEST(test_mode_none_beyond_loopback_refuses_to_start)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' --listen 0.0.0.0:0 --set auth.mode=none --state-dir /nonexistent --backend "
             "cpu 2>&1 | grep -q 'needs a loopback listener'; echo $?; '%s' --listen 0.0.0.0:0 "
             "--set auth.mode=none --state-dir /nonexistent --backend cpu >/dev/null 2>&1; "
             "echo $?",
             getenv("GPUJOBD_BIN"), getenv("GPUJOBD_BIN"));
    FILE *p = popen(cmd, "r");
    int grep_rc = -1, rc = -1;
    ck_assert_int_eq(fscanf(p, "%d %d", &grep_rc, &rc), 2);
    pclose(p);
    ck_assert_int_eq(grep_rc, 0);
    ck_assert_int_eq(rc, 2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_auth");
    TCase *tc = tcase_create("auth");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_every_route_answers_owner_other_admin_and_anonymous_as_the_table_says);
    tcase_add_test(tc, test_secrets_are_nowhere_and_revoked_or_expired_tokens_are_refused);
    tcase_add_test(tc, test_mode_none_beyond_loopback_refuses_to_start);
    tcase_add_test(tc, test_another_sites_page_is_not_taken_as_the_local_account);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
