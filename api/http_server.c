/* The HTTP adapter: the only file of gpujobd that includes libmicrohttpd.
 *
 * It listens (TCP, and a Unix socket when configured) with a pool of MHD threads, collects
 * each request's body under the size limit, asks http_identity.c who the user is, hands a
 * plain api_request_t to the router and writes the api_response_t back. A handler that posts
 * to the scheduler suspends its connection; the scheduler's reply callback (loop thread) fills
 * the response and resumes it, and MHD then calls on_request() once more to send it.
 *
 * Lifetime: a request context lives from the first on_request() of a request to MHD's
 * completion notice. A suspended connection is never timed out or completed by MHD, so a
 * pending scheduler reply always finds its context; this holds until api_server_free(), which
 * therefore must run after sched_stop() has answered every request (daemon/main.c does). */
#include "api.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "api_internal.h"
#include "conn_watch.h"
#include "http_body.h"
#include "http_identity.h"
#include "http_strict.h"
#include "http_tls.h"
#include "json_write.h"
#include "daemon/util/id.h"
#include "daemon/util/log.h"

/* The most body memory taken on a Content-Length header alone; more grows as data arrives. */
#define BODY_PREALLOC_MAX ((size_t)4 << 20)

#define API_LISTEN_BACKLOG 511

typedef struct listener {
    struct api_server *srv;
    bool is_unix;
    bool tls; /* serves HTTPS: a suspended client's close cannot be probed in plain text */
    /* Its connections: which are let in, the deadlines of their requests, and the close of
     * suspended clients (conn_watch.h). */
    conn_watch_t *watch;
} listener_t;

/* libmicrohttpd's log lines, each kind (its format string) at most once per
 * CONN_WATCH_LOG_INTERVAL_US: a flood of refused connections writes a line, not thousands. */
#define MHD_LOG_KINDS 16

typedef struct mhd_log_kind {
    const char *fmt;
    conn_ratelimit_t rl;
} mhd_log_kind_t;

typedef struct reader_entry {
    store_reader_t *rd;
    struct reader_entry *next;
} reader_entry_t;

struct api_server {
    api_env_t env; /* first: thread_reader() gets the server from it */
    struct MHD_Daemon *tcp, *local;
    listener_t tcp_listener, unix_listener;
    char unix_path[PATH_MAX];
    unsigned generation;
    atomic_long pending; /* requests waiting for the scheduler */
    pthread_mutex_t readers_lock;
    reader_entry_t *readers;
    int max_connections; /* per listener: server.max_connections, or what the descriptors fit */
    pthread_mutex_t log_lock;
    mhd_log_kind_t log_kinds[MHD_LOG_KINDS];
    conn_ratelimit_t peer_log; /* failures to ask the kernel for a loopback peer; log_lock */
    /* The settings a request takes when it begins (api_server_reload swaps them); the server
     * holds a reference. The lock guards the pointer only. */
    pthread_mutex_t settings_lock;
    api_settings_t *settings;
    /* The request heads are walked for bytes a NUL hid (http_strict.h): libmicrohttpd 0.9. */
    bool head_walk;
};

/* A connection from its start to its close (MHD's socket context): its entry in the watch,
 * and the account the kernel named at its other end when it was accepted, while the client's
 * socket surely existed (auth_peer_uid). */
typedef struct conn_state {
    conn_watch_entry_t *watched; /* NULL if none */
    http_peer_t peer;
} conn_state_t;

/* Made by the URI log callback (on_uri), as each request's line is parsed; the rest is filled
 * by the first call of the access handler (request_begin), which sets begun. */
typedef struct conn_ctx {
    bool begun;
    size_t target_len; /* the request target's length before libmicrohttpd decoded it */
    bool target_bad;   /* it holds a control byte or a space (http_target_is_bad) */
    api_server_t *srv;
    api_settings_t *settings; /* the generation req.cfg and req.auth belong to; a reference */
    struct MHD_Connection *conn;
    conn_watch_t *watch;         /* its listener's */
    conn_watch_entry_t *watched; /* the connection's entry in watch; NULL if none */
    http_body_t body;            /* how the request's body is being taken in */
    bool dispatched;             /* the router has run */
    bool read;      /* req's method, path, query and headers are filled (request_read) */
    bool responded; /* a response is queued: later calls only drain the upload */
    atomic_bool reply_ready;
    /* What the request's log line says besides its answer: when its headers were in, its
     * method and route pattern (libmicrohttpd's string and a static one; the route NULL for a
     * path no route matches), and the id its answer carries in X-Request-Id. */
    int64_t started_us;
    const char *log_method, *log_route;
    char request_id[REQUEST_ID_SIZE];
    api_request_t req;
} conn_ctx_t;

/* --- store readers, one per thread --- */

/* Distinguishes servers over a process's life, so that a thread never reuses a reader of a
 * server that is gone (tests start several). */
static atomic_uint server_generation;
static _Thread_local struct {
    unsigned generation;
    store_reader_t *rd;
} tls_reader;

static store_reader_t *thread_reader(api_env_t *env)
{
    api_server_t *srv = (api_server_t *)env;
    if (tls_reader.rd && tls_reader.generation == srv->generation) return tls_reader.rd;
    store_reader_t *rd = NULL;
    int r = store_reader_open(sched_store(env->sched), &rd);
    if (r < 0) {
        log_error("Failed to open a store reader: %s", strerror(-r));
        return NULL;
    }
    reader_entry_t *e = malloc(sizeof *e);
    if (!e) {
        store_reader_close(rd);
        return NULL;
    }
    pthread_mutex_lock(&srv->readers_lock);
    e->rd = rd;
    e->next = srv->readers;
    srv->readers = e;
    pthread_mutex_unlock(&srv->readers_lock);
    tls_reader.generation = srv->generation;
    tls_reader.rd = rd;
    return rd;
}

