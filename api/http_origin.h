/* Private to api/: whether a request was made by a web page of another site, for the HTTP
 * adapter (http_server.c).
 *
 * A request that no token identifies is taken as an account that the caller brings along
 * without naming it: over loopback TCP the owner of the client's socket, as the kernel names
 * it, or "local" with auth.mode = none. A browser is such a client too: a page of any site
 * that its user opens can make it send requests to localhost (a form posted there, a fetch in
 * no-cors mode), and, through DNS rebinding, read the answers as the page's own, with the
 * browser's user as the caller. What marks such requests, in every browser that can reach the
 * API: a Host that names the attacker's domain (rebinding), an Origin that is not the daemon's
 * own (RFC 6454: browsers send it on every cross-origin request and on every POST and DELETE),
 * and Sec-Fetch-Site (Fetch Metadata) saying the request came from elsewhere. curl, libgpujob,
 * the Python client and the status page, served by the daemon itself, send none of those
 * marks. */
#pragma once

#include <stdbool.h>

/* Whether a request with these header values (NULL for a header not sent) may come from
 * another site's page: host names no loopback address ("localhost" or a name under it,
 * 127.0.0.0/8, [::1], with an optional port), origin is present and is not "http://" or
 * "https://" followed by host, or fetch_site is present and is neither "same-origin" nor
 * "none". A request without Host is no browser's. */
bool http_cross_site(const char *host, const char *origin, const char *fetch_site);
