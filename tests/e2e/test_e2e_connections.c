/* End-to-end: connections against the real gpujobd, over raw sockets. Waits whose clients
 * went away give their connections back at once; slow or greedy TCP clients cannot lock other
 * clients out (per-address limit, header deadline) nor flood the log; and requests whose
 * framing or target a proxy could read differently, or whose line or fields hold a NUL or
 * another control byte, answer 400. Loopback only. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* A TCP connection to the daemon from source address src ("127.0.0.1", "127.0.0.2": all of
 * 127/8 is loopback). -1 when the connection is refused. */
static int tcp_connect(e2e_daemon_t *d, const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert(fd >= 0);
    struct sockaddr_in from = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &from.sin_addr);
    ck_assert_msg(bind(fd, (struct sockaddr *)&from, sizeof from) == 0, "bind %s: %s", src,
                  strerror(errno));
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(e2e_daemon_port(d))};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&to, sizeof to) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int unix_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert(fd >= 0);
    struct sockaddr_un to = {.sun_family = AF_UNIX};
    snprintf(to.sun_path, sizeof to.sun_path, "%s", path);
    ck_assert_msg(connect(fd, (struct sockaddr *)&to, sizeof to) == 0, "connect %s: %s", path,
                  strerror(errno));
    return fd;
}

/* Sends request on fd and reads the answer until the daemon closes or timeout_s passes; the
 * answer's status, 0 when none came. The answer is copied into reply (may be NULL). */
static long exchange(int fd, const char *request, size_t len, double timeout_s, char *reply,
                     size_t size)
{
    char buf[8192];
    if (!reply) reply = buf, size = sizeof buf;
    struct timeval tv = {.tv_sec = (long)timeout_s, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (send(fd, request, len, MSG_NOSIGNAL) != (ssize_t)len) return 0;
    size_t got = 0;
    double until = e2e_now() + timeout_s;
    while (got < size - 1 && e2e_now() < until) {
        ssize_t k = read(fd, reply + got, size - 1 - got);
        if (k <= 0) break;
        got += (size_t)k;
        reply[got] = '\0';
        /* A whole answer with a body length: enough. */
        const char *end = strstr(reply, "\r\n\r\n"), *cl = strcasestr(reply, "Content-Length:");
        if (end && cl && cl < end && got >= (size_t)(end + 4 - reply) + strtoul(cl + 15, 0, 10))
            break;
    }
    reply[got] = '\0';
    long status = 0;
    if (sscanf(reply, "HTTP/1.%*d %ld", &status) != 1) status = 0;
    return status;
}

/* One request on a new connection from src; its status (0: no answer). */
static long tcp_request(e2e_daemon_t *d, const char *src, const char *request, char *reply,
                        size_t size)
{
    int fd = tcp_connect(d, src);
    if (fd < 0) return 0;
    long status = exchange(fd, request, strlen(request), 5, reply, size);
    close(fd);
    return status;
}

static double tcp_connections(e2e_daemon_t *d)
{
    return e2e_metric_ok(d, "gpujobd_http_connections{listener=\"tcp\"}");
}

/* The daemon's open sockets, counted in /proc. */
static int daemon_sockets(e2e_daemon_t *d)
{
    char dir[64], link[PATH_MAX], target[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)e2e_daemon_pid(d));
    DIR *fds = opendir(dir);
    ck_assert(fds);
    int n = 0;
    for (struct dirent *e; (e = readdir(fds));) {
        snprintf(link, sizeof link, "%s/%s", dir, e->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        n += len > 0 && strncmp(target, "socket:", 7) == 0;
    }
    closedir(fds);
    return n;
}

#define N_WAITS 60

START_TEST(test_closed_waits_give_back_their_connections_at_once)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG "[server]\n"
                                                                "max_connections = 64\n"
                                                                "max_connections_per_ip = 0\n");
    json_t *job = e2e_long_job_new(30000);
    char *id = e2e_submit_ok(d, job);
    json_decref(job);
    char request[256];
    int n = snprintf(request, sizeof request,
                     "GET /v1/jobs/%s/wait?timeout=300 HTTP/1.1\r\nHost: localhost\r\n\r\n", id);
    int fds[N_WAITS];
    for (int i = 0; i < N_WAITS; i++) {
        fds[i] = tcp_connect(d, "127.0.0.1");
        ck_assert_int_ge(fds[i], 0);
        ck_assert_int_eq(send(fds[i], request, (size_t)n, MSG_NOSIGNAL), n);
    }
    double until = e2e_now() + 10;
    while (tcp_connections(d) < N_WAITS + 1 && e2e_now() < until)
        usleep(50 * 1000);
    ck_assert_double_ge(tcp_connections(d), N_WAITS + 1);
    usleep(200 * 1000); /* every wait posted */
    int sockets_before = daemon_sockets(d);
    for (int i = 0; i < N_WAITS; i++)
        close(fds[i]);
    /* The waits end now, not after their 300 s: the daemon closes their sockets (rather than
     * keep them half-closed), and only the metrics client stays connected. */
    until = e2e_now() + 5;
    while (daemon_sockets(d) > sockets_before - N_WAITS && e2e_now() < until)
        usleep(50 * 1000);
    ck_assert_int_le(daemon_sockets(d), sockets_before - N_WAITS);
    ck_assert_double_le(tcp_connections(d), 2);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