/* --- settings --- */

/* The settings in force now, with a reference for the caller (a request, to its end). */
static api_settings_t *settings_take(api_server_t *srv)
{
    pthread_mutex_lock(&srv->settings_lock);
    api_settings_t *s = api_settings_ref(srv->settings);
    pthread_mutex_unlock(&srv->settings_lock);
    return s;
}

int api_server_reload(api_server_t *srv, const config_t *cfg, auth_settings_t *auth)
{
    api_settings_t *next;
    int r = api_settings_new(cfg, auth, true, &next);
    if (r < 0) return r;
    pthread_mutex_lock(&srv->settings_lock);
    api_settings_t *old = srv->settings;
    srv->settings = next;
    pthread_mutex_unlock(&srv->settings_lock);
    api_settings_unref(old);
    return 0;
}

/* --- suspend and resume --- */

static void conn_suspend(api_request_t *req)
{
    conn_ctx_t *ctx = req->conn;
    atomic_fetch_add(&ctx->srv->pending, 1);
    conn_watch_suspend(ctx->watch, ctx->watched);
    MHD_suspend_connection(ctx->conn);
}

/* Runs on the scheduler's loop thread, after the reply was written into req->resp. */
static void conn_resume(api_request_t *req)
{
    conn_ctx_t *ctx = req->conn;
    atomic_fetch_sub(&ctx->srv->pending, 1);
    atomic_store(&ctx->reply_ready, true);
    conn_watch_resume(ctx->watch, ctx->watched);
    STAMP(RESUMED);
    MHD_resume_connection(ctx->conn);
}

/* The watcher's thread, under its lock: the client of a suspended request closed its
 * connection. A wait is answered at once, which resumes the connection, so that
 * libmicrohttpd sees the close and frees the slot. Other pending requests are answered soon
 * anyway. */
static void conn_client_gone(void *ud)
{
    conn_ctx_t *ctx = ud;
    api_request_client_gone(&ctx->req);
}

static const api_conn_ops_t conn_ops = {conn_suspend, conn_resume};

/* --- responses --- */

/* The request's one line at info level: method, route pattern, user, status, body bytes,
 * microseconds from its headers to its answer, and its id. */
static void log_request(const conn_ctx_t *ctx, int status, size_t bytes)
{
    if (LOG_INFO > log_max_level) return;
    const log_field_t fields[] = {
        {"method", ctx->log_method ? ctx->log_method : "-", 0},
        {"route", ctx->log_route ? ctx->log_route : "-", 0},
        {"user", ctx->req.user.name[0] ? ctx->req.user.name : "-", 0},
        {"status", NULL, status},
        {"bytes", NULL, (int64_t)bytes},
        {"us", NULL, mono_us() - ctx->started_us},
        {"request_id", ctx->request_id, 0},
    };
    log_write_fields(LOG_INFO, "request", fields, (int)(sizeof fields / sizeof fields[0]));
}

static enum MHD_Result send_response(conn_ctx_t *ctx)
{
    api_request_t *req = &ctx->req;
    api_response_build(req);
    api_response_t *resp = &req->resp;
    char *data;
    size_t len;
    size_t json_len = 0;
    if (resp->json) {
        if (json_write(resp->json, &data, &json_len) < 0) return MHD_NO;
        size_t section_len = resp->framed ? resp->section.len : 0;
        char *grown = realloc(data, json_len + 2 + section_len);
        if (!grown) {
            free(data);
            return MHD_NO;
        }
        data = grown;
        data[json_len++] = '\n';
        data[json_len] = '\0';
        if (section_len) memcpy(data + json_len, resp->section.bytes, section_len);
        len = json_len + section_len;
    } else {
        data = resp->body;
        len = resp->body_len;
        resp->body = NULL;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(data);
        return MHD_NO;
    }
    if (resp->json && resp->framed) {
        char length[24];
        snprintf(length, sizeof length, "%zu", json_len);
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
        MHD_add_response_header(r, "Gpujob-Json-Length", length);
    } else {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                resp->content_type ? resp->content_type : "application/json");
    }
    for (int i = 0; i < resp->n_headers; i++)
        MHD_add_response_header(r, resp->headers[i].name, resp->headers[i].value);
    MHD_add_response_header(r, "X-Request-Id", ctx->request_id);
    int status = resp->status ? resp->status : 500;
    /* Made while its job's end was being committed, the answer leaves once it is. */
    sched_gate_pass(req->answer_gate);
    req->answer_gate = NULL;
    enum MHD_Result ok = MHD_queue_response(ctx->conn, (unsigned)status, r);
    STAMP(ANSWERED);
    MHD_destroy_response(r);
    ctx->responded = ok == MHD_YES;
    if (status >= 100 && status < API_STATUS_MAX)
        atomic_fetch_add(&ctx->srv->env.responses[status], 1);
    log_request(ctx, status, len);
    return ok;
}

static enum MHD_Result collect_query(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value)
{
    api_request_t *req = cls;
    if (req->n_query == API_MAX_QUERY) {
        req->query_overflow = true;
        return MHD_NO;
    }
    req->query[req->n_query++] = (api_kv_t){key, value ? value : ""};
    return MHD_YES;
}

