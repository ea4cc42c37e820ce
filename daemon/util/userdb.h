/* Who a user name is on this host: its groups, through NSS (getpwnam_r, getgrouplist), so that
 * config can name Unix groups for admins and per-group policy. A name the host does not know
 * (a token user without a login) is in no group. */
#pragma once

#include <stdbool.h>

/* Whether user is a member of group (its primary group or a supplementary one). False when
 * either name is unknown to the host. */
bool userdb_in_group(const char *user, const char *group);
