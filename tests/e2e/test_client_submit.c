/* libgpujob's submissions to the real daemon: lists all or nothing, idempotency keys, one job
 * (or one waited list's jobs) after a retry of a lost answer (through a proxy that drops it), the
 * error answers mapped to error values with the daemon's codes, fields and messages, lists of jobs
 * paged through cursors, and the caller's usage.
 *
 * One daemon serves the suite (support/client_test.h); tests count only jobs they made. With
 * GJC_TEST_QUICK set (the valgrind run) the heaviest loops are shorter. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/client_test.h"

START_TEST(test_submit_many_is_all_or_nothing)
{
    gpujob_client_t *c = client_test_tcp();
    /* Each job's own x, so that inputs sent one after another in the body's binary section
     * must each be found where their job says. */
    float x[3] = {1, 2, 3}, y[3] = {4, 5, 6}, xs[3][3];
    gpujob_spec_t *specs[3];
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 3; k++)
            xs[i][k] = x[k] * (float)(i + 1);
        specs[i] = client_test_saxpy(i + 1, xs[i], y, 3);
    }
    long before = client_test_count_jobs(c, NULL);
    gpujob_job_t *jobs[3] = {NULL};
    ck_assert_int_eq(gpujob_submit_many(c, (const gpujob_spec_t *const *)specs, 3, NULL, jobs), 0);
    ck_assert_str_ne(gpujob_job_id(jobs[0]), gpujob_job_id(jobs[1]));
    ck_assert_str_ne(gpujob_job_id(jobs[1]), gpujob_job_id(jobs[2]));
    for (int i = 0; i < 3; i++) {
        gpujob_job_t *done = client_test_wait_ok(c, gpujob_job_id(jobs[i]));
        gpujob_tensor_t out;
        ck_assert_int_eq(gpujob_job_output(done, "out", &out), 0);
        ck_assert_float_eq(((float *)out.data)[2], (float)(i + 1) * xs[i][2] + 6);
        gpujob_tensor_clear(&out);
        gpujob_job_free(done);
        gpujob_job_free(jobs[i]);
    }
    ck_assert_int_eq(client_test_count_jobs(c, NULL), before + 3);

    /* Inputs of no bytes still go in a binary section (an empty one). */
    gpujob_spec_t *empty = client_test_saxpy(2, x, y, 0);
    gpujob_job_t *job = NULL;
    ck_assert_msg(gpujob_submit(c, empty, &job) == 0, "%s", gpujob_errmsg(c));
    gpujob_job_t *done = client_test_wait_ok(c, gpujob_job_id(job));
    ck_assert_int_eq(gpujob_job_state(done), GPUJOB_SUCCEEDED);
    gpujob_job_free(done);
    gpujob_job_free(job);
    gpujob_spec_free(empty);
    before++;

    /* One bad job (an input saxpy does not have) rejects the whole request, naming it. */
    gpujob_tensor_t extra;
    int64_t n = 3;
    gpujob_tensor_init(&extra, GPUJOB_F32, 1, &n, x);
    ck_assert_int_eq(gpujob_spec_input(specs[1], "bogus", &extra), 0);
    gpujob_job_t *none[3] = {NULL};
    ck_assert_int_eq(gpujob_submit_many(c, (const gpujob_spec_t *const *)specs, 3, NULL, none),
                     -EINVAL);
    ck_assert_ptr_null(none[0]);
    ck_assert_int_eq(gpujob_http_status(c), 400);
    ck_assert_str_eq(gpujob_error_code(c), "invalid_argument");
    ck_assert_str_eq(gpujob_error_field(c), "[1].inputs.bogus");
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), "[1].inputs.bogus"));
    ck_assert_int_eq(client_test_count_jobs(c, NULL), before + 3);
    for (int i = 0; i < 3; i++)
        gpujob_spec_free(specs[i]);
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_same_idempotency_key_returns_the_first_job)
{
    gpujob_client_t *c = client_test_tcp();
    float x[2] = {1, 2}, y[2] = {3, 4};
    gpujob_spec_t *spec = client_test_saxpy(2, x, y, 2);
    const gpujob_spec_t *specs[1] = {spec};
    char key[64];
    snprintf(key, sizeof key, "test-key-%d-%f", (int)getpid(), e2e_now());
    long before = client_test_count_jobs(c, NULL);
    gpujob_job_t *first = NULL, *second = NULL;
    ck_assert_int_eq(gpujob_submit_many(c, specs, 1, key, &first), 0);
    ck_assert_int_eq(gpujob_http_status(c), 201);
    ck_assert_int_eq(gpujob_submit_many(c, specs, 1, key, &second), 0);
    ck_assert_int_eq(gpujob_http_status(c), 200);
    ck_assert_str_eq(gpujob_job_id(first), gpujob_job_id(second));
    ck_assert_int_eq(client_test_count_jobs(c, NULL), before + 1);
    /* Without a key, every submission is a new job. */
    gpujob_job_t *third = client_test_submit_ok(c, spec);
    ck_assert_str_ne(gpujob_job_id(third), gpujob_job_id(first));
    char long_key[200];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    gpujob_job_t *unused = NULL;
    ck_assert_int_eq(gpujob_submit_many(c, specs, 1, long_key, &unused), -EINVAL);
    gpujob_job_free(first);
    gpujob_job_free(second);
    gpujob_job_free(third);
    gpujob_spec_free(spec);
    gpujob_client_free(c);
}
END_TEST

