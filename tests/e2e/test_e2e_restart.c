/* End-to-end: durability across restarts of the real gpujobd. A SIGTERM leaves queued jobs for
 * the next start; a kill -9 loses nothing that was answered 201, and re-runs what was running;
 * a restart in place (SIGUSR1, as after a lost GPU context) keeps the process, its port and
 * its jobs, and answers a connection made meanwhile; a job that crashes the daemon is failed at
 * the next start instead of crashing it again; a kill -9 in the middle of uploads and of jobs'
 * output writes leaves no blob file that no row names. And the service's life as systemd sees
 * it: READY=1, the watchdog, STOPPING=1. */
/* POSIX and XSI (nftw). */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/kill9_stream.h"

/* The kill -9 test needs its long job to outlast the stream of competing submissions before
 * the kill (a second, and 20 acknowledged), with room to spare. */
#define KILL_JOB_MS 3000

/* Asserts that job succeeded with the output of the add job for k (e2e_add_job_new). */
static void assert_add_result(const json_t *job, int k)
{
    char why[128];
    ck_assert_msg(e2e_add_result_ok(job, k, why, sizeof why), "job %s: %s",
                  json_string_value(json_object_get(job, "id")), why);
}

START_TEST(test_sigterm_keeps_queued_jobs_for_next_start)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);
    enum { QUEUED = 5 };
    char *ids[QUEUED];
    for (int i = 0; i < QUEUED; i++) {
        json_t *job = e2e_add_job_new(100 * i);
        ids[i] = e2e_submit_ok(d, job);
        json_decref(job);
        json_t *now = e2e_get_job_ok(d, ids[i]);
        ck_assert_str_eq(e2e_job_state(now), "queued");
        json_decref(now);
    }

    int status = 0;
    ck_assert_msg(e2e_daemon_stop(d, 60000, &status) == 0, "no exit within 60 s of SIGTERM");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "SIGTERM: exit status 0x%x, expected a clean exit 0", status);

    ck_assert(e2e_daemon_restart(d) == 0);
    for (int i = 0; i < QUEUED; i++) {
        json_t *done = e2e_wait_final_ok(d, ids[i], 60);
        assert_add_result(done, 100 * i);
        json_decref(done);
        free(ids[i]);
    }
    /* The running job was either drained to completion or re-run after the restart. */
    json_t *long_done = e2e_wait_final_ok(d, long_id, 60);
    ck_assert_str_eq(e2e_job_state(long_done), "succeeded");
    json_decref(long_done);
    free(long_id);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

/* Asserts that a job acknowledged before a kill -9 counts at least one attempt. */
static void assert_attempted(const json_t *job, void *arg)
{
    (void)arg;
    ck_assert_msg(json_integer_value(json_object_get(job, "attempts")) >= 1,
                  "job %s: attempts %lld", json_string_value(json_object_get(job, "id")),
                  (long long)json_integer_value(json_object_get(job, "attempts")));
}

START_TEST(test_kill9_under_submissions_loses_no_acknowledged_job)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[scheduler]\ncpu_threads = 2\n");
    json_t *long_job = e2e_long_job_new(KILL_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);

    e2e_kill9_stream_t st;
    e2e_kill9_stream_start_ok(&st, d, "/v1/jobs", 60, 200000);
    e2e_kill9_stream_wait_ok(&st, 1.0, 20);
    json_t *before = e2e_get_job_ok(d, long_id);
    ck_assert_msg(strcmp(e2e_job_state(before), "running") == 0,
                  "the long job should still run at the kill, it is %s (make it longer)",
                  e2e_job_state(before));
    json_decref(before);
    e2e_kill9_stream_kill_ok(&st);
    ck_assert_msg(st.refused > 0, "no submission was refused: was the daemon killed?");

    ck_assert(e2e_daemon_restart(d) == 0);
    e2e_kill9_stream_verify_ok(&st, assert_attempted, NULL);
    json_t *long_done = e2e_wait_final_ok(d, long_id, 90);
    ck_assert_str_eq(e2e_job_state(long_done), "succeeded");
    ck_assert_msg(json_integer_value(json_object_get(long_done, "attempts")) >= 2,
                  "the job running at the kill has attempts %lld, expected >= 2",
                  (long long)json_integer_value(json_object_get(long_done, "attempts")));
    json_decref(long_done);
    e2e_kill9_stream_clear(&st);
    free(long_id);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

/* The blob files under d's state directory, each as its path relative to blobs/ ("ab/NAME"),
 * which is how rows name them. */
