/* Local accounts told apart by the kernel, with no token: two test accounts made here with
 * useradd, each in a forked child that drops to its uid and talks HTTP to the real gpujobd.
 *
 * - Over loopback TCP, with the packaged configuration (config/gpujobd.conf) as it is, each is
 *   itself: neither sees, waits for, downloads or cancels the other's jobs (404), neither is an
 *   admin, and root, an admin, sees both.
 * - ?user= naming someone else, and the admin routes, answer 403 to a user who is not an
 *   admin in every auth mode (none, token, peercred, token,peercred), on each transport the
 *   mode identifies; an admin is answered.
 * - [auth] allow_users and allow_groups keep an account out on both transports, a token of
 *   theirs included (403 naming the key); the socket's mode and group keep out those not in it.
 *
 * It needs root (to create the accounts and to switch to them) and useradd, userdel, groupadd
 * and groupdel (Debian's passwd package, which scripts/deps.sh installs); otherwise it says why
 * and exits 77 (skipped). The accounts and the group are removed at exit, after a failed test,
 * and on SIGINT or SIGTERM. */
#define _GNU_SOURCE
#include <check.h>
#include <curl/curl.h>
#include <errno.h>
#include <grp.h>
#include <jansson.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/local_accounts.h"
#include "support/run_suite.h"

/* A test account: a, in the test group; b, in no group of ours. */
typedef struct account {
    char name[32];
    uid_t uid;
    gid_t gid;
} account_t;

static account_t a, b;
static char group_name[32];
static gid_t group_gid;
static bool made_a, made_b, made_group;
static pid_t maker; /* the process that made them: only it removes them */
static char socket_dir[64];

