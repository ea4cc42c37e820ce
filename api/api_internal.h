/* Private to api/: what its files share. The parsed request and the response a handler fills,
 * the route table, the request and response helpers, and the handlers' entry points. Only
 * http_server.c knows libmicrohttpd; everything here is plain data, so that tests can drive
 * the router and the handlers without a socket.
 *
 * A handler runs on an HTTP thread. It either fills req->resp and returns API_DONE, or it
 * hands the request to the scheduler and returns API_PENDING: then it has called
 * api_request_suspend() BEFORE posting (so that a reply arriving at once finds the connection
 * suspended), and the scheduler's reply callback, on the loop thread, fills req->resp and calls
 * api_request_resume(). After posting, the handler touches req no more. */
#pragma once

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "daemon/auth/auth.h"
#include "daemon/util/config.h"
#include "daemon/util/stamp.h"
#include "daemon/exec/executor.h"
#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"
#include "job_json.h"

#define API_MAX_QUERY 32
#define API_MAX_PATH_PARAMS 4
#define API_PATH_PARAM_SIZE 128
#define API_MAX_EXTRA_HEADERS 4
#define API_STATUS_MAX 600

/* Who sent a request (http_identity.c decides). An empty name: nobody was identified, and err
 * says why; only the anonymous routes (/healthz, /readyz) answer such a request. */
typedef struct api_user {
    char name[OWNER_SIZE];
    bool admin;     /* sees every owner's jobs, buffers and tokens */
    bool over_unix; /* came over the Unix socket */
    bool by_token;  /* identified by a Bearer token (else by the kernel, or mode = none) */
    /* When name is empty: -ENOKEY no credentials, -EACCES a bad or revoked token,
     * -EKEYEXPIRED an expired one, -ESRCH a loopback TCP client whose socket the kernel did not
     * name (closed, or the lookup failed), -EPERM an account that [auth] allow_users and
     * allow_groups keep out (its name in refused), -EXDEV a TCP request that no token
     * identifies and another site's page may have sent (http_origin.h), another negative errno
     * when the token store failed. */
    int err;
    char refused[OWNER_SIZE];
} api_user_t;

/* Each user's limits and request-rate bucket at the door (user_policy.c). */
typedef struct api_users api_users_t;

/* The server-wide state that handlers use. */
typedef struct api_env {
    /* The configuration the server started with: what it reads of it are the keys that change
     * only at a restart (config_keep_restart_only). A request reads its own req->cfg. */
    const config_t *cfg;
    sched_t *sched;
    gpu_metrics_t *gpu_metrics; /* the GPU gauges of /metrics; NULL for none. Borrowed. */
    atomic_bool intake_stopped; /* api_server_stop_intake(): POST answers 503 */
    /* The calling thread's store reader, opened on first use and kept for the thread; NULL
     * when it cannot be opened. Borrowed. */
    store_reader_t *(*reader)(struct api_env *env);
    /* The op table: op_find in the daemon. */
    const op_def_t *(*find_op)(const char *name);
    /* The token store; NULL in tests that drive handlers without a server (then there are no
     * token routes). Borrowed. */
    auth_store_t *tokens;
    atomic_long responses[API_STATUS_MAX]; /* responses sent, by status code */
    atomic_long connections[2];            /* open HTTP connections: [0] TCP, [1] Unix socket */
    api_users_t *users; /* NULL: limits resolved on each call, no rate limit (tests) */
} api_env_t;

typedef struct api_kv {
    const char *key;
    const char *value;
} api_kv_t;

typedef struct api_header {
    char name[32];
    char value[160];
} api_header_t;

/* A response: JSON (serialized by the server) or raw bytes. */
typedef struct api_response {
    int status;   /* 0 until filled */
    json_t *json; /* owned */
    /* framed: the JSON goes out followed by section, as application/octet-stream with a
     * Gpujob-Json-Length header, the way a request carries a binary section. */
    bool framed;
    job_json_section_t section; /* owned */
    /* A body still to be built: the JSON of these jobs (owned), a list or the one, made by
     * the HTTP thread that sends it (api_respond_jobs_later). */
    job_t **jobs;
    size_t n_jobs;
    bool jobs_list;
    bool jobs_whole; /* outputs inlined, as api_respond_jobs_whole answers */
    void *body;      /* owned raw body when json is NULL */
    size_t body_len;
    const char *content_type; /* static string; "application/json" for json */
    api_header_t headers[API_MAX_EXTRA_HEADERS];
    int n_headers;
} api_response_t;

