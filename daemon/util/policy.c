/* Per-user policy: the configuration's defaults and its user and group sections, resolved per
 * user (policy.h says in what order). */
#include "policy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userdb.h"

struct policy {
    atomic_int refs;
    bool has_groups;
    uint64_t defaults[CONFIG_POLICY_KEY_COUNT];
    int n_sections;
    config_policy_section_t sections[]; /* in file order */
};

int policy_new(const config_t *cfg, policy_t **ret)
{
    int n = cfg->n_policy_sections;
    policy_t *p = calloc(1, sizeof *p + (size_t)n * sizeof p->sections[0]);
    if (!p) return -ENOMEM;
    atomic_init(&p->refs, 1);
    for (int k = 0; k < CONFIG_POLICY_KEY_COUNT; k++)
        p->defaults[k] = config_policy_default(cfg, (config_policy_key_t)k);
    memcpy(p->sections, cfg->policy_sections, (size_t)n * sizeof p->sections[0]);
    p->n_sections = n;
    for (int i = 0; i < n; i++)
        p->has_groups |= p->sections[i].is_group;
    *ret = p;
    return 0;
}

policy_t *policy_ref(policy_t *p)
{
    if (p) atomic_fetch_add(&p->refs, 1);
    return p;
}

void policy_unref(policy_t *p)
{
    if (p && atomic_fetch_sub(&p->refs, 1) == 1) free(p);
}

bool policy_has_groups(const policy_t *p)
{
    return p->has_groups;
}

/* Sets key k of ret from section ps, naming it as "user.NAME.key" or "group.NAME.key". */
static void limits_take(policy_limits_t *ret, int k, const config_policy_section_t *ps)
{
    ret->value[k] = ps->value[k];
    snprintf(ret->source[k], sizeof ret->source[k], "%s.%s.%s", ps->is_group ? "group" : "user",
             ps->name, config_policy_key_name((config_policy_key_t)k));
}

void policy_resolve(const policy_t *p, const char *user, policy_limits_t *ret)
{
    uint32_t done = 0;
    const uint32_t all = (1u << CONFIG_POLICY_KEY_COUNT) - 1;
    for (int i = 0; i < p->n_sections; i++) {
        const config_policy_section_t *ps = &p->sections[i];
        if (ps->is_group || strcmp(ps->name, user) != 0) continue;
        for (int k = 0; k < CONFIG_POLICY_KEY_COUNT; k++)
            if (ps->set & (1u << k)) limits_take(ret, k, ps);
        done = ps->set;
        break;
    }
    /* Groups are asked only for keys the user's own section left open, in file order. */
    for (int i = 0; i < p->n_sections && done != all; i++) {
        const config_policy_section_t *ps = &p->sections[i];
        if (!ps->is_group || !(ps->set & ~done) || !userdb_in_group(user, ps->name)) continue;
        for (int k = 0; k < CONFIG_POLICY_KEY_COUNT; k++)
            if ((ps->set & ~done) & (1u << k)) limits_take(ret, k, ps);
        done |= ps->set;
    }
    for (int k = 0; k < CONFIG_POLICY_KEY_COUNT; k++) {
        if (done & (1u << k)) continue;
        ret->value[k] = p->defaults[k];
        snprintf(ret->source[k], sizeof ret->source[k], "%s",
                 config_policy_key_default((config_policy_key_t)k));
    }
}

bool policy_bytes_exceeded(const policy_limits_t *l, config_policy_key_t key, const char *owner,
                           uint64_t used, uint64_t more, char *why, size_t why_size)
{
    uint64_t limit = l->value[key];
    if (limit == 0 || (used <= limit && more <= limit - used)) return false;
    snprintf(why, why_size,
             "%s of '%s' hold %" PRIu64 " bytes; %" PRIu64 " more would pass %s = %" PRIu64,
             key == CONFIG_POLICY_MAX_RESIDENT_BYTES ? "resident buffers" : "stored buffers", owner,
             used, more, l->source[key], limit);
    return true;
}
