/* The client handle and its HTTP exchanges: one libcurl easy handle per client, reset between
 * requests (curl_easy_reset keeps the connection cache, so the connection stays alive), and the
 * translation of transport failures and error answers into error values and messages. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "gpujob_internal.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_global_status = CURLE_OK;

static void curl_global_once(void)
{
    curl_global_status = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void copy_message(char *errbuf, size_t size, const char *msg)
{
    if (errbuf && size > 0) snprintf(errbuf, size, "%s", msg);
}

void gjc_clear_error(gpujob_client_t *c)
{
    c->errmsg[0] = '\0';
    c->err_code[0] = '\0';
    c->err_field[0] = '\0';
    c->http_status = 0;
}

int gjc_fail(gpujob_client_t *c, int r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    return r;
}

/* Splits an address into the base URL and the Unix socket path (NULL for TCP). A URL must
 * parse with curl's own parser, so that a typo is reported here and not as a vague transport
 * error on the first call. */
static int address_parse(const char *address, char **ret_base, char **ret_unix, char *err,
                         size_t err_size)
{
    char msg[512];
    const char *path = NULL;
    if (strncmp(address, "unix:", 5) == 0) {
        path = address + 5;
        if (strncmp(path, "//", 2) == 0) path += 2;
    } else if (address[0] == '/') {
        path = address;
    }
    if (path) {
        if (path[0] != '/') {
            snprintf(msg, sizeof msg, "Unix socket path '%s' is not absolute", path);
            copy_message(err, err_size, msg);
            return -EINVAL;
        }
        char *base = strdup("http://localhost"), *unix_path = strdup(path);
        if (!base || !unix_path) {
            free(base);
            free(unix_path);
            return -ENOMEM;
        }
        *ret_base = base;
        *ret_unix = unix_path;
        return 0;
    }
    if (strncmp(address, "http://", 7) != 0 && strncmp(address, "https://", 8) != 0) {
        snprintf(msg, sizeof msg,
                 "address '%s' is neither an http:// URL nor a Unix socket path (unix:/PATH)",
                 address);
        copy_message(err, err_size, msg);
        return -EINVAL;
    }
    CURLU *u = curl_url();
    if (!u) return -ENOMEM;
    CURLUcode uc = curl_url_set(u, CURLUPART_URL, address, 0);
    char *host = NULL;
    if (uc == CURLUE_OK) uc = curl_url_get(u, CURLUPART_HOST, &host, 0);
    curl_free(host);
    curl_url_cleanup(u);
    if (uc != CURLUE_OK) {
        snprintf(msg, sizeof msg, "malformed URL '%s': %s", address, curl_url_strerror(uc));
        copy_message(err, err_size, msg);
        return -EINVAL;
    }
    if (strchr(address, '?') || strchr(address, '#')) {
        snprintf(msg, sizeof msg, "URL '%s' must not carry a query or fragment", address);
        copy_message(err, err_size, msg);
        return -EINVAL;
    }
    char *base = strdup(address);
    if (!base) return -ENOMEM;
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        base[--n] = '\0';
    *ret_base = base;
    *ret_unix = NULL;
    return 0;
}

int gpujob_client_new(const char *address, gpujob_client_t **ret, char *errbuf, size_t errbuf_size)
{
    if (!ret) return -EINVAL;
    pthread_once(&curl_once, curl_global_once);
    if (curl_global_status != CURLE_OK) {
        copy_message(errbuf, errbuf_size, "libcurl failed to initialise");
        return -ENOMEM;
    }
    if (!address || !address[0]) address = getenv("GPUJOB_URL");
    if (!address || !address[0]) address = GPUJOB_DEFAULT_SOCKET;

    gpujob_client_t *c = calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    int r = address_parse(address, &c->base_url, &c->unix_path, errbuf, errbuf_size);
    if (r < 0) {
        free(c);
        return r;
    }
    c->address = strdup(address);
    c->curl = curl_easy_init();
    c->request_timeout_ms = 60000;
    c->connect_timeout_ms = 10000;
    c->retries = 3;
    c->binary_outputs = true;
    const char *token = getenv("GPUJOB_TOKEN");
    r = c->address && c->curl ? 0 : -ENOMEM;
    if (r == 0 && token && token[0]) r = gpujob_client_set_token(c, token);
    if (r < 0) {
        /* The message never quotes the token. */
        if (r == -EINVAL)
            copy_message(errbuf, errbuf_size, "$GPUJOB_TOKEN holds a space or control character");
        gpujob_client_free(c);
        return r;
    }
    const char *ca_file = getenv("GPUJOB_CA_FILE");
    r = ca_file && ca_file[0] ? gpujob_client_set_ca_file(c, ca_file) : 0;
    if (r < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "GPUJOB_CA_FILE '%s' cannot be read: %s", ca_file, strerror(-r));
        copy_message(errbuf, errbuf_size, msg);
        gpujob_client_free(c);
        return r;
    }
    *ret = c;
    return 0;
}

