/* HTTP requests through the API's router and handlers (api/api_internal.h) with the fake
 * scheduler and store of tests/support/api_fakes.c, as the HTTP adapter hands them over: the
 * route and path parameters, the query arguments, the headers the handlers read (among them
 * Gpujob-Json-Length, which frames a job body as JSON then a binary section) and the body.
 *
 * Input layout, as text: "METHOD URL" on the first line, then "Name: value" header lines, an
 * empty line, and the body (any bytes). The header "User" names the caller ("root" is an
 * admin). Every request must be answered with a status in [200, 599], once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_internal.h"
#include "support/api_fakes.h"

static config_t cfg;
static api_env_t env;
static int suspends, resumes;

static store_reader_t *fuzz_reader(api_env_t *e)
{
    return fake_reader();
}

static void fuzz_suspend(api_request_t *req)
{
    suspends++;
}

static void fuzz_resume(api_request_t *req)
{
    resumes++;
}

static const api_conn_ops_t conn_ops = {fuzz_suspend, fuzz_resume};

/* The request's strings, NUL-terminated copies of the input's pieces. */
typedef struct fuzz_req {
    char method[16], url[1024], user[OWNER_SIZE];
    char accept[128], content_type[128], idem_key[128], json_length[32];
} fuzz_req_t;

/* Copies the next line of in (at most size - 1 bytes of it) into buf; false at the end. */
static bool take_line(const uint8_t **p, const uint8_t *end, char *buf, size_t size)
{
    if (*p >= end) return false;
    const uint8_t *nl = memchr(*p, '\n', (size_t)(end - *p));
    size_t len = (size_t)((nl ? nl : end) - *p);
    snprintf(buf, size, "%.*s", (int)len, (const char *)*p);
    *p = nl ? nl + 1 : end;
    return true;
}

static void take_header(fuzz_req_t *s, api_request_t *req, const char *line)
{
    static const struct {
        const char *name;
        size_t offset;
    } known[] = {
        {"Accept: ", offsetof(fuzz_req_t, accept)},
        {"Content-Type: ", offsetof(fuzz_req_t, content_type)},
        {"Idempotency-Key: ", offsetof(fuzz_req_t, idem_key)},
        {"Gpujob-Json-Length: ", offsetof(fuzz_req_t, json_length)},
        {"User: ", offsetof(fuzz_req_t, user)},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        size_t n = strlen(known[i].name);
        if (strncmp(line, known[i].name, n) != 0) continue;
        char *dst = (char *)s + known[i].offset;
        snprintf(dst,
                 i == 4   ? sizeof s->user
                 : i == 3 ? sizeof s->json_length
                          : 128,
                 "%s", line + n);
    }
    req->accept = s->accept[0] ? s->accept : NULL;
    req->content_type = s->content_type[0] ? s->content_type : NULL;
    req->idempotency_key = s->idem_key[0] ? s->idem_key : NULL;
    req->json_length = s->json_length[0] ? s->json_length : NULL;
}

/* Splits url into path and query arguments, as libmicrohttpd does (without decoding). */
static void take_url(char *url, api_request_t *req)
{
    char *q = strchr(url, '?');
    if (q) *q++ = '\0';
    req->path = url;
    for (char *arg = q; arg && *arg;) {
        char *next = strchr(arg, '&');
        if (next) *next++ = '\0';
        char *eq = strchr(arg, '=');
        if (eq) *eq++ = '\0';
        if (req->n_query == API_MAX_QUERY) {
            req->query_overflow = true;
            break;
        }
        req->query[req->n_query++] = (api_kv_t){arg, eq};
        arg = next;
    }
}

static void setup_once(void)
{
    config_defaults(&cfg);
    cfg.max_wait_ms = 10000;
    cfg.max_inline_output_bytes = 64;
    cfg.max_tensor_bytes = 1 << 20;
    cfg.max_jobs_per_request = 8;
    env.cfg = &cfg;
    env.reader = fuzz_reader;
    env.find_op = fake_find_op;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!env.cfg) setup_once();
    fakes_reset();
    const uint8_t *p = data, *end = data + size;
    fuzz_req_t s = {.user = "alice"};
    char line[256];
    if (!take_line(&p, end, line, sizeof line)) return 0;
    if (sscanf(line, "%15s %1023s", s.method, s.url) != 2) return 0;

    api_request_t req = {.env = &env, .cfg = &cfg, .method = s.method, .conn_ops = &conn_ops};
    take_url(s.url, &req);
    while (take_line(&p, end, line, sizeof line) && line[0])
        take_header(&s, &req, line);
    snprintf(req.user.name, sizeof req.user.name, "%s", s.user);
    req.user.admin = strcmp(s.user, "root") == 0;
    req.body_len = (size_t)(end - p);
    req.body = malloc(req.body_len + 1);
    memcpy(req.body, p, req.body_len);
    req.body[req.body_len] = '\0';

    int before = suspends;
    int r = api_dispatch(&req);
    /* The fakes answer inline: a pending request was suspended and resumed exactly once. */
    if (suspends - before != (r == API_PENDING) || suspends != resumes) __builtin_trap();
    api_response_build(&req);
    if (req.resp.status < 200 || req.resp.status > 599) __builtin_trap();
    api_request_cleanup(&req);
    free(req.body);
    return 0;
}
