/* GET /v1/stats: what the status page's "now" panel shows, in one JSON answer, so that no
 * browser parses the Prometheus text of /metrics (which is for admins only anyway).
 *
 *   gpus    each device's state and latest sample: utilisation, memory, temperature
 *   queue   jobs queued and running, in all (the scheduler's counters) and per user (as the
 *           scheduler's loop counts them now: sched_user_counts, every user, uncapped)
 *   recent  jobs that succeeded in the last ?minutes= (1..60, default 15), per minute: how
 *           many, and the p50 and p99 of their latency, from submission to end
 *
 * A non-admin sees the devices and the totals, which name nobody, and of the per-user rows and
 * the recent jobs only their own. The recent jobs are those submitted in the window (their ids
 * sort by creation time, so the store reads them by its primary key): a job that waited longer
 * than the window before it ended is not counted.
 *
 * The devices and the recent jobs are read on the HTTP thread; the answer then waits for the
 * loop's per-user counts and leaves from their reply, with the totals read at that moment. */
#include "api_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/id.h"

/* Jobs one answer reads from the store at most for the recent series: past it its "complete"
 * is false and the series is that of the jobs read. */
#define STATS_SCAN_MAX 20000
#define STATS_PAGE 1000
#define STATS_BUCKET_S 60

/* The devices: the backend's description (index, state) with the sampler's readings, each
 * null when the sampler has none. An empty array for a backend without devices. */
static json_t *stats_gpus(api_request_t *req)
{
    json_t *backend = sched_describe_backend(req->env->sched);
    json_t *devices = json_object_get(backend, "devices");
    gpu_metrics_t *m = req->env->gpu_metrics;
    int n = m ? gpu_metrics_device_count(m) : 0;
    gpu_sample_t *samples = n > 0 ? calloc((size_t)n, sizeof *samples) : NULL;
    n = samples ? gpu_metrics_snapshot(m, samples, n) : 0;
    json_t *gpus = json_array();
    size_t i;
    json_t *device;
    json_array_foreach(devices, i, device)
    {
        json_int_t index = json_integer_value(json_object_get(device, "index"));
        const gpu_sample_t *s = NULL;
        for (int k = 0; k < n && !s; k++)
            if (samples[k].index == index) s = &samples[k];
        unsigned valid = s ? s->valid : 0;
        json_t *state = json_object_get(device, "state");
        json_array_append_new(
            gpus,
            json_pack(
                "{s:I, s:O, s:o, s:o, s:o, s:o}", "index", index, "state",
                state ? state : json_null(), "utilization_pct",
                valid & GPU_SAMPLE_UTILIZATION ? json_integer(s->utilization_pct) : json_null(),
                "memory_used_bytes",
                valid & GPU_SAMPLE_MEMORY ? json_integer((json_int_t)s->memory_used) : json_null(),
                "memory_total_bytes",
                valid & GPU_SAMPLE_MEMORY ? json_integer((json_int_t)s->memory_total) : json_null(),
                "temperature_c",
                valid & GPU_SAMPLE_TEMPERATURE ? json_integer(s->temperature_c) : json_null()));
    }
    free(samples);
    json_decref(backend);
    return gpus;
}

/* Calls visit on every job of q, a page at a time, up to STATS_SCAN_MAX: 1 when there were
 * more, 0 when all were read, or the store's negative errno. */
static int stats_scan(store_reader_t *rd, store_list_query_t q,
                      void (*visit)(const job_t *job, void *ud), void *ud)
{
    char after[ID_SIZE] = "";
    if (q.after) snprintf(after, sizeof after, "%s", q.after);
    for (size_t seen = 0; seen < STATS_SCAN_MAX;) {
        job_t **jobs = NULL;
        size_t n = 0;
        q.after = after;
        q.limit = STATS_PAGE;
        int r = store_jobs_list(rd, &q, &jobs, &n);
        if (r < 0) return r;
        for (size_t i = 0; i < n; i++)
            visit(jobs[i], ud);
        if (n > 0) snprintf(after, sizeof after, "%s", jobs[n - 1]->id);
        job_json_free_jobs(jobs, n);
        seen += n;
        if (n < STATS_PAGE) return 0;
    }
    return 1;
}

/* The queue: totals from the scheduler's counters, and the loop's rows per user (their own for
 * non-admins), by name; every live job is counted, so the rows are complete. */
static json_t *stats_queue(sched_t *sched, const sched_user_gauge_t *users, size_t n)
{
    sched_stats_t s;
    sched_get_stats(sched, &s);
    json_t *rows = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(rows, json_pack("{s:I, s:I, s:s}", "queued",
                                              (json_int_t)users[i].queued, "running",
                                              (json_int_t)users[i].running, "user", users[i].user));
    return json_pack("{s:I, s:I, s:o, s:b}", "queued", (json_int_t)s.queued, "running",
                     (json_int_t)s.running, "users", rows, "complete", true);
}

/* The recent jobs' (minute, latency) pairs, gathered by the scan. */
typedef struct recent {
    int64_t since_us;
    int minutes;
    struct recent_point {
        int minute;
        double latency_ms;
    } * points;
    size_t n, cap;
    bool failed;
} recent_t;

static void recent_add(const job_t *job, void *ud)
{
    recent_t *rc = ud;
    if (job->state != JOB_SUCCEEDED || job->finished_us < rc->since_us || rc->failed) return;
    int minute = (int)((job->finished_us - rc->since_us) / (STATS_BUCKET_S * 1000000LL));
    if (minute >= rc->minutes) minute = rc->minutes - 1;
    if (rc->n == rc->cap) {
        size_t cap = rc->cap ? rc->cap * 2 : 256;
        struct recent_point *grown = realloc(rc->points, cap * sizeof *grown);
        if (!grown) {
            rc->failed = true;
            return;
        }
        rc->points = grown;
        rc->cap = cap;
    }
    rc->points[rc->n++] = (struct recent_point){minute, (job->finished_us - job->created_us) / 1e3};
}

