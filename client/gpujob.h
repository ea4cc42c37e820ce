/* libgpujob: the C client of gpujobd, the GPU job-execution daemon.
 *
 * A gpujob_client_t talks HTTP/1.1 to one daemon, over TCP ("http://host:port") or over a Unix
 * socket (a path, or "unix:/path"), through one libcurl handle whose connection is kept alive
 * and reused between calls. Jobs are described with a gpujob_spec_t (op, params, typed input
 * tensors) so a caller never writes JSON; what the daemon answers comes back as opaque objects
 * (gpujob_job_t, gpujob_job_list_t, gpujob_info_t) with typed accessors and the raw JSON text.
 *
 * Conventions, for every function below:
 * - Functions that can fail return 0 or a negative errno value. Out-parameters come last, are
 *   named ret_*, and are written only on success. After a failure of a call taking a client,
 *   gpujob_errmsg() says what went wrong in words; for an error answered by the daemon,
 *   gpujob_http_status(), gpujob_error_code() and gpujob_error_field() give its details.
 * - Error values: -EINVAL bad argument or 400/422 (invalid_argument), -ENOENT 404 (not found),
 *   -EBUSY 409 (conflict: e.g. cancelling a finished job, downloading an output of a job that
 *   did not succeed), -E2BIG 413 (payload too large), -EAGAIN 429 (resource exhausted),
 *   -EACCES 401/403, -ESHUTDOWN 503 (unavailable, daemon draining), -EREMOTEIO other 5xx,
 *   -EBADMSG an answer that is not what the API promises, -ECONNREFUSED daemon not running,
 *   -ETIMEDOUT request or wait timed out, -ECONNRESET connection lost mid-request, -EPROTO the
 *   TLS handshake failed or the daemon's certificate did not verify, -ENOBUFS a
 *   caller buffer too small, -ENOMEM, -EIO other transport errors.
 * - Pointers returned by accessors (const char *, const void *) are borrowed from the object
 *   they were read from and stay valid until that object is freed. Objects returned through
 *   ret_* are new and owned by the caller, who frees them with the matching *_free() (every
 *   *_free() accepts NULL). Memory returned as void ** / char ** is malloc'd: release it with
 *   free() (or gpujob_free(), which is the same free() of the library's C runtime).
 * - Thread safety: a gpujob_client_t is used by one thread at a time (it owns a libcurl easy
 *   handle and per-call error state); use one client per thread. Distinct clients, and every
 *   other object once created, are independent and may be used from different threads. The
 *   library's global initialisation (libcurl's) happens once, thread-safely, in
 *   gpujob_client_new().
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPUJOB_API __attribute__((visibility("default")))
#else
#define GPUJOB_API
#endif

#define GPUJOB_MAX_DIMS 8
/* The Unix socket of the packaged daemon (systemd's RuntimeDirectory). */
#define GPUJOB_DEFAULT_SOCKET "/run/gpujobd/gpujobd.sock"

/* ---- Tensors ---------------------------------------------------------------------------- */

typedef enum gpujob_dtype {
    GPUJOB_F32,
    GPUJOB_F16,
    GPUJOB_BF16,
    GPUJOB_F64,
    GPUJOB_I8,
    GPUJOB_I32,
    GPUJOB_U32,
    GPUJOB_I64,
    GPUJOB_DTYPE_COUNT
} gpujob_dtype_t;

/* A dense row-major tensor. When the library fills one (npy reads, outputs), data is malloc'd
 * and owned by the tensor: release it with gpujob_tensor_clear(). When the caller fills one to
 * pass it in, the library only reads it during the call. */
typedef struct gpujob_tensor {
    gpujob_dtype_t dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[GPUJOB_MAX_DIMS];
    void *data;    /* may be NULL for a descriptor without bytes */
    size_t nbytes; /* numel * dtype size */
} gpujob_tensor_t;