/* api_query_peek_fn over a connection whose body has not arrived yet. */
static const char *query_peek(void *cls, const char *key)
{
    return MHD_lookup_connection_value(cls, MHD_GET_ARGUMENT_KIND, key);
}

static void respond_too_large(conn_ctx_t *ctx)
{
    api_respond_error(&ctx->req, 413, "payload_too_large", "body",
                      "the request body exceeds the limit of %" PRIu64 " bytes",
                      ctx->req.cfg->max_body_bytes);
}

static void respond_upload_failed(conn_ctx_t *ctx)
{
    int err = -ctx->body.upload_err;
    bool full = err == ENOSPC || err == EDQUOT;
    api_respond_error(&ctx->req, full ? 507 : 500, full ? "insufficient_storage" : "internal",
                      "body", "the upload could not be stored: %s", strerror(err));
}

/* Fills req's method, path, query and the headers handlers read, once. */
static void request_read(conn_ctx_t *ctx, const char *method, const char *url)
{
    api_request_t *req = &ctx->req;
    struct MHD_Connection *conn = ctx->conn;
    if (ctx->read) return;
    ctx->read = true;
    req->method = method;
    req->path = url;
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, collect_query, req);
    req->accept = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
    req->content_type =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    req->idempotency_key = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Idempotency-Key");
    req->json_length = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Gpujob-Json-Length");
}

/* MHD_OPTION_URI_LOG_CALLBACK: the request's context, made as its line is parsed, while its
 * target is still as the client sent it. Its result becomes the request's first *con_cls; NULL
 * when out of memory, which request_begin answers by closing the connection. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)cls;
    (void)conn;
    conn_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->target_len = strlen(uri);
    ctx->target_bad = http_target_is_bad(uri);
    return ctx;
}

/* What a pass over a request's header fields finds: the framing headers counted, a name or a
 * value that breaks RFC 9110, and the head walked for hidden bytes (http_strict.h). */
typedef struct header_scan {
    int content_length, transfer_encoding;
    bool bad_name;         /* a field's name is no token */
    const char *bad_value; /* the name of the first field whose value holds a control byte */
    http_head_walk_t walk;
    bool walking;
} header_scan_t;

static enum MHD_Result scan_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                  size_t key_size, const char *value, size_t value_size)
{
    header_scan_t *n = cls;
    (void)kind;
    n->content_length += strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0;
    n->transfer_encoding += strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0;
    n->bad_name |= !http_is_token(key, key_size);
    if (!n->bad_value && value && http_value_has_control(value, value_size)) n->bad_value = key;
    if (n->walking) http_head_walk_field(&n->walk, key, key_size, value, value_size);
    return MHD_YES;
}

/* Refuses with 400, before anything routes it, a request line or a header field that breaks
 * the grammar (a method or a field name that is no token, a target or a field value with a
 * control byte, a NUL anywhere: RFC 9112 3 and 5), what a proxy in front of us could read
 * differently (more than one Content-Length, or one beside Transfer-Encoding: request
 * smuggling), and HTTP/1.1 without Host (RFC 9112, 3.2). True when answered; the connection is
 * then closed after the answer, as its framing cannot be trusted. */
static bool request_malformed(conn_ctx_t *ctx, const char *method, const char *url,
                              const char *version)
{
    header_scan_t n = {.walking = ctx->srv->head_walk};
    const union MHD_ConnectionInfo *head =
        n.walking ? MHD_get_connection_info(ctx->conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE)
                  : NULL;
    n.walking = head != NULL;
    if (n.walking)
        http_head_walk_begin(&n.walk, method, head->header_size, url, ctx->target_len, version);
    MHD_get_connection_values_n(ctx->conn, MHD_HEADER_KIND, scan_field, &n);
    api_request_t *req = &ctx->req;
    if (!http_is_token(method, strlen(method)))
        api_respond_error(req, 400, "invalid_argument", "method",
                          "the request method holds a byte no token may hold");
    else if (ctx->target_bad)
        api_respond_error(req, 400, "invalid_argument", "path",
                          "the request target holds a control character or a space");
    else if (n.bad_name)
        api_respond_error(req, 400, "invalid_argument", "headers",
                          "a header name holds a byte no token may hold (RFC 9110, 5.1)");
    else if (n.bad_value)
        api_respond_error(req, 400, "invalid_argument", "headers",
                          "the value of header '%.64s' holds a control character", n.bad_value);
    else if (n.walking && http_head_walk_end(&n.walk))
        api_respond_error(req, 400, "invalid_argument", "headers",
                          "the request line or a header field holds a NUL byte or a stray "
                          "space, or a field is folded onto the next line");
    else if (n.content_length > 1 || (n.content_length && n.transfer_encoding))
        api_respond_error(req, 400, "invalid_argument", "headers.Content-Length",
                          "more than one Content-Length, or one beside Transfer-Encoding");
    else if (strcmp(version, MHD_HTTP_VERSION_1_1) == 0 &&
             !MHD_lookup_connection_value(ctx->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST))
        api_respond_error(req, 400, "invalid_argument", "headers.Host",
                          "an HTTP/1.1 request needs a Host header");
    else
        return false;
    api_response_add_header(&req->resp, MHD_HTTP_HEADER_CONNECTION, "close");
    ctx->dispatched = true;
    ctx->body.too_large = n.content_length > 0; /* drain, do not keep, what body follows */
    return true;
}

/* Refuses a request whose address already has server.max_connections_per_ip requests in
 * flight (conn_watch_head_in), before anything of it is read, and closes its connection after
 * the answer. 429, not 503: it is this client that sends too many at once, and others are
 * served. */
