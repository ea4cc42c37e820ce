/* libgpujob against the real daemon, over TCP and over its Unix socket: every call of the
 * library, the errors it maps (bad addresses, a daemon that is down, one that never answers,
 * 4xx answers with their codes, fields and messages, wait timeouts), idempotent retries after
 * a lost answer (through a proxy that drops it), and typed outputs compared with what the
 * test computed or downloaded another way.
 *
 * One daemon serves the whole suite (started in main, one CPU worker so a long job holds the
 * queue); tests only count jobs they made themselves. With GJC_TEST_QUICK set (the valgrind
 * run) the heaviest loops are shorter. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/gpujob.h"
#include "support/daemon_harness.h"

static e2e_daemon_t *daemon_;
static char socket_dir[64];
static char socket_url[128];
static bool quick;

/* ---- Helpers ----------------------------------------------------------------------------- */

static gpujob_client_t *client_at(const char *address)
{
    gpujob_client_t *c = NULL;
    char err[256] = "";
    int r = gpujob_client_new(address, &c, err, sizeof err);
    ck_assert_msg(r == 0, "client for %s: %s", address, err);
    return c;
}

static gpujob_client_t *client_tcp(void)
{
    return client_at(e2e_daemon_url(daemon_));
}

static float *random_floats(size_t n, uint32_t seed, double lo, double hi)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)e2e_rand_uniform(&seed, lo, hi);
    return v;
}

/* A saxpy spec on n floats; x and y are copied into the spec. */
static gpujob_spec_t *saxpy_spec(double a, const float *x, const float *y, int64_t n)
{
    gpujob_spec_t *spec = NULL;
    gpujob_tensor_t tx, ty;
    ck_assert_int_eq(gpujob_spec_new("saxpy", &spec), 0);
    ck_assert_int_eq(gpujob_tensor_init(&tx, GPUJOB_F32, 1, &n, (void *)x), 0);
    ck_assert_int_eq(gpujob_tensor_init(&ty, GPUJOB_F32, 1, &n, (void *)y), 0);
    ck_assert_int_eq(gpujob_spec_input(spec, "x", &tx), 0);
    ck_assert_int_eq(gpujob_spec_input(spec, "y", &ty), 0);
    ck_assert_int_eq(gpujob_spec_param_double(spec, "a", a), 0);
    return spec;
}

/* A job that keeps the one CPU worker busy for a second or so (C = 128 here): conv2d f32,
 * x [1, C, 64, 64], w [C, C, 3, 3], padding 1. Its tensors are uploaded once as buffers (ids in
 * ret_buffers, to delete), so that submitting it is quick even under valgrind. */
static gpujob_spec_t *long_spec(gpujob_client_t *c, int channels, gpujob_buffer_t ret_buffers[2])
{
    int64_t xs[4] = {1, channels, 64, 64}, ws[4] = {channels, channels, 3, 3};
    size_t nx = (size_t)channels * 64 * 64, nw = (size_t)channels * channels * 9;
    float *x = random_floats(nx, 1, -1, 1), *w = random_floats(nw, 2, -1, 1);
    gpujob_tensor_t tx, tw;
    gpujob_spec_t *spec = NULL;
    gpujob_tensor_init(&tx, GPUJOB_F32, 4, xs, x);
    gpujob_tensor_init(&tw, GPUJOB_F32, 4, ws, w);
    ck_assert_int_eq(gpujob_buffer_put(c, &tx, false, &ret_buffers[0]), 0);
    ck_assert_int_eq(gpujob_buffer_put(c, &tw, false, &ret_buffers[1]), 0);
    ck_assert_int_eq(gpujob_spec_new("conv2d", &spec), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(spec, "x", ret_buffers[0].id), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(spec, "w", ret_buffers[1].id), 0);
    ck_assert_int_eq(gpujob_spec_param_int(spec, "padding", 1), 0);
    free(x);
    free(w);
    return spec;
}

static gpujob_job_t *submit_ok(gpujob_client_t *c, const gpujob_spec_t *spec)
{
    gpujob_job_t *job = NULL;
    int r = gpujob_submit(c, spec, &job);
    ck_assert_msg(r == 0, "submit: %d %s", r, gpujob_errmsg(c));
    ck_assert_str_ne(gpujob_job_id(job), "");
    return job;
}

static gpujob_job_t *wait_ok(gpujob_client_t *c, const char *id)
{
    gpujob_job_t *job = NULL;
    int r = gpujob_wait(c, id, 120, &job);
    ck_assert_msg(r == 0, "wait %s: %d %s", id, r, gpujob_errmsg(c));
    return job;
}