typedef struct api_request api_request_t;

/* How a handler parks its connection while the scheduler works (http_server.c, or a test). */
typedef struct api_conn_ops {
    void (*suspend)(api_request_t *req);
    void (*resume)(api_request_t *req);
} api_conn_ops_t;

struct api_request {
    api_env_t *env;
    /* The settings in force when the request began, kept to its end whatever a reload does
     * meanwhile (api_server_reload): the configuration, and the [auth] settings (NULL in tests
     * that drive handlers without a server: no access control). Borrowed. */
    const config_t *cfg;
    const auth_settings_t *auth;
    const char *method; /* "GET", ... */
    const char *path;   /* decoded, without the query string */
    api_kv_t query[API_MAX_QUERY];
    int n_query;
    bool query_overflow; /* more than API_MAX_QUERY arguments: answered 400 */
    const char *accept, *content_type, *idempotency_key; /* NULL when absent */
    const char *json_length; /* Gpujob-Json-Length: a body of JSON, then bytes; NULL when absent */
    char *body;              /* owned by the connection; NULL when body_file holds it */
    size_t body_len;         /* the body's length, in memory or in body_file */
    /* A large upload, written to a store blob file as it arrived (see
     * api_body_sink); the connection's until a handler takes it. Of a .npy upload
     * the file holds the data; its first body_head_len bytes, up to the data, are in body. */
    store_blob_stream_t *body_file;
    size_t body_head_len;
    /* An ephemeral buffer's upload (api_buffer_upload_begin): the body goes into the
     * executor's resident copy as it arrives, never into body; the first error of a write
     * (sched_upload_write) in upload_err, after which the rest is dropped. The connection's
     * until the handler takes it. */
    exec_upload_t *upload;
    int upload_err;
    api_user_t user;
    const api_conn_ops_t *conn_ops;
    void *conn; /* the connection ops' own */

    /* Filled by the router from the matched pattern's {name} segments. */
    int n_path_params;
    char path_param_names[API_MAX_PATH_PARAMS][16];
    char path_param_values[API_MAX_PATH_PARAMS][API_PATH_PARAM_SIZE];

    api_response_t resp;

    /* The job a suspended request waits for through sched_wait, with the request as its
     * token: when the client goes away meanwhile, that wait is cancelled. "" with wait_posted:
     * a submission's ?wait= (sched_submit_waited), cancelled by the request alone.
     * wait_posted and client_gone are read and written under api_wait_lock's mutex once the
     * request is armed. */
    char waits_for[ID_SIZE];
    bool wait_posted, client_gone;
    /* A waited submission's answer, handed over while its job's end was being committed,
     * leaves once this opens (sched_gate_t); owned reference, NULL when none. */
    sched_gate_t *answer_gate;

    /* A pending submission answers a list with a list. */
    bool submit_is_list;
    /* ?wait=: the answer waits up to submit_wait_ms for the ends of all its jobs. */
    bool submit_waits;
    int submit_wait_ms;

    /* GET /v1/jobs while the loop says why its queued jobs wait (sched_explain_jobs): the
     * page read from the store (owned, lent to the loop until its reply) and its limit. */
    job_t **list_jobs;
    size_t list_n;
    int list_limit;
};

/* Handler results. Both are non-zero so that helpers can return API_DONE for "answered" and
 * 0 for "carry on". */
enum { API_DONE = 1, API_PENDING = 2 };

typedef int (*api_handler_fn)(api_request_t *req);

/* A query argument of a request whose body has not arrived yet (NULL when absent), read
 * through the HTTP server's cls. */
typedef const char *(*api_query_peek_fn)(void *cls, const char *key);

/* Where a request's body goes as it arrives. */
typedef enum api_body_sink {
    API_BODY_MEMORY,       /* into memory, grown as it arrives */
    API_BODY_FILE,         /* into a store blob file */
    API_BODY_MEMORY_WHOLE, /* into memory allocated for its announced length at once: a body
                            * that is held whole anyway, which growing would copy */
    API_BODY_UPLOAD,       /* into an ephemeral buffer's resident copy, opened by
                            * api_buffer_upload_begin once the headers are in */
} api_body_sink_t;