static enum MHD_Result respond_too_many_in_flight(conn_ctx_t *ctx)
{
    int most = ctx->srv->env.cfg->max_connections_per_ip;
    ctx->dispatched = true;
    ctx->body.too_large = true; /* drain, do not keep, what body follows */
    api_respond_error(&ctx->req, 429, "rate_limited", "server.max_connections_per_ip",
                      "this address already has %d requests in flight, the most "
                      "server.max_connections_per_ip allows; try again when one is answered",
                      most);
    api_response_add_header(&ctx->req.resp, "Retry-After", "1");
    api_response_add_header(&ctx->req.resp, MHD_HTTP_HEADER_CONNECTION, "close");
    return send_response(ctx);
}

/* The first call of a request: creates its context, decides the user and refuses at once a
 * request past its address's share, a malformed request or a body that Content-Length says is
 * too large. */
static enum MHD_Result request_begin(listener_t *l, struct MHD_Connection *conn, const char *method,
                                     const char *url, const char *version, void **con_cls)
{
    conn_ctx_t *ctx = *con_cls;
    if (!ctx) return MHD_NO; /* on_uri was out of memory */
    ctx->begun = true;
    ctx->srv = l->srv;
    ctx->conn = conn;
    ctx->req.env = &l->srv->env;
    ctx->settings = settings_take(l->srv);
    ctx->req.cfg = api_settings_config(ctx->settings);
    ctx->req.auth = api_settings_auth(ctx->settings);
    ctx->req.conn_ops = &conn_ops;
    ctx->req.conn = ctx;
    ctx->started_us = mono_us();
    ctx->log_method = method;
    ctx->log_route = api_route_pattern(url);
    id_request(ctx->request_id);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    const conn_state_t *cs = ci ? ci->socket_context : NULL;
    ctx->watch = l->watch;
    ctx->watched = cs ? cs->watched : NULL;
    /* The headers are in: the body has its own time from now. */
    if (conn_watch_head_in(l->watch, ctx->watched,
                           mono_us() + (int64_t)l->srv->env.cfg->body_timeout_s * 1000000) < 0)
        return respond_too_many_in_flight(ctx);
    if (request_malformed(ctx, method, url, version)) return send_response(ctx);
    http_caller_t caller = {
        .over_unix = l->is_unix,
        .peer = cs ? &cs->peer : NULL,
        .authorization =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
        .host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Host"),
        .origin = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin"),
        .sec_fetch_site = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Sec-Fetch-Site"),
    };
    http_peer_log_t peer_log = {&l->srv->log_lock, &l->srv->peer_log};
    int r =
        http_request_user(&caller, ctx->req.auth, l->srv->env.tokens, &peer_log, &ctx->req.user);
    if (r < 0) {
        log_warn("Failed to identify a Unix socket peer: %s", strerror(-r));
        ctx->dispatched = true;
        api_respond_error(&ctx->req, 500, "internal", NULL, "cannot identify the peer");
        return send_response(ctx);
    }
    /* Nobody identified: answered now, before any of the body is kept or written to disk. */
    if (!ctx->req.user.name[0] && !api_route_is_anonymous(method, url)) {
        ctx->dispatched = true;
        ctx->body.too_large = true; /* drain, do not keep, what body follows */
        api_respond_unauthorized(&ctx->req);
        return send_response(ctx);
    }
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        bool known = errno == 0 && *end == '\0';
        if (known && n > ctx->req.cfg->max_body_bytes) {
            ctx->dispatched = true;
            ctx->body.too_large = true;
            respond_too_large(ctx);
            return send_response(ctx);
        }
        const char *type =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        api_body_sink_t sink =
            known ? api_body_sink(&l->srv->env, method, url, type, n, query_peek, conn)
                  : API_BODY_MEMORY;
        /* A streamed body holds a blob file or device memory until its request ends. */
        if (sink == API_BODY_FILE || sink == API_BODY_UPLOAD)
            conn_watch_body_begin(l->watch, ctx->watched);
        if (sink == API_BODY_FILE) {
            r = store_blob_stream_open(l->srv->env.cfg, &ctx->req.body_file);
            if (r < 0) ctx->body.upload_err = r;
            ctx->body.npy_head_pending = api_media_is(type, strlen(type), "application/x-npy");
        } else if (sink == API_BODY_UPLOAD) {
            /* Checked and its copy opened before any byte of the body is taken. */
            request_read(ctx, method, url);
            if (api_buffer_upload_begin(&ctx->req, n)) {
                ctx->dispatched = true;
                ctx->body.too_large = true; /* drain, do not keep, what body follows */
                return send_response(ctx);
            }
        } else if (known && n > 0) {
            /* Room for the announced body up front, but no more than a few MiB before bytes
             * actually arrive: a client's header alone must not reserve max_body_bytes. A body
             * the route holds whole anyway (an identified user's, within max_body_bytes) gets
             * all of it, so that growing never copies it; its pages are touched only as its
             * bytes arrive. */
            size_t want = n < BODY_PREALLOC_MAX || sink == API_BODY_MEMORY_WHOLE
                              ? (size_t)n + 1
                              : BODY_PREALLOC_MAX;
            ctx->req.body = malloc(want);
            ctx->body.cap = ctx->req.body ? want : 0;
        }
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    conn_ctx_t *ctx = *con_cls;
    if (!ctx || !ctx->begun) return request_begin(cls, conn, method, url, version, con_cls);
    if (*upload_data_size) {
        if (!ctx->responded)
            http_body_append(&ctx->body, &ctx->req, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    /* The whole request is in: no deadline while it is answered. */
    conn_watch_set_deadline(ctx->watch, ctx->watched, 0);
    conn_watch_body_end(ctx->watch, ctx->watched);
    if (ctx->responded) return MHD_YES;
    if (ctx->dispatched) {
        /* Resumed after the scheduler's reply. */
        if (!atomic_load(&ctx->reply_ready))
            api_respond_error(&ctx->req, 500, "internal", NULL, "resumed without a reply");
        return send_response(ctx);
    }
    ctx->dispatched = true;
    if (ctx->body.too_large || ctx->body.upload_err) {
        if (ctx->body.too_large)
            respond_too_large(ctx);
        else
            respond_upload_failed(ctx);
        return send_response(ctx);
    }
    api_request_t *req = &ctx->req;
    request_read(ctx, method, url);
    if (api_dispatch(req) == API_PENDING) {
        /* Posted: from now a close by the client is noticed (conn_watch_arm). */
        conn_watch_arm(ctx->watch, ctx->watched, conn_client_gone, ctx);
        return MHD_YES;
    }
    return send_response(ctx);
}

/* MHD's completion notice: the request is over (answered, or the client went away). */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    conn_ctx_t *ctx = *con_cls;
    if (!ctx) return;
    if (!ctx->begun) {
        /* A request libmicrohttpd answered itself (a malformed line, headers too large). */
        free(ctx);
        *con_cls = NULL;
        return;
    }
    /* A kept-alive connection's next request: idle time, then the time for its headers. */
    const config_t *cfg = ctx->srv->env.cfg;
    conn_watch_request_end(ctx->watch, ctx->watched,
                           mono_us() +
                               (int64_t)(cfg->idle_timeout_s + cfg->header_timeout_s) * 1000000);
    conn_watch_body_end(ctx->watch, ctx->watched);
    api_request_cleanup(&ctx->req);
    free(ctx->req.body);
    store_blob_stream_abort(ctx->req.body_file);
    sched_upload_abort(ctx->req.upload);
    api_settings_unref(ctx->settings);
    free(ctx);
    *con_cls = NULL;
}

/* The text of a TCP client's address into buf; NULL when there is none. */
static const char *client_address(struct MHD_Connection *conn, char *buf, size_t size)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    const void *in =
        !sa                         ? NULL
        : sa->sa_family == AF_INET  ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
        : sa->sa_family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                                    : NULL;
    return in ? inet_ntop(sa->sa_family, in, buf, (socklen_t)size) : NULL;
}