static char (*orphan_walk_files)[128];
static int orphan_walk_n, orphan_walk_cap;
static size_t orphan_walk_prefix;

static int orphan_walk_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    if (flag != FTW_F) return 0;
    if (orphan_walk_n < orphan_walk_cap)
        snprintf(orphan_walk_files[orphan_walk_n], sizeof orphan_walk_files[0], "%s",
                 path + orphan_walk_prefix);
    orphan_walk_n++;
    return 0;
}

static int blob_files(e2e_daemon_t *d, char (*files)[128], int cap)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/state/blobs", e2e_daemon_dir(d));
    orphan_walk_files = files;
    orphan_walk_cap = cap;
    orphan_walk_n = 0;
    orphan_walk_prefix = strlen(dir) + 1;
    nftw(dir, orphan_walk_one, 16, FTW_PHYS);
    return orphan_walk_n;
}

/* How many rows of the stopped daemon's databases (every shard) name file: job tensors
 * through blob_refs, and buffers. */
static long rows_naming(e2e_daemon_t *d, const char *file)
{
    long n = 0;
    for (int k = 0; k < 16; k++) {
        char path[PATH_MAX];
        if (k == 0)
            snprintf(path, sizeof path, "%s/state/gpujobd.db", e2e_daemon_dir(d));
        else
            snprintf(path, sizeof path, "%s/state/gpujobd-%d.db", e2e_daemon_dir(d), k);
        if (access(path, F_OK) != 0) continue;
        sqlite3 *db = NULL;
        ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
        sqlite3_stmt *stmt = NULL;
        ck_assert_int_eq(sqlite3_prepare_v2(db,
                                            "SELECT coalesce((SELECT refs FROM blob_refs WHERE "
                                            "file = ?1), 0) + (SELECT count(*) FROM buffers WHERE "
                                            "file = ?1)",
                                            -1, &stmt, NULL),
                         SQLITE_OK);
        sqlite3_bind_text(stmt, 1, file, -1, SQLITE_STATIC);
        ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
        n += sqlite3_column_int64(stmt, 0);
        sqlite3_finalize(stmt);
        sqlite3_close(db);
    }
    return n;
}

#define ORPHAN_BUFFERS 10
#define ORPHAN_FLOATS (256 * 1024)
#define ORPHAN_JOBS 24
#define ORPHAN_UPLOADS 3