/* Bytes of one element; 0 for an unknown dtype. */
GPUJOB_API size_t gpujob_dtype_size(gpujob_dtype_t dt);
/* "f32", "bf16", ...: a static string; "?" for an unknown dtype. */
GPUJOB_API const char *gpujob_dtype_name(gpujob_dtype_t dt);
/* Parses a dtype name. 0 or -EINVAL. */
GPUJOB_API int gpujob_dtype_parse(const char *name, gpujob_dtype_t *ret);

/* Describes data (borrowed, may be NULL) as a tensor of dtype and shape (ndim sizes, each
 * >= 0): checks the dtype, ndim <= GPUJOB_MAX_DIMS and the byte size for overflow, and sets
 * nbytes. 0, -EINVAL or -EOVERFLOW. */
GPUJOB_API int gpujob_tensor_init(gpujob_tensor_t *t, gpujob_dtype_t dtype, int ndim,
                                  const int64_t *shape, void *data);
/* Number of elements (1 for a scalar). */
GPUJOB_API int64_t gpujob_tensor_numel(const gpujob_tensor_t *t);
/* Frees t->data and zeroes t; for tensors the library filled. Accepts NULL. */
GPUJOB_API void gpujob_tensor_clear(gpujob_tensor_t *t);

/* NumPy .npy files. Reading accepts versions 1.0, 2.0 and 3.0, C order, little-endian
 * '<f4' '<f2' '<f8' '|i1' '<i4' '<u4' '<i8', and a data length exactly matching the header;
 * *ret gets a copy of the data (owned). Writing produces a version 1.0 file (a new malloc'd
 * block); bf16 has no .npy form (-ENOTSUP). Errors: -EINVAL (malformed, message in errbuf when
 * not NULL), -ENOTSUP (a dtype we do not have), -ENOMEM, or -errno of the file I/O. */
GPUJOB_API int gpujob_npy_parse(const void *file, size_t len, gpujob_tensor_t *ret, char *errbuf,
                                size_t errbuf_size);
GPUJOB_API int gpujob_npy_load(const char *path, gpujob_tensor_t *ret, char *errbuf,
                               size_t errbuf_size);
GPUJOB_API int gpujob_npy_format(const gpujob_tensor_t *t, void **ret_file, size_t *ret_len);
/* Writes t to path (created or truncated, mode 0666 & ~umask) through a temporary file renamed
 * into place, so a reader never sees half a file. */
GPUJOB_API int gpujob_npy_save(const char *path, const gpujob_tensor_t *t);

/* ---- The client ------------------------------------------------------------------------- */

typedef struct gpujob_client gpujob_client_t;

/* Creates a client for address: "http://HOST:PORT" (https too), "unix:/path/to/socket" or an
 * absolute socket path. NULL means $GPUJOB_URL when set, else GPUJOB_DEFAULT_SOCKET. Nothing
 * is contacted yet. -EINVAL (malformed address or $GPUJOB_TOKEN, message in errbuf when not
 * NULL) or -ENOMEM. */
GPUJOB_API int gpujob_client_new(const char *address, gpujob_client_t **ret, char *errbuf,
                                 size_t errbuf_size);
/* Closes the connection and frees. Accepts NULL. */
GPUJOB_API void gpujob_client_free(gpujob_client_t *c);
/* The address in use (borrowed). */
GPUJOB_API const char *gpujob_client_address(const gpujob_client_t *c);
/* Sends "Authorization: Bearer TOKEN" from now on (copied; NULL stops sending it). $GPUJOB_TOKEN
 * is used by default when set. 0, -EINVAL when token holds a control character or a space
 * (it would split the header), or -ENOMEM. */
GPUJOB_API int gpujob_client_set_token(gpujob_client_t *c, const char *token);
/* Verifies an https:// daemon's certificate against the CA certificates of this PEM file (a
 * lab's own CA) instead of the system's trusted ones (copied; NULL goes back to the system's).
 * $GPUJOB_CA_FILE is used by default when set. Certificates are always verified, host name
 * included: a daemon whose certificate does not verify fails every call with -EPROTO. 0,
 * -ENOMEM, or the negative errno of a file that cannot be read (the setting is then
 * unchanged). */