/* Where a request's body of known length goes: asked once the headers are in, of the route's
 * handler, which may peek at the query. */
typedef api_body_sink_t (*api_streams_body_fn)(const api_env_t *env, const char *content_type,
                                               uint64_t length, api_query_peek_fn peek, void *cls);

typedef struct api_route {
    const char *method;  /* "GET", "POST", "DELETE" */
    const char *pattern; /* "/v1/jobs/{id}/outputs/{name}" */
    api_handler_fn handler;
    api_streams_body_fn streams_body; /* NULL: bodies are kept in memory */
    bool anonymous;                   /* answers requests of no identified user */
} api_route_t;

/* --- routes.c: the route table and the dispatch --- */

/* The daemon's route table (static). */
const api_route_t *api_routes(size_t *ret_n);

typedef struct api_route_match {
    const api_route_t *route; /* NULL unless status is 200 */
    int status;               /* 200, 404 (no such path) or 405 (path known, method not) */
    char allow[64];           /* 405: the methods the path has, "GET, DELETE" */
    int n_params;
    char names[API_MAX_PATH_PARAMS][16];
    char values[API_MAX_PATH_PARAMS][API_PATH_PARAM_SIZE];
} api_route_match_t;

/* Matches method and path against a table. Pattern segments "{name}" match one non-empty
 * segment. Always fills *ret. */
void api_route_match(const api_route_t *routes, size_t n, const char *method, const char *path,
                     api_route_match_t *ret);

/* Routes the request through the daemon's table and runs its handler, answering 404, 405,
 * 400 (too many query arguments) and 503 (POST after stop_intake) itself. API_DONE or
 * API_PENDING. */
int api_dispatch(api_request_t *req);

/* Whether a request to method and path may go on without an identified user: true for the
 * anonymous routes and for paths that answer 404 or 405 anyway. */
bool api_route_is_anonymous(const char *method, const char *path);
/* The pattern of the route path matches, whatever the method ("/v1/jobs/{id}"): what the
 * request log names instead of the raw path. NULL when none matches. Static. */
const char *api_route_pattern(const char *path);

/* Where the body of a request to method and path goes as it arrives (the server asks once the
 * headers are in): the matched route's streams_body says; API_BODY_MEMORY without one. */
api_body_sink_t api_body_sink(const api_env_t *env, const char *method, const char *path,
                              const char *content_type, uint64_t length, api_query_peek_fn peek,
                              void *cls);

/* --- http_util.c: reading a request, filling its response --- */

/* Frees what a request owns (its response, a held submission answer); not the request itself
 * or its body. */
void api_request_cleanup(api_request_t *req);

void api_request_suspend(api_request_t *req);
void api_request_resume(api_request_t *req);
/* The client of a suspended request went away (the connection watcher's thread): a wait it
 * posted is cancelled, and one not posted yet is not posted (handlers_jobs.c). */
void api_request_client_gone(api_request_t *req);

/* The calling thread's store reader; NULL after answering 503 when it cannot be opened. */
store_reader_t *api_request_reader(api_request_t *req);
/* The owner filter of a request: NULL for admins (every owner), else the user's name. */
const char *api_request_owner_filter(const api_request_t *req);
/* True when the user may see something owned by owner. */
bool api_request_may_see(const api_request_t *req, const char *owner);
/* Answers a request of no identified user (req->user.err says why): 401 with
 * WWW-Authenticate, never naming the token it carried; 403 naming the [auth] key for an
 * account that allow_users and allow_groups keep out. */
void api_respond_unauthorized(api_request_t *req);
/* Admin routes and another user's data: 0 when the user is an admin, in every auth mode
 * (with mode = none the TCP user "local" is one only when [auth] admins names it); else
 * answers 403 naming field (NULL: none), saying that only an admin may do what `what` says,
 * and returns API_DONE. */
int api_request_require_admin(api_request_t *req, const char *field, const char *what);

/* A query argument's value ("" for a key without one), NULL when absent. */
const char *api_query(const api_request_t *req, const char *key);
/* A {name} segment of the matched route; NULL when the route has none of that name. */
const char *api_path_param(const api_request_t *req, const char *name);

