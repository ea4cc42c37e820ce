/* Handlers about the daemon itself: health, readiness, metrics and /v1/info. */
#include "api_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/op.h"

/* Healthy unless the store was found damaged (the integrity check after an unclean stop):
 * the daemon then refuses every write and wants its database restored, which a restart alone
 * does not do. */
int api_handle_healthz(api_request_t *req)
{
    char reason[STORE_DAMAGE_SIZE];
    if (sched_store_damaged(req->env->sched, reason, sizeof reason)) {
        api_respond_json(req, 503,
                         json_pack("{s:s, s:s}", "status", "store_damaged", "reason", reason));
        return API_DONE;
    }
    api_respond_json(req, 200, json_pack("{s:s}", "status", "ok"));
    return API_DONE;
}

/* Ready while accepting work with room on the store's disk, while no batch the watchdog gave
 * up on is still held by a stuck worker or device ("recovering": the CPU backend serves on a
 * replacement worker meanwhile, but a thread is lost to it until it returns, and the CUDA
 * backend is restarting), and, for a backend with devices, while one of them serves; each
 * device's state shows a reset in progress or a device lost. A full disk says why in reason. */
int api_handle_readyz(api_request_t *req)
{
    sched_stats_t stats;
    sched_get_stats(req->env->sched, &stats);
    char reason[STORE_DAMAGE_SIZE];
    bool damaged = sched_store_damaged(req->env->sched, reason, sizeof reason);
    bool full =
        !damaged && !stats.store_failed && sched_disk_full(req->env->sched, reason, sizeof reason);
    const char *status = damaged              ? "store_damaged"
                         : stats.store_failed ? "store_failed"
                         : full               ? "disk_full"
                         : stats.accepting && !atomic_load(&req->env->intake_stopped) ? "ready"
                                                                                      : "draining";
    json_t *backend = sched_describe_backend(req->env->sched);
    json_t *states = json_array();
    bool serving = false;
    size_t i;
    json_t *device;
    json_array_foreach(json_object_get(backend, "devices"), i, device)
    {
        const char *state = json_string_value(json_object_get(device, "state"));
        serving |= state && strcmp(state, "ready") == 0;
        json_array_append_new(states,
                              json_pack("{s:O, s:s}", "index", json_object_get(device, "index"),
                                        "state", state ? state : "unknown"));
    }
    json_decref(backend);
    if (strcmp(status, "ready") == 0 && stats.stuck_batches > 0) status = "recovering";
    if (strcmp(status, "ready") == 0 && json_array_size(states) > 0 && !serving)
        status = "no_device";
    json_t *body = json_pack("{s:s}", "status", status);
    if (full || damaged) json_object_set_new(body, "reason", json_string(reason));
    if (stats.stuck_batches > 0)
        json_object_set_new(body, "stuck_batches", json_integer(stats.stuck_batches));
    if (json_array_size(states) > 0)
        json_object_set_new(body, "devices", states);
    else
        json_decref(states);
    api_respond_json(req, strcmp(status, "ready") == 0 ? 200 : 503, body);
    return API_DONE;
}

/* A growing text buffer for the Prometheus exposition. */
typedef struct text {
    char *buf;
    size_t len, cap;
    bool failed;
} text_t;

static void text_printf(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(text_t *t, const char *fmt, ...)
{
    for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) break;
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *buf = realloc(t->buf, cap);
        if (!buf) break;
        t->buf = buf;
        t->cap = cap;
    }
    t->failed = true;
}

static void metric(text_t *t, const char *name, const char *type, const char *help, long value)
{
    text_printf(t, "# HELP %s %s\n# TYPE %s %s\n%s %ld\n", name, help, name, type, name, value);
}

/* The latest GPU sample's gauges; nothing when the daemon samples no GPU. */
static void gpu_gauges_text(text_t *t, gpu_metrics_t *m)
{
    int n = gpu_metrics_device_count(m);
    if (n == 0) return;
    gpu_sample_t *samples = calloc((size_t)n, sizeof *samples);
    char *gauges = NULL;
    if (samples) {
        n = gpu_metrics_snapshot(m, samples, n);
        gauges = gpu_metrics_format_prometheus(samples, n);
    }
    if (gauges)
        text_printf(t, "%s", gauges);
    else
        t->failed = true;
    free(gauges);
    free(samples);
}