GPUJOB_API int gpujob_client_set_ca_file(gpujob_client_t *c, const char *path);
/* The longest one request may take, beyond the long-poll time of a wait (default 60000 ms;
 * 0 for no limit), and how long a connection attempt may take (default 10000 ms). */
GPUJOB_API void gpujob_client_set_timeout_ms(gpujob_client_t *c, long request_ms, long connect_ms);
/* How many times a submission is sent again after a lost connection, a refused connection or
 * a 429/503 answer (default 3, with 100 ms, 200 ms, 400 ms... between attempts, or the
 * daemon's Retry-After; a Retry-After past a minute, such as a spent GPU-time budget's
 * (budget_exceeded), is not waited for: the refusal is returned). Every attempt carries the
 * same Idempotency-Key, so the daemon creates the job at most once. */
GPUJOB_API void gpujob_client_set_retries(gpujob_client_t *c, int retries);
/* Whether answers that carry a job ask for its inline outputs as bytes in a binary section
 * (Accept: application/octet-stream) rather than as JSON numbers (default true: no number
 * formatting in the daemon, no parsing here). gpujob_job_output reads either; the JSON of
 * gpujob_job_json names such an output's bytes with "binary_offset" instead of "data". */
GPUJOB_API void gpujob_client_set_binary_outputs(gpujob_client_t *c, bool on);

/* The last failure of a call on c, in words ("" after a success; borrowed). */
GPUJOB_API const char *gpujob_errmsg(const gpujob_client_t *c);
/* The HTTP status of the last answer (0 when none came back). */
GPUJOB_API long gpujob_http_status(const gpujob_client_t *c);
/* The daemon's error code ("invalid_argument", "not_found", ...) and field path
 * ("inputs.x.dtype") of the last error answer; "" when none. Borrowed. */
GPUJOB_API const char *gpujob_error_code(const gpujob_client_t *c);
GPUJOB_API const char *gpujob_error_field(const gpujob_client_t *c);
/* A short description of an error value of this library (strerror of -r). */
GPUJOB_API const char *gpujob_strerror(int r);
/* free() of the library's runtime, for memory it returned. */
GPUJOB_API void gpujob_free(void *p);

/* ---- Daemon information and usage ------------------------------------------------------- */

typedef struct gpujob_info gpujob_info_t;

/* GET /v1/info. */
GPUJOB_API int gpujob_info(gpujob_client_t *c, gpujob_info_t **ret);
GPUJOB_API void gpujob_info_free(gpujob_info_t *info);
GPUJOB_API const char *gpujob_info_version(const gpujob_info_t *info);
/* The backend's name ("cpu" or "cuda") and its number of GPUs (0 for the CPU backend). */
GPUJOB_API const char *gpujob_info_backend(const gpujob_info_t *info);
GPUJOB_API size_t gpujob_info_device_count(const gpujob_info_t *info);
GPUJOB_API size_t gpujob_info_op_count(const gpujob_info_t *info);
/* Name and one-line summary of op i (< op_count), or NULL. */
GPUJOB_API const char *gpujob_info_op_name(const gpujob_info_t *info, size_t i);
GPUJOB_API const char *gpujob_info_op_summary(const gpujob_info_t *info, size_t i);
/* The whole answer as JSON text. */
GPUJOB_API const char *gpujob_info_json(const gpujob_info_t *info);

/* ---- Jobs ------------------------------------------------------------------------------- */

typedef enum gpujob_state {
    GPUJOB_QUEUED,
    GPUJOB_RUNNING,
    GPUJOB_SUCCEEDED,
    GPUJOB_FAILED,
    GPUJOB_CANCELLED,
    GPUJOB_STATE_UNKNOWN
} gpujob_state_t;

