/* The gpujob CLI end to end against the real daemon: .npy files made here with known contents
 * go in, outputs come back byte for byte, and every exit status (success, failed job, usage
 * error, daemon error, unreachable daemon, wait timeout) is what gpujob(1) promises. The binary
 * comes from $GPUJOB_CLI; each run's stdout and stderr are captured in files. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/gpujob.h"
#include "support/daemon_harness.h"

static e2e_daemon_t *daemon_;
static char dir[64];
static char socket_url[128];

typedef struct run_result {
    int status; /* exit status, or -1 when it did not exit normally */
    char *out, *err;
} run_result_t;

static char *slurp(const char *path, size_t *ret_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) buf = realloc(buf, cap = cap ? cap * 2 : 8192);
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n == 0) break;
    }
    fclose(f);
    buf[len] = '\0';
    if (ret_len) *ret_len = len;
    return buf;
}

/* Runs gpujob with argv (NULL-terminated), GPUJOB_URL set to url (NULL: unset). */
static run_result_t run_cli_env(const char *url, const char *const *args)
{
    char out_path[128], err_path[128];
    snprintf(out_path, sizeof out_path, "%s/stdout", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, STDOUT_FILENO);
        dup2(e, STDERR_FILENO);
        if (url)
            setenv("GPUJOB_URL", url, 1);
        else
            unsetenv("GPUJOB_URL");
        const char *argv[64] = {"gpujob"};
        int n = 1;
        for (; args[n - 1] && n < 63; n++)
            argv[n] = args[n - 1];
        argv[n] = NULL;
        execv(getenv("GPUJOB_CLI"), (char *const *)argv);
        _exit(127);
    }
    int ws = 0;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    run_result_t r = {.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1};
    r.out = slurp(out_path, NULL);
    r.err = slurp(err_path, NULL);
    return r;
}

#define RUN(...) run_cli_env(e2e_daemon_url(daemon_), (const char *const[]){__VA_ARGS__, NULL})

static void result_free(run_result_t *r)
{
    free(r->out);
    free(r->err);
}

#define ck_assert_exit(r, want)                                                                    \
    ck_assert_msg((r).status == (want), "exit %d, want %d\nstdout: %s\nstderr: %s", (r).status,    \
                  (want), (r).out, (r).err)