/* Each device's state as the backend describes it: ready or not, resets after sticky faults,
 * resident bytes and pool memory in use. Nothing for a backend without devices. */
static void device_gauges_text(text_t *t, api_request_t *req)
{
    static const struct {
        const char *name, *type, *help, *field;
    } gauges[] = {
        {"gpujobd_gpu_ready", "gauge", "1 while the device serves, 0 while it resets or failed.",
         "state"},
        {"gpujobd_gpu_resets_total", "counter",
         "Device contexts lost to sticky CUDA errors (each reset by a restart).", "resets"},
        {"gpujobd_gpu_resident_bytes", "gauge", "Bytes of resident buffers on the device.",
         "resident_bytes"},
        {"gpujobd_gpu_pool_in_use_bytes", "gauge", "Device memory reserved by running batches.",
         "pool_in_use"},
    };
    json_t *backend = sched_describe_backend(req->env->sched);
    json_t *devices = json_object_get(backend, "devices");
    for (size_t g = 0; g < sizeof gauges / sizeof gauges[0] && json_array_size(devices); g++) {
        text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", gauges[g].name, gauges[g].help,
                    gauges[g].name, gauges[g].type);
        size_t i;
        json_t *device;
        json_array_foreach(devices, i, device)
        {
            json_t *v = json_object_get(device, gauges[g].field);
            json_int_t value = json_is_string(v) ? strcmp(json_string_value(v), "ready") == 0
                                                 : json_integer_value(v);
            text_printf(t, "%s{device=\"%" JSON_INTEGER_FORMAT "\"} %" JSON_INTEGER_FORMAT "\n",
                        gauges[g].name, json_integer_value(json_object_get(device, "index")),
                        value);
        }
    }
    json_decref(backend);
}

/* The buffers' bytes, summed over their rows: the durable ones, the resident ones and the
 * ephemeral ones (resident too, never stored). Nothing when the store cannot be read. */
static void buffer_gauges_text(text_t *t, api_request_t *req)
{
    store_reader_t *rd = req->env->reader(req->env);
    store_usage_t u;
    if (!rd || store_usage_get(rd, NULL, &u) < 0) return;
    metric(t, "gpujobd_buffer_stored_bytes", "gauge", "Bytes of durable (stored) buffers.",
           (long)u.buffer_bytes);
    metric(t, "gpujobd_buffer_resident_bytes", "gauge",
           "Bytes of resident buffers, ephemeral ones included.", (long)u.resident_bytes);
    metric(t, "gpujobd_buffer_ephemeral_bytes", "gauge",
           "Bytes of ephemeral buffers: in device (or, on the CPU backend, host) memory only, "
           "never stored, gone on restart.",
           (long)u.ephemeral_bytes);
}

/* A label value as the Prometheus text format writes it: backslash, double quote and line
 * feed escaped (\\, \", \n), every other byte as it is. */
static void label_value_text(text_t *t, const char *v)
{
    for (const char *p = v;; p++) {
        size_t plain = strcspn(p, "\\\"\n");
        text_printf(t, "%.*s", (int)plain, p);
        p += plain;
        if (!*p) return;
        text_printf(t, "\\%c", *p == '\n' ? 'n' : *p);
    }
}

/* Jobs queued and running per user, from the scheduler's latest snapshot (scheduler.h says
 * which users it holds), and how many users had jobs then. */