static void accounts_remove(void)
{
    if (getpid() != maker) return;
    static const char msg[] = "test_e2e_local_users: userdel/groupdel failed; remove by hand\n";
    if (made_a) {
        made_a = false;
        char *argv[] = {"userdel", a.name, NULL};
        if (local_run_program(argv) != 0) (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    }
    if (made_b) {
        made_b = false;
        char *argv[] = {"userdel", b.name, NULL};
        if (local_run_program(argv) != 0) (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    }
    if (made_group) {
        made_group = false;
        char *argv[] = {"groupdel", group_name, NULL};
        if (local_run_program(argv) != 0) (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    }
}

static void on_signal(int sig)
{
    accounts_remove();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* A system account without a home or a login shell, in group when not NULL. */
static int account_create(account_t *acc, const char *name, const char *group, bool *made)
{
    snprintf(acc->name, sizeof acc->name, "%s", name);
    return local_account_create(acc->name, group, made, &acc->uid, &acc->gid);
}

/* --- HTTP, a new connection for each request --- */

typedef struct buf {
    char *data;
    size_t len;
} buf_t;

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    buf_t *b = arg;
    char *grown = realloc(b->data, b->len + size * n + 1);
    if (!grown) return 0;
    memcpy(grown + b->len, p, size * n);
    b->data = grown;
    b->len += size * n;
    b->data[b->len] = '\0';
    return size * n;
}

/* Where a request goes: the daemon's TCP port (over 127.0.0.1), or its Unix socket; and the
 * Bearer token it sends (NULL: none). */
typedef struct target {
    int port;
    const char *unix_path;
    const char *token;
} target_t;

/* Sends method path (with a JSON body when body is not NULL) on a connection of its own, made
 * by the calling process, so that the kernel names the calling process's account. The status
 * (0 when no answer came: *ret_json NULL) and the answer's JSON in *ret_json (NULL when not
 * JSON, or ret_json NULL). */
static long request(const target_t *t, const char *method, const char *path, const char *body,
                    json_t **ret_json)
{
    CURL *c = curl_easy_init();
    if (!c) return 0;
    char url[512], auth[256];
    if (t->unix_path)
        snprintf(url, sizeof url, "http://localhost%s", path);
    else
        snprintf(url, sizeof url, "http://127.0.0.1:%d%s", t->port, path);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (t->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", t->token);
        h = curl_slist_append(h, auth);
    }
    buf_t out = {0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    if (t->unix_path) curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, t->unix_path);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(c, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &out);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    long status = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (ret_json) *ret_json = out.data ? json_loads(out.data, JSON_DECODE_ANY, NULL) : NULL;
    free(out.data);
    return status;
}

/* --- a side run as an account --- */

/* Fails the calling side: says what went wrong and exits with the step's number. */
static void side_fail(int step, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "step %d: ", step);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    _exit(10 + step);
}

/* Sends a request and fails the side unless it answers want; returns the answer's JSON (a new
 * reference; json null when none). */
static json_t *expect(int step, const target_t *t, const char *method, const char *path,
                      const char *body, long want)
{
    json_t *j = NULL;
    long got = request(t, method, path, body, &j);
    if (got != want) {
        char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
        side_fail(step, "%s %s answered %ld, expected %ld: %s", method, path, got, want,
                  text ? text : "(no JSON)");
    }
    return j ? j : json_null();
}

/* As expect, for a 403 whose error names field. */
static void expect_forbidden(int step, const target_t *t, const char *path, const char *field)
{
    json_t *j = expect(step, t, "GET", path, NULL, 403);
    const char *f = json_string_value(json_object_get(json_object_get(j, "error"), "field"));
    if (!f || strcmp(f, field) != 0) side_fail(step, "GET %s: field '%s', not %s", path, f, field);
    json_decref(j);
}

typedef void (*side_fn)(const void *arg, int out_fd);

/* Runs fn(arg, fd) in a child that has dropped to acc's uid, its groups and gid (acc NULL:
 * stays root), and waits for it; what it writes to fd comes back in out (size bytes,
 * NUL-terminated; out NULL: nothing). Fails the test unless the child exits 0. */
static void run_as(const account_t *acc, side_fn fn, const void *arg, char *out, size_t size)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        if (acc && (initgroups(acc->name, acc->gid) < 0 || setgid(acc->gid) < 0 ||
                    setuid(acc->uid) < 0 || geteuid() != acc->uid))
            side_fail(0, "cannot become %s: %s", acc->name, strerror(errno));
        fn(arg, fds[1]);
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t n;
    char sink[256];
    while ((n = read(fds[0], out ? out + got : sink, out ? size - 1 - got : sizeof sink)) > 0)
        if (out) got += (size_t)n;
    if (out) out[got] = '\0';
    close(fds[0]);
    int ws = 0;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
                  "the side of %s failed (exit %d; its reason is above)", acc ? acc->name : "root",
                  WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
}

static const char saxpy_job[] =
    "{\"op\": \"saxpy\", \"params\": {\"a\": 2}, \"inputs\": {"
    "\"x\": {\"dtype\": \"f32\", \"shape\": [4], \"data\": [1, 2, 3, 4]},"
    "\"y\": {\"dtype\": \"f32\", \"shape\": [4], \"data\": [1, 1, 1, 1]}}}";

/* --- isolation over loopback TCP --- */

typedef struct iso_arg {
    target_t t;
    const account_t *me, *other;
    char other_done[64], other_long[64]; /* the other account's jobs; "" for none yet */
} iso_arg_t;

/* One account's side: itself, not an admin; submits a job that runs to its end and a long
 * one; finds the other's jobs absent in every way and another user's data closed; writes
 * "DONE LONG" (its jobs' ids) to fd. */
static void iso_side(const void *arg, int fd)
{
    const iso_arg_t *x = arg;
    const target_t *t = &x->t;
    json_t *info = expect(1, t, "GET", "/v1/info", NULL, 200);
    json_t *user = json_object_get(info, "user");
    const char *name = json_string_value(json_object_get(user, "name"));
    if (!name || strcmp(name, x->me->name) != 0 || json_is_true(json_object_get(user, "admin")))
        side_fail(1, "the daemon sees '%s' (admin %d), not %s", name,
                  json_is_true(json_object_get(user, "admin")), x->me->name);
    json_decref(info);

    json_t *done = expect(2, t, "POST", "/v1/jobs?wait=30", saxpy_job, 201);
    const char *state = json_string_value(json_object_get(done, "state"));
    if (!state || strcmp(state, "succeeded") != 0) side_fail(2, "its job ended '%s'", state);
    json_t *long_job = e2e_long_job_new(4000);
    char *long_text = json_dumps(long_job, JSON_COMPACT);
    json_decref(long_job);
    json_t *queued = expect(3, t, "POST", "/v1/jobs", long_text, 201);
    free(long_text);
    char ids[160];
    snprintf(ids, sizeof ids, "%s %s", json_string_value(json_object_get(done, "id")),
             json_string_value(json_object_get(queued, "id")));
    json_decref(done);
    json_decref(queued);

    /* Its list holds its own jobs and nothing else. */
    json_t *list = expect(4, t, "GET", "/v1/jobs", NULL, 200);
    json_t *jobs = json_object_get(list, "jobs");
    size_t i;
    json_t *j;
    json_array_foreach(jobs, i, j)
    {
        const char *id = json_string_value(json_object_get(j, "id"));
        const char *owner = json_string_value(json_object_get(j, "owner"));
        if (!owner || strcmp(owner, x->me->name) != 0 || strstr(x->other_done, id))
            side_fail(4, "its list shows job %s of '%s'", id, owner);
    }
    if (json_array_size(jobs) < 2) side_fail(4, "its list has %zu jobs", json_array_size(jobs));
    json_decref(list);

    /* The other's jobs do not exist for it: 404 for reading, waiting, outputs and cancelling. */
    char path[256];
    if (x->other_done[0]) {
        snprintf(path, sizeof path, "/v1/jobs/%s", x->other_done);
        json_decref(expect(5, t, "GET", path, NULL, 404));
        snprintf(path, sizeof path, "/v1/jobs/%s/wait?timeout=1", x->other_done);
        json_decref(expect(6, t, "GET", path, NULL, 404));
        snprintf(path, sizeof path, "/v1/jobs/%s/outputs/out", x->other_done);
        json_decref(expect(7, t, "GET", path, NULL, 404));
        snprintf(path, sizeof path, "/v1/jobs/%s", x->other_long);
        json_decref(expect(8, t, "DELETE", path, NULL, 404));
        snprintf(path, sizeof path, "/v1/jobs?user=%s", x->other->name);
        expect_forbidden(9, t, path, "query.user");
    }
    /* Another user's data and the admin routes are closed to it. */
    expect_forbidden(10, t, "/v1/jobs?user=root", "query.user");
    expect_forbidden(11, t, "/v1/usage?user=all", "query.user");
    json_decref(expect(12, t, "GET", "/metrics", NULL, 403));
    if (write(fd, ids, strlen(ids)) != (ssize_t)strlen(ids)) side_fail(13, "write");
}

START_TEST(test_two_accounts_over_loopback_tcp_are_isolated_without_tokens)
{
    /* The packaged configuration, as the .deb installs it. */
    char path[4096];
    snprintf(path, sizeof path, "%s/config/gpujobd.conf", getenv("GPUJOB_SOURCE_DIR"));
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    static char packaged[1 << 16];
    size_t n = fread(packaged, 1, sizeof packaged - 1, f);
    fclose(f);
    packaged[n] = '\0';
    e2e_daemon_t *d = e2e_daemon_start_ok(packaged);

    iso_arg_t xa = {.t = {.port = e2e_daemon_port(d)}, .me = &a, .other = &b};
    char a_ids[160], b_ids[160];
    run_as(&a, iso_side, &xa, a_ids, sizeof a_ids);
    iso_arg_t xb = {.t = {.port = e2e_daemon_port(d)}, .me = &b, .other = &a};
    ck_assert_int_eq(sscanf(a_ids, "%63s %63s", xb.other_done, xb.other_long), 2);
    run_as(&b, iso_side, &xb, b_ids, sizeof b_ids);
    /* And a's side again, now that b has jobs. */
    ck_assert_int_eq(sscanf(b_ids, "%63s %63s", xa.other_done, xa.other_long), 2);
    run_as(&a, iso_side, &xa, NULL, 0);

    /* b's attempt left a's long job alone; root (uid 0 over loopback) is an admin and sees
     * both accounts' jobs, named by owner. */
    target_t root = {.port = e2e_daemon_port(d)};
    char q[256];
    snprintf(q, sizeof q, "/v1/jobs/%s", xb.other_long);
    json_t *j = NULL;
    ck_assert_int_eq(request(&root, "GET", q, NULL, &j), 200);
    ck_assert_str_eq(json_string_value(json_object_get(j, "owner")), a.name);
    ck_assert_str_ne(json_string_value(json_object_get(j, "state")), "cancelled");
    json_decref(j);
    snprintf(q, sizeof q, "/v1/jobs?user=%s", b.name);
    ck_assert_int_eq(request(&root, "GET", q, NULL, &j), 200);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "jobs")), 2);
    json_decref(j);
    ck_assert_int_eq(request(&root, "GET", "/v1/info", NULL, &j), 200);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "user"), "name")),
                     "root");
    json_decref(j);
    e2e_daemon_free(d);
}
END_TEST

