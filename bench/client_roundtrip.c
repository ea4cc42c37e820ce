/* bench_client_roundtrip: what libgpujob adds to a tiny job's submit + wait round trip, against
 * the same two HTTP requests made with raw libcurl on the same daemon.
 *
 *   bench_client_roundtrip [--url URL | --daemon PATH] [--jobs N] [--rounds R]
 *                          [--max-overhead PCT]
 *
 * With --daemon (or $GPUJOBD_BIN and no --url) it starts gpujobd itself on a free port with a
 * temporary state directory and the CPU backend. Both sides send the same body (what the
 * library sends for an `add` of two f32[4]: the JSON, then the inputs' bytes in a binary
 * section) with a fresh Idempotency-Key, over one keep-alive connection each, then long-poll
 * /wait until the job is final. Rounds alternate a
 * block of library round trips with a block of raw ones, so drift in the daemon (its database
 * growing, the machine's load) hits both alike. Prints the median and 90th percentile of each
 * and the library's overhead on the median; with --max-overhead, exits 1 when it is larger. */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpujob.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

/* ---- A daemon of our own ----------------------------------------------------------------- */

static pid_t daemon_pid;
static char state_dir[64];

static int daemon_start(const char *bin, char *url, size_t url_size)
{
    snprintf(state_dir, sizeof state_dir, "/tmp/gj-bench-XXXXXX");
    if (!mkdtemp(state_dir)) return -errno;
    int fds[2];
    if (pipe(fds) < 0) return -errno;
    daemon_pid = fork();
    if (daemon_pid < 0) return -errno;
    if (daemon_pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        execl(bin, bin, "--listen", "127.0.0.1:0", "--state-dir", state_dir, "--backend", "cpu",
              (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *log = fdopen(fds[0], "r");
    char line[512];
    while (fgets(line, sizeof line, log)) {
        char *p = strstr(line, "listening on http://");
        if (!p) continue;
        p += strlen("listening on ");
        p[strcspn(p, " \r\n")] = '\0';
        snprintf(url, url_size, "%s", p);
        /* Keep draining the daemon's stderr so it never blocks on a full pipe. */
        if (fork() == 0) {
            while (fgets(line, sizeof line, log)) {
            }
            _exit(0);
        }
        fclose(log);
        return 0;
    }
    fclose(log);
    return -ECHILD;
}

static void daemon_stop(void)
{
    if (daemon_pid <= 0) return;
    kill(daemon_pid, SIGTERM);
    waitpid(daemon_pid, NULL, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", state_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", state_dir);
}

/* ---- The two clients --------------------------------------------------------------------- */

typedef struct raw_client {
    CURL *curl;
    const char *url;
    char *buf;
    size_t len, cap;
} raw_client_t;

static size_t raw_on_body(char *p, size_t size, size_t n, void *arg)
{
    raw_client_t *rc = arg;
    size_t k = size * n;
    if (rc->len + k + 1 > rc->cap) {
        rc->cap = (rc->len + k + 1) * 2;
        rc->buf = realloc(rc->buf, rc->cap);
    }
    memcpy(rc->buf + rc->len, p, k);
    rc->len += k;
    rc->buf[rc->len] = '\0';
    return k;
}

/* A submission as libgpujob sends it: json_len bytes of JSON, then the binary section. */
typedef struct raw_body {
    char *bytes;
    size_t len, json_len;
} raw_body_t;

/* One request on the kept-alive handle (a GET without body); 0 when the status is expect. */
static int raw_request(raw_client_t *rc, const char *path, const raw_body_t *body, const char *key,
                       long expect)
{
    char url[512], header[160];
    snprintf(url, sizeof url, "%s%s", rc->url, path);
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
    h = curl_slist_append(h, "Accept: application/json");
    if (body) {
        h = curl_slist_append(h, "Content-Type: application/octet-stream");
        snprintf(header, sizeof header, "Gpujob-Json-Length: %zu", body->json_len);
        h = curl_slist_append(h, header);
        snprintf(header, sizeof header, "Idempotency-Key: %s", key);
        h = curl_slist_append(h, header);
    }
    rc->len = 0;
    curl_easy_setopt(rc->curl, CURLOPT_URL, url);
    curl_easy_setopt(rc->curl, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(rc->curl, CURLOPT_WRITEFUNCTION, raw_on_body);
    curl_easy_setopt(rc->curl, CURLOPT_WRITEDATA, rc);
    curl_easy_setopt(rc->curl, CURLOPT_NOSIGNAL, 1L);
    if (body) {
        curl_easy_setopt(rc->curl, CURLOPT_POSTFIELDS, body->bytes);
        curl_easy_setopt(rc->curl, CURLOPT_POSTFIELDSIZE, (long)body->len);
    } else {
        curl_easy_setopt(rc->curl, CURLOPT_HTTPGET, 1L);
    }
    CURLcode code = curl_easy_perform(rc->curl);
    long status = 0;
    curl_easy_getinfo(rc->curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    return code == CURLE_OK && status == expect ? 0 : -EIO;
}

static int raw_roundtrip(raw_client_t *rc, const raw_body_t *body, long seq)
{
    char key[64], path[256], id[64];
    snprintf(key, sizeof key, "bench-raw-%ld-%ld", (long)getpid(), seq);
    if (raw_request(rc, "/v1/jobs", body, key, 201) < 0) return -EIO;
    const char *p = strstr(rc->buf, "\"id\":");
    if (!p || sscanf(p, "\"id\":%*[ \"]%63[^\"]", id) != 1) return -EBADMSG;
    snprintf(path, sizeof path, "/v1/jobs/%s/wait?timeout=25.000", id);
    if (raw_request(rc, path, NULL, NULL, 200) < 0) return -EIO;
    return strstr(rc->buf, "\"succeeded\"") ? 0 : -EBADMSG;
}

static int lib_roundtrip(gpujob_client_t *c, const gpujob_spec_t *spec)
{
    gpujob_job_t *job = NULL, *done = NULL;
    int r = gpujob_submit(c, spec, &job);
    if (r >= 0) r = gpujob_wait(c, gpujob_job_id(job), 25.0, &done);
    if (r >= 0 && gpujob_job_state(done) != GPUJOB_SUCCEEDED) r = -EBADMSG;
    gpujob_job_free(done);
    gpujob_job_free(job);
    return r;
}

int main(int argc, char **argv)
{
    const char *url = getenv("GPUJOB_URL"), *bin = getenv("GPUJOBD_BIN");
    int jobs = 50, rounds = 10;
    double max_overhead = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--url") == 0 && i + 1 < argc)
            url = argv[++i], bin = NULL;
        else if (strcmp(argv[i], "--daemon") == 0 && i + 1 < argc)
            bin = argv[++i], url = NULL;
        else if (strcmp(argv[i], "--jobs") == 0 && i + 1 < argc)
            jobs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--max-overhead") == 0 && i + 1 < argc)
            max_overhead = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_client_roundtrip [--url URL | --daemon PATH] [--jobs N] "
                            "[--rounds R] [--max-overhead PCT]\n");
            return 2;
        }
    }
    if (jobs < 1 || rounds < 1) return 2;
    char own_url[128];
    if (bin && (!url || !url[0])) {
        if (daemon_start(bin, own_url, sizeof own_url) < 0) {
            fprintf(stderr, "could not start %s\n", bin);
            return 2;
        }
        url = own_url;
    }
    if (!url || strncmp(url, "http", 4) != 0) {
        fprintf(stderr, "give --url http://HOST:PORT or --daemon PATH (or $GPUJOBD_BIN)\n");
        return 2;
    }

    gpujob_client_t *c = NULL;
    char err[256] = "";
    if (gpujob_client_new(url, &c, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        daemon_stop();
        return 2;
    }
    float x[4] = {1, 2, 3, 4}, y[4] = {0.5f, 0.25f, 0.125f, 0};
    int64_t n = 4;
    gpujob_tensor_t tx, ty;
    gpujob_spec_t *spec = NULL;
    gpujob_tensor_init(&tx, GPUJOB_F32, 1, &n, x);
    gpujob_tensor_init(&ty, GPUJOB_F32, 1, &n, y);
    gpujob_spec_new("add", &spec);
    gpujob_spec_input(spec, "x", &tx);
    gpujob_spec_input(spec, "y", &ty);
    static const char json[] =
        "{\"op\":\"add\",\"params\":{},\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[4],"
        "\"binary_offset\":0},\"y\":{\"dtype\":\"f32\",\"shape\":[4],\"binary_offset\":16}}}";
    raw_body_t raw_body = {.json_len = sizeof json - 1,
                           .len = sizeof json - 1 + sizeof x + sizeof y};
    raw_body.bytes = malloc(raw_body.len);
    memcpy(raw_body.bytes, json, sizeof json - 1);
    memcpy(raw_body.bytes + sizeof json - 1, x, sizeof x);
    memcpy(raw_body.bytes + sizeof json - 1 + sizeof x, y, sizeof y);
    const raw_body_t *body = &raw_body;
    raw_client_t rc = {.curl = curl_easy_init(), .url = url};

    double *lib = malloc(sizeof(double) * (size_t)(jobs * rounds));
    double *raw = malloc(sizeof(double) * (size_t)(jobs * rounds));
    int status = 0;
    long seq = 0;
    /* Warm up both connections and the daemon's caches. */
    for (int i = 0; i < 10 && status == 0; i++)
        if (lib_roundtrip(c, spec) < 0 || raw_roundtrip(&rc, body, seq++) < 0) status = 2;
    for (int r = 0; r < rounds && status == 0; r++) {
        for (int i = 0; i < jobs && status == 0; i++) {
            double t0 = now_us();
            if (lib_roundtrip(c, spec) < 0) status = 2;
            lib[r * jobs + i] = now_us() - t0;
        }
        for (int i = 0; i < jobs && status == 0; i++) {
            double t0 = now_us();
            if (raw_roundtrip(&rc, body, seq++) < 0) status = 2;
            raw[r * jobs + i] = now_us() - t0;
        }
    }
    if (status != 0) {
        fprintf(stderr, "a round trip failed: %s\n", gpujob_errmsg(c));
    } else {
        int total = jobs * rounds;
        double lib_med = percentile(lib, total, 0.5), lib_p90 = percentile(lib, total, 0.9);
        double raw_med = percentile(raw, total, 0.5), raw_p90 = percentile(raw, total, 0.9);
        double overhead = (lib_med - raw_med) / raw_med * 100.0;
        printf("submit+wait of a tiny add job, %d round trips each, against %s\n", total, url);
        printf("  libgpujob:  median %8.1f us  p90 %8.1f us\n", lib_med, lib_p90);
        printf("  raw curl:   median %8.1f us  p90 %8.1f us\n", raw_med, raw_p90);
        printf("  library overhead on the median: %+.1f%%\n", overhead);
        if (max_overhead >= 0 && overhead > max_overhead) {
            printf("  over the %.1f%% limit\n", max_overhead);
            status = 1;
        }
    }
    free(lib);
    free(raw);
    free(raw_body.bytes);
    free(rc.buf);
    curl_easy_cleanup(rc.curl);
    gpujob_spec_free(spec);
    gpujob_client_free(c);
    daemon_stop();
    return status;
}