/* A proxy that forwards the first request to the daemon, waits for its answer and then drops
 * the connection without relaying it: the client saw nothing, the daemon created the job. Later
 * connections are relayed both ways. */
typedef struct proxy {
    int listen_fd, port, daemon_port;
    int connections;
    bool dropped;
    pthread_t thread;
} proxy_t;

static int connect_daemon(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads one HTTP message (headers and Content-Length body) from fd into buf. */
static ssize_t read_message(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    for (;;) {
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end) {
            char *cl = strcasestr(buf, "Content-Length:");
            size_t body = cl && cl < end ? strtoul(cl + 15, NULL, 10) : 0;
            if (len >= (size_t)(end + 4 - buf) + body) return (ssize_t)len;
        }
        if (len + 1 >= cap) return -1;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0) return -1;
        len += (size_t)n;
    }
}

static void relay(int a, int b)
{
    struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
    char buf[65536];
    for (;;) {
        if (poll(p, 2, 30000) <= 0) return;
        for (int i = 0; i < 2; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = read(p[i].fd, buf, sizeof buf);
            if (n <= 0 || write(p[1 - i].fd, buf, (size_t)n) != n) return;
        }
    }
}

static void *proxy_main(void *arg)
{
    proxy_t *p = arg;
    static char buf[1 << 20];
    for (;;) {
        int cfd = accept(p->listen_fd, NULL, NULL);
        if (cfd < 0) return NULL;
        int dfd = connect_daemon(p->daemon_port);
        if (p->connections++ == 0) {
            ssize_t n = read_message(cfd, buf, sizeof buf);
            if (n > 0 && write(dfd, buf, (size_t)n) == n && read_message(dfd, buf, sizeof buf) > 0)
                p->dropped = true;
        } else {
            relay(cfd, dfd);
        }
        close(dfd);
        close(cfd);
    }
}

/* Starts a proxy to the suite's daemon; url receives its address. */
static void proxy_start(proxy_t *p, char url[64])
{
    *p = (proxy_t){.daemon_port = e2e_daemon_port(client_test_daemon)};
    p->listen_fd = client_test_silent_listener(&p->port);
    ck_assert_int_eq(pthread_create(&p->thread, NULL, proxy_main, p), 0);
    snprintf(url, 64, "http://127.0.0.1:%d", p->port);
}

static void proxy_stop(proxy_t *p)
{
    shutdown(p->listen_fd, SHUT_RDWR);
    pthread_join(p->thread, NULL);
    close(p->listen_fd);
}

/* Asserts that submission r through the proxy succeeded after the proxy dropped its first
 * answer, that the retry's key was one the daemon knew (200), and that the caller then has
 * want_jobs jobs. */
static void assert_retried_once(const proxy_t *p, int r, gpujob_client_t *via_proxy,
                                gpujob_client_t *direct, long want_jobs)
{
    ck_assert_msg(r == 0, "submit through the proxy: %s", gpujob_errmsg(via_proxy));
    ck_assert(p->dropped);
    ck_assert_int_ge(p->connections, 2);
    ck_assert_int_eq(gpujob_http_status(via_proxy), 200); /* the daemon recognised the key */
    ck_assert_int_eq(client_test_count_jobs(direct, NULL), want_jobs);
}