#define N_SLOW 120

START_TEST(test_slow_clients_are_cut_and_lock_nobody_out)
{
    char sock_dir[] = "/tmp/gj-conn-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(sock_dir));
    char sock_path[64], config[512];
    snprintf(sock_path, sizeof sock_path, "%s/gpujobd.sock", sock_dir);
    snprintf(config, sizeof config,
             "[server]\nunix_socket = %s\nmax_connections = 64\nmax_connections_per_ip = 16\n"
             "header_timeout_s = 2\nidle_timeout_s = 3\n",
             sock_path);
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    int warnings_before = e2e_daemon_log_count(d, " warn ");

    /* Slow clients: a header begun, then one byte a second, which MHD's idle timeout never
     * sees as idle. More than the daemon has slots. */
    int slow[N_SLOW];
    bool open_[N_SLOW];
    for (int i = 0; i < N_SLOW; i++) {
        slow[i] = tcp_connect(d, "127.0.0.1");
        open_[i] = slow[i] >= 0;
        if (open_[i]) send(slow[i], "GET /healthz HTTP/1.1\r\nX", 24, MSG_NOSIGNAL);
    }
    usleep(300 * 1000);

    /* Another client over TCP, and one over the Unix socket, are served meanwhile. */
    static const char healthz[] =
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    ck_assert_int_eq(tcp_request(d, "127.0.0.2", healthz, NULL, 0), 200);
    int ufd = unix_connect(sock_path);
    ck_assert_int_eq(exchange(ufd, healthz, strlen(healthz), 5, NULL, 0), 200);
    close(ufd);

    /* Trickle: every slow client still open gets a byte a second; the daemon must close each
     * one within its header deadline (2 s), plus the watch's tick. */
    double until = e2e_now() + 6;
    int still_open = N_SLOW;
    while (e2e_now() < until && still_open) {
        still_open = 0;
        for (int i = 0; i < N_SLOW; i++) {
            if (!open_[i]) continue;
            char c;
            ssize_t k = recv(slow[i], &c, 1, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
                send(slow[i], "x", 1, MSG_NOSIGNAL) < 0) {
                open_[i] = false;
                continue;
            }
            still_open++;
        }
        usleep(1000 * 1000);
    }
    ck_assert_msg(still_open == 0, "%d slow clients still connected after 6 s", still_open);
    for (int i = 0; i < N_SLOW; i++)
        if (slow[i] >= 0) close(slow[i]);
    /* The refusals and cuts took a few lines, not one per connection. */
    int warnings = e2e_daemon_log_count(d, " warn ") - warnings_before;
    ck_assert_msg(warnings <= 4, "%d warning lines about %d slow clients", warnings, N_SLOW);
    ck_assert_int_eq(tcp_request(d, "127.0.0.1", healthz, NULL, 0), 200);
    e2e_daemon_free(d);
    unlink(sock_path);
    rmdir(sock_dir);
}
END_TEST

#define N_GREEDY 100
#define PER_IP 64

/* Whether fd has an answer (or its end) to read within timeout_ms. */
static bool readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1;
}

/* One address opens its connections first, while none has a request in flight, and sends a
 * request's headers on each afterwards (a body announced and never sent): only
 * max_connections_per_ip of those requests are let in, the rest answer 429 and are closed, a
 * kept-alive connection's next request is refused too, and another address is served. */
START_TEST(test_requests_past_the_per_address_limit_are_refused_when_their_headers_arrive)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[server]\nmax_connections = 400\n"
                                          "max_connections_per_ip = 64\nbody_timeout_s = 60\n");
    static const char healthz[] = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    int kept = tcp_connect(d, "127.0.0.1");
    ck_assert_int_ge(kept, 0);
    ck_assert_int_eq(exchange(kept, healthz, strlen(healthz), 5, NULL, 0), 200);
    int fds[N_GREEDY];
    for (int i = 0; i < N_GREEDY; i++) {
        fds[i] = tcp_connect(d, "127.0.0.1");
        ck_assert_int_ge(fds[i], 0);
    }
    usleep(300 * 1000); /* every connection let in before any head arrives */
    static const char post[] = "POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\n"
                               "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n";
    for (int i = 0; i < N_GREEDY; i++)
        ck_assert_int_eq(send(fds[i], post, strlen(post), MSG_NOSIGNAL), (ssize_t)strlen(post));
    usleep(1000 * 1000);
    int answered = 0, waiting = 0;
    for (int i = 0; i < N_GREEDY; i++) {
        if (!readable(fds[i], 0)) {
            waiting++;
            continue;
        }
        char reply[2048];
        long status = exchange(fds[i], "", 0, 2, reply, sizeof reply);
        ck_assert_msg(status == 429, "request %d answered %ld: %s", i, status, reply);
        ck_assert_ptr_nonnull(strcasestr(reply, "Retry-After:"));
        ck_assert_ptr_nonnull(strcasestr(reply, "Connection: close"));
        ck_assert_ptr_nonnull(strstr(reply, "\"server.max_connections_per_ip\""));
        ck_assert(readable(fds[i], 2000));
        char c;
        ck_assert_int_eq(read(fds[i], &c, 1), 0); /* closed after the answer */
        answered++;
    }
    ck_assert_int_eq(waiting, PER_IP);
    ck_assert_int_eq(answered, N_GREEDY - PER_IP);
    /* The kept-alive connection's next request is refused; another address is served. */
    ck_assert_int_eq(exchange(kept, healthz, strlen(healthz), 5, NULL, 0), 429);
    close(kept);
    ck_assert_int_eq(tcp_request(d, "127.0.0.2", healthz, NULL, 0), 200);
    /* Requests that end make room again. */
    for (int i = 0; i < N_GREEDY; i++)
        close(fds[i]);
    double until = e2e_now() + 5;
    long status = 0;
    while ((status = tcp_request(d, "127.0.0.1", healthz, NULL, 0)) != 200 && e2e_now() < until)
        usleep(50 * 1000);
    ck_assert_int_eq(status, 200);
    e2e_daemon_free(d);
}
END_TEST

