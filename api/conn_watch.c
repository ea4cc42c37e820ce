/* The watch over connections that libmicrohttpd does not keep: request deadlines, the peer's
 * close of a suspended connection, and which connections are let in (conn_watch.h). One
 * thread per watcher sleeps in epoll_wait on the armed sockets and wakes every
 * CONN_WATCH_TICK_MS to cut the connections past their deadline. Entries live in a slot array,
 * so that an epoll event names its entry by slot and arm serial and is ignored when the entry
 * changed since; those awaiting their request's head are also on a list, oldest first. */
#define _GNU_SOURCE
#include "conn_watch.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/util/id.h"
#include "daemon/util/log.h"
#include "daemon/util/queue.h"
#include "daemon/util/strmap.h"

#define CONN_WATCH_TICK_MS 250
#define CONN_WATCH_EVENTS 64
/* A connection awaiting its head is never closed to make room before it has had this long to
 * send it. */
#define CONN_WATCH_GRACE_US (200 * INT64_C(1000))
/* How many connections whose whole head waits unread in their socket (about to be served, so
 * passed over) one search for a connection to close looks past. */
#define CONN_WATCH_PASS_OVER 64
/* Why connections, or the requests of connections already in, are refused; one log line
 * counts both. */
#define REFUSED_WHY                                                                                \
    "(or the request whose headers they sent) from addresses with "                                \
    "server.max_connections_per_ip requests in flight"

typedef enum {
    ENTRY_ACTIVE,
    ENTRY_BODY,      /* its streamed body's socket polled for the peer's close */
    ENTRY_BODY_GONE, /* that close came: its reading side is shut down again each tick */
    ENTRY_SUSPENDED,
    ENTRY_ARMED,
    ENTRY_GONE
} entry_state_t;

/* One client address: its open connections, and those of them with a request in flight. */
typedef struct watch_addr {
    int open, in_flight;
    char key[];
} watch_addr_t;

struct conn_watch_entry {
    int fd;
    uint32_t slot;
    uint32_t serial; /* of the latest arm */
    int64_t deadline_us;
    entry_state_t state;
    conn_watch_gone_fn gone;
    void *ud;
    watch_addr_t *addr;  /* its client's address; NULL for none (a Unix socket) */
    bool awaiting;       /* on the watch's awaiting list: its request's head is not in */
    int64_t awaiting_us; /* since when */
    bool in_flight;      /* counted in addr->in_flight */
    bool closing;        /* shut down by the watch: libmicrohttpd is closing it */
    queue_t awaiting_node;
};

struct conn_watch {
    char name[16];
    pthread_mutex_t lock;
    pthread_t thread;
    int epfd, stopfd;
    conn_watch_entry_t **slots;
    uint32_t n_slots, cap_slots;
    uint32_t *free_slots;
    uint32_t n_free;
    uint32_t next_serial;
    conn_ratelimit_t cut_log;
    long cut_held; /* connections cut since the last line */
    conn_watch_limits_t limits;
    queue_t awaiting; /* entries awaiting their request's head, oldest first */
    uint32_t n_awaiting;
    strmap_t *addrs; /* client address -> watch_addr_t */
    conn_ratelimit_t evict_log, refuse_log;
    long evict_held, refuse_held;
};

bool conn_ratelimit_pass(conn_ratelimit_t *rl, int64_t now, long *ret_held)
{
    if (rl->last_us && now - rl->last_us < CONN_WATCH_LOG_INTERVAL_US) {
        rl->held++;
        return false;
    }
    *ret_held = rl->held;
    rl->held = 0;
    rl->last_us = now;
    return true;
}

/* Takes e off the awaiting list (if on it). Lock held. */
static void entry_stop_awaiting(conn_watch_t *w, conn_watch_entry_t *e)
{
    if (!e->awaiting) return;
    queue_remove(&e->awaiting_node);
    e->awaiting = false;
    w->n_awaiting--;
}

/* Shuts down e's socket, which makes libmicrohttpd see the end of its stream and close it; it
 * no longer counts as awaiting, and has no deadline. Lock held. */
static void entry_close(conn_watch_t *w, conn_watch_entry_t *e)
{
    entry_stop_awaiting(w, e);
    e->deadline_us = 0;
    e->closing = true;
    shutdown(e->fd, SHUT_RDWR);
}

/* Counts n more connections closed or refused for one reason in *held and, at most once per
 * CONN_WATCH_LOG_INTERVAL_US (rl), says how many there were since its last line. Lock held. */
static void watch_log(conn_watch_t *w, conn_ratelimit_t *rl, long *held, long n, const char *verb,
                      const char *why)
{
    *held += n;
    long lines_held;
    if (!conn_ratelimit_pass(rl, mono_us(), &lines_held)) return;
    log_warn("http (%s): %s %ld connection(s) %s", w->name, verb, *held, why);
    *held = 0;
}