static int point_order(const void *a, const void *b)
{
    const struct recent_point *x = a, *y = b;
    if (x->minute != y->minute) return x->minute < y->minute ? -1 : 1;
    return (x->latency_ms > y->latency_ms) - (x->latency_ms < y->latency_ms);
}

static int latency_order(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The nearest-rank quantile q of sorted[0..n): null for none. */
static json_t *quantile_json(const double *sorted, size_t n, double q)
{
    if (n == 0) return json_null();
    size_t rank = (size_t)ceil(q * (double)n);
    return json_real(sorted[rank ? rank - 1 : 0]);
}

/* The series of rc, minute by minute, and its totals: from points sorted by minute. */
static json_t *recent_json(const recent_t *rc, bool complete)
{
    double *all = malloc((rc->n ? rc->n : 1) * sizeof *all), *in_minute = all;
    if (!all) return NULL;
    json_t *series = json_array();
    size_t i = 0;
    for (int m = 0; m < rc->minutes; m++) {
        size_t first = i;
        for (; i < rc->n && rc->points[i].minute == m; i++)
            all[i] = rc->points[i].latency_ms;
        in_minute = all + first;
        size_t n = i - first;
        json_array_append_new(
            series, json_pack("{s:o, s:I, s:o, s:o}", "start",
                              job_json_time(rc->since_us + (int64_t)m * STATS_BUCKET_S * 1000000),
                              "jobs", (json_int_t)n, "p50_ms", quantile_json(in_minute, n, 0.5),
                              "p99_ms", quantile_json(in_minute, n, 0.99)));
    }
    qsort(all, rc->n, sizeof *all, latency_order);
    json_t *j = json_pack("{s:i, s:i, s:I, s:o, s:o, s:o, s:b}", "minutes", rc->minutes, "bucket_s",
                          STATS_BUCKET_S, "jobs", (json_int_t)rc->n, "p50_ms",
                          quantile_json(all, rc->n, 0.5), "p99_ms", quantile_json(all, rc->n, 0.99),
                          "series", series, "complete", complete);
    free(all);
    return j;
}

/* The recent series: the caller's jobs (everyone's for admins) submitted since the window
 * began, read by id from the first id that window could have. */
static int stats_recent(api_request_t *req, store_reader_t *rd, int minutes, json_t **ret)
{
    int64_t now = now_us();
    /* Whole minutes, so that a page polling every few seconds sees stable buckets. */
    int64_t bucket_us = STATS_BUCKET_S * 1000000LL;
    recent_t rc = {.since_us = (now / bucket_us - minutes + 1) * bucket_us, .minutes = minutes};
    char first[ID_SIZE];
    snprintf(first, sizeof first, "j%012llx000000000000", (unsigned long long)(rc.since_us / 1000));
    store_list_query_t q = {.owner = api_request_owner_filter(req), .state = -1, .after = first};
    int r = stats_scan(rd, q, recent_add, &rc);
    if (r >= 0 && rc.failed) r = -ENOMEM;
    if (r >= 0 && rc.n > 1) qsort(rc.points, rc.n, sizeof *rc.points, point_order);
    json_t *j = r >= 0 ? recent_json(&rc, r == 0) : NULL;
    free(rc.points);
    if (r < 0) return r;
    if (!j) return -ENOMEM;
    *ret = j;
    return 0;
}

/* What an answer holds while the loop counts the users' jobs: the parts read before. */
typedef struct stats_pending {
    api_request_t *req;
    json_t *gpus, *recent;
} stats_pending_t;

/* The loop's per-user counts: the answer, whole, on the loop thread. */
static void stats_counted(void *token, const sched_result_t *res)
{
    stats_pending_t *p = token;
    api_request_t *req = p->req;
    if (res->err)
        api_respond_errno(req, res->err, res->message);
    else
        api_respond_json(req, 200,
                         json_pack("{s:o, s:O, s:o, s:O}", "at", job_json_time(now_us()), "gpus",
                                   p->gpus, "queue",
                                   stats_queue(req->env->sched, res->users, res->n_users), "recent",
                                   p->recent));
    json_decref(p->gpus);
    json_decref(p->recent);
    free(p);
    api_request_resume(req);
}

int api_handle_stats(api_request_t *req)
{
    static const char *const allowed[] = {"minutes", NULL};
    long minutes;
    if (api_query_check(req, allowed) || api_query_int(req, "minutes", 1, 60, 15, &minutes))
        return API_DONE;
    store_reader_t *rd = api_request_reader(req);
    if (!rd) return API_DONE;
    json_t *recent = NULL;
    int r = stats_recent(req, rd, (int)minutes, &recent);
    if (r < 0) {
        api_respond_error(req, r == -ENOMEM ? 500 : 503, r == -ENOMEM ? "internal" : "unavailable",
                          NULL, "the store could not be read: %s", strerror(-r));
        return API_DONE;
    }
    stats_pending_t *p = malloc(sizeof *p);
    if (!p) {
        json_decref(recent);
        api_respond_errno(req, -ENOMEM, NULL);
        return API_DONE;
    }
    *p = (stats_pending_t){.req = req, .gpus = stats_gpus(req), .recent = recent};
    api_request_suspend(req);
    sched_user_counts(req->env->sched, api_request_owner_filter(req), stats_counted, p);
    return API_PENDING;
}
