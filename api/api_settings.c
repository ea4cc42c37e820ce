/* Generations of the settings that requests read (api_internal.h): a reload makes a new one
 * and the server swaps its pointer; each request holds a reference to the one it began with,
 * so that a reload in its middle changes nothing it sees, and the last reference frees it. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "api_internal.h"

struct api_settings {
    atomic_int refs;
    config_t cfg;
    const auth_settings_t *auth;
    auth_settings_t *auth_owned; /* auth when this generation frees it; NULL when borrowed */
};

int api_settings_new(const config_t *cfg, const auth_settings_t *auth, bool owns_auth,
                     api_settings_t **ret)
{
    api_settings_t *s = malloc(sizeof *s);
    if (!s) return -ENOMEM;
    atomic_init(&s->refs, 1);
    s->cfg = *cfg;
    s->auth = auth;
    s->auth_owned = owns_auth ? (auth_settings_t *)auth : NULL;
    *ret = s;
    return 0;
}

api_settings_t *api_settings_ref(api_settings_t *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

void api_settings_unref(api_settings_t *s)
{
    if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1) return;
    auth_settings_free(s->auth_owned);
    free(s);
}

const config_t *api_settings_config(const api_settings_t *s)
{
    return &s->cfg;
}

const auth_settings_t *api_settings_auth(const api_settings_t *s)
{
    return s->auth;
}
