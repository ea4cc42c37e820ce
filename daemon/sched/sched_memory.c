/* Device memory per user: a user's resident buffers plus what its running jobs take
 * (exec_job_device_bytes) may hold at most limits.device_memory_percent_per_user of the
 * executor's pool (every device's together; the CPU backend's working memory). A job that
 * would pass it stays queued, shown waiting for device_memory with that key, until the user's
 * jobs end or buffers go; the pool itself is the executor's to bound (executor_ops_t.fit,
 * asked when a batch is cut, sched_dispatch.c).
 *
 * The user's resident bytes come from the store (store_buffer_bytes), read once and again only
 * after a buffer was stored or deleted (resident_gen): a dispatch costs no query. */
#include "sched_internal.h"

void memory_init(sched_t *s)
{
    s->pool_bytes = s->pool_largest = 0;
    s->pool_key = NULL;
    if (s->ex && s->ex->ops->memory_pool)
        s->pool_bytes = s->ex->ops->memory_pool(s->ex, &s->pool_largest, &s->pool_key);
}

void memory_resident_changed(sched_t *s)
{
    s->resident_gen++;
}

uint64_t memory_user_limit(sched_t *s, user_t *u)
{
    return sched_memory_share(s->pool_bytes,
                              user_limits(s, u)->value[CONFIG_POLICY_DEVICE_MEMORY_PCT]);
}

/* The user's resident bytes, read again when buffers changed since the last read. */
static uint64_t user_resident_bytes(sched_t *s, user_t *u)
{
    if (u->resident_gen != s->resident_gen + 1) {
        uint64_t stored = 0, resident = 0;
        if (store_buffer_bytes(s->st, u->owner, &stored, &resident) < 0)
            return u->resident_bytes; /* logged by the store; the last reading stands */
        u->resident_bytes = resident;
        u->resident_gen = s->resident_gen + 1; /* + 1: a new user (0) reads at once */
    }
    return u->resident_bytes;
}

bool memory_admits(sched_t *s, entry_t *e)
{
    uint64_t limit = memory_user_limit(s, e->user);
    if (!limit) return true;
    uint64_t need = exec_job_device_bytes(e->job);
    uint64_t used = e->user->device_bytes + user_resident_bytes(s, e->user);
    if (used <= limit && need <= limit - used) return true;
    e->memory_wait = MEMORY_WAIT_USER;
    return false;
}

void memory_take(entry_t *e)
{
    e->user->device_bytes += exec_job_device_bytes(e->job);
}

void memory_give(entry_t *e)
{
    uint64_t n = exec_job_device_bytes(e->job);
    e->user->device_bytes = e->user->device_bytes > n ? e->user->device_bytes - n : 0;
}
