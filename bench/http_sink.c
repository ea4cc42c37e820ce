/* bench_http_sink: the loopback HTTP ceiling for uploads, and the floor of a request's round
 * trip. Answers every request on 127.0.0.1 with 200 after reading its body (Content-Length
 * bytes) into one 1 MiB buffer that is never looked at: what a server that does nothing with
 * the bytes can take from the same client (curl, wrk) over the same loopback. The answer is
 * "{} ", or, when the request's target has the query reply_bytes=N (N up to 1 MiB), N bytes of
 * JSON ("{}" and spaces), as long as a real server's answer to the same request. One
 * connection at a time, which is what an upload benchmark or one client needs; keep-alive is
 * honoured.
 *
 *   bench_http_sink [--port N]
 *
 * Port 0 (the default) picks a free port; "listening on http://127.0.0.1:PORT" is printed on
 * stdout once it accepts. "Expect: 100-continue" is answered. A chunked body answers 411, a
 * reply_bytes that is not a number from 2 to 1 MiB 400. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define SINK_BUF (1 << 20)
#define SINK_HEAD_MAX 16384
#define SINK_REPLY_MAX (1 << 20)
#define SINK_REPLY_DEFAULT 3 /* "{}" and a space */

static char sink_buf[SINK_BUF];
static char sink_reply[SINK_REPLY_MAX]; /* "{}" and spaces: JSON however much is sent */

/* Writes all of head then body_len bytes of body, in one call where the socket takes them: a
 * head and body sent apart would cost the round trip a second segment. 0 or -errno. */
static int sink_sendv(int fd, const char *head, const char *body, size_t body_len)
{
    struct iovec iov[2] = {{(void *)head, strlen(head)}, {(void *)body, body_len}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    while (msg.msg_iovlen > 0) {
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        for (; msg.msg_iovlen > 0 && (size_t)n >= msg.msg_iov->iov_len; msg.msg_iovlen--)
            n -= (ssize_t)msg.msg_iov++->iov_len;
        if (msg.msg_iovlen > 0) {
            msg.msg_iov->iov_base = (char *)msg.msg_iov->iov_base + n;
            msg.msg_iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

/* Writes all of s; 0 or -errno. */
static int sink_send(int fd, const char *s)
{
    return sink_sendv(fd, s, NULL, 0);
}

/* The reply_bytes=N of the request line that starts head: N, SINK_REPLY_DEFAULT when it has
 * none, or -EINVAL when N is not from 2 to SINK_REPLY_MAX. */
static long sink_reply_bytes(const char *head)
{
    const char *eol = strstr(head, "\r\n");
    const char *q = strstr(head, "reply_bytes=");
    if (!q || (eol && q > eol) || (q[-1] != '?' && q[-1] != '&')) return SINK_REPLY_DEFAULT;
    const char *digits = q + strlen("reply_bytes=");
    char *end;
    long n = strtol(digits, &end, 10);
    if (end == digits || n < 2 || n > SINK_REPLY_MAX) return -EINVAL;
    return n;
}

/* Answers 200 with the first reply_bytes of sink_reply; 0 or -errno. */
static int sink_answer(int fd, long reply_bytes)
{
    char head[128];
    snprintf(head, sizeof head,
             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %ld\r\n\r\n",
             reply_bytes);
    return sink_sendv(fd, head, sink_reply, (size_t)reply_bytes);
}

/* The value of header name in the NUL-terminated head, or NULL. */
static const char *sink_header(const char *head, const char *name)
{
    size_t len = strlen(name);
    for (const char *line = strstr(head, "\r\n"); line; line = strstr(line + 2, "\r\n")) {
        if (strncasecmp(line + 2, name, len) == 0 && line[2 + len] == ':') {
            const char *v = line + 3 + len;
            while (*v == ' ')
                v++;
            return v;
        }
    }
    return NULL;
}

/* Reads and drops the next n bytes of the connection; 0 or -errno (-EPIPE at
 * an early end). */
static int sink_drain(int fd, long long n)
{
    while (n > 0) {
        ssize_t got = recv(fd, sink_buf, n < SINK_BUF ? (size_t)n : SINK_BUF, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -errno;
        if (got == 0) return -EPIPE;
        n -= got;
    }
    return 0;
}

/* Serves one request on fd: 1 when the connection may carry another, 0 when it ended, or
 * -errno. Bytes after the head that arrived with it count toward the body. */
static int sink_request(int fd)
{
    static char head[SINK_HEAD_MAX + 1];
    size_t have = 0;
    char *end = NULL;
    while (!end) {
        if (have == SINK_HEAD_MAX) return -E2BIG;
        ssize_t got = recv(fd, head + have, SINK_HEAD_MAX - have, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return got == 0 ? 0 : -errno;
        have += (size_t)got;
        head[have] = '\0';
        end = strstr(head, "\r\n\r\n");
    }
    size_t head_len = (size_t)(end - head) + 4;
    *end = '\0';
    const char *te = sink_header(head, "Transfer-Encoding");
    if (te && strncasecmp(te, "chunked", 7) == 0) {
        sink_send(fd, "HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\n"
                      "Connection: close\r\n\r\n");
        return 0;
    }
    long reply_bytes = sink_reply_bytes(head);
    if (reply_bytes == -EINVAL) {
        sink_send(fd, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                      "Connection: close\r\n\r\n");
        return 0;
    }
    const char *cl = sink_header(head, "Content-Length");
    long long body = cl ? strtoll(cl, NULL, 10) : 0;
    const char *expect = sink_header(head, "Expect");
    if (expect && strncasecmp(expect, "100-continue", 12) == 0) {
        int r = sink_send(fd, "HTTP/1.1 100 Continue\r\n\r\n");
        if (r < 0) return r;
    }
    int r = sink_drain(fd, body - (long long)(have - head_len));
    if (r < 0) return r;
    r = sink_answer(fd, reply_bytes);
    return r < 0 ? r : 1;
}

int main(int argc, char **argv)
{
    int port = 0;
    if (argc == 3 && strcmp(argv[1], "--port") == 0) {
        port = atoi(argv[2]);
    } else if (argc != 1) {
        fprintf(stderr, "usage: bench_http_sink [--port N]\n");
        return 2;
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof addr;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 16) < 0 ||
        getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0) {
        fprintf(stderr, "bench_http_sink: cannot listen: %s\n", strerror(errno));
        return 1;
    }
    memset(sink_reply, ' ', sizeof sink_reply);
    memcpy(sink_reply, "{}", 2);
    printf("listening on http://127.0.0.1:%d\n", ntohs(addr.sin_port));
    fflush(stdout);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "bench_http_sink: accept: %s\n", strerror(errno));
            return 1;
        }
        /* Each answer leaves in one segment where it fits, as a latency-minded server's do. */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int r;
        while ((r = sink_request(fd)) > 0)
            ;
        /* A load generator resets its connections when its time is up: no error of ours. */
        if (r < 0 && r != -ECONNRESET)
            fprintf(stderr, "bench_http_sink: request: %s\n", strerror(-r));
        close(fd);
    }
}
