/* The watch over HTTP connections (api/conn_watch.c) on real loopback TCP sockets: a streamed
 * body's peer close that an edge-triggered poller already spent is announced again; the
 * suspended connection's gone callback, also after a watched body; deadlines; which
 * connections are let in (the share of those awaiting their head, requests per address). */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/conn_watch.h"
#include "daemon/util/id.h"
#include "support/run_suite.h"

/* A connected loopback TCP pair: ret[0] the server's end, ret[1] the client's. */
static void tcp_pair(int ret[2])
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(lfd, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&addr, sizeof addr), 0);
    ck_assert_int_eq(listen(lfd, 1), 0);
    ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&addr, &len), 0);
    ret[1] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_eq(connect(ret[1], (struct sockaddr *)&addr, sizeof addr), 0);
    ret[0] = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    ck_assert_int_ge(ret[0], 0);
    close(lfd);
}

/* An edge-triggered epoll set polling fd as libmicrohttpd polls a connection, its first edge
 * (writable at once) collected. */
static int edge_poller(int fd)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLPRI | EPOLLET};
    ck_assert_int_eq(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev), 0);
    struct epoll_event got;
    ck_assert_int_eq(epoll_wait(ep, &got, 1, 1000), 1);
    return ep;
}

/* A new watch with fd in it, with deadline_us as conn_watch_add takes it; fd's entry in *ret_e. */
static conn_watch_t *watch_fd(int fd, int64_t deadline_us, conn_watch_entry_t **ret_e)
{
    conn_watch_t *w;
    ck_assert_int_eq(conn_watch_new("test", &(conn_watch_limits_t){0}, &w), 0);
    ck_assert_int_eq(conn_watch_add(w, fd, NULL, deadline_us, ret_e), 0);
    return w;
}

/* Takes e out of w, frees w and closes e's fd. */
static void unwatch(conn_watch_t *w, conn_watch_entry_t *e, int fd)
{
    conn_watch_remove(w, e);
    conn_watch_free(w);
    close(fd);
}

/* The server's end after its client sent bytes and closed, as libmicrohttpd can leave it: the
 * one edge that announced both spent, the bytes read with a short read, the end unread. Its
 * edge-triggered epoll set in *ret_ep. */
static int spent_close(int *ret_ep)
{
    int fds[2];
    tcp_pair(fds);
    int ep = edge_poller(fds[0]);
    struct epoll_event got;
    ck_assert_int_eq(write(fds[1], "body", 4), 4);
    close(fds[1]);
    usleep(50 * 1000); /* the bytes and the close both in */
    ck_assert_int_eq(epoll_wait(ep, &got, 1, 1000), 1);
    char buf[64];
    ck_assert_int_eq(read(fds[0], buf, sizeof buf), 4);
    /* Nothing announces the unread end any more. */
    ck_assert_int_eq(epoll_wait(ep, &got, 1, 200), 0);
    *ret_ep = ep;
    return fds[0];
}

START_TEST(test_a_streamed_body_whose_client_left_wakes_the_poller_again)
{
    int ep;
    int fd = spent_close(&ep);
    conn_watch_entry_t *e;
    conn_watch_t *w = watch_fd(fd, 0, &e);
    conn_watch_body_begin(w, e);
    struct epoll_event got;
    ck_assert_int_eq(epoll_wait(ep, &got, 1, 2000), 1);
    char buf[8];
    ck_assert_int_eq(read(fd, buf, sizeof buf), 0); /* the end, readable */
    unwatch(w, e, fd);
    close(ep);
}
END_TEST

/* The watch shuts the socket down as soon as the client closes, which can be before the
 * poller collected the wake-up of the last bytes and the close: the shutdown's wake-up merges
 * into that one, which a short read spends. The watch's next ticks announce the end again. */
START_TEST(test_a_close_announced_before_the_poller_woke_is_announced_again)
{
    int fds[2];
    tcp_pair(fds);
    int ep = edge_poller(fds[0]);
    conn_watch_entry_t *e;
    conn_watch_t *w = watch_fd(fds[0], 0, &e);
    conn_watch_body_begin(w, e);
    ck_assert_int_eq(write(fds[1], "body", 4), 4);
    close(fds[1]);
    usleep(50 * 1000); /* the watch has shut the socket down by now */
    struct epoll_event got;
    ck_assert_int_eq(epoll_wait(ep, &got, 1, 1000), 1);
    char buf[64];
    ck_assert_int_eq(read(fds[0], buf, sizeof buf), 4);
    ck_assert_int_eq(epoll_wait(ep, &got, 1, 2000), 1);
    ck_assert_int_eq(read(fds[0], buf, sizeof buf), 0);
    unwatch(w, e, fds[0]);
    close(ep);
}
END_TEST