/* "queued", ...: a static string. */
GPUJOB_API const char *gpujob_state_name(gpujob_state_t s);
/* 0 or -EINVAL. */
GPUJOB_API int gpujob_state_parse(const char *name, gpujob_state_t *ret);
/* True for succeeded, failed and cancelled. */
GPUJOB_API bool gpujob_state_is_final(gpujob_state_t s);

/* A job to submit: an op, its params, and its inputs. Inputs are copied (encoded) when added,
 * so the caller's tensor data may be released right after. */
typedef struct gpujob_spec gpujob_spec_t;

/* 0, -EINVAL (op empty) or -ENOMEM. */
GPUJOB_API int gpujob_spec_new(const char *op, gpujob_spec_t **ret);
GPUJOB_API void gpujob_spec_free(gpujob_spec_t *spec);
/* Adds input name from a tensor (its data must be non-NULL unless nbytes is 0). -EINVAL for an
 * empty name or an inconsistent tensor, -EEXIST when name was already added. */
GPUJOB_API int gpujob_spec_input(gpujob_spec_t *spec, const char *name, const gpujob_tensor_t *t);
/* Adds input name as a reference to an uploaded buffer. */
GPUJOB_API int gpujob_spec_input_buffer(gpujob_spec_t *spec, const char *name,
                                        const char *buffer_id);
/* Sets param key to a number, integer, boolean, string, or any JSON value given as text
 * ("[1, 2]", "null"): -EINVAL when the text is not JSON. A key set twice keeps the last. */
GPUJOB_API int gpujob_spec_param_double(gpujob_spec_t *spec, const char *key, double v);
GPUJOB_API int gpujob_spec_param_int(gpujob_spec_t *spec, const char *key, int64_t v);
GPUJOB_API int gpujob_spec_param_bool(gpujob_spec_t *spec, const char *key, bool v);
GPUJOB_API int gpujob_spec_param_string(gpujob_spec_t *spec, const char *key, const char *v);
GPUJOB_API int gpujob_spec_param_json(gpujob_spec_t *spec, const char *key, const char *json);
/* Priority -100..100 (default 0: the daemon checks the range), pinned device (>= 0; -1 for
 * any, the default), deadline in ms from submission (0: the daemon's default) and time limit,
 * the longest the job may run once started, in ms (0: the daemon's default; past it the job
 * fails with time_limit). */
GPUJOB_API void gpujob_spec_set_priority(gpujob_spec_t *spec, int priority);
GPUJOB_API void gpujob_spec_set_device(gpujob_spec_t *spec, int device);
GPUJOB_API void gpujob_spec_set_deadline_ms(gpujob_spec_t *spec, int64_t deadline_ms);
GPUJOB_API void gpujob_spec_set_time_limit_ms(gpujob_spec_t *spec, int64_t time_limit_ms);
/* The JSON the spec submits (a new malloc'd string, or NULL when out of memory). */
GPUJOB_API char *gpujob_spec_json(const gpujob_spec_t *spec);

/* A job as the daemon last reported it. */
typedef struct gpujob_job gpujob_job_t;

/* POST /v1/jobs with one job; *ret is the new job (queued). A new Idempotency-Key is generated
 * for the call and reused by its retries (gpujob_client_set_retries). */
GPUJOB_API int gpujob_submit(gpujob_client_t *c, const gpujob_spec_t *spec, gpujob_job_t **ret);
/* gpujob_submit, waiting in the same request up to wait_s seconds (the daemon cuts it to its
 * limits.max_wait_ms) for the job to end: *ret is the job as it stands then, final or not, its
 * small outputs inline. A negative wait_s does not wait (gpujob_submit). */
GPUJOB_API int gpujob_submit_wait(gpujob_client_t *c, const gpujob_spec_t *spec, double wait_s,
                                  gpujob_job_t **ret);
