/* The state directory's lock: one gpujobd per state directory. Two daemons on one directory
 * would each re-queue the other's running jobs and fight over every row; so the first holds
 * an exclusive flock() on STATE_DIR/gpujobd.lock for its whole life, and the file says its
 * pid, for the refusal the second one gets. The lock outlives a restart in place (exec after
 * a lost GPU context): its descriptor stays open across the exec, named in the environment,
 * and the new program adopts it, so that no other daemon can take the directory meanwhile. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/util/log.h"

#define LOCK_NAME "gpujobd.lock"
#define LOCK_ENV "GPUJOBD_LOCK_FD" /* the lock's descriptor, handed over across an exec */

/* The descriptor the process before the exec handed over, when it is a descriptor of the
 * lock file at path (same device and inode) that holds the lock; else -1. Clears the
 * environment variable either way. */
static int lock_adopt(const char *path)
{
    const char *carried = getenv(LOCK_ENV);
    if (!carried) return -1;
    char *end;
    long fd = strtol(carried, &end, 10);
    unsetenv(LOCK_ENV);
    struct stat held, named;
    if (*end || fd < 0 || fd > INT_MAX || fstat((int)fd, &held) < 0 || stat(path, &named) < 0 ||
        held.st_dev != named.st_dev || held.st_ino != named.st_ino) {
        log_warn("store: %s=%s does not name the lock '%s': ignored", LOCK_ENV, carried, path);
        return -1;
    }
    /* The lock belongs to the open file description, which the exec kept: taking it again
     * through it succeeds at once. */
    if (flock((int)fd, LOCK_EX | LOCK_NB) < 0 || fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0) return -1;
    return (int)fd;
}

/* The pid the lock file at fd names, or 0 when it names none. */
static long lock_holder(int fd)
{
    char text[32] = "";
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    if (n <= 0) return 0;
    text[n] = '\0';
    long pid = strtol(text, NULL, 10);
    return pid > 0 ? pid : 0;
}

static int lock_take(const char *state_dir, const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return log_error_errno(-errno, "store: cannot open the lock file '%s': %s", path,
                               strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int r = errno == EWOULDBLOCK ? -EBUSY : -errno;
        long holder = lock_holder(fd);
        close(fd);
        if (r != -EBUSY)
            return log_error_errno(r, "store: cannot lock '%s': %s", path, strerror(-r));
        if (holder)
            return log_error_errno(r,
                                   "store: the state directory '%s' is in use by another gpujobd "
                                   "(pid %ld, which holds '%s'): one state directory serves one "
                                   "daemon",
                                   state_dir, holder, path);
        return log_error_errno(r,
                               "store: the state directory '%s' is in use by another gpujobd "
                               "(it holds '%s'): one state directory serves one daemon",
                               state_dir, path);
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)len, 0) != len)
        log_warn("store: cannot write the pid into '%s': %s", path, strerror(errno));
    return fd;
}

int store_lock_state_dir(const char *state_dir, int *ret_fd)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", state_dir, LOCK_NAME) >= (int)sizeof path)
        return log_error_errno(-ENAMETOOLONG, "store: state_dir '%s' is too long", state_dir);
    if (mkdir(state_dir, 0750) < 0 && errno != EEXIST)
        return log_error_errno(-errno, "store: cannot create '%s': %s", state_dir, strerror(errno));
    int fd = lock_adopt(path);
    if (fd < 0) fd = lock_take(state_dir, path);
    if (fd < 0) return fd;
    *ret_fd = fd;
    return 0;
}

int store_lock_keep_across_exec(int fd)
{
    char text[16];
    snprintf(text, sizeof text, "%d", fd);
    if (fcntl(fd, F_SETFD, 0) < 0 || setenv(LOCK_ENV, text, 1) < 0)
        return log_error_errno(-errno,
                               "store: cannot keep the state directory's lock across "
                               "the restart: %s",
                               strerror(errno));
    return 0;
}
