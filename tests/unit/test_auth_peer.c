/* daemon/auth/auth_peer.c: the account behind a connection, asked of the kernel, on real
 * sockets. A loopback TCP client (IPv4, another 127/8 address, IPv6, IPv4 mapped into an IPv6
 * listener) is its socket's owner, another uid's client included (as root: a child drops to
 * nobody), and an unprivileged process can ask; a client that closed its socket, and a peer
 * beyond loopback, are never given an owner; a Unix socket's peer is its SO_PEERCRED uid. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/auth/auth.h"
#include "support/run_suite.h"

/* A listening TCP socket on addr (IPv4 or IPv6 text) and a free port, IPv6 sockets dual-stack;
 * -1 when the host cannot bind that address (no IPv6). */
static int listen_on(const char *addr, struct sockaddr_storage *ret_addr, socklen_t *ret_len)
{
    struct sockaddr_storage ss = {0};
    socklen_t len;
    int family;
    if (strchr(addr, ':')) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        in6->sin6_family = AF_INET6;
        ck_assert_int_eq(inet_pton(AF_INET6, addr, &in6->sin6_addr), 1);
        family = AF_INET6;
        len = sizeof *in6;
    } else {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        in->sin_family = AF_INET;
        ck_assert_int_eq(inet_pton(AF_INET, addr, &in->sin_addr), 1);
        family = AF_INET;
        len = sizeof *in;
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    int off = 0;
    if (family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 8) < 0) {
        close(fd);
        return -1;
    }
    *ret_len = sizeof *ret_addr;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)ret_addr, ret_len), 0);
    return fd;
}

/* A client socket connected to the listener at to (a copy of its address, whose family and
 * host are replaced by connect_to when given), bound first to from when given. */
static int connect_to(const struct sockaddr_storage *to, const char *connect_addr, const char *from)
{
    struct sockaddr_storage dst = *to;
    socklen_t len =
        dst.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (connect_addr && !strchr(connect_addr, ':')) {
        /* An IPv4 client of a dual-stack listener. */
        uint16_t port = ((struct sockaddr_in6 *)to)->sin6_port;
        struct sockaddr_in *in = (struct sockaddr_in *)&dst;
        memset(&dst, 0, sizeof dst);
        in->sin_family = AF_INET;
        in->sin_port = port;
        ck_assert_int_eq(inet_pton(AF_INET, connect_addr, &in->sin_addr), 1);
        len = sizeof *in;
    }
    int fd = socket(dst.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    if (from) {
        struct sockaddr_in src = {.sin_family = AF_INET};
        ck_assert_int_eq(inet_pton(AF_INET, from, &src.sin_addr), 1);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&src, sizeof src), 0);
    }
    ck_assert_msg(connect(fd, (struct sockaddr *)&dst, len) == 0, "connect: %s", strerror(errno));
    return fd;
}

static int accept_one(int listener)
{
    int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    return fd;
}

/* Connects a client as from_addr to a listener on listen_addr and asks who the accepted
 * connection's peer is: the answer (0 or a negative errno), and the uid in *ret_uid. -2 when
 * the host has no such address. */
static int owner_of(const char *listen_addr, const char *connect_addr, const char *from,
                    uid_t *ret_uid)
{
    struct sockaddr_storage addr;
    socklen_t len;
    int l = listen_on(listen_addr, &addr, &len);
    if (l < 0) return -2;
    int c = connect_to(&addr, connect_addr, from);
    int s = accept_one(l);
    int r = auth_peer_uid(s, ret_uid);
    close(s);
    close(c);
    close(l);
    return r;
}

START_TEST(test_loopback_tcp_client_is_its_sockets_owner)
{
    uid_t uid = (uid_t)-1;
    ck_assert_int_eq(owner_of("127.0.0.1", NULL, NULL, &uid), 0);
    ck_assert_uint_eq(uid, getuid());
    /* Any address of 127/8 is loopback. */
    uid = (uid_t)-1;
    ck_assert_int_eq(owner_of("127.0.0.1", NULL, "127.0.0.2", &uid), 0);
    ck_assert_uint_eq(uid, getuid());
}
END_TEST

START_TEST(test_ipv6_and_mapped_ipv4_clients_are_their_sockets_owners)
{
    uid_t uid = (uid_t)-1;
    int r = owner_of("::1", NULL, NULL, &uid);
    if (r == -2) {
        fprintf(stderr, "no IPv6 loopback here: the IPv6 cases are skipped\n");
        return;
    }
    ck_assert_int_eq(r, 0);
    ck_assert_uint_eq(uid, getuid());
    /* An IPv4 client of a dual-stack listener: its address arrives as ::ffff:127.0.0.1. */
    uid = (uid_t)-1;
    r = owner_of("::", "127.0.0.1", NULL, &uid);
    if (r == -2) return;
    ck_assert_int_eq(r, 0);
    ck_assert_uint_eq(uid, getuid());
}
END_TEST

