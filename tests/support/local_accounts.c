/* Local accounts for the suites that act as other users (local_accounts.h). */
#define _GNU_SOURCE
#include "local_accounts.h"

#include <errno.h>
#include <pwd.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

int local_run_program(char *const argv[])
{
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execvp(argv[0], argv);
        _exit(127);
    }
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

int local_account_create(const char *name, const char *group, bool *ret_made, uid_t *ret_uid,
                         gid_t *ret_gid)
{
    char *with_group[] = {"useradd",     "--system",          "--no-create-home",
                          "--shell",     "/usr/sbin/nologin", "-G",
                          (char *)group, (char *)name,        NULL};
    char *alone[] = {"useradd",    "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                     (char *)name, NULL};
    if (local_run_program(group ? with_group : alone) != 0) return -EIO;
    *ret_made = true;
    struct passwd *pw = getpwnam(name);
    if (!pw) return -ENOENT;
    *ret_uid = pw->pw_uid;
    *ret_gid = pw->pw_gid;
    return 0;
}
