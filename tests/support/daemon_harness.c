/* End-to-end test support: the real gpujobd process and HTTP to it (see daemon_harness.h). */
/* POSIX and XSI (nftw). */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700
#include "daemon_harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define E2E_START_TIMEOUT_S 30
#define E2E_LISTEN_PHRASE "listening on http"

struct e2e_daemon {
    char dir[256];
    char state_dir[PATH_MAX];
    char config_path[PATH_MAX];
    char log_path[PATH_MAX];
    char url[128];
    int port;
    pid_t pid; /* 0 when not running */

    /* The drainer thread of the current run and what it has seen. */
    pthread_t drainer;
    bool drainer_running;
    int pipe_fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool listening;
    bool eof;
};

double e2e_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

long e2e_daemon_status_kib(e2e_daemon_t *d, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)e2e_daemon_pid(d));
    FILE *f = fopen(path, "re");
    ck_assert_msg(f, "cannot open %s", path);
    long kib = -1;
    size_t len = strlen(field);
    while (kib < 0 && fgets(line, sizeof line, f))
        if (strncmp(line, field, len) == 0 && line[len] == ':')
            kib = strtol(line + len + 1, NULL, 10);
    fclose(f);
    ck_assert_msg(kib >= 0, "no %s in %s", field, path);
    return kib;
}