/* --- ?user= and the admin routes in every mode --- */

/* A user who is not an admin, by the target it sends with: another user's jobs, usage and
 * tokens, and /metrics, answer 403. */
static void non_admin_side(const void *arg, int fd)
{
    (void)fd;
    const target_t *t = arg;
    expect_forbidden(1, t, "/v1/jobs?user=root", "query.user");
    expect_forbidden(2, t, "/v1/usage?user=all", "query.user");
    expect_forbidden(3, t, "/v1/usage?user=root", "query.user");
    expect_forbidden(4, t, "/v1/tokens?user=root", "query.user");
    json_decref(expect(5, t, "GET", "/metrics", NULL, 403));
    /* Its own name is no other user. */
    json_t *info = expect(6, t, "GET", "/v1/info", NULL, 200);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs?user=%s",
             json_string_value(json_object_get(json_object_get(info, "user"), "name")));
    json_decref(info);
    json_decref(expect(7, t, "GET", path, NULL, 200));
}

/* An admin, by the target it sends with: answered. */
static void admin_side(const void *arg, int fd)
{
    (void)fd;
    const target_t *t = arg;
    json_decref(expect(1, t, "GET", "/v1/jobs?user=someone", NULL, 200));
    json_decref(expect(2, t, "GET", "/v1/usage?user=all", NULL, 200));
    json_decref(expect(3, t, "GET", "/metrics", NULL, 200));
}