START_TEST(test_retried_submit_after_a_lost_answer_creates_one_job)
{
    proxy_t p;
    char url[64];
    proxy_start(&p, url);
    gpujob_client_t *via_proxy = client_test_at(url), *direct = client_test_tcp();
    long before = client_test_count_jobs(direct, NULL);

    float x[2] = {5, 6}, y[2] = {1, 1};
    gpujob_spec_t *spec = client_test_saxpy(3, x, y, 2);
    gpujob_job_t *job = NULL;
    int r = gpujob_submit(via_proxy, spec, &job);
    assert_retried_once(&p, r, via_proxy, direct, before + 1);

    /* With retries off, the same loss is reported as a lost connection. */
    p.connections = 0;
    p.dropped = false;
    gpujob_job_t *lost = NULL;
    gpujob_client_free(via_proxy); /* a fresh connection goes through accept again */
    via_proxy = client_test_at(url);
    gpujob_client_set_retries(via_proxy, 0);
    ck_assert_int_eq(gpujob_submit(via_proxy, spec, &lost), -ECONNRESET);
    ck_assert_ptr_null(lost);

    proxy_stop(&p);
    gpujob_job_free(job);
    gpujob_spec_free(spec);
    gpujob_client_free(via_proxy);
    gpujob_client_free(direct);
}
END_TEST

/* A waited list whose answer is lost is sent again with the same Idempotency-Key: the retry
 * waits for the jobs the first try created and answers them (200), ended, with their outputs;
 * no job is created twice. */
START_TEST(test_retried_waited_list_after_a_lost_answer_creates_its_jobs_once)
{
    float x[3][4], y[4] = {1, 2, 3, 4};
    const gpujob_spec_t *specs[3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 4; i++)
            x[k][i] = (float)(10 * k + i);
        specs[k] = client_test_saxpy(k + 1, x[k], y, 4);
    }
    proxy_t p;
    char url[64];
    proxy_start(&p, url);
    gpujob_client_t *via_proxy = client_test_at(url), *direct = client_test_tcp();
    long before = client_test_count_jobs(direct, NULL);
    gpujob_job_t *jobs[3] = {NULL};
    int r = gpujob_submit_many_wait(via_proxy, specs, 3, NULL, 60, jobs);
    assert_retried_once(&p, r, via_proxy, direct, before + 3);
    for (int k = 0; k < 3; k++) {
        client_test_assert_saxpy_out(jobs[k], k + 1, x[k], y, 4);
        gpujob_job_free(jobs[k]);
        gpujob_spec_free((gpujob_spec_t *)specs[k]);
    }
    proxy_stop(&p);
    gpujob_client_free(via_proxy);
    gpujob_client_free(direct);
}
END_TEST

