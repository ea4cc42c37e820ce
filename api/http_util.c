/* Reading a request and filling its response: query and path parameters, ids, media types and
 * the Accept header, and the answers every handler gives (JSON, bytes, errors of the form
 * {"error": {"code", "message", "field"}}). Calls nothing else of api/, so that every other
 * file of the folder may call it. */
#include "api_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "daemon/util/id.h"

static void response_clear(api_response_t *resp)
{
    json_decref(resp->json);
    for (size_t i = 0; i < resp->n_jobs; i++)
        job_free(resp->jobs[i]);
    free(resp->jobs);
    free(resp->body);
    free(resp->section.bytes);
    memset(resp, 0, sizeof *resp);
}

void api_request_cleanup(api_request_t *req)
{
    response_clear(&req->resp);
    sched_gate_drop(req->answer_gate);
    req->answer_gate = NULL;
}

void api_request_suspend(api_request_t *req)
{
    req->conn_ops->suspend(req);
}

void api_request_resume(api_request_t *req)
{
    req->conn_ops->resume(req);
}

store_reader_t *api_request_reader(api_request_t *req)
{
    store_reader_t *rd = req->env->reader(req->env);
    if (!rd) api_respond_error(req, 503, "unavailable", NULL, "the store cannot be read");
    return rd;
}

const char *api_request_owner_filter(const api_request_t *req)
{
    return req->user.admin ? NULL : req->user.name;
}

bool api_request_may_see(const api_request_t *req, const char *owner)
{
    return req->user.admin || strcmp(req->user.name, owner) == 0;
}

void api_respond_unauthorized(api_request_t *req)
{
    int err = req->user.err;
    bool given = err == -EACCES || err == -EKEYEXPIRED;
    bool tokens = !req->auth || auth_settings_tokens(req->auth);
    bool peercred = req->auth && auth_settings_peercred(req->auth);
    if (err == -EPERM && req->auth) {
        char why[256];
        const char *key = auth_settings_refusal(req->auth, req->user.refused, why, sizeof why);
        api_respond_error(req, 403, "forbidden", key, "%s", why);
        return;
    }
    if (err == -EXDEV) {
        api_respond_error(req, 403, "forbidden", "headers.Origin",
                          "a request that another site's page may have sent (its Host is not "
                          "this host's loopback name, its Origin is not this daemon, or "
                          "Sec-Fetch-Site says so) is not taken as the local account: "
                          "connect to localhost, or send 'Authorization: Bearer TOKEN'");
        return;
    }
    if (given)
        api_respond_error(req, 401, "unauthorized", "headers.Authorization", "%s",
                          err == -EKEYEXPIRED ? "the token has expired"
                                              : "the token is not valid (unknown, revoked or "
                                                "malformed)");
    else if (err == -ESRCH)
        api_respond_error(req, 401, "unauthorized", "headers.Authorization",
                          "the kernel named no account for this loopback connection (its client "
                          "socket is gone, or the lookup failed; the daemon's log says which)%s",
                          tokens ? ": connect again, or send 'Authorization: Bearer TOKEN'"
                                 : ": connect again");
    else if ((err == -ENOKEY || err == 0) && !tokens)
        api_respond_error(req, 401, "unauthorized", NULL,
                          "this daemon knows only local accounts (auth.mode = peercred): "
                          "connect over loopback (localhost) or its Unix socket");
    else if (err == -ENOKEY || err == 0)
        api_respond_error(req, 401, "unauthorized", "headers.Authorization",
                          "credentials are needed: send 'Authorization: Bearer TOKEN'%s",
                          req->user.over_unix ? ""
                          : peercred          ? " (tokens: gpujob token create), or connect "
                                                "from this host over loopback as yourself"
                                              : " (tokens: gpujob token create)");
    else
        api_respond_error(req, 500, "internal", NULL, "the token could not be checked");
    if (err == -ENOKEY || err == 0 || err == -ESRCH || given)
        api_response_add_header(&req->resp, "WWW-Authenticate", "Bearer realm=\"gpujobd\"%s",
                                given ? ", error=\"invalid_token\"" : "");
}

int api_request_require_admin(api_request_t *req, const char *field, const char *what)
{
    /* A request driven without a server (tests of the handlers) has no access control. */
    if (req->user.admin || !req->auth) return 0;
    api_respond_error(req, 403, "forbidden", field,
                      "only an admin may %s ('%s' is not one: see [auth] admins)", what,
                      req->user.name);
    return API_DONE;
}

