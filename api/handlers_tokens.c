/* The token routes: POST /v1/tokens (a user mints a token for themself, over the Unix socket
 * only), GET /v1/tokens (one's own; an admin's: everyone's, or ?user=), DELETE /v1/tokens/{id}
 * (one's own; an admin: any). A token's secret appears in one answer only, the POST's. */
#include "api_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The longest life a token made through the API may be given: ten years. */
#define TOKEN_MAX_LIFE_S (10LL * 366 * 86400)

static json_t *token_json(const auth_token_info_t *t)
{
    return json_pack("{s:s, s:s, s:s, s:o, s:o, s:o}", "id", t->id, "name", t->name, "owner",
                     t->owner, "created_at", job_json_time(t->created * 1000000), "expires_at",
                     job_json_time(t->expires * 1000000), "last_used_at",
                     job_json_time(t->last_used * 1000000));
}

/* The token store, or NULL after answering 404 when this server has none. */
static auth_store_t *token_store(api_request_t *req)
{
    if (!req->env->tokens)
        api_respond_error(req, 404, "not_found", NULL, "this server keeps no tokens");
    return req->env->tokens;
}

/* {"name": string, "expires_in_s": integer (optional)}: 0, or API_DONE after answering 400. */
static int create_body_parse(api_request_t *req, const char **ret_name, int64_t *ret_life,
                             json_t **ret_body)
{
    json_error_t jerr;
    json_t *body = json_loadb(req->body ? req->body : "", req->body_len, 0, &jerr);
    const char *field = "body", *why = "expected a JSON object";
    json_t *name = body ? json_object_get(body, "name") : NULL;
    json_t *life = body ? json_object_get(body, "expires_in_s") : NULL;
    if (!json_is_object(body))
        ;
    else if (!json_is_string(name) || !auth_name_valid(json_string_value(name), AUTH_NAME_SIZE))
        field = "name", why = "expected a non-empty string of printable characters, shorter "
                              "than 128 bytes";
    else if (life && !json_is_null(life) &&
             (!json_is_integer(life) || json_integer_value(life) < 1 ||
              json_integer_value(life) > TOKEN_MAX_LIFE_S))
        field = "expires_in_s", why = "expected a whole number of seconds, 1 to ten years";
    else
        field = NULL;
    if (field) {
        api_respond_error(req, 400, "invalid_argument", field, "%s", why);
        json_decref(body);
        return API_DONE;
    }
    *ret_name = json_string_value(name);
    *ret_life = json_is_integer(life) ? json_integer_value(life) : 0;
    *ret_body = body;
    return 0;
}

int api_handle_tokens_create(api_request_t *req)
{
    static const char *const no_args[] = {NULL};
    if (api_query_check(req, no_args)) return API_DONE;
    auth_store_t *tokens = token_store(req);
    if (!tokens) return API_DONE;
    /* A token is minted only by who logged in to this host: a stolen token mints no more. */
    if (!req->user.over_unix || req->user.by_token) {
        api_respond_error(req, 403, "forbidden", NULL,
                          "tokens are made over the Unix socket, as its peer user "
                          "(gpujob token create on the server)");
        return API_DONE;
    }
    const char *name;
    int64_t life;
    json_t *body;
    if (create_body_parse(req, &name, &life, &body)) return API_DONE;
    char token[AUTH_TOKEN_SIZE];
    auth_token_info_t info;
    int r = auth_token_create(tokens, req->user.name, name, life ? (int64_t)time(NULL) + life : 0,
                              &info, token);
    json_decref(body);
    if (r < 0) {
        api_respond_errno(req, r, "the token could not be made");
        return API_DONE;
    }
    json_t *o = token_json(&info);
    json_object_set_new(o, "token", json_string(token));
    memset(token, 0, sizeof token);
    api_respond_json(req, 201, o);
    return API_DONE;
}

int api_handle_tokens_list(api_request_t *req)
{
    static const char *const args[] = {"user", NULL};
    if (api_query_check(req, args)) return API_DONE;
    auth_store_t *tokens = token_store(req);
    if (!tokens) return API_DONE;
    const char *user = api_query(req, "user");
    const char *owner = user ? user : api_request_owner_filter(req);
    if (user && strcmp(user, req->user.name) != 0 &&
        api_request_require_admin(req, "query.user", "list another user's tokens"))
        return API_DONE;
    auth_token_info_t *list = NULL;
    size_t n = 0;
    int r = auth_token_list(tokens, owner, &list, &n);
    if (r < 0) {
        api_respond_errno(req, r, "the tokens could not be read");
        return API_DONE;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, token_json(&list[i]));
    free(list);
    api_respond_json(req, 200, json_pack("{s:o}", "tokens", arr));
    return API_DONE;
}

int api_handle_token_revoke(api_request_t *req)
{
    static const char *const no_args[] = {NULL};
    if (api_query_check(req, no_args)) return API_DONE;
    auth_store_t *tokens = token_store(req);
    if (!tokens) return API_DONE;
    const char *id = api_path_param(req, "id");
    int r = auth_token_revoke(tokens, id, api_request_owner_filter(req));
    /* Only a well-formed id is quoted back: a whole token pasted in its place is not. */
    if (r == -ENOENT && auth_token_id_valid(id))
        api_respond_error(req, 404, "not_found", "id", "token '%s' not found", id);
    else if (r == -ENOENT)
        api_respond_error(req, 404, "not_found", "id", "no such token");
    else if (r < 0)
        api_respond_errno(req, r, "the token could not be revoked");
    else
        api_respond_json(req, 200, json_pack("{s:s, s:b}", "id", id, "revoked", 1));
    return API_DONE;
}