static char *path_in_dir(const char *name)
{
    char *p = NULL;
    ck_assert_int_ge(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

/* Writes a .npy file of n f32 values value(i) and returns its path (malloc'd). */
static char *write_f32_npy(const char *name, int64_t rows, int64_t cols, float (*value)(int64_t))
{
    int64_t shape[2] = {rows, cols};
    float *v = malloc((size_t)(rows * cols) * sizeof *v);
    for (int64_t i = 0; i < rows * cols; i++)
        v[i] = value(i);
    size_t len = 0;
    void *file = e2e_npy_build("<f4", shape, 2, v, (size_t)(rows * cols) * sizeof *v, &len);
    ck_assert_ptr_nonnull(file);
    char *path = path_in_dir(name);
    FILE *f = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(file, 1, len, f), len);
    fclose(f);
    free(file);
    free(v);
    return path;
}

static float x_value(int64_t i)
{
    return (float)i - 7.5f;
}

static float y_value(int64_t i)
{
    return (float)(i % 5) * 0.25f;
}

/* Checks that path is a .npy of f32 [rows, cols] whose bytes are exactly want(i). */
static void check_npy_f32(const char *path, int64_t rows, int64_t cols, float (*want)(int64_t))
{
    size_t len = 0;
    char *file = slurp(path, &len);
    char descr[16];
    int64_t shape[8];
    int ndim = 0;
    size_t off = 0;
    ck_assert_int_eq(e2e_npy_parse(file, len, descr, shape, &ndim, &off), 0);
    ck_assert_str_eq(descr, "<f4");
    ck_assert_int_eq(ndim, 2);
    ck_assert_int_eq(shape[0], rows);
    ck_assert_int_eq(shape[1], cols);
    ck_assert_uint_eq(len - off, (size_t)(rows * cols) * 4);
    for (int64_t i = 0; i < rows * cols; i++) {
        float w = want(i);
        ck_assert_msg(memcmp(file + off + i * 4, &w, 4) == 0, "%s: element %ld differs", path,
                      (long)i);
    }
    free(file);
}

static float saxpy_want(int64_t i)
{
    return 2.0f * x_value(i) + y_value(i); /* small exact values: no rounding anywhere */
}

static float add_want(int64_t i)
{
    return x_value(i) + y_value(i);
}

static float add_twice_want(int64_t i)
{
    return add_want(i) + y_value(i);
}

/* The id printed alone on stdout, trimmed. */
static char *stdout_id(const run_result_t *r)
{
    char *id = strdup(r->out);
    id[strcspn(id, "\n")] = '\0';
    ck_assert_str_ne(id, "");
    return id;
}

START_TEST(test_run_writes_outputs_byte_for_byte)
{
    char *x = write_f32_npy("x.npy", 4, 6, x_value), *y = write_f32_npy("y.npy", 4, 6, y_value);
    char *out = path_in_dir("out.npy");
    char xarg[256], yarg[256], oarg[256];
    snprintf(xarg, sizeof xarg, "x=%s", x);
    snprintf(yarg, sizeof yarg, "y=%s", y);
    snprintf(oarg, sizeof oarg, "out=%s", out);
    run_result_t r = RUN("run", "saxpy", "-p", "a=2", "-i", xarg, "-i", yarg, "-o", oarg);
    ck_assert_exit(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "succeeded"));
    ck_assert_str_eq(r.err, ""); /* no progress line when stderr is not a terminal */
    check_npy_f32(out, 4, 6, saxpy_want);
    result_free(&r);

    /* The same through the Unix socket, options after and before OP, and --json. */
    r = run_cli_env(socket_url, (const char *const[]){"run", "-i", xarg, "saxpy", "-i", yarg,
                                                      "--param", "a=2", "--wait", "--json", NULL});
    ck_assert_exit(r, 0);
    json_t *job = json_loads(r.out, 0, NULL);
    ck_assert_ptr_nonnull(job);
    ck_assert_str_eq(json_string_value(json_object_get(job, "state")), "succeeded");
    const char *id = json_string_value(json_object_get(job, "id"));
    /* out --raw gives the bare bytes; out (.npy) the same file as run -o. */
    char *raw = path_in_dir("out.raw"), *npy2 = path_in_dir("out2.npy");
    run_result_t o =
        run_cli_env(socket_url, (const char *const[]){"out", id, "out", "-o", raw, "--raw", NULL});
    ck_assert_exit(o, 0);
    size_t len = 0;
    char *bytes = slurp(raw, &len);
    ck_assert_uint_eq(len, 24 * 4);
    for (int i = 0; i < 24; i++) {
        float w = saxpy_want(i);
        ck_assert(memcmp(bytes + 4 * i, &w, 4) == 0);
    }
    free(bytes);
    result_free(&o);
    o = run_cli_env(socket_url, (const char *const[]){"out", id, "out", "-o", npy2, NULL});
    ck_assert_exit(o, 0);
    check_npy_f32(npy2, 4, 6, saxpy_want);
    result_free(&o);
    json_decref(job);
    result_free(&r);
    free(raw);
    free(npy2);
    free(x);
    free(y);
    free(out);
}
END_TEST

static float tenth_value(int64_t i)
{
    (void)i;
    return 0.1f;
}

/* An f32 output of 0.2 (0.1f + 0.1f, exact) and a param of 0.1 print as the daemon sent them,
 * shortest: "0.2" and "0.1", not jansson's 17 digits (0.20000000298023224 for the float as a
 * double, 0.10000000000000001 for the param), whether run prints the answer or status reads
 * the job again. */
