/* Private to api/: who sent a request, for the HTTP adapter (http_server.c). It knows neither
 * libmicrohttpd nor the server: the adapter hands it what the kernel said of the connection's
 * other end and the header values that bear on it, and it answers with an api_user_t decided
 * by those, the [auth] settings and the token store alone. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>

#include "api_internal.h"
#include "conn_watch.h"

/* The account the kernel named at a connection's other end when it was accepted, while the
 * client's socket surely existed (auth_peer_uid). */
typedef struct http_peer {
    /* 0: uid is the kernel's answer; else its error, or -ENOKEY when it was not asked (a
     * TCP connection that began while the settings named no TCP peers). */
    int err;
    uid_t uid;
} http_peer_t;

/* Asks the kernel who is at the other end of fd, a connection just accepted (over the Unix
 * socket when over_unix), into *ret: always over the Unix socket; over TCP only when auth,
 * the settings in force (read only then), name TCP peers (http_tcp_peers_named). */
void http_peer_lookup(int fd, bool over_unix, const auth_settings_t *auth, http_peer_t *ret);
/* Whether the settings take a loopback TCP client as its socket's owner (peercred): only then
 * is the kernel asked, a round trip over netlink, when such a client connects. */
bool http_tcp_peers_named(const auth_settings_t *auth);

/* What of a request decides who sent it. */
typedef struct http_caller {
    bool over_unix;          /* came over the Unix socket */
    const http_peer_t *peer; /* its connection's; NULL when the connection has no state */
    /* Its headers' values, NULL for a header not sent. */
    const char *authorization, *host, *origin, *sec_fetch_site;
} http_caller_t;

/* The warnings that the kernel could not be asked who owns a loopback client's socket, at most
 * one line per CONN_WATCH_LOG_INTERVAL_US (conn_ratelimit_t) however many requests meet it:
 * rl, guarded by lock, both the server's. */
typedef struct http_peer_log {
    pthread_mutex_t *lock;
    conn_ratelimit_t *rl;
} http_peer_log_t;

/* Who is asking: the one place that decides. With mode = none, the Unix socket's peer, and
 * over TCP the user "local" (an admin only when [auth] admins names it). Otherwise, over the
 * Unix socket the peer's uid, unless the mode is token alone; over TCP a Bearer token where
 * tokens are on (checked in tokens; NULL: none is known) and one is sent, else with peercred
 * the owner of a loopback client's socket. A TCP request that no token identifies and that
 * another site's page may have sent is taken as nobody's (err -EXDEV). Then an account that
 * allow_users and allow_groups keep out is refused. auth NULL: no access control, as mode =
 * none. An empty name when nobody is identified (ret->err says why: the router answers 401,
 * or 403 for a refused account). A failed kernel lookup is logged through log (NULL: not
 * logged). 0, or a negative errno when the Unix socket peer's credentials cannot be read. */
int http_request_user(const http_caller_t *caller, const auth_settings_t *auth,
                      auth_store_t *tokens, http_peer_log_t *log, api_user_t *ret);