/* A slowloris: n (up to SLOW_SOCKETS) connections from 127.0.0.1 that send a request line and
 * then trickle a header one byte per round (SLOW_ROUND_MS), each reconnected at its next round
 * once the daemon closed it, as such a client does (unless once). Runs on a thread of its
 * own. */
#define SLOW_SOCKETS 2000
#define SLOW_ROUND_MS 500

typedef struct slowloris {
    int port, n;
    bool once; /* a socket the daemon closed is not opened again */
    int fds[SLOW_SOCKETS];
    double opened[SLOW_SOCKETS]; /* when each socket connected */
    bool started[SLOW_SOCKETS];  /* its request line went out */
    bool gone[SLOW_SOCKETS];     /* the daemon closed it */
    atomic_bool stop;
    atomic_int rounds;
    long connects;
    int closed;           /* sockets the daemon closed, and how long the shortest and the */
    double shortest_open; /* longest of them stayed open, in seconds */
    double longest_open;
    pthread_t thread;
} slowloris_t;

static void slow_connect(slowloris_t *sl, int i)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return;
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sl->port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&to, sizeof to) < 0 && errno != EINPROGRESS) {
        close(fd);
        return;
    }
    sl->fds[i] = fd;
    sl->opened[i] = e2e_now();
    sl->started[i] = false;
    sl->connects++;
}

/* Notes that the daemon closed socket i after it had sent its request line. */
static void slow_closed(slowloris_t *sl, int i)
{
    double open_s = e2e_now() - sl->opened[i];
    if (open_s > sl->longest_open) sl->longest_open = open_s;
    if (!sl->closed || open_s < sl->shortest_open) sl->shortest_open = open_s;
    sl->closed++;
}

/* One round over socket i: reconnect it if the daemon closed it, else send its next bytes. */
static void slow_tick(slowloris_t *sl, int i)
{
    static const char line[] = "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
    int fd = sl->fds[i];
    if (fd < 0) {
        if (!(sl->once && sl->gone[i])) slow_connect(sl, i);
        return;
    }
    char c;
    ssize_t k = recv(fd, &c, 1, MSG_DONTWAIT);
    bool closed = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    if (!closed) {
        const char *bytes = sl->started[i] ? "a" : line;
        size_t n = sl->started[i] ? 1 : sizeof line - 1;
        ssize_t sent = send(fd, bytes, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent == (ssize_t)n) sl->started[i] = true;
        closed = sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
    }
    if (!closed) return;
    if (sl->started[i]) slow_closed(sl, i);
    sl->gone[i] = true;
    close(fd);
    sl->fds[i] = -1;
}

static void *slowloris_run(void *arg)
{
    slowloris_t *sl = arg;
    while (!atomic_load(&sl->stop)) {
        double round_end = e2e_now() + SLOW_ROUND_MS / 1000.0;
        for (int i = 0; i < sl->n; i++)
            slow_tick(sl, i);
        atomic_fetch_add(&sl->rounds, 1);
        while (!atomic_load(&sl->stop) && e2e_now() < round_end)
            usleep(10 * 1000);
    }
    return NULL;
}

/* Starts a slowloris of n sockets on d, and returns once each has been opened (two rounds). */
static slowloris_t *slowloris_start(e2e_daemon_t *d, int n, bool once)
{
    slowloris_t *sl = calloc(1, sizeof *sl);
    ck_assert_ptr_nonnull(sl);
    sl->port = e2e_daemon_port(d);
    sl->n = n;
    sl->once = once;
    for (int i = 0; i < SLOW_SOCKETS; i++)
        sl->fds[i] = -1;
    ck_assert_int_eq(pthread_create(&sl->thread, NULL, slowloris_run, sl), 0);
    while (atomic_load(&sl->rounds) < 2)
        usleep(10 * 1000);
    return sl;
}