/* POST /v1/jobs with n (>= 1) jobs in one request, all or nothing. ret_jobs receives n new
 * jobs in order (an array the caller provides). idempotency_key: the key to send (at most 127
 * characters; to retry a submission across process restarts), or NULL to generate one. */
GPUJOB_API int gpujob_submit_many(gpujob_client_t *c, const gpujob_spec_t *const *specs, size_t n,
                                  const char *idempotency_key, gpujob_job_t **ret_jobs);
/* gpujob_submit_many, waiting in the same request up to wait_s seconds (cut to the daemon's
 * limits.max_wait_ms) for all n jobs to end: ret_jobs receives them in order as they stand
 * then, final or not (a job not final is one the wait did not see end; a wait that runs out is
 * no error), each with its small outputs inline for gpujob_job_output as gpujob_submit_wait
 * gives one job's. The jobs of one answer share its binary section (see
 * gpujob_client_set_binary_outputs): each may be freed on its own. Retries reuse the
 * idempotency key, so that a lost answer is waited for again without creating new jobs. A
 * negative wait_s does not wait (gpujob_submit_many); one past a day waits a day; -EINVAL when
 * it is not a number. */
GPUJOB_API int gpujob_submit_many_wait(gpujob_client_t *c, const gpujob_spec_t *const *specs,
                                       size_t n, const char *idempotency_key, double wait_s,
                                       gpujob_job_t **ret_jobs);
/* GET /v1/jobs/{id}. */
GPUJOB_API int gpujob_get(gpujob_client_t *c, const char *id, gpujob_job_t **ret);
/* Waits until job id is final, with long polls (no busy loop), and returns it. timeout_s < 0
 * waits without limit; when the job is not final after timeout_s, -ETIMEDOUT. */
GPUJOB_API int gpujob_wait(gpujob_client_t *c, const char *id, double timeout_s,
                           gpujob_job_t **ret);
/* Like gpujob_wait, but calls progress (when not NULL) with the job's latest state about every
 * interval_s seconds; a non-zero return from progress stops the wait with -ECANCELED. */
typedef int (*gpujob_progress_fn)(const gpujob_job_t *job, double elapsed_s, void *userdata);
GPUJOB_API int gpujob_wait_progress(gpujob_client_t *c, const char *id, double timeout_s,
                                    double interval_s, gpujob_progress_fn progress, void *userdata,
                                    gpujob_job_t **ret);
/* DELETE /v1/jobs/{id}: a queued job never runs; a running one has its result discarded.
 * -EBUSY when the job is already final. ret may be NULL; else the job after the cancel. */
GPUJOB_API int gpujob_cancel(gpujob_client_t *c, const char *id, gpujob_job_t **ret);

GPUJOB_API void gpujob_job_free(gpujob_job_t *job);
GPUJOB_API const char *gpujob_job_id(const gpujob_job_t *job);
GPUJOB_API const char *gpujob_job_op(const gpujob_job_t *job);
GPUJOB_API gpujob_state_t gpujob_job_state(const gpujob_job_t *job);
GPUJOB_API int gpujob_job_priority(const gpujob_job_t *job);
/* The pinned device, or -1; the device that ran it, or -1 (none, or the CPU backend). */
GPUJOB_API int gpujob_job_device(const gpujob_job_t *job);
GPUJOB_API int gpujob_job_run_device(const gpujob_job_t *job);
GPUJOB_API int gpujob_job_attempts(const gpujob_job_t *job);
/* Jobs in the launch that ran it (0 when it has not run). */
GPUJOB_API int gpujob_job_batch_size(const gpujob_job_t *job);
/* Milliseconds queued, running and on the GPU; -1 when not known (yet). */
GPUJOB_API double gpujob_job_queue_ms(const gpujob_job_t *job);
GPUJOB_API double gpujob_job_run_ms(const gpujob_job_t *job);
GPUJOB_API double gpujob_job_gpu_ms(const gpujob_job_t *job);
/* RFC 3339 timestamps, or NULL when unset. */
GPUJOB_API const char *gpujob_job_created_at(const gpujob_job_t *job);
GPUJOB_API const char *gpujob_job_started_at(const gpujob_job_t *job);
GPUJOB_API const char *gpujob_job_finished_at(const gpujob_job_t *job);
/* Why a job failed: the error code ("deadline_exceeded") and message, or NULL. */
GPUJOB_API const char *gpujob_job_error_code(const gpujob_job_t *job);
GPUJOB_API const char *gpujob_job_error_message(const gpujob_job_t *job);
/* What a cancel (gpujob_cancel) did to the job: "dequeued" (it had not started and never runs),
 * "stopped" (its CPU worker stops it), "dropped" (it runs to its end on the GPU, its result
 * dropped); NULL for a job that is not a cancel's answer. */
