#include "service_notify.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

void service_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = path ? strlen(path) : 0;
    /* A path, or an abstract name written with a leading '@'. */
    if (len < 2 || len >= sizeof addr.sun_path || (path[0] != '/' && path[0] != '@')) return;
    memcpy(addr.sun_path, path, len);
    if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    (void)sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&addr,
                 (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len));
    close(fd);
}

uint64_t service_watchdog_usec(void)
{
    const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    if (!usec || (pid && strtol(pid, NULL, 10) != (long)getpid())) return 0;
    char *end;
    unsigned long long v = strtoull(usec, &end, 10);
    return *usec && *end == '\0' ? (uint64_t)v : 0;
}
