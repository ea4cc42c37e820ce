/* The [user.NAME] and [group.NAME] sections of the configuration: their keys, each with the
 * [limits] or [scheduler] key that is its default and whose type and bounds it shares, and
 * their values as the file and --set give them (policy.h resolves them for one user). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "config_key.h"
#include "budget.h"

/* The keys of a policy section, in config_policy_key_t order, each with the table key that
 * holds its default and whose type and bounds it shares. */
static const struct {
    const char *name, *section, *default_name, *full;
} policy_keys[CONFIG_POLICY_KEY_COUNT] = {
    {"max_queued", "limits", "max_queued_per_user", "limits.max_queued_per_user"},
    {"max_running", "limits", "max_running_per_user", "limits.max_running_per_user"},
    {"max_resident_bytes", "limits", "max_resident_bytes_per_user",
     "limits.max_resident_bytes_per_user"},
    {"max_stored_bytes", "limits", "max_stored_bytes_per_user", "limits.max_stored_bytes_per_user"},
    {"rate", "limits", "requests_per_s_per_user", "limits.requests_per_s_per_user"},
    {"burst", "limits", "request_burst_per_user", "limits.request_burst_per_user"},
    {"max_job_cost_ms", "limits", "max_job_cost_ms", "limits.max_job_cost_ms"},
    {"max_time_limit_ms", "limits", "max_time_limit_ms", "limits.max_time_limit_ms"},
    {"device_memory_percent", "limits", "device_memory_percent_per_user",
     "limits.device_memory_percent_per_user"},
    {"weight", "scheduler", "weight", "scheduler.weight"},
    {"gpu_hours_per_day", "limits", "gpu_hours_per_day_per_user",
     "limits.gpu_hours_per_day_per_user"},
    {"gpu_hours_per_month", "limits", "gpu_hours_per_month_per_user",
     "limits.gpu_hours_per_month_per_user"},
};

const char *config_policy_key_name(config_policy_key_t key)
{
    return key < CONFIG_POLICY_KEY_COUNT ? policy_keys[key].name : NULL;
}

const char *config_policy_key_default(config_policy_key_t key)
{
    return key < CONFIG_POLICY_KEY_COUNT ? policy_keys[key].full : NULL;
}

static const config_key_t *policy_default_key(config_policy_key_t key)
{
    return config_key_find(policy_keys[key].section, policy_keys[key].default_name);
}

uint64_t config_policy_default(const config_t *cfg, config_policy_key_t key)
{
    if (!cfg || key >= CONFIG_POLICY_KEY_COUNT) return 0;
    const config_key_t *k = policy_default_key(key);
    const void *field = config_key_field_const(cfg, k);
    if (k->type == CONFIG_SIZE || k->type == CONFIG_HOURS) return *(const uint64_t *)field;
    return (uint64_t) * (const int *)field;
}

/* Whether section names a policy section: "user.NAME" or "group.NAME"; *ret_name is then NAME. */
static bool policy_section_parse(const char *section, bool *ret_group, const char **ret_name)
{
    if (strncmp(section, "user.", 5) == 0) {
        *ret_group = false;
        *ret_name = section + 5;
        return true;
    }
    if (strncmp(section, "group.", 6) == 0) {
        *ret_group = true;
        *ret_name = section + 6;
        return true;
    }
    return false;
}

/* The section of cfg for [user.NAME] or [group.NAME], added (at line) when new: sections keep
 * the order of their first appearance, which decides between groups (policy.h). */
static int policy_section_get(config_t *cfg, bool is_group, const char *name, int line,
                              config_policy_section_t **ret, char *reason, size_t reason_size)
{
    size_t len = strlen(name);
    if (len == 0 || len >= CONFIG_POLICY_NAME_SIZE || strpbrk(name, " \t")) {
        snprintf(reason, reason_size, "expected a %s name of 1 to %d characters without blanks",
                 is_group ? "group" : "user", CONFIG_POLICY_NAME_SIZE - 1);
        return -EINVAL;
    }
    for (int i = 0; i < cfg->n_policy_sections; i++) {
        config_policy_section_t *ps = &cfg->policy_sections[i];
        if (ps->is_group == is_group && strcmp(ps->name, name) == 0) {
            *ret = ps;
            return 0;
        }
    }
    if (cfg->n_policy_sections == CONFIG_MAX_POLICY_SECTIONS) {
        snprintf(reason, reason_size, "more than %d [user.NAME] and [group.NAME] sections",
                 CONFIG_MAX_POLICY_SECTIONS);
        return -EINVAL;
    }
    config_policy_section_t *ps = &cfg->policy_sections[cfg->n_policy_sections++];
    memset(ps, 0, sizeof *ps);
    ps->is_group = is_group;
    memcpy(ps->name, name, len + 1);
    ps->line = line;
    *ret = ps;
    return 0;
}

/* Parses value for a policy key with the type and bounds of its default's key. */
static int policy_value_parse(config_policy_key_t key, const char *value, uint64_t *ret,
                              char *reason, size_t reason_size)
{
    const config_key_t *k = policy_default_key(key);
    if (k->type == CONFIG_HOURS)
        return budget_parse_hours(value, k->umax, ret, reason, reason_size);
    if (k->type == CONFIG_SIZE)
        return config_parse_size(value, k->umin, k->umax, ret, reason, reason_size);
    int64_t n = 0;
    int r = config_parse_int(value, k->min, k->max, &n, reason, reason_size);
    if (r < 0) return r;
    *ret = (uint64_t)n;
    return 0;
}

/* Sets key name of a [user.NAME] or [group.NAME] section in cfg. -ENOENT when section is not
 * one (the key table then decides), -EINVAL with the reason otherwise; refuse_twice refuses a
 * key the section already set, as a file may set each key once. */
int config_policy_set(config_t *cfg, const char *section, const char *name, const char *value,
                      int line, bool refuse_twice, char *reason, size_t reason_size)
{
    bool is_group = false;
    const char *who = NULL;
    if (!policy_section_parse(section, &is_group, &who)) return -ENOENT;
    config_policy_key_t key = 0;
    while (key < CONFIG_POLICY_KEY_COUNT && strcmp(policy_keys[key].name, name) != 0)
        key++;
    if (key == CONFIG_POLICY_KEY_COUNT) {
        snprintf(reason, reason_size,
                 "unknown key '%.*s' (a user or group section takes max_queued, max_running, "
                 "max_resident_bytes, max_stored_bytes, rate, burst, max_job_cost_ms, "
                 "max_time_limit_ms, device_memory_percent, weight, gpu_hours_per_day, "
                 "gpu_hours_per_month)",
                 CONFIG_QUOTE_MAX, name);
        return -EINVAL;
    }
    uint64_t n = 0;
    int r = policy_value_parse(key, value, &n, reason, reason_size);
    config_policy_section_t *ps = NULL;
    if (r >= 0) r = policy_section_get(cfg, is_group, who, line, &ps, reason, reason_size);
    if (r < 0) return r;
    if (refuse_twice && (ps->set & (1u << key))) {
        snprintf(reason, reason_size, "set twice in [%.*s]", CONFIG_QUOTE_MAX, section);
        return -EINVAL;
    }
    ps->set |= 1u << key;
    ps->value[key] = n;
    return 0;
}
