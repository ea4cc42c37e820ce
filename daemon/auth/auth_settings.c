/* The [auth] settings, parsed once into an immutable auth_settings_t: the mode and the admins
 * (user names and @groups). */
#include "auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/userdb.h"

#define AUTH_MAX_ADMINS 64

struct auth_settings {
    bool tokens, peercred; /* both false: mode = none */
    int n_admins;
    char admins[AUTH_MAX_ADMINS][AUTH_USER_SIZE + 1]; /* "alice" or "@wheel" */
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

/* Parses "alice, @wheel" into s->admins. 0 or -EINVAL with the reason in err. */
static int admins_parse(auth_settings_t *s, const char *list, char *err, size_t err_size)
{
    const char *p = list;
    while (*p) {
        p += strspn(p, " \t,");
        size_t len = strcspn(p, ",");
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (len == 0) continue;
        const char *name = p[0] == '@' ? p + 1 : p;
        size_t name_len = len - (size_t)(name - p);
        if (name_len == 0 || name_len >= AUTH_USER_SIZE || memchr(name, ' ', name_len) ||
            memchr(name, '\t', name_len) || memchr(name, '@', name_len)) {
            snprintf(err, err_size,
                     "auth.admins: '%.*s' is not a user name or @group (names are separated "
                     "by commas)",
                     (int)(len < 128 ? len : 128), p);
            return -EINVAL;
        }
        if (s->n_admins == AUTH_MAX_ADMINS) {
            snprintf(err, err_size, "auth.admins: more than %d entries", AUTH_MAX_ADMINS);
            return -EINVAL;
        }
        snprintf(s->admins[s->n_admins++], sizeof s->admins[0], "%.*s", (int)len, p);
        p += strcspn(p, ",");
    }
    return 0;
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
    int r = admins_parse(s, cfg->admins, err, err_size);
    char host[256];
    int port;
    bool loopback =
        config_listen_addr(cfg, host, sizeof host, &port) == 0 && host_is_loopback(host);
    if (r == 0 && !s->tokens && !s->peercred && !loopback) {
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
        free(s);
        return r;
    }
    *ret = s;
    return 0;
}

void auth_settings_free(auth_settings_t *s)
{
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

bool auth_settings_is_admin(const auth_settings_t *s, const char *user)
{
    for (int i = 0; i < s->n_admins; i++)
        if (s->admins[i][0] != '@' && strcmp(s->admins[i], user) == 0) return true;
    for (int i = 0; i < s->n_admins; i++)
        if (s->admins[i][0] == '@' && userdb_in_group(user, s->admins[i] + 1)) return true;
    return false;
}