static void user_gauges_text(text_t *t, sched_t *sched)
{
    static const struct {
        const char *name, *help;
        bool running;
    } families[] = {
        {"gpujobd_user_jobs_queued", "Jobs waiting to run, per user.", false},
        {"gpujobd_user_jobs_running", "Jobs running now, per user.", true},
    };
    sched_user_gauge_t *rows = malloc(SCHED_USER_GAUGES_MAX * sizeof *rows);
    if (!rows) {
        t->failed = true;
        return;
    }
    long users = 0;
    int n = sched_get_user_gauges(sched, rows, SCHED_USER_GAUGES_MAX, &users);
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        text_printf(t, "# HELP %s %s\n# TYPE %s gauge\n", families[f].name, families[f].help,
                    families[f].name);
        for (int i = 0; i < n; i++) {
            text_printf(t, "%s{user=\"", families[f].name);
            label_value_text(t, rows[i].user);
            text_printf(t, "\"} %ld\n", families[f].running ? rows[i].running : rows[i].queued);
        }
    }
    free(rows);
    text_printf(t,
                "# HELP gpujobd_users_with_jobs Users with jobs queued or running; the per-user "
                "gauges show the %d with the most queued.\n"
                "# TYPE gpujobd_users_with_jobs gauge\ngpujobd_users_with_jobs %ld\n",
                SCHED_USER_GAUGES_MAX, users);
}

/* One histogram family: cumulative buckets, +Inf, sum and count. */
static void histogram_text(text_t *t, const char *name, const char *help,
                           const sched_histogram_t *h)
{
    text_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < h->n; i++)
        text_printf(t, "%s_bucket{le=\"%g\"} %ld\n", name, h->bounds[i], h->le[i]);
    text_printf(t, "%s_bucket{le=\"+Inf\"} %ld\n%s_sum %.15g\n%s_count %ld\n", name, h->count, name,
                h->sum, name, h->count);
}

static void histograms_text(text_t *t, sched_t *sched)
{
    sched_histograms_t h;
    sched_get_histograms(sched, &h);
    histogram_text(t, "gpujobd_job_latency_seconds",
                   "Time from a job's submission to its success or failure.", &h.latency_s);
    histogram_text(t, "gpujobd_batch_jobs", "Jobs in each batch handed to the executor.",
                   &h.batch_jobs);
}

int api_handle_metrics(api_request_t *req)
{
    if (api_request_require_admin(req, NULL, "read /metrics")) return API_DONE;
    sched_stats_t s;
    sched_get_stats(req->env->sched, &s);
    text_t t = {.buf = malloc(4096), .cap = 4096};
    t.failed = !t.buf;
    metric(&t, "gpujobd_jobs_submitted_total", "counter", "Jobs accepted.", s.submitted_total);
    metric(&t, "gpujobd_jobs_succeeded_total", "counter", "Jobs that succeeded.",
           s.succeeded_total);
    metric(&t, "gpujobd_jobs_failed_total", "counter", "Jobs that failed.", s.failed_total);
    metric(&t, "gpujobd_jobs_cancelled_total", "counter", "Jobs cancelled.", s.cancelled_total);
    metric(&t, "gpujobd_jobs_queued", "gauge", "Jobs waiting to run.", s.queued);
    metric(&t, "gpujobd_jobs_running", "gauge", "Jobs running now.", s.running);
    user_gauges_text(&t, req->env->sched);
    metric(&t, "gpujobd_batches_total", "counter", "Launches (batches) run.", s.batches_total);
    metric(&t, "gpujobd_batched_jobs_total", "counter", "Jobs run inside batches.",
           s.batched_jobs_total);
    metric(&t, "gpujobd_watchdog_expired_total", "counter",
           "Batches the watchdog gave up on: no progress within the bound from their cost.",
           s.watchdog_expired_total);
    metric(&t, "gpujobd_watchdog_stuck_batches", "gauge",
           "Batches given up on whose worker or device has not come back from them yet.",
           s.stuck_batches);
    metric(&t, "gpujobd_store_damaged", "gauge",
           "1 once the store's integrity check found damage: every write is refused.",
           sched_store_damaged(req->env->sched, NULL, 0));
    metric(&t, "gpujobd_store_bytes", "gauge",
           "Bytes the store keeps (database pages in use and blob files), at the last measure.",
           s.store_bytes);
    metric(&t, "gpujobd_store_max_bytes", "gauge",
           "The store's bound ([store] max_bytes); 0: none.", (long)req->cfg->max_bytes);
    metric(&t, "gpujobd_store_expired_early_bytes_total", "counter",
           "Tensor bytes the bound dropped before retention: outputs, and inputs of deleted jobs.",
           s.store_expired_bytes_total);
    metric(&t, "gpujobd_store_expired_early_jobs_total", "counter",
           "Finished jobs whose outputs the bound expired before retention.",
           s.store_expired_jobs_total);
    metric(&t, "gpujobd_store_deleted_early_jobs_total", "counter",
           "Finished jobs the bound deleted before retention.", s.store_deleted_jobs_total);
    text_printf(&t, "# HELP gpujobd_http_requests_total HTTP responses sent, by status.\n"
                    "# TYPE gpujobd_http_requests_total counter\n");
    for (int code = 100; code < API_STATUS_MAX; code++) {
        long n = atomic_load(&req->env->responses[code]);
        if (n) text_printf(&t, "gpujobd_http_requests_total{code=\"%d\"} %ld\n", code, n);
    }
    text_printf(&t,
                "# HELP gpujobd_http_connections HTTP connections open now, by listener.\n"
                "# TYPE gpujobd_http_connections gauge\n"
                "gpujobd_http_connections{listener=\"tcp\"} %ld\n"
                "gpujobd_http_connections{listener=\"unix\"} %ld\n",
                atomic_load(&req->env->connections[0]), atomic_load(&req->env->connections[1]));
    histograms_text(&t, req->env->sched);
    gpu_gauges_text(&t, req->env->gpu_metrics);
    device_gauges_text(&t, req);
    buffer_gauges_text(&t, req);
    if (t.failed) {
        free(t.buf);
        api_respond_error(req, 500, "internal", NULL, "out of memory");
        return API_DONE;
    }
    api_respond_bytes(req, 200, "text/plain; version=0.0.4; charset=utf-8", t.buf, t.len);
    return API_DONE;
}

