/* Per-user policy at the door: each user's limits, resolved from the scheduler's policy (again
 * after a swap, which sched_policy_generation tells), and each user's request-rate bucket.
 * Resolving may ask NSS for groups, so it happens once per user and policy, outside the lock. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "daemon/util/id.h"
#include "daemon/util/strmap.h"

/* One user as the door sees it. */
typedef struct door_user {
    unsigned gen; /* of the policy limits were resolved from; 0: never */
    policy_limits_t limits;
    double tokens;     /* the rate bucket: requests the user may make now */
    int64_t refill_us; /* when tokens was last brought up to date (monotonic) */
    char name[];
} door_user_t;

struct api_users {
    pthread_mutex_t lock;
    strmap_t *map; /* name → door_user_t */
};

int api_users_new(api_users_t **ret)
{
    api_users_t *u = calloc(1, sizeof *u);
    if (!u) return -ENOMEM;
    int r = strmap_new(&u->map);
    if (r < 0) {
        free(u);
        return r;
    }
    pthread_mutex_init(&u->lock, NULL);
    *ret = u;
    return 0;
}

static void door_user_free(const char *key, void *value, void *ud)
{
    (void)key;
    (void)ud;
    free(value);
}

void api_users_free(api_users_t *u)
{
    if (!u) return;
    strmap_foreach(u->map, door_user_free, NULL);
    strmap_free(u->map);
    pthread_mutex_destroy(&u->lock);
    free(u);
}

/* The door's entry of name, made when new, with limits under the policy of generation gen.
 * Called and returns with the lock held; drops it while resolving. NULL without memory. */
static door_user_t *door_user_get(api_env_t *env, const char *name, unsigned gen)
{
    api_users_t *users = env->users;
    door_user_t *d = strmap_get(users->map, name);
    if (!d) {
        size_t len = strlen(name);
        d = calloc(1, sizeof *d + len + 1);
        if (!d) return NULL;
        memcpy(d->name, name, len + 1);
        if (strmap_put(users->map, d->name, d) < 0) {
            free(d);
            return NULL;
        }
    }
    if (d->gen != gen) {
        policy_limits_t l;
        pthread_mutex_unlock(&users->lock);
        policy_t *p = sched_policy(env->sched);
        policy_resolve(p, name, &l);
        policy_unref(p);
        pthread_mutex_lock(&users->lock);
        /* Entries are never removed, so d is still the entry of name. */
        if (d->gen == 0) d->tokens = (double)l.value[CONFIG_POLICY_BURST];
        d->limits = l;
        d->gen = gen;
    }
    return d;
}

void api_user_limits(api_request_t *req, policy_limits_t *ret)
{
    api_env_t *env = req->env;
    unsigned gen = sched_policy_generation(env->sched);
    door_user_t *d = NULL;
    if (env->users) {
        pthread_mutex_lock(&env->users->lock);
        d = door_user_get(env, req->user.name, gen);
        if (d) *ret = d->limits;
        pthread_mutex_unlock(&env->users->lock);
    }
    if (d) return;
    policy_t *p = sched_policy(env->sched);
    policy_resolve(p, req->user.name, ret);
    policy_unref(p);
}

/* Takes a token from d's bucket, refilled at rate per second up to burst; 0, or the seconds
 * until a token is back (rounded up) when there is none. */
static int bucket_take(door_user_t *d, double rate, double burst, int64_t now)
{
    d->tokens = fmin(burst, d->tokens + rate * (double)(now - d->refill_us) / 1e6);
    d->refill_us = now;
    if (d->tokens >= 1.0) {
        d->tokens -= 1.0;
        return 0;
    }
    int wait = (int)ceil((1.0 - d->tokens) / rate);
    return wait > 0 ? wait : 1;
}

bool api_rate_admits(api_request_t *req)
{
    api_env_t *env = req->env;
    if (!env->users) return true;
    unsigned gen = sched_policy_generation(env->sched);
    pthread_mutex_lock(&env->users->lock);
    door_user_t *d = door_user_get(env, req->user.name, gen);
    uint64_t rate = d ? d->limits.value[CONFIG_POLICY_RATE] : 0;
    int wait = 0;
    char limit[POLICY_SOURCE_SIZE] = "";
    if (rate) {
        wait =
            bucket_take(d, (double)rate, (double)d->limits.value[CONFIG_POLICY_BURST], mono_us());
        memcpy(limit, d->limits.source[CONFIG_POLICY_RATE], sizeof limit);
    }
    pthread_mutex_unlock(&env->users->lock);
    if (!wait) return true;
    api_respond_error(req, 429, "rate_limited", limit,
                      "'%s' is making requests faster than %s = %" PRIu64
                      " per second allows; try again in %d s",
                      req->user.name, limit, rate, wait);
    api_response_add_header(&req->resp, "Retry-After", "%d", wait);
    return false;
}
