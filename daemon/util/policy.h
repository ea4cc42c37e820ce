/* Per-user policy: what each user may do (queued and running jobs, resident and stored bytes,
 * request rate, the largest single job) and its fair-share weight, resolved from the
 * configuration's defaults and its [user.NAME] and [group.NAME] sections.
 *
 * A policy_t is immutable once built and reference-counted, so that a reload can build a new
 * one and swap the pointer that the scheduler and the HTTP threads read, while readers that
 * still hold the old one finish with it: each reader takes a reference (policy_ref) for as
 * long as it uses it, and the last policy_unref frees it.
 *
 * Precedence, per key: the user's own [user.NAME] section; else the first [group.NAME]
 * section in the file that sets the key and names a Unix group the user is in (userdb.h);
 * else the default in [limits] or [scheduler]. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct policy policy_t;

/* A policy key's full name: "user.NAME.max_queued", "limits.max_queued_per_user". */
#define POLICY_SOURCE_SIZE (CONFIG_POLICY_NAME_SIZE + 40)

/* What one user may do, and where each value came from. */
typedef struct policy_limits {
    uint64_t value[CONFIG_POLICY_KEY_COUNT]; /* by config_policy_key_t; 0 "no limit" where the
                                                key's default allows it */
    /* The key that set each value, as refusals name it: "user.alice.max_queued",
     * "group.lab.weight" or "limits.max_queued_per_user". */
    char source[CONFIG_POLICY_KEY_COUNT][POLICY_SOURCE_SIZE];
} policy_limits_t;

/* Builds the policy of cfg (a copy: cfg may go). 0 or -ENOMEM. The new policy holds one
 * reference, the caller's. */
int policy_new(const config_t *cfg, policy_t **ret);
/* Takes a reference to p (returned, for chaining). Any thread. */
policy_t *policy_ref(policy_t *p);
/* Drops a reference; the last one frees p. Accepts NULL. Any thread. */
void policy_unref(policy_t *p);

/* Resolves user's limits under p. May ask NSS for the user's groups when p has group
 * sections (blocking): callers keep the result rather than resolve on every request. */
void policy_resolve(const policy_t *p, const char *user, policy_limits_t *ret);
/* Whether used bytes plus more pass the byte limit key (max_resident_bytes or
 * max_stored_bytes, 0: none) of owner's limits; why then says so, naming the key. */
bool policy_bytes_exceeded(const policy_limits_t *l, config_policy_key_t key, const char *owner,
                           uint64_t used, uint64_t more, char *why, size_t why_size);
/* Whether p names any group: without one, policy_resolve never blocks. */
bool policy_has_groups(const policy_t *p);