/* Every job the daemon lists for this client, following cursors. */
static long count_jobs(gpujob_client_t *c, const char *state)
{
    long n = 0;
    char *cursor = NULL;
    do {
        gpujob_list_query_t q = {.state = state, .limit = 1000, .after = cursor};
        gpujob_job_list_t *list = NULL;
        int r = gpujob_list(c, &q, &list);
        ck_assert_msg(r == 0, "list: %s", gpujob_errmsg(c));
        n += (long)gpujob_job_list_count(list);
        free(cursor);
        cursor = gpujob_job_list_next(list) ? strdup(gpujob_job_list_next(list)) : NULL;
        gpujob_job_list_free(list);
    } while (cursor);
    return n;
}

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

/* A listening socket (never accepted from) and its port. */
static int silent_listener(int *ret_port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 8), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *ret_port = ntohs(a.sin_port);
    return fd;
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
    setenv("GPUJOB_URL", socket_url, 1);
    ck_assert_int_eq(gpujob_client_new(NULL, &c, NULL, 0), 0);
    ck_assert_str_eq(gpujob_client_address(c), socket_url);
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
    gpujob_client_t *c = client_at(url);
    gpujob_info_t *info = NULL;
    ck_assert_int_eq(gpujob_info(c, &info), -ECONNREFUSED);
    ck_assert_ptr_null(info);
    ck_assert_int_eq(gpujob_http_status(c), 0);
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), url));
    gpujob_client_free(c);

    char path[128];
    snprintf(path, sizeof path, "unix:%s/no-such.sock", socket_dir);
    c = client_at(path);
    gpujob_job_t *job = NULL;
    ck_assert_int_eq(gpujob_get(c, "anything", &job), -ECONNREFUSED);
    ck_assert_str_ne(gpujob_errmsg(c), "");
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_silent_daemon_times_out)
{
    int port = 0, fd = silent_listener(&port);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    gpujob_client_t *c = client_at(url);
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

/* ---- Info and usage ---------------------------------------------------------------------- */

START_TEST(test_info_over_tcp_and_unix_socket)
{
    gpujob_client_t *tcp = client_tcp(), *unix_c = client_at(socket_url);
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
    /* Over TCP the user is "local"; over the socket, the peer's uid. */
    ck_assert_ptr_nonnull(strstr(gpujob_info_json(a), "\"local\""));
    ck_assert_ptr_null(strstr(gpujob_info_json(b), "\"local\""));
    gpujob_info_free(a);
    gpujob_info_free(b);
    gpujob_client_free(tcp);
    gpujob_client_free(unix_c);
}
END_TEST

START_TEST(test_usage_counts_the_callers_jobs)
{
    gpujob_client_t *c = client_tcp();
    gpujob_usage_t before, after;
    ck_assert_int_eq(gpujob_usage(c, &before), 0);
    ck_assert_str_eq(before.owner, "local");
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    gpujob_spec_t *spec = saxpy_spec(1.0, x, y, 4);
    gpujob_job_t *job = submit_ok(c, spec), *done = wait_ok(c, gpujob_job_id(job));
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

/* ---- Jobs and outputs -------------------------------------------------------------------- */

static void check_saxpy_over(const char *address)
{
    gpujob_client_t *c = client_at(address);
    const int64_t n = 1000;
    const double a = 1.75;
    float *x = random_floats((size_t)n, 7, -10, 10), *y = random_floats((size_t)n, 8, -10, 10);
    gpujob_spec_t *spec = saxpy_spec(a, x, y, n);
    gpujob_job_t *job = submit_ok(c, spec);
    ck_assert_str_eq(gpujob_job_op(job), "saxpy");
    ck_assert(gpujob_job_state(job) == GPUJOB_QUEUED || gpujob_job_state(job) == GPUJOB_RUNNING ||
              gpujob_job_state(job) == GPUJOB_SUCCEEDED);
    ck_assert_ptr_nonnull(gpujob_job_created_at(job));
    gpujob_job_t *done = wait_ok(c, gpujob_job_id(job));
    ck_assert_str_eq(gpujob_job_id(done), gpujob_job_id(job));
    ck_assert_int_eq(gpujob_job_state(done), GPUJOB_SUCCEEDED);
    ck_assert_ptr_null(gpujob_job_error_code(done));
    ck_assert_ptr_nonnull(gpujob_job_finished_at(done));
    ck_assert(gpujob_job_run_ms(done) >= 0 && gpujob_job_queue_ms(done) >= 0);
    ck_assert_int_ge(gpujob_job_attempts(done), 1);
    ck_assert_uint_eq(gpujob_job_output_count(done), 1);
    ck_assert_str_eq(gpujob_job_output_name(done, 0), "out");

    /* Inline (4000 bytes is under the inline limit): the values a*x+y. */
    gpujob_tensor_t inl, raw;
    ck_assert_int_eq(gpujob_job_output(done, "out", &inl), 0);
    ck_assert_int_eq(gpujob_job_output(done, "nope", &raw), -ENOENT);
    ck_assert_int_eq(inl.dtype, GPUJOB_F32);
    ck_assert_int_eq(inl.ndim, 1);
    ck_assert_int_eq(inl.shape[0], n);
    ck_assert_ptr_nonnull(inl.data);
    for (int64_t i = 0; i < n; i++) {
        float want = (float)a * x[i] + y[i], got = ((float *)inl.data)[i];
        ck_assert_msg(fabsf(got - want) <= 1e-5f * (fabsf(want) + 1), "out[%ld] %g, want %g",
                      (long)i, got, want);
    }
    /* Raw download, a caller buffer, and a .npy file all carry the same bytes. */
    ck_assert_int_eq(gpujob_output_tensor(c, gpujob_job_id(done), "out", &raw), 0);
    ck_assert_int_eq(raw.dtype, GPUJOB_F32);
    ck_assert_int_eq(raw.shape[0], n);
    ck_assert_uint_eq(raw.nbytes, inl.nbytes);
    ck_assert_mem_eq(raw.data, inl.data, inl.nbytes);
    size_t len = 0;
    char *buf = malloc(inl.nbytes + 16);
    ck_assert_int_eq(gpujob_output_read(c, gpujob_job_id(done), "out", GPUJOB_FORMAT_RAW, buf,
                                        inl.nbytes + 16, &len),
                     0);
    ck_assert_uint_eq(len, inl.nbytes);
    ck_assert_mem_eq(buf, inl.data, inl.nbytes);
    len = 12345;
    ck_assert_int_eq(gpujob_output_read(c, gpujob_job_id(done), "out", GPUJOB_FORMAT_RAW, buf,
                                        inl.nbytes - 1, &len),
                     -ENOBUFS);
    ck_assert_uint_eq(len, 12345);
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), "buffer"));
    free(buf);
    void *npy = NULL;
    ck_assert_int_eq(
        gpujob_output_fetch(c, gpujob_job_id(done), "out", GPUJOB_FORMAT_NPY, &npy, &len), 0);
    gpujob_tensor_t from_npy;
    char err[256];
    ck_assert_int_eq(gpujob_npy_parse(npy, len, &from_npy, err, sizeof err), 0);
    ck_assert_mem_eq(from_npy.data, inl.data, inl.nbytes);
    gpujob_free(npy);
    gpujob_tensor_clear(&from_npy);
    gpujob_tensor_clear(&raw);
    gpujob_tensor_clear(&inl);

    /* The job as GET reports it is the job wait returned. */
    gpujob_job_t *again = NULL;
    ck_assert_int_eq(gpujob_get(c, gpujob_job_id(done), &again), 0);
    ck_assert_int_eq(gpujob_job_state(again), GPUJOB_SUCCEEDED);
    ck_assert_str_eq(gpujob_job_finished_at(again), gpujob_job_finished_at(done));
    gpujob_job_free(again);
    gpujob_job_free(done);
    gpujob_job_free(job);
    gpujob_spec_free(spec);
    free(x);
    free(y);
    gpujob_client_free(c);
}

