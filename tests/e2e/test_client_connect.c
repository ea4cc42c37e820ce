/* libgpujob's connections to the real daemon: the addresses it takes and refuses, the errors of
 * a daemon that is down or never answers, /v1/info over TCP and over the Unix socket, and API
 * tokens: sent over TCP, minted on the socket, revoked, never quoted in a message.
 *
 * One daemon serves the suite (support/client_test.h); the token test starts its own, in
 * auth mode token,peercred. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/client_test.h"

/* A TCP port on 127.0.0.1 that nothing listens on (bound, then closed). */
static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* ---- Addresses and transport errors ------------------------------------------------------ */

START_TEST(test_client_new_rejects_malformed_addresses)
{
    static const char *const bad[] = {"ftp://example.com",      "http://",
                                      "relative/socket",        "unix:relative",
                                      "http://127.0.0.1:99999", "http://host/x?y=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gpujob_client_t *c = (gpujob_client_t *)0x1;
        char err[256] = "";
        ck_assert_int_eq(gpujob_client_new(bad[i], &c, err, sizeof err), -EINVAL);
        ck_assert_ptr_eq(c, (gpujob_client_t *)0x1); /* untouched on failure */
        ck_assert_msg(strstr(err, bad[i]) || strstr(err, bad[i] + 5), "'%s': message '%s'", bad[i],
                      err);
    }
    /* NULL means $GPUJOB_URL, else the packaged socket. */
    gpujob_client_t *c = NULL;
    setenv("GPUJOB_URL", client_test_socket_url, 1);
    ck_assert_int_eq(gpujob_client_new(NULL, &c, NULL, 0), 0);
    ck_assert_str_eq(gpujob_client_address(c), client_test_socket_url);
    gpujob_client_free(c);
    unsetenv("GPUJOB_URL");
    ck_assert_int_eq(gpujob_client_new(NULL, &c, NULL, 0), 0);
    ck_assert_str_eq(gpujob_client_address(c), GPUJOB_DEFAULT_SOCKET);
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_daemon_down_is_econnrefused_with_message)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
    gpujob_client_t *c = client_test_at(url);
    gpujob_info_t *info = NULL;
    ck_assert_int_eq(gpujob_info(c, &info), -ECONNREFUSED);
    ck_assert_ptr_null(info);
    ck_assert_int_eq(gpujob_http_status(c), 0);
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), url));
    gpujob_client_free(c);

    char path[128];
    snprintf(path, sizeof path, "unix:%s/no-such.sock", client_test_socket_dir);
    c = client_test_at(path);
    gpujob_job_t *job = NULL;
    ck_assert_int_eq(gpujob_get(c, "anything", &job), -ECONNREFUSED);
    ck_assert_str_ne(gpujob_errmsg(c), "");
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_silent_daemon_times_out)
{
    int port = 0, fd = client_test_silent_listener(&port);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    gpujob_client_t *c = client_test_at(url);
    gpujob_client_set_timeout_ms(c, 300, 1000);
    double t0 = e2e_now();
    gpujob_usage_t u;
    ck_assert_int_eq(gpujob_usage(c, &u), -ETIMEDOUT);
    double took = e2e_now() - t0;
    ck_assert_msg(took >= 0.25 && took < 3.0, "timed out after %.2f s", took);
    gpujob_client_free(c);
    close(fd);
}
END_TEST

/* ---- Info -------------------------------------------------------------------------------- */

