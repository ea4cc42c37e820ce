/* End-to-end test support: runs the real gpujobd binary (getenv("GPUJOBD_BIN")) on a free
 * port with a fresh state directory, and speaks real HTTP to it with libcurl.
 *
 * Each daemon lives in its own mkdtemp directory (config file, state dir, the daemon's log).
 * The daemon's stderr is a pipe drained on a thread into that log, so the daemon never blocks
 * on it; the "listening on http://HOST:PORT" line (https:// when it serves TLS) gives the port. The
 * daemon gets PR_SET_PDEATHSIG, so a test that dies (a failed assertion in Check's forked child)
 * takes its daemon with it and leaves the directory behind for inspection; e2e_daemon_free() after
 * a passing test removes it.
 *
 * Functions named e2e_*_ok() assert with Check and return only on success; the others return 0
 * or a negative errno. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct e2e_daemon e2e_daemon_t;

/* Writes config_ini (INI text, may be "") to a new temp dir and starts gpujobd with
 * `--config FILE --listen 127.0.0.1:0 --state-dir DIR/state --backend cpu --set
 * debug.test_ops=true` (the backend is $GPUJOB_E2E_BACKEND when set; the test-only ops give
 * e2e_long_job_new its job). Waits up to 30 s for the listening line. On failure the daemon's
 * log is copied to stderr. */
int e2e_daemon_start(const char *config_ini, e2e_daemon_t **ret);
/* Starts the binary again on the same directory (after a stop or a kill). */
int e2e_daemon_restart(e2e_daemon_t *d);
/* SIGTERM, then waits up to timeout_ms for the exit; *ret_wait_status is waitpid's status.
 * -ETIMEDOUT (the daemon is then killed with SIGKILL) when it does not exit in time. */
int e2e_daemon_stop(e2e_daemon_t *d, int timeout_ms, int *ret_wait_status);
/* SIGKILL and reap. */
void e2e_daemon_kill(e2e_daemon_t *d);
/* True while the process runs (not exited, not reaped). */
bool e2e_daemon_alive(e2e_daemon_t *d);
pid_t e2e_daemon_pid(const e2e_daemon_t *d);
/* "http://127.0.0.1:PORT" of the current run ("https://" when the daemon serves TLS: the
 * harness's own requests then fail, as it trusts no test CA); a borrowed string. */
const char *e2e_daemon_url(const e2e_daemon_t *d);
int e2e_daemon_port(const e2e_daemon_t *d);
/* The temp directory; a borrowed string. */
const char *e2e_daemon_dir(const e2e_daemon_t *d);
/* Kills the daemon if it still runs, removes the temp dir, frees. Accepts NULL. */
void e2e_daemon_free(e2e_daemon_t *d);

/* One HTTP exchange. body and headers are NUL-terminated for convenience; json is the parsed
 * body when it parses as JSON, else NULL. */
typedef struct e2e_response {
    long status;
    char *headers; /* the raw header block of the final response */
    char *body;
    size_t body_len;
    json_t *json;
} e2e_response_t;

/* Sends method path (e.g. "/v1/jobs?limit=10") with extra headers (a NULL-terminated list of
 * "Name: value", or NULL) and body (len bytes; NULL for none). Waits at most 60 s. Each thread
 * keeps one keep-alive connection. 0, or -EIO with the curl error on stderr. */
int e2e_http_request(e2e_daemon_t *d, const char *method, const char *path,
                     const char *const *headers, const void *body, size_t len, e2e_response_t *ret);
/* Frees what a response holds and zeroes it. */
void e2e_response_clear(e2e_response_t *r);
/* Copies the value of header name (case-insensitive) into buf; NULL when absent. */
const char *e2e_response_header(const e2e_response_t *r, const char *name, char *buf, size_t size);
/* Frees this thread's curl handle; threads other than the main one call it before exiting. */
void e2e_http_thread_done(void);

/* Sends JSON text (NULL for no body) with Content-Type: application/json, asserts the status
 * and returns the parsed body (a new reference; json null when the body is not JSON). */
json_t *e2e_json_ok(e2e_daemon_t *d, const char *method, const char *path, const char *json_text,
                    long expect_status);
