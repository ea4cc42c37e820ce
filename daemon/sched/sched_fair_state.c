/* Fair share across restarts: each user's decayed usage is saved to the store every
 * FAIR_STATE_SAVE_US and when the scheduler stops, and loaded when it starts, decayed over the
 * time the daemon was down by the wall clock ([scheduler] fair_share_half_life_s), so that a
 * restart neither forgives a heavy user nor punishes one whose usage is long past. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"
#include "daemon/util/vec.h"
#include "sched_internal.h"

/* Below this usage (µs) a user is as good as new and is not saved. */
#define FAIR_STATE_MIN_US 1.0

typedef struct fair_rows {
    store_fair_share_t *a;
    size_t n, cap;
    int err;
} fair_rows_t;

static void collect_user(const char *key, void *value, void *ud)
{
    (void)key;
    user_t *u = value;
    fair_rows_t *rows = ud;
    user_charge(u, 0); /* decayed to now */
    if (rows->err || u->usage_us < FAIR_STATE_MIN_US) return;
    if ((rows->err = vec_grow((void **)&rows->a, &rows->cap, rows->n + 1, sizeof *rows->a, 16)))
        return;
    store_fair_share_t *f = &rows->a[rows->n++];
    memcpy(f->owner, u->owner, sizeof f->owner);
    f->usage_us = u->usage_us;
    f->at_us = u->usage_at;
}

void fair_state_save(sched_t *s)
{
    fair_rows_t rows = {0};
    strmap_foreach(s->users, collect_user, &rows);
    int r = rows.err ? rows.err : store_fair_share_save(s->st, rows.a, rows.n);
    if (r < 0) log_warn("saving the fair-share state failed: %s", strerror(-r));
    free(rows.a);
}

int fair_state_load(sched_t *s)
{
    store_fair_share_t *a = NULL;
    size_t n = 0;
    int r = store_fair_share_load(s->st, &a, &n);
    if (r < 0) return log_error_errno(r, "loading the fair-share state failed: %s", strerror(-r));
    int64_t now = now_us();
    double half_life_us = s->cfg->fair_share_half_life_s * 1e6;
    for (size_t i = 0; i < n && r == 0; i++) {
        user_t *u = user_get(s, a[i].owner);
        if (!u) {
            r = -ENOMEM;
            break;
        }
        /* A clock set back since the save counts as no time passed. */
        double down_us = now > a[i].at_us ? (double)(now - a[i].at_us) : 0;
        u->usage_us = a[i].usage_us * exp2(-down_us / half_life_us);
        u->usage_at = now;
    }
    free(a);
    if (n) log_info("fair share: usage of %zu users restored", n);
    return r;
}