START_TEST(test_json_prints_numbers_as_the_daemon_sent_them)
{
    char *x = write_f32_npy("tenth.npy", 1, 3, tenth_value);
    char xarg[256], yarg[256];
    snprintf(xarg, sizeof xarg, "x=%s", x);
    snprintf(yarg, sizeof yarg, "y=%s", x);
    run_result_t r = RUN("--json", "run", "add", "-i", xarg, "-i", yarg, "--wait");
    ck_assert_exit(r, 0);
    json_t *job = json_loads(r.out, 0, NULL);
    ck_assert_ptr_nonnull(job);
    char *id = strdup(json_string_value(json_object_get(job, "id")));
    json_t *data = json_object_get(json_object_get(json_object_get(job, "outputs"), "out"), "data");
    ck_assert_int_eq(json_array_size(data), 3);
    ck_assert((float)json_real_value(json_array_get(data, 0)) == 0.2f);
    json_decref(job);
    /* JSON_INDENT(2): each element of the list on its own line. */
    ck_assert_msg(strstr(r.out, " 0.2,\n") && strstr(r.out, " 0.2\n"), "%s", r.out);
    ck_assert_msg(!strstr(r.out, "0.200"), "%s", r.out);
    result_free(&r);

    r = RUN("status", id, "--json");
    ck_assert_exit(r, 0);
    ck_assert_msg(strstr(r.out, " 0.2,\n") && !strstr(r.out, "0.200"), "%s", r.out);
    result_free(&r);

    r = RUN("--json", "run", "saxpy", "-p", "a=0.1", "-i", xarg, "-i", yarg, "--wait");
    ck_assert_exit(r, 0);
    ck_assert_msg(strstr(r.out, "\"a\": 0.1\n") && !strstr(r.out, "0.1000"), "%s", r.out);
    result_free(&r);
    free(id);
    free(x);
}
END_TEST

START_TEST(test_submit_then_status_wait_ls_and_cancel)
{
    char *x = write_f32_npy("x2.npy", 2, 3, x_value);
    char xarg[256];
    snprintf(xarg, sizeof xarg, "x=%s", x);
    char yarg[256];
    snprintf(yarg, sizeof yarg, "y=%s", x);
    run_result_t r = RUN("run", "add", "-i", xarg, "-i", yarg, "--priority", "5");
    ck_assert_exit(r, 0);
    char *id = stdout_id(&r);
    result_free(&r);

    r = RUN("wait", id, "--timeout", "60");
    ck_assert_exit(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, id));
    result_free(&r);

    r = RUN("status", id);
    ck_assert_exit(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "state:     succeeded"));
    ck_assert_ptr_nonnull(strstr(r.out, "priority:  5"));
    ck_assert_ptr_nonnull(strstr(r.out, "output:    out f32 [2, 3] (24 B)"));
    result_free(&r);

    r = RUN("status", id, "--json");
    ck_assert_exit(r, 0);
    json_t *job = json_loads(r.out, 0, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(job, "id")), id);
    ck_assert_int_eq(json_integer_value(json_object_get(job, "priority")), 5);
    json_decref(job);
    result_free(&r);

    /* ls: a header and aligned columns; --json lists the same job. */
    r = RUN("ls", "--op", "add", "--state", "succeeded");
    ck_assert_exit(r, 0);
    ck_assert_int_eq(strncmp(r.out, "ID", 2), 0);
    char *line = strstr(r.out, id);
    ck_assert_ptr_nonnull(line);
    const char *state_head = strstr(r.out, "STATE");
    ck_assert_int_eq(state_head - r.out, strstr(line, "succeeded") - line);
    result_free(&r);
    r = RUN("--json", "ls", "--all", "--state", "succeeded");
    ck_assert_exit(r, 0);
    json_t *list = json_loads(r.out, 0, NULL);
    ck_assert_ptr_nonnull(list);
    ck_assert(json_is_null(json_object_get(list, "next")));
    bool found = false;
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(list, "jobs"), i,
                       item) if (strcmp(json_string_value(json_object_get(item, "id")), id) == 0)
        found = true;
    ck_assert(found);
    json_decref(list);
    result_free(&r);

    /* Cancelling a finished job is a daemon error: exit 3 with its message. */
    r = RUN("cancel", id);
    ck_assert_exit(r, 3);
    ck_assert_ptr_nonnull(strstr(r.err, "409"));
    result_free(&r);
    free(id);
    free(x);
}
END_TEST