/* Stops the slowloris and closes its sockets; returns how many were still open. */
static int slowloris_stop(slowloris_t *sl)
{
    atomic_store(&sl->stop, true);
    pthread_join(sl->thread, NULL);
    int open = 0;
    for (int i = 0; i < sl->n; i++) {
        if (sl->fds[i] < 0) continue;
        open++;
        close(sl->fds[i]);
    }
    return open;
}

/* Raises this process's descriptor limit to its hard limit; false (with a reason printed)
 * when that is fewer than need. */
static bool raise_own_fd_limit(rlim_t need)
{
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = rl.rlim_max;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur >= need) return true;
    fprintf(stderr, "skipped: the descriptor limit is %llu, fewer than %llu\n",
            (unsigned long long)rl.rlim_cur, (unsigned long long)need);
    return false;
}

#define GOOD_REQUESTS 40
/* The slowloris test's header deadline. */
#define SLOW_HEADER_TIMEOUT_S 4
/* A socket the deadline cuts is seen closed within the watch's tick and a slowloris round. */
#define SLOW_CUT_SLACK_S 1.5

START_TEST(test_thousands_of_slow_sockets_lock_no_client_out)
{
    if (!raise_own_fd_limit(SLOW_SOCKETS + 256)) return;
    /* The packaged defaults (max_connections sized from the descriptor limit, 64 requests in
     * flight per address), but a shorter header deadline for a shorter test. Every socket of
     * the slowloris comes from 127.0.0.1, as does the client: no limit per address can tell
     * them apart. */
    char config[128];
    snprintf(config, sizeof config, "[server]\nheader_timeout_s = %d\n", SLOW_HEADER_TIMEOUT_S);
    e2e_daemon_t *d = e2e_daemon_start_ok(config);
    slowloris_t *sl = slowloris_start(d, SLOW_SOCKETS, false);

    /* A client's requests, each on a new TCP connection, while the slowloris runs. */
    static const char info[] =
        "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    int failed = 0;
    long first_failure = 0;
    double begin = e2e_now();
    for (int i = 0; i < GOOD_REQUESTS; i++) {
        long status = tcp_request(d, "127.0.0.1", info, NULL, 0);
        if (status != 200 && !failed++) first_failure = status;
        usleep(100 * 1000);
    }
    double took = e2e_now() - begin;
    slowloris_stop(sl);
    fprintf(stderr,
            "slowloris of %d: %ld connections in %d rounds, %d closed by the daemon after "
            "%.2f s to %.2f s; %d requests in %.1f s\n",
            SLOW_SOCKETS, sl->connects, atomic_load(&sl->rounds), sl->closed, sl->shortest_open,
            sl->longest_open, GOOD_REQUESTS, took);
    ck_assert_msg(failed == 0, "%d of %d requests failed under the slowloris (the first: %ld)",
                  failed, GOOD_REQUESTS, first_failure);
    ck_assert_msg(sl->longest_open <= SLOW_HEADER_TIMEOUT_S + SLOW_CUT_SLACK_S,
                  "a trickling socket stayed open %.1f s, past its header deadline of %d s",
                  sl->longest_open, SLOW_HEADER_TIMEOUT_S);
    free(sl);

    /* Fewer slow sockets than the share kept for them: nothing needs their room, and each is
     * cut by its header deadline, however it trickles. */
    sl = slowloris_start(d, 100, true);
    double until = e2e_now() + SLOW_HEADER_TIMEOUT_S + SLOW_CUT_SLACK_S + 1;
    while (sl->closed < 100 && e2e_now() < until)
        usleep(100 * 1000);
    int still_open = slowloris_stop(sl);
    fprintf(stderr, "slowloris of 100: closed after %.2f s to %.2f s, %d still open\n",
            sl->shortest_open, sl->longest_open, still_open);
    ck_assert_msg(still_open == 0, "%d trickling sockets outlived their header deadline",
                  still_open);
    ck_assert_double_ge(sl->shortest_open, SLOW_HEADER_TIMEOUT_S - 0.5);
    ck_assert_double_le(sl->longest_open, SLOW_HEADER_TIMEOUT_S + SLOW_CUT_SLACK_S);
    free(sl);

    /* Everything the slowloris opened is gone from the daemon, which serves on. */
    until = e2e_now() + 10;
    while (tcp_connections(d) > 1 && e2e_now() < until)
        usleep(100 * 1000);
    ck_assert_double_le(tcp_connections(d), 1);
    ck_assert_int_eq(tcp_request(d, "127.0.0.1", info, NULL, 0), 200);
    e2e_daemon_free(d);
}
END_TEST

/* The soft and hard "Max open files" of the daemon, from /proc/PID/limits. */
static void daemon_fd_limits(e2e_daemon_t *d, long *ret_soft, long *ret_hard)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/limits", (int)e2e_daemon_pid(d));
    FILE *f = fopen(path, "re");
    ck_assert_ptr_nonnull(f);
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "Max open files %ld %ld", ret_soft, ret_hard) == 2;
    fclose(f);
    ck_assert_msg(found, "no 'Max open files' in %s", path);
}