/* Shuts down the connections past their deadline. Lock held. */
static void watch_cut_expired(conn_watch_t *w)
{
    int64_t now = mono_us();
    long cut = 0;
    for (uint32_t i = 0; i < w->n_slots; i++) {
        conn_watch_entry_t *e = w->slots[i];
        if (!e || !e->deadline_us || e->deadline_us > now) continue;
        entry_close(w, e);
        cut++;
    }
    if (cut)
        watch_log(w, &w->cut_log, &w->cut_held, cut, "closed",
                  "whose request did not arrive in time (server.header_timeout_s, "
                  "server.body_timeout_s)");
}

/* Whether e's socket holds a whole request head that libmicrohttpd has not read yet: that
 * client has sent what it owes, and is not the one to close. */
static bool head_waits_unread(const conn_watch_entry_t *e)
{
    char buf[4096];
    ssize_t n = recv(e->fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 && (memmem(buf, (size_t)n, "\r\n\r\n", 4) || memmem(buf, (size_t)n, "\n\n", 2));
}

/* Makes room while more connections await their head than limits.awaiting_max: closes the
 * oldest of them that has had CONN_WATCH_GRACE_US to send it and whose whole head does not
 * wait unread in its socket. None may qualify (a burst of new connections): libmicrohttpd's own
 * limit bounds them meanwhile, and the watch's next tick looks again. Lock held. */
static void watch_make_room(conn_watch_t *w, int64_t now)
{
    if (!w->limits.awaiting_max) return;
    long closed = 0;
    int passed_over = 0;
    queue_t *q = queue_head(&w->awaiting);
    while (q && w->n_awaiting > w->limits.awaiting_max && passed_over < CONN_WATCH_PASS_OVER) {
        conn_watch_entry_t *e = queue_data(q, conn_watch_entry_t, awaiting_node);
        if (now - e->awaiting_us < CONN_WATCH_GRACE_US) break; /* and so are those after it */
        q = queue_next(&w->awaiting, q);
        if (head_waits_unread(e)) {
            passed_over++;
            continue;
        }
        entry_close(w, e);
        closed++;
    }
    if (closed)
        watch_log(w, &w->evict_log, &w->evict_held, closed, "closed",
                  "still waiting for their request's headers, the oldest, to let new ones in "
                  "(half of server.max_connections is kept for requests whose headers are in)");
}

/* Puts e at the end of the awaiting list, and makes room if it is one too many. Lock held. */
static void entry_await(conn_watch_t *w, conn_watch_entry_t *e)
{
    int64_t now = mono_us();
    queue_insert_tail(&w->awaiting, &e->awaiting_node);
    e->awaiting = true;
    e->awaiting_us = now;
    w->n_awaiting++;
    watch_make_room(w, now);
}

/* Whether e's socket is in the watcher's epoll set. */
static bool entry_polled(const conn_watch_entry_t *e)
{
    return e->state == ENTRY_ARMED || e->state == ENTRY_BODY;
}

/* A polled connection's peer has closed: an armed one's gone callback runs, once; a streamed
 * body's socket stops reading, which wakes libmicrohttpd to read the rest and the end. Lock
 * held. */
static void watch_peer_closed(conn_watch_t *w, uint64_t key)
{
    uint32_t slot = (uint32_t)(key >> 32), serial = (uint32_t)key;
    conn_watch_entry_t *e = slot < w->n_slots ? w->slots[slot] : NULL;
    if (!e || e->serial != serial || !entry_polled(e)) return;
    epoll_ctl(w->epfd, EPOLL_CTL_DEL, e->fd, NULL);
    if (e->state == ENTRY_BODY) {
        e->state = ENTRY_BODY_GONE;
        shutdown(e->fd, SHUT_RD);
        return;
    }
    e->state = ENTRY_GONE;
    e->gone(e->ud);
}

/* Polls e's socket for its peer's close only (EPOLLRDHUP: bytes that arrive are
 * libmicrohttpd's to read), under a new serial; true when it is polled. Lock held. */
static bool watch_poll_close(conn_watch_t *w, conn_watch_entry_t *e)
{
    e->serial = ++w->next_serial;
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT,
                             .data.u64 = (uint64_t)e->slot << 32 | e->serial};
    return epoll_ctl(w->epfd, EPOLL_CTL_ADD, e->fd, &ev) == 0;
}

/* Wakes libmicrohttpd again for each streamed body whose client has gone, until it closes the
 * connection (which removes the entry). A shutdown wakes every poller of the socket, but one
 * made before libmicrohttpd collected the wake-up of the bytes and the close is merged into
 * that one, which its short read then spends as before. Lock held. */