START_TEST(test_kill9_mid_upload_and_output_write_leaves_no_orphan_files)
{
    /* Every buffer and every output a file of its own; one worker, so that jobs queue up
     * behind the one whose outputs are being written. */
    e2e_daemon_t *d = e2e_daemon_start_ok("[store]\ninline_blob_bytes = 1024\n"
                                          "[scheduler]\ncpu_threads = 1\n");
    static float x[ORPHAN_BUFFERS][ORPHAN_FLOATS];
    char buffer_ids[ORPHAN_BUFFERS][64], shape[32];
    snprintf(shape, sizeof shape, "%d", ORPHAN_FLOATS);
    uint32_t seed = 7;
    for (int b = 0; b < ORPHAN_BUFFERS; b++) {
        for (int i = 0; i < ORPHAN_FLOATS; i++)
            x[b][i] = (float)e2e_rand_uniform(&seed, -100, 100);
        json_t *meta = e2e_upload_ok(d, "f32", shape, x[b], sizeof x[b], false, 201);
        snprintf(buffer_ids[b], sizeof buffer_ids[b], "%s",
                 json_string_value(json_object_get(meta, "id")));
        json_decref(meta);
    }
    /* Jobs whose 1 MiB outputs go to files: x + x of each buffer in turn. */
    char *job_ids[ORPHAN_JOBS];
    for (int j = 0; j < ORPHAN_JOBS; j++) {
        const char *id = buffer_ids[j % ORPHAN_BUFFERS];
        json_t *job = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}}", "op", "add", "inputs", "x", "buffer",
                                id, "y", "buffer", id);
        job_ids[j] = e2e_submit_ok(d, job);
        json_decref(job);
    }
    /* Uploads cut short: their headers and a quarter of their bodies sent, which the daemon
     * streams into files of their own. */
    static char chunk[ORPHAN_FLOATS];
    char path[128];
    snprintf(path, sizeof path, "/v1/buffers?dtype=f32&shape=%d", ORPHAN_FLOATS);
    int uploads[ORPHAN_UPLOADS];
    for (int u = 0; u < ORPHAN_UPLOADS; u++) {
        uploads[u] = e2e_raw_post_start_ok(d, path, "application/octet-stream", sizeof x[0]);
        e2e_write_all_ok(uploads[u], chunk, sizeof chunk);
    }
    /* The kill comes once the uploads' files exist and some job has written its output. */
    static char files[4096][128];
    double until = e2e_now() + 30;
    while (e2e_now() < until && (blob_files(d, files, 4096) < ORPHAN_BUFFERS + ORPHAN_UPLOADS + 1 ||
                                 e2e_count_jobs_ok(d, "state=succeeded") < 1))
        usleep(10 * 1000);
    ck_assert_int_ge(e2e_count_jobs_ok(d, "state=succeeded"), 1);
    ck_assert_msg(e2e_count_jobs_ok(d, "state=succeeded") < ORPHAN_JOBS,
                  "every job ended before the kill: make them more");
    e2e_daemon_kill(d);
    for (int u = 0; u < ORPHAN_UPLOADS; u++)
        close(uploads[u]);

    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    /* The buffers are whole, and every job ends with x + x. */
    static float out[ORPHAN_FLOATS];
    for (int j = 0; j < ORPHAN_JOBS; j++) {
        json_t *done = e2e_wait_final_ok(d, job_ids[j], 120);
        ck_assert_str_eq(e2e_job_state(done), "succeeded");
        json_decref(done);
        e2e_output_raw_ok(d, job_ids[j], "out", out, sizeof out);
        const float *in = x[j % ORPHAN_BUFFERS];
        for (int i = 0; i < ORPHAN_FLOATS; i++)
            ck_assert_msg(out[i] == in[i] + in[i], "job %d: out[%d] = %g, expected %g", j, i,
                          out[i], in[i] + in[i]);
        free(job_ids[j]);
    }
    for (int b = 0; b < ORPHAN_BUFFERS; b++) {
        snprintf(path, sizeof path, "/v1/buffers/%.63s", buffer_ids[b]);
        json_decref(e2e_json_ok(d, "GET", path, NULL, 200));
    }
    int status;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);
    /* Every file left is named by a row: the buffers' own, and the jobs' outputs. */
    int n = blob_files(d, files, 4096);
    ck_assert_int_le(n, 4096);
    ck_assert_int_ge(n, ORPHAN_BUFFERS + ORPHAN_JOBS);
    for (int i = 0; i < n; i++)
        ck_assert_msg(rows_naming(d, files[i]) > 0, "blob file '%s' (of %d) is named by no row",
                      files[i], n);
    e2e_daemon_free(d);
}
END_TEST

/* A debug_fault job that crashes the daemon with a SIGSEGV in the worker that runs it. */
static json_t *crash_job_new(void)
{
    return json_pack("{s:s, s:{s:b}, s:{s:{s:s, s:[i], s:[i]}}}", "op", "debug_fault", "params",
                     "crash", 1, "inputs", "x", "dtype", "f32", "shape", 1, "data", 1);
}

/* Waits up to timeout_s for the daemon's process to end; true when it did. */
static bool wait_daemon_gone(e2e_daemon_t *d, double timeout_s)
{
    double until = e2e_now() + timeout_s;
    while (e2e_daemon_alive(d) && e2e_now() < until)
        usleep(20 * 1000);
    return !e2e_daemon_alive(d);
}

START_TEST(test_a_job_that_crashes_a_worker_fails_and_crashes_no_second_start)
{
#ifdef GPUJOB_SANITIZE
    fprintf(stderr, "skipped: under ASan+UBSan the sanitizers, not a fatal signal, end the "
                    "process that crashes, so there is nothing for the crash guard to see\n");
    return;
#endif
    e2e_daemon_t *d = e2e_daemon_start_ok("[scheduler]\ncpu_threads = 2\n");
    /* One worker runs a long job through the crash; the other runs a short one, then the
     * crashing job, while an add job waits behind it. */
    json_t *long_job = e2e_long_job_new(KILL_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);
    json_t *short_job = e2e_long_job_new(500);
    char *short_id = e2e_submit_ok(d, short_job);
    e2e_wait_state_ok(d, short_id, "running", 10);
    json_t *crash = crash_job_new();
    char *crash_id = e2e_submit_ok(d, crash);
    json_t *add = e2e_add_job_new(7);
    char *add_id = e2e_submit_ok(d, add);
    ck_assert_msg(wait_daemon_gone(d, 20), "the crashing job did not crash the daemon");

    /* The next start fails the job that crashed it instead of running it again; the long job,
     * running beside it, runs again, and the queued one runs. */
    ck_assert(e2e_daemon_restart(d) == 0);
    json_t *failed = e2e_wait_final_ok(d, crash_id, 30);
    ck_assert_str_eq(e2e_job_state(failed), "failed");
    json_t *error = json_object_get(failed, "error");
    ck_assert_str_eq(json_string_value(json_object_get(error, "code")), "worker_crashed");
    ck_assert_ptr_nonnull(
        strstr(json_string_value(json_object_get(error, "message")), "took the daemon down"));
    json_t *long_done = e2e_wait_final_ok(d, long_id, 60);
    ck_assert_str_eq(e2e_job_state(long_done), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(long_done, "attempts")), 2);
    json_t *add_done = e2e_wait_final_ok(d, add_id, 30);
    assert_add_result(add_done, 7);
    ck_assert(e2e_daemon_alive(d));
    json_t *after = e2e_add_job_new(8);
    char *after_id = e2e_submit_ok(d, after);
    json_t *after_done = e2e_wait_final_ok(d, after_id, 30);
    assert_add_result(after_done, 8);
    ck_assert(e2e_daemon_alive(d));

    json_decref(after_done);
    json_decref(after);
    free(after_id);
    json_decref(add_done);
    json_decref(long_done);
    json_decref(failed);
    json_decref(add);
    free(add_id);
    json_decref(crash);
    free(crash_id);
    json_decref(short_job);
    free(short_id);
    json_decref(long_job);
    free(long_id);
    e2e_daemon_free(d);
}
END_TEST