/* Picks the port out of one line of the daemon's log, if it is the listening line. */
static void drainer_scan_line(e2e_daemon_t *d, const char *line)
{
    const char *p = strstr(line, E2E_LISTEN_PHRASE);
    if (!p) return;
    p += strlen(E2E_LISTEN_PHRASE);
    bool tls = *p == 's'; /* "https://": server.tls_cert is set */
    const char *colon = strrchr(p, ':');
    if (!colon) return;
    int port = atoi(colon + 1);
    if (port <= 0 || port > 65535) return;
    pthread_mutex_lock(&d->mu);
    d->port = port;
    snprintf(d->url, sizeof d->url, "http%s://127.0.0.1:%d", tls ? "s" : "", port);
    d->listening = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* Copies the daemon's stderr into its log file until EOF, so that the daemon never blocks on
 * a full pipe, and watches each line for the listening address. */
static void *drainer_main(void *arg)
{
    e2e_daemon_t *d = arg;
    FILE *log = fopen(d->log_path, "ae");
    char line[4096];
    size_t line_len = 0;
    char chunk[4096];
    for (;;) {
        ssize_t n = read(d->pipe_fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (log) {
            fwrite(chunk, 1, (size_t)n, log);
            fflush(log);
        }
        for (ssize_t i = 0; i < n; i++) {
            if (chunk[i] == '\n' || line_len == sizeof line - 1) {
                line[line_len] = '\0';
                drainer_scan_line(d, line);
                line_len = 0;
            } else {
                line[line_len++] = chunk[i];
            }
        }
    }
    if (log) fclose(log);
    close(d->pipe_fd);
    d->pipe_fd = -1;
    pthread_mutex_lock(&d->mu);
    d->eof = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

static void dump_log(const e2e_daemon_t *d)
{
    FILE *f = fopen(d->log_path, "re");
    if (!f) return;
    fprintf(stderr, "---- gpujobd log (%s) ----\n", d->log_path);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stderr);
    fprintf(stderr, "---- end of log ----\n");
    fclose(f);
}

static void reap(e2e_daemon_t *d, int *ret_wait_status)
{
    int status = 0;
    while (waitpid(d->pid, &status, 0) < 0 && errno == EINTR) {
    }
    d->pid = 0;
    if (d->drainer_running) {
        pthread_join(d->drainer, NULL);
        d->drainer_running = false;
    }
    if (ret_wait_status) *ret_wait_status = status;
}

static int spawn(e2e_daemon_t *d)
{
    const char *bin = getenv("GPUJOBD_BIN");
    if (!bin || !*bin) {
        fprintf(stderr, "e2e: GPUJOBD_BIN is not set\n");
        return -ENOENT;
    }
    int fds[2];
    if (pipe(fds) < 0) return -errno;
    /* Only this thread forks, so setting CLOEXEC after pipe() cannot race with a fork. */
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    d->listening = false;
    d->eof = false;
    d->port = 0;
    d->url[0] = '\0';

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int r = -errno;
        close(fds[0]);
        close(fds[1]);
        return r;
    }
    if (pid == 0) {
        /* The daemon must not outlive a test that crashed or failed an assertion. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(fds[1], STDERR_FILENO);
        dup2(fds[1], STDOUT_FILENO);
        /* GPUJOB_E2E_BACKEND runs the same suites on another backend (cuda on the GPU
         * machine); the default is the CPU backend every machine has. The test-only ops give
         * the suites a job of known length on either (e2e_long_job_new). */
        const char *backend = getenv("GPUJOB_E2E_BACKEND");
        /* GPUJOB_E2E_SHARDS runs them on a store of that many shards. */
        const char *shards = getenv("GPUJOB_E2E_SHARDS");
        char shards_set[64];
        snprintf(shards_set, sizeof shards_set, "store.shards=%s",
                 shards && *shards ? shards : "1");
        char *argv[] = {(char *)bin,
                        "--config",
                        d->config_path,
                        "--listen",
                        "127.0.0.1:0",
                        "--state-dir",
                        d->state_dir,
                        "--backend",
                        (char *)(backend && *backend ? backend : "cpu"),
                        "--log-level",
                        "info",
                        "--set",
                        "debug.test_ops=true",
                        "--set",
                        shards_set,
                        NULL};
        execv(bin, argv);
        fprintf(stderr, "e2e: exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    d->pid = pid;
    d->pipe_fd = fds[0];
    if (pthread_create(&d->drainer, NULL, drainer_main, d) != 0) {
        kill(pid, SIGKILL);
        close(fds[0]);
        d->pipe_fd = -1;
        reap(d, NULL);
        return -EAGAIN;
    }
    d->drainer_running = true;

    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += E2E_START_TIMEOUT_S;
    pthread_mutex_lock(&d->mu);
    int r = 0;
    while (!d->listening && !d->eof && r == 0)
        r = pthread_cond_timedwait(&d->cv, &d->mu, &until);
    bool ok = d->listening;
    pthread_mutex_unlock(&d->mu);
    if (!ok) {
        fprintf(stderr, "e2e: gpujobd did not report listening within %d s\n", E2E_START_TIMEOUT_S);
        kill(pid, SIGKILL);
        reap(d, NULL);
        dump_log(d);
        return -ECHILD;
    }
    return 0;
}

int e2e_daemon_start(const char *config_ini, e2e_daemon_t **ret)
{
    e2e_daemon_t *d = calloc(1, sizeof *d);
    if (!d) return -ENOMEM;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    d->pipe_fd = -1;
    snprintf(d->dir, sizeof d->dir, "/tmp/gpujobd-e2e-XXXXXX");
    if (!mkdtemp(d->dir)) {
        int r = -errno;
        free(d);
        return r;
    }
    snprintf(d->state_dir, sizeof d->state_dir, "%s/state", d->dir);
    snprintf(d->config_path, sizeof d->config_path, "%s/gpujobd.conf", d->dir);
    snprintf(d->log_path, sizeof d->log_path, "%s/gpujobd.log", d->dir);
    int r = 0;
    if (mkdir(d->state_dir, 0700) < 0) r = -errno;
    FILE *f = r == 0 ? fopen(d->config_path, "we") : NULL;
    if (r == 0 && !f) r = -errno;
    if (f) {
        fputs(config_ini ? config_ini : "", f);
        if (fclose(f) != 0) r = -EIO;
    }
    if (r == 0) r = spawn(d);
    if (r < 0) {
        fprintf(stderr, "e2e: starting gpujobd in %s failed: %s\n", d->dir, strerror(-r));
        free(d); /* the directory stays for inspection */
        return r;
    }
    fprintf(stderr, "e2e: gpujobd pid %d at %s, dir %s\n", (int)d->pid, d->url, d->dir);
    *ret = d;
    return 0;
}

int e2e_daemon_restart(e2e_daemon_t *d)
{
    if (d->pid != 0) return -EBUSY;
    int r = spawn(d);
    if (r == 0) fprintf(stderr, "e2e: gpujobd restarted: pid %d at %s\n", (int)d->pid, d->url);
    return r;
}

int e2e_daemon_stop(e2e_daemon_t *d, int timeout_ms, int *ret_wait_status)
{
    if (d->pid == 0) return -ESRCH;
    kill(d->pid, SIGTERM);
    double until = e2e_now() + timeout_ms / 1000.0;
    for (;;) {
        int status = 0;
        pid_t p = waitpid(d->pid, &status, WNOHANG);
        if (p == d->pid) {
            d->pid = 0;
            if (d->drainer_running) {
                pthread_join(d->drainer, NULL);
                d->drainer_running = false;
            }
            *ret_wait_status = status;
            return 0;
        }
        if (e2e_now() > until) break;
        usleep(10 * 1000);
    }
    fprintf(stderr, "e2e: gpujobd did not exit within %d ms of SIGTERM; killing it\n", timeout_ms);
    e2e_daemon_kill(d);
    return -ETIMEDOUT;
}

void e2e_daemon_kill(e2e_daemon_t *d)
{
    if (d->pid == 0) return;
    kill(d->pid, SIGKILL);
    reap(d, NULL);
}

bool e2e_daemon_alive(e2e_daemon_t *d)
{
    if (d->pid == 0) return false;
    int status;
    if (waitpid(d->pid, &status, WNOHANG) == 0) return true;
    /* It exited and is now reaped: forget the pid so that nothing signals a reused one. */
    fprintf(stderr, "e2e: gpujobd pid %d exited, wait status 0x%x\n", (int)d->pid, status);
    d->pid = 0;
    if (d->drainer_running) {
        pthread_join(d->drainer, NULL);
        d->drainer_running = false;
    }
    return false;
}

pid_t e2e_daemon_pid(const e2e_daemon_t *d)
{
    return d->pid;
}

const char *e2e_daemon_url(const e2e_daemon_t *d)
{
    return d->url;
}

int e2e_daemon_port(const e2e_daemon_t *d)
{
    return d->port;
}

const char *e2e_daemon_dir(const e2e_daemon_t *d)
{
    return d->dir;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    remove(path);
    return 0;
}

void e2e_daemon_free(e2e_daemon_t *d)
{
    if (!d) return;
    e2e_daemon_kill(d);
    nftw(d->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
}

/* ---- HTTP ---- */

typedef struct growbuf {
    char *data;
    size_t len, cap;
} growbuf_t;

static int growbuf_append(growbuf_t *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *data = realloc(b->data, cap);
        if (!data) return -ENOMEM;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    return growbuf_append(arg, p, size * n) == 0 ? size * n : 0;
}

/* Keeps only the last response's headers: a 100 Continue comes before the final one. */
static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    growbuf_t *b = arg;
    if (size * n >= 5 && strncmp(p, "HTTP/", 5) == 0) b->len = 0;
    return growbuf_append(b, p, size * n) == 0 ? size * n : 0;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static __thread CURL *thread_curl;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
}

void e2e_http_thread_done(void)
{
    if (thread_curl) curl_easy_cleanup(thread_curl);
    thread_curl = NULL;
}

int e2e_http_request(e2e_daemon_t *d, const char *method, const char *path,
                     const char *const *headers, const void *body, size_t len, e2e_response_t *ret)
{
    pthread_once(&curl_once, curl_init_once);
    if (!thread_curl) thread_curl = curl_easy_init();
    CURL *c = thread_curl;
    if (!c) return -ENOMEM;
    curl_easy_reset(c);

    char url[2048];
    snprintf(url, sizeof url, "%s%s", d->url, path);
    growbuf_t hdr = {0}, out = {0};
    /* "Expect:" stops curl from waiting for 100 Continue on large bodies. */
    struct curl_slist *list = curl_slist_append(NULL, "Expect:");
    for (int i = 0; headers && headers[i]; i++)
        list = curl_slist_append(list, headers[i]);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &out);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &hdr);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    }
    if (strcmp(method, "GET") == 0 && !body)
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    else if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    else if (strcmp(method, "POST") != 0 || !body)
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);

    CURLcode cr = curl_easy_perform(c);
    curl_slist_free_all(list);
    if (cr != CURLE_OK) {
        fprintf(stderr, "e2e: %s %s: %s\n", method, url, curl_easy_strerror(cr));
        free(hdr.data);
        free(out.data);
        return -EIO;
    }
    memset(ret, 0, sizeof *ret);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &ret->status);
    ret->headers = hdr.data ? hdr.data : strdup("");
    ret->body = out.data ? out.data : strdup("");
    ret->body_len = out.len;
    ret->json = json_loadb(ret->body, ret->body_len, JSON_DECODE_ANY, NULL);
    return 0;
}