static json_t *op_json(const op_def_t *op)
{
    json_t *inputs = json_array(), *params = json_array();
    for (int j = 0; j < op->n_inputs; j++)
        json_array_append_new(inputs, json_pack("{s:s, s:b}", "name", op->input_names[j],
                                                "required", (op->required_inputs >> j) & 1));
    for (const char *const *p = op->param_names; p && *p; p++)
        json_array_append_new(params, json_string(*p));
    return json_pack("{s:s, s:s, s:o, s:o}", "name", op->name, "summary",
                     op->summary ? op->summary : "", "inputs", inputs, "params", params);
}

int api_handle_info(api_request_t *req)
{
    const config_t *cfg = req->cfg;
    json_t *ops = json_array(), *dtypes = json_array();
    for (int i = 0; i < op_count(); i++)
        json_array_append_new(ops, op_json(op_at(i)));
    for (int d = 0; d < DTYPE_COUNT; d++)
        json_array_append_new(dtypes, json_string(dtype_name((dtype_t)d)));
    json_t *backend = sched_describe_backend(req->env->sched);
    json_t *limits = json_pack(
        "{s:I, s:I, s:i, s:i, s:i, s:I, s:i, s:i}", "max_body_bytes",
        (json_int_t)cfg->max_body_bytes, "max_tensor_bytes", (json_int_t)cfg->max_tensor_bytes,
        "max_dims", TENSOR_MAX_DIMS, "max_jobs_per_request", cfg->max_jobs_per_request,
        "max_queued_per_user", cfg->max_queued_per_user, "max_inline_output_bytes",
        (json_int_t)cfg->max_inline_output_bytes, "max_wait_ms", cfg->max_wait_ms,
        "max_running_per_user", cfg->max_running_per_user);
    api_respond_json(req, 200,
                     json_pack("{s:s, s:o, s:o, s:o, s:o, s:{s:s, s:b}}", "version",
                               GPUJOBD_VERSION, "backend", backend ? backend : json_null(), "ops",
                               ops, "dtypes", dtypes, "limits", limits, "user", "name",
                               req->user.name, "admin", req->user.admin));
    return API_DONE;
}