START_TEST(test_info_over_tcp_and_unix_socket)
{
    gpujob_client_t *tcp = client_test_tcp(), *unix_c = client_test_at(client_test_socket_url);
    gpujob_info_t *a = NULL, *b = NULL;
    ck_assert_int_eq(gpujob_info(tcp, &a), 0);
    ck_assert_int_eq(gpujob_info(unix_c, &b), 0);
    ck_assert_str_eq(gpujob_info_version(a), gpujob_info_version(b));
    ck_assert_str_eq(gpujob_info_backend(a), "cpu");
    ck_assert_uint_eq(gpujob_info_device_count(a), 0);
    bool saxpy = false;
    ck_assert_uint_ge(gpujob_info_op_count(a), 1);
    for (size_t i = 0; i < gpujob_info_op_count(a); i++) {
        ck_assert_ptr_nonnull(gpujob_info_op_name(a, i));
        ck_assert_ptr_nonnull(gpujob_info_op_summary(a, i));
        if (strcmp(gpujob_info_op_name(a, i), "saxpy") == 0) saxpy = true;
    }
    ck_assert(saxpy);
    ck_assert_ptr_null(gpujob_info_op_name(a, gpujob_info_op_count(a)));
    /* Over loopback TCP and over the socket alike, the user is the account that runs the
     * client, as the kernel names it. */
    char want[96];
    snprintf(want, sizeof want, "\"name\":\"%s\"", e2e_caller_name());
    ck_assert_msg(strstr(gpujob_info_json(a), want), "%s", gpujob_info_json(a));
    ck_assert_msg(strstr(gpujob_info_json(b), want), "%s", gpujob_info_json(b));
    gpujob_info_free(a);
    gpujob_info_free(b);
    gpujob_client_free(tcp);
    gpujob_client_free(unix_c);
}
END_TEST

/* ---- Tokens ------------------------------------------------------------------------------ */

START_TEST(test_bearer_token_is_sent_and_checked_over_tcp)
{
    /* With the default auth mode (this suite's daemon), a token sent over TCP is checked
     * (this one is refused, and not replaced by the loopback client's account); without one,
     * the loopback client is its own account. */
    gpujob_client_t *c = client_test_tcp();
    ck_assert_int_eq(gpujob_client_set_token(c, "secret-token"), 0);
    gpujob_usage_t u;
    ck_assert_int_eq(gpujob_usage(c, &u), -EACCES);
    ck_assert_int_eq(gpujob_http_status(c), 401);
    ck_assert_int_eq(gpujob_client_set_token(c, NULL), 0);
    ck_assert_int_eq(gpujob_usage(c, &u), 0);
    ck_assert_str_eq(u.owner, e2e_caller_name());
    gpujob_client_free(c);
}
END_TEST

/* A token minted over the Unix socket of a daemon with auth mode token,peercred works over
 * TCP, is listed without its secret, and is refused from the request after its revocation; no
 * message of the library quotes it. */