START_TEST(test_error_answers_map_to_codes_fields_and_messages)
{
    gpujob_client_t *c = client_test_tcp();
    gpujob_job_t *job = NULL;
    gpujob_spec_t *spec = NULL;

    /* Unknown op: 400 naming "op". */
    ck_assert_int_eq(gpujob_spec_new("no_such_op", &spec), 0);
    ck_assert_int_eq(gpujob_submit(c, spec, &job), -EINVAL);
    ck_assert_ptr_null(job);
    ck_assert_int_eq(gpujob_http_status(c), 400);
    ck_assert_str_eq(gpujob_error_code(c), "invalid_argument");
    ck_assert_str_eq(gpujob_error_field(c), "op");
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), "HTTP 400 invalid_argument"));
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), "no_such_op"));
    gpujob_spec_free(spec);

    /* A dtype the op does not take: the op's own validation, with its field path. */
    int8_t bytes[4] = {1, 2, 3, 4};
    int64_t n = 4;
    gpujob_tensor_t t;
    gpujob_tensor_init(&t, GPUJOB_I8, 1, &n, bytes);
    ck_assert_int_eq(gpujob_spec_new("add", &spec), 0);
    gpujob_spec_input(spec, "x", &t);
    gpujob_spec_input(spec, "y", &t);
    ck_assert_int_eq(gpujob_submit(c, spec, &job), -EINVAL);
    ck_assert_str_eq(gpujob_error_field(c), "inputs.x.dtype");
    gpujob_spec_free(spec);

    /* Out-of-range priority. */
    float x[2] = {1, 2};
    spec = client_test_saxpy(1, x, x, 2);
    gpujob_spec_set_priority(spec, 1000);
    ck_assert_int_eq(gpujob_submit(c, spec, &job), -EINVAL);
    ck_assert_str_eq(gpujob_error_field(c), "priority");
    gpujob_spec_set_priority(spec, 0);

    /* A tensor over the daemon's max_tensor_bytes (4 MiB here): 413. */
    int64_t big = client_test_quick ? (int64_t)(4u << 20) / 4 + 1 : (int64_t)(5u << 20) / 4;
    float *huge = calloc((size_t)big, sizeof *huge);
    gpujob_spec_t *big_spec = client_test_saxpy(1, huge, huge, big);
    ck_assert_int_eq(gpujob_submit(c, big_spec, &job), -E2BIG);
    ck_assert_int_eq(gpujob_http_status(c), 413);
    ck_assert_str_eq(gpujob_error_code(c), "payload_too_large");
    gpujob_spec_free(big_spec);
    free(huge);

    /* Unknown and malformed ids. */
    gpujob_job_t *ok = client_test_submit_ok(c, spec),
                 *done = client_test_wait_ok(c, gpujob_job_id(ok));
    char unknown[128];
    snprintf(unknown, sizeof unknown, "%s", gpujob_job_id(ok));
    size_t len = strlen(unknown);
    unknown[len - 1] = unknown[len - 1] == '0' ? '1' : '0';
    ck_assert_int_eq(gpujob_get(c, unknown, &job), -ENOENT);
    ck_assert_int_eq(gpujob_http_status(c), 404);
    ck_assert_str_eq(gpujob_error_code(c), "not_found");
    ck_assert_int_eq(gpujob_get(c, "not-an-id", &job), -EINVAL);
    ck_assert_int_eq(gpujob_http_status(c), 400);
    ck_assert_str_eq(gpujob_error_field(c), "id");
    ck_assert_int_eq(gpujob_get(c, "", &job), -EINVAL);
    ck_assert_int_eq(gpujob_http_status(c), 0); /* refused before any request */

    /* Outputs: unknown name 404; cancel of a final job 409. */
    void *data = NULL;
    ck_assert_int_eq(
        gpujob_output_fetch(c, gpujob_job_id(done), "nope", GPUJOB_FORMAT_RAW, &data, &len),
        -ENOENT);
    ck_assert_ptr_null(data);
    ck_assert_int_eq(gpujob_cancel(c, gpujob_job_id(done), NULL), -EBUSY);
    ck_assert_int_eq(gpujob_http_status(c), 409);
    ck_assert_str_eq(gpujob_error_code(c), "conflict");

    /* Bad list queries are refused with the query field. */
    gpujob_job_list_t *list = NULL;
    gpujob_list_query_t q = {.state = "sleeping"};
    ck_assert_int_eq(gpujob_list(c, &q, &list), -EINVAL);
    ck_assert_str_eq(gpujob_error_field(c), "query.state");
    q = (gpujob_list_query_t){.limit = 5000};
    ck_assert_int_eq(gpujob_list(c, &q, &list), -EINVAL);
    ck_assert_str_eq(gpujob_error_field(c), "query.limit");
    ck_assert_ptr_null(list);

    /* A success clears the previous error. */
    gpujob_usage_t u;
    ck_assert_int_eq(gpujob_usage(c, &u), 0);
    ck_assert_str_eq(gpujob_errmsg(c), "");
    ck_assert_str_eq(gpujob_error_code(c), "");
    gpujob_job_free(ok);
    gpujob_job_free(done);
    gpujob_spec_free(spec);
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_list_filters_and_pages_through_cursors)
{
    gpujob_client_t *c = client_test_tcp();
    float x[1] = {1};
    gpujob_spec_t *spec = NULL;
    int64_t one = 1;
    gpujob_tensor_t t;
    gpujob_tensor_init(&t, GPUJOB_F32, 1, &one, x);
    ck_assert_int_eq(gpujob_spec_new("mul", &spec), 0);
    gpujob_spec_input(spec, "x", &t);
    gpujob_spec_input(spec, "y", &t);
    char *ids[5];
    for (int i = 0; i < 5; i++) {
        gpujob_job_t *job = client_test_submit_ok(c, spec),
                     *done = client_test_wait_ok(c, gpujob_job_id(job));
        ids[i] = strdup(gpujob_job_id(job));
        gpujob_job_free(job);
        gpujob_job_free(done);
    }
    /* Pages of 2 of the succeeded mul jobs: every one of ours shows up once. */
    int seen[5] = {0}, pages = 0;
    char *cursor = NULL;
    do {
        gpujob_list_query_t q = {.state = "succeeded", .op = "mul", .limit = 2, .after = cursor};
        gpujob_job_list_t *list = NULL;
        ck_assert_int_eq(gpujob_list(c, &q, &list), 0);
        ck_assert_uint_le(gpujob_job_list_count(list), 2);
        for (size_t i = 0; i < gpujob_job_list_count(list); i++) {
            const gpujob_job_t *job = gpujob_job_list_at(list, i);
            ck_assert_str_eq(gpujob_job_op(job), "mul");
            ck_assert_int_eq(gpujob_job_state(job), GPUJOB_SUCCEEDED);
            for (int k = 0; k < 5; k++)
                if (strcmp(ids[k], gpujob_job_id(job)) == 0) seen[k]++;
        }
        ck_assert_ptr_null(gpujob_job_list_at(list, gpujob_job_list_count(list)));
        free(cursor);
        cursor = gpujob_job_list_next(list) ? strdup(gpujob_job_list_next(list)) : NULL;
        gpujob_job_list_free(list);
        pages++;
    } while (cursor);
    ck_assert_int_ge(pages, 3);
    for (int k = 0; k < 5; k++) {
        ck_assert_int_eq(seen[k], 1);
        free(ids[k]);
    }
    /* No filter matches: an empty last page. */
    gpujob_list_query_t q = {.op = "dequantize", .state = "running"};
    gpujob_job_list_t *list = NULL;
    ck_assert_int_eq(gpujob_list(c, &q, &list), 0);
    ck_assert_uint_eq(gpujob_job_list_count(list), 0);
    ck_assert_ptr_null(gpujob_job_list_next(list));
    gpujob_job_list_free(list);
    gpujob_spec_free(spec);
    gpujob_client_free(c);
}
END_TEST