/* MHD_OPTION_NOTIFY_CONNECTION: a connection opens (the watch lets it in, or not, and its
 * headers get their deadline; the kernel names the account at its other end) or closes (before
 * libmicrohttpd closes its socket, so the watch lets the socket go first). */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    listener_t *l = cls;
    api_server_t *srv = l->srv;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_state_t *cs = *socket_context;
        if (cs) conn_watch_remove(l->watch, cs->watched);
        free(cs);
        *socket_context = NULL;
        atomic_fetch_sub(&srv->env.connections[l->is_unix], 1);
        return;
    }
    atomic_fetch_add(&srv->env.connections[l->is_unix], 1);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    /* Out of memory leaves the connection unwatched (MHD's idle timeout still ends it) and
     * with nobody the kernel named. */
    conn_state_t *cs = calloc(1, sizeof *cs);
    if (cs && ci) {
        int64_t deadline = mono_us() + (int64_t)srv->env.cfg->header_timeout_s * 1000000;
        char addr[INET6_ADDRSTRLEN];
        const char *client = l->is_unix ? NULL : client_address(conn, addr, sizeof addr);
        (void)conn_watch_add(l->watch, ci->connect_fd, client, deadline, &cs->watched);
        api_settings_t *st = l->is_unix ? NULL : settings_take(srv);
        http_peer_lookup(ci->connect_fd, l->is_unix, st ? api_settings_auth(st) : NULL, &cs->peer);
        api_settings_unref(st);
    } else if (cs) {
        cs->peer.err = -EIO;
    }
    *socket_context = cs;
}

/* The rate limit of one kind of line: the slot of fmt, or the last slot, shared by the
 * kinds that do not fit. Log lock held. */
static conn_ratelimit_t *mhd_log_kind(api_server_t *srv, const char *fmt)
{
    for (int i = 0; i < MHD_LOG_KINDS - 1; i++) {
        mhd_log_kind_t *k = &srv->log_kinds[i];
        if (!k->fmt) k->fmt = fmt;
        if (k->fmt == fmt) return &k->rl;
    }
    return &srv->log_kinds[MHD_LOG_KINDS - 1].rl;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    api_server_t *srv = cls;
    pthread_mutex_lock(&srv->log_lock);
    long held = 0;
    bool pass = conn_ratelimit_pass(mhd_log_kind(srv, fmt), mono_us(), &held);
    pthread_mutex_unlock(&srv->log_lock);
    if (!pass) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    if (held)
        log_warn("http: %s (and %ld more like it)", line, held);
    else
        log_warn("http: %s", line);
}

/* --- listening --- */

static unsigned daemon_flags(void)
{
    unsigned poll =
        MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL;
    /* MHD_USE_ITC: MHD_quiesce_daemon needs it with a thread pool. */
    return MHD_USE_INTERNAL_POLLING_THREAD | poll | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME |
           MHD_USE_ITC;
}

/* The options both listeners share: threads, limits, timeouts, and the callbacks; given
 * first, as MHD wants its logger before any option that may log. */