START_TEST(test_token_minted_on_the_socket_works_over_tcp_until_revoked)
{
    char dir[64] = "/tmp/gjc-token-XXXXXX", config[512], sock_url[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(config, sizeof config,
             "[server]\nunix_socket = %s/gpujobd.sock\n[auth]\nmode = token,peercred\n", dir);
    snprintf(sock_url, sizeof sock_url, "unix:%s/gpujobd.sock", dir);
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    e2e_wait_unix_socket_ok(sock_url + 5);
    gpujob_client_t *local = client_test_at(sock_url), *remote = client_test_at(e2e_daemon_url(d));
    gpujob_client_set_token(remote, NULL);
    gpujob_usage_t u;
    ck_assert_int_eq(gpujob_usage(remote, &u), 0); /* over loopback: the caller's account */
    ck_assert_str_eq(u.owner, e2e_caller_name());

    gpujob_token_t t;
    char text[GPUJOB_TOKEN_SIZE];
    ck_assert_int_eq(gpujob_token_create(local, "laptop", 3600, &t, text), 0);
    ck_assert_msg(strncmp(text, "gj_", 3) == 0 && strstr(text, t.id), "token text %s", text);
    ck_assert_str_eq(t.name, "laptop");
    ck_assert_str_ne(t.expires_at, "");
    ck_assert_str_eq(t.last_used_at, "");
    /* Over TCP nobody mints a token, not even with a valid one. */
    ck_assert_int_eq(gpujob_client_set_token(remote, text), 0);
    char other[GPUJOB_TOKEN_SIZE];
    ck_assert_int_eq(gpujob_token_create(remote, "more", 0, NULL, other), -EACCES);
    ck_assert_int_eq(gpujob_http_status(remote), 403);

    ck_assert_int_eq(gpujob_usage(remote, &u), 0);
    ck_assert_str_eq(u.owner, t.owner);
    gpujob_token_t *list = NULL;
    size_t n = 0;
    ck_assert_int_eq(gpujob_token_list(remote, NULL, &list, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(list[0].id, t.id);
    ck_assert_str_eq(list[0].owner, t.owner);
    ck_assert_str_ne(list[0].last_used_at, "");
    free(list);

    /* Revoking by the whole text sends only the id; the next request is refused. */
    ck_assert_int_eq(gpujob_token_revoke(local, text), 0);
    ck_assert_int_eq(gpujob_usage(remote, &u), -EACCES);
    ck_assert_int_eq(gpujob_http_status(remote), 401);
    ck_assert_msg(!strstr(gpujob_errmsg(remote), text + 3), "%s", gpujob_errmsg(remote));
    ck_assert_int_eq(gpujob_token_revoke(local, t.id), -ENOENT);
    ck_assert_int_eq(gpujob_token_list(local, NULL, &list, &n), 0);
    ck_assert_uint_eq(n, 0);
    free(list);
    /* Another user's list is an admin's: root of the socket is one, anyone else gets 403. */
    int r = gpujob_token_list(local, "someone-else", &list, &n);
    if (getuid() == 0) {
        ck_assert_int_eq(r, 0);
        free(list);
    } else {
        ck_assert_int_eq(r, -EACCES);
    }

    /* The daemon's log and state never hold the token's secret. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "grep -r -a -l -F '%s' '%s'", strrchr(text, '_') + 1,
             e2e_daemon_dir(d));
    ck_assert_int_ne(system(cmd), 0);
    gpujob_client_free(local);
    gpujob_client_free(remote);
    e2e_daemon_free(d);
    snprintf(cmd, sizeof cmd, "%s/gpujobd.sock", dir);
    unlink(cmd);
    rmdir(dir);
}
END_TEST

START_TEST(test_token_with_a_control_character_is_refused_without_quoting_it)
{
    gpujob_client_t *c = client_test_tcp();
    ck_assert_int_eq(gpujob_client_set_token(c, "gj_abc\r\nX-Evil: 1"), -EINVAL);
    setenv("GPUJOB_TOKEN", "gj_abc_secret\nmore", 1);
    gpujob_client_t *bad = NULL;
    char err[256] = "";
    ck_assert_int_eq(gpujob_client_new(e2e_daemon_url(client_test_daemon), &bad, err, sizeof err),
                     -EINVAL);
    unsetenv("GPUJOB_TOKEN");
    ck_assert_ptr_null(bad);
    ck_assert_msg(strstr(err, "GPUJOB_TOKEN") && !strstr(err, "secret"), "%s", err);
    ck_assert_int_eq(gpujob_token_revoke(c, "gj__"), -EINVAL);
    ck_assert_int_eq(gpujob_token_create(c, "", 0, NULL, (char[GPUJOB_TOKEN_SIZE]){0}), -EINVAL);
    gpujob_client_free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_connect");
    TCase *tc = tcase_create("library");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_client_new_rejects_malformed_addresses);
    tcase_add_test(tc, test_daemon_down_is_econnrefused_with_message);
    tcase_add_test(tc, test_silent_daemon_times_out);
    tcase_add_test(tc, test_info_over_tcp_and_unix_socket);
    tcase_add_test(tc, test_bearer_token_is_sent_and_checked_over_tcp);
    tcase_add_test(tc, test_token_minted_on_the_socket_works_over_tcp_until_revoked);
    tcase_add_test(tc, test_token_with_a_control_character_is_refused_without_quoting_it);
    suite_add_tcase(s, tc);
    return client_test_main(s);
}
