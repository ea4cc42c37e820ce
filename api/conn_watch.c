/* The watch over connections that libmicrohttpd does not keep: request deadlines, and the
 * peer's close of a suspended connection (conn_watch.h). One thread per watcher sleeps in
 * epoll_wait on the armed sockets and wakes every CONN_WATCH_TICK_MS to cut the connections
 * past their deadline. Entries live in a slot array, so that an epoll event names its entry
 * by slot and arm serial and is ignored when the entry changed since. */
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

#define CONN_WATCH_TICK_MS 250
#define CONN_WATCH_EVENTS 64

typedef enum {
    ENTRY_ACTIVE,
    ENTRY_BODY,      /* its streamed body's socket polled for the peer's close */
    ENTRY_BODY_GONE, /* that close came: its reading side is shut down again each tick */
    ENTRY_SUSPENDED,
    ENTRY_ARMED,
    ENTRY_GONE
} entry_state_t;

struct conn_watch_entry {
    int fd;
    uint32_t slot;
    uint32_t serial; /* of the latest arm */
    int64_t deadline_us;
    entry_state_t state;
    conn_watch_gone_fn gone;
    void *ud;
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

/* Shuts down the connections past their deadline. Lock held. */
static void watch_cut_expired(conn_watch_t *w)
{
    int64_t now = mono_us();
    long cut = 0;
    for (uint32_t i = 0; i < w->n_slots; i++) {
        conn_watch_entry_t *e = w->slots[i];
        if (!e || !e->deadline_us || e->deadline_us > now) continue;
        e->deadline_us = 0;
        shutdown(e->fd, SHUT_RDWR);
        cut++;
    }
    if (!cut) return;
    w->cut_held += cut;
    long held;
    if (!conn_ratelimit_pass(&w->cut_log, now, &held)) return;
    log_warn("http (%s): closed %ld connection(s) whose request did not arrive in time "
             "(server.header_timeout_s, server.body_timeout_s)",
             w->name, w->cut_held);
    w->cut_held = 0;
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
        watch_kick_gone_bodies(w);
        pthread_mutex_unlock(&w->lock);
        if (stop) return NULL;
    }
}

int conn_watch_new(const char *name, conn_watch_t **ret)
{
    conn_watch_t *w = calloc(1, sizeof *w);
    if (!w) return -ENOMEM;
    snprintf(w->name, sizeof w->name, "%s", name);
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

int conn_watch_add(conn_watch_t *w, int fd, int64_t deadline_us, conn_watch_entry_t **ret)
{
    conn_watch_entry_t *e = calloc(1, sizeof *e);
    if (!e) return -ENOMEM;
    e->fd = fd;
    e->deadline_us = deadline_us;
    pthread_mutex_lock(&w->lock);
    e->slot = watch_slot_take(w);
    if (e->slot != UINT32_MAX) w->slots[e->slot] = e;
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
