/* GPU-time budgets: the calendar windows they are counted over, and their values as the
 * configuration writes them.
 *
 * A budget ([limits] gpu_hours_per_day_per_user, gpu_hours_per_month_per_user, and the same
 * keys without "_per_user" in [user.NAME] and [group.NAME]) caps the GPU time a user's jobs are
 * charged within one calendar day or one calendar month, in UTC, as a lab's monthly allocation
 * is counted: the window starts at 00:00:00 UTC of the day, or of the month's first day, and
 * resets at the start of the next one. Days are those of the usage rollup (days since
 * 1970-01-01, UTC, as store.h counts them); times are wall-clock µs since the epoch.
 *
 * Values are hours of GPU time in the file ("100", "0.5"), kept as whole µs. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A day of wall-clock µs. */
#define BUDGET_DAY_US INT64_C(86400000000)
/* The largest budget: 10^9 hours. */
#define BUDGET_MAX_US UINT64_C(3600000000000000000)
/* µs in one hour. */
#define BUDGET_HOUR_US 3600000000.0

typedef enum budget_window {
    BUDGET_DAY,
    BUDGET_MONTH,
    BUDGET_WINDOW_COUNT,
} budget_window_t;

/* "day" or "month". */
const char *budget_window_name(budget_window_t w);

/* The UTC day of a wall-clock time t_us: days since 1970-01-01, rounded down (a time before
 * the epoch falls on a negative day). */
int64_t budget_day_of(int64_t t_us);

/* The window w that holds day: its first day in *ret_first and the first day after it in
 * *ret_end, so that it resets at *ret_end * BUDGET_DAY_US. A day's window is the day itself;
 * a month's runs from the 1st to the last day of its month in the proleptic Gregorian calendar
 * (February has 29 days in years divisible by 4, but not by 100 unless by 400). */
void budget_window_days(budget_window_t w, int64_t day, int64_t *ret_first, int64_t *ret_end);

/* Days since 1970-01-01 of the date y-m-d (m 1..12, d 1..31), and back. */
int64_t budget_days_from_civil(int y, int m, int d);
void budget_civil_from_days(int64_t day, int *ret_y, int *ret_m, int *ret_d);

/* Parses a number of hours ("100", "0.0003", "1e-3") into whole µs within [0, max_us]: a
 * positive value rounds to at least 1 µs, so that only 0 means none. 0, or -EINVAL with the
 * reason (not naming the key) in reason. */
int budget_parse_hours(const char *value, uint64_t max_us, uint64_t *ret_us, char *reason,
                       size_t reason_size);
/* Writes us as hours the way budget_parse_hours reads them back to the same value
 * ("100", "0.0003"). */
void budget_format_hours(uint64_t us, char *buf, size_t size);