/* A daemon of mode with a Unix socket (and admins = carol), its socket's path in sock. */
static e2e_daemon_t *mode_daemon(const char *mode, char *sock, size_t size)
{
    snprintf(sock, size, "%s/mode.sock", socket_dir);
    char config[512];
    snprintf(config, sizeof config,
             "[server]\nunix_socket = %s\n[auth]\nmode = %s\nadmins = carol\n", sock, mode);
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    e2e_wait_unix_socket_ok(sock);
    return d;
}

START_TEST(test_user_query_and_admin_routes_refuse_non_admins_in_every_mode)
{
    char sock[128], b_token[E2E_TOKEN_SIZE], carol[E2E_TOKEN_SIZE];

    /* none: every TCP client is "local", no admin; the socket's peers by uid. */
    e2e_daemon_t *d = mode_daemon("none", sock, sizeof sock);
    target_t tcp = {.port = e2e_daemon_port(d)}, unix_socket = {.unix_path = sock};
    run_as(NULL, non_admin_side, &tcp, NULL, 0);
    run_as(&b, non_admin_side, &unix_socket, NULL, 0);
    run_as(NULL, admin_side, &unix_socket, NULL, 0); /* root on the socket */
    e2e_daemon_free(d);

    /* token: who a token names. */
    d = mode_daemon("token", sock, sizeof sock);
    e2e_token_create_ok(d, b.name, NULL, b_token);
    e2e_token_create_ok(d, "carol", NULL, carol);
    tcp = (target_t){.port = e2e_daemon_port(d), .token = b_token};
    run_as(NULL, non_admin_side, &tcp, NULL, 0);
    tcp.token = carol;
    run_as(NULL, admin_side, &tcp, NULL, 0);
    e2e_daemon_free(d);

    /* peercred: the kernel's answer, on both transports. */
    d = mode_daemon("peercred", sock, sizeof sock);
    tcp = (target_t){.port = e2e_daemon_port(d)};
    run_as(&b, non_admin_side, &tcp, NULL, 0);
    run_as(&b, non_admin_side, &unix_socket, NULL, 0);
    run_as(NULL, admin_side, &tcp, NULL, 0);
    e2e_daemon_free(d);

    /* token,peercred: both. */
    d = mode_daemon("token,peercred", sock, sizeof sock);
    e2e_token_create_ok(d, b.name, NULL, b_token);
    e2e_token_create_ok(d, "carol", NULL, carol);
    tcp = (target_t){.port = e2e_daemon_port(d)};
    run_as(&b, non_admin_side, &tcp, NULL, 0);
    run_as(&b, non_admin_side, &unix_socket, NULL, 0);
    tcp.token = b_token;
    run_as(NULL, non_admin_side, &tcp, NULL, 0);
    tcp.token = carol;
    run_as(&b, admin_side, &tcp, NULL, 0); /* a token over loopback is its owner's */
    tcp.token = NULL;
    run_as(NULL, admin_side, &tcp, NULL, 0);
    e2e_daemon_free(d);
}
END_TEST