START_TEST(test_saxpy_round_trip_over_tcp)
{
    check_saxpy_over(e2e_daemon_url(daemon_));
}
END_TEST

START_TEST(test_saxpy_round_trip_over_unix_socket)
{
    check_saxpy_over(socket_url);
}
END_TEST

/* Inline outputs, as JSON numbers decoded by the client per dtype (f16 and bf16 through its
 * own conversions) or as bytes in the answer's binary section: either way they must equal the
 * raw bytes the daemon sends for the same output. */
START_TEST(test_inline_outputs_decode_to_the_raw_bytes_for_every_dtype)
{
    static const gpujob_dtype_t dts[] = {GPUJOB_F32, GPUJOB_F16, GPUJOB_BF16, GPUJOB_F64,
                                         GPUJOB_I32};
    gpujob_client_t *c = client_tcp();
    uint32_t seed = 99;
    const size_t n_dts = sizeof dts / sizeof dts[0];
    for (size_t k = 0; k < 2 * n_dts; k++) {
        bool binary = k >= n_dts;
        gpujob_client_set_binary_outputs(c, binary);
        int64_t shape[2] = {7, 9};
        gpujob_tensor_t tx, ty;
        gpujob_tensor_init(&tx, dts[k % n_dts], 2, shape, NULL);
        gpujob_tensor_init(&ty, dts[k % n_dts], 2, shape, NULL);
        tx.data = malloc(tx.nbytes);
        ty.data = malloc(ty.nbytes);
        for (int64_t i = 0; i < 63; i++) {
            double u = e2e_rand_uniform(&seed, -100, 100), v = e2e_rand_uniform(&seed, -3, 3);
            switch (dts[k % n_dts]) {
            case GPUJOB_F32:
                ((float *)tx.data)[i] = (float)u, ((float *)ty.data)[i] = (float)v;
                break;
            case GPUJOB_F64:
                ((double *)tx.data)[i] = u, ((double *)ty.data)[i] = v;
                break;
            case GPUJOB_I32:
                ((int32_t *)tx.data)[i] = (int32_t)u, ((int32_t *)ty.data)[i] = (int32_t)v;
                break;
            default:
                /* Random finite 16-bit floats: any exponent but the all-ones one. */
                ((uint16_t *)tx.data)[i] =
                    (uint16_t)(e2e_rand(&seed) & (dts[k % n_dts] == GPUJOB_F16 ? 0xbbff : 0xbf7f));
                ((uint16_t *)ty.data)[i] =
                    (uint16_t)(e2e_rand(&seed) & (dts[k % n_dts] == GPUJOB_F16 ? 0xbbff : 0xbf7f));
            }
        }
        gpujob_spec_t *spec = NULL;
        ck_assert_int_eq(gpujob_spec_new("add", &spec), 0);
        ck_assert_int_eq(gpujob_spec_input(spec, "x", &tx), 0);
        ck_assert_int_eq(gpujob_spec_input(spec, "y", &ty), 0);
        gpujob_job_t *job = submit_ok(c, spec), *done = wait_ok(c, gpujob_job_id(job));
        ck_assert_msg(gpujob_job_state(done) == GPUJOB_SUCCEEDED, "%s: %s",
                      gpujob_dtype_name(dts[k % n_dts]), gpujob_job_json(done));
        /* The answer carried the output the way the client asked for it. */
        ck_assert_ptr_nonnull(
            strstr(gpujob_job_json(done), binary ? "\"binary_offset\":0" : "\"data\":["));
        gpujob_tensor_t inl, raw;
        ck_assert_int_eq(gpujob_job_output(done, "out", &inl), 0);
        ck_assert_int_eq(gpujob_output_tensor(c, gpujob_job_id(done), "out", &raw), 0);
        ck_assert_int_eq(inl.dtype, dts[k % n_dts]);
        ck_assert_int_eq(raw.dtype, dts[k % n_dts]);
        ck_assert_int_eq(raw.ndim, 2);
        ck_assert_int_eq(raw.shape[1], 9);
        ck_assert_ptr_nonnull(inl.data);
        ck_assert_msg(memcmp(inl.data, raw.data, raw.nbytes) == 0, "%s: inline != raw",
                      gpujob_dtype_name(dts[k % n_dts]));
        gpujob_tensor_clear(&inl);
        gpujob_tensor_clear(&raw);
        gpujob_job_free(done);
        gpujob_job_free(job);
        gpujob_spec_free(spec);
        free(tx.data);
        free(ty.data);
    }
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_submit_many_is_all_or_nothing)
{
    gpujob_client_t *c = client_tcp();
    /* Each job's own x, so that inputs sent one after another in the body's binary section
     * must each be found where their job says. */
    float x[3] = {1, 2, 3}, y[3] = {4, 5, 6}, xs[3][3];
    gpujob_spec_t *specs[3];
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 3; k++)
            xs[i][k] = x[k] * (float)(i + 1);
        specs[i] = saxpy_spec(i + 1, xs[i], y, 3);
    }
    long before = count_jobs(c, NULL);
    gpujob_job_t *jobs[3] = {NULL};
    ck_assert_int_eq(gpujob_submit_many(c, (const gpujob_spec_t *const *)specs, 3, NULL, jobs), 0);
    ck_assert_str_ne(gpujob_job_id(jobs[0]), gpujob_job_id(jobs[1]));
    ck_assert_str_ne(gpujob_job_id(jobs[1]), gpujob_job_id(jobs[2]));
    for (int i = 0; i < 3; i++) {
        gpujob_job_t *done = wait_ok(c, gpujob_job_id(jobs[i]));
        gpujob_tensor_t out;
        ck_assert_int_eq(gpujob_job_output(done, "out", &out), 0);
        ck_assert_float_eq(((float *)out.data)[2], (float)(i + 1) * xs[i][2] + 6);
        gpujob_tensor_clear(&out);
        gpujob_job_free(done);
        gpujob_job_free(jobs[i]);
    }
    ck_assert_int_eq(count_jobs(c, NULL), before + 3);

    /* Inputs of no bytes still go in a binary section (an empty one). */
    gpujob_spec_t *empty = saxpy_spec(2, x, y, 0);
    gpujob_job_t *job = NULL;
    ck_assert_msg(gpujob_submit(c, empty, &job) == 0, "%s", gpujob_errmsg(c));
    gpujob_job_t *done = wait_ok(c, gpujob_job_id(job));
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
    ck_assert_int_eq(count_jobs(c, NULL), before + 3);
    for (int i = 0; i < 3; i++)
        gpujob_spec_free(specs[i]);
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_same_idempotency_key_returns_the_first_job)
{
    gpujob_client_t *c = client_tcp();
    float x[2] = {1, 2}, y[2] = {3, 4};
    gpujob_spec_t *spec = saxpy_spec(2, x, y, 2);
    const gpujob_spec_t *specs[1] = {spec};
    char key[64];
    snprintf(key, sizeof key, "test-key-%d-%f", (int)getpid(), e2e_now());
    long before = count_jobs(c, NULL);
    gpujob_job_t *first = NULL, *second = NULL;
    ck_assert_int_eq(gpujob_submit_many(c, specs, 1, key, &first), 0);
    ck_assert_int_eq(gpujob_http_status(c), 201);
    ck_assert_int_eq(gpujob_submit_many(c, specs, 1, key, &second), 0);
    ck_assert_int_eq(gpujob_http_status(c), 200);
    ck_assert_str_eq(gpujob_job_id(first), gpujob_job_id(second));
    ck_assert_int_eq(count_jobs(c, NULL), before + 1);
    /* Without a key, every submission is a new job. */
    gpujob_job_t *third = submit_ok(c, spec);
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

START_TEST(test_retried_submit_after_a_lost_answer_creates_one_job)
{
    proxy_t p = {.daemon_port = e2e_daemon_port(daemon_)};
    p.listen_fd = silent_listener(&p.port);
    ck_assert_int_eq(pthread_create(&p.thread, NULL, proxy_main, &p), 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", p.port);
    gpujob_client_t *via_proxy = client_at(url), *direct = client_tcp();
    long before = count_jobs(direct, NULL);

    float x[2] = {5, 6}, y[2] = {1, 1};
    gpujob_spec_t *spec = saxpy_spec(3, x, y, 2);
    gpujob_job_t *job = NULL;
    int r = gpujob_submit(via_proxy, spec, &job);
    ck_assert_msg(r == 0, "submit through the proxy: %s", gpujob_errmsg(via_proxy));
    ck_assert(p.dropped);
    ck_assert_int_ge(p.connections, 2);
    ck_assert_int_eq(gpujob_http_status(via_proxy), 200); /* the daemon recognised the key */
    ck_assert_int_eq(count_jobs(direct, NULL), before + 1);

    /* With retries off, the same loss is reported as a lost connection. */
    p.connections = 0;
    p.dropped = false;
    gpujob_job_t *lost = NULL;
    gpujob_client_free(via_proxy); /* a fresh connection goes through accept again */
    via_proxy = client_at(url);
    gpujob_client_set_retries(via_proxy, 0);
    ck_assert_int_eq(gpujob_submit(via_proxy, spec, &lost), -ECONNRESET);
    ck_assert_ptr_null(lost);

    shutdown(p.listen_fd, SHUT_RDWR);
    pthread_join(p.thread, NULL);
    close(p.listen_fd);
    gpujob_job_free(job);
    gpujob_spec_free(spec);
    gpujob_client_free(via_proxy);
    gpujob_client_free(direct);
}
END_TEST

START_TEST(test_error_answers_map_to_codes_fields_and_messages)
{
    gpujob_client_t *c = client_tcp();
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
    spec = saxpy_spec(1, x, x, 2);
    gpujob_spec_set_priority(spec, 1000);
    ck_assert_int_eq(gpujob_submit(c, spec, &job), -EINVAL);
    ck_assert_str_eq(gpujob_error_field(c), "priority");
    gpujob_spec_set_priority(spec, 0);

    /* A tensor over the daemon's max_tensor_bytes (4 MiB here): 413. */
    int64_t big = quick ? (int64_t)(4u << 20) / 4 + 1 : (int64_t)(5u << 20) / 4;
    float *huge = calloc((size_t)big, sizeof *huge);
    gpujob_spec_t *big_spec = saxpy_spec(1, huge, huge, big);
    ck_assert_int_eq(gpujob_submit(c, big_spec, &job), -E2BIG);
    ck_assert_int_eq(gpujob_http_status(c), 413);
    ck_assert_str_eq(gpujob_error_code(c), "payload_too_large");
    gpujob_spec_free(big_spec);
    free(huge);

    /* Unknown and malformed ids. */
    gpujob_job_t *ok = submit_ok(c, spec), *done = wait_ok(c, gpujob_job_id(ok));
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

static int stop_after_two(const gpujob_job_t *job, double elapsed_s, void *userdata)
{
    ck_assert_int_eq(gpujob_job_state(job), GPUJOB_QUEUED);
    ck_assert(elapsed_s >= 0);
    return ++*(int *)userdata >= 2;
}

/* gpujob_submit_wait: a short job comes back ended, its output inline, from the one request;
 * a job longer than the wait comes back as it stands. */
START_TEST(test_submit_wait_returns_the_job_once_it_ended)
{
    gpujob_client_t *c = client_tcp();
    float x[3] = {1, 2, 3}, y[3] = {10, 20, 30};
    gpujob_spec_t *spec = saxpy_spec(2, x, y, 3);
    gpujob_job_t *job = NULL;
    ck_assert_msg(gpujob_submit_wait(c, spec, 60, &job) == 0, "%s", gpujob_errmsg(c));
    ck_assert_int_eq(gpujob_job_state(job), GPUJOB_SUCCEEDED);
    gpujob_tensor_t out;
    ck_assert_int_eq(gpujob_job_output(job, "out", &out), 0);
    for (int i = 0; i < 3; i++)
        ck_assert(((float *)out.data)[i] == 2 * x[i] + y[i]);
    gpujob_tensor_clear(&out);
    gpujob_job_free(job);

    gpujob_buffer_t slow_buffers[2];
    gpujob_spec_t *slow = long_spec(c, 128, slow_buffers);
    ck_assert_msg(gpujob_submit_wait(c, slow, 0.05, &job) == 0, "%s", gpujob_errmsg(c));
    ck_assert(gpujob_job_state(job) == GPUJOB_QUEUED || gpujob_job_state(job) == GPUJOB_RUNNING);
    gpujob_job_t *done = wait_ok(c, gpujob_job_id(job));
    ck_assert_int_eq(gpujob_job_state(done), GPUJOB_SUCCEEDED);
    ck_assert_int_eq(gpujob_submit_wait(c, spec, NAN, &job), -EINVAL);

    gpujob_job_free(done);
    gpujob_job_free(job);
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[0].id), 0);
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[1].id), 0);
    gpujob_spec_free(slow);
    gpujob_spec_free(spec);
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_cancel_queued_job_and_wait_timeout)
{
    gpujob_client_t *c = client_tcp();
    /* The CPU executor takes two batches per worker thread (one running, one waiting in its own
     * queue, reported as running): with three long jobs ahead, the fourth stays queued for at
     * least one long job's time after the first ends. */
    gpujob_buffer_t slow_buffers[2];
    gpujob_spec_t *slow = long_spec(c, 128, slow_buffers);
    gpujob_job_t *blockers[3] = {submit_ok(c, slow), submit_ok(c, slow), submit_ok(c, slow)};
    float x[2] = {1, 2};
    gpujob_spec_t *spec = saxpy_spec(1, x, x, 2);
    gpujob_job_t *queued = submit_ok(c, spec);

    /* The one worker is busy: the wait gives up after its timeout, writing nothing. */
    gpujob_job_t *none = NULL;
    double t0 = e2e_now();
    ck_assert_int_eq(gpujob_wait(c, gpujob_job_id(queued), 0.3, &none), -ETIMEDOUT);
    double took = e2e_now() - t0;
    ck_assert_msg(took >= 0.29 && took < 5, "wait took %.2f s", took);
    ck_assert_ptr_null(none);
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), gpujob_job_id(queued)));

    /* Progress callbacks see the job while it waits, and can stop the wait. */
    int calls = 0;
    ck_assert_int_eq(
        gpujob_wait_progress(c, gpujob_job_id(queued), 30, 0.05, stop_after_two, &calls, &none),
        -ECANCELED);
    ck_assert_int_eq(calls, 2);

    gpujob_job_t *cancelled = NULL;
    ck_assert_int_eq(gpujob_cancel(c, gpujob_job_id(queued), &cancelled), 0);
    ck_assert_int_eq(gpujob_job_state(cancelled), GPUJOB_CANCELLED);
    gpujob_job_t *final = wait_ok(c, gpujob_job_id(queued));
    ck_assert_int_eq(gpujob_job_state(final), GPUJOB_CANCELLED);
    ck_assert_ptr_null(gpujob_job_started_at(final)); /* it never ran */
    ck_assert_int_eq(gpujob_cancel(c, gpujob_job_id(queued), NULL), -EBUSY);

    for (int i = 0; i < 3; i++) {
        gpujob_job_t *b_done = NULL;
        ck_assert_int_eq(gpujob_wait(c, gpujob_job_id(blockers[i]), 120, &b_done), 0);
        ck_assert_int_eq(gpujob_job_state(b_done), GPUJOB_SUCCEEDED);
        gpujob_job_free(b_done);
        gpujob_job_free(blockers[i]);
    }
    gpujob_job_free(final);
    gpujob_job_free(cancelled);
    gpujob_job_free(queued);
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[0].id), 0);
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[1].id), 0);
    gpujob_spec_free(spec);
    gpujob_spec_free(slow);
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_list_filters_and_pages_through_cursors)
{
    gpujob_client_t *c = client_tcp();
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
        gpujob_job_t *job = submit_ok(c, spec), *done = wait_ok(c, gpujob_job_id(job));
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

/* ---- Buffers ----------------------------------------------------------------------------- */

START_TEST(test_buffers_upload_describe_use_and_delete)
{
    gpujob_client_t *c = client_tcp();
    int64_t shape[2] = {4, 5};
    float *x = random_floats(20, 3, -4, 4), *y = random_floats(20, 4, -4, 4);
    gpujob_tensor_t tx, ty;
    gpujob_tensor_init(&tx, GPUJOB_F32, 2, shape, x);
    gpujob_tensor_init(&ty, GPUJOB_F32, 2, shape, y);

    /* From memory, raw. */
    gpujob_buffer_t bx, got;
    ck_assert_int_eq(gpujob_buffer_put(c, &tx, true, &bx), 0);
    ck_assert_str_ne(bx.id, "");
    ck_assert_int_eq(bx.dtype, GPUJOB_F32);
    ck_assert_int_eq(bx.ndim, 2);
    ck_assert_int_eq(bx.shape[0], 4);
    ck_assert_int_eq(bx.shape[1], 5);
    ck_assert_uint_eq(bx.bytes, 80);
    ck_assert(bx.resident);
    ck_assert_int_eq(gpujob_buffer_get(c, bx.id, &got), 0);
    ck_assert_str_eq(got.id, bx.id);
    ck_assert_uint_eq(got.bytes, 80);
    ck_assert(got.resident);

    /* From a .npy file in memory and on disk. */
    void *npy = NULL;
    size_t len = 0;
    ck_assert_int_eq(gpujob_npy_format(&ty, &npy, &len), 0);
    gpujob_buffer_t by, bfile;
    ck_assert_int_eq(gpujob_buffer_put_npy(c, npy, len, false, &by), 0);
    ck_assert(!by.resident);
    ck_assert_int_eq(by.shape[1], 5);
    char path[128];
    snprintf(path, sizeof path, "%s/y.npy", socket_dir);
    ck_assert_int_eq(gpujob_npy_save(path, &ty), 0);
    ck_assert_int_eq(gpujob_buffer_put_file(c, path, false, &bfile), 0);
    ck_assert_str_ne(bfile.id, by.id);
    ck_assert_uint_eq(bfile.bytes, 80);
    ck_assert_int_eq(gpujob_buffer_put_file(c, "/nonexistent/file.npy", false, &bfile), -ENOENT);
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), "/nonexistent/file.npy"));
    /* A file the daemon must refuse: header lies about the data. */
    ((char *)npy)[len - 1] = 0;
    ck_assert_int_eq(gpujob_buffer_put_npy(c, npy, len - 4, false, &bfile), -EINVAL);
    ck_assert_int_eq(gpujob_http_status(c), 400);
    free(npy);

    /* A job on the two buffers computes x + y. */
    gpujob_spec_t *spec = NULL;
    ck_assert_int_eq(gpujob_spec_new("add", &spec), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(spec, "x", bx.id), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(spec, "y", bfile.id), 0);
    gpujob_job_t *job = submit_ok(c, spec), *done = wait_ok(c, gpujob_job_id(job));
    ck_assert_msg(gpujob_job_state(done) == GPUJOB_SUCCEEDED, "%s", gpujob_job_json(done));
    gpujob_tensor_t out;
    ck_assert_int_eq(gpujob_job_output(done, "out", &out), 0);
    for (int i = 0; i < 20; i++)
        ck_assert_float_eq(((float *)out.data)[i], x[i] + y[i]);
    gpujob_tensor_clear(&out);

    /* Its output kept as a buffer feeds the next job: (x + y) + y. */
    gpujob_buffer_t kept;
    ck_assert_int_eq(gpujob_buffer_keep(c, gpujob_job_id(done), "out", false, &kept), 0);
    ck_assert_int_eq(kept.dtype, GPUJOB_F32);
    ck_assert_int_eq(kept.ndim, 2);
    ck_assert_int_eq(kept.shape[0], 4);
    ck_assert_int_eq(kept.shape[1], 5);
    ck_assert_uint_eq(kept.bytes, 80);
    ck_assert(!kept.resident);
    gpujob_spec_t *next = NULL;
    ck_assert_int_eq(gpujob_spec_new("add", &next), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(next, "x", kept.id), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(next, "y", bfile.id), 0);
    gpujob_job_t *next_job = submit_ok(c, next), *next_done = wait_ok(c, gpujob_job_id(next_job));
    ck_assert_int_eq(gpujob_job_output(next_done, "out", &out), 0);
    for (int i = 0; i < 20; i++)
        ck_assert_float_eq(((float *)out.data)[i], (x[i] + y[i]) + y[i]);
    gpujob_tensor_clear(&out);
    ck_assert_int_eq(gpujob_buffer_keep(c, gpujob_job_id(done), "nope", false, &got), -ENOENT);
    ck_assert_str_eq(gpujob_error_field(c), "query.output");
    ck_assert_int_eq(gpujob_buffer_keep(c, "", "out", false, &got), -EINVAL);
    ck_assert_int_eq(gpujob_buffer_delete(c, kept.id), 0);
    gpujob_job_free(next_job);
    gpujob_job_free(next_done);
    gpujob_spec_free(next);

    /* Delete, then it is gone for reads, deletes and jobs. */
    ck_assert_int_eq(gpujob_buffer_delete(c, bx.id), 0);
    ck_assert_int_eq(gpujob_buffer_get(c, bx.id, &got), -ENOENT);
    ck_assert_int_eq(gpujob_buffer_delete(c, bx.id), -ENOENT);
    gpujob_job_t *none = NULL;
    ck_assert_int_eq(gpujob_submit(c, spec, &none), -ENOENT);
    ck_assert_str_eq(gpujob_error_field(c), "inputs.x.buffer");
    ck_assert_int_eq(gpujob_buffer_delete(c, by.id), 0);
    ck_assert_int_eq(gpujob_buffer_delete(c, bfile.id), 0);
    ck_assert_int_eq(gpujob_buffer_get(c, "", &got), -EINVAL);

    gpujob_job_free(job);
    gpujob_job_free(done);
    gpujob_spec_free(spec);
    unlink(path);
    free(x);
    free(y);
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_bearer_token_is_sent_and_ignored_over_tcp_with_mode_none)
{
    /* With auth mode none (this suite's daemon) every TCP caller is "local": a token sent
     * anyway must not break requests. */
    gpujob_client_t *c = client_tcp();
    ck_assert_int_eq(gpujob_client_set_token(c, "secret-token"), 0);
    gpujob_usage_t u;
    ck_assert_int_eq(gpujob_usage(c, &u), 0);
    ck_assert_int_eq(gpujob_client_set_token(c, NULL), 0);
    ck_assert_int_eq(gpujob_usage(c, &u), 0);
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
    gpujob_client_t *local = client_at(sock_url), *remote = client_at(e2e_daemon_url(d));
    gpujob_client_set_token(remote, NULL);
    gpujob_usage_t u;
    ck_assert_int_eq(gpujob_usage(remote, &u), -EACCES);
    ck_assert_int_eq(gpujob_http_status(remote), 401);

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
    gpujob_client_t *c = client_tcp();
    ck_assert_int_eq(gpujob_client_set_token(c, "gj_abc\r\nX-Evil: 1"), -EINVAL);
    setenv("GPUJOB_TOKEN", "gj_abc_secret\nmore", 1);
    gpujob_client_t *bad = NULL;
    char err[256] = "";
    ck_assert_int_eq(gpujob_client_new(e2e_daemon_url(daemon_), &bad, err, sizeof err), -EINVAL);
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
    /* The client's suite times its jobs on the CPU backend (a long job there is one that keeps
     * the one worker busy): it runs there whatever $GPUJOB_E2E_BACKEND says. */
    unsetenv("GPUJOB_E2E_BACKEND");
    quick = getenv("GJC_TEST_QUICK") != NULL;
    snprintf(socket_dir, sizeof socket_dir, "/tmp/gjc-test-XXXXXX");
    if (!mkdtemp(socket_dir)) return 1;
    snprintf(socket_url, sizeof socket_url, "unix:%s/gpujobd.sock", socket_dir);
    char config[512];
    snprintf(config, sizeof config,
             "[server]\nunix_socket = %s/gpujobd.sock\n"
             "[scheduler]\ncpu_threads = 1\n"
             "[limits]\nmax_tensor_bytes = 4MiB\n",
             socket_dir);
    if (e2e_daemon_start(config, &daemon_) < 0) {
        rmdir(socket_dir);
        return 1;
    }

    Suite *s = suite_create("client");
    TCase *tc = tcase_create("library");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_client_new_rejects_malformed_addresses);
    tcase_add_test(tc, test_submit_wait_returns_the_job_once_it_ended);
    tcase_add_test(tc, test_daemon_down_is_econnrefused_with_message);
    tcase_add_test(tc, test_silent_daemon_times_out);
    tcase_add_test(tc, test_info_over_tcp_and_unix_socket);
    tcase_add_test(tc, test_usage_counts_the_callers_jobs);
    tcase_add_test(tc, test_saxpy_round_trip_over_tcp);
    tcase_add_test(tc, test_saxpy_round_trip_over_unix_socket);
    tcase_add_test(tc, test_inline_outputs_decode_to_the_raw_bytes_for_every_dtype);
    tcase_add_test(tc, test_submit_many_is_all_or_nothing);
    tcase_add_test(tc, test_same_idempotency_key_returns_the_first_job);
    tcase_add_test(tc, test_retried_submit_after_a_lost_answer_creates_one_job);
    tcase_add_test(tc, test_error_answers_map_to_codes_fields_and_messages);
    tcase_add_test(tc, test_cancel_queued_job_and_wait_timeout);
    tcase_add_test(tc, test_list_filters_and_pages_through_cursors);
    tcase_add_test(tc, test_buffers_upload_describe_use_and_delete);
    tcase_add_test(tc, test_bearer_token_is_sent_and_ignored_over_tcp_with_mode_none);
    tcase_add_test(tc, test_token_minted_on_the_socket_works_over_tcp_until_revoked);
    tcase_add_test(tc, test_token_with_a_control_character_is_refused_without_quoting_it);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);

    int status = 0;
    e2e_daemon_stop(daemon_, 30000, &status);
    e2e_daemon_free(daemon_);
    char sock[128];
    snprintf(sock, sizeof sock, "%s/gpujobd.sock", socket_dir);
    unlink(sock);
    rmdir(socket_dir);
    return failed ? 1 : 0;
}