GPUJOB_API const char *gpujob_job_cancel_outcome(const gpujob_job_t *job);
/* The outputs of a succeeded job (none before): their count and names, in the daemon's order. */
GPUJOB_API size_t gpujob_job_output_count(const gpujob_job_t *job);
GPUJOB_API const char *gpujob_job_output_name(const gpujob_job_t *job, size_t i);
/* Output name's dtype and shape, and its data when the daemon inlined it (small outputs):
 * then ret->data is a new copy owned by *ret, else ret->data is NULL (download it with
 * gpujob_output_tensor()). -ENOENT when the job has no such output, -EBADMSG when the daemon's
 * description cannot be read. Free with gpujob_tensor_clear(). */
GPUJOB_API int gpujob_job_output(const gpujob_job_t *job, const char *name, gpujob_tensor_t *ret);
/* The job's JSON as the daemon sent it (without a binary section; see
 * gpujob_client_set_binary_outputs). */
GPUJOB_API const char *gpujob_job_json(const gpujob_job_t *job);

/* GET /v1/jobs: a page of the caller's jobs, in the daemon's order (submission order). */
typedef struct gpujob_list_query {
    const char *state; /* NULL for any; else a state name */
    const char *op;    /* NULL for any */
    int limit;         /* 1..1000; 0 for the daemon's default (100) */
    const char *after; /* the cursor of the previous page (gpujob_job_list_next), or NULL */
} gpujob_list_query_t;
typedef struct gpujob_job_list gpujob_job_list_t;

/* query may be NULL (everything, first page). */
GPUJOB_API int gpujob_list(gpujob_client_t *c, const gpujob_list_query_t *query,
                           gpujob_job_list_t **ret);
GPUJOB_API void gpujob_job_list_free(gpujob_job_list_t *list);
GPUJOB_API size_t gpujob_job_list_count(const gpujob_job_list_t *list);
/* Job i (< count), borrowed from the list. */
GPUJOB_API const gpujob_job_t *gpujob_job_list_at(const gpujob_job_list_t *list, size_t i);
/* The cursor of the next page, or NULL on the last page. */
GPUJOB_API const char *gpujob_job_list_next(const gpujob_job_list_t *list);

/* ---- Usage ------------------------------------------------------------------------------ */

/* What the calling user holds and has used (GET /v1/usage), by value. */
typedef struct gpujob_usage {
    char owner[64];
    int64_t jobs[GPUJOB_STATE_UNKNOWN]; /* jobs by state, indexed by gpujob_state_t */
    double run_ms;                      /* run time of finished jobs */
    double gpu_ms;                      /* device time of finished jobs */
    int64_t buffers, buffer_bytes;      /* uploaded buffers */
} gpujob_usage_t;

GPUJOB_API int gpujob_usage(gpujob_client_t *c, gpujob_usage_t *ret);

/* Which usage to report: every field may be NULL (or the whole query, for the caller's usage
 * over every day there is). */