static void watch_kick_gone_bodies(conn_watch_t *w)
{
    for (uint32_t i = 0; i < w->n_slots; i++)
        if (w->slots[i] && w->slots[i]->state == ENTRY_BODY_GONE)
            shutdown(w->slots[i]->fd, SHUT_RD);
}

static void *watch_thread(void *arg)
{
    conn_watch_t *w = arg;
    struct epoll_event events[CONN_WATCH_EVENTS];
    for (;;) {
        int n = epoll_wait(w->epfd, events, CONN_WATCH_EVENTS, CONN_WATCH_TICK_MS);
        pthread_mutex_lock(&w->lock);
        bool stop = false;
        for (int i = 0; i < n; i++) {
            if (events[i].data.u64 == UINT64_MAX)
                stop = true;
            else
                watch_peer_closed(w, events[i].data.u64);
        }
        watch_cut_expired(w);
        watch_make_room(w, mono_us());
        watch_kick_gone_bodies(w);
        pthread_mutex_unlock(&w->lock);
        if (stop) return NULL;
    }
}

int conn_watch_new(const char *name, const conn_watch_limits_t *limits, conn_watch_t **ret)
{
    conn_watch_t *w = calloc(1, sizeof *w);
    if (!w) return -ENOMEM;
    if (strmap_new(&w->addrs) < 0) {
        free(w);
        return -ENOMEM;
    }
    snprintf(w->name, sizeof w->name, "%s", name);
    w->limits = *limits;
    queue_init(&w->awaiting);
    pthread_mutex_init(&w->lock, NULL);
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    w->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    int r = w->epfd < 0 || w->stopfd < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->stopfd, &ev) < 0
                ? -errno
                : -pthread_create(&w->thread, NULL, watch_thread, w);
    if (r < 0) {
        if (w->epfd >= 0) close(w->epfd);
        if (w->stopfd >= 0) close(w->stopfd);
        pthread_mutex_destroy(&w->lock);
        strmap_free(w->addrs);
        free(w);
        return log_error_errno(r, "Failed to start the connection watch: %s", strerror(-r));
    }
    *ret = w;
    return 0;
}

