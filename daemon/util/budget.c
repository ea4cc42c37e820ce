/* GPU-time budgets' windows and values (budget.h). */
#include "budget.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *budget_window_name(budget_window_t w)
{
    return w == BUDGET_DAY ? "day" : w == BUDGET_MONTH ? "month" : "?";
}

int64_t budget_day_of(int64_t t_us)
{
    /* Floor division: C's rounds toward zero. */
    return t_us >= 0 ? t_us / BUDGET_DAY_US : -((-t_us + BUDGET_DAY_US - 1) / BUDGET_DAY_US);
}

/* Howard Hinnant's days_from_civil and civil_from_days: exact for every date the proleptic
 * Gregorian calendar has, in eras of 400 years (146097 days). */
int64_t budget_days_from_civil(int y, int m, int d)
{
    int64_t yy = (int64_t)y - (m <= 2);
    int64_t era = (yy >= 0 ? yy : yy - 399) / 400;
    int64_t yoe = yy - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

void budget_civil_from_days(int64_t day, int *ret_y, int *ret_m, int *ret_d)
{
    int64_t z = day + 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    int64_t d = doy - (153 * mp + 2) / 5 + 1;
    int64_t m = mp < 10 ? mp + 3 : mp - 9;
    *ret_y = (int)(yoe + era * 400 + (m <= 2));
    *ret_m = (int)m;
    *ret_d = (int)d;
}

void budget_window_days(budget_window_t w, int64_t day, int64_t *ret_first, int64_t *ret_end)
{
    if (w != BUDGET_MONTH) {
        *ret_first = day;
        *ret_end = day + 1;
        return;
    }
    int y, m, d;
    budget_civil_from_days(day, &y, &m, &d);
    *ret_first = day - (d - 1);
    *ret_end = m == 12 ? budget_days_from_civil(y + 1, 1, 1) : budget_days_from_civil(y, m + 1, 1);
}

int budget_parse_hours(const char *value, uint64_t max_us, uint64_t *ret_us, char *reason,
                       size_t reason_size)
{
    /* strtod would also take blanks, signs, hex, inf and nan: a plain decimal number starts
     * with a digit or a point, and has no x or p. */
    char *end = NULL;
    double h = 0;
    bool plain = (isdigit((unsigned char)value[0]) ||
                  (value[0] == '.' && isdigit((unsigned char)value[1]))) &&
                 !strpbrk(value, "xXpP");
    if (plain) h = strtod(value, &end);
    if (!plain || *end != '\0' || !isfinite(h)) {
        snprintf(reason, reason_size, "expected a number of hours such as 100 or 0.5, got '%.128s'",
                 value);
        return -EINVAL;
    }
    double us = h * BUDGET_HOUR_US;
    if (!(us <= (double)max_us)) {
        snprintf(reason, reason_size, "%.128s is out of range (0..%.0f hours)", value,
                 (double)max_us / BUDGET_HOUR_US);
        return -EINVAL;
    }
    uint64_t n = (uint64_t)llround(us);
    *ret_us = n == 0 && h > 0 ? 1 : n;
    return 0;
}

void budget_format_hours(uint64_t us, char *buf, size_t size)
{
    /* The fewest decimals that read back to the same µs: "100", "0.0003". A µs is 2.8e-10
     * hours: twelve decimals always do. */
    for (int decimals = 0; decimals <= 12; decimals++) {
        snprintf(buf, size, "%.*f", decimals, (double)us / BUDGET_HOUR_US);
        uint64_t back = 0;
        char reason[8];
        if (budget_parse_hours(buf, UINT64_MAX, &back, reason, sizeof reason) == 0 && back == us)
            return;
    }
}