#define COMMON_OPTIONS(srv, listener)                                                              \
    {                                                                                              \
        {MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)on_mhd_log, (srv)},                                 \
            {MHD_OPTION_THREAD_POOL_SIZE, (srv)->env.cfg->http_threads, NULL},                     \
            {MHD_OPTION_CONNECTION_LIMIT, (srv)->max_connections, NULL},                           \
            {MHD_OPTION_CONNECTION_TIMEOUT, (srv)->env.cfg->idle_timeout_s, NULL},                 \
            {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, NULL},                           \
            {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, (listener)},                   \
            {MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)on_uri, NULL},                                 \
        {                                                                                          \
            MHD_OPTION_END, 0, NULL                                                                \
        }                                                                                          \
    }

/* Sets up the listener l of srv and its watch: at most half of its connections may await
 * their request's head, so that the other half stays for requests whose heads are in; over
 * TCP, an address has at most server.max_connections_per_ip requests in flight. */
static int listener_init(api_server_t *srv, listener_t *l, bool is_unix, bool tls)
{
    *l = (listener_t){srv, is_unix, tls, NULL};
    conn_watch_limits_t limits = {
        .awaiting_max = (uint32_t)(srv->max_connections > 1 ? srv->max_connections / 2 : 1),
        .in_flight_per_addr = is_unix ? 0 : srv->env.cfg->max_connections_per_ip,
    };
    return conn_watch_new(is_unix ? "unix" : "tcp", &limits, &l->watch);
}

/* Listens on host:port, or on `inherited`, a socket the previous process bound to them. */
static int start_tcp(api_server_t *srv, const char *host, int port, int inherited)
{
    const config_t *cfg = srv->env.cfg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port_str[16];
    snprintf(port_str, sizeof port_str, "%d", port);
    int r = getaddrinfo(host, port_str, &hints, &ai);
    if (r != 0)
        return log_error_errno(-EINVAL, "Failed to resolve listen address '%s': %s", host,
                               gai_strerror(r));
    bool v6 = ai->ai_family == AF_INET6;
    bool tls = config_tls_enabled(cfg);
    unsigned flags = daemon_flags() | (v6 ? MHD_USE_IPv6 : 0) | (tls ? MHD_USE_TLS : 0);
    r = listener_init(srv, &srv->tcp_listener, false, tls);
    http_tls_files_t pem = {0};
    if (r >= 0 && tls) r = http_tls_files_load(cfg->tls_cert, cfg->tls_key, &pem);
    if (r < 0) {
        freeaddrinfo(ai);
        return r;
    }
    /* Empty without TLS: MHD takes MHD_OPTION_END as the end of the array. */
    struct MHD_OptionItem tls_options[] = {
        tls ? (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, pem.cert}
            : (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, pem.key},
        {MHD_OPTION_END, 0, NULL}};
    /* Either bind (address and reuse) or take the inherited socket. */
    struct MHD_OptionItem bind_options[] = {
        inherited >= 0 ? (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, inherited, NULL}
                       : (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, ai->ai_addr},
        {MHD_OPTION_LISTENING_ADDRESS_REUSE, inherited < 0, NULL},
        {MHD_OPTION_END, 0, NULL}};
    struct MHD_OptionItem common[] = COMMON_OPTIONS(srv, &srv->tcp_listener);
    srv->tcp = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, &srv->tcp_listener,
                                MHD_OPTION_ARRAY, common, MHD_OPTION_ARRAY, bind_options,
                                MHD_OPTION_ARRAY, tls_options, MHD_OPTION_LISTEN_BACKLOG_SIZE,
                                (unsigned)API_LISTEN_BACKLOG, MHD_OPTION_END);
    freeaddrinfo(ai);
    /* GnuTLS holds its own copy of the key from here on. */
    http_tls_files_clear(&pem);
    if (!srv->tcp)
        return log_error_errno(-EADDRNOTAVAIL, "Failed to listen on '%s' (port %d)", host, port);
    struct sockaddr_storage bound;
    socklen_t len = sizeof bound;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->tcp, MHD_DAEMON_INFO_LISTEN_FD);
    int bound_port = port; /* port 0 resolved: tests and scripts read it from this line */
    if (info && getsockname(info->listen_fd, (struct sockaddr *)&bound, &len) == 0)
        bound_port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                       : ((struct sockaddr_in *)&bound)->sin_port);
    log_info("listening on http%s://%s%s%s:%d", tls ? "s" : "", v6 ? "[" : "", host, v6 ? "]" : "",
             bound_port);
    return 0;
}

/* Gives the socket file at path the configured group and permissions (server.
 * unix_socket_group, unix_socket_mode): who may connect to it. */
static int unix_socket_access(const config_t *cfg, const char *path)
{
    if (cfg->unix_socket_group[0]) {
        char buf[16384];
        struct group gr, *found = NULL;
        int e = getgrnam_r(cfg->unix_socket_group, &gr, buf, sizeof buf, &found);
        if (e != 0 || !found)
            return log_error_errno(-(e ? e : ENOENT),
                                   "server.unix_socket_group: no group '%s' on this host",
                                   cfg->unix_socket_group);
        if (chown(path, (uid_t)-1, found->gr_gid) < 0) {
            int r = -errno;
            return log_error_errno(r,
                                   "Failed to give the Unix socket '%s' to group '%s': %s (the "
                                   "daemon's user must be a member of it: SupplementaryGroups= "
                                   "in the systemd unit)",
                                   path, cfg->unix_socket_group, strerror(-r));
        }
    }
    if (chmod(path, config_unix_socket_mode(cfg)) < 0) {
        int r = -errno;
        return log_error_errno(r, "Failed to set the mode of the Unix socket '%s': %s", path,
                               strerror(-r));
    }
    return 0;
}