/* A job that holds the one CPU worker for a second. */
static char *submit_long_job(void)
{
    json_t *spec_json = e2e_long_job_new(1000);
    char *id = e2e_submit_ok(daemon_, spec_json);
    json_decref(spec_json);
    return id;
}

START_TEST(test_failed_cancelled_and_timed_out_jobs_exit_codes)
{
    /* The CPU executor takes two batches per worker thread (one running, one waiting in its
     * own queue, reported as running): three long jobs ahead keep the next ones queued. */
    char *blockers[3] = {submit_long_job(), submit_long_job(), submit_long_job()};
    char *x = write_f32_npy("x3.npy", 1, 4, x_value);
    char xarg[256], yarg[256];
    snprintf(xarg, sizeof xarg, "x=%s", x);
    snprintf(yarg, sizeof yarg, "y=%s", x);

    /* Queued behind the blocker: a 1 ms deadline passes, the job fails, run exits 1. */
    run_result_t r = RUN("run", "add", "-i", xarg, "-i", yarg, "--deadline", "1", "--wait");
    ck_assert_exit(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "deadline_exceeded"));
    result_free(&r);

    /* wait --timeout on a queued job: exit 5. Then cancel it: wait exits 1. */
    r = RUN("run", "add", "-i", xarg, "-i", yarg);
    ck_assert_exit(r, 0);
    char *id = stdout_id(&r);
    result_free(&r);
    double t0 = e2e_now();
    r = RUN("wait", id, "--timeout", "0.3");
    ck_assert_exit(r, 5);
    ck_assert(e2e_now() - t0 < 10);
    result_free(&r);
    r = RUN("cancel", id);
    ck_assert_exit(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "cancelled (dequeued)"));
    result_free(&r);
    r = RUN("wait", id);
    ck_assert_exit(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "cancelled"));
    result_free(&r);

    for (int i = 0; i < 3; i++) {
        json_decref(e2e_wait_final_ok(daemon_, blockers[i], 120));
        free(blockers[i]);
    }
    free(id);
    free(x);
}
END_TEST

/* run --time-limit: a 5 s sleep with a limit of 300 ms fails with time_limit well before its
 * end, and run exits 1 saying so. */
START_TEST(test_run_time_limit_fails_a_job_that_runs_past_it)
{
    char *x = write_f32_npy("tl.npy", 1, 4, x_value);
    char xarg[256];
    snprintf(xarg, sizeof xarg, "x=%s", x);
    double t0 = e2e_now();
    run_result_t r =
        RUN("run", "debug_sleep", "-p", "ms=5000", "-i", xarg, "--time-limit", "300", "--wait");
    ck_assert_exit(r, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "time_limit"));
    ck_assert_msg(e2e_now() - t0 < 4.5, "run took %.1f s", e2e_now() - t0);
    result_free(&r);
    r = RUN("run", "debug_sleep", "-p", "ms=0", "-i", xarg, "--time-limit", "0");
    ck_assert_exit(r, 2);
    result_free(&r);
    free(x);
}
END_TEST

