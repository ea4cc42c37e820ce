/* The router: one table of {method, pattern, handler}, a matcher that falls through to 404 and
 * 405, and the small helpers every handler uses to read a request and fill a response. */
#include "api_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ctype.h>

static const api_route_t routes[] = {
    {"GET", "/healthz", api_handle_healthz},
    {"GET", "/readyz", api_handle_readyz},
    {"GET", "/metrics", api_handle_metrics},
    {"GET", "/v1/info", api_handle_info},
    {"POST", "/v1/jobs", api_handle_jobs_submit},
    {"GET", "/v1/jobs", api_handle_jobs_list},
    {"GET", "/v1/jobs/{id}", api_handle_job_get},
    {"DELETE", "/v1/jobs/{id}", api_handle_job_cancel},
    {"GET", "/v1/jobs/{id}/wait", api_handle_job_wait},
    {"GET", "/v1/jobs/{id}/outputs/{name}", api_handle_job_output},
    {"POST", "/v1/buffers", api_handle_buffer_put},
    {"GET", "/v1/buffers/{id}", api_handle_buffer_get},
    {"DELETE", "/v1/buffers/{id}", api_handle_buffer_delete},
    {"GET", "/v1/usage", api_handle_usage},
};

const api_route_t *api_routes(size_t *ret_n)
{
    *ret_n = sizeof routes / sizeof routes[0];
    return routes;
}

/* Matches path against pattern, capturing {name} segments into m. */
static bool pattern_match(const char *pattern, const char *path, api_route_match_t *m)
{
    m->n_params = 0;
    const char *p = pattern, *s = path;
    while (*p && *s) {
        if (*p != '/' || *s != '/') return false;
        p++, s++;
        size_t plen = strcspn(p, "/"), slen = strcspn(s, "/");
        if (plen >= 2 && p[0] == '{' && p[plen - 1] == '}') {
            if (slen == 0 || slen >= API_PATH_PARAM_SIZE || m->n_params == API_MAX_PATH_PARAMS)
                return false;
            snprintf(m->names[m->n_params], sizeof m->names[0], "%.*s", (int)(plen - 2), p + 1);
            memcpy(m->values[m->n_params], s, slen);
            m->values[m->n_params][slen] = '\0';
            m->n_params++;
        } else if (plen != slen || memcmp(p, s, plen) != 0) {
            return false;
        }
        p += plen, s += slen;
    }
    return *p == '\0' && *s == '\0';
}

void api_route_match(const api_route_t *table, size_t n, const char *method, const char *path,
                     api_route_match_t *ret)
{
    memset(ret, 0, sizeof *ret);
    ret->status = 404;
    for (size_t i = 0; i < n; i++) {
        api_route_match_t m;
        if (!pattern_match(table[i].pattern, path, &m)) continue;
        if (strcmp(table[i].method, method) == 0) {
            m.route = &table[i];
            m.status = 200;
            memcpy(m.allow, ret->allow, sizeof m.allow);
            *ret = m;
            return;
        }
        ret->status = 405;
        size_t used = strlen(ret->allow);
        if (!strstr(ret->allow, table[i].method))
            snprintf(ret->allow + used, sizeof ret->allow - used, "%s%s", used ? ", " : "",
                     table[i].method);
    }
}

int api_dispatch(api_request_t *req)
{
    size_t n;
    const api_route_t *table = api_routes(&n);
    api_route_match_t m;
    api_route_match(table, n, req->method, req->path, &m);
    if (m.status == 404) {
        api_respond_error(req, 404, "not_found", NULL, "no such path '%s'", req->path);
        return API_DONE;
    }
    if (m.status == 405) {
        api_respond_error(req, 405, "method_not_allowed", NULL, "'%s' takes %s, not %s", req->path,
                          m.allow, req->method);
        api_response_add_header(&req->resp, "Allow", "%s", m.allow);
        return API_DONE;
    }
    req->n_path_params = m.n_params;
    memcpy(req->path_param_names, m.names, sizeof m.names);
    memcpy(req->path_param_values, m.values, sizeof m.values);
    if (req->query_overflow) {
        api_respond_error(req, 400, "invalid_argument", "query", "more than %d query arguments",
                          API_MAX_QUERY);
        return API_DONE;
    }
    if (strcmp(req->method, "POST") == 0 && atomic_load(&req->env->intake_stopped)) {
        api_respond_error(req, 503, "unavailable", NULL, "the daemon is shutting down");
        api_response_add_header(&req->resp, "Retry-After", "5");
        return API_DONE;
    }
    return m.route->handler(req);
}

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
    json_decref(req->submit_answer);
    req->submit_answer = NULL;
}

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

int api_query_check(api_request_t *req, const char *const *allowed)
{
    for (int i = 0; i < req->n_query; i++) {
        bool known = false;
        for (const char *const *a = allowed; *a && !known; a++)
            known = strcmp(*a, req->query[i].key) == 0;
        if (!known) {
            char field[80];
            snprintf(field, sizeof field, "query.%.60s", req->query[i].key);
            api_respond_error(req, 400, "invalid_argument", field, "unknown query argument '%.60s'",
                              req->query[i].key);
            return API_DONE;
        }
    }
    return 0;
}

void api_request_suspend(api_request_t *req)
{
    req->conn_ops->suspend(req);
}

void api_request_resume(api_request_t *req)
{
    req->conn_ops->resume(req);
}

void api_respond_json(api_request_t *req, int status, json_t *json)
{
    response_clear(&req->resp);
    req->resp.status = status;
    req->resp.json = json;
    req->resp.content_type = "application/json";
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

void api_response_build(api_request_t *req)
{
    api_response_t *resp = &req->resp;
    if (!resp->jobs) return;
    api_respond_json(req, resp->status, api_jobs_json(resp->jobs, resp->n_jobs, resp->jobs_list));
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

const char *api_status_code_name(int status)
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
    json_t *error = json_pack("{s:s, s:s}", "code", code ? code : api_status_code_name(status),
                              "message", message);
    /* A message quoting the client's bytes may not be valid UTF-8: keep the code at least. */
    if (!error)
        error = json_pack("{s:s, s:s}", "code", api_status_code_name(status), "message",
                          "(message not representable)");
    if (field && *field) json_object_set_new(error, "field", json_string(field));
    api_respond_json(req, status, json_pack("{s:o}", "error", error));
}

void api_respond_api_error(api_request_t *req, const api_error_t *err)
{
    api_respond_error(req, err->status, err->code, err->field, "%s", err->message);
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
    default:
        status = 500;
        break;
    }
    api_respond_error(req, status, NULL, NULL, "%s",
                      message && *message ? message : strerror(err < 0 ? -err : err));
    if (status == 429) api_response_add_header(&req->resp, "Retry-After", "1");
}

void api_response_add_header(api_response_t *resp, const char *name, const char *fmt, ...)
{
    if (resp->n_headers == API_MAX_EXTRA_HEADERS) return;
    api_header_t *h = &resp->headers[resp->n_headers++];
    snprintf(h->name, sizeof h->name, "%s", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->value, sizeof h->value, fmt, ap);
    va_end(ap);
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

bool api_media_is(const char *item, size_t len, const char *type)
{
    while (len && isspace((unsigned char)*item))
        item++, len--;
    size_t n = 0;
    while (n < len && item[n] != ';' && !isspace((unsigned char)item[n]))
        n++;
    return n == strlen(type) && strncasecmp(item, type, n) == 0;
}
