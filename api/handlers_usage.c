/* GET /v1/usage: what a user holds now (live jobs, buffers) and what jobs used, from the
 * store's usage rollup (per owner, UTC day and op), which outlives job retention and costs the
 * same however many jobs the store keeps. ?since= and ?until= select whole UTC days (a date,
 * or an RFC 3339 time, which selects its day); ?user= names another owner, or * (or all) for
 * every owner: admins only. The answer also shows the owner's GPU-time budgets, with what is
 * used and left of each and when it resets. */
#include "api_internal.h"
#include "daemon/util/budget.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Rows one answer may carry: past it, the caller narrows the range or names a user. */
#define USAGE_MAX_ROWS 10000
/* Days since the epoch of 0001-01-01 and 9999-12-31: the dates a query may name. */
#define USAGE_FIRST_DAY (-719162)
#define USAGE_LAST_DAY 2932896

/* Reads exactly n decimal digits at *p into *ret and moves *p past them. */
static bool digits(const char **p, int n, int *ret)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        char c = (*p)[i];
        if (c < '0' || c > '9') return false;
        v = v * 10 + (c - '0');
    }
    *p += n;
    *ret = v;
    return true;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static bool date_valid(int y, int m, int d)
{
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return y >= 1 && m >= 1 && m <= 12 && d >= 1 && d <= mdays[m - 1] && (m != 2 || d <= 28 + leap);
}

/* The UTC day of s: YYYY-MM-DD, or an RFC 3339 time YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM),
 * whose offset may move it to the day before or after. false for anything else. */
static bool parse_day(const char *s, int64_t *ret_day)
{
    const char *p = s;
    int y, mo, d, h = 0, mi = 0, sec = 0, oh = 0, om = 0;
    if (!digits(&p, 4, &y) || *p++ != '-' || !digits(&p, 2, &mo) || *p++ != '-' ||
        !digits(&p, 2, &d) || !date_valid(y, mo, d))
        return false;
    int64_t seconds = 0;
    if (*p) {
        if ((*p != 'T' && *p != 't') || (++p, !digits(&p, 2, &h)) || *p++ != ':' ||
            !digits(&p, 2, &mi) || *p++ != ':' || !digits(&p, 2, &sec) || h > 23 || mi > 59 ||
            sec > 60)
            return false;
        if (*p == '.') {
            if (!(p[1] >= '0' && p[1] <= '9')) return false;
            for (p++; *p >= '0' && *p <= '9'; p++) {
            }
        }
        int sign = 0;
        if (*p == 'Z' || *p == 'z')
            p++;
        else if (*p == '+' || *p == '-') {
            sign = *p++ == '+' ? 1 : -1;
            if (!digits(&p, 2, &oh) || *p++ != ':' || !digits(&p, 2, &om) || oh > 23 || om > 59)
                return false;
        } else {
            return false;
        }
        if (*p) return false;
        seconds = (int64_t)h * 3600 + mi * 60 + sec - sign * ((int64_t)oh * 3600 + om * 60);
    }
    int64_t day = days_from_civil(y, mo, d);
    /* Floor division: an offset can take the time to the day before. */
    int64_t shift = seconds >= 0 ? seconds / 86400 : -((-seconds + 86399) / 86400);
    /* An offset can also take 0001-01-01 or 9999-12-31 out of the years a date can write. */
    day += shift;
    if (day < USAGE_FIRST_DAY || day > USAGE_LAST_DAY) return false;
    *ret_day = day;
    return true;
}

/* The day of query argument key (default_day when absent); 400 naming it otherwise. */
static int query_day(api_request_t *req, const char *key, int64_t default_day, int64_t *ret)
{
    const char *v = api_query(req, key);
    if (!v) {
        *ret = default_day;
        return 0;
    }
    char field[32];
    snprintf(field, sizeof field, "query.%s", key);
    if (!parse_day(v, ret)) {
        api_respond_error(req, 400, NULL, field,
                          "%s must be a date (YYYY-MM-DD) or an RFC 3339 time, not '%.64s'", key,
                          v);
        return API_DONE;
    }
    return 0;
}