START_TEST(test_buffers_put_use_and_remove)
{
    char *x = write_f32_npy("bx.npy", 3, 5, x_value), *y = write_f32_npy("by.npy", 3, 5, y_value);
    run_result_t r = RUN("buf", "put", x, "--resident");
    ck_assert_exit(r, 0);
    char *buf_id = stdout_id(&r);
    result_free(&r);

    r = RUN("buf", "get", buf_id, "--json");
    ck_assert_exit(r, 0);
    json_t *b = json_loads(r.out, 0, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(b, "dtype")), "f32");
    ck_assert_int_eq(json_integer_value(json_object_get(b, "bytes")), 60);
    ck_assert(json_is_true(json_object_get(b, "resident")));
    json_decref(b);
    result_free(&r);
    r = RUN("buf", "get", buf_id);
    ck_assert_exit(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "f32 [3, 5] (60 B)"));
    result_free(&r);

    char xarg[128], yarg[256], oarg[256];
    char *out = path_in_dir("bout.npy");
    snprintf(xarg, sizeof xarg, "x=buffer:%s", buf_id);
    snprintf(yarg, sizeof yarg, "y=%s", y);
    snprintf(oarg, sizeof oarg, "out=%s", out);
    r = RUN("run", "add", "-i", xarg, "-i", yarg, "-o", oarg);
    ck_assert_exit(r, 0);
    check_npy_f32(out, 3, 5, add_want);
    result_free(&r);

    /* A job's output kept as a buffer feeds the next job: (x + y) + y. */
    r = RUN("run", "add", "-i", xarg, "-i", yarg);
    ck_assert_exit(r, 0);
    char *job_id = stdout_id(&r);
    result_free(&r);
    r = RUN("wait", job_id, "--timeout", "60");
    ck_assert_exit(r, 0);
    result_free(&r);
    r = RUN("buf", "keep", job_id, "out");
    ck_assert_exit(r, 0);
    char *kept_id = stdout_id(&r);
    result_free(&r);
    char karg[128];
    snprintf(karg, sizeof karg, "x=buffer:%s", kept_id);
    r = RUN("run", "add", "-i", karg, "-i", yarg, "-o", oarg);
    ck_assert_exit(r, 0);
    check_npy_f32(out, 3, 5, add_twice_want);
    result_free(&r);
    r = RUN("buf", "keep", job_id, "nope");
    ck_assert_exit(r, 3);
    ck_assert_ptr_nonnull(strstr(r.err, "404"));
    result_free(&r);
    free(kept_id);
    free(job_id);

    r = RUN("buf", "rm", buf_id);
    ck_assert_exit(r, 0);
    result_free(&r);
    r = RUN("buf", "get", buf_id);
    ck_assert_exit(r, 3);
    ck_assert_ptr_nonnull(strstr(r.err, "404"));
    result_free(&r);
    r = RUN("buf", "put", "/nonexistent.npy");
    ck_assert_exit(r, 2);
    result_free(&r);
    free(buf_id);
    free(out);
    free(x);
    free(y);
}
END_TEST

START_TEST(test_info_and_usage_human_and_json)
{
    run_result_t r = RUN("info");
    ck_assert_exit(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "backend: cpu"));
    ck_assert_ptr_nonnull(strstr(r.out, "saxpy"));
    ck_assert_ptr_nonnull(strstr(r.out, "max_body_bytes"));
    result_free(&r);
    r = RUN("info", "--json");
    ck_assert_exit(r, 0);
    json_t *info = json_loads(r.out, 0, NULL);
    ck_assert(json_array_size(json_object_get(info, "ops")) > 0);
    json_decref(info);
    result_free(&r);
    /* Over loopback the user is the account that runs the CLI, as the kernel names it. */
    r = RUN("usage");
    ck_assert_exit(r, 0);
    char want[96];
    snprintf(want, sizeof want, "user:      %s\n", e2e_caller_name());
    ck_assert_msg(strstr(r.out, want), "%s", r.out);
    result_free(&r);
    r = RUN("usage", "--json");
    ck_assert_exit(r, 0);
    json_t *u = json_loads(r.out, 0, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(u, "owner")), e2e_caller_name());
    ck_assert(json_is_integer(json_object_get(json_object_get(u, "jobs"), "succeeded")));
    json_decref(u);
    result_free(&r);
}
END_TEST

