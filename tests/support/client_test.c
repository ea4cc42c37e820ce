/* What the libgpujob suites share (client_test.h). */
#define _GNU_SOURCE
#include "support/client_test.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/run_suite.h"

e2e_daemon_t *client_test_daemon;
char client_test_socket_dir[64];
char client_test_socket_url[128];
bool client_test_quick;

int client_test_main(Suite *s)
{
    /* The client's suites time their jobs on the CPU backend (a long job there is one that
     * keeps the one worker busy): they run there whatever $GPUJOB_E2E_BACKEND says. */
    unsetenv("GPUJOB_E2E_BACKEND");
    client_test_quick = getenv("GJC_TEST_QUICK") != NULL;
    snprintf(client_test_socket_dir, sizeof client_test_socket_dir, "/tmp/gjc-test-XXXXXX");
    if (!mkdtemp(client_test_socket_dir)) {
        srunner_free(srunner_create(s)); /* Check frees a suite only through its runner */
        return EXIT_FAILURE;
    }
    snprintf(client_test_socket_url, sizeof client_test_socket_url, "unix:%s/gpujobd.sock",
             client_test_socket_dir);
    char config[512], sock[128];
    snprintf(config, sizeof config,
             "[server]\nunix_socket = %s/gpujobd.sock\n"
             "[scheduler]\ncpu_threads = 1\n"
             "[limits]\nmax_tensor_bytes = 4MiB\n",
             client_test_socket_dir);
    snprintf(sock, sizeof sock, "%s/gpujobd.sock", client_test_socket_dir);
    if (e2e_daemon_start(config, &client_test_daemon) < 0) {
        rmdir(client_test_socket_dir);
        srunner_free(srunner_create(s));
        return EXIT_FAILURE;
    }
    int status = run_suite(s), daemon_status = 0;
    e2e_daemon_stop(client_test_daemon, 30000, &daemon_status);
    e2e_daemon_free(client_test_daemon);
    unlink(sock);
    rmdir(client_test_socket_dir);
    return status;
}

gpujob_client_t *client_test_at(const char *address)
{
    gpujob_client_t *c = NULL;
    char err[256] = "";
    int r = gpujob_client_new(address, &c, err, sizeof err);
    ck_assert_msg(r == 0, "client for %s: %s", address, err);
    return c;
}

gpujob_client_t *client_test_tcp(void)
{
    return client_test_at(e2e_daemon_url(client_test_daemon));
}

float *client_test_random_floats(size_t n, uint32_t seed, double lo, double hi)
{
    float *v = malloc(n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)e2e_rand_uniform(&seed, lo, hi);
    return v;
}

gpujob_spec_t *client_test_saxpy(double a, const float *x, const float *y, int64_t n)
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

void client_test_assert_saxpy_out(const gpujob_job_t *job, double a, const float *x, const float *y,
                                  int64_t n)
{
    ck_assert_msg(gpujob_job_state(job) == GPUJOB_SUCCEEDED, "%s", gpujob_job_json(job));
    gpujob_tensor_t out;
    ck_assert_int_eq(gpujob_job_output(job, "out", &out), 0);
    ck_assert_int_eq(out.dtype, GPUJOB_F32);
    ck_assert_int_eq(out.ndim, 1);
    ck_assert_int_eq(out.shape[0], n);
    ck_assert_msg(out.data, "%s: no output inline", gpujob_job_id(job));
    for (int64_t i = 0; i < n; i++) {
        float want = (float)a * x[i] + y[i], got = ((float *)out.data)[i];
        ck_assert_msg(fabsf(got - want) <= 1e-5f * (fabsf(want) + 1), "%s: out[%ld] %g, want %g",
                      gpujob_job_id(job), (long)i, got, want);
    }
    gpujob_tensor_clear(&out);
}

gpujob_spec_t *client_test_long_spec(gpujob_client_t *c, int channels,
                                     gpujob_buffer_t ret_buffers[2])
{
    int64_t xs[4] = {1, channels, 64, 64}, ws[4] = {channels, channels, 3, 3};
    size_t nx = (size_t)channels * 64 * 64, nw = (size_t)channels * channels * 9;
    float *x = client_test_random_floats(nx, 1, -1, 1),
          *w = client_test_random_floats(nw, 2, -1, 1);
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

gpujob_job_t *client_test_submit_ok(gpujob_client_t *c, const gpujob_spec_t *spec)
{
    gpujob_job_t *job = NULL;
    int r = gpujob_submit(c, spec, &job);
    ck_assert_msg(r == 0, "submit: %d %s", r, gpujob_errmsg(c));
    ck_assert_str_ne(gpujob_job_id(job), "");
    return job;
}

gpujob_job_t *client_test_wait_ok(gpujob_client_t *c, const char *id)
{
    gpujob_job_t *job = NULL;
    int r = gpujob_wait(c, id, 120, &job);
    ck_assert_msg(r == 0, "wait %s: %d %s", id, r, gpujob_errmsg(c));
    return job;
}

long client_test_count_jobs(gpujob_client_t *c, const char *state)
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

int client_test_silent_listener(int *ret_port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 8), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *ret_port = ntohs(a.sin_port);
    return fd;
}
