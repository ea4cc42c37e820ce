/* The [auth] settings, parsed once into an immutable auth_settings_t: the mode, the admins
 * (user names and @groups) and who may connect (allow_users, allow_groups). Whether a user
 * belongs to a group (an admin @group, or one of allow_groups) is an NSS lookup (files, LDAP,
 * sssd...), too slow for every request: its answers are cached in the settings, per user, for
 * AUTH_GROUP_CACHE_US, so that a membership change shows within that time or at the next
 * reload, which builds new settings with an empty cache. */
#include "auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/id.h"
#include "daemon/util/strmap.h"
#include "daemon/util/userdb.h"

#define AUTH_MAX_ADMINS 64
#define AUTH_MAX_ALLOWED 64 /* entries of allow_users, and of allow_groups */
#define AUTH_GROUP_CACHE_US (60 * 1000000LL)
/* Users the cache holds at most; when full it is emptied, which bounds its memory whatever
 * names tokens carry. */
#define AUTH_GROUP_CACHE_MAX 4096

/* One user's answers until expires (mono_us): whether a group of the admins holds them, and
 * whether a group of allow_groups does. */
typedef struct group_answer {
    bool admin, allowed;
    int64_t expires;
} group_answer_t;

struct auth_settings {
    bool tokens, peercred; /* both false: mode = none */
    int n_admins;
    bool any_group;                                   /* some admins entry is an @group */
    char admins[AUTH_MAX_ADMINS][AUTH_USER_SIZE + 1]; /* "alice" or "@wheel" */
    int n_allow_users, n_allow_groups;                /* both 0: everyone may connect */
    char allow_users[AUTH_MAX_ALLOWED][AUTH_USER_SIZE];
    char allow_groups[AUTH_MAX_ALLOWED][AUTH_USER_SIZE];
    /* The cache of group answers, the one mutable part: request threads share it. */
    pthread_mutex_t lock;
    strmap_t *groups; /* user -> group_answer_t */
    size_t n_groups, lookups;
};

/* Whether host (as server.listen gives it, without brackets) is a loopback address. */
static bool host_is_loopback(const char *host)
{
    unsigned char addr[16];
    if (strcmp(host, "localhost") == 0) return true;
    if (inet_pton(AF_INET, host, addr) == 1) return addr[0] == 127;
    if (inet_pton(AF_INET6, host, addr) == 1) {
        static const unsigned char loopback6[16] = {[15] = 1};
        return memcmp(addr, loopback6, 16) == 0;
    }
    return false;
}

/* Parses key's comma-separated list of names into names (at most max entries of size bytes
 * each), counting them in *n. A name is shorter than AUTH_USER_SIZE, without blanks or '@';
 * with groups, an entry may also be "@group", kept with its '@'. 0 or -EINVAL with the reason
 * in err. */
static int names_parse(const char *key, const char *list, bool groups, char *names, size_t size,
                       int max, int *n, char *err, size_t err_size)
{
    for (const char *p = list; *p;) {
        p += strspn(p, " \t,");
        size_t len = strcspn(p, ",");
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (len == 0) continue;
        const char *name = groups && p[0] == '@' ? p + 1 : p;
        size_t name_len = len - (size_t)(name - p);
        if (name_len == 0 || name_len >= AUTH_USER_SIZE || len >= size ||
            memchr(name, ' ', name_len) || memchr(name, '\t', name_len) ||
            memchr(name, '@', name_len)) {
            snprintf(err, err_size, "%s: '%.*s' is not a %s (names are separated by commas%s)", key,
                     (int)(len < 128 ? len : 128), p, groups ? "user name or @group" : "name",
                     groups ? "" : ", without '@'");
            return -EINVAL;
        }
        if (*n == max) {
            snprintf(err, err_size, "%s: more than %d entries", key, max);
            return -EINVAL;
        }
        snprintf(names + (size_t)(*n)++ * size, size, "%.*s", (int)len, p);
        p += len;
        p += strcspn(p, ",");
    }
    return 0;
}