/* Reads the next notification from fd into buf within timeout_ms; false when none came. */
static bool next_notification(int fd, char *buf, size_t size, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1) return false;
    ssize_t n = recv(fd, buf, size - 1, 0);
    if (n < 0) return false;
    buf[n] = '\0';
    return true;
}

/* A new TCP connection to the daemon's port with a request on it: connected, not yet
 * answered. */
static int send_raw_request(e2e_daemon_t *d, const char *request)
{
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)e2e_daemon_port(d)),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_msg(connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0, "connect: %s",
                  strerror(errno));
    ck_assert_int_eq(send(fd, request, strlen(request), MSG_NOSIGNAL), (ssize_t)strlen(request));
    return fd;
}

START_TEST(test_a_restart_in_place_keeps_the_pid_the_port_and_the_jobs)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    pid_t pid = e2e_daemon_pid(d);
    json_t *long_job = e2e_long_job_new(1000);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);
    enum { QUEUED = 3 };
    char *ids[QUEUED];
    for (int i = 0; i < QUEUED; i++) {
        json_t *job = e2e_add_job_new(10 * i);
        ids[i] = e2e_submit_ok(d, job);
        json_decref(job);
    }

    /* The restart drains the running job first. A connection made meanwhile waits in the
     * listening socket's backlog and is answered by the next process. */
    ck_assert_int_eq(kill(pid, SIGUSR1), 0);
    usleep(200 * 1000);
    int fd = send_raw_request(d, "GET /healthz HTTP/1.0\r\n\r\n");
    char answer[512] = "";
    size_t got = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (got < sizeof answer - 1 && poll(&p, 1, 30000) == 1) {
        ssize_t n = recv(fd, answer + got, sizeof answer - 1 - got, 0);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    ck_assert_msg(strncmp(answer, "HTTP/1.1 200", 12) == 0 ||
                      strncmp(answer, "HTTP/1.0 200", 12) == 0,
                  "the connection made during the restart got: '%.200s'", answer);

    /* The same process serves again, started a second time; the running job was drained, the
     * queued ones run. */
    ck_assert_int_eq(e2e_daemon_pid(d), pid);
    ck_assert(e2e_daemon_alive(d));
    double until = e2e_now() + 10;
    while (e2e_daemon_log_count(d, " ready") < 2 && e2e_now() < until)
        usleep(20 * 1000);
    ck_assert_int_eq(e2e_daemon_log_count(d, " ready"), 2);
    json_t *done = e2e_wait_final_ok(d, long_id, 30);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(done, "attempts")), 1);
    json_decref(done);
    for (int i = 0; i < QUEUED; i++) {
        done = e2e_wait_final_ok(d, ids[i], 30);
        assert_add_result(done, 10 * i);
        json_decref(done);
        free(ids[i]);
    }
    json_t *job = e2e_add_job_new(1000);
    char *after = e2e_submit_ok(d, job);
    done = e2e_wait_final_ok(d, after, 30);
    assert_add_result(done, 1000);
    json_decref(done);
    json_decref(job);
    free(after);
    free(long_id);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

/* Asserts that a second gpujobd on d's state directory is refused: a non-zero exit, and an
 * error naming the directory and the first one's pid. */