START_TEST(test_the_connection_limit_fits_the_descriptor_limit)
{
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max < 4096) {
        fprintf(stderr, "skipped: the hard descriptor limit is %llu\n",
                (unsigned long long)rl.rlim_max);
        return;
    }
    /* A low soft limit under a high hard one: the daemon raises it, and the 992 connections of
     * its 8 HTTP threads fit. */
    rl.rlim_cur = 512;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    long soft, hard;
    daemon_fd_limits(d, &soft, &hard);
    ck_assert_int_eq(soft, hard);
    ck_assert_int_eq(e2e_daemon_log_count(d, "HTTP connections: at most 992 a listener"), 1);
    int status;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);

    /* A hard limit of 512: the default takes what fits, and says so; a configured limit that
     * cannot fit is refused at start, with the numbers. */
    rl.rlim_max = 512;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    ck_assert_int_eq(e2e_daemon_log_count(d, "fits"), 1);
    int limit = 0;
    char log_path[PATH_MAX + 32], line[512];
    snprintf(log_path, sizeof log_path, "%s/gpujobd.log", e2e_daemon_dir(d));
    FILE *f = fopen(log_path, "re");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "HTTP connections: at most ");
        if (at) limit = atoi(at + strlen("HTTP connections: at most "));
    }
    fclose(f);
    ck_assert_int_gt(limit, 0);
    ck_assert_int_lt(limit, 256); /* two descriptors a connection, and the daemon's own */
    static const char healthz[] = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    ck_assert_int_eq(tcp_request(d, "127.0.0.1", healthz, NULL, 0), 200);
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);
    static const char *const too_many[] = {"--set", "server.max_connections=1000", NULL};
    char refused_log[PATH_MAX + 32];
    status =
        e2e_daemon_run_to_exit_ok(d, too_many, "refused.log", 30, refused_log, sizeof refused_log);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0, "status 0x%x", status);
    ck_assert_msg(e2e_file_has_line(refused_log, "server.max_connections = 1000 needs", "512"),
                  "no reason in %s", refused_log);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_ambiguous_requests_answer_400)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    json_t *job = json_loads("{\"op\":\"add\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[1],"
                             "\"data\":[1]},\"y\":{\"dtype\":\"f32\",\"shape\":[1],\"data\":[2]}}}",
                             0, NULL);
    char *id = e2e_submit_ok(d, job);
    json_decref(job);
    char request[512], reply[8192];
    /* The job itself is found. */
    snprintf(request, sizeof request, "GET /v1/jobs/%s HTTP/1.1\r\nHost: localhost\r\n\r\n", id);
    ck_assert_int_eq(tcp_request(d, "127.0.0.1", request, reply, sizeof reply), 200);
    static const char *const suffixes[] = {"%00junk", "%0a", "%1F", "%7f"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        snprintf(request, sizeof request, "GET /v1/jobs/%s%s HTTP/1.1\r\nHost: localhost\r\n\r\n",
                 id, suffixes[i]);
        ck_assert_msg(tcp_request(d, "127.0.0.1", request, reply, sizeof reply) == 400, "%s: %s",
                      suffixes[i], reply);
        ck_assert_ptr_nonnull(strstr(reply, "\"field\":\"path\""));
    }
    static const char *const framings[] = {
        "POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}",
        "POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        "POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        "Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof framings / sizeof framings[0]; i++) {
        ck_assert_msg(tcp_request(d, "127.0.0.1", framings[i], reply, sizeof reply) == 400,
                      "framing %zu: %s", i, reply);
        ck_assert_ptr_nonnull(strstr(reply, "headers.Content-Length"));
        ck_assert_ptr_nonnull(strcasestr(reply, "Connection: close"));
    }
    ck_assert_int_eq(
        tcp_request(d, "127.0.0.1", "GET /healthz HTTP/1.1\r\n\r\n", reply, sizeof reply), 400);
    ck_assert_ptr_nonnull(strstr(reply, "headers.Host"));
    ck_assert_int_eq(
        tcp_request(d, "127.0.0.1", "GET /healthz HTTP/1.0\r\n\r\n", reply, sizeof reply), 200);
    free(id);
    e2e_daemon_free(d);
}
END_TEST

/* A raw request and the status it must answer. */
typedef struct raw_case {
    const char *what;
    const char *bytes;
    size_t len;
    long status;
} raw_case_t;

#define RAW(what, literal, status)                                                                 \
    {                                                                                              \
        what, literal, sizeof literal - 1, status                                                  \
    }

