/* End-to-end test support: raw TCP connections to the daemon, for what an HTTP client library
 * will not send (a body cut short, a request written by hand); see daemon_harness.h. */
#include <check.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "daemon_harness.h"

int e2e_raw_connect_ok(e2e_daemon_t *d)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert(fd >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(e2e_daemon_port(d))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert(connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0);
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

void e2e_write_all_ok(int fd, const void *data, size_t n)
{
    for (const char *p = data; n;) {
        ssize_t k = write(fd, p, n);
        ck_assert_msg(k > 0, "write failed");
        p += k;
        n -= (size_t)k;
    }
}

int e2e_raw_post_start_ok(e2e_daemon_t *d, const char *path_query, const char *content_type,
                          size_t content_length)
{
    int fd = e2e_raw_connect_ok(d);
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     path_query, content_type, content_length);
    ck_assert(n > 0 && (size_t)n < sizeof head);
    e2e_write_all_ok(fd, head, (size_t)n);
    return fd;
}

void e2e_read_reply(int fd, char *reply, size_t size)
{
    size_t got = 0;
    for (ssize_t k; got < size - 1 && (k = read(fd, reply + got, size - 1 - got)) > 0;)
        got += (size_t)k;
    reply[got] = '\0';
}