/* ---- Usage ------------------------------------------------------------------------------- */

START_TEST(test_usage_counts_the_callers_jobs)
{
    gpujob_client_t *c = client_test_tcp();
    gpujob_usage_t before, after;
    ck_assert_int_eq(gpujob_usage(c, &before), 0);
    ck_assert_str_eq(before.owner, e2e_caller_name());
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    gpujob_spec_t *spec = client_test_saxpy(1.0, x, y, 4);
    gpujob_job_t *job = client_test_submit_ok(c, spec),
                 *done = client_test_wait_ok(c, gpujob_job_id(job));
    ck_assert_int_eq(gpujob_job_state(done), GPUJOB_SUCCEEDED);
    ck_assert_int_eq(gpujob_usage(c, &after), 0);
    ck_assert_int_eq(after.jobs[GPUJOB_SUCCEEDED], before.jobs[GPUJOB_SUCCEEDED] + 1);
    ck_assert(after.run_ms >= before.run_ms);
    gpujob_job_free(job);
    gpujob_job_free(done);
    gpujob_spec_free(spec);
    gpujob_client_free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_submit");
    TCase *tc = tcase_create("library");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_submit_many_is_all_or_nothing);
    tcase_add_test(tc, test_same_idempotency_key_returns_the_first_job);
    tcase_add_test(tc, test_retried_submit_after_a_lost_answer_creates_one_job);
    tcase_add_test(tc, test_retried_waited_list_after_a_lost_answer_creates_its_jobs_once);
    tcase_add_test(tc, test_error_answers_map_to_codes_fields_and_messages);
    tcase_add_test(tc, test_list_filters_and_pages_through_cursors);
    tcase_add_test(tc, test_usage_counts_the_callers_jobs);
    suite_add_tcase(s, tc);
    return client_test_main(s);
}