/* Like e2e_json_ok for a request without a body, but across a restart of the daemon (after a
 * lost GPU context: daemon/util/restart.h): no response, or 503 while it drains, is tried again
 * every 20 ms until the e2e_now() time `until`; then the status is asserted. */
json_t *e2e_json_until(e2e_daemon_t *d, const char *method, const char *path, long expect_status,
                       double until);
/* Uploads len raw bytes as a buffer (POST /v1/buffers?dtype=&shape=, with &resident=true when
 * resident), asserts the status and returns the parsed body (a new reference). */
json_t *e2e_upload_ok(e2e_daemon_t *d, const char *dtype, const char *shape_query,
                      const void *bytes, size_t len, bool resident, long expect_status);
/* Downloads a job's output as raw bytes (GET /v1/jobs/{id}/outputs/{name}) into out; fails the
 * test unless the answer is 200 with exactly nbytes bytes. */
void e2e_output_raw_ok(e2e_daemon_t *d, const char *job_id, const char *name, void *out,
                       size_t nbytes);
/* Submits one job (a borrowed JSON object), asserts 201 and returns its id (malloc'd). */
char *e2e_submit_ok(e2e_daemon_t *d, const json_t *job);
/* GET /v1/jobs/{id}: asserts 200 and returns the job's JSON (a new reference). */
json_t *e2e_get_job_ok(e2e_daemon_t *d, const char *id);
/* Waits through GET /v1/jobs/{id}/wait until the job is final, across daemon restarts; fails
 * the test after timeout_s. Returns the job's JSON (a new reference). */
json_t *e2e_wait_final_ok(e2e_daemon_t *d, const char *id, double timeout_s);
/* Polls GET /v1/jobs/{id} until its state is state, across daemon restarts; fails the test
 * after timeout_s. */
void e2e_wait_state_ok(e2e_daemon_t *d, const char *id, const char *state, double timeout_s);
/* Counts the jobs GET /v1/jobs lists with query (e.g. "state=queued", or ""), following the
 * `next` cursors. */
long e2e_count_jobs_ok(e2e_daemon_t *d, const char *query);
/* The value of one sample (e.g. `gpujobd_http_requests_total{code="201"}`) in GET /metrics; 0
 * when the sample is absent. */
double e2e_metric_ok(e2e_daemon_t *d, const char *sample);

/* A configuration with one CPU worker and one running job per user: jobs submitted behind a
 * long job (e2e_long_job_new) stay queued. */
#define E2E_ONE_WORKER_CONFIG "[limits]\nmax_running_per_user = 1\n[scheduler]\ncpu_threads = 1\n"
/* How long a long job runs, in milliseconds, unless a test needs another length. */
#define E2E_LONG_JOB_MS 1500

/* Runs gpujobd once more on d's state directory while d is stopped, and waits for it to end
 * by itself: `--listen 127.0.0.1:0 --state-dir DIR/state --backend cpu` and the extra
 * arguments (a NULL-terminated list, or NULL), its stdout and stderr in DIR/log_name, whose
 * path goes to log_path (size bytes). For a daemon that must refuse to run. Returns waitpid's
 * status; fails the test (killing it) when it still runs after timeout_s. */
int e2e_daemon_run_to_exit_ok(e2e_daemon_t *d, const char *const *extra, const char *log_name,
                              double timeout_s, char *log_path, size_t size);
/* How many lines of the daemon's log (DIR/gpujobd.log, every run of it) contain text. */
int e2e_daemon_log_count(e2e_daemon_t *d, const char *text);
/* Whether a line of the file at path contains text, and also `also` when not NULL. */
bool e2e_file_has_line(const char *path, const char *text, const char *also);

/* e2e_daemon_start() that fails the test (with the reason) when the daemon does not start. */
e2e_daemon_t *e2e_daemon_start_ok(const char *config_ini);
/* Waits until the Unix socket at path (a path, no "unix:") accepts connections: the daemon
 * reports its TCP listener, which e2e_daemon_start waits for, before it binds the socket.
 * Fails the test after 10 s. */
void e2e_wait_unix_socket_ok(const char *path);