typedef struct gpujob_usage_query {
    const char *since; /* the first UTC day: "2026-03-01" or an RFC 3339 time; NULL: the first */
    const char *until; /* the last UTC day (inclusive), written as since; NULL: the last */
    const char *user;  /* another user's name, or "all": admins only (403); NULL: the caller */
} gpujob_usage_query_t;

/* The jobs that ended, summed: over one user, UTC day and op (a row of the report), or over
 * the whole report (its totals: date and op ""). Times are exact integers. */
typedef struct gpujob_usage_row {
    char date[16]; /* "2026-03-01" */
    char user[64];
    char op[32];
    int64_t jobs, succeeded, failed, cancelled;
    int64_t run_us;              /* the sum of the jobs' run_ms, in microseconds */
    int64_t gpu_ns;              /* the sum of the jobs' gpu_ms, in nanoseconds */
    int64_t bytes_in, bytes_out; /* inputs, and outputs of the jobs that succeeded */
} gpujob_usage_row_t;

/* One of the user's GPU-time budgets (per UTC day or month): what the user's jobs have been
 * charged in its window so far, what is left, and when the window resets. */
typedef struct gpujob_budget {
    char window[8];                          /* "day" or "month" */
    char key[128];                           /* the configuration key that set it */
    double gpu_ms, used_gpu_ms, left_gpu_ms; /* the budget, and its use so far */
    bool exceeded;                           /* used up: submissions answer 429 until reset_at */
    char since[40], reset_at[40];            /* the window's start and end, RFC 3339 (UTC) */
} gpujob_budget_t;

/* A usage report (GET /v1/usage?since=&until=&user=): what the user holds now, and the daemon's
 * per-day, per-op rollup of the jobs that ended in the range, which outlives the jobs. */
typedef struct gpujob_usage_report {
    gpujob_usage_t summary;    /* as gpujob_usage() gives it, over the range */
    char since[16], until[16]; /* the range's days; "" where it is open */
    gpujob_usage_row_t totals;
    size_t n_rows;
    gpujob_usage_row_t *rows; /* by user, then day, then op */
    char *json;               /* the daemon's answer, as JSON text */
    /* The user's budgets, whatever the range (none for every user's report, or a daemon that
     * sets none). */
    size_t n_budgets;
    gpujob_budget_t budgets[2];
} gpujob_usage_report_t;

/* GET /v1/usage with query (NULL: the caller's, every day). *ret is freed with
 * gpujob_usage_report_free. A since or until that is not a date answers -EINVAL, with
 * gpujob_error_field() naming it; another user's usage, to one who is not an admin, -EACCES. */
GPUJOB_API int gpujob_usage_report(gpujob_client_t *c, const gpujob_usage_query_t *query,
                                   gpujob_usage_report_t **ret);
/* Accepts NULL. */
GPUJOB_API void gpujob_usage_report_free(gpujob_usage_report_t *report);

/* ---- Outputs ---------------------------------------------------------------------------- */

typedef enum gpujob_format {
    GPUJOB_FORMAT_RAW, /* the tensor's bytes, little-endian, row-major */
    GPUJOB_FORMAT_NPY, /* a .npy v1.0 file */
} gpujob_format_t;

/* GET /v1/jobs/{id}/outputs/{name} into the caller's buffer buf of cap bytes; *ret_len is
 * the length written. -ENOBUFS (nothing useful written) when cap is too small, -EBUSY when the
 * job has not succeeded, -ENOENT for an unknown job or output. */
GPUJOB_API int gpujob_output_read(gpujob_client_t *c, const char *id, const char *name,
                                  gpujob_format_t format, void *buf, size_t cap, size_t *ret_len);
/* The same into a new malloc'd block (free() it). */
GPUJOB_API int gpujob_output_fetch(gpujob_client_t *c, const char *id, const char *name,
                                   gpujob_format_t format, void **ret_data, size_t *ret_len);
/* The output as a typed tensor (raw download; dtype and shape from the daemon's headers). */
GPUJOB_API int gpujob_output_tensor(gpujob_client_t *c, const char *id, const char *name,
                                    gpujob_tensor_t *ret);