void gpujob_client_free(gpujob_client_t *c)
{
    if (!c) return;
    if (c->curl) curl_easy_cleanup(c->curl);
    free(c->address);
    free(c->base_url);
    free(c->unix_path);
    if (c->auth_header) explicit_bzero(c->auth_header, strlen(c->auth_header));
    free(c->auth_header);
    free(c->ca_file);
    free(c);
}

const char *gpujob_client_address(const gpujob_client_t *c)
{
    return c->address;
}

int gpujob_client_set_token(gpujob_client_t *c, const char *token)
{
    char *header = NULL;
    for (const char *p = token; p && *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f) return -EINVAL;
    if (token && asprintf(&header, "Authorization: Bearer %s", token) < 0) return -ENOMEM;
    if (c->auth_header) explicit_bzero(c->auth_header, strlen(c->auth_header));
    free(c->auth_header);
    c->auth_header = header;
    return 0;
}

int gpujob_client_set_ca_file(gpujob_client_t *c, const char *path)
{
    char *copy = NULL;
    if (path) {
        /* Said now rather than as a vague TLS error on the first call. */
        if (access(path, R_OK) < 0) return -errno;
        copy = strdup(path);
        if (!copy) return -ENOMEM;
    }
    free(c->ca_file);
    c->ca_file = copy;
    return 0;
}

void gpujob_client_set_timeout_ms(gpujob_client_t *c, long request_ms, long connect_ms)
{
    c->request_timeout_ms = request_ms < 0 ? 0 : request_ms;
    c->connect_timeout_ms = connect_ms < 0 ? 0 : connect_ms;
}

void gpujob_client_set_binary_outputs(gpujob_client_t *c, bool on)
{
    c->binary_outputs = on;
}

const char *gjc_job_accept(const gpujob_client_t *c)
{
    return c->binary_outputs ? "application/octet-stream, application/json" : "application/json";
}

void gpujob_client_set_retries(gpujob_client_t *c, int retries)
{
    c->retries = retries < 0 ? 0 : retries;
}

const char *gpujob_errmsg(const gpujob_client_t *c)
{
    return c->errmsg;
}

long gpujob_http_status(const gpujob_client_t *c)
{
    return c->http_status;
}

const char *gpujob_error_code(const gpujob_client_t *c)
{
    return c->err_code;
}

const char *gpujob_error_field(const gpujob_client_t *c)
{
    return c->err_field;
}

const char *gpujob_strerror(int r)
{
    switch (r) {
    case 0:
        return "success";
    case -EINVAL:
        return "invalid argument";
    case -ENOENT:
        return "not found";
    case -EBUSY:
        return "conflict with the job's or buffer's state";
    case -EEXIST:
        return "already exists";
    case -E2BIG:
        return "payload too large";
    case -EAGAIN:
        return "resource exhausted, retry later";
    case -EACCES:
        return "permission denied";
    case -ESHUTDOWN:
        return "daemon unavailable (draining)";
    case -EREMOTEIO:
        return "daemon internal error";
    case -EBADMSG:
        return "malformed answer from the daemon";
    case -ECONNREFUSED:
        return "cannot connect to the daemon";
    case -ETIMEDOUT:
        return "timed out";
    case -ECONNRESET:
        return "connection lost";
    case -ENOBUFS:
        return "buffer too small";
    default:
        return strerror(r < 0 ? -r : r);
    }
}

void gpujob_free(void *p)
{
    free(p);
}

char *gjc_escape(gpujob_client_t *c, const char *segment)
{
    char *e = curl_easy_escape(c->curl, segment, 0);
    if (!e) return NULL;
    char *copy = strdup(e);
    curl_free(e);
    return copy;
}

void gjc_response_clear(gjc_response_t *resp)
{
    free(resp->body);
    memset(resp, 0, sizeof *resp);
    resp->retry_after_s = -1;
}

typedef struct exchange {
    gpujob_client_t *c;
    const gjc_request_t *req;
    gjc_response_t *resp;
} exchange_t;

static int body_append(gjc_response_t *resp, const char *p, size_t n)
{
    if (resp->len + n + 1 > resp->cap) {
        size_t cap = resp->cap ? resp->cap : 4096;
        while (cap < resp->len + n + 1)
            cap *= 2;
        char *body = realloc(resp->body, cap);
        if (!body) return -ENOMEM;
        resp->body = body;
        resp->cap = cap;
    }
    memcpy(resp->body + resp->len, p, n);
    resp->len += n;
    resp->body[resp->len] = '\0';
    return 0;
}

