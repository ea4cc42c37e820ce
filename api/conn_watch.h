/* Private to api/: the watch over open HTTP connections that libmicrohttpd does not keep
 * itself. It knows sockets, not HTTP: http_server.c registers each connection's socket and
 * says when its request's head is in and when the request ends. One watcher per listener.
 *
 * Which connections are let in. A connection awaits its request's head from its start, and
 * again between the requests of a kept-alive connection; it stops once the head is in. Those
 * awaiting may be at most limits.awaiting_max: past it the oldest of them is shut down, so
 * that a new connection gets in, and the rest of the listener's connections stay for requests
 * whose heads are in. Thousands of clients that trickle their heads a byte at a time
 * (slowloris) then take turns in their share and close each other, instead of locking every
 * client out. A connection is not closed so before it has had 200 ms to send its head, nor
 * while its whole head waits unread in its socket: a burst of new connections may exceed the
 * share for that long (libmicrohttpd's own limit still bounds them), and the watch's tick makes
 * room once they are old enough. A new
 * connection from an address that already has limits.in_flight_per_addr requests in flight is
 * refused (shut down at once), and so is a request whose head comes in while its address has
 * that many (conn_watch_head_in says so; the caller answers it), whether its connection is new
 * or kept alive: the requests of one client, not its idle or trickling connections, are what
 * that limit bounds, so clients that share an address (loopback, a NAT) are not locked out by
 * another's open sockets, and connections opened first cannot carry more requests later.
 *
 * Three more things are watched, by one thread per watcher:
 *  - Deadlines. A connection whose request has not fully arrived by its deadline (a slow
 *    client trickling its headers or body) is shut down, which makes libmicrohttpd see the end
 *    of its stream and close it. MHD's own timeout restarts on every byte, so it cannot bound
 *    such a client.
 *  - Suspended connections. libmicrohttpd does not poll a suspended connection, so it would
 *    not notice that the client went away while its request waits for the scheduler. An armed
 *    connection is polled for the peer's close; when it comes, the `gone` callback runs once
 *    (on the watcher's thread, with the watcher's lock held: it must only post, never wait).
 *  - Streamed bodies. libmicrohttpd polls its sockets edge-triggered and takes a short read as
 *    "nothing more to read", so a client that sends its last bytes and closes at once can leave
 *    the close unread: the edge that announced both was spent on the bytes. The connection then
 *    waits for MHD's idle timeout, holding what its body streams into (device memory, a blob
 *    file). While such a body streams, the watch polls the socket for the peer's close and,
 *    when it comes, shuts down the socket's reading side: a fresh wake-up for libmicrohttpd,
 *    which reads what is left (the rest of the body, if all of it came) and then the end.
 *    Since a wake-up libmicrohttpd has not collected yet absorbs it, the shutdown is repeated
 *    every tick until libmicrohttpd closes the connection or the body ends.
 *
 * Locking: every function takes the watcher's lock. A connection's socket is touched only
 * while its entry is registered, and http_server.c removes the entry before libmicrohttpd
 * closes the socket (MHD's close notice comes first), so the watcher never shuts down a
 * socket number that was reused. */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct conn_watch conn_watch_t;
typedef struct conn_watch_entry conn_watch_entry_t;

/* Called once when an armed connection's peer has closed; ud as given to conn_watch_arm. */
typedef void (*conn_watch_gone_fn)(void *ud);

/* At most one line per this many microseconds for each kind of refused or cut connection. */
#define CONN_WATCH_LOG_INTERVAL_US (10 * INT64_C(1000000))

/* A log line's rate limit: pass it the time; it says whether to log now and how many were
 * held back since the last line. Callers hold their own lock or use it from one thread. */
typedef struct conn_ratelimit {
    int64_t last_us;
    long held;
} conn_ratelimit_t;

/* True when a line may be written now (then *ret_held is how many were held back before it);
 * false counts one more held back. */
bool conn_ratelimit_pass(conn_ratelimit_t *rl, int64_t now, long *ret_held);

typedef struct conn_watch_limits {
    uint32_t awaiting_max;  /* connections awaiting their request's head; 0: no bound */
    int in_flight_per_addr; /* requests in flight from one client address; 0: no bound */
} conn_watch_limits_t;

/* Starts a watcher and its thread. name says what it watches in its log lines ("tcp"). */
int conn_watch_new(const char *name, const conn_watch_limits_t *limits, conn_watch_t **ret);
/* Stops the thread and frees the watcher; every entry must have been removed. Accepts NULL. */
void conn_watch_free(conn_watch_t *w);

/* Registers a new connection's socket, awaiting its request's head until deadline_us
 * (absolute, mono_us() clock; 0 for none). addr names its client's address ("127.0.0.1"), or
 * is NULL where there is none (a Unix socket). The connection may be refused, or let in by
 * shutting down the oldest connection awaiting a head (see above); a refused one is shut down
 * and registered all the same, for libmicrohttpd's close notice to remove. */
int conn_watch_add(conn_watch_t *w, int fd, const char *addr, int64_t deadline_us,
                   conn_watch_entry_t **ret);
/* Forgets the connection: from its return the watcher no longer touches the socket. Accepts
 * NULL. */
void conn_watch_remove(conn_watch_t *w, conn_watch_entry_t *e);
/* The functions below accept a NULL entry (a connection left unwatched when its entry could not
 * be made) and then do nothing. */
/* Moves the connection's deadline (0: none). */
void conn_watch_set_deadline(conn_watch_t *w, conn_watch_entry_t *e, int64_t deadline_us);
/* The request's head is in: the connection no longer awaits one, counts as a request in
 * flight of its address, and has deadline_us (its body's). -EBUSY when its address already
 * has limits.in_flight_per_addr requests in flight: the request is then not counted, and the
 * caller answers it with a refusal and closes the connection. */
int conn_watch_head_in(conn_watch_t *w, conn_watch_entry_t *e, int64_t deadline_us);
/* The request is over (answered, or its client gone): a kept-alive connection awaits the next
 * request's head until deadline_us, as the newest of those awaiting. */
void conn_watch_request_end(conn_watch_t *w, conn_watch_entry_t *e, int64_t deadline_us);

/* The connection's body streams into what must not wait for MHD's idle timeout once the
 * client has gone: from now until conn_watch_body_end, the peer's close wakes libmicrohttpd. */
void conn_watch_body_begin(conn_watch_t *w, conn_watch_entry_t *e);
/* The whole body is in (or the request ends): the poll of conn_watch_body_begin stops. */
void conn_watch_body_end(conn_watch_t *w, conn_watch_entry_t *e);

/* The connection is being suspended: from now until conn_watch_resume it may be armed. */
void conn_watch_suspend(conn_watch_t *w, conn_watch_entry_t *e);
/* Starts polling a suspended connection for its peer's close, unless it was resumed since
 * conn_watch_suspend. Called by the connection's own HTTP thread after the request was posted
 * (so that gone's cancel always comes after what it cancels). */
void conn_watch_arm(conn_watch_t *w, conn_watch_entry_t *e, conn_watch_gone_fn gone, void *ud);
/* The connection resumes: the poll stops, and gone is not called from now on. */
void conn_watch_resume(conn_watch_t *w, conn_watch_entry_t *e);