START_TEST(test_usage_errors_exit_2_and_every_command_has_help)
{
    static const char *const commands[] = {"info",   "run", "status", "wait",  "ls",
                                           "cancel", "out", "buf",    "usage", "token"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        run_result_t r = RUN(commands[i], "--help");
        ck_assert_exit(r, 0);
        char want[64];
        snprintf(want, sizeof want, "usage: gpujob %s", commands[i]);
        ck_assert_msg(strstr(r.out, want), "%s --help: %s", commands[i], r.out);
        result_free(&r);
    }
    run_result_t r = RUN("--help");
    ck_assert_exit(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "Exit status"));
    result_free(&r);

    static const char *const bad[][6] = {
        {"frobnicate"},
        {"run"},
        {"run", "add", "-p", "novalue"},
        {"run", "add", "-i", "x=/nonexistent.npy"},
        {"run", "add", "-i", "justaname"},
        {"run", "add", "--priority", "500"},
        {"ls", "--state", "sleeping"},
        {"status"},
        {"out", "id", "name"},
        {"buf", "frob", "x"},
        {"buf", "keep", "j1"},
        {"buf", "keep", "j1", "out", "extra"},
        {"--url", "ftp://nope", "info"},
        {"token", "create"},
        {"token", "create", "laptop", "--expires", "soon"},
        {"token", "create", "laptop", "--expires", "0d"},
        {"token", "list", "--expires", "1d"},
        {"token", "frob", "x"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = run_cli_env(e2e_daemon_url(daemon_), bad[i]);
        ck_assert_msg(r.status == 2, "%s %s: exit %d, stderr %s", bad[i][0],
                      bad[i][1] ? bad[i][1] : "", r.status, r.err);
        ck_assert_str_ne(r.err, "");
        result_free(&r);
    }
}
END_TEST

START_TEST(test_daemon_errors_exit_3_and_unreachable_exit_4)
{
    run_result_t r = RUN("run", "no_such_op");
    ck_assert_exit(r, 3);
    ck_assert_ptr_nonnull(strstr(r.err, "no_such_op"));
    result_free(&r);
    r = RUN("status", "definitely-not-an-id");
    ck_assert_exit(r, 3);
    result_free(&r);

    r = run_cli_env("http://127.0.0.1:9", (const char *const[]){"info", NULL});
    ck_assert_exit(r, 4);
    ck_assert_ptr_nonnull(strstr(r.err, "127.0.0.1"));
    result_free(&r);
    /* --url wins over $GPUJOB_URL. */
    r = run_cli_env("http://127.0.0.1:9",
                    (const char *const[]){"--url", e2e_daemon_url(daemon_), "usage", NULL});
    ck_assert_exit(r, 0);
    result_free(&r);
    r = run_cli_env("http://127.0.0.1:9",
                    (const char *const[]){"usage", "--url", socket_url, NULL});
    ck_assert_exit(r, 0);
    result_free(&r);
}
END_TEST

/* token create over the Unix socket prints the token alone on stdout; with it in
 * $GPUJOB_TOKEN the CLI works over TCP as the token's owner, token list shows it without its
 * secret, and after token revoke the same command is refused (exit 3) without the token in
 * any message: a token sent and refused is never replaced by the loopback client's account. */