/* Writes a 2xx body into the caller's sink when there is one (outputs read into a caller
 * buffer), anything else into the response body; returning less than n aborts the transfer. */
static size_t on_body(char *p, size_t size, size_t nmemb, void *arg)
{
    exchange_t *x = arg;
    size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(x->c->curl, CURLINFO_RESPONSE_CODE, &status);
    if (x->req->sink && status >= 200 && status < 300) {
        if (x->resp->sink_len + n > x->req->sink_cap) {
            x->resp->sink_overflow = true;
            return 0;
        }
        memcpy((char *)x->req->sink + x->resp->sink_len, p, n);
        x->resp->sink_len += n;
        return n;
    }
    return body_append(x->resp, p, n) < 0 ? 0 : n;
}

static void header_value(const char *line, size_t n, char *out, size_t size)
{
    const char *colon = memchr(line, ':', n);
    if (!colon) return;
    const char *v = colon + 1, *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
        end--;
    size_t len = (size_t)(end - v) < size - 1 ? (size_t)(end - v) : size - 1;
    memcpy(out, v, len);
    out[len] = '\0';
}

static bool header_is(const char *line, size_t n, const char *name)
{
    size_t k = strlen(name);
    return n > k && line[k] == ':' && strncasecmp(line, name, k) == 0;
}

/* Remembers the few headers the library reads; a new status line (after a 100 Continue or a
 * redirect) starts over. */
static size_t on_header(char *p, size_t size, size_t nmemb, void *arg)
{
    exchange_t *x = arg;
    size_t n = size * nmemb;
    gjc_response_t *r = x->resp;
    if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        r->x_dtype[0] = r->x_shape[0] = '\0';
        r->retry_after_s = -1;
        r->framed = false;
    } else if (header_is(p, n, "Gpujob-Json-Length")) {
        char v[32] = "";
        header_value(p, n, v, sizeof v);
        char *end = NULL;
        unsigned long long len = strtoull(v, &end, 10);
        r->framed = end != v && *end == '\0' && v[0] != '-';
        r->json_length = (size_t)len;
    } else if (header_is(p, n, "X-Dtype")) {
        header_value(p, n, r->x_dtype, sizeof r->x_dtype);
    } else if (header_is(p, n, "X-Shape")) {
        header_value(p, n, r->x_shape, sizeof r->x_shape);
    } else if (header_is(p, n, "Retry-After")) {
        char v[32] = "";
        header_value(p, n, v, sizeof v);
        char *end = NULL;
        long s = strtol(v, &end, 10);
        if (end != v && s >= 0) r->retry_after_s = s;
    }
    return n;
}

static int curl_code_to_errno(CURLcode code)
{
    switch (code) {
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return -EHOSTUNREACH;
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
        return -ECONNRESET;
    case CURLE_OUT_OF_MEMORY:
        return -ENOMEM;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
        return -EPROTO;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
        return -EINVAL;
    default:
        return -EIO;
    }
}

static struct curl_slist *headers_build(const gpujob_client_t *c, const gjc_request_t *req,
                                        bool *ret_ok)
{
    struct curl_slist *h = NULL, *t = NULL;
    char line[256];
    bool ok = true;
#define ADD(s)                                                                                     \
    do {                                                                                           \
        if (ok && !(t = curl_slist_append(h, (s)))) ok = false;                                    \
        if (t) h = t;                                                                              \
    } while (0)
    /* No "Expect: 100-continue": it costs a round trip on every large upload. */
    ADD("Expect:");
    if (req->content_type) {
        snprintf(line, sizeof line, "Content-Type: %s", req->content_type);
        ADD(line);
    }
    if (req->accept) {
        snprintf(line, sizeof line, "Accept: %s", req->accept);
        ADD(line);
    }
    if (req->idempotency_key) {
        snprintf(line, sizeof line, "Idempotency-Key: %s", req->idempotency_key);
        ADD(line);
    }
    if (req->json_length) {
        snprintf(line, sizeof line, "Gpujob-Json-Length: %zu", req->json_length);
        ADD(line);
    }
    if (c->auth_header) ADD(c->auth_header);
#undef ADD
    *ret_ok = ok;
    return h;
}

