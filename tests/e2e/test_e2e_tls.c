/* End-to-end: the daemon serves HTTPS (server.tls_cert, server.tls_key) with a certificate this
 * test makes (a throwaway CA and a server certificate for 127.0.0.1 and localhost, by the
 * openssl program). curl and libgpujob submit and read jobs when they trust the CA, and fail
 * with a certificate error when they do not; plain HTTP to the port gets no answer and leaves
 * the daemon serving; a restart in place serves HTTPS again; a certificate file that is
 * missing or not a certificate stops the start with a line naming it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/gpujob.h"
#include "support/daemon_harness.h"

#define ADD_JOB                                                                                    \
    "{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[1],\"data\":[1]},"            \
    "\"y\":{\"dtype\":\"f32\",\"shape\":[1],\"data\":[2]}}}"

static char dir[64]; /* the CA, the server's certificate and key, curl's outputs */

/* Runs a shell command; its exit status (-1 when it did not exit). */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A CA (ca.pem) and a server certificate it signed for 127.0.0.1 and localhost (srv.pem,
 * srv.key), in dir. */
static void make_certificates(void)
{
    snprintf(dir, sizeof dir, "/tmp/gj-tls-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(sh("cd %s && exec >openssl.log 2>&1 && "
                        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                        "-keyout ca.key -out ca.pem -days 2 -subj /CN=gpujobd-test-ca && "
                        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                        "-keyout srv.key -out srv.csr -subj /CN=localhost && "
                        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' >san && "
                        "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
                        "-out srv.pem -days 2 -extfile san",
                        dir),
                     0);
}

static e2e_daemon_t *start_tls_daemon(void)
{
    char config[512];
    snprintf(config, sizeof config, "[server]\ntls_cert = %s/srv.pem\ntls_key = %s/srv.key\n", dir,
             dir);
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    ck_assert_int_eq(strncmp(e2e_daemon_url(d), "https://", 8), 0);
    return d;
}

/* curl's exit status for one request; the body goes to dir/out. cacert: "--cacert FILE" or "". */
static int curl_run(e2e_daemon_t *d, const char *cacert, const char *method, const char *path,
                    const char *body, long *ret_status)
{
    int rc = sh("curl -sS %s -X %s %s%s%s -o %s/out -w '%%{http_code}' %s%s >%s/code 2>%s/curl.err",
                cacert, method, body ? "-H 'Content-Type: application/json' --data '" : "",
                body ? body : "", body ? "'" : "", dir, e2e_daemon_url(d), path, dir, dir);
    char path_code[128];
    snprintf(path_code, sizeof path_code, "%s/code", dir);
    FILE *f = fopen(path_code, "re");
    *ret_status = 0;
    if (f) {
        if (fscanf(f, "%ld", ret_status) != 1) *ret_status = 0;
        fclose(f);
    }
    return rc;
}

/* The "id" of the JSON in dir/out, into id. */
static void out_id(char *id, size_t size)
{
    char path[128];
    snprintf(path, sizeof path, "%s/out", dir);
    json_t *j = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(j);
    const char *s = json_string_value(json_object_get(j, "id"));
    ck_assert_ptr_nonnull(s);
    snprintf(id, size, "%s", s);
    json_decref(j);
}

