/* bench_loadgen: HTTP load against a running gpujobd, with libcurl multi and keep-alive
 * connections, one connection per concurrent client.
 *
 *   bench_loadgen [--duration S] [--concurrency 1,16,64] [--array 100,1000]
 *                 [--array-concurrency 4] [--elements 1024]
 *                 [--encoding b64|inline|binary] [--outputs json|binary]
 *                 [--modes submit,array,e2e,waited] URL
 *
 * Inputs travel as base64 of their bytes (--encoding b64, what libgpujob sends), as JSON
 * arrays of numbers (inline, what a curl user types) or as raw bytes in the body's binary
 * section after the JSON (binary: application/octet-stream with Gpujob-Json-Length). All three
 * submit the same jobs. Ended jobs come back with their output as JSON numbers (--outputs json)
 * or as bytes in a binary section after the JSON (binary: Accept: application/octet-stream),
 * of which only the JSON is parsed.
 *
 * Modes, each run for --duration seconds per setting:
 *   submit  one tiny job (saxpy on --elements f32) per POST, at each concurrency:
 *           accepted jobs/s (201s per second) and p50/p99 submit latency;
 *   array   N such jobs per POST for each N of --array: jobs/s and per-POST latency;
 *   e2e     submit, then GET /v1/jobs/{id}/wait until done, at each concurrency: completed
 *           jobs/s and p50/p99 submit-to-done latency;
 *   waited  as e2e, but submitting with POST /v1/jobs?wait=30, which answers once the job has
 *           ended: one request per job (a wait follows only if the job outlasts it).
 * Prints one Markdown table on stdout. */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define LOADGEN_MAX_LEVELS 16
#define ACCEPT_BINARY "Accept: application/octet-stream"

typedef enum loadgen_encoding {
    ENCODING_B64,    /* inputs as base64 */
    ENCODING_INLINE, /* inputs as JSON numbers */
    ENCODING_BINARY, /* inputs as bytes of the binary section, named by binary_offset */
} loadgen_encoding_t;

typedef struct loadgen_opts {
    const char *url;
    double duration_s;
    int concurrency[LOADGEN_MAX_LEVELS], n_concurrency;
    int array_sizes[LOADGEN_MAX_LEVELS], n_array_sizes;
    int array_concurrency;
    int elements;
    loadgen_encoding_t encoding;
    struct curl_slist *accept; /* of requests answered with an ended job: NULL for JSON */
    bool mode_submit, mode_array, mode_e2e, mode_waited;
} loadgen_opts_t;

/* The body of a POST /v1/jobs, prepared once per level. A binary body holds NUL bytes, hence
 * its length; its headers differ by encoding (Gpujob-Json-Length). */
typedef struct request_body {
    char *data;
    size_t len;
    struct curl_slist *headers;
} request_body_t;

typedef enum slot_phase { PHASE_SUBMIT, PHASE_WAIT } slot_phase_t;

/* One concurrent client: an easy handle that is re-armed after each response. */
typedef struct slot {
    CURL *easy;
    slot_phase_t phase;
    double t_start; /* of the current POST: latency is measured from here */
    char *resp;
    size_t resp_len, resp_cap;
    size_t json_len; /* Gpujob-Json-Length of a framed answer; 0: all of resp is JSON */
    char url[512];
} slot_t;

typedef struct run_stats {
    long requests;  /* responses received */
    long jobs_ok;   /* jobs accepted (submit, array) or completed (e2e) */
    long errors;    /* transport errors and unexpected statuses */
    double *lat_ms; /* one per successful request (submit, array) or job (e2e) */
    long n_lat, cap_lat;
} run_stats_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    slot_t *s = arg;
    size_t len = size * n;
    if (s->resp_len + len + 1 > s->resp_cap) {
        size_t cap = s->resp_cap ? s->resp_cap : 4096;
        while (cap < s->resp_len + len + 1)
            cap *= 2;
        char *r = realloc(s->resp, cap);
        if (!r) return 0;
        s->resp = r;
        s->resp_cap = cap;
    }
    memcpy(s->resp + s->resp_len, p, len);
    s->resp_len += len;
    s->resp[s->resp_len] = '\0';
    return len;
}