/* Parses "alice, @wheel" into s->admins. 0 or -EINVAL with the reason in err. */
static int admins_parse(auth_settings_t *s, const char *list, char *err, size_t err_size)
{
    int r = names_parse("auth.admins", list, true, s->admins[0], sizeof s->admins[0],
                        AUTH_MAX_ADMINS, &s->n_admins, err, err_size);
    for (int i = 0; r == 0 && i < s->n_admins; i++)
        s->any_group |= s->admins[i][0] == '@';
    return r;
}

int auth_settings_new(const config_t *cfg, auth_settings_t **ret, char *err, size_t err_size)
{
    auth_settings_t *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_size, "out of memory");
        return -ENOMEM;
    }
    s->tokens = strstr(cfg->mode, "token") != NULL;
    s->peercred = strstr(cfg->mode, "peercred") != NULL;
    pthread_mutex_init(&s->lock, NULL);
    int r = strmap_new(&s->groups);
    if (r < 0)
        snprintf(err, err_size, "out of memory");
    else
        r = admins_parse(s, cfg->admins, err, err_size);
    if (r == 0)
        r = names_parse("auth.allow_users", cfg->allow_users, false, s->allow_users[0],
                        sizeof s->allow_users[0], AUTH_MAX_ALLOWED, &s->n_allow_users, err,
                        err_size);
    if (r == 0)
        r = names_parse("auth.allow_groups", cfg->allow_groups, false, s->allow_groups[0],
                        sizeof s->allow_groups[0], AUTH_MAX_ALLOWED, &s->n_allow_groups, err,
                        err_size);
    char host[256];
    int port;
    bool loopback =
        config_listen_addr(cfg, host, sizeof host, &port) == 0 && host_is_loopback(host);
    if (r == 0 && !s->tokens && !s->peercred && (s->n_allow_users || s->n_allow_groups)) {
        snprintf(err, err_size,
                 "auth.%s needs auth.mode to identify who connects, but mode = none makes "
                 "every TCP client the user 'local': set auth.mode = peercred or "
                 "token,peercred",
                 s->n_allow_users ? "allow_users" : "allow_groups");
        r = -EINVAL;
    } else if (r == 0 && !s->tokens && !s->peercred && !loopback) {
        snprintf(err, err_size,
                 "auth.mode = none (no access control) needs a loopback listener, but "
                 "server.listen is '%s': set auth.mode = token (and create tokens with "
                 "'gpujobd token create'), or listen on 127.0.0.1 or [::1]",
                 cfg->listen);
        r = -EINVAL;
    } else if (r == 0 && s->tokens && !loopback && !config_tls_enabled(cfg) &&
               !cfg->allow_insecure_tokens) {
        snprintf(err, err_size,
                 "auth.mode = %s on '%s' would send tokens in the clear: set server.tls_cert "
                 "and server.tls_key to serve HTTPS, or auth.allow_insecure_tokens = true to "
                 "accept that risk",
                 cfg->mode, cfg->listen);
        r = -EINVAL;
    }
    if (r < 0) {
        auth_settings_free(s);
        return r;
    }
    *ret = s;
    return 0;
}

static void answer_free(const char *key, void *value, void *ud)
{
    (void)key, (void)ud;
    free(value);
}

/* Empties the cache of group answers; the caller holds s->lock. */
static void groups_clear(auth_settings_t *s)
{
    strmap_foreach(s->groups, answer_free, NULL);
    strmap_free(s->groups);
    s->groups = NULL;
    s->n_groups = 0;
    if (strmap_new(&s->groups) < 0) s->groups = NULL;
}