void e2e_response_clear(e2e_response_t *r)
{
    free(r->headers);
    free(r->body);
    json_decref(r->json);
    memset(r, 0, sizeof *r);
}

const char *e2e_response_header(const e2e_response_t *r, const char *name, char *buf, size_t size)
{
    size_t name_len = strlen(name);
    for (const char *line = r->headers; line && *line;) {
        const char *end = strstr(line, "\r\n");
        size_t line_len = end ? (size_t)(end - line) : strlen(line);
        if (line_len > name_len && strncasecmp(line, name, name_len) == 0 &&
            line[name_len] == ':') {
            const char *v = line + name_len + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            size_t v_len = line_len - (size_t)(v - line);
            if (v_len >= size) v_len = size - 1;
            memcpy(buf, v, v_len);
            buf[v_len] = '\0';
            return buf;
        }
        if (!end) break;
        line = end + 2;
    }
    return NULL;
}

json_t *e2e_json_ok(e2e_daemon_t *d, const char *method, const char *path, const char *json_text,
                    long expect_status)
{
    static const char *const json_headers[] = {"Content-Type: application/json", NULL};
    e2e_response_t resp;
    int r = e2e_http_request(d, method, path, json_headers, json_text,
                             json_text ? strlen(json_text) : 0, &resp);
    ck_assert_msg(r == 0, "%s %s: no HTTP response", method, path);
    ck_assert_msg(resp.status == expect_status, "%s %s: status %ld, expected %ld; body: %.2000s",
                  method, path, resp.status, expect_status, resp.body);
    json_t *j = resp.json ? json_incref(resp.json) : json_null();
    e2e_response_clear(&resp);
    return j;
}