static void count_gone(void *ud)
{
    atomic_fetch_add((atomic_int *)ud, 1);
}

/* Waits up to 2 s for the gone callback, then a little more: it must have run exactly once. */
static void expect_gone_once(atomic_int *gone)
{
    int64_t until = mono_us() + 2000000;
    while (atomic_load(gone) == 0 && mono_us() < until)
        usleep(1000);
    usleep(50 * 1000);
    ck_assert_int_eq(atomic_load(gone), 1);
}

START_TEST(test_a_suspended_connection_whose_client_left_is_gone_once)
{
    int fds[2];
    tcp_pair(fds);
    conn_watch_entry_t *e;
    conn_watch_t *w = watch_fd(fds[0], 0, &e);
    atomic_int gone = 0;
    conn_watch_suspend(w, e);
    conn_watch_arm(w, e, count_gone, &gone);
    ck_assert_int_eq(write(fds[1], "next", 4), 4); /* a pipelined request is not a close */
    usleep(100 * 1000);
    ck_assert_int_eq(atomic_load(&gone), 0);
    close(fds[1]);
    expect_gone_once(&gone);
    conn_watch_resume(w, e);
    unwatch(w, e, fds[0]);
}
END_TEST

/* A connection whose body ended is polled no more for it: its socket can be armed for the
 * close of a suspended request (which needs the socket out of the watcher's set first). */
START_TEST(test_a_connection_whose_body_ended_can_be_armed_for_its_wait)
{
    int fds[2];
    tcp_pair(fds);
    conn_watch_entry_t *e;
    conn_watch_t *w = watch_fd(fds[0], 0, &e);
    conn_watch_body_begin(w, e);
    conn_watch_body_end(w, e);
    atomic_int gone = 0;
    conn_watch_suspend(w, e);
    conn_watch_arm(w, e, count_gone, &gone);
    close(fds[1]);
    expect_gone_once(&gone);
    conn_watch_resume(w, e);
    unwatch(w, e, fds[0]);
}
END_TEST

