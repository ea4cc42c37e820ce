/* Who sent a request (api/http_identity.c), decided from what the kernel said of the
 * connection, the request's headers, the [auth] settings and a real token store on SQLite. */
#include <check.h>
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/http_identity.h"
#include "support/run_suite.h"

static char dir[64];
static auth_store_t *tokens;
static char token[AUTH_TOKEN_SIZE];
static char me[OWNER_SIZE]; /* the test's own account, as the kernel would name its socket */

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_api_identity.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(auth_store_open(dir, &tokens), 0);
    ck_assert_int_eq(auth_token_create(tokens, "alice", "laptop", 0, NULL, token), 0);
    struct passwd *pw = getpwuid(getuid());
    if (pw)
        snprintf(me, sizeof me, "%s", pw->pw_name);
    else
        snprintf(me, sizeof me, "uid:%u", (unsigned)getuid());
}

static void teardown(void)
{
    auth_store_close(tokens);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* The [auth] settings of mode (over a loopback listener) and allow_users. */
static auth_settings_t *settings(const char *mode, const char *allow_users)
{
    config_t cfg;
    config_defaults(&cfg);
    snprintf(cfg.listen, sizeof cfg.listen, "127.0.0.1:8080");
    snprintf(cfg.mode, sizeof cfg.mode, "%s", mode);
    snprintf(cfg.allow_users, sizeof cfg.allow_users, "%s", allow_users);
    auth_settings_t *s;
    char err[512];
    ck_assert_msg(auth_settings_new(&cfg, &s, err, sizeof err) == 0, "%s", err);
    return s;
}

/* Who a TCP request from the test's own loopback socket is, carrying authorization and, when
 * cross_site, the Host of another site's page. */
static api_user_t tcp_user(const auth_settings_t *auth, const char *authorization, bool cross_site)
{
    http_peer_t peer = {.err = 0, .uid = getuid()};
    http_caller_t caller = {.peer = &peer,
                            .authorization = authorization,
                            .host = cross_site ? "attacker.example:8080" : "127.0.0.1:8080"};
    api_user_t user;
    ck_assert_int_eq(http_request_user(&caller, auth, tokens, NULL, &user), 0);
    return user;
}

START_TEST(test_a_bearer_token_wins_over_the_loopback_account)
{
    auth_settings_t *auth = settings("token,peercred", "");
    char h[AUTH_TOKEN_SIZE + 16];
    snprintf(h, sizeof h, "Bearer %s", token);
    api_user_t u = tcp_user(auth, h, false);
    ck_assert_str_eq(u.name, "alice");
    ck_assert(u.by_token);
    ck_assert(!u.over_unix);
    u = tcp_user(auth, NULL, false);
    ck_assert_str_eq(u.name, me);
    ck_assert(!u.by_token);
    auth_settings_free(auth);
}
END_TEST

START_TEST(test_a_bad_token_is_not_replaced_by_the_loopback_account)
{
    auth_settings_t *auth = settings("token,peercred", "");
    api_user_t u = tcp_user(auth, "Bearer gj_not_a_token", false);
    ck_assert_str_eq(u.name, "");
    ck_assert_int_eq(u.err, -EACCES);
    u = tcp_user(auth, "Basic YWxpY2U6eA==", false);
    ck_assert_str_eq(u.name, "");
    ck_assert_int_eq(u.err, -EACCES);
    auth_settings_free(auth);
}
END_TEST

START_TEST(test_a_cross_site_request_is_the_tokens_or_nobodys)
{
    auth_settings_t *auth = settings("token,peercred", "");
    api_user_t u = tcp_user(auth, NULL, true);
    ck_assert_str_eq(u.name, "");
    ck_assert_int_eq(u.err, -EXDEV);
    char h[AUTH_TOKEN_SIZE + 16];
    snprintf(h, sizeof h, "Bearer %s", token);
    u = tcp_user(auth, h, true);
    ck_assert_str_eq(u.name, "alice");
    auth_settings_free(auth);
    /* With mode none, a cross-site request is nobody's too. */
    auth = settings("none", "");
    u = tcp_user(auth, NULL, true);
    ck_assert_str_eq(u.name, "");
    ck_assert_int_eq(u.err, -EXDEV);
    auth_settings_free(auth);
}
END_TEST

START_TEST(test_mode_none_names_local_over_tcp_and_the_peer_over_the_unix_socket)
{
    auth_settings_t *auth = settings("none", "");
    api_user_t u = tcp_user(auth, NULL, false);
    ck_assert_str_eq(u.name, "local");
    ck_assert(!u.admin);
    http_peer_t peer = {.err = 0, .uid = getuid()};
    http_caller_t caller = {.over_unix = true, .peer = &peer};
    ck_assert_int_eq(http_request_user(&caller, auth, tokens, NULL, &u), 0);
    ck_assert_str_eq(u.name, me);
    ck_assert(u.over_unix);
    /* A Unix socket peer the kernel did not name is an error, not nobody. */
    peer.err = -EIO;
    ck_assert_int_eq(http_request_user(&caller, auth, tokens, NULL, &u), -EIO);
    caller.peer = NULL;
    ck_assert_int_eq(http_request_user(&caller, auth, tokens, NULL, &u), -ENOMEM);
    auth_settings_free(auth);
}
END_TEST

START_TEST(test_a_loopback_client_the_kernel_did_not_name_is_nobody)
{
    auth_settings_t *auth = settings("token,peercred", "");
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    conn_ratelimit_t rl = {0};
    http_peer_log_t log = {&lock, &rl};
    /* Beyond loopback: no credentials. Closed, or the kernel not asked: not found. */
    const int errs[] = {-EREMOTE, -ENOENT, -EPERM};
    const int want[] = {-ENOKEY, -ESRCH, -ESRCH};
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        http_peer_t peer = {.err = errs[i]};
        http_caller_t caller = {.peer = &peer, .host = "localhost"};
        api_user_t u;
        ck_assert_int_eq(http_request_user(&caller, auth, tokens, &log, &u), 0);
        ck_assert_str_eq(u.name, "");
        ck_assert_int_eq(u.err, want[i]);
    }
    auth_settings_free(auth);
}
END_TEST

START_TEST(test_an_account_the_allow_list_keeps_out_is_refused)
{
    auth_settings_t *auth = settings("token,peercred", "bob");
    char h[AUTH_TOKEN_SIZE + 16];
    snprintf(h, sizeof h, "Bearer %s", token);
    api_user_t u = tcp_user(auth, h, false);
    ck_assert_str_eq(u.name, "");
    ck_assert_str_eq(u.refused, "alice");
    ck_assert_int_eq(u.err, -EPERM);
    auth_settings_free(auth);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api_identity");
    TCase *tc = tcase_create("identity");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_a_bearer_token_wins_over_the_loopback_account);
    tcase_add_test(tc, test_a_bad_token_is_not_replaced_by_the_loopback_account);
    tcase_add_test(tc, test_a_cross_site_request_is_the_tokens_or_nobodys);
    tcase_add_test(tc, test_mode_none_names_local_over_tcp_and_the_peer_over_the_unix_socket);
    tcase_add_test(tc, test_a_loopback_client_the_kernel_did_not_name_is_nobody);
    tcase_add_test(tc, test_an_account_the_allow_list_keeps_out_is_refused);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