void auth_settings_free(auth_settings_t *s)
{
    if (!s) return;
    if (s->groups) strmap_foreach(s->groups, answer_free, NULL);
    strmap_free(s->groups);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

bool auth_settings_open(const auth_settings_t *s)
{
    return !s->tokens && !s->peercred;
}

bool auth_settings_tokens(const auth_settings_t *s)
{
    return s->tokens;
}

bool auth_settings_peercred(const auth_settings_t *s)
{
    return s->peercred;
}

/* Whether a group of the admins holds user, and whether a group of allow_groups does, asking
 * NSS. */
static group_answer_t groups_lookup(const auth_settings_t *s, const char *user)
{
    group_answer_t a = {0};
    for (int i = 0; i < s->n_admins && !a.admin; i++)
        a.admin = s->admins[i][0] == '@' && userdb_in_group(user, s->admins[i] + 1);
    for (int i = 0; i < s->n_allow_groups && !a.allowed; i++)
        a.allowed = userdb_in_group(user, s->allow_groups[i]);
    return a;
}

/* groups_lookup through the cache. The lookup runs outside the lock, so that a slow NSS
 * server holds up only the requests of users it has not answered for yet. */
static group_answer_t groups_cached(auth_settings_t *s, const char *user)
{
    int64_t now = mono_us();
    pthread_mutex_lock(&s->lock);
    group_answer_t *a = s->groups ? strmap_get(s->groups, user) : NULL;
    bool hit = a && a->expires > now;
    group_answer_t answer = hit ? *a : (group_answer_t){0};
    if (!hit) s->lookups++;
    pthread_mutex_unlock(&s->lock);
    if (hit) return answer;

    answer = groups_lookup(s, user);
    answer.expires = now + AUTH_GROUP_CACHE_US;
    pthread_mutex_lock(&s->lock);
    if (s->n_groups >= AUTH_GROUP_CACHE_MAX) groups_clear(s);
    a = s->groups ? strmap_get(s->groups, user) : NULL;
    if (!a && s->groups && (a = malloc(sizeof *a))) {
        if (strmap_put(s->groups, user, a) == 0) {
            s->n_groups++;
        } else {
            free(a); /* out of memory: answered, not remembered */
            a = NULL;
        }
    }
    if (a) *a = answer;
    pthread_mutex_unlock(&s->lock);
    return answer;
}

bool auth_settings_is_admin(const auth_settings_t *s, const char *user)
{
    for (int i = 0; i < s->n_admins; i++)
        if (s->admins[i][0] != '@' && strcmp(s->admins[i], user) == 0) return true;
    /* The cache is the settings' one mutable part, behind its own lock. */
    return s->any_group && groups_cached((auth_settings_t *)s, user).admin;
}

bool auth_settings_allows(const auth_settings_t *s, const char *user)
{
    if (!s->n_allow_users && !s->n_allow_groups) return true;
    for (int i = 0; i < s->n_allow_users; i++)
        if (strcmp(s->allow_users[i], user) == 0) return true;
    if (s->n_allow_groups && groups_cached((auth_settings_t *)s, user).allowed) return true;
    return auth_settings_is_admin(s, user);
}

const char *auth_settings_refusal(const auth_settings_t *s, const char *user, char *why,
                                  size_t why_size)
{
    const char *users = "auth.allow_users does not name them";
    const char *groups = "they are in none of the groups of auth.allow_groups";
    if (s->n_allow_users && s->n_allow_groups)
        snprintf(why, why_size, "'%s' may not use this daemon: %s, and %s", user, users, groups);
    else
        snprintf(why, why_size, "'%s' may not use this daemon: %s", user,
                 s->n_allow_users ? users : groups);
    return s->n_allow_users ? "auth.allow_users" : "auth.allow_groups";
}

size_t auth_settings_group_lookups(const auth_settings_t *s)
{
    auth_settings_t *m = (auth_settings_t *)s;
    pthread_mutex_lock(&m->lock);
    size_t n = m->lookups;
    pthread_mutex_unlock(&m->lock);
    return n;
}