/* A new socket at path, listening, with the group and permissions of cfg. */
static int bind_unix(const config_t *cfg, const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return log_error_errno(-ENAMETOOLONG, "Unix socket path '%s' is too long", path);
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);

    /* A socket file left by a previous run is stale: nothing else may own our path. */
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return log_error_errno(-EEXIST, "'%s' exists and is not a socket", path);
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int r = -errno;
        return log_error_errno(r, "Failed to create a Unix socket: %s", strerror(-r));
    }
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        int r = -errno;
        close(fd);
        return log_error_errno(r, "Failed to listen on '%s': %s", path, strerror(-r));
    }
    /* Until then the file has the umask's permissions, which admit no more than these. */
    int r = unix_socket_access(cfg, path);
    if (r == 0 && listen(fd, API_LISTEN_BACKLOG) < 0) {
        r = -errno;
        log_error("Failed to listen on '%s': %s", path, strerror(-r));
    }
    if (r < 0) {
        close(fd);
        unlink(path);
        return r;
    }
    return fd;
}

/* Serves the Unix socket at path: a new one, or `inherited`, the previous process's. */
static int start_unix(api_server_t *srv, const char *path, int inherited)
{
    int fd = inherited >= 0 ? inherited : bind_unix(srv->env.cfg, path);
    if (fd < 0) return fd;
    snprintf(srv->unix_path, sizeof srv->unix_path, "%s", path);
    int r = listener_init(srv, &srv->unix_listener, true, false);
    if (r < 0) {
        close(fd);
        unlink(path);
        srv->unix_path[0] = '\0';
        return r;
    }
    /* A daemon of its own, with its own threads and connection limit: TCP clients that take
     * every TCP slot leave the Unix socket served. */
    struct MHD_OptionItem common[] = COMMON_OPTIONS(srv, &srv->unix_listener);
    srv->local =
        MHD_start_daemon(daemon_flags(), 0, NULL, NULL, on_request, &srv->unix_listener,
                         MHD_OPTION_ARRAY, common, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_END);
    if (!srv->local) {
        close(fd);
        unlink(path);
        srv->unix_path[0] = '\0';
        return log_error_errno(-EIO, "Failed to serve on Unix socket '%s'", path);
    }
    log_info("listening on unix:%s", path);
    return 0;
}

/* Descriptors the daemon holds besides its connections, at most: 256 for its own (logs, the
 * lock, epoll and event descriptors, the GPUs' device nodes, the token store), and the files
 * of a store connection (each shard's database, WAL and shared memory) for the loop, the
 * integrity check and each reader: one per HTTP thread of each listener, per worker (CPU
 * threads, or a GPU's workers) and per syncer. */
static long fds_reserved(const config_t *cfg)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN), workers = cfg->cpu_threads;
    if (workers == 0) workers = cores > 0 ? cores : 1;
    long connections = 2 * cfg->http_threads + workers + 16;
    return 256 + 3L * cfg->shards * connections;
}

/* A connection holds its socket and, while its body streams into one, a blob file. */
#define FDS_PER_CONNECTION 2
/* libmicrohttpd (0.9.75 to 1.0.1 at least) takes at most 128 events from one epoll_wait and,
 * when it gets that many, waits again with the same timeout before it handles any: an HTTP
 * thread whose sockets all became ready at once (every client of a burst closing) sleeps
 * until its next connection timeout, holding them. A thread's epoll set holds its connections,
 * the listening socket, its wake-up channel and, with TLS, one more: with at most this many
 * connections a thread, one epoll_wait never returns 128 events. */
#define CONNECTIONS_PER_THREAD_MAX 124

/* The connection limit of each listener: server.max_connections, or with 0 as many as the
 * descriptor limit (RLIMIT_NOFILE, which daemon/main.c raised to its hard limit) fits, and at
 * most CONNECTIONS_PER_THREAD_MAX a thread either way. A configured limit the descriptors
 * cannot carry is refused: past it accept() would fail with EMFILE, which stops
 * libmicrohttpd's accepting for everyone. */
static int connection_limit(const config_t *cfg, int *ret)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return log_error_errno(-errno, "Failed to read the descriptor limit: %s", strerror(errno));
    long listeners = cfg->unix_socket[0] ? 2 : 1, reserved = fds_reserved(cfg);
    long have = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT_MAX ? INT_MAX : (long)rl.rlim_cur;
    long fit = (have - reserved) / (FDS_PER_CONNECTION * listeners);
    long most = (long)CONNECTIONS_PER_THREAD_MAX * cfg->http_threads;
    int limit = cfg->max_connections;
    if (limit == 0 && fit >= 1) {
        limit = (int)(fit < most ? fit : most);
        if (fit < most)
            log_warn("the descriptor limit (%ld) fits %ld HTTP connections a listener, fewer "
                     "than %ld: raise it (LimitNOFILE= in the unit, ulimit -n)",
                     have, fit, most);
    } else if (limit > most) {
        log_warn("server.max_connections = %d is more than %d a thread of server.http_threads "
                 "(%d), which libmicrohttpd can stall on: serving %ld",
                 limit, CONNECTIONS_PER_THREAD_MAX, cfg->http_threads, most);
        limit = (int)most;
    }
    if (limit > 0 && limit <= fit) {
        log_info("HTTP connections: at most %d a listener, %d of them waiting for their "
                 "headers (descriptor limit %ld)",
                 limit, limit > 1 ? limit / 2 : 1, have);
        *ret = limit;
        return 0;
    }
    if (cfg->max_connections == 0)
        return log_error_errno(-EMFILE,
                               "the descriptor limit (%ld) leaves no room for HTTP connections: "
                               "the rest of the daemon may take %ld; raise it (LimitNOFILE= in "
                               "the unit, ulimit -n)",
                               have, reserved);
    long want = cfg->max_connections;
    return log_error_errno(-EMFILE,
                           "server.max_connections = %ld needs %ld file descriptors (%ld per "
                           "connection on %ld listener(s), and %ld for the rest of the daemon), "
                           "and the limit is %ld: lower max_connections or raise the limit "
                           "(LimitNOFILE= in the unit, ulimit -n)",
                           want, want * FDS_PER_CONNECTION * listeners + reserved,
                           (long)FDS_PER_CONNECTION, listeners, reserved, have);
}