json_t *e2e_json_until(e2e_daemon_t *d, const char *method, const char *path, long expect_status,
                       double until)
{
    for (;;) {
        e2e_response_t resp;
        int r = e2e_http_request(d, method, path, NULL, NULL, 0, &resp);
        bool again = (r != 0 || resp.status == 503) && e2e_now() < until;
        if (!again) {
            ck_assert_msg(r == 0, "%s %s: no HTTP response", method, path);
            ck_assert_msg(resp.status == expect_status,
                          "%s %s: status %ld, expected %ld; body: %.2000s", method, path,
                          resp.status, expect_status, resp.body);
            json_t *j = resp.json ? json_incref(resp.json) : json_null();
            e2e_response_clear(&resp);
            return j;
        }
        if (r == 0) e2e_response_clear(&resp);
        usleep(20 * 1000);
    }
}

json_t *e2e_upload_ok(e2e_daemon_t *d, const char *dtype, const char *shape_query,
                      const void *bytes, size_t len, bool resident, long expect_status)
{
    static const char *const headers[] = {"Content-Type: application/octet-stream", NULL};
    char path[256];
    snprintf(path, sizeof path, "/v1/buffers?dtype=%s&shape=%s%s", dtype, shape_query,
             resident ? "&resident=true" : "");
    e2e_response_t resp;
    ck_assert_msg(e2e_http_request(d, "POST", path, headers, bytes, len, &resp) == 0,
                  "POST %s: no HTTP response", path);
    ck_assert_msg(resp.status == expect_status, "POST %s: status %ld, expected %ld; body: %.2000s",
                  path, resp.status, expect_status, resp.body);
    json_t *j = resp.json ? json_incref(resp.json) : json_null();
    e2e_response_clear(&resp);
    return j;
}

