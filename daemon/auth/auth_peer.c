/* The local account behind a connected socket, asked of the kernel.
 *
 * A Unix socket's peer is its SO_PEERCRED uid. A TCP connection over loopback (127.0.0.0/8,
 * ::1, or an IPv4 loopback address mapped into IPv6) has its other end on this host, in a
 * socket the kernel knows: NETLINK_SOCK_DIAG's exact lookup (SOCK_DIAG_BY_FAMILY with an
 * inet_diag_req_v2 naming the 4-tuple, the peer's address and port as the source and ours as
 * the destination) finds it and gives its owner, idiag_uid: the uid that made the socket. Any
 * process may ask, without privileges, as `ss -e` does.
 *
 * The answer is taken only when it is the client's own socket, still open: the reply must name
 * exactly the 4-tuple asked for, in a connected state. A listener that the lookup falls back on,
 * or a TIME_WAIT entry (the kernel reports uid 0 for those, and inode 0), would otherwise name
 * someone else. */
#define _GNU_SOURCE /* struct ucred */
#include "auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* How long the kernel may take to answer; it answers at once, so this only bounds a bug. */
#define PEER_DIAG_TIMEOUT_US 200000

/* An address reduced to what identifies a TCP endpoint: its family (AF_INET for an IPv4
 * address, mapped into IPv6 or not), 4 or 16 address bytes and its port in network order. */
typedef struct endpoint {
    int family;
    uint8_t addr[16];
    uint16_t port;
} endpoint_t;

static const uint8_t v4_mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

/* Fills e from family and a 4- or 16-byte address; a v4-mapped IPv6 address becomes IPv4. */
static void endpoint_set(endpoint_t *e, int family, const void *addr, uint16_t port)
{
    memset(e, 0, sizeof *e);
    e->port = port;
    if (family == AF_INET6 && memcmp(addr, v4_mapped_prefix, 12) == 0) {
        e->family = AF_INET;
        memcpy(e->addr, (const uint8_t *)addr + 12, 4);
    } else {
        e->family = family;
        memcpy(e->addr, addr, family == AF_INET ? 4 : 16);
    }
}

static int endpoint_from_sockaddr(const struct sockaddr_storage *ss, endpoint_t *ret)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        endpoint_set(ret, AF_INET, &in->sin_addr, in->sin_port);
        return 0;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        endpoint_set(ret, AF_INET6, &in6->sin6_addr, in6->sin6_port);
        return 0;
    }
    return -EAFNOSUPPORT;
}

static bool endpoint_is_loopback(const endpoint_t *e)
{
    static const uint8_t loopback6[16] = {[15] = 1};
    return e->family == AF_INET ? e->addr[0] == 127 : memcmp(e->addr, loopback6, 16) == 0;
}

static bool endpoint_equal(const endpoint_t *a, const endpoint_t *b)
{
    return a->family == b->family && a->port == b->port && memcmp(a->addr, b->addr, 16) == 0;
}

/* Copies e's address into an inet_diag address (4 words, network order). */
static void diag_addr(const endpoint_t *e, __be32 ret[4])
{
    memset(ret, 0, 4 * sizeof ret[0]);
    memcpy(ret, e->addr, e->family == AF_INET ? 4 : 16);
}

/* Whether the kernel's record is the connected socket whose local end is peer and whose
 * remote end is local, still held open by a process. */
static bool diag_reply_matches(const struct inet_diag_msg *m, const endpoint_t *peer,
                               const endpoint_t *local)
{
    int family = m->idiag_family;
    if (family != AF_INET && family != AF_INET6) return false;
    endpoint_t src, dst;
    endpoint_set(&src, family, m->id.idiag_src, m->id.idiag_sport);
    endpoint_set(&dst, family, m->id.idiag_dst, m->id.idiag_dport);
    if (!endpoint_equal(&src, peer) || !endpoint_equal(&dst, local)) return false;
    switch (m->idiag_state) {
    case TCP_ESTABLISHED:
    case TCP_FIN_WAIT1:
    case TCP_FIN_WAIT2:
    case TCP_CLOSE_WAIT:
    case TCP_CLOSING:
    case TCP_LAST_ACK:
        /* A TIME_WAIT or orphaned FIN_WAIT2 entry reports inode 0 (and uid 0): no socket of
         * any process is left to own it. */
        return m->idiag_inode != 0;
    default:
        return false;
    }
}