static json_t *day_json(int64_t day)
{
    time_t t = (time_t)(day * 86400);
    struct tm tm;
    char buf[32];
    if (!gmtime_r(&t, &tm)) return json_null();
    /* Four digits of year, as RFC 3339's full-date has them (%Y writes 647, not 0647). */
    snprintf(buf, sizeof buf, "%04d-%02d-%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
    return json_string(buf);
}

/* The owner whose usage the request asks for (*ret_owner NULL: every owner), after its rights
 * are checked: another owner's, or everyone's, is for admins alone (403). */
static int query_owner(api_request_t *req, const char **ret_owner)
{
    const char *user = api_query(req, "user");
    if (!user || strcmp(user, req->user.name) == 0) {
        *ret_owner = req->user.name;
        return 0;
    }
    if (!user[0] || strlen(user) >= OWNER_SIZE) {
        api_respond_error(req, 400, NULL, "query.user",
                          "user must be a user name, or * or all for every user");
        return API_DONE;
    }
    /* Another owner's usage, or everyone's, is for admins alone, in every auth mode. */
    if (api_request_require_admin(req, "query.user", "read another user's usage")) return API_DONE;
    bool all = strcmp(user, "*") == 0 || strcmp(user, "all") == 0;
    *ret_owner = all ? NULL : user;
    return 0;
}

static void sums_add(store_usage_row_t *t, const store_usage_row_t *r)
{
    t->jobs += r->jobs;
    t->succeeded += r->succeeded;
    t->failed += r->failed;
    t->cancelled += r->cancelled;
    t->run_us += r->run_us;
    t->gpu_ns += r->gpu_ns;
    t->bytes_in += r->bytes_in;
    t->bytes_out += r->bytes_out;
}

/* A row's (or the totals') sums as JSON: a new reference. */
static json_t *sums_json(const store_usage_row_t *r)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I}", "jobs",
                     (json_int_t)r->jobs, "succeeded", (json_int_t)r->succeeded, "failed",
                     (json_int_t)r->failed, "cancelled", (json_int_t)r->cancelled, "run_us",
                     (json_int_t)r->run_us, "gpu_ns", (json_int_t)r->gpu_ns, "run_ms",
                     (double)r->run_us / 1000.0, "gpu_ms", (double)r->gpu_ns / 1e6, "bytes_in",
                     (json_int_t)r->bytes_in, "bytes_out", (json_int_t)r->bytes_out);
}

/* The limits of owner under the policy in force ("*": the defaults). */
static void owner_limits(api_request_t *req, const char *owner, policy_limits_t *ret)
{
    if (strcmp(owner, req->user.name) == 0) {
        api_user_limits(req, ret);
    } else {
        policy_t *p = sched_policy(req->env->sched);
        policy_resolve(p, owner, ret);
        policy_unref(p);
    }
}

/* One budget as the answer shows it: its window, key, hours, what the rollup holds for the
 * window (used_ns) and what is left, and when the window began and resets. */
static json_t *budget_json(budget_window_t w, const char *key, uint64_t budget_us, int64_t used_ns,
                           int64_t first_day, int64_t end_day)
{
    double limit_ms = (double)budget_us / 1e3, used_ms = (double)used_ns / 1e6;
    double left_ms = limit_ms > used_ms ? limit_ms - used_ms : 0;
    return json_pack("{s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:b, s:o, s:o}", "window",
                     budget_window_name(w), "key", key, "gpu_hours", limit_ms / 3.6e6,
                     "used_gpu_hours", used_ms / 3.6e6, "left_gpu_hours", left_ms / 3.6e6, "gpu_ms",
                     limit_ms, "used_gpu_ms", used_ms, "left_gpu_ms", left_ms, "exceeded",
                     left_ms <= 0, "since", job_json_time(first_day * BUDGET_DAY_US), "reset_at",
                     job_json_time(end_day * BUDGET_DAY_US));
}

/* The GPU-time budgets of one owner (none for every owner, "*"): those its limits set, each
 * with what the rollup holds for its window so far (the sums the scheduler judges
 * submissions by), into *ret (a new reference). 0, or the store's error. */
static int budgets_json(api_request_t *req, store_reader_t *rd, const char *owner, json_t **ret)
{
    json_t *a = json_array();
    policy_limits_t l;
    if (strcmp(owner, "*") != 0) owner_limits(req, owner, &l);
    bool any = strcmp(owner, "*") != 0 && (l.value[CONFIG_POLICY_GPU_HOURS_PER_DAY] ||
                                           l.value[CONFIG_POLICY_GPU_HOURS_PER_MONTH]);
    if (!any) {
        *ret = a;
        return 0;
    }
    int64_t today = budget_day_of(now_us()), first, end;
    budget_window_days(BUDGET_MONTH, today, &first, &end);
    store_usage_query_t q = {
        .owner = owner, .since_day = first, .until_day = today, .max_rows = USAGE_MAX_ROWS};
    store_usage_row_t *rows = NULL;
    size_t n = 0;
    int r = store_usage_rollup(rd, &q, &rows, &n);
    if (r < 0) {
        json_decref(a);
        return r;
    }
    int64_t used[BUDGET_WINDOW_COUNT] = {0};
    for (size_t i = 0; i < n; i++) {
        used[BUDGET_MONTH] += rows[i].gpu_ns;
        if (rows[i].day == today) used[BUDGET_DAY] += rows[i].gpu_ns;
    }
    free(rows);
    static const config_policy_key_t keys[BUDGET_WINDOW_COUNT] = {
        [BUDGET_DAY] = CONFIG_POLICY_GPU_HOURS_PER_DAY,
        [BUDGET_MONTH] = CONFIG_POLICY_GPU_HOURS_PER_MONTH};
    for (int w = 0; w < BUDGET_WINDOW_COUNT; w++) {
        if (!l.value[keys[w]]) continue;
        budget_window_days((budget_window_t)w, today, &first, &end);
        json_array_append_new(a, budget_json((budget_window_t)w, l.source[keys[w]],
                                             l.value[keys[w]], used[w], first, end));
    }
    *ret = a;
    return 0;
}

