/* Who sent a request (http_identity.h). */
#define _GNU_SOURCE /* getpwuid_r */
#include "http_identity.h"

#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "http_origin.h"
#include "daemon/util/id.h"
#include "daemon/util/log.h"

bool http_tcp_peers_named(const auth_settings_t *auth)
{
    return auth && auth_settings_peercred(auth);
}

void http_peer_lookup(int fd, bool over_unix, const auth_settings_t *auth, http_peer_t *ret)
{
    ret->err = over_unix || http_tcp_peers_named(auth) ? auth_peer_uid(fd, &ret->uid) : -ENOKEY;
}

/* The user of uid, as the kernel names a peer: its login name (or "uid:N" when the host has
 * no name for it). Uid 0 is an admin, as are the users the settings name. */
static void uid_user(uid_t uid, const auth_settings_t *auth, api_user_t *user)
{
    struct passwd pw, *found = NULL;
    char buf[4096];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found &&
        strlen(found->pw_name) < sizeof user->name)
        snprintf(user->name, sizeof user->name, "%s", found->pw_name);
    else
        snprintf(user->name, sizeof user->name, "uid:%u", (unsigned)uid);
    user->admin = uid == 0 || (auth && auth_settings_is_admin(auth, user->name));
}

/* The account at the other end of the connection, as the kernel named it when the
 * connection began: the Unix socket's peer, or a loopback TCP client's socket owner. 0, or
 * auth_peer_uid's error (-ENOMEM when the connection has no state). */
static int peer_user(const http_peer_t *peer, const auth_settings_t *auth, api_user_t *user)
{
    if (!peer) return -ENOMEM;
    if (peer->err < 0) return peer->err;
    uid_user(peer->uid, auth, user);
    return 0;
}

/* The owner of the request's Bearer token (h, its Authorization header); user->err says why
 * there is none. */
static void token_user(const char *h, auth_store_t *tokens, const auth_settings_t *auth,
                       api_user_t *user)
{
    user->err = -ENOKEY;
    if (!h) return;
    user->err = -EACCES;
    if (strncasecmp(h, "Bearer ", 7) != 0 || !auth_settings_tokens(auth) || !tokens) return;
    h += 7 + strspn(h + 7, " ");
    auth_token_info_t info;
    int r = auth_token_check(tokens, h, (int64_t)time(NULL), &info);
    if (r < 0) {
        user->err = r;
        return;
    }
    snprintf(user->name, sizeof user->name, "%s", info.owner);
    user->admin = auth_settings_is_admin(auth, user->name);
    user->by_token = true;
    user->err = 0;
}

/* A loopback TCP client by its socket's owner; user->err says why there is none. A peer
 * beyond loopback has no owner the kernel can name (only a token says who it is); a lookup
 * that finds nothing is refused, never guessed. */
static void loopback_user(const http_peer_t *peer, http_peer_log_t *log,
                          const auth_settings_t *auth, api_user_t *user)
{
    int r = peer_user(peer, auth, user);
    if (r == 0) return;
    user->err = r == -EREMOTE ? -ENOKEY : -ESRCH;
    if (r == -EREMOTE || r == -ENOENT || r == -ENOKEY || !log) return;
    /* The kernel could not be asked: a sandbox without AF_NETLINK, say. */
    pthread_mutex_lock(log->lock);
    long held = 0;
    bool pass = conn_ratelimit_pass(log->rl, mono_us(), &held);
    pthread_mutex_unlock(log->lock);
    if (pass)
        log_warn("Failed to ask the kernel who owns a loopback client's socket: %s; such "
                 "requests answer 401 (%ld more like it)",
                 strerror(-r), held);
}

/* Whether a request that no token identifies may come from another site's page in a browser
 * (http_origin.h): such a request is not taken as the browser's user. */
static bool request_cross_site(const http_caller_t *caller)
{
    return http_cross_site(caller->host, caller->origin, caller->sec_fetch_site);
}

int http_request_user(const http_caller_t *caller, const auth_settings_t *auth,
                      auth_store_t *tokens, http_peer_log_t *log, api_user_t *ret)
{
    bool over_unix = caller->over_unix;
    api_user_t user = {.over_unix = over_unix};
    bool open = !auth || auth_settings_open(auth);
    bool peercred = auth && auth_settings_peercred(auth);
    bool bearer = auth && auth_settings_tokens(auth) && caller->authorization;
    if (over_unix && (open || peercred)) {
        int r = peer_user(caller->peer, auth, &user);
        if (r < 0) return r;
    } else if (!over_unix && (open || (peercred && !bearer)) && request_cross_site(caller)) {
        user.err = -EXDEV;
    } else if (open) {
        snprintf(user.name, sizeof user.name, "local");
        user.admin = auth && auth_settings_is_admin(auth, user.name);
    } else if (!over_unix && peercred && !bearer) {
        loopback_user(caller->peer, log, auth, &user);
    } else {
        token_user(caller->authorization, tokens, auth, &user);
    }
    if (user.name[0] && !open && !user.admin && !auth_settings_allows(auth, user.name)) {
        memcpy(user.refused, user.name, sizeof user.refused);
        user.name[0] = '\0';
        user.err = -EPERM;
    }
    *ret = user;
    return 0;
}
