/* Local accounts for the suites that run as root and act as other users (test_e2e_unix_users,
 * test_e2e_local_users): programs such as useradd and userdel run from a signal handler too,
 * and system accounts made with useradd. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

/* Runs argv (a program on $PATH) and returns its exit status, or -1. Async-signal-safe in the
 * caller's part (fork, execvp, waitpid), so that a signal handler may remove accounts. */
int local_run_program(char *const argv[]);

/* Makes the system account name, without a home or a login shell, in the supplementary group
 * group when not NULL. *ret_made becomes true once useradd has made it (so that the caller
 * removes it even when the lookup after fails); its uid and gid go to ret_uid and ret_gid.
 * 0, -EIO when useradd fails, or -ENOENT when the account is not found after. */
int local_account_create(const char *name, const char *group, bool *ret_made, uid_t *ret_uid,
                         gid_t *ret_gid);