/* ---- Buffers ---------------------------------------------------------------------------- */

/* A buffer's metadata, by value. */
typedef struct gpujob_buffer {
    char id[64];
    gpujob_dtype_t dtype;
    int ndim;
    int64_t shape[GPUJOB_MAX_DIMS];
    uint64_t bytes;
    bool resident;       /* kept in device memory across jobs */
    char created_at[40]; /* RFC 3339, "" when unknown */
} gpujob_buffer_t;

/* POST /v1/buffers from a tensor's bytes (application/octet-stream). */
GPUJOB_API int gpujob_buffer_put(gpujob_client_t *c, const gpujob_tensor_t *t, bool resident,
                                 gpujob_buffer_t *ret);
/* POST /v1/buffers from a .npy file held in memory, or read from path (application/x-npy:
 * the daemon reads dtype and shape from its header). */
GPUJOB_API int gpujob_buffer_put_npy(gpujob_client_t *c, const void *file, size_t len,
                                     bool resident, gpujob_buffer_t *ret);
GPUJOB_API int gpujob_buffer_put_file(gpujob_client_t *c, const char *path, bool resident,
                                      gpujob_buffer_t *ret);
/* POST /v1/buffers?job=&output=: output of job job_id, which has succeeded, kept as a new
 * buffer (copied within the daemon) for later jobs. */
GPUJOB_API int gpujob_buffer_keep(gpujob_client_t *c, const char *job_id, const char *output,
                                  bool resident, gpujob_buffer_t *ret);
/* GET /v1/buffers/{id}. */
GPUJOB_API int gpujob_buffer_get(gpujob_client_t *c, const char *id, gpujob_buffer_t *ret);
/* DELETE /v1/buffers/{id}. */
GPUJOB_API int gpujob_buffer_delete(gpujob_client_t *c, const char *id);

/* ---- Tokens ----------------------------------------------------------------------------- */

/* The longest token text the daemon makes ("gj_<id>_<secret>"), NUL included. */
#define GPUJOB_TOKEN_SIZE 128

/* A token's record, by value: everything but its secret. Times are RFC 3339; expires_at and
 * last_used_at are "" for never. */
typedef struct gpujob_token {
    char id[32];
    char name[128];
    char owner[64];
    char created_at[40];
    char expires_at[40];
    char last_used_at[40];
} gpujob_token_t;

/* POST /v1/tokens: mints a token for the caller, labelled name, expiring expires_in_s seconds
 * from now (0: never). The daemon makes tokens only over its Unix socket, for the socket's
 * peer user (-EACCES otherwise): a user logged in to the server mints the token they then use
 * from elsewhere with gpujob_client_set_token or $GPUJOB_TOKEN. The token's text goes to
 * ret_text, the only copy there will ever be (the daemon keeps a hash); its record to ret
 * (NULL: not wanted). The library never puts a token's text in a message. */
GPUJOB_API int gpujob_token_create(gpujob_client_t *c, const char *name, int64_t expires_in_s,
                                   gpujob_token_t *ret, char ret_text[GPUJOB_TOKEN_SIZE]);
/* GET /v1/tokens: the caller's tokens, oldest first, or, for an admin, user's (NULL: the
 * caller's own; an admin's NULL lists everyone's). *ret is a malloc'd array (free() it; NULL
 * when *ret_n is 0). */
GPUJOB_API int gpujob_token_list(gpujob_client_t *c, const char *user, gpujob_token_t **ret,
                                 size_t *ret_n);
/* DELETE /v1/tokens/{id}: revokes one of the caller's tokens (an admin: anyone's); it is
 * refused from its next request on. id may also be the token's whole text: only its id is
 * sent. -ENOENT when the caller has no such token. */
GPUJOB_API int gpujob_token_revoke(gpujob_client_t *c, const char *id);

#ifdef __cplusplus
}
#endif