START_TEST(test_curl_with_the_ca_submits_and_reads_without_it_fails)
{
    e2e_daemon_t *d = start_tls_daemon();
    char cacert[128], id[64], path[128];
    snprintf(cacert, sizeof cacert, "--cacert %s/ca.pem", dir);
    long status;
    ck_assert_int_eq(curl_run(d, cacert, "POST", "/v1/jobs?wait=30", ADD_JOB, &status), 0);
    ck_assert(status == 200 || status == 201);
    out_id(id, sizeof id);
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    ck_assert_int_eq(curl_run(d, cacert, "GET", path, NULL, &status), 0);
    ck_assert_int_eq(status, 200);
    /* Without the CA: curl's certificate error (60), no answer. */
    ck_assert_int_eq(curl_run(d, "", "GET", path, NULL, &status), 60);
    ck_assert_int_eq(curl_run(d, "", "POST", "/v1/jobs", ADD_JOB, &status), 60);
    ck_assert(e2e_daemon_alive(d));
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_libgpujob_with_the_ca_submits_and_reads_without_it_fails)
{
    e2e_daemon_t *d = start_tls_daemon();
    char ca[128], err[256] = "";
    snprintf(ca, sizeof ca, "%s/ca.pem", dir);
    gpujob_client_t *c = NULL;
    ck_assert_int_eq(gpujob_client_new(e2e_daemon_url(d), &c, err, sizeof err), 0);
    gpujob_info_t *info = NULL;
    ck_assert_int_eq(gpujob_info(c, &info), -EPROTO);
    ck_assert_msg(strcasestr(gpujob_errmsg(c), "certificate"), "%s", gpujob_errmsg(c));
    ck_assert_int_eq(gpujob_client_set_ca_file(c, "/nonexistent/ca.pem"), -ENOENT);
    ck_assert_int_eq(gpujob_client_set_ca_file(c, ca), 0);
    gpujob_spec_t *spec = NULL;
    ck_assert_int_eq(gpujob_spec_new("add", &spec), 0);
    int64_t n = 1;
    float x = 1, y = 2;
    gpujob_tensor_t tx, ty;
    ck_assert_int_eq(gpujob_tensor_init(&tx, GPUJOB_F32, 1, &n, &x), 0);
    ck_assert_int_eq(gpujob_tensor_init(&ty, GPUJOB_F32, 1, &n, &y), 0);
    ck_assert_int_eq(gpujob_spec_input(spec, "x", &tx), 0);
    ck_assert_int_eq(gpujob_spec_input(spec, "y", &ty), 0);
    gpujob_job_t *job = NULL, *read = NULL;
    ck_assert_msg(gpujob_submit(c, spec, &job) == 0, "%s", gpujob_errmsg(c));
    ck_assert_msg(gpujob_wait(c, gpujob_job_id(job), 30, &read) == 0, "%s", gpujob_errmsg(c));
    ck_assert_int_eq(gpujob_job_state(read), GPUJOB_SUCCEEDED);
    gpujob_job_free(read);
    gpujob_client_free(c);

    /* $GPUJOB_CA_FILE does the same for a client made without a CA of its own. */
    setenv("GPUJOB_CA_FILE", ca, 1);
    ck_assert_int_eq(gpujob_client_new(e2e_daemon_url(d), &c, err, sizeof err), 0);
    unsetenv("GPUJOB_CA_FILE");
    ck_assert_msg(gpujob_get(c, gpujob_job_id(job), &read) == 0, "%s", gpujob_errmsg(c));
    gpujob_job_free(read);
    gpujob_client_free(c);
    gpujob_job_free(job);
    gpujob_spec_free(spec);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_plain_http_gets_no_answer_and_restart_serves_tls_again)
{
    e2e_daemon_t *d = start_tls_daemon();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(e2e_daemon_port(d))};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&to, sizeof to), 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    ck_assert_int_eq(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)sizeof req - 1);
    char buf[256];
    ssize_t k = read(fd, buf, sizeof buf - 1);
    /* The daemon closes the connection: no HTTP answer comes back in the clear. */
    ck_assert(k <= 0 || strncmp(buf, "HTTP/", 5) != 0);
    close(fd);
    char cacert[128];
    snprintf(cacert, sizeof cacert, "--cacert %s/ca.pem", dir);
    long status;
    ck_assert_int_eq(curl_run(d, cacert, "GET", "/healthz", NULL, &status), 0);
    ck_assert_int_eq(status, 200);

    /* A restart in place (SIGUSR1) hands the socket over; the next process reads the
     * certificate again and serves HTTPS on it. */
    ck_assert_int_eq(kill(e2e_daemon_pid(d), SIGUSR1), 0);
    double until = e2e_now() + 30;
    int rc;
    do {
        usleep(100 * 1000);
        rc = curl_run(d, cacert, "GET", "/readyz", NULL, &status);
    } while ((rc != 0 || status != 200) && e2e_now() < until);
    ck_assert_int_eq(status, 200);
    char log[512];
    snprintf(log, sizeof log, "%s/gpujobd.log", e2e_daemon_dir(d));
    ck_assert_int_eq(sh("test $(grep -c 'listening on https://' %s) -ge 2", log), 0);
    ck_assert_int_eq(curl_run(d, "", "GET", "/healthz", NULL, &status), 60);
    e2e_daemon_free(d);
}
END_TEST

/* Runs gpujobd with the given TLS files; asserts it exits 1 with a line naming bad_path. */
static void expect_refused(const char *cert, const char *key, const char *bad_path)
{
    const char *bin = getenv("GPUJOBD_BIN");
    ck_assert_ptr_nonnull(bin);
    ck_assert_int_eq(sh("rm -rf %s/state && timeout 30 %s --listen 127.0.0.1:0 --state-dir "
                        "%s/state --backend cpu --set server.tls_cert=%s --set "
                        "server.tls_key=%s >%s/refused.log 2>&1",
                        dir, bin, dir, cert, key, dir),
                     1);
    ck_assert_int_eq(sh("grep -q \"error.*'%s'\" %s/refused.log", bad_path, dir), 0);
    /* The key's bytes are not in the log. */
    ck_assert_int_ne(sh("grep -q 'PRIVATE KEY' %s/refused.log", dir), 0);
}

START_TEST(test_bad_certificate_files_stop_the_start_naming_the_file)
{
    char cert[128], key[128], missing[128], not_pem[128];
    snprintf(cert, sizeof cert, "%s/srv.pem", dir);
    snprintf(key, sizeof key, "%s/srv.key", dir);
    snprintf(missing, sizeof missing, "%s/missing.pem", dir);
    snprintf(not_pem, sizeof not_pem, "%s/san", dir);
    expect_refused(missing, key, missing);
    expect_refused(not_pem, key, not_pem);
    expect_refused(cert, missing, missing);
    expect_refused(cert, cert, cert); /* a certificate is no key */
    char ca_key[128];
    snprintf(ca_key, sizeof ca_key, "%s/ca.key", dir);
    expect_refused(cert, ca_key, ca_key); /* a key of another certificate */
}
END_TEST

static void setup(void)
{
    make_certificates();
}

static void teardown(void)
{
    sh("rm -rf %s", dir);
}

int main(void)
{
    Suite *s = suite_create("tls");
    TCase *tc = tcase_create("tls");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_curl_with_the_ca_submits_and_reads_without_it_fails);
    tcase_add_test(tc, test_libgpujob_with_the_ca_submits_and_reads_without_it_fails);
    tcase_add_test(tc, test_plain_http_gets_no_answer_and_restart_serves_tls_again);
    tcase_add_test(tc, test_bad_certificate_files_stop_the_start_naming_the_file);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