int api_server_start(const config_t *cfg, sched_t *sched, gpu_metrics_t *gpu_metrics,
                     const api_auth_t *auth, const api_listeners_t *inherited, api_server_t **ret)
{
    char host[256];
    int port = 0;
    int r = config_listen_addr(cfg, host, sizeof host, &port);
    if (r < 0) return log_error_errno(r, "Invalid listen address '%s'", cfg->listen);
    api_server_t *srv = calloc(1, sizeof *srv);
    if (!srv) return -ENOMEM;
    srv->env.cfg = cfg;
    srv->env.sched = sched;
    srv->env.gpu_metrics = gpu_metrics;
    srv->env.reader = thread_reader;
    srv->env.find_op = op_find;
    srv->env.tokens = auth ? auth->tokens : NULL;
    srv->generation = atomic_fetch_add(&server_generation, 1) + 1;
    srv->head_walk = strncmp(MHD_get_version(), "0.9.", 4) == 0;
    pthread_mutex_init(&srv->readers_lock, NULL);
    pthread_mutex_init(&srv->log_lock, NULL);
    pthread_mutex_init(&srv->settings_lock, NULL);
    r = api_settings_new(cfg, auth ? auth->settings : NULL, false, &srv->settings);
    if (r >= 0) r = api_users_new(&srv->env.users);
    if (r >= 0) r = connection_limit(cfg, &srv->max_connections);
    if (r < 0) {
        api_users_free(srv->env.users);
        api_settings_unref(srv->settings);
        pthread_mutex_destroy(&srv->settings_lock);
        pthread_mutex_destroy(&srv->log_lock);
        pthread_mutex_destroy(&srv->readers_lock);
        free(srv);
        return r;
    }
    /* After a restart (api_server_keep_listeners), the sockets are already there. */
    api_listeners_t fds = inherited ? *inherited : (api_listeners_t){-1, -1};
    if (fds.tcp >= 0) fcntl(fds.tcp, F_SETFD, FD_CLOEXEC);
    if (fds.local >= 0) fcntl(fds.local, F_SETFD, FD_CLOEXEC);
    /* The Unix socket first: the TCP listener's line, which scripts wait for, then means that
     * both are there. */
    r = 0;
    if (cfg->unix_socket[0])
        r = start_unix(srv, cfg->unix_socket, fds.local);
    else if (fds.local >= 0)
        close(fds.local);
    if (r >= 0) r = start_tcp(srv, host, port, fds.tcp);
    if (r < 0) {
        api_server_free(srv);
        return r;
    }
    *ret = srv;
    return 0;
}

void api_server_stop_intake(api_server_t *srv)
{
    if (srv) atomic_store(&srv->env.intake_stopped, true);
}

/* MHD stops accepting, and keeps the listening socket open for the next process: connections
 * that come meanwhile wait in its backlog. */
static int keep_listener(struct MHD_Daemon *d)
{
    if (!d) return -1;
    int fd = MHD_quiesce_daemon(d);
    if (fd < 0 || fcntl(fd, F_SETFD, 0) < 0) return -1;
    return fd;
}

api_listeners_t api_server_keep_listeners(api_server_t *srv)
{
    if (!srv) return (api_listeners_t){-1, -1};
    api_listeners_t kept = {keep_listener(srv->tcp), keep_listener(srv->local)};
    if (kept.local >= 0) srv->unix_path[0] = '\0'; /* the next process serves it */
    return kept;
}

void api_server_free(api_server_t *srv)
{
    if (!srv) return;
    long pending = atomic_load(&srv->pending);
    if (pending)
        log_error("Stopping the HTTP server with %ld requests still waiting for the scheduler",
                  pending);
    /* MHD closes the listening sockets it was given along with the daemons. */
    if (srv->tcp) MHD_stop_daemon(srv->tcp);
    if (srv->local) MHD_stop_daemon(srv->local);
    if (srv->unix_path[0]) unlink(srv->unix_path);
    conn_watch_free(srv->tcp_listener.watch);
    conn_watch_free(srv->unix_listener.watch);
    api_users_free(srv->env.users);
    api_settings_unref(srv->settings);
    pthread_mutex_destroy(&srv->settings_lock);
    pthread_mutex_destroy(&srv->log_lock);
    for (reader_entry_t *e = srv->readers, *next; e; e = next) {
        next = e->next;
        store_reader_close(e->rd);
        free(e);
    }
    pthread_mutex_destroy(&srv->readers_lock);
    free(srv);
}
