/* The status page: GET / answers ui/index.html, GET /ui/{file} the page's script and style,
 * all compiled into the daemon (ui_assets.h). Query arguments are ignored. The routes are
 * anonymous: the files hold no data, and the page asks the JSON API itself, with the user's token,
 * for everything it shows. GET /ui/session tells the page, without a 401 (which a browser logs as
 * an error), whether the request's credentials (a Bearer token, or none where none is needed)
 * identify a user. */
#include "api_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ui_assets.h"

/* The page runs only its own script and style and talks only to this daemon: no inline
 * script, no other origin, no framing by another site. */
#define UI_CSP                                                                                     \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src "        \
    "'self'; "                                                                                     \
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

_Static_assert(sizeof UI_CSP <= sizeof((api_header_t *)0)->value, "the CSP fits a header");

static const api_ui_asset_t *ui_asset_find(const char *name)
{
    for (int i = 0; i < api_ui_asset_count; i++)
        if (strcmp(api_ui_assets[i].name, name) == 0) return &api_ui_assets[i];
    return NULL;
}

/* Answers a file of the page. no-cache: the browser revalidates each load, so that a daemon
 * upgraded in place never serves an old script beside a new page; the files are a few kB. */
static int ui_respond(api_request_t *req, const char *name)
{
    const api_ui_asset_t *a = ui_asset_find(name);
    if (!a) {
        api_respond_error(req, 404, "not_found", "path", "no such file '%.64s' in the page", name);
        return API_DONE;
    }
    void *copy = malloc(a->size ? a->size : 1);
    if (!copy) {
        api_respond_error(req, 500, "internal", NULL, "out of memory");
        return API_DONE;
    }
    memcpy(copy, a->data, a->size);
    api_respond_bytes(req, 200, a->content_type, copy, a->size);
    api_response_add_header(&req->resp, "Content-Security-Policy", "%s", UI_CSP);
    api_response_add_header(&req->resp, "Cache-Control", "no-cache");
    api_response_add_header(&req->resp, "X-Content-Type-Options", "nosniff");
    api_response_add_header(&req->resp, "Referrer-Policy", "no-referrer");
    return API_DONE;
}

int api_handle_ui_index(api_request_t *req)
{
    return ui_respond(req, "index.html");
}

int api_handle_ui_file(api_request_t *req)
{
    return ui_respond(req, api_path_param(req, "file"));
}

int api_handle_ui_session(api_request_t *req)
{
    const api_user_t *u = &req->user;
    char why[256] = "";
    if (u->err == -EPERM && req->auth)
        (void)auth_settings_refusal(req->auth, u->refused, why, sizeof why);
    const char *refused = u->err == -EKEYEXPIRED ? "the token has expired"
                          : u->err == -EACCES
                              ? "the token is not valid (unknown, revoked or malformed)"
                          : u->err == -ENOKEY ? NULL
                          : u->err == -ESRCH  ? "the kernel named no account for this loopback "
                                                "connection"
                          : u->err == -EPERM  ? why
                          : u->err < 0        ? "the token could not be checked"
                                              : NULL;
    json_t *user =
        u->name[0] ? json_pack("{s:s, s:b}", "name", u->name, "admin", u->admin) : json_null();
    api_respond_json(req, 200,
                     json_pack("{s:o, s:o}", "user", user, "refused",
                               refused && !u->name[0] ? json_string(refused) : json_null()));
    api_response_add_header(&req->resp, "Cache-Control", "no-store");
    return API_DONE;
}