/* The resident-bytes limit of owner under the policy in force ("*": the default's). */
static uint64_t resident_limit(api_request_t *req, const char *owner)
{
    policy_limits_t l;
    owner_limits(req, owner, &l);
    return l.value[CONFIG_POLICY_MAX_RESIDENT_BYTES];
}

/* The answer: what the owner holds now (u), the rollup's rows in the range with their totals,
 * which also give the ended jobs' counts and times at the top, and the owner's budgets. */
static json_t *usage_json(api_request_t *req, const store_usage_t *u, const store_usage_query_t *q,
                          const store_usage_row_t *rows, size_t n, json_t *budgets)
{
    store_usage_row_t total = {.jobs = 0};
    json_t *days = json_array();
    for (size_t i = 0; i < n; i++) {
        sums_add(&total, &rows[i]);
        json_t *row = sums_json(&rows[i]);
        json_object_set_new(row, "date", day_json(rows[i].day));
        json_object_set_new(row, "user", json_string(rows[i].owner));
        json_object_set_new(row, "op", json_string(rows[i].op));
        json_array_append_new(days, row);
    }
    json_t *jobs = json_pack(
        "{s:I, s:I, s:I, s:I, s:I}", "queued", (json_int_t)u->jobs_by_state[JOB_QUEUED], "running",
        (json_int_t)u->jobs_by_state[JOB_RUNNING], "succeeded", (json_int_t)total.succeeded,
        "failed", (json_int_t)total.failed, "cancelled", (json_int_t)total.cancelled);
    return json_pack("{s:s, s:o, s:o, s:o, s:f, s:f, s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "owner",
                     u->owner, "since",
                     q->since_day > USAGE_FIRST_DAY ? day_json(q->since_day) : json_null(), "until",
                     q->until_day < USAGE_LAST_DAY ? day_json(q->until_day) : json_null(), "jobs",
                     jobs, "run_ms", (double)total.run_us / 1000.0, "gpu_ms",
                     (double)total.gpu_ns / 1e6, "buffers", (json_int_t)u->buffers, "buffer_bytes",
                     (json_int_t)u->buffer_bytes, "resident_bytes", (json_int_t)u->resident_bytes,
                     "resident_limit_bytes", (json_int_t)resident_limit(req, u->owner), "totals",
                     sums_json(&total), "days", days, "budgets", budgets);
}

int api_handle_usage(api_request_t *req)
{
    static const char *const args[] = {"since", "until", "user", NULL};
    store_usage_query_t q = {.max_rows = USAGE_MAX_ROWS};
    if (api_query_check(req, args) || query_owner(req, &q.owner) ||
        query_day(req, "since", USAGE_FIRST_DAY, &q.since_day) ||
        query_day(req, "until", USAGE_LAST_DAY, &q.until_day))
        return API_DONE;
    if (q.until_day < q.since_day) {
        api_respond_error(req, 400, NULL, "query.until", "until comes before since");
        return API_DONE;
    }
    store_reader_t *rd = api_request_reader(req);
    if (!rd) return API_DONE;
    store_usage_t u;
    store_usage_row_t *rows = NULL;
    size_t n = 0;
    json_t *budgets = NULL;
    int r = store_usage_get(rd, q.owner, &u);
    if (r == 0) r = store_usage_rollup(rd, &q, &rows, &n);
    if (r == 0) r = budgets_json(req, rd, u.owner, &budgets);
    if (r == -E2BIG)
        api_respond_error(req, 422, "too_many_rows", "query.since",
                          "more than %d rows of usage: narrow since and until, or name a user",
                          USAGE_MAX_ROWS);
    else if (r < 0)
        api_respond_errno(req, r, "reading usage failed");
    else
        api_respond_json(req, 200, usage_json(req, &u, &q, rows, n, budgets));
    if (r < 0) json_decref(budgets);
    free(rows);
    return API_DONE;
}
