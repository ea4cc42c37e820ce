/* The router: one table of {method, pattern, handler}, a matcher, and the dispatch that falls
 * through to 404 and 405. */
#include "api_internal.h"

#include <stdio.h>
#include <string.h>

static const api_route_t routes[] = {
    {"GET", "/healthz", api_handle_healthz, NULL, true},
    {"GET", "/readyz", api_handle_readyz, NULL, true},
    {"GET", "/metrics", api_handle_metrics, NULL, false},
    {"GET", "/v1/info", api_handle_info, NULL, false},
    {"POST", "/v1/jobs", api_handle_jobs_submit, NULL, false},
    {"GET", "/v1/jobs", api_handle_jobs_list, NULL, false},
    {"GET", "/v1/jobs/{id}", api_handle_job_get, NULL, false},
    {"DELETE", "/v1/jobs/{id}", api_handle_job_cancel, NULL, false},
    {"GET", "/v1/jobs/{id}/wait", api_handle_job_wait, NULL, false},
    {"GET", "/v1/jobs/{id}/outputs/{name}", api_handle_job_output, NULL, false},
    {"POST", "/v1/buffers", api_handle_buffer_put, api_buffer_put_streams_body, false},
    {"GET", "/v1/buffers/{id}", api_handle_buffer_get, NULL, false},
    {"DELETE", "/v1/buffers/{id}", api_handle_buffer_delete, NULL, false},
    {"GET", "/v1/usage", api_handle_usage, NULL, false},
    {"POST", "/v1/tokens", api_handle_tokens_create, NULL, false},
    {"GET", "/v1/tokens", api_handle_tokens_list, NULL, false},
    {"DELETE", "/v1/tokens/{id}", api_handle_token_revoke, NULL, false},
    {"GET", "/v1/stats", api_handle_stats, NULL, false},
    {"GET", "/", api_handle_ui_index, NULL, true},
    {"GET", "/ui/session", api_handle_ui_session, NULL, true},
    {"GET", "/ui/{file}", api_handle_ui_file, NULL, true},
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
    api_route_match_t m;
    api_route_match(routes, sizeof routes / sizeof routes[0], req->method, req->path, &m);
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
    if (!req->user.name[0] && !m.route->anonymous) {
        api_respond_unauthorized(req);
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
    /* The probes and /metrics stay outside the users' rate: only /v1/ is counted. */
    if (strncmp(req->path, "/v1/", 4) == 0 && !api_rate_admits(req)) return API_DONE;
    if (strcmp(req->method, "POST") == 0 && atomic_load(&req->env->intake_stopped)) {
        api_respond_error(req, 503, "unavailable", NULL, "the daemon is shutting down");
        api_response_add_header(&req->resp, "Retry-After", "5");
        return API_DONE;
    }
    return m.route->handler(req);
}

bool api_route_is_anonymous(const char *method, const char *path)
{
    api_route_match_t m;
    api_route_match(routes, sizeof routes / sizeof routes[0], method, path, &m);
    return !m.route || m.route->anonymous;
}

const char *api_route_pattern(const char *path)
{
    api_route_match_t m;
    for (size_t i = 0; path && i < sizeof routes / sizeof routes[0]; i++)
        if (pattern_match(routes[i].pattern, path, &m)) return routes[i].pattern;
    return NULL;
}

api_body_sink_t api_body_sink(const api_env_t *env, const char *method, const char *path,
                              const char *content_type, uint64_t length, api_query_peek_fn peek,
                              void *cls)
{
    api_route_match_t m;
    api_route_match(routes, sizeof routes / sizeof routes[0], method, path, &m);
    if (!m.route || !m.route->streams_body) return API_BODY_MEMORY;
    return m.route->streams_body(env, content_type, length, peek, cls);
}