void conn_watch_free(conn_watch_t *w)
{
    if (!w) return;
    uint64_t one = 1;
    if (write(w->stopfd, &one, sizeof one) != sizeof one)
        log_error("Failed to stop the connection watch: %s", strerror(errno));
    else
        pthread_join(w->thread, NULL);
    close(w->epfd);
    close(w->stopfd);
    for (uint32_t i = 0; i < w->n_slots; i++)
        free(w->slots[i]);
    free(w->slots);
    free(w->free_slots);
    strmap_free(w->addrs);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

/* A free slot for a new entry; UINT32_MAX when out of memory. Lock held. */
static uint32_t watch_slot_take(conn_watch_t *w)
{
    if (w->n_free) return w->free_slots[--w->n_free];
    if (w->n_slots == w->cap_slots) {
        uint32_t cap = w->cap_slots ? w->cap_slots * 2 : 64;
        conn_watch_entry_t **slots = realloc(w->slots, cap * sizeof *slots);
        if (slots) w->slots = slots;
        uint32_t *free_slots = realloc(w->free_slots, cap * sizeof *free_slots);
        if (free_slots) w->free_slots = free_slots;
        if (!slots || !free_slots) return UINT32_MAX;
        w->cap_slots = cap;
    }
    return w->n_slots++;
}

/* The record of the client address key, made on its first connection; NULL when out of
 * memory. Lock held. */
static watch_addr_t *watch_addr_take(conn_watch_t *w, const char *key)
{
    watch_addr_t *a = strmap_get(w->addrs, key);
    if (a) return a;
    size_t len = strlen(key);
    a = calloc(1, sizeof *a + len + 1);
    if (!a) return NULL;
    memcpy(a->key, key, len + 1);
    if (strmap_put(w->addrs, a->key, a) < 0) {
        free(a);
        return NULL;
    }
    return a;
}

int conn_watch_add(conn_watch_t *w, int fd, const char *addr, int64_t deadline_us,
                   conn_watch_entry_t **ret)
{
    conn_watch_entry_t *e = calloc(1, sizeof *e);
    if (!e) return -ENOMEM;
    e->fd = fd;
    e->deadline_us = deadline_us;
    queue_init(&e->awaiting_node);
    pthread_mutex_lock(&w->lock);
    e->slot = watch_slot_take(w);
    if (e->slot != UINT32_MAX && addr && !(e->addr = watch_addr_take(w, addr))) {
        w->free_slots[w->n_free++] = e->slot;
        e->slot = UINT32_MAX;
    }
    if (e->slot != UINT32_MAX) {
        w->slots[e->slot] = e;
        if (e->addr) e->addr->open++;
        int most = w->limits.in_flight_per_addr;
        if (e->addr && most && e->addr->in_flight >= most) {
            entry_close(w, e);
            watch_log(w, &w->refuse_log, &w->refuse_held, 1, "refused", REFUSED_WHY);
        } else {
            entry_await(w, e);
        }
    }
    pthread_mutex_unlock(&w->lock);
    if (e->slot == UINT32_MAX) {
        free(e);
        return -ENOMEM;
    }
    *ret = e;
    return 0;
}

void conn_watch_remove(conn_watch_t *w, conn_watch_entry_t *e)
{
    if (!e) return;
    pthread_mutex_lock(&w->lock);
    if (entry_polled(e)) epoll_ctl(w->epfd, EPOLL_CTL_DEL, e->fd, NULL);
    entry_stop_awaiting(w, e);
    if (e->addr) {
        e->addr->in_flight -= e->in_flight;
        if (--e->addr->open == 0) free(strmap_remove(w->addrs, e->addr->key));
    }
    w->slots[e->slot] = NULL;
    w->free_slots[w->n_free++] = e->slot;
    pthread_mutex_unlock(&w->lock);
    free(e);
}

void conn_watch_set_deadline(conn_watch_t *w, conn_watch_entry_t *e, int64_t deadline_us)
{
    if (!e) return;
    pthread_mutex_lock(&w->lock);
    e->deadline_us = deadline_us;
    pthread_mutex_unlock(&w->lock);
}

int conn_watch_head_in(conn_watch_t *w, conn_watch_entry_t *e, int64_t deadline_us)
{
    if (!e) return 0;
    int r = 0;
    pthread_mutex_lock(&w->lock);
    entry_stop_awaiting(w, e);
    if (!e->closing) e->deadline_us = deadline_us;
    int most = w->limits.in_flight_per_addr;
    if (e->addr && !e->in_flight && most && e->addr->in_flight >= most) {
        r = -EBUSY;
        watch_log(w, &w->refuse_log, &w->refuse_held, 1, "refused", REFUSED_WHY);
    } else {
        if (e->addr && !e->in_flight) e->addr->in_flight++;
        e->in_flight = true;
    }
    pthread_mutex_unlock(&w->lock);
    return r;
}

void conn_watch_request_end(conn_watch_t *w, conn_watch_entry_t *e, int64_t deadline_us)
{
    if (!e) return;
    pthread_mutex_lock(&w->lock);
    if (e->addr && e->in_flight) e->addr->in_flight--;
    e->in_flight = false;
    if (!e->closing) {
        e->deadline_us = deadline_us;
        if (!e->awaiting) entry_await(w, e);
    }
    pthread_mutex_unlock(&w->lock);
}

void conn_watch_body_begin(conn_watch_t *w, conn_watch_entry_t *e)
{
    if (!e) return;
    pthread_mutex_lock(&w->lock);
    if (e->state == ENTRY_ACTIVE && watch_poll_close(w, e)) e->state = ENTRY_BODY;
    pthread_mutex_unlock(&w->lock);
}

void conn_watch_body_end(conn_watch_t *w, conn_watch_entry_t *e)
{
    if (!e) return;
    pthread_mutex_lock(&w->lock);
    if (e->state == ENTRY_BODY) epoll_ctl(w->epfd, EPOLL_CTL_DEL, e->fd, NULL);
    if (e->state == ENTRY_BODY || e->state == ENTRY_BODY_GONE) e->state = ENTRY_ACTIVE;
    pthread_mutex_unlock(&w->lock);
}

void conn_watch_suspend(conn_watch_t *w, conn_watch_entry_t *e)
{
    if (!e) return;
    pthread_mutex_lock(&w->lock);
    e->state = ENTRY_SUSPENDED;
    pthread_mutex_unlock(&w->lock);
}

void conn_watch_arm(conn_watch_t *w, conn_watch_entry_t *e, conn_watch_gone_fn gone, void *ud)
{
    if (!e) return;
    pthread_mutex_lock(&w->lock);
    if (e->state == ENTRY_SUSPENDED) {
        e->gone = gone;
        e->ud = ud;
        /* Bytes a client sends ahead (a pipelined request) are libmicrohttpd's to read once
         * the connection resumes. */
        if (watch_poll_close(w, e)) e->state = ENTRY_ARMED;
    }
    pthread_mutex_unlock(&w->lock);
}

void conn_watch_resume(conn_watch_t *w, conn_watch_entry_t *e)
{
    if (!e) return;
    pthread_mutex_lock(&w->lock);
    if (e->state == ENTRY_ARMED) epoll_ctl(w->epfd, EPOLL_CTL_DEL, e->fd, NULL);
    e->state = ENTRY_ACTIVE;
    pthread_mutex_unlock(&w->lock);
}