static void assert_second_daemon_refused(e2e_daemon_t *d)
{
    char log_path[PATH_MAX], holder[64], state_dir[PATH_MAX];
    int status = e2e_daemon_run_to_exit_ok(d, NULL, "second.log", 10, log_path, sizeof log_path);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0,
                  "the second gpujobd ended with status 0x%x, expected a non-zero exit", status);
    snprintf(holder, sizeof holder, "(pid %d,", (int)e2e_daemon_pid(d));
    snprintf(state_dir, sizeof state_dir, "'%s/state' is in use by another gpujobd",
             e2e_daemon_dir(d));
    ck_assert_msg(e2e_file_has_line(log_path, state_dir, NULL) &&
                      e2e_file_has_line(log_path, holder, NULL),
                  "the second gpujobd's log (%s) does not name the directory and pid %d", log_path,
                  (int)e2e_daemon_pid(d));
}

START_TEST(test_a_second_daemon_on_the_same_state_dir_is_refused)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG);
    json_t *long_job = e2e_long_job_new(E2E_LONG_JOB_MS);
    char *long_id = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, long_id, "running", 10);
    json_t *job = e2e_add_job_new(7);
    char *queued_id = e2e_submit_ok(d, job);

    assert_second_daemon_refused(d);

    /* The first one serves on, its jobs as they were: the running one was not re-queued. */
    json_t *done = e2e_wait_final_ok(d, long_id, 30);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(done, "attempts")), 1);
    json_decref(done);
    done = e2e_wait_final_ok(d, queued_id, 30);
    assert_add_result(done, 7);
    json_decref(done);

    /* A restart in place keeps the lock: a second daemon is refused after it too. */
    pid_t pid = e2e_daemon_pid(d);
    ck_assert_int_eq(kill(pid, SIGUSR1), 0);
    double until = e2e_now() + 30;
    while (e2e_daemon_log_count(d, " ready") < 2 && e2e_now() < until)
        usleep(20 * 1000);
    ck_assert_int_eq(e2e_daemon_log_count(d, " ready"), 2);
    assert_second_daemon_refused(d);
    char *after = e2e_submit_ok(d, job);
    done = e2e_wait_final_ok(d, after, 30);
    assert_add_result(done, 7);
    json_decref(done);
    ck_assert_int_eq(e2e_daemon_pid(d), pid);
    free(after);
    free(queued_id);
    free(long_id);
    json_decref(job);
    json_decref(long_job);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_systemd_hears_ready_the_watchdog_and_stopping)
{
    /* systemd's end of Type=notify and WatchdogSec=: a datagram socket, named to the daemon by
     * the environment it inherits. */
    char dir[] = "/tmp/gj-notify-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s/notify", dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    setenv("NOTIFY_SOCKET", addr.sun_path, 1);
    setenv("WATCHDOG_USEC", "200000", 1);
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");

    /* READY=1 once it serves, then WATCHDOG=1 from the scheduler's loop every 100 ms. */
    char msg[256];
    bool ready = false;
    int pings = 0;
    double until = e2e_now() + 5;
    while (e2e_now() < until && !(ready && pings >= 5))
        if (next_notification(fd, msg, sizeof msg, 1000)) {
            ready |= strstr(msg, "READY=1") != NULL;
            pings += strcmp(msg, "WATCHDOG=1") == 0;
        }
    ck_assert_msg(ready, "no READY=1");
    ck_assert_int_ge(pings, 5);

    /* SIGTERM: STOPPING=1 before the drain. */
    int status = 0;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);
    bool stopping = false;
    while (!stopping && next_notification(fd, msg, sizeof msg, 1000))
        stopping = strstr(msg, "STOPPING=1") != NULL;
    ck_assert_msg(stopping, "no STOPPING=1");

    close(fd);
    unlink(addr.sun_path);
    rmdir(dir);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_restart");
    TCase *tc = tcase_create("restart");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_sigterm_keeps_queued_jobs_for_next_start);
    tcase_add_test(tc, test_kill9_under_submissions_loses_no_acknowledged_job);
    tcase_add_test(tc, test_kill9_mid_upload_and_output_write_leaves_no_orphan_files);
    tcase_add_test(tc, test_a_restart_in_place_keeps_the_pid_the_port_and_the_jobs);
    tcase_add_test(tc, test_a_second_daemon_on_the_same_state_dir_is_refused);
    tcase_add_test(tc, test_a_job_that_crashes_a_worker_fails_and_crashes_no_second_start);
    tcase_add_test(tc, test_systemd_hears_ready_the_watchdog_and_stopping);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