START_TEST(test_nul_and_control_bytes_in_a_request_answer_400)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("");
    static const raw_case_t cases[] = {
        RAW("a NUL in the target", "GET /v1/info\0junk HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
        RAW("a NUL in the method", "GET\0X /v1/info HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
        RAW("a control byte in the method", "G\x01T /v1/info HTTP/1.1\r\nHost: localhost\r\n\r\n",
            400),
        RAW("a space in the target", "GET /v1/info x HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
        RAW("two spaces after the method", "GET  /v1/info HTTP/1.1\r\nHost: localhost\r\n\r\n",
            400),
        RAW("a control byte in a name",
            "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A\x01: 1\r\n\r\n", 400),
        RAW("a space before the colon",
            "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A : 1\r\n\r\n", 400),
        RAW("a NUL in a name", "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-\0A: 1\r\n\r\n", 400),
        RAW("a control byte in a value",
            "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A: a\x01z\r\n\r\n", 400),
        RAW("a DEL in a value", "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A: a\x7f\r\n\r\n",
            400),
        RAW("a bare CR in a value", "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A: a\rz\r\n\r\n",
            400),
        RAW("a NUL in a value", "GET /v1/info HTTP/1.1\r\nX-A: a\0z\r\nHost: localhost\r\n\r\n",
            400),
        RAW("a NUL in the last value",
            "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A: a\0z\r\n\r\n", 400),
        RAW("a NUL ending the last value",
            "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A: a\0\r\n\r\n", 400),
        RAW("a NUL in Host", "GET /v1/info HTTP/1.1\r\nHost: x\0evil\r\n\r\n", 400),
        RAW("a folded value", "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A: a\r\n b\r\n\r\n",
            400),
        /* Well-formed, however spelled: a tab in a value, bare LFs, empty and 8-bit values. */
        RAW("a tab in a value", "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A: a\tz\r\n\r\n",
            200),
        RAW("bare LF line ends", "GET /v1/info HTTP/1.1\nHost: localhost\nX-A: a\n\n", 200),
        RAW("empty and 8-bit values",
            "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A:\r\nX-B:   \xc3\xa9t\xc3\xa9  \r\n"
            "User-Agent: t\r\n\r\n",
            200),
        RAW("no field but Host", "GET /v1/info?x=%41 HTTP/1.1\r\nHost: localhost\r\n\r\n", 200),
        RAW("HTTP/1.0 without fields", "GET /v1/info HTTP/1.0\r\n\r\n", 200),
    };
    char reply[8192];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const raw_case_t *c = &cases[i];
        int fd = tcp_connect(d, "127.0.0.1");
        ck_assert_int_ge(fd, 0);
        long status = exchange(fd, c->bytes, c->len, 5, reply, sizeof reply);
        close(fd);
        ck_assert_msg(status == c->status, "%s: %ld, expected %ld: %s", c->what, status, c->status,
                      reply);
        if (status == 400 && strstr(reply, "\"error\""))
            ck_assert_msg(strcasestr(reply, "Connection: close"), "%s: %s", c->what, reply);
    }
    /* A kept-alive connection's second request, and a body after checked fields. */
    static const char info[] = "GET /v1/info HTTP/1.1\r\nHost: localhost\r\nX-A: 1\r\n\r\n";
    static const char job[] = "POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                              "application/json\r\nContent-Length: 66\r\n\r\n"
                              "{\"op\":\"sum\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[1],"
                              "\"data\":[1]}}}";
    ck_assert_int_eq(strlen(strstr(job, "\r\n\r\n") + 4), 66);
    int fd = tcp_connect(d, "127.0.0.1");
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(exchange(fd, info, sizeof info - 1, 5, reply, sizeof reply), 200);
    ck_assert_int_eq(exchange(fd, job, sizeof job - 1, 5, reply, sizeof reply), 201);
    ck_assert_int_eq(exchange(fd, info, sizeof info - 1, 5, reply, sizeof reply), 200);
    close(fd);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_submission_wait_of_a_closed_client_is_released)
{
    /* A long group-commit window: the client leaves while its submission is committed. It
     * sends a token: a loopback client that closes its socket before the daemon has asked the
     * kernel whose it is would be nobody's (401). */
    e2e_daemon_t *d = e2e_daemon_start_ok(E2E_ONE_WORKER_CONFIG "commit_delay_us = 1000000\n");
    char token[E2E_TOKEN_SIZE];
    e2e_token_create_ok(d, "leaver", NULL, token);
    json_t *job = e2e_long_job_new(30000);
    char *text = json_dumps(job, JSON_COMPACT);
    json_decref(job);
    char request[1024];
    int n = snprintf(request, sizeof request,
                     "POST /v1/jobs?wait=300 HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
                     "%s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     token, strlen(text), text);
    free(text);
    ck_assert_int_lt(n, (int)sizeof request);
    int sockets_before = daemon_sockets(d);
    int fd = tcp_connect(d, "127.0.0.1");
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(send(fd, request, (size_t)n, MSG_NOSIGNAL), n);
    double until = e2e_now() + 5;
    while (daemon_sockets(d) <= sockets_before && e2e_now() < until)
        usleep(20 * 1000);
    close(fd);
    /* The wait ends now, not with the job 30 s later: the daemon closes the socket. */
    until = e2e_now() + 5;
    while (daemon_sockets(d) > sockets_before && e2e_now() < until)
        usleep(50 * 1000);
    ck_assert_int_le(daemon_sockets(d), sockets_before);
    /* The job was accepted all the same. */
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 1);
    e2e_daemon_free(d);
}
END_TEST

/* Fills the filesystem of dir with a file until it has no room; returns its path in path. */
static void fill_disk(const char *dir, char *path, size_t size)
{
    snprintf(path, size, "%s/filler", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    ck_assert(fd >= 0);
    static char chunk[65536];
    while (write(fd, chunk, sizeof chunk) > 0)
        ;
    while (write(fd, chunk, 1) > 0)
        ;
    close(fd);
}

START_TEST(test_submission_on_a_full_disk_answers_507)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[store]\ninline_blob_bytes = 1024\n");
    int status;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);
    char state[512], filler[600];
    snprintf(state, sizeof state, "%s/state", e2e_daemon_dir(d));
    /* A small filesystem of its own for the state directory: root only. */
    if (mount("tmpfs", state, "tmpfs", 0, "size=16m") < 0) {
        fprintf(stderr, "skipped: cannot mount a tmpfs on '%s': %s\n", state, strerror(errno));
        e2e_daemon_free(d);
        return;
    }
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    fill_disk(state, filler, sizeof filler);
    /* x's 8 KiB go to a blob file, which the full disk refuses. */
    json_t *data = json_array();
    for (int i = 0; i < 2048; i++)
        json_array_append_new(data, json_integer(i));
    json_t *job = json_pack("{s:s, s:{s:{s:s, s:[i], s:o}}}", "op", "sum", "inputs", "x", "dtype",
                            "f32", "shape", 2048, "data", data);
    char *text = json_dumps(job, JSON_COMPACT);
    json_t *body = e2e_json_ok(d, "POST", "/v1/jobs", text, 507);
    ck_assert_str_eq(e2e_error_code(body), "insufficient_storage");
    json_decref(body);
    /* With room again, the same job is taken. */
    unlink(filler);
    json_decref(e2e_json_ok(d, "POST", "/v1/jobs", text, 201));
    free(text);
    json_decref(job);
    e2e_daemon_kill(d);
    umount2(state, MNT_DETACH);
    e2e_daemon_free(d);
}
END_TEST