/* The checks below answer 400 naming the field ("query.KEY", or the field given) and return
 * API_DONE, or return 0 with their result written. */

/* Every query argument is in allowed (NULL-terminated). */
int api_query_check(api_request_t *req, const char *const *allowed);
/* A number of seconds in query argument key (default_s when absent), at most max_ms: longer
 * is cut down to it when clamp, else refused. *ret_ms in milliseconds. */
int api_query_seconds(api_request_t *req, const char *key, double default_s, int max_ms, bool clamp,
                      int *ret_ms);
/* A decimal integer in [lo, hi] in query argument key; default_value when absent. */
int api_query_int(api_request_t *req, const char *key, long lo, long hi, long default_value,
                  long *ret);
/* "true" or "false" in query argument key; default_value when absent. */
int api_query_bool(api_request_t *req, const char *key, bool default_value, bool *ret);
/* id, given in field, is an id of kind ('j' a job, 'b' a buffer): id_valid(). */
int api_id_check(api_request_t *req, char kind, const char *id, const char *field);

/* True when a Content-Type value or one Accept item (len bytes, parameters after ';' ignored)
 * is the media type `type`, compared case-insensitively. */
bool api_media_is(const char *item, size_t len, const char *type);
/* True when the request has a Content-Type and it is `type`. */
bool api_content_type_is(const api_request_t *req, const char *type);
/* Which of media[0..n) the Accept header asks for: the index of the first one that the
 * header's first matching item names, items taken in the header's order (q= is not
 * weighed). -1 when no item names one of them, or there is no header. */
int api_accept_pick(const api_request_t *req, const char *const *media, size_t n);

/* Fill req->resp, replacing what was there. json is stolen. */
void api_respond_json(api_request_t *req, int status, json_t *json);
/* Answers with the JSON of jobs (taken: an array of n owned jobs), a list or the one, built
 * only when the answer is sent (api_response_build), on the connection's HTTP thread: a reply
 * from another thread then costs that thread nothing but the hand-over. */
void api_respond_jobs_later(api_request_t *req, int status, job_t **jobs, size_t n, bool list);
/* body is taken. */
void api_respond_bytes(api_request_t *req, int status, const char *content_type, void *body,
                       size_t len);
/* The error answer {"error": {"code", "message", "field"}}: code NULL means the status's
 * ("invalid_argument" for 400), field NULL or "" leaves it out. */