/* Keeps the Gpujob-Json-Length of a framed answer: its JSON is that much of the body. */
static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    slot_t *s = arg;
    size_t len = size * n;
    static const char name[] = "gpujob-json-length:";
    if (len > sizeof name - 1 && strncasecmp(p, name, sizeof name - 1) == 0)
        s->json_len = strtoul(p + sizeof name - 1, NULL, 10);
    return len;
}

static void stats_add_latency(run_stats_t *st, double ms)
{
    if (st->n_lat == st->cap_lat) {
        long cap = st->cap_lat ? 2 * st->cap_lat : 4096;
        double *l = realloc(st->lat_ms, (size_t)cap * sizeof *l);
        if (!l) return;
        st->lat_ms = l;
        st->cap_lat = cap;
    }
    st->lat_ms[st->n_lat++] = ms;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of the sorted latencies (nearest rank), or 0 when there are none. */
static double percentile(const run_stats_t *st, double q)
{
    if (st->n_lat == 0) return 0;
    long i = (long)(q * (double)st->n_lat + 0.5) - 1;
    if (i < 0) i = 0;
    if (i >= st->n_lat) i = st->n_lat - 1;
    return st->lat_ms[i];
}

static char *base64(const void *data, size_t n)
{
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = data;
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
    for (size_t i = 0; out && i < n; i += 3) {
        unsigned v = p[i] << 16 | (i + 1 < n ? p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *o++ = tbl[v >> 18 & 63];
        *o++ = tbl[v >> 12 & 63];
        *o++ = i + 1 < n ? tbl[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? tbl[v & 63] : '=';
    }
    if (out) *o = '\0';
    return out;
}

/* One input tensor of n f32 values, as JSON; binary ones name their bytes at offset in the
 * binary section instead of carrying them. */
static json_t *tensor_json(const float *v, int n, loadgen_encoding_t enc, size_t offset)
{
    if (enc == ENCODING_BINARY)
        return json_pack("{s:s, s:[i], s:I}", "dtype", "f32", "shape", n, "binary_offset",
                         (json_int_t)offset);
    if (enc == ENCODING_B64) {
        char *text = base64(v, (size_t)n * sizeof *v);
        json_t *t = json_pack("{s:s, s:[i], s:s}", "dtype", "f32", "shape", n, "b64", text);
        free(text);
        return t;
    }
    json_t *data = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(data, json_integer((json_int_t)v[i]));
    return json_pack("{s:s, s:[i], s:o}", "dtype", "f32", "shape", n, "data", data);
}

/* Saxpy job k on n f32 elements: with the binary encoding, its x and y are the k-th pair of
 * tensors in the binary section. */
static json_t *job_json(const float *x, const float *y, int n, loadgen_encoding_t enc, int k)
{
    size_t bytes = (size_t)n * sizeof(float);
    return json_pack("{s:s, s:{s:f}, s:{s:o, s:o}}", "op", "saxpy", "params", "a", 2.0, "inputs",
                     "x", tensor_json(x, n, enc, (size_t)(2 * k) * bytes), "y",
                     tensor_json(y, n, enc, (size_t)(2 * k + 1) * bytes));
}

/* Appends h to *list, which stays valid (and owned by the caller) when that fails. */
static int headers_add(struct curl_slist **list, const char *h)
{
    struct curl_slist *l = curl_slist_append(*list, h);
    if (!l) return -ENOMEM;
    *list = l;
    return 0;
}

static void body_free(request_body_t *b)
{
    free(b->data);
    curl_slist_free_all(b->headers);
    *b = (request_body_t){0};
}

/* Fills b with one saxpy job on n f32 elements (array false, count 1) or a JSON array of count
 * of them; with the binary encoding the JSON is followed by count x, y pairs of bytes. */
static int body_build(request_body_t *b, int n, loadgen_encoding_t enc, int count, bool array)
{
    *b = (request_body_t){0};
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    unsigned seed = 1;
    for (int i = 0; x && y && i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((int)(seed >> 16) % 100);
        y[i] = (float)(i % 7);
    }
    json_t *root = array ? json_array() : NULL, *job = NULL;
    bool ok = x && y && (!array || root);
    for (int k = 0; ok && k < count; k++) {
        /* Only binary jobs differ (by their offsets): otherwise one job is referenced count
         * times rather than built count times. */
        if (!job || enc == ENCODING_BINARY) {
            json_decref(job);
            job = job_json(x, y, n, enc, k);
        }
        ok = job && (!array || json_array_append(root, job) == 0);
    }
    char *text = ok ? json_dumps(array ? root : job, JSON_COMPACT) : NULL;
    json_decref(job);
    json_decref(root);
    size_t json_len = text ? strlen(text) : 0, bytes = (size_t)n * sizeof(float);
    if (text && enc == ENCODING_BINARY) {
        b->data = malloc(json_len + 2 * bytes * (size_t)count);
        if (b->data) {
            memcpy(b->data, text, json_len);
            for (int k = 0; k < count; k++) {
                memcpy(b->data + json_len + (size_t)(2 * k) * bytes, x, bytes);
                memcpy(b->data + json_len + (size_t)(2 * k + 1) * bytes, y, bytes);
            }
            b->len = json_len + 2 * bytes * (size_t)count;
        }
        free(text);
    } else {
        b->data = text;
        b->len = json_len;
    }
    free(x);
    free(y);
    if (!b->data) return -ENOMEM;
    char length[64];
    snprintf(length, sizeof length, "Gpujob-Json-Length: %zu", json_len);
    /* "Expect:" spares large bodies curl's wait for a 100 Continue. */
    if (headers_add(&b->headers, enc == ENCODING_BINARY ? "Content-Type: application/octet-stream"
                                                        : "Content-Type: application/json") < 0 ||
        (enc == ENCODING_BINARY && headers_add(&b->headers, length) < 0) ||
        headers_add(&b->headers, "Expect:") < 0) {
        body_free(b);
        return -ENOMEM;
    }
    return 0;
}

static void slot_arm_submit(slot_t *s, const char *base_url, const request_body_t *body,
                            bool waited)
{
    curl_easy_reset(s->easy);
    snprintf(s->url, sizeof s->url, "%s/v1/jobs%s", base_url, waited ? "?wait=30" : "");
    curl_easy_setopt(s->easy, CURLOPT_URL, s->url);
    curl_easy_setopt(s->easy, CURLOPT_HTTPHEADER, body->headers);
    curl_easy_setopt(s->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body->len);
    curl_easy_setopt(s->easy, CURLOPT_POSTFIELDS, body->data);
    curl_easy_setopt(s->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(s->easy, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(s->easy, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(s->easy, CURLOPT_PRIVATE, s);
    curl_easy_setopt(s->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->easy, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(s->easy, CURLOPT_TCP_NODELAY, 1L);
    s->phase = PHASE_SUBMIT;
    s->resp_len = s->json_len = 0;
    s->t_start = now_s();
}

static void slot_arm_wait(slot_t *s, const loadgen_opts_t *o, const char *id)
{
    curl_easy_reset(s->easy);
    snprintf(s->url, sizeof s->url, "%s/v1/jobs/%s/wait?timeout=60", o->url, id);
    curl_easy_setopt(s->easy, CURLOPT_URL, s->url);
    curl_easy_setopt(s->easy, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(s->easy, CURLOPT_HTTPHEADER, o->accept);
    curl_easy_setopt(s->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(s->easy, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(s->easy, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(s->easy, CURLOPT_PRIVATE, s);
    curl_easy_setopt(s->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->easy, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(s->easy, CURLOPT_TCP_NODELAY, 1L);
    s->phase = PHASE_WAIT;
    s->resp_len = s->json_len = 0;
}

/* Runs `concurrency` clients for duration_s. Each POSTs body (jobs_per_post jobs); in e2e mode
 * each then waits for its job; waited, its POST waits for it. Responses after the deadline are
 * not counted. */
static int run_level(const loadgen_opts_t *o, const request_body_t *body, int jobs_per_post,
                     int concurrency, bool e2e, bool waited, run_stats_t *ret)
{
    run_stats_t st = {0};
    CURLM *multi = curl_multi_init();
    slot_t *slots = calloc((size_t)concurrency, sizeof *slots);
    if (!multi || !slots) {
        curl_multi_cleanup(multi);
        free(slots);
        return -ENOMEM;
    }
    curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)concurrency);
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long)concurrency);
    double t0 = now_s(), end = t0 + o->duration_s;
    for (int i = 0; i < concurrency; i++) {
        slots[i].easy = curl_easy_init();
        slot_arm_submit(&slots[i], o->url, body, waited);
        curl_multi_add_handle(multi, slots[i].easy);
    }
    int active = concurrency;
    while (active > 0) {
        int running = 0;
        curl_multi_perform(multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            slot_t *s = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            CURLcode cr = msg->data.result;
            long status = 0;
            curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &status);
            curl_multi_remove_handle(multi, s->easy);
            double t = now_s();
            bool in_time = t <= end;
            bool next_wait = false;
            char id[64] = "";
            size_t json_len = s->json_len && s->json_len <= s->resp_len ? s->json_len : s->resp_len;
            if (in_time) st.requests++;
            if (cr != CURLE_OK || (s->phase == PHASE_SUBMIT && status != 201) ||
                (s->phase == PHASE_WAIT && status != 200)) {
                if (in_time) st.errors++;
            } else if (s->phase == PHASE_SUBMIT && e2e) {
                json_t *j = json_loadb(s->resp, json_len, 0, NULL);
                const char *v = json_string_value(json_object_get(j, "id"));
                if (v) {
                    snprintf(id, sizeof id, "%s", v);
                    next_wait = true;
                } else if (in_time) {
                    st.errors++;
                }
                json_decref(j);
            } else if (s->phase == PHASE_WAIT || waited) {
                json_t *j = json_loadb(s->resp, json_len, 0, NULL);
                const char *state = json_string_value(json_object_get(j, "state"));
                if (state && strcmp(state, "succeeded") == 0) {
                    if (in_time) {
                        st.jobs_ok++;
                        stats_add_latency(&st, (t - s->t_start) * 1e3);
                    }
                } else if (state &&
                           (strcmp(state, "queued") == 0 || strcmp(state, "running") == 0)) {
                    /* The long-poll timed out: wait again. */
                    next_wait = true;
                    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
                } else if (in_time) {
                    st.errors++;
                }
                json_decref(j);
            } else if (in_time) {
                st.jobs_ok += jobs_per_post;
                stats_add_latency(&st, (t - s->t_start) * 1e3);
            }
            if (next_wait) {
                slot_arm_wait(s, o, id);
                curl_multi_add_handle(multi, s->easy);
            } else if (t < end) {
                slot_arm_submit(s, o->url, body, waited);
                curl_multi_add_handle(multi, s->easy);
            } else {
                active--;
            }
        }
        if (active > 0) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    for (int i = 0; i < concurrency; i++) {
        curl_easy_cleanup(slots[i].easy);
        free(slots[i].resp);
    }
    free(slots);
    curl_multi_cleanup(multi);
    qsort(st.lat_ms, (size_t)st.n_lat, sizeof *st.lat_ms, cmp_double);
    *ret = st;
    return 0;
}

/* Waits (up to 300 s) until the daemon's /metrics show no queued or running job, so that each
 * row starts from an idle daemon rather than the backlog of the previous one. */
static void wait_idle(const char *base_url)
{
    CURL *c = curl_easy_init();
    slot_t s = {0};
    char url[512];
    snprintf(url, sizeof url, "%s/metrics", base_url);
    double until = now_s() + 300;
    while (c && now_s() < until) {
        curl_easy_reset(c);
        s.resp_len = 0;
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
        if (curl_easy_perform(c) != CURLE_OK || !s.resp) break;
        long busy = 0;
        for (const char *line = s.resp; line && *line;) {
            if (strncmp(line, "gpujobd_jobs_queued ", 20) == 0 ||
                strncmp(line, "gpujobd_jobs_running ", 21) == 0)
                busy += strtol(strchr(line, ' ') + 1, NULL, 10);
            line = strchr(line, '\n');
            if (line) line++;
        }
        if (busy == 0) break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    curl_easy_cleanup(c);
    free(s.resp);
}

static void print_row(const char *mode, int concurrency, int per_post, double duration_s,
                      const run_stats_t *st)
{
    printf("| %s | %d | %d | %ld | %ld | %ld | %.0f | %.2f | %.2f |\n", mode, concurrency, per_post,
           st->requests, st->jobs_ok, st->errors, (double)st->jobs_ok / duration_s,
           percentile(st, 0.50), percentile(st, 0.99));
    fflush(stdout);
}

static int parse_list(const char *arg, int *out, int *ret_n)
{
    int n = 0;
    const char *p = arg;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 100000 || n == LOADGEN_MAX_LEVELS) return -EINVAL;
        out[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -EINVAL;
    }
    if (n == 0) return -EINVAL;
    *ret_n = n;
    return 0;
}

static void usage(FILE *f)
{
    fputs("usage: bench_loadgen [--duration S] [--concurrency 1,16,64] [--array 100,1000]\n"
          "                     [--array-concurrency 4] [--elements 1024]\n"
          "                     [--encoding b64|inline|binary] [--outputs json|binary]\n"
          "                     [--modes submit,array,e2e,waited] URL\n",
          f);
}

static int parse_args(int argc, char **argv, loadgen_opts_t *o)
{
    static const struct option opts[] = {
        {"duration", required_argument, NULL, 'd'},
        {"concurrency", required_argument, NULL, 'c'},
        {"array", required_argument, NULL, 'a'},
        {"array-concurrency", required_argument, NULL, 'A'},
        {"elements", required_argument, NULL, 'n'},
        {"encoding", required_argument, NULL, 'e'},
        {"outputs", required_argument, NULL, 'o'},
        {"modes", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (loadgen_opts_t){.duration_s = 5,
                          .concurrency = {1, 16, 64},
                          .n_concurrency = 3,
                          .array_sizes = {100, 1000},
                          .n_array_sizes = 2,
                          .array_concurrency = 4,
                          .elements = 1024,
                          .encoding = ENCODING_B64,
                          .mode_submit = true,
                          .mode_array = true,
                          .mode_e2e = true};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'd':
            o->duration_s = strtod(optarg, NULL);
            if (!(o->duration_s > 0)) {
                fprintf(stderr, "bench_loadgen: --duration must be a positive number\n");
                return -EINVAL;
            }
            break;
        case 'c':
            if (parse_list(optarg, o->concurrency, &o->n_concurrency) < 0) {
                fprintf(stderr, "bench_loadgen: --concurrency: a list like 1,16,64\n");
                return -EINVAL;
            }
            break;
        case 'a':
            if (parse_list(optarg, o->array_sizes, &o->n_array_sizes) < 0) {
                fprintf(stderr, "bench_loadgen: --array: a list like 100,1000\n");
                return -EINVAL;
            }
            break;
        case 'A':
            o->array_concurrency = atoi(optarg);
            break;
        case 'n':
            o->elements = atoi(optarg);
            break;
        case 'e':
            if (strcmp(optarg, "b64") == 0) {
                o->encoding = ENCODING_B64;
            } else if (strcmp(optarg, "inline") == 0) {
                o->encoding = ENCODING_INLINE;
            } else if (strcmp(optarg, "binary") == 0) {
                o->encoding = ENCODING_BINARY;
            } else {
                fprintf(stderr, "bench_loadgen: --encoding is b64, inline or binary\n");
                return -EINVAL;
            }
            break;
        case 'o':
            if (strcmp(optarg, "binary") == 0) {
                if (!o->accept) o->accept = curl_slist_append(NULL, ACCEPT_BINARY);
                if (!o->accept) return -ENOMEM;
            } else if (strcmp(optarg, "json") != 0) {
                fprintf(stderr, "bench_loadgen: --outputs is json or binary\n");
                return -EINVAL;
            }
            break;
        case 'm':
            o->mode_submit = strstr(optarg, "submit") != NULL;
            o->mode_array = strstr(optarg, "array") != NULL;
            o->mode_e2e = strstr(optarg, "e2e") != NULL;
            o->mode_waited = strstr(optarg, "waited") != NULL;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -EINVAL;
        }
    }
    if (optind != argc - 1 || o->array_concurrency < 1 || o->elements < 1) {
        usage(stderr);
        return -EINVAL;
    }
    o->url = argv[optind];
    return 0;
}

int main(int argc, char **argv)
{
    loadgen_opts_t o;
    if (parse_args(argc, argv, &o) < 0) return 2;
    curl_global_init(CURL_GLOBAL_ALL);
    request_body_t job;
    if (body_build(&job, o.elements, o.encoding, 1, false) < 0 ||
        (o.accept && headers_add(&job.headers, ACCEPT_BINARY) < 0))
        return 1;

    printf("| mode | concurrency | jobs/POST | requests | jobs ok | errors | jobs/s | p50 ms | "
           "p99 ms |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    run_stats_t st;
    if (o.mode_submit)
        for (int i = 0; i < o.n_concurrency; i++) {
            wait_idle(o.url);
            if (run_level(&o, &job, 1, o.concurrency[i], false, false, &st) < 0) return 1;
            print_row("submit", o.concurrency[i], 1, o.duration_s, &st);
            free(st.lat_ms);
        }
    if (o.mode_array)
        for (int i = 0; i < o.n_array_sizes; i++) {
            wait_idle(o.url);
            request_body_t body;
            if (body_build(&body, o.elements, o.encoding, o.array_sizes[i], true) < 0 ||
                run_level(&o, &body, o.array_sizes[i], o.array_concurrency, false, false, &st) < 0)
                return 1;
            print_row("array", o.array_concurrency, o.array_sizes[i], o.duration_s, &st);
            free(st.lat_ms);
            body_free(&body);
        }
    if (o.mode_e2e)
        for (int i = 0; i < o.n_concurrency; i++) {
            wait_idle(o.url);
            if (run_level(&o, &job, 1, o.concurrency[i], true, false, &st) < 0) return 1;
            print_row("e2e", o.concurrency[i], 1, o.duration_s, &st);
            free(st.lat_ms);
        }
    if (o.mode_waited)
        for (int i = 0; i < o.n_concurrency; i++) {
            wait_idle(o.url);
            if (run_level(&o, &job, 1, o.concurrency[i], false, true, &st) < 0) return 1;
            print_row("waited", o.concurrency[i], 1, o.duration_s, &st);
            free(st.lat_ms);
        }
    printf("\nElements per job: %d (saxpy, f32, %s; outputs %s); %.1f s per row. Latency: per "
           "POST (submit, array) or submit-to-done (e2e, waited).\n",
           o.elements,
           o.encoding == ENCODING_BINARY   ? "binary section"
           : o.encoding == ENCODING_INLINE ? "inline JSON numbers"
                                           : "base64",
           o.accept ? "as bytes after the JSON" : "as JSON numbers", o.duration_s);
    body_free(&job);
    curl_slist_free_all(o.accept);
    curl_global_cleanup();
    return 0;
}