/* Length of a token's text ("gj_" and 77 characters) and a buffer that holds it. */
#define E2E_TOKEN_SIZE 128
/* Makes a token of user with `gpujobd token create --user USER --name test [--expires EXPIRES]
 * --state-dir DIR/state` (EXPIRES NULL: never) and copies its text into ret
 * (E2E_TOKEN_SIZE); fails the test unless the command prints a well-formed token. */
void e2e_token_create_ok(e2e_daemon_t *d, const char *user, const char *expires, char *ret);
/* Runs `gpujobd token ARGS --state-dir DIR/state`, asserts it exits 0 and returns the first
 * line of its output (a static buffer, overwritten by the next call). */
const char *e2e_token_cli_ok(e2e_daemon_t *d, const char *args);

/* A job that runs for ms milliseconds (at least, and not much more) on any backend and then
 * succeeds: the test-only op debug_sleep on a small f32 x [4] = {1, 2, 3, 4}, whose output out
 * equals x. It holds a CPU worker (or, on CUDA, a stream) for that long. A new reference. */
json_t *e2e_long_job_new(int ms);

/* The login name of the account running the test ("uid:N" when the host has none): who the
 * daemon's default auth mode sees in the test's requests over loopback TCP and on its Unix
 * socket. A static string. */
const char *e2e_caller_name(void);

/* The string of job["state"], or "" when absent; a borrowed string. */
const char *e2e_job_state(const json_t *job);
/* The error object's code and field of an error response, or of a failed job ("" when
 * absent); borrowed. */
const char *e2e_error_code(const json_t *body);
const char *e2e_error_field(const json_t *body);
/* A timestamp field of a job ("2026-01-02T03:04:05.678901Z", as the API writes it) in
 * seconds since the epoch, or -1 when absent or not in that form. */
double e2e_job_time(const json_t *job, const char *key);
/* e2e_job_time() that fails the test when the field is absent or not a time. */
double e2e_job_time_ok(const json_t *job, const char *key);
/* Flattens a nested or flat JSON array of numbers into out (at most cap values); returns the
 * number of leaves, or -1 when a leaf is not a number. */
long e2e_json_flatten(const json_t *data, double *out, long cap);
/* Standard base64 of len bytes (malloc'd, NUL-terminated). */
char *e2e_base64(const void *data, size_t len);
/* A .npy v1.0 file of the given descr ("<f4"), shape and data; malloc'd, size in *ret_len. */
void *e2e_npy_build(const char *descr, const int64_t *shape, int ndim, const void *data,
                    size_t data_len, size_t *ret_len);
/* Parses a .npy file: descr (e.g. "<f4") copied into descr, shape into shape (up to 8), and the
 * data's offset in the file. 0 or -EINVAL when the file is not a valid little-endian C-order
 * .npy whose data length matches its header. */
int e2e_npy_parse(const void *file, size_t len, char descr[16], int64_t shape[8], int *ret_ndim,
                  size_t *ret_data_offset);
/* Deterministic pseudo-random numbers for test data (xorshift); seed is updated. */
uint32_t e2e_rand(uint32_t *seed);
double e2e_rand_uniform(uint32_t *seed, double lo, double hi);
/* Monotonic time in seconds. */
double e2e_now(void);
/* A field of the daemon's /proc/PID/status in KiB ("VmHWM": its peak RSS, "VmRSS"). */
long e2e_daemon_status_kib(e2e_daemon_t *d, const char *field);
/* A TCP connection to the daemon's port for a request written by hand, with a receive
 * timeout of 30 s; the caller closes it. */
int e2e_raw_connect_ok(e2e_daemon_t *d);
/* Writes all n bytes to fd. */
void e2e_write_all_ok(int fd, const void *data, size_t n);
/* A raw connection (e2e_raw_connect_ok) with the headers of a POST to path_query sent: a
 * Content-Type and a Content-Length of content_length; the body is the caller's to send. */
int e2e_raw_post_start_ok(e2e_daemon_t *d, const char *path_query, const char *content_type,
                          size_t content_length);
/* What comes back on fd, NUL-terminated, until the daemon closes it, the receive timeout, or
 * size - 1 bytes. */
void e2e_read_reply(int fd, char *reply, size_t size);