START_TEST(test_token_create_use_list_and_revoke)
{
    char config[512], sock[160], cmd[512];
    snprintf(sock, sizeof sock, "unix:%s/token.sock", dir);
    snprintf(config, sizeof config, "[server]\nunix_socket = %s\n[auth]\nmode = token,peercred\n",
             sock + 5);
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    e2e_wait_unix_socket_ok(sock + 5);
    const char *tcp = e2e_daemon_url(d);
    unsetenv("GPUJOB_TOKEN");
    run_result_t r = run_cli_env(tcp, (const char *const[]){"usage", NULL});
    ck_assert_exit(r, 0); /* without a token, the loopback client's own account */
    result_free(&r);

    r = run_cli_env(sock,
                    (const char *const[]){"token", "create", "laptop", "--expires", "2d", NULL});
    ck_assert_exit(r, 0);
    char token[160];
    ck_assert_int_eq(sscanf(r.out, "%159s", token), 1);
    ck_assert_msg(strncmp(token, "gj_", 3) == 0, "stdout: %s", r.out);
    ck_assert_ptr_nonnull(strstr(r.err, "shown this once"));
    result_free(&r);
    /* Made over TCP, even with a valid token: refused. */
    setenv("GPUJOB_TOKEN", token, 1);
    r = run_cli_env(tcp, (const char *const[]){"token", "create", "more", NULL});
    ck_assert_exit(r, 3);
    result_free(&r);

    r = run_cli_env(tcp, (const char *const[]){"usage", NULL});
    ck_assert_exit(r, 0);
    result_free(&r);
    r = run_cli_env(tcp, (const char *const[]){"token", "list", "--json", NULL});
    ck_assert_exit(r, 0);
    json_t *list = json_loads(r.out, 0, NULL);
    json_t *first = json_array_get(json_object_get(list, "tokens"), 0);
    ck_assert_uint_eq(json_array_size(json_object_get(list, "tokens")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(first, "name")), "laptop");
    ck_assert_ptr_nonnull(json_string_value(json_object_get(first, "expires_at")));
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(first, "id")));
    ck_assert_ptr_null(strstr(r.out, strrchr(token, '_') + 1));
    json_decref(list);
    result_free(&r);
    r = run_cli_env(sock, (const char *const[]){"token", "list", NULL});
    ck_assert_exit(r, 0);
    ck_assert_msg(strstr(r.out, "LAST USED") && strstr(r.out, id), "%s", r.out);
    result_free(&r);

    r = run_cli_env(sock, (const char *const[]){"token", "revoke", id, NULL});
    ck_assert_exit(r, 0);
    result_free(&r);
    r = run_cli_env(tcp, (const char *const[]){"usage", NULL});
    ck_assert_exit(r, 3);
    ck_assert_ptr_nonnull(strstr(r.err, "401"));
    ck_assert_ptr_null(strstr(r.err, strrchr(token, '_') + 1));
    result_free(&r);
    r = run_cli_env(sock, (const char *const[]){"token", "revoke", id, NULL});
    ck_assert_exit(r, 3);
    result_free(&r);
    unsetenv("GPUJOB_TOKEN");
    snprintf(cmd, sizeof cmd, "grep -r -a -l -F '%s' '%s'", strrchr(token, '_') + 1,
             e2e_daemon_dir(d));
    ck_assert_int_ne(system(cmd), 0);
    e2e_daemon_free(d);
    unlink(sock + 5);
}
END_TEST

int main(void)
{
    if (!getenv("GPUJOB_CLI")) {
        fprintf(stderr, "GPUJOB_CLI is not set\n");
        return 77;
    }
    /* The client's suite times its jobs on the CPU backend (a long job there is one that keeps
     * the one worker busy): it runs there whatever $GPUJOB_E2E_BACKEND says. */
    unsetenv("GPUJOB_E2E_BACKEND");
    snprintf(dir, sizeof dir, "/tmp/gjc-cli-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    snprintf(socket_url, sizeof socket_url, "unix:%s/gpujobd.sock", dir);
    char config[512];
    snprintf(config, sizeof config,
             "[server]\nunix_socket = %s/gpujobd.sock\n[scheduler]\ncpu_threads = 1\n", dir);
    if (e2e_daemon_start(config, &daemon_) < 0) return 1;

    Suite *s = suite_create("client_cli");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_run_writes_outputs_byte_for_byte);
    tcase_add_test(tc, test_submit_then_status_wait_ls_and_cancel);
    tcase_add_test(tc, test_json_prints_numbers_as_the_daemon_sent_them);
    tcase_add_test(tc, test_failed_cancelled_and_timed_out_jobs_exit_codes);
    tcase_add_test(tc, test_run_time_limit_fails_a_job_that_runs_past_it);
    tcase_add_test(tc, test_buffers_put_use_and_remove);
    tcase_add_test(tc, test_info_and_usage_human_and_json);
    tcase_add_test(tc, test_usage_errors_exit_2_and_every_command_has_help);
    tcase_add_test(tc, test_daemon_errors_exit_3_and_unreachable_exit_4);
    tcase_add_test(tc, test_token_create_use_list_and_revoke);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);

    int status = 0;
    e2e_daemon_stop(daemon_, 30000, &status);
    e2e_daemon_free(daemon_);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return failed ? 1 : 0;
}
