/* GPU-time budgets (daemon/util/budget.h): the UTC day and month windows at fixed clocks,
 * across month ends, year ends and leap years (2000 and 2024 leap, 1900 and 2100 not), before
 * the epoch too; budgets in hours as the configuration writes them; and the per-user policy
 * that resolves them, each naming the key that set it. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/util/budget.h"
#include "daemon/util/config.h"
#include "daemon/util/policy.h"

/* Wall-clock µs of y-m-d hh:mm:ss UTC, written without the code under test. */
static int64_t utc_us(int y, int mo, int d, int h, int mi, int s)
{
    struct tm tm = {.tm_year = y - 1900,
                    .tm_mon = mo - 1,
                    .tm_mday = d,
                    .tm_hour = h,
                    .tm_min = mi,
                    .tm_sec = s};
    return (int64_t)timegm(&tm) * 1000000;
}

/* The window w at time t: its start and reset as wall-clock µs. */
static void window_at(budget_window_t w, int64_t t, int64_t *ret_start, int64_t *ret_reset)
{
    int64_t first, end;
    budget_window_days(w, budget_day_of(t), &first, &end);
    *ret_start = first * BUDGET_DAY_US;
    *ret_reset = end * BUDGET_DAY_US;
}

START_TEST(test_day_window_starts_and_resets_at_utc_midnight)
{
    int64_t start, reset;
    window_at(BUDGET_DAY, utc_us(2026, 3, 5, 14, 30, 0), &start, &reset);
    ck_assert_int_eq(start, utc_us(2026, 3, 5, 0, 0, 0));
    ck_assert_int_eq(reset, utc_us(2026, 3, 6, 0, 0, 0));
    /* The last µs of a day is still in it; midnight opens the next. */
    int64_t last = utc_us(2026, 3, 6, 0, 0, 0) - 1;
    window_at(BUDGET_DAY, last, &start, &reset);
    ck_assert_int_eq(reset, utc_us(2026, 3, 6, 0, 0, 0));
    window_at(BUDGET_DAY, last + 1, &start, &reset);
    ck_assert_int_eq(start, utc_us(2026, 3, 6, 0, 0, 0));
    ck_assert_int_eq(reset, utc_us(2026, 3, 7, 0, 0, 0));
    /* Year's end, and a day before the epoch (floor, not truncation). */
    window_at(BUDGET_DAY, utc_us(2025, 12, 31, 23, 59, 59), &start, &reset);
    ck_assert_int_eq(reset, utc_us(2026, 1, 1, 0, 0, 0));
    window_at(BUDGET_DAY, utc_us(1969, 12, 31, 12, 0, 0), &start, &reset);
    ck_assert_int_eq(start, utc_us(1969, 12, 31, 0, 0, 0));
    ck_assert_int_eq(reset, 0);
}
END_TEST

START_TEST(test_month_window_runs_from_the_first_to_the_next_first)
{
    static const struct {
        int y, m, d;        /* a day of the month */
        int next_y, next_m; /* where its window resets (the 1st) */
        int days;           /* the month's length */
    } cases[] = {
        {2026, 3, 5, 2026, 4, 31},  {2026, 1, 31, 2026, 2, 31},  {2026, 2, 28, 2026, 3, 28},
        {2024, 2, 29, 2024, 3, 29}, {2024, 2, 1, 2024, 3, 29},   {2000, 2, 15, 2000, 3, 29},
        {1900, 2, 15, 1900, 3, 28}, {2100, 2, 28, 2100, 3, 28},  {2025, 12, 31, 2026, 1, 31},
        {2026, 4, 30, 2026, 5, 30}, {2026, 11, 1, 2026, 12, 30}, {1969, 12, 31, 1970, 1, 31},
        {1970, 1, 1, 1970, 2, 31},  {2400, 2, 29, 2400, 3, 29},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t start, reset;
        int64_t t = utc_us(cases[i].y, cases[i].m, cases[i].d, 23, 59, 59);
        window_at(BUDGET_MONTH, t, &start, &reset);
        ck_assert_msg(start == utc_us(cases[i].y, cases[i].m, 1, 0, 0, 0),
                      "%04d-%02d-%02d: the month starts wrong", cases[i].y, cases[i].m, cases[i].d);
        ck_assert_msg(reset == utc_us(cases[i].next_y, cases[i].next_m, 1, 0, 0, 0),
                      "%04d-%02d-%02d: the month resets wrong", cases[i].y, cases[i].m, cases[i].d);
        ck_assert_int_eq((reset - start) / BUDGET_DAY_US, cases[i].days);
    }
}
END_TEST

START_TEST(test_civil_dates_round_trip_over_four_centuries)
{
    /* Every day from 1800 to 2400 maps to a date and back, and successive days are successive
     * dates. */
    int64_t from = budget_days_from_civil(1800, 1, 1), to = budget_days_from_civil(2400, 12, 31);
    int py = 1799, pm = 12, pd = 31;
    for (int64_t day = from; day <= to; day++) {
        int y, m, d;
        budget_civil_from_days(day, &y, &m, &d);
        ck_assert_int_eq(budget_days_from_civil(y, m, d), day);
        bool next_day = y == py && m == pm && d == pd + 1;
        bool next_month = y == py && m == pm + 1 && d == 1;
        bool next_year = y == py + 1 && m == 1 && pm == 12 && d == 1;
        ck_assert_msg(next_day || next_month || next_year, "%d-%d-%d follows %d-%d-%d", y, m, d, py,
                      pm, pd);
        py = y, pm = m, pd = d;
    }
    ck_assert_int_eq(budget_days_from_civil(1970, 1, 1), 0);
    ck_assert_int_eq(budget_days_from_civil(2000, 3, 1) - budget_days_from_civil(2000, 2, 28), 2);
    ck_assert_int_eq(budget_days_from_civil(2100, 3, 1) - budget_days_from_civil(2100, 2, 28), 1);
}
END_TEST