int gjc_perform(gpujob_client_t *c, const gjc_request_t *req, gjc_response_t *resp)
{
    gjc_response_clear(resp);
    CURL *h = c->curl;
    curl_easy_reset(h);
    char *url = NULL;
    if (asprintf(&url, "%s%s", c->base_url, req->path) < 0) return -ENOMEM;
    bool ok = true;
    struct curl_slist *headers = headers_build(c, req, &ok);
    if (!ok) {
        curl_slist_free_all(headers);
        free(url);
        return gjc_fail(c, -ENOMEM, "out of memory building a request");
    }
    char curl_err[CURL_ERROR_SIZE] = "";
    exchange_t x = {.c = c, .req = req, .resp = resp};
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (c->unix_path) curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, c->unix_path);
    /* libcurl verifies the peer and its host name by default; only the trusted CAs change. */
    if (c->ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_file);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_err);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->connect_timeout_ms);
    if (c->request_timeout_ms > 0)
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->request_timeout_ms + req->extra_timeout_ms);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "libgpujob/" GPUJOB_CLIENT_VERSION);
    if (strcmp(req->method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, req->body ? req->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    } else if (strcmp(req->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
    }
    CURLcode code = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
    c->http_status = resp->status;
    curl_slist_free_all(headers);

    int r = 0;
    if (code == CURLE_WRITE_ERROR && resp->sink_overflow) {
        r = 0; /* an answer came; the caller reports the small buffer */
    } else if (code != CURLE_OK) {
        r = gjc_fail(c, curl_code_to_errno(code), "%s %s: %s", req->method, url,
                     curl_err[0] ? curl_err : curl_easy_strerror(code));
    } else if (!resp->body && body_append(resp, "", 0) < 0) {
        r = gjc_fail(c, -ENOMEM, "out of memory");
    }
    free(url);
    return r;
}

static int status_to_errno(long status, const char *code)
{
    switch (status) {
    case 400:
    case 422:
        return -EINVAL;
    case 401:
    case 403:
        return -EACCES;
    case 404:
        return -ENOENT;
    case 405:
        return -EOPNOTSUPP;
    case 409:
        return strcmp(code, "already_exists") == 0 ? -EEXIST : -EBUSY;
    case 413:
        return -E2BIG;
    case 429:
        return -EAGAIN;
    case 503:
        return -ESHUTDOWN;
    default:
        return status >= 500 ? -EREMOTEIO : -EBADMSG;
    }
}

int gjc_check_status(gpujob_client_t *c, const gjc_response_t *resp, long expect, long expect2)
{
    if (resp->status == expect || (expect2 && resp->status == expect2)) return 0;
    json_t *root = resp->body ? json_loads(resp->body, JSON_DECODE_ANY, NULL) : NULL;
    json_t *err = json_object_get(root, "error");
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *message = json_string_value(json_object_get(err, "message"));
    const char *field = json_string_value(json_object_get(err, "field"));
    snprintf(c->err_code, sizeof c->err_code, "%s", code ? code : "");
    snprintf(c->err_field, sizeof c->err_field, "%s", field ? field : "");
    int r = status_to_errno(resp->status, c->err_code);
    if (message) {
        gjc_fail(c, r, "HTTP %ld %s: %s%s%s%s", resp->status, code ? code : "error", message,
                 field ? " (field " : "", field ? field : "", field ? ")" : "");
    } else {
        gjc_fail(c, r, "HTTP %ld: %.200s", resp->status,
                 resp->body && resp->body[0] ? resp->body : "(empty body)");
    }
    json_decref(root);
    return r;
}

int gjc_parse_body(gpujob_client_t *c, const gjc_response_t *resp, json_t **ret)
{
    if (resp->framed && resp->json_length > resp->len)
        return gjc_fail(c, -EBADMSG, "answer (HTTP %ld) is shorter than its Gpujob-Json-Length",
                        resp->status);
    json_error_t jerr;
    json_t *root = json_loadb(resp->body ? resp->body : "",
                              resp->framed ? resp->json_length : resp->len, JSON_DECODE_ANY, &jerr);
    if (!root)
        return gjc_fail(c, -EBADMSG, "answer (HTTP %ld) is not JSON: %s at line %d column %d",
                        resp->status, jerr.text, jerr.line, jerr.column);
    *ret = root;
    return 0;
}

void gjc_take_section(gjc_response_t *resp, gjc_section_t *ret)
{
    *ret = (gjc_section_t){0};
    if (!resp->framed || resp->json_length > resp->len) return;
    *ret = (gjc_section_t){resp->body, resp->json_length, resp->len - resp->json_length};
    resp->body = NULL;
}

int gjc_call_json(gpujob_client_t *c, const gjc_request_t *req, long expect, long expect2,
                  json_t **ret, gjc_section_t *ret_section)
{
    gjc_response_t resp = {.retry_after_s = -1};
    int r = gjc_perform(c, req, &resp);
    if (r >= 0) r = gjc_check_status(c, &resp, expect, expect2);
    json_t *root = NULL;
    if (r >= 0) r = gjc_parse_body(c, &resp, &root);
    if (r >= 0 && ret_section) gjc_take_section(&resp, ret_section);
    gjc_response_clear(&resp);
    if (r < 0) return r;
    *ret = root;
    return 0;
}