START_TEST(test_unix_socket_peer_is_its_peercred_uid)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    uid_t uid = (uid_t)-1;
    ck_assert_int_eq(auth_peer_uid(sv[0], &uid), 0);
    ck_assert_uint_eq(uid, getuid());
    close(sv[0]);
    close(sv[1]);
}
END_TEST

/* Drops the calling process to nobody; false when it cannot (not root, or no nobody). */
static bool become_nobody(uid_t *ret_uid)
{
    struct passwd *pw = getpwnam("nobody");
    if (!pw || geteuid() != 0) return false;
    *ret_uid = pw->pw_uid;
    return setgroups(0, NULL) == 0 && setgid(pw->pw_gid) == 0 && setuid(pw->pw_uid) == 0;
}

START_TEST(test_another_accounts_client_is_that_account)
{
    struct passwd *pw = getpwnam("nobody");
    if (geteuid() != 0 || !pw) {
        fprintf(stderr, "not root (or no user nobody): the other-account case is skipped\n");
        return;
    }
    struct sockaddr_storage addr;
    socklen_t len;
    int l = listen_on("127.0.0.1", &addr, &len);
    ck_assert_int_ge(l, 0);
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* nobody's client, held open until the parent has asked. */
        uid_t nobody;
        if (!become_nobody(&nobody)) _exit(2);
        int c = connect_to(&addr, NULL, NULL);
        char b = 0;
        (void)!write(ready[1], &b, 1);
        (void)!read(c, &b, 1);
        _exit(0);
    }
    close(ready[1]);
    char b;
    ck_assert_int_eq(read(ready[0], &b, 1), 1);
    int s = accept_one(l);
    uid_t uid = (uid_t)-1;
    ck_assert_int_eq(auth_peer_uid(s, &uid), 0);
    ck_assert_uint_eq(uid, pw->pw_uid);

    /* The daemon runs unprivileged: nobody asking about root's client gets root. */
    int c = connect_to(&addr, NULL, NULL);
    int s2 = accept_one(l);
    pid_t asker = fork();
    ck_assert_int_ge(asker, 0);
    if (asker == 0) {
        uid_t nobody, got = (uid_t)-1;
        if (!become_nobody(&nobody)) _exit(2);
        _exit(auth_peer_uid(s2, &got) == 0 && got == 0 ? 0 : 3);
    }
    int ws = 0;
    ck_assert_int_eq(waitpid(asker, &ws, 0), asker);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "an unprivileged asker: exit %d",
                  WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    close(s);
    close(s2);
    close(c);
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    close(ready[0]);
    close(l);
}
END_TEST

START_TEST(test_closed_client_has_no_owner)
{
    struct sockaddr_storage addr;
    socklen_t len;
    int l = listen_on("127.0.0.1", &addr, &len);
    ck_assert_int_ge(l, 0);
    int c = connect_to(&addr, NULL, NULL);
    int s = accept_one(l);
    /* The client's socket is closed: its end lingers in FIN_WAIT2 or TIME_WAIT, which the
     * kernel reports with uid 0. Nobody owns it any more, so nobody is named. */
    close(c);
    char b;
    struct pollfd p = {.fd = s, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 5000), 1);
    ck_assert_int_eq(read(s, &b, 1), 0);
    uid_t uid = (uid_t)-1;
    int r = auth_peer_uid(s, &uid);
    ck_assert_msg(r == -ENOENT, "a closed client: %d (uid %u)", r, (unsigned)uid);
    ck_assert_uint_eq(uid, (uid_t)-1);
    close(s);
    close(l);
}
END_TEST

START_TEST(test_peer_beyond_loopback_is_remote)
{
    /* This host's first non-loopback IPv4 address, as a client of itself: local, but not on
     * loopback, so only a token could say who it is. */
    struct ifaddrs *ifs = NULL, *i;
    char host[INET_ADDRSTRLEN] = "";
    ck_assert_int_eq(getifaddrs(&ifs), 0);
    for (i = ifs; i && !host[0]; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, host, sizeof host);
    }
    freeifaddrs(ifs);
    if (!host[0]) {
        fprintf(stderr, "no address beyond loopback here: the remote case is skipped\n");
        return;
    }
    uid_t uid = (uid_t)-1;
    int r = owner_of(host, NULL, NULL, &uid);
    if (r == -2) return;
    ck_assert_int_eq(r, -EREMOTE);
    ck_assert_uint_eq(uid, (uid_t)-1);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("auth_peer");
    TCase *tc = tcase_create("peer");
    tcase_add_test(tc, test_loopback_tcp_client_is_its_sockets_owner);
    tcase_add_test(tc, test_ipv6_and_mapped_ipv4_clients_are_their_sockets_owners);
    tcase_add_test(tc, test_unix_socket_peer_is_its_peercred_uid);
    tcase_add_test(tc, test_another_accounts_client_is_that_account);
    tcase_add_test(tc, test_closed_client_has_no_owner);
    tcase_add_test(tc, test_peer_beyond_loopback_is_remote);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