START_TEST(test_hours_parse_into_microseconds)
{
    static const struct {
        const char *text;
        uint64_t us;
    } good[] = {
        {"0", 0},
        {"100", UINT64_C(360000000000)},
        {"0.5", UINT64_C(1800000000)},
        {"0.0003", 1080000},
        {".25", 900000000},
        {"1e-3", 3600000},
        {"0.0000000001", 1}, /* a positive budget is never none */
        {"1000000000", BUDGET_MAX_US},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t us = 99;
        char reason[256] = "";
        ck_assert_msg(budget_parse_hours(good[i].text, BUDGET_MAX_US, &us, reason, sizeof reason) ==
                          0,
                      "%s: %s", good[i].text, reason);
        ck_assert_msg(us == good[i].us, "%s gave %llu us", good[i].text, (unsigned long long)us);
        char back[32];
        budget_format_hours(us, back, sizeof back);
        uint64_t again = 0;
        ck_assert_int_eq(budget_parse_hours(back, BUDGET_MAX_US, &again, reason, sizeof reason), 0);
        ck_assert_msg(again == us, "%s wrote %s, read back as %llu", good[i].text, back,
                      (unsigned long long)again);
    }
    static const char *const bad[] = {"-1", "", " 1", "1h", "0x10", "inf", "nan", "1e10", "+1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t us = 99;
        char reason[256] = "";
        ck_assert_msg(budget_parse_hours(bad[i], BUDGET_MAX_US, &us, reason, sizeof reason) ==
                          -EINVAL,
                      "'%s' was taken", bad[i]);
        ck_assert_uint_eq(us, 99);
        ck_assert(reason[0]);
    }
    char out[32];
    budget_format_hours(UINT64_C(360000000000), out, sizeof out);
    ck_assert_str_eq(out, "100");
    budget_format_hours(1080000, out, sizeof out);
    ck_assert_str_eq(out, "0.0003");
}
END_TEST

START_TEST(test_budgets_resolve_per_user_and_name_their_key)
{
    config_t *cfg = calloc(1, sizeof *cfg);
    char err[512];
    config_defaults(cfg);
    policy_t *p = NULL;
    policy_limits_t l;
    ck_assert_int_eq(policy_new(cfg, &p), 0);
    policy_resolve(p, "anyone", &l);
    policy_unref(p);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_GPU_HOURS_PER_DAY], 0);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_GPU_HOURS_PER_MONTH], 0);

    ck_assert_int_eq(
        config_set(cfg, "limits", "gpu_hours_per_month_per_user", "10", err, sizeof err), 0);
    ck_assert_int_eq(config_set(cfg, "user.alice", "gpu_hours_per_month", "100", err, sizeof err),
                     0);
    ck_assert_int_eq(config_set(cfg, "user.alice", "gpu_hours_per_day", "0.0003", err, sizeof err),
                     0);
    ck_assert_int_eq(config_set(cfg, "user.alice", "gpu_hours_per_day", "-2", err, sizeof err),
                     -EINVAL);
    ck_assert_msg(strstr(err, "user.alice.gpu_hours_per_day") && strstr(err, "hours"), "%s", err);
    ck_assert_int_eq(policy_new(cfg, &p), 0);
    policy_resolve(p, "alice", &l);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_GPU_HOURS_PER_MONTH], UINT64_C(360000000000));
    ck_assert_str_eq(l.source[CONFIG_POLICY_GPU_HOURS_PER_MONTH], "user.alice.gpu_hours_per_month");
    ck_assert_uint_eq(l.value[CONFIG_POLICY_GPU_HOURS_PER_DAY], 1080000);
    ck_assert_str_eq(l.source[CONFIG_POLICY_GPU_HOURS_PER_DAY], "user.alice.gpu_hours_per_day");
    policy_resolve(p, "bob", &l);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_GPU_HOURS_PER_MONTH], UINT64_C(36000000000));
    ck_assert_str_eq(l.source[CONFIG_POLICY_GPU_HOURS_PER_MONTH],
                     "limits.gpu_hours_per_month_per_user");
    ck_assert_uint_eq(l.value[CONFIG_POLICY_GPU_HOURS_PER_DAY], 0);
    policy_unref(p);
    free(cfg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("util_budget");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_day_window_starts_and_resets_at_utc_midnight);
    tcase_add_test(tc, test_month_window_runs_from_the_first_to_the_next_first);
    tcase_add_test(tc, test_civil_dates_round_trip_over_four_centuries);
    tcase_add_test(tc, test_hours_parse_into_microseconds);
    tcase_add_test(tc, test_budgets_resolve_per_user_and_name_their_key);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
