/* The caller's usage (/v1/usage): what the user holds now and the daemon's per-day, per-op
 * rollup of the jobs that ended, for a range of days and, for admins, other users; and the
 * user's GPU-time budgets. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpujob_internal.h"

/* A row's sums (the totals' too) from their JSON object: 0 or -EBADMSG. */
static int usage_row_from_json(const json_t *o, gpujob_usage_row_t *ret)
{
    static const char *const keys[] = {"jobs",   "succeeded", "failed",   "cancelled",
                                       "run_us", "gpu_ns",    "bytes_in", "bytes_out"};
    gpujob_usage_row_t row = {.jobs = 0};
    int64_t *fields[] = {&row.jobs,   &row.succeeded, &row.failed,   &row.cancelled,
                         &row.run_us, &row.gpu_ns,    &row.bytes_in, &row.bytes_out};
    if (!json_is_object(o)) return -EBADMSG;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(o, keys[i]);
        if (!json_is_integer(v)) return -EBADMSG;
        *fields[i] = json_integer_value(v);
    }
    snprintf(row.date, sizeof row.date, "%s", json_string_value(json_object_get(o, "date")) ?: "");
    snprintf(row.user, sizeof row.user, "%s", json_string_value(json_object_get(o, "user")) ?: "");
    snprintf(row.op, sizeof row.op, "%s", json_string_value(json_object_get(o, "op")) ?: "");
    *ret = row;
    return 0;
}

/* The summary (owner, jobs by state, times, buffers) of an answer: 0 or -EBADMSG. */
static int usage_summary_from_json(const json_t *root, gpujob_usage_t *ret)
{
    gpujob_usage_t u = {.run_ms = 0};
    const char *owner = json_string_value(json_object_get(root, "owner"));
    json_t *jobs = json_object_get(root, "jobs");
    if (!owner || !json_is_object(jobs)) return -EBADMSG;
    snprintf(u.owner, sizeof u.owner, "%s", owner);
    for (int s = 0; s < GPUJOB_STATE_UNKNOWN; s++)
        u.jobs[s] = json_integer_value(json_object_get(jobs, gpujob_state_name(s)));
    u.run_ms = json_number_value(json_object_get(root, "run_ms"));
    u.gpu_ms = json_number_value(json_object_get(root, "gpu_ms"));
    u.buffers = json_integer_value(json_object_get(root, "buffers"));
    u.buffer_bytes = json_integer_value(json_object_get(root, "buffer_bytes"));
    *ret = u;
    return 0;
}

/* The budgets of an answer, which an older daemon leaves out: 0 or -EBADMSG. */
static int usage_budgets_from_json(const json_t *root, gpujob_usage_report_t *report)
{
    json_t *budgets = json_object_get(root, "budgets"), *b;
    size_t i;
    if (!budgets) return 0;
    if (!json_is_array(budgets)) return -EBADMSG;
    json_array_foreach(budgets, i, b)
    {
        if (report->n_budgets == sizeof report->budgets / sizeof report->budgets[0]) break;
        gpujob_budget_t *g = &report->budgets[report->n_budgets];
        const char *window = json_string_value(json_object_get(b, "window"));
        const char *key = json_string_value(json_object_get(b, "key"));
        json_t *limit = json_object_get(b, "gpu_ms"), *used = json_object_get(b, "used_gpu_ms");
        json_t *left = json_object_get(b, "left_gpu_ms");
        if (!window || !key || !json_is_number(limit) || !json_is_number(used) ||
            !json_is_number(left))
            return -EBADMSG;
        snprintf(g->window, sizeof g->window, "%s", window);
        snprintf(g->key, sizeof g->key, "%s", key);
        g->gpu_ms = json_number_value(limit);
        g->used_gpu_ms = json_number_value(used);
        g->left_gpu_ms = json_number_value(left);
        g->exceeded = json_is_true(json_object_get(b, "exceeded"));
        snprintf(g->since, sizeof g->since, "%s",
                 json_string_value(json_object_get(b, "since")) ?: "");
        snprintf(g->reset_at, sizeof g->reset_at, "%s",
                 json_string_value(json_object_get(b, "reset_at")) ?: "");
        report->n_budgets++;
    }
    return 0;
}

/* Fills report from the answer root (borrowed): 0, -EBADMSG or -ENOMEM. */
static int usage_report_fill(const json_t *root, gpujob_usage_report_t *report)
{
    json_t *days = json_object_get(root, "days");
    int r = usage_summary_from_json(root, &report->summary);
    if (r == 0) r = usage_row_from_json(json_object_get(root, "totals"), &report->totals);
    if (r == 0 && !json_is_array(days)) r = -EBADMSG;
    if (r == 0) r = usage_budgets_from_json(root, report);
    if (r < 0) return r;
    snprintf(report->since, sizeof report->since, "%s",
             json_string_value(json_object_get(root, "since")) ?: "");
    snprintf(report->until, sizeof report->until, "%s",
             json_string_value(json_object_get(root, "until")) ?: "");
    size_t n = json_array_size(days);
    report->rows = calloc(n ? n : 1, sizeof *report->rows);
    report->json = gjc_json_dumps(root, JSON_COMPACT);
    if (!report->rows || !report->json) return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        if ((r = usage_row_from_json(json_array_get(days, i), &report->rows[i])) < 0) return r;
    report->n_rows = n;
    return 0;
}

void gpujob_usage_report_free(gpujob_usage_report_t *report)
{
    if (!report) return;
    free(report->rows);
    free(report->json);
    free(report);
}

int gpujob_usage_report(gpujob_client_t *c, const gpujob_usage_query_t *query,
                        gpujob_usage_report_t **ret)
{
    gjc_clear_error(c);
    gpujob_usage_query_t none = {0};
    if (!query) query = &none;
    static const char *const keys[] = {"since", "until", "user"};
    const char *values[] = {query->since, query->until, query->user};
    json_t *root = NULL;
    int r = gjc_get_json_query(c, "/v1/usage", keys, values, 3, &root);
    if (r < 0) return r;
    gpujob_usage_report_t *report = calloc(1, sizeof *report);
    r = report ? usage_report_fill(root, report) : -ENOMEM;
    json_decref(root);
    if (r < 0) {
        gpujob_usage_report_free(report);
        return r == -ENOMEM ? gjc_fail(c, r, "out of memory")
                            : gjc_fail(c, r, "GET /v1/usage: the answer is not a usage report");
    }
    *ret = report;
    return 0;
}

int gpujob_usage(gpujob_client_t *c, gpujob_usage_t *ret)
{
    gpujob_usage_report_t *report = NULL;
    int r = gpujob_usage_report(c, NULL, &report);
    if (r < 0) return r;
    *ret = report->summary;
    gpujob_usage_report_free(report);
    return 0;
}
