/* GPU-time budgets (daemon/util/budget.h) as the loop enforces them, and the charges they count.
 *
 * Each user keeps, in memory, the GPU time charged to it on the current UTC day and in the
 * current UTC month: the same sums the usage rollup holds for those days (what GET /v1/usage
 * reports), restored from the rollup when the scheduler starts and added to wherever the
 * rollup is (entry_charge), so that a submission is judged without a store query. A submission
 * by a user whose charges reached a budget is refused with the key that decided it and the time
 * the window resets; jobs already queued still run (the budget gates submission), and what
 * they are charged counts against the next submission.
 *
 * What is charged is each job's device time as its record shows it (gpu_ms): its share of its
 * batch's measured time (CUDA events; on the CPU backend the worker's time), or, for a job
 * ended while its launch went on, the time it had run by then and, once the launch returns,
 * what the executor measured if that is more (sched_complete.c). Fair share is charged the
 * same, so that the record, the rollup, the budgets and fair share agree. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/budget.h"
#include "sched_internal.h"

/* Rows of the rollup read at start: every user's days of the month so far, by op. */
#define BUDGET_LOAD_MAX_ROWS ((size_t)1 << 30)

/* Brings u's sums to the windows of today, emptying those that ended. */
static void user_budget_roll(user_t *u, int64_t today)
{
    int64_t first, end;
    budget_window_days(BUDGET_MONTH, today, &first, &end);
    if (u->budget_day != today) {
        u->budget_day = today;
        u->day_ns = 0;
    }
    if (u->budget_month != first) {
        u->budget_month = first;
        u->month_ns = 0;
    }
}

/* Adds ns of GPU time charged on day (the rollup's day of the charge) to u's sums. */
static void user_budget_add(user_t *u, int64_t day, int64_t ns)
{
    user_budget_roll(u, budget_day_of(now_us()));
    if (day == u->budget_day) u->day_ns += ns;
    if (day >= u->budget_month && day <= u->budget_day) u->month_ns += ns;
}

void entry_charge(sched_t *s, entry_t *e, int64_t finished_us, int64_t total_ns)
{
    (void)s;
    user_charge(e->user, (double)total_ns / 1e3 - e->charged_us);
    e->charged_us = (double)total_ns / 1e3;
    user_budget_add(e->user, budget_day_of(finished_us), total_ns - e->charged_ns);
    e->charged_ns = total_ns;
}

int budget_load(sched_t *s)
{
    int64_t today = budget_day_of(now_us()), first, end;
    budget_window_days(BUDGET_MONTH, today, &first, &end);
    store_usage_query_t q = {
        .owner = NULL, .since_day = first, .until_day = today, .max_rows = BUDGET_LOAD_MAX_ROWS};
    store_usage_row_t *rows = NULL;
    size_t n = 0;
    int r = store_usage_rollup(s->rd, &q, &rows, &n);
    if (r < 0) return log_error_errno(r, "reading this month's usage failed: %s", strerror(-r));
    size_t users = 0;
    for (size_t i = 0; i < n; i++) {
        user_t *u = user_get(s, rows[i].owner);
        if (!u) {
            r = -ENOMEM;
            break;
        }
        users += u->budget_month == 0;
        user_budget_add(u, rows[i].day, rows[i].gpu_ns);
    }
    free(rows);
    if (r < 0) return log_error_errno(r, "restoring this month's usage: out of memory");
    if (users) log_info("budgets: this month's GPU time of %zu users restored", users);
    return 0;
}

/* The budget of window w that u has used up at today, if any: its key's index. */
static bool budget_spent(sched_t *s, user_t *u, budget_window_t w, int64_t today,
                         config_policy_key_t *ret_key)
{
    config_policy_key_t key =
        w == BUDGET_DAY ? CONFIG_POLICY_GPU_HOURS_PER_DAY : CONFIG_POLICY_GPU_HOURS_PER_MONTH;
    uint64_t budget_us = user_limits(s, u)->value[key];
    if (budget_us == 0) return false;
    user_budget_roll(u, today);
    int64_t used_ns = w == BUDGET_DAY ? u->day_ns : u->month_ns;
    if (used_ns < 0 || (uint64_t)used_ns / 1000 < budget_us) return false;
    *ret_key = key;
    return true;
}

bool budget_refuses(sched_t *s, user_t *u, budget_refusal_t *ret)
{
    int64_t today = budget_day_of(now_us());
    /* A spent month outlasts a spent day: it decides, as it says when to come back. */
    for (budget_window_t w = BUDGET_MONTH;; w = BUDGET_DAY) {
        config_policy_key_t key;
        if (budget_spent(s, u, w, today, &key)) {
            const policy_limits_t *l = user_limits(s, u);
            int64_t first, end;
            budget_window_days(w, today, &first, &end);
            char budget[32], used[32];
            budget_format_hours(l->value[key], budget, sizeof budget);
            int64_t used_ns = w == BUDGET_DAY ? u->day_ns : u->month_ns;
            snprintf(used, sizeof used, "%.6g", (double)used_ns / 1e3 / BUDGET_HOUR_US);
            int y, m, d;
            budget_civil_from_days(end, &y, &m, &d);
            snprintf(ret->message, sizeof ret->message,
                     "'%s' has used %s of the %s GPU-hours of %s this %s (UTC): no new jobs "
                     "until it resets at %04d-%02d-%02dT00:00:00Z",
                     u->owner, used, budget, l->source[key], budget_window_name(w), y, m, d);
            snprintf(ret->limit, sizeof ret->limit, "%s", l->source[key]);
            ret->window = w;
            ret->reset_at_us = end * BUDGET_DAY_US;
            return true;
        }
        if (w == BUDGET_DAY) return false;
    }
}