void e2e_output_raw_ok(e2e_daemon_t *d, const char *job_id, const char *name, void *out,
                       size_t nbytes)
{
    static const char *const headers[] = {"Accept: application/octet-stream", NULL};
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/outputs/%s", job_id, name);
    e2e_response_t resp;
    ck_assert_msg(e2e_http_request(d, "GET", path, headers, NULL, 0, &resp) == 0,
                  "GET %s: no HTTP response", path);
    ck_assert_msg(resp.status == 200 && resp.body_len == nbytes,
                  "GET %s: status %ld with %zu bytes, expected 200 with %zu", path, resp.status,
                  resp.body_len, nbytes);
    memcpy(out, resp.body, nbytes);
    e2e_response_clear(&resp);
}

char *e2e_submit_ok(e2e_daemon_t *d, const json_t *job)
{
    char *text = json_dumps(job, JSON_COMPACT);
    ck_assert(text != NULL);
    json_t *resp = e2e_json_ok(d, "POST", "/v1/jobs", text, 201);
    free(text);
    const char *id = json_string_value(json_object_get(resp, "id"));
    ck_assert_msg(id && *id, "201 without an id");
    char *copy = strdup(id);
    json_decref(resp);
    return copy;
}

json_t *e2e_get_job_ok(e2e_daemon_t *d, const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    return e2e_json_ok(d, "GET", path, NULL, 200);
}

const char *e2e_caller_name(void)
{
    static char name[64];
    if (!name[0]) {
        struct passwd *pw = getpwuid(getuid());
        if (pw && strlen(pw->pw_name) < sizeof name)
            snprintf(name, sizeof name, "%s", pw->pw_name);
        else
            snprintf(name, sizeof name, "uid:%u", (unsigned)getuid());
    }
    return name;
}

const char *e2e_job_state(const json_t *job)
{
    const char *s = json_string_value(json_object_get(job, "state"));
    return s ? s : "";
}

static bool state_is_final(const char *s)
{
    return strcmp(s, "succeeded") == 0 || strcmp(s, "failed") == 0 || strcmp(s, "cancelled") == 0;
}

json_t *e2e_wait_final_ok(e2e_daemon_t *d, const char *id, double timeout_s)
{
    double until = e2e_now() + timeout_s;
    for (;;) {
        double left = until - e2e_now();
        char path[256];
        snprintf(path, sizeof path, "/v1/jobs/%s/wait?timeout=%.3f", id,
                 left > 10 ? 10.0 : (left > 0 ? left : 0));
        json_t *job = e2e_json_until(d, "GET", path, 200, until);
        if (state_is_final(e2e_job_state(job))) return job;
        ck_assert_msg(e2e_now() < until, "job %s still %s after %.1f s", id, e2e_job_state(job),
                      timeout_s);
        json_decref(job);
    }
}