/* Asks the kernel for the TCP socket at peer connected to local: 0 and its owner, -ENOENT when
 * there is none (or none that is still an open, connected socket), or a negative errno when
 * the kernel could not be asked. */
static int diag_lookup_uid(const endpoint_t *peer, const endpoint_t *local, uid_t *ret_uid)
{
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0) return -errno;
    struct timeval tv = {.tv_sec = 0, .tv_usec = PEER_DIAG_TIMEOUT_US};
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 req;
    } msg = {
        .nlh = {.nlmsg_len = sizeof msg,
                .nlmsg_type = SOCK_DIAG_BY_FAMILY,
                .nlmsg_flags = NLM_F_REQUEST,
                .nlmsg_seq = 1},
        .req = {.sdiag_family = (uint8_t)peer->family,
                .sdiag_protocol = IPPROTO_TCP,
                .idiag_states = ~0u,
                .id = {.idiag_sport = peer->port,
                       .idiag_dport = local->port,
                       .idiag_cookie = {INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE}}},
    };
    diag_addr(peer, msg.req.id.idiag_src);
    diag_addr(local, msg.req.id.idiag_dst);
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    int r = 0;
    if (sendto(fd, &msg, sizeof msg, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0) r = -errno;

    /* One answer: the socket's record, or an error message (ENOENT when there is none). */
    union {
        struct nlmsghdr nlh;
        char bytes[8192];
    } buf;
    ssize_t n = r < 0 ? 0 : recv(fd, &buf, sizeof buf, 0);
    if (r == 0 && n < 0) r = errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
    close(fd);
    if (r < 0) return r;
    r = -ENOENT;
    for (struct nlmsghdr *h = &buf.nlh; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_ERROR) {
            const struct nlmsgerr *e = NLMSG_DATA(h);
            if (h->nlmsg_len >= NLMSG_LENGTH(sizeof *e) && e->error < 0) return e->error;
            continue;
        }
        if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
            h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
            continue;
        const struct inet_diag_msg *m = NLMSG_DATA(h);
        if (!diag_reply_matches(m, peer, local)) continue;
        *ret_uid = (uid_t)m->idiag_uid;
        return 0;
    }
    return r;
}

/* The uid of a TCP connection's peer on this host; see auth_peer_uid. */
static int tcp_peer_uid(int fd, uid_t *ret_uid)
{
    struct sockaddr_storage peer_ss, local_ss;
    socklen_t peer_len = sizeof peer_ss, local_len = sizeof local_ss;
    if (getpeername(fd, (struct sockaddr *)&peer_ss, &peer_len) < 0 ||
        getsockname(fd, (struct sockaddr *)&local_ss, &local_len) < 0)
        return -errno;
    endpoint_t peer, local;
    int r = endpoint_from_sockaddr(&peer_ss, &peer);
    if (r == 0) r = endpoint_from_sockaddr(&local_ss, &local);
    if (r < 0) return r;
    if (!endpoint_is_loopback(&peer) || peer.family != local.family) return -EREMOTE;
    return diag_lookup_uid(&peer, &local, ret_uid);
}

int auth_peer_uid(int fd, uid_t *ret_uid)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) return -errno;
    if (ss.ss_family == AF_UNIX) {
        struct ucred cred;
        socklen_t cred_len = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) < 0) return -errno;
        *ret_uid = cred.uid;
        return 0;
    }
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return -EAFNOSUPPORT;
    uid_t uid;
    int r = tcp_peer_uid(fd, &uid);
    if (r < 0) return r;
    *ret_uid = uid;
    return 0;
}