START_TEST(test_a_connection_past_its_deadline_is_shut_down)
{
    int fds[2];
    tcp_pair(fds);
    conn_watch_entry_t *e;
    conn_watch_t *w = watch_fd(fds[0], mono_us() + 100000, &e);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fds[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[8];
    ck_assert_int_eq(read(fds[1], buf, sizeof buf), 0); /* the server's end shut down */
    unwatch(w, e, fds[0]);
    close(fds[1]);
}
END_TEST

/* Whether the server's end of the pair was shut down: its client reads the end at once (a
 * socket left open has nothing to read within 100 ms). */
static bool shut_down(int client)
{
    struct timeval tv = {.tv_usec = 100 * 1000};
    setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[8];
    return read(client, buf, sizeof buf) == 0;
}

#define N_CONNS 4

START_TEST(test_past_the_share_the_oldest_connection_awaiting_its_head_is_closed)
{
    conn_watch_t *w;
    ck_assert_int_eq(conn_watch_new("test", &(conn_watch_limits_t){.awaiting_max = 2}, &w), 0);
    int fds[N_CONNS][2];
    conn_watch_entry_t *e[N_CONNS];
    for (int i = 0; i < N_CONNS; i++)
        tcp_pair(fds[i]);
    /* Two await their head; a third, while they are fresh, is let in all the same. */
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(conn_watch_add(w, fds[i][0], "10.0.0.1", 0, &e[i]), 0);
    for (int i = 0; i < 3; i++)
        ck_assert(!shut_down(fds[i][1]));
    /* Once they had time to send it, the oldest is closed to make room. */
    usleep(500 * 1000);
    ck_assert(shut_down(fds[0][1]));
    ck_assert(!shut_down(fds[1][1]));
    ck_assert(!shut_down(fds[2][1]));
    /* A head that arrived whole but is not read yet saves its connection: the next one goes. */
    ck_assert_int_eq(write(fds[1][1], "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27), 27);
    usleep(50 * 1000);
    ck_assert_int_eq(conn_watch_add(w, fds[3][0], "10.0.0.2", 0, &e[3]), 0);
    ck_assert(shut_down(fds[2][1]));
    ck_assert(!shut_down(fds[3][1]));
    for (int i = 0; i < N_CONNS; i++)
        conn_watch_remove(w, e[i]);
    conn_watch_free(w);
    for (int i = 0; i < N_CONNS; i++) {
        close(fds[i][0]);
        close(fds[i][1]);
    }
}
END_TEST

START_TEST(test_an_address_with_its_requests_in_flight_is_refused_more)
{
    conn_watch_t *w;
    ck_assert_int_eq(conn_watch_new("test", &(conn_watch_limits_t){.in_flight_per_addr = 2}, &w),
                     0);
    int fds[6][2];
    conn_watch_entry_t *e[6];
    for (int i = 0; i < 6; i++)
        tcp_pair(fds[i]);
    /* Connections that only wait for their head do not count: a third is let in. */
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(conn_watch_add(w, fds[i][0], "10.0.0.1", 0, &e[i]), 0);
    conn_watch_head_in(w, e[0], 0);
    conn_watch_head_in(w, e[1], 0);
    /* Two requests in flight: the address's next connection is refused, another's is not. */
    ck_assert_int_eq(conn_watch_add(w, fds[3][0], "10.0.0.1", 0, &e[3]), 0);
    ck_assert_int_eq(conn_watch_add(w, fds[4][0], "10.0.0.2", 0, &e[4]), 0);
    ck_assert(shut_down(fds[3][1]));
    ck_assert(!shut_down(fds[4][1]));
    ck_assert(!shut_down(fds[2][1]));
    /* One request answered: the address may connect again. */
    conn_watch_request_end(w, e[0], 0);
    ck_assert_int_eq(conn_watch_add(w, fds[5][0], "10.0.0.1", 0, &e[5]), 0);
    ck_assert(!shut_down(fds[5][1]));
    for (int i = 0; i < 6; i++) {
        conn_watch_remove(w, e[i]);
        close(fds[i][0]);
        close(fds[i][1]);
    }
    conn_watch_free(w);
}
END_TEST

/* The limit bounds requests, not only new connections: connections opened first and their
 * heads sent afterwards, or a kept-alive connection's next request, are refused past it. */
START_TEST(test_a_head_past_its_address_requests_in_flight_is_refused)
{
    conn_watch_t *w;
    ck_assert_int_eq(conn_watch_new("test", &(conn_watch_limits_t){.in_flight_per_addr = 2}, &w),
                     0);
    int fds[5][2];
    conn_watch_entry_t *e[5];
    for (int i = 0; i < 5; i++) {
        tcp_pair(fds[i]);
        ck_assert_int_eq(conn_watch_add(w, fds[i][0], i < 4 ? "10.0.0.1" : "10.0.0.2", 0, &e[i]),
                         0);
    }
    ck_assert_int_eq(conn_watch_head_in(w, e[0], 0), 0);
    ck_assert_int_eq(conn_watch_head_in(w, e[1], 0), 0);
    ck_assert_int_eq(conn_watch_head_in(w, e[2], 0), -EBUSY);
    ck_assert_int_eq(conn_watch_head_in(w, e[4], 0), 0); /* another address */
    /* The refused one was not counted: one answered request makes room for exactly one. */
    conn_watch_request_end(w, e[2], 0);
    conn_watch_request_end(w, e[0], 0);
    ck_assert_int_eq(conn_watch_head_in(w, e[3], 0), 0);
    ck_assert_int_eq(conn_watch_head_in(w, e[0], 0), -EBUSY); /* kept alive, its next request */
    conn_watch_request_end(w, e[1], 0);
    ck_assert_int_eq(conn_watch_head_in(w, e[0], 0), 0);
    for (int i = 0; i < 5; i++) {
        ck_assert(!shut_down(fds[i][1])); /* the caller answers, then closes */
        conn_watch_remove(w, e[i]);
        close(fds[i][0]);
        close(fds[i][1]);
    }
    conn_watch_free(w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api_conn_watch");
    TCase *tc = tcase_create("watch");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_a_streamed_body_whose_client_left_wakes_the_poller_again);
    tcase_add_test(tc, test_a_close_announced_before_the_poller_woke_is_announced_again);
    tcase_add_test(tc, test_a_suspended_connection_whose_client_left_is_gone_once);
    tcase_add_test(tc, test_a_connection_whose_body_ended_can_be_armed_for_its_wait);
    tcase_add_test(tc, test_a_connection_past_its_deadline_is_shut_down);
    tcase_add_test(tc, test_past_the_share_the_oldest_connection_awaiting_its_head_is_closed);
    tcase_add_test(tc, test_an_address_with_its_requests_in_flight_is_refused_more);
    tcase_add_test(tc, test_a_head_past_its_address_requests_in_flight_is_refused);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
