#include "restart.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

#define RESTART_MAX_DEVICES 64
#define RESTART_ENV "GPUJOBD_DEVICE_RESETS" /* "n0,n1,...": each device's resets so far */
#define LISTENERS_ENV "GPUJOBD_LISTEN_FDS"  /* "TCP,UNIX": the listening sockets, -1 none */

static atomic_int device_resets[RESTART_MAX_DEVICES];
static int inherited_tcp = -1, inherited_local = -1;

/* fd, when it is a listening socket (not a stray number in an administrator's
 * environment); else -1. */
static int listening_socket(int fd)
{
    int listening = 0;
    socklen_t len = sizeof listening;
    if (fd < 0) return -1;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening) return fd;
    log_warn("restart: fd %d from %s is not a listening socket: ignored", fd, LISTENERS_ENV);
    return -1;
}

void restart_init(void)
{
    const char *carried = getenv(RESTART_ENV);
    for (int d = 0; carried && *carried && d < RESTART_MAX_DEVICES; d++) {
        char *end;
        long n = strtol(carried, &end, 10);
        if (end == carried || n < 0) break;
        atomic_store(&device_resets[d], (int)n);
        carried = *end == ',' ? end + 1 : end;
    }
    unsetenv(RESTART_ENV);
    const char *fds = getenv(LISTENERS_ENV);
    int tcp = -1, local = -1;
    if (fds && sscanf(fds, "%d,%d", &tcp, &local) == 2) {
        inherited_tcp = listening_socket(tcp);
        inherited_local = listening_socket(local);
    }
    unsetenv(LISTENERS_ENV);
}

void restart_listeners(int *ret_tcp, int *ret_local)
{
    *ret_tcp = inherited_tcp;
    *ret_local = inherited_local;
}

int restart_device_resets(int device)
{
    return device >= 0 && device < RESTART_MAX_DEVICES ? atomic_load(&device_resets[device]) : 0;
}

static atomic_bool requested;

void restart_request(int device)
{
    if (device >= 0 && device < RESTART_MAX_DEVICES) atomic_fetch_add(&device_resets[device], 1);
    /* Once: a fault loses every device's context, and each worker asks. */
    if (!atomic_exchange(&requested, true)) kill(getpid(), SIGUSR1);
}

int restart_exec(char *const argv[], int tcp, int local)
{
    char carried[RESTART_MAX_DEVICES * 12] = "", fds[32];
    size_t len = 0;
    for (int d = 0; d < RESTART_MAX_DEVICES && len < sizeof carried; d++)
        len += (size_t)snprintf(carried + len, sizeof carried - len, "%s%d", d ? "," : "",
                                atomic_load(&device_resets[d]));
    snprintf(fds, sizeof fds, "%d,%d", tcp, local);
    if (setenv(RESTART_ENV, carried, 1) < 0 || setenv(LISTENERS_ENV, fds, 1) < 0) return -errno;
    /* A signal still pending would outlive the exec and restart the next process at once. */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    while (sigtimedwait(&usr1, NULL, &(struct timespec){0}) == SIGUSR1)
        ;
    execv("/proc/self/exe", argv);
    int r = -errno;
    log_error("restart: cannot execute /proc/self/exe again: %s", strerror(-r));
    unsetenv(RESTART_ENV);
    unsetenv(LISTENERS_ENV);
    return r;
}