/* --- who may connect --- */

typedef struct allow_arg {
    target_t tcp, unix_socket;
    const char *refused_by; /* the key a refusal names; NULL: this side is let in */
} allow_arg_t;

/* One side on both transports: let in (200), or refused with 403 naming the key on every
 * route but the anonymous ones. */
static void allow_side(const void *arg, int fd)
{
    (void)fd;
    const allow_arg_t *x = arg;
    const target_t *targets[] = {&x->tcp, &x->unix_socket};
    for (int i = 0; i < 2; i++) {
        const target_t *t = targets[i];
        if (!x->refused_by) {
            json_decref(expect(1 + i, t, "GET", "/v1/jobs", NULL, 200));
            continue;
        }
        expect_forbidden(3 + i, t, "/v1/jobs", x->refused_by);
        json_t *j = expect(5 + i, t, "POST", "/v1/jobs", saxpy_job, 403);
        const char *message =
            json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        if (!message || !strstr(message, "may not use this daemon"))
            side_fail(5 + i, "the refusal says '%s'", message);
        json_decref(j);
        json_decref(expect(7 + i, t, "GET", "/healthz", NULL, 200));
    }
}

START_TEST(test_accounts_outside_allow_lists_are_refused_on_both_transports)
{
    char sock[128], config[512], b_token[E2E_TOKEN_SIZE];
    snprintf(sock, sizeof sock, "%s/allow.sock", socket_dir);
    snprintf(config, sizeof config, "[server]\nunix_socket = %s\n[auth]\nallow_users = %s\n", sock,
             a.name);
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    e2e_wait_unix_socket_ok(sock);
    allow_arg_t x = {.tcp = {.port = e2e_daemon_port(d)}, .unix_socket = {.unix_path = sock}};
    run_as(&a, allow_side, &x, NULL, 0);
    run_as(NULL, allow_side, &x, NULL, 0); /* root, an admin, always may */
    x.refused_by = "auth.allow_users";
    run_as(&b, allow_side, &x, NULL, 0);
    /* A token of b's is b, and refused as well. */
    e2e_token_create_ok(d, b.name, NULL, b_token);
    target_t by_token = {.port = e2e_daemon_port(d), .token = b_token};
    json_t *j = NULL;
    ck_assert_int_eq(request(&by_token, "GET", "/v1/jobs", NULL, &j), 403);
    ck_assert_str_eq(e2e_error_field(j), "auth.allow_users");
    json_decref(j);
    e2e_daemon_free(d);

    /* allow_groups: a is in the test group, b is not. */
    snprintf(config, sizeof config, "[server]\nunix_socket = %s\n[auth]\nallow_groups = %s\n", sock,
             group_name);
    d = e2e_daemon_start_ok(config);
    e2e_wait_unix_socket_ok(sock);
    x = (allow_arg_t){.tcp = {.port = e2e_daemon_port(d)}, .unix_socket = {.unix_path = sock}};
    run_as(&a, allow_side, &x, NULL, 0);
    x.refused_by = "auth.allow_groups";
    run_as(&b, allow_side, &x, NULL, 0);
    e2e_daemon_free(d);
}
END_TEST