/* Mounts a 16 MiB tmpfs on the state directory of d (stopped first, started again on it).
 * False, with the reason printed, where mounting is not permitted (not root). */
static bool restart_on_small_disk(e2e_daemon_t *d, char *state, size_t size)
{
    int status;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);
    snprintf(state, size, "%s/state", e2e_daemon_dir(d));
    if (mount("tmpfs", state, "tmpfs", 0, "size=16m") < 0) {
        fprintf(stderr, "skipped: cannot mount a tmpfs on '%s': %s\n", state, strerror(errno));
        return false;
    }
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    return true;
}

/* Asserts GET /readyz's status, and with 503 the reason and Retry-After of a full disk. */
static void expect_readyz(e2e_daemon_t *d, long status)
{
    e2e_response_t r = {0};
    ck_assert_int_eq(e2e_http_request(d, "GET", "/readyz", NULL, NULL, 0, &r), 0);
    ck_assert_msg(r.status == status, "readyz %ld: %s", r.status, r.body);
    char retry[32];
    if (status == 503) {
        ck_assert_str_eq(json_string_value(json_object_get(r.json, "status")), "disk_full");
        ck_assert_ptr_nonnull(json_string_value(json_object_get(r.json, "reason")));
        ck_assert_ptr_nonnull(e2e_response_header(&r, "Retry-After", retry, sizeof retry));
    }
    e2e_response_clear(&r);
}

/* A small inline job: no input file, so only the store's commit needs room. */
static const char small_job[] =
    "{\"op\":\"sum\",\"inputs\":{\"x\":{\"dtype\":\"f32\",\"shape\":[4],\"data\":[1,2,3,4]}}}";