/* --- query and path parameters --- */

const char *api_query(const api_request_t *req, const char *key)
{
    for (int i = 0; i < req->n_query; i++)
        if (strcmp(req->query[i].key, key) == 0)
            return req->query[i].value ? req->query[i].value : "";
    return NULL;
}

const char *api_path_param(const api_request_t *req, const char *name)
{
    for (int i = 0; i < req->n_path_params; i++)
        if (strcmp(req->path_param_names[i], name) == 0) return req->path_param_values[i];
    return NULL;
}

/* The error field that names query argument key: "query.KEY". */
static const char *query_field(char *buf, size_t size, const char *key)
{
    snprintf(buf, size, "query.%.60s", key);
    return buf;
}

int api_query_check(api_request_t *req, const char *const *allowed)
{
    for (int i = 0; i < req->n_query; i++) {
        bool known = false;
        for (const char *const *a = allowed; *a && !known; a++)
            known = strcmp(*a, req->query[i].key) == 0;
        if (!known) {
            char field[80];
            api_respond_error(req, 400, "invalid_argument",
                              query_field(field, sizeof field, req->query[i].key),
                              "unknown query argument '%.60s'", req->query[i].key);
            return API_DONE;
        }
    }
    return 0;
}

int api_query_seconds(api_request_t *req, const char *key, double default_s, int max_ms, bool clamp,
                      int *ret_ms)
{
    double max_s = max_ms / 1000.0, s = default_s;
    const char *v = api_query(req, key);
    if (v) {
        char *end;
        s = strtod(v, &end);
        if (!*v || *end || !isfinite(s) || s < 0 || (!clamp && s > max_s)) {
            char field[80];
            api_respond_error(req, 400, "invalid_argument", query_field(field, sizeof field, key),
                              "%s must be a number of seconds in [0, %g]", key, max_s);
            return API_DONE;
        }
    }
    *ret_ms = (int)(fmin(s, max_s) * 1000.0);
    return 0;
}

int api_query_int(api_request_t *req, const char *key, long lo, long hi, long default_value,
                  long *ret)
{
    const char *v = api_query(req, key);
    if (!v) {
        *ret = default_value;
        return 0;
    }
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (!*v || *end || errno || n < lo || n > hi) {
        char field[80];
        api_respond_error(req, 400, "invalid_argument", query_field(field, sizeof field, key),
                          "%s must be an integer in [%ld, %ld]", key, lo, hi);
        return API_DONE;
    }
    *ret = n;
    return 0;
}

int api_query_bool(api_request_t *req, const char *key, bool default_value, bool *ret)
{
    const char *v = api_query(req, key);
    if (!v) {
        *ret = default_value;
        return 0;
    }
    if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0) {
        char field[80];
        api_respond_error(req, 400, "invalid_argument", query_field(field, sizeof field, key),
                          "%s must be true or false", key);
        return API_DONE;
    }
    *ret = strcmp(v, "true") == 0;
    return 0;
}

/* The kind of thing an id prefix names, for messages. */
static const char *id_kind_name(char kind)
{
    return kind == 'j' ? "job" : kind == 'b' ? "buffer" : "object";
}

int api_id_check(api_request_t *req, char kind, const char *id, const char *field)
{
    if (id_valid(kind, id)) return 0;
    api_respond_error(req, 400, "invalid_argument", field,
                      "'%.40s' is not a %s id ('%c' and 24 hex digits)", id ? id : "",
                      id_kind_name(kind), kind);
    return API_DONE;
}

/* --- media types --- */

bool api_media_is(const char *item, size_t len, const char *type)
{
    while (len && isspace((unsigned char)*item))
        item++, len--;
    size_t n = 0;
    while (n < len && item[n] != ';' && !isspace((unsigned char)item[n]))
        n++;
    return n == strlen(type) && strncasecmp(item, type, n) == 0;
}

bool api_content_type_is(const api_request_t *req, const char *type)
{
    const char *ct = req->content_type;
    return ct && api_media_is(ct, strlen(ct), type);
}