void e2e_wait_state_ok(e2e_daemon_t *d, const char *id, const char *state, double timeout_s)
{
    double until = e2e_now() + timeout_s;
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    for (;;) {
        json_t *job = e2e_json_until(d, "GET", path, 200, until);
        bool done = strcmp(e2e_job_state(job), state) == 0;
        ck_assert_msg(done || e2e_now() < until, "job %s is %s, not %s, after %.1f s", id,
                      e2e_job_state(job), state, timeout_s);
        json_decref(job);
        if (done) return;
        usleep(5 * 1000);
    }
}

long e2e_count_jobs_ok(e2e_daemon_t *d, const char *query)
{
    long count = 0;
    char cursor[128] = "";
    for (int page = 0; page < 100000; page++) {
        char path[512];
        snprintf(path, sizeof path, "/v1/jobs?limit=1000%s%s%s%s", *query ? "&" : "", query,
                 *cursor ? "&after=" : "", cursor);
        json_t *list = e2e_json_ok(d, "GET", path, NULL, 200);
        json_t *jobs = json_object_get(list, "jobs");
        ck_assert_msg(json_is_array(jobs), "GET %s: no jobs array", path);
        count += (long)json_array_size(jobs);
        const char *next = json_string_value(json_object_get(list, "next"));
        bool more = next && *next;
        if (more) snprintf(cursor, sizeof cursor, "%s", next);
        json_decref(list);
        if (!more) break;
    }
    return count;
}

double e2e_metric_ok(e2e_daemon_t *d, const char *sample)
{
    e2e_response_t resp;
    ck_assert(e2e_http_request(d, "GET", "/metrics", NULL, NULL, 0, &resp) == 0);
    ck_assert_msg(resp.status == 200, "GET /metrics: %ld", resp.status);
    double value = 0;
    size_t n = strlen(sample);
    for (const char *line = resp.body; line && *line;) {
        const char *end = strchr(line, '\n');
        if (line[0] != '#' && strncmp(line, sample, n) == 0 && line[n] == ' ') {
            value = strtod(line + n + 1, NULL);
            break;
        }
        line = end ? end + 1 : NULL;
    }
    e2e_response_clear(&resp);
    return value;
}

uint32_t e2e_rand(uint32_t *seed)
{
    uint32_t x = *seed ? *seed : 0x9e3779b9u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *seed = x;
    return x;
}

double e2e_rand_uniform(uint32_t *seed, double lo, double hi)
{
    return lo + (hi - lo) * (e2e_rand(seed) / 4294967296.0);
}

json_t *e2e_long_job_new(int ms)
{
    json_t *job =
        json_pack("{s:s, s:{s:i}, s:{s:{s:s, s:[i], s:[i,i,i,i]}}}", "op", "debug_sleep", "params",
                  "ms", ms, "inputs", "x", "dtype", "f32", "shape", 4, "data", 1, 2, 3, 4);
    ck_assert(job != NULL);
    return job;
}

const char *e2e_error_code(const json_t *body)
{
    const char *s = json_string_value(json_object_get(json_object_get(body, "error"), "code"));
    return s ? s : "";
}

const char *e2e_error_field(const json_t *body)
{
    const char *s = json_string_value(json_object_get(json_object_get(body, "error"), "field"));
    return s ? s : "";
}

double e2e_job_time(const json_t *job, const char *key)
{
    const char *v = json_string_value(json_object_get(job, key));
    struct tm tm = {0};
    int usec = 0;
    if (!v || sscanf(v, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                     &tm.tm_min, &tm.tm_sec, &usec) != 7)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (double)timegm(&tm) + usec * 1e-6;
}

double e2e_job_time_ok(const json_t *job, const char *key)
{
    double t = e2e_job_time(job, key);
    ck_assert_msg(t >= 0, "%s is not a time", key);
    return t;
}