START_TEST(test_full_disk_commits_answer_507_and_readyz_is_not_ready)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[store]\ninline_blob_bytes = 1024\n");
    char state[512], filler[600];
    if (!restart_on_small_disk(d, state, sizeof state)) {
        e2e_daemon_free(d);
        return;
    }
    expect_readyz(d, 200);
    fill_disk(state, filler, sizeof filler);
    expect_readyz(d, 503);
    /* Enough submissions to outgrow what the WAL has room for already. */
    json_t *body = NULL;
    for (int i = 0; i < 200; i++) {
        e2e_response_t r = {0};
        const char *h[] = {"Content-Type: application/json", NULL};
        ck_assert_int_eq(
            e2e_http_request(d, "POST", "/v1/jobs", h, small_job, strlen(small_job), &r), 0);
        ck_assert_msg(r.status == 201 || r.status == 507, "submission %d: %ld %s", i, r.status,
                      r.body);
        if (r.status == 507) body = json_incref(r.json);
        e2e_response_clear(&r);
        if (body) break;
    }
    ck_assert_ptr_nonnull(body);
    ck_assert_str_eq(e2e_error_code(body), "insufficient_storage");
    json_decref(body);
    /* With room again, the daemon is ready and takes the job. */
    unlink(filler);
    expect_readyz(d, 200);
    json_decref(e2e_json_ok(d, "POST", "/v1/jobs", small_job, 201));
    e2e_daemon_kill(d);
    umount2(state, MNT_DETACH);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_buffer_delete_frees_space_on_a_full_disk)
{
    e2e_daemon_t *d = e2e_daemon_start_ok("[store]\ninline_blob_bytes = 1024\n");
    char state[512], filler[600], path[600];
    if (!restart_on_small_disk(d, state, sizeof state)) {
        e2e_daemon_free(d);
        return;
    }
    /* Buffers of 256 KiB each, in files of their own. */
    enum { N_BUFFERS = 8, N_FLOATS = 65536 };
    static float x[N_FLOATS];
    char ids[N_BUFFERS][64];
    for (int i = 0; i < N_BUFFERS; i++) {
        json_t *b = e2e_upload_ok(d, "f32", "65536", x, sizeof x, false, 201);
        snprintf(ids[i], sizeof ids[i], "%s", json_string_value(json_object_get(b, "id")));
        json_decref(b);
    }
    fill_disk(state, filler, sizeof filler);
    /* Fill what the WAL has room for too: every delete must still be possible. */
    for (int i = 0; i < 200; i++) {
        e2e_response_t r = {0};
        const char *h[] = {"Content-Type: application/json", NULL};
        ck_assert_int_eq(
            e2e_http_request(d, "POST", "/v1/jobs", h, small_job, strlen(small_job), &r), 0);
        long status = r.status;
        e2e_response_clear(&r);
        if (status != 201) break;
    }
    for (int i = 0; i < N_BUFFERS; i++) {
        snprintf(path, sizeof path, "/v1/buffers/%s", ids[i]);
        json_t *deleted = e2e_json_ok(d, "DELETE", path, NULL, 200);
        ck_assert(json_is_true(json_object_get(deleted, "deleted")));
        json_decref(deleted);
        json_decref(e2e_json_ok(d, "GET", path, NULL, 404));
    }
    /* The buffers' files went: a submission fits again without the filler going. */
    json_t *body = e2e_json_ok(d, "POST", "/v1/jobs", small_job, 201);
    char *id = strdup(json_string_value(json_object_get(body, "id")));
    json_decref(body);
    json_decref(e2e_wait_final_ok(d, id, 30));
    free(id);
    e2e_daemon_kill(d);
    umount2(state, MNT_DETACH);
    e2e_daemon_free(d);
}
END_TEST

/* Every file the daemon writes in its state directory (database, WAL, shared memory, blobs,
 * lock, reserve) is readable by its owner only. */
static void expect_private_files(const char *dir)
{
    DIR *dp = opendir(dir);
    ck_assert_ptr_nonnull(dp);
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        ck_assert_int_eq(lstat(path, &sb), 0);
        ck_assert_msg((sb.st_mode & 077) == 0, "'%s' has mode %o", path, sb.st_mode & 07777);
        if (S_ISDIR(sb.st_mode)) expect_private_files(path);
    }
    closedir(dp);
}

START_TEST(test_state_files_are_private_to_the_daemon_user)
{
    /* A umask that would let everyone read: the daemon sets its own. */
    mode_t old = umask(022);
    e2e_daemon_t *d = e2e_daemon_start_ok("[store]\ninline_blob_bytes = 1024\n");
    umask(old);
    static float x[4096];
    json_decref(e2e_upload_ok(d, "f32", "4096", x, sizeof x, false, 201));
    json_t *body = e2e_json_ok(d, "POST", "/v1/jobs", small_job, 201);
    char *id = strdup(json_string_value(json_object_get(body, "id")));
    json_decref(body);
    json_decref(e2e_wait_final_ok(d, id, 30));
    free(id);
    char state[512];
    snprintf(state, sizeof state, "%s/state", e2e_daemon_dir(d));
    expect_private_files(state);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_connections");
    TCase *tc = tcase_create("connections");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_closed_waits_give_back_their_connections_at_once);
    tcase_add_test(tc, test_slow_clients_are_cut_and_lock_nobody_out);
    tcase_add_test(tc,
                   test_requests_past_the_per_address_limit_are_refused_when_their_headers_arrive);
    tcase_add_test(tc, test_thousands_of_slow_sockets_lock_no_client_out);
    tcase_add_test(tc, test_the_connection_limit_fits_the_descriptor_limit);
    tcase_add_test(tc, test_ambiguous_requests_answer_400);
    tcase_add_test(tc, test_nul_and_control_bytes_in_a_request_answer_400);
    tcase_add_test(tc, test_submission_wait_of_a_closed_client_is_released);
    tcase_add_test(tc, test_submission_on_a_full_disk_answers_507);
    tcase_add_test(tc, test_full_disk_commits_answer_507_and_readyz_is_not_ready);
    tcase_add_test(tc, test_buffer_delete_frees_space_on_a_full_disk);
    tcase_add_test(tc, test_state_files_are_private_to_the_daemon_user);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
