/* Whether a request was made by another site's page (http_origin.h). */
#include "http_origin.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Whether s[0..n) is a port: one to five digits. */
static bool is_port(const char *s, size_t n)
{
    if (n == 0 || n > 5) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

/* Whether the name ends with "localhost" as its last label, case aside: browsers resolve
 * such names to loopback themselves (RFC 6761 6.3), so no DNS answer can rebind them. */
static bool is_localhost_name(const char *name, size_t n)
{
    static const char lh[] = "localhost";
    size_t k = sizeof lh - 1;
    if (n < k || strncasecmp(name + n - k, lh, k) != 0) return false;
    return n == k || name[n - k - 1] == '.';
}

/* Whether host (a Host header: a name, an IPv4 address or an IPv6 one in brackets, and an
 * optional port) names a loopback address. */
static bool host_is_loopback(const char *host)
{
    size_t n = strlen(host);
    char addr[64];
    if (host[0] == '[') {
        const char *close = strchr(host, ']');
        if (!close) return false;
        size_t rest = n - (size_t)(close + 1 - host);
        if (rest && (close[1] != ':' || !is_port(close + 2, rest - 1))) return false;
        size_t len = (size_t)(close - host - 1);
        if (len >= sizeof addr) return false;
        memcpy(addr, host + 1, len);
        addr[len] = '\0';
        struct in6_addr a6;
        return inet_pton(AF_INET6, addr, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
    }
    const char *colon = strchr(host, ':');
    size_t len = colon ? (size_t)(colon - host) : n;
    if (colon && !is_port(colon + 1, n - len - 1)) return false;
    if (len == 0 || len >= sizeof addr) return false;
    if (is_localhost_name(host, len)) return true;
    memcpy(addr, host, len);
    addr[len] = '\0';
    struct in_addr a4;
    return inet_pton(AF_INET, addr, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127;
}

/* Whether origin is the daemon's own as host names it: "http://HOST" or "https://HOST". */
static bool origin_is_host(const char *origin, const char *host)
{
    const char *rest = strncasecmp(origin, "http://", 7) == 0    ? origin + 7
                       : strncasecmp(origin, "https://", 8) == 0 ? origin + 8
                                                                 : NULL;
    return rest && strcasecmp(rest, host) == 0;
}

bool http_cross_site(const char *host, const char *origin, const char *fetch_site)
{
    if (!host) return false;
    if (!host_is_loopback(host)) return true;
    if (origin && !origin_is_host(origin, host)) return true;
    return fetch_site && strcasecmp(fetch_site, "same-origin") != 0 &&
           strcasecmp(fetch_site, "none") != 0;
}