void api_respond_error(api_request_t *req, int status, const char *code, const char *field,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void api_respond_api_error(api_request_t *req, const api_error_t *err);
/* 404: the job ('j') or buffer ('b') id, named in field, does not exist or is not the user's. */
void api_respond_not_found(api_request_t *req, char kind, const char *id, const char *field);
/* Maps a scheduler or store errno: -ENOENT 404, -EBUSY/-EEXIST 409, -EAGAIN 429 (with
 * Retry-After), -ESHUTDOWN 503, -ENOSPC 507 (insufficient_storage), anything else 500. Every
 * 503 answer, from here or from api_respond_json, carries Retry-After. */
void api_respond_errno(api_request_t *req, int err, const char *message);
/* Adds a header, or replaces the value of one of that name. */
void api_response_add_header(api_response_t *resp, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* --- job_responses.c: answers that carry jobs --- */

/* The job JSON of lists and submissions: outputs described, without their data. A new
 * reference. */
json_t *api_job_json(const job_t *job);
/* The JSON of n jobs: a list, or (list false) the first alone. */
json_t *api_jobs_json(job_t *const *jobs, size_t n, bool list);
/* Builds a body api_respond_jobs_later left to be built. */
void api_response_build(api_request_t *req);
/* Answers with the job's JSON, outputs inlined up to cfg->max_inline_output_bytes (read
 * through the calling thread's store reader when not in memory): as JSON numbers, or in a
 * binary section after the JSON when the request's Accept header puts
 * application/octet-stream before application/json. */
void api_respond_job(api_request_t *req, int status, const job_t *job);
/* api_respond_job for n jobs (borrowed): a list of them when list, else the first alone; in
 * binary, one section after the JSON holds the inline outputs of all of them. */
void api_respond_jobs_whole(api_request_t *req, int status, job_t *const *jobs, size_t n,
                            bool list);

/* --- job_lookup.c: a job the user may see, and its outputs --- */

/* Loads job id, given in field (a path or query parameter), if the user may see it; else
 * answers 400, 404 or 503 and returns API_DONE. */
int api_job_find(api_request_t *req, const char *id, const char *field, job_t **ret);
/* The output name of job id, a succeeded job the user may see: the job (job_free it) and its
 * tensor there. Else answers (400, 404 or 409 naming id_field or name_field; or the store's
 * error) and returns API_DONE. */
int api_job_find_output(api_request_t *req, const char *id, const char *id_field, const char *name,
                        const char *name_field, job_t **ret_job, const job_tensor_t **ret_t);
/* A copy of an output's bytes, malloc'd. Else answers and returns API_DONE. */
int api_job_read_output(api_request_t *req, const job_tensor_t *t, void **ret_bytes);

/* --- the handlers' entry points, named by the route table --- */

/* handlers_system.c */
int api_handle_healthz(api_request_t *req);
int api_handle_readyz(api_request_t *req);
int api_handle_metrics(api_request_t *req);
int api_handle_info(api_request_t *req);

/* handlers_jobs.c */
int api_handle_jobs_submit(api_request_t *req);
int api_handle_jobs_list(api_request_t *req);
int api_handle_job_get(api_request_t *req);
int api_handle_job_wait(api_request_t *req);
int api_handle_job_cancel(api_request_t *req);

/* handlers_outputs.c */
int api_handle_job_output(api_request_t *req);

/* handlers_buffers.c */
int api_handle_buffer_put(api_request_t *req);
/* A buffer upload, raw or .npy, too large for a row streams to a blob file. */
/* An ephemeral buffer's upload whose body streams into its resident copy (API_BODY_UPLOAD):
 * once the headers are in, before any byte of the body is taken, it is checked as
 * api_handle_buffer_put would (the query, dtype and shape against length, the Content-Length,
 * the resident quota) and its copy opened in req->upload; the handler then ends it. 0, or
 * API_DONE after answering. */
int api_buffer_upload_begin(api_request_t *req, uint64_t length);
api_body_sink_t api_buffer_put_streams_body(const api_env_t *env, const char *content_type,
                                            uint64_t length, api_query_peek_fn peek, void *cls);
int api_handle_buffer_get(api_request_t *req);
int api_handle_buffer_delete(api_request_t *req);
int api_handle_usage(api_request_t *req);

/* handlers_tokens.c */
int api_handle_tokens_create(api_request_t *req);
int api_handle_tokens_list(api_request_t *req);
int api_handle_token_revoke(api_request_t *req);

/* handlers_stats.c */
int api_handle_stats(api_request_t *req);

/* handlers_ui.c: the status page's files */
int api_handle_ui_index(api_request_t *req);
int api_handle_ui_file(api_request_t *req);
int api_handle_ui_session(api_request_t *req);

/* --- api_settings.c: the settings a request reads, one generation per reload --- */

/* One generation: a copy of the configuration and the [auth] settings built from it. */
typedef struct api_settings api_settings_t;

/* Makes a generation of cfg (copied) and auth (freed with the generation when owns_auth, else
 * borrowed and outliving it), holding one reference, the caller's. 0 or -ENOMEM. */
int api_settings_new(const config_t *cfg, const auth_settings_t *auth, bool owns_auth,
                     api_settings_t **ret);
/* Takes a reference to s (returned, for chaining). Any thread. */
api_settings_t *api_settings_ref(api_settings_t *s);
/* Drops a reference; the last one frees s. Accepts NULL. Any thread. */
void api_settings_unref(api_settings_t *s);
/* s's configuration and auth settings, borrowed for as long as a reference is held. */
const config_t *api_settings_config(const api_settings_t *s);
const auth_settings_t *api_settings_auth(const api_settings_t *s);

/* --- user_policy.c: per-user policy at the door --- */

int api_users_new(api_users_t **ret);
void api_users_free(api_users_t *u);
/* The requesting user's limits under the policy in force. */
void api_user_limits(api_request_t *req, policy_limits_t *ret);
/* Takes one of the user's requests from its rate bucket (requests_per_s_per_user, burst):
 * false, after answering 429 rate_limited with Retry-After in whole seconds, when it is empty. */
bool api_rate_admits(api_request_t *req);