static long flatten_into(const json_t *v, double *out, long cap, long n)
{
    if (n < 0) return n;
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) n = flatten_into(e, out, cap, n);
        return n;
    }
    if (!json_is_number(v)) return -1;
    if (n < cap) out[n] = json_number_value(v);
    return n + 1;
}

long e2e_json_flatten(const json_t *data, double *out, long cap)
{
    return flatten_into(data, out, cap, 0);
}

char *e2e_base64(const void *data, size_t len)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = data;
    char *out = malloc((len + 2) / 3 * 4 + 1);
    ck_assert(out != NULL);
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < len) v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < len) v |= p[i + 2];
        out[o++] = alphabet[(v >> 18) & 63];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < len ? alphabet[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? alphabet[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

void *e2e_npy_build(const char *descr, const int64_t *shape, int ndim, const void *data,
                    size_t data_len, size_t *ret_len)
{
    char dict[512], dims[256] = "";
    size_t pos = 0;
    for (int i = 0; i < ndim; i++)
        pos += (size_t)snprintf(dims + pos, sizeof dims - pos, "%lld,%s", (long long)shape[i],
                                i + 1 < ndim ? " " : "");
    if (ndim > 1) dims[pos - 1] = '\0'; /* numpy writes (2, 3) but (5,) */
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr, dims);
    /* Magic, version, header length, dict padded with spaces and a newline to 64 bytes. */
    size_t header = 10 + (size_t)n + 1;
    size_t padded = (header + 63) / 64 * 64;
    unsigned char *file = malloc(padded + data_len);
    ck_assert(file != NULL);
    memcpy(file, "\x93NUMPY\x01\x00", 8);
    uint16_t hlen = (uint16_t)(padded - 10);
    file[8] = (unsigned char)(hlen & 0xff);
    file[9] = (unsigned char)(hlen >> 8);
    memcpy(file + 10, dict, (size_t)n);
    memset(file + 10 + n, ' ', padded - 10 - (size_t)n);
    file[padded - 1] = '\n';
    if (data_len) memcpy(file + padded, data, data_len);
    *ret_len = padded + data_len;
    return file;
}

static size_t npy_descr_size(const char *descr)
{
    if (strlen(descr) != 3 || (descr[0] != '<' && descr[0] != '|')) return 0;
    return (size_t)(descr[2] - '0');
}

int e2e_npy_parse(const void *file, size_t len, char descr[16], int64_t shape[8], int *ret_ndim,
                  size_t *ret_data_offset)
{
    const unsigned char *p = file;
    if (len < 10 || memcmp(p, "\x93NUMPY", 6) != 0) return -EINVAL;
    size_t hlen, hstart;
    if (p[6] == 1) {
        hlen = p[8] | (size_t)p[9] << 8;
        hstart = 10;
    } else if (p[6] == 2 || p[6] == 3) {
        if (len < 12) return -EINVAL;
        hlen = p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
        hstart = 12;
    } else {
        return -EINVAL;
    }
    if (hstart + hlen > len || (hstart + hlen) % 16 != 0) return -EINVAL;
    char header[4096];
    if (hlen >= sizeof header) return -EINVAL;
    memcpy(header, p + hstart, hlen);
    header[hlen] = '\0';

    const char *d = strstr(header, "'descr':");
    const char *f = strstr(header, "'fortran_order':");
    const char *s = strstr(header, "'shape':");
    if (!d || !f || !s) return -EINVAL;
    char got_descr[16];
    if (sscanf(d, "'descr': '%15[^']'", got_descr) != 1) return -EINVAL;
    if (strncmp(f + strlen("'fortran_order':"), " False", 6) != 0) return -EINVAL;
    size_t item = npy_descr_size(got_descr);
    if (item == 0) return -EINVAL;
    const char *q = strchr(s, '(');
    if (!q) return -EINVAL;
    q++;
    int ndim = 0;
    uint64_t numel = 1;
    while (*q && *q != ')') {
        char *end;
        long long v = strtoll(q, &end, 10);
        if (end == q) {
            if (*q == ',' || *q == ' ') {
                q++;
                continue;
            }
            return -EINVAL;
        }
        if (ndim == 8 || v < 0) return -EINVAL;
        shape[ndim++] = v;
        numel *= (uint64_t)v;
        q = end;
    }
    if (*q != ')') return -EINVAL;
    if (len - hstart - hlen != numel * item) return -EINVAL;
    snprintf(descr, 16, "%s", got_descr);
    *ret_ndim = ndim;
    *ret_data_offset = hstart + hlen;
    return 0;
}

e2e_daemon_t *e2e_daemon_start_ok(const char *config_ini)
{
    e2e_daemon_t *d = NULL;
    int r = e2e_daemon_start(config_ini, &d);
    ck_assert_msg(r == 0, "gpujobd did not start: %s", strerror(-r));
    return d;
}

void e2e_wait_unix_socket_ok(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    ck_assert_uint_lt(strlen(path), sizeof addr.sun_path);
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    double until = e2e_now() + 10;
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(fd, 0);
        int r = connect(fd, (struct sockaddr *)&addr, sizeof addr);
        close(fd);
        if (r == 0) return;
        ck_assert_msg(e2e_now() < until, "Unix socket '%s' never accepted: %s", path,
                      strerror(errno));
        usleep(10000);
    }
}

