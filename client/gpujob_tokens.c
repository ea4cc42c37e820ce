/* Tokens: minting one for oneself over the Unix socket, listing and revoking them. A token's
 * text comes back in one answer only, the mint's: it is copied to the caller and the memory of
 * the answer is wiped, and it never goes into a message. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpujob_internal.h"

/* Copies a string member of o into out (size bytes); "" for null or absent. 0, or -EBADMSG
 * when it is of another type or too long. */
static int token_string(const json_t *o, const char *key, bool required, char *out, size_t size)
{
    json_t *v = json_object_get(o, key);
    out[0] = '\0';
    if (!v || json_is_null(v)) return required ? -EBADMSG : 0;
    if (!json_is_string(v) || json_string_length(v) >= size) return -EBADMSG;
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

static int token_from_json(gpujob_client_t *c, const json_t *o, gpujob_token_t *ret)
{
    gpujob_token_t t;
    if (!json_is_object(o) || token_string(o, "id", true, t.id, sizeof t.id) < 0 ||
        token_string(o, "name", true, t.name, sizeof t.name) < 0 ||
        token_string(o, "owner", true, t.owner, sizeof t.owner) < 0 ||
        token_string(o, "created_at", false, t.created_at, sizeof t.created_at) < 0 ||
        token_string(o, "expires_at", false, t.expires_at, sizeof t.expires_at) < 0 ||
        token_string(o, "last_used_at", false, t.last_used_at, sizeof t.last_used_at) < 0)
        return gjc_fail(c, -EBADMSG, "the answer is not a token's description");
    *ret = t;
    return 0;
}

/* Reads the mint's answer: the record into *ret_info and the text into ret_text. */
static int token_created(gpujob_client_t *c, const gjc_response_t *resp, gpujob_token_t *ret_info,
                         char ret_text[GPUJOB_TOKEN_SIZE])
{
    json_t *root = NULL;
    int r = gjc_parse_body(c, resp, &root);
    if (r < 0) return r;
    gpujob_token_t info;
    char text[GPUJOB_TOKEN_SIZE];
    r = token_from_json(c, root, &info);
    if (r == 0 && token_string(root, "token", true, text, sizeof text) < 0)
        r = gjc_fail(c, -EBADMSG, "POST /v1/tokens: the answer carries no token");
    json_decref(root);
    if (r < 0) return r;
    memcpy(ret_text, text, sizeof text);
    explicit_bzero(text, sizeof text);
    if (ret_info) *ret_info = info;
    return 0;
}

int gpujob_token_create(gpujob_client_t *c, const char *name, int64_t expires_in_s,
                        gpujob_token_t *ret, char ret_text[GPUJOB_TOKEN_SIZE])
{
    gjc_clear_error(c);
    if (!name || !name[0] || !ret_text) return gjc_fail(c, -EINVAL, "empty token name");
    if (expires_in_s < 0) return gjc_fail(c, -EINVAL, "a negative expiry");
    json_t *body = json_pack("{s:s}", "name", name);
    if (body && expires_in_s > 0)
        json_object_set_new(body, "expires_in_s", json_integer((json_int_t)expires_in_s));
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) return gjc_fail(c, -ENOMEM, "out of memory");
    gjc_request_t req = {.method = "POST",
                         .path = "/v1/tokens",
                         .content_type = "application/json",
                         .body = text,
                         .body_len = strlen(text),
                         .accept = "application/json"};
    gjc_response_t resp = {.retry_after_s = -1};
    int r = gjc_perform(c, &req, &resp);
    free(text);
    if (r >= 0) r = gjc_check_status(c, &resp, 201, 0);
    if (r >= 0) r = token_created(c, &resp, ret, ret_text);
    /* The answer held the token's text: it does not outlive the call in this process. */
    if (resp.body) explicit_bzero(resp.body, resp.cap);
    gjc_response_clear(&resp);
    return r;
}

/* method /v1/tokens<sep><arg, escaped> (arg NULL: nothing after /v1/tokens), answered 200:
 * its JSON into *ret (a new reference). */
static int tokens_call(gpujob_client_t *c, const char *method, const char *sep, const char *arg,
                       json_t **ret)
{
    char *path = NULL, *escaped = arg ? gjc_escape(c, arg) : NULL;
    if ((arg && !escaped) ||
        asprintf(&path, "/v1/tokens%s%s", arg ? sep : "", arg ? escaped : "") < 0) {
        free(escaped);
        return gjc_fail(c, -ENOMEM, "out of memory");
    }
    free(escaped);
    gjc_request_t req = {.method = method, .path = path, .accept = "application/json"};
    int r = gjc_call_json(c, &req, 200, 0, ret, NULL);
    free(path);
    return r;
}

int gpujob_token_list(gpujob_client_t *c, const char *user, gpujob_token_t **ret, size_t *ret_n)
{
    gjc_clear_error(c);
    json_t *root = NULL;
    int r = tokens_call(c, "GET", user ? "?user=" : "", user, &root);
    if (r < 0) return r;
    json_t *arr = json_object_get(root, "tokens");
    size_t n = json_array_size(arr);
    gpujob_token_t *list = n ? calloc(n, sizeof *list) : NULL;
    if (!json_is_array(arr))
        r = gjc_fail(c, -EBADMSG, "GET /v1/tokens: the answer has no tokens array");
    else if (n && !list)
        r = gjc_fail(c, -ENOMEM, "out of memory");
    for (size_t i = 0; r == 0 && i < n; i++)
        r = token_from_json(c, json_array_get(arr, i), &list[i]);
    json_decref(root);
    if (r < 0) {
        free(list);
        return r;
    }
    *ret = list;
    *ret_n = n;
    return 0;
}

/* A token's id from id, or from a whole token's text pasted in its place ("gj_<id>_<secret>"),
 * so that the secret is never sent in a URL, which messages quote. */
static int token_id(const char *id, char ret[64])
{
    size_t len = strlen(id);
    if (strncmp(id, "gj_", 3) == 0 && strchr(id + 3, '_')) {
        id += 3;
        len = (size_t)(strchr(id, '_') - id);
    }
    if (len == 0 || len >= 64) return -EINVAL;
    memcpy(ret, id, len);
    ret[len] = '\0';
    return 0;
}

int gpujob_token_revoke(gpujob_client_t *c, const char *id)
{
    gjc_clear_error(c);
    char clean[64];
    if (!id || token_id(id, clean) < 0)
        return gjc_fail(c, -EINVAL, "expected a token id (the part of the token after gj_)");
    json_t *root = NULL;
    int r = tokens_call(c, "DELETE", "/", clean, &root);
    json_decref(root);
    return r;
}