int api_accept_pick(const api_request_t *req, const char *const *media, size_t n)
{
    for (const char *item = req->accept ? req->accept : ""; *item;) {
        size_t len = strcspn(item, ",");
        for (size_t i = 0; i < n; i++)
            if (api_media_is(item, len, media[i])) return (int)i;
        item += len;
        if (*item == ',') item++;
    }
    return -1;
}

/* --- responses --- */

void api_respond_json(api_request_t *req, int status, json_t *json)
{
    response_clear(&req->resp);
    req->resp.status = status;
    req->resp.json = json;
    req->resp.content_type = "application/json";
    /* Every 503 says when to come back: the conditions behind it (a drain, a restart, a store
     * that cannot be read) pass. A handler may name a longer time. */
    if (status == 503) api_response_add_header(&req->resp, "Retry-After", "1");
    if (!json) {
        req->resp.status = 500;
        req->resp.json = json_pack("{s:{s:s, s:s}}", "error", "code", "internal", "message",
                                   "out of memory building the response");
    }
}

void api_respond_jobs_later(api_request_t *req, int status, job_t **jobs, size_t n, bool list)
{
    response_clear(&req->resp);
    req->resp.status = status;
    req->resp.jobs = jobs;
    req->resp.n_jobs = n;
    req->resp.jobs_list = list;
    req->resp.content_type = "application/json";
}

void api_respond_bytes(api_request_t *req, int status, const char *content_type, void *body,
                       size_t len)
{
    response_clear(&req->resp);
    req->resp.status = status;
    req->resp.body = body;
    req->resp.body_len = len;
    req->resp.content_type = content_type;
}

void api_response_add_header(api_response_t *resp, const char *name, const char *fmt, ...)
{
    /* A header set twice keeps the later value. */
    api_header_t *h = NULL;
    for (int i = 0; i < resp->n_headers && !h; i++)
        if (strcasecmp(resp->headers[i].name, name) == 0) h = &resp->headers[i];
    if (!h && resp->n_headers == API_MAX_EXTRA_HEADERS) return;
    if (!h) h = &resp->headers[resp->n_headers++];
    snprintf(h->name, sizeof h->name, "%s", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->value, sizeof h->value, fmt, ap);
    va_end(ap);
}

/* The error code string of an HTTP status ("invalid_argument" for 400). */
static const char *status_code_name(int status)
{
    switch (status) {
    case 400:
        return "invalid_argument";
    case 404:
        return "not_found";
    case 405:
        return "method_not_allowed";
    case 406:
        return "not_acceptable";
    case 409:
        return "conflict";
    case 413:
        return "payload_too_large";
    case 415:
        return "unsupported_media_type";
    case 429:
        return "resource_exhausted";
    case 503:
        return "unavailable";
    case 507:
        return "insufficient_storage";
    default:
        return "internal";
    }
}

void api_respond_error(api_request_t *req, int status, const char *code, const char *field,
                       const char *fmt, ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    json_t *error =
        json_pack("{s:s, s:s}", "code", code ? code : status_code_name(status), "message", message);
    /* A message quoting the client's bytes may not be valid UTF-8: keep the code at least. */
    if (!error)
        error = json_pack("{s:s, s:s}", "code", status_code_name(status), "message",
                          "(message not representable)");
    if (field && *field) json_object_set_new(error, "field", json_string(field));
    api_respond_json(req, status, json_pack("{s:o}", "error", error));
}

void api_respond_api_error(api_request_t *req, const api_error_t *err)
{
    api_respond_error(req, err->status, err->code, err->field, "%s", err->message);
}

void api_respond_not_found(api_request_t *req, char kind, const char *id, const char *field)
{
    api_respond_error(req, 404, "not_found", field, "%s '%s' not found", id_kind_name(kind), id);
}

void api_respond_errno(api_request_t *req, int err, const char *message)
{
    int status;
    switch (err) {
    case -ENOENT:
        status = 404;
        break;
    case -EBUSY:
    case -EEXIST:
        status = 409;
        break;
    case -EAGAIN:
        status = 429;
        break;
    case -ESHUTDOWN:
        status = 503;
        break;
    case -ENOSPC:
        status = 507;
        break;
    default:
        status = 500;
        break;
    }
    api_respond_error(req, status, NULL, NULL, "%s",
                      message && *message ? message : strerror(err < 0 ? -err : err));
    if (status == 429) api_response_add_header(&req->resp, "Retry-After", "1");
}