int e2e_daemon_run_to_exit_ok(e2e_daemon_t *d, const char *const *extra, const char *log_name,
                              double timeout_s, char *log_path, size_t size)
{
    char state_dir[PATH_MAX];
    snprintf(state_dir, sizeof state_dir, "%s/state", e2e_daemon_dir(d));
    snprintf(log_path, size, "%s/%s", e2e_daemon_dir(d), log_name);
    const char *bin = getenv("GPUJOBD_BIN");
    ck_assert_ptr_nonnull(bin);
    const char *argv[32] = {bin,       "--listen",  "127.0.0.1:0", "--state-dir",
                            state_dir, "--backend", "cpu"};
    int argc = 7;
    for (int i = 0; extra && extra[i] && argc < 31; i++)
        argv[argc++] = extra[i];
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) _exit(127);
        dup2(fd, STDERR_FILENO);
        dup2(fd, STDOUT_FILENO);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    double until = e2e_now() + timeout_s;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (e2e_now() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            ck_abort_msg("gpujobd on '%s' kept running past %.0f s (log: %s)", state_dir, timeout_s,
                         log_path);
        }
        usleep(20 * 1000);
    }
    return status;
}

bool e2e_file_has_line(const char *path, const char *text, const char *also)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, text) && (!also || strstr(line, also));
    fclose(f);
    return found;
}

int e2e_daemon_log_count(e2e_daemon_t *d, const char *text)
{
    FILE *f = fopen(d->log_path, "re");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

const char *e2e_token_cli_ok(e2e_daemon_t *d, const char *args)
{
    static char line[512];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' token %s --state-dir '%s/state'", getenv("GPUJOBD_BIN"), args,
             e2e_daemon_dir(d));
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    line[0] = '\0';
    ck_assert_ptr_nonnull(fgets(line, sizeof line, p));
    ck_assert_int_eq(pclose(p), 0);
    line[strcspn(line, "\n")] = '\0';
    return line;
}

void e2e_token_create_ok(e2e_daemon_t *d, const char *user, const char *expires, char *ret)
{
    char args[256];
    snprintf(args, sizeof args, "create --user %s --name test%s%s", user,
             expires ? " --expires " : "", expires ? expires : "");
    snprintf(ret, E2E_TOKEN_SIZE, "%s", e2e_token_cli_ok(d, args));
    ck_assert_msg(strncmp(ret, "gj_", 3) == 0 && strlen(ret) == 80, "bad token '%s'", ret);
}