/* A side that expects to connect to the socket (want 200) or to be kept out by its
 * permissions (want 0: no answer). */
typedef struct socket_arg {
    target_t t;
    long want;
} socket_arg_t;

static void socket_side(const void *arg, int fd)
{
    (void)fd;
    const socket_arg_t *x = arg;
    long got = request(&x->t, "GET", "/v1/info", NULL, NULL);
    if (got != x->want) side_fail(1, "the socket answered %ld, expected %ld", got, x->want);
}

START_TEST(test_socket_mode_and_group_keep_out_who_is_not_in_the_group)
{
    char sock[128], config[512];
    snprintf(sock, sizeof sock, "%s/group.sock", socket_dir);
    snprintf(config, sizeof config,
             "[server]\nunix_socket = %s\nunix_socket_mode = 0660\nunix_socket_group = %s\n", sock,
             group_name);
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    e2e_wait_unix_socket_ok(sock);
    struct stat st;
    ck_assert_int_eq(stat(sock, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0660);
    ck_assert_uint_eq(st.st_gid, group_gid);
    socket_arg_t x = {.t = {.unix_path = sock}, .want = 200};
    run_as(&a, socket_side, &x, NULL, 0);
    x.want = 0;
    run_as(&b, socket_side, &x, NULL, 0);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    if (geteuid() != 0) {
        printf("skipped: creating local accounts and switching to them needs root\n");
        return 77;
    }
    char *probe[] = {"sh", "-c",
                     "command -v useradd && command -v userdel && command -v groupadd && "
                     "command -v groupdel",
                     NULL};
    if (local_run_program(probe) != 0) {
        printf("skipped: useradd/userdel/groupadd/groupdel are missing (the passwd package)\n");
        return 77;
    }
    curl_global_init(CURL_GLOBAL_ALL);
    /* Made here, not in a test's forked process, so that this process removes them even when
     * a test dies. */
    maker = getpid();
    atexit(accounts_remove);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    snprintf(group_name, sizeof group_name, "gjg%ld", (long)getpid());
    char *groupadd[] = {"groupadd", "--system", group_name, NULL};
    if (local_run_program(groupadd) != 0) {
        fprintf(stderr, "groupadd %s failed\n", group_name);
        return 1;
    }
    made_group = true;
    struct group *gr = getgrnam(group_name);
    if (!gr) return 1;
    group_gid = gr->gr_gid;
    char name[32];
    snprintf(name, sizeof name, "gja%ld", (long)getpid());
    int r = account_create(&a, name, group_name, &made_a);
    snprintf(name, sizeof name, "gjb%ld", (long)getpid());
    if (r == 0) r = account_create(&b, name, NULL, &made_b);
    if (r < 0) {
        fprintf(stderr, "useradd failed\n");
        return 1;
    }
    snprintf(socket_dir, sizeof socket_dir, "/tmp/gj-local-XXXXXX");
    if (!mkdtemp(socket_dir) || chmod(socket_dir, 0755) < 0) return 1;

    Suite *s = suite_create("local_users");
    TCase *tc = tcase_create("kernel");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_two_accounts_over_loopback_tcp_are_isolated_without_tokens);
    tcase_add_test(tc, test_user_query_and_admin_routes_refuse_non_admins_in_every_mode);
    tcase_add_test(tc, test_accounts_outside_allow_lists_are_refused_on_both_transports);
    tcase_add_test(tc, test_socket_mode_and_group_keep_out_who_is_not_in_the_group);
    suite_add_tcase(s, tc);
    int status = run_suite(s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", socket_dir);
    (void)!system(cmd);
    return status;
}
