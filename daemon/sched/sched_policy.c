/* The scheduler's per-user policy (daemon/util/policy.h): the current policy, swapped whole by
 * sched_set_policy, and each user's limits resolved from it once and again after each swap. */
#include <errno.h>

#include "sched_internal.h"

int sched_policy_init(sched_t *s)
{
    pthread_mutex_init(&s->policy_lock, NULL);
    atomic_init(&s->policy_gen, 1);
    return policy_new(s->cfg, &s->policy);
}

void sched_policy_free(sched_t *s)
{
    policy_unref(s->policy);
    s->policy = NULL;
    pthread_mutex_destroy(&s->policy_lock);
}

policy_t *sched_policy(sched_t *s)
{
    pthread_mutex_lock(&s->policy_lock);
    policy_t *p = policy_ref(s->policy);
    pthread_mutex_unlock(&s->policy_lock);
    return p;
}

unsigned sched_policy_generation(sched_t *s)
{
    return atomic_load(&s->policy_gen);
}

void sched_set_policy(sched_t *s, policy_t *p)
{
    pthread_mutex_lock(&s->policy_lock);
    policy_t *old = s->policy;
    s->policy = p;
    atomic_fetch_add(&s->policy_gen, 1);
    pthread_mutex_unlock(&s->policy_lock);
    policy_unref(old);
}

/* The user's limits under the current policy, resolved when the policy changed since the last
 * time (a user is resolved once, not on every dispatch: groups may ask NSS). Loop thread. */
const policy_limits_t *user_limits(sched_t *s, user_t *u)
{
    unsigned gen = sched_policy_generation(s);
    if (u->limits_gen != gen) {
        policy_t *p = sched_policy(s);
        policy_resolve(p, u->owner, &u->limits);
        policy_unref(p);
        u->limits_gen = gen;
    }
    return &u->limits;
}

int user_max_running(sched_t *s, user_t *u)
{
    return (int)user_limits(s, u)->value[CONFIG_POLICY_MAX_RUNNING];
}

/* The user's decayed usage per unit of weight: fair share serves the smallest first, so that
 * a user of weight 3 gets three times the device time of a user of weight 1 over a backlog. */
double user_share(sched_t *s, user_t *u)
{
    uint64_t w = user_limits(s, u)->value[CONFIG_POLICY_WEIGHT];
    return u->usage_us / (double)(w ? w : 1);
}
