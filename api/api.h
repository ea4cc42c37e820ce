/* The HTTP API (v1) of gpujobd, served by libmicrohttpd. api/ turns HTTP into validated calls
 * to the scheduler and the store's readers, and results into HTTP; it owns no state of its own
 * beyond the server handle, and it is the only part of gpujobd that includes libmicrohttpd. */
#pragma once

#include "daemon/auth/auth.h"
#include "daemon/util/config.h"
#include "daemon/exec/executor.h"
#include "daemon/sched/scheduler.h"

typedef struct api_server api_server_t;

/* Listening sockets handed from one process of the daemon to the next (daemon/util/restart.h):
 * TCP and Unix, -1 for none. */
typedef struct api_listeners {
    int tcp, local;
} api_listeners_t;

/* Who may use the server: the [auth] settings and the token store, both borrowed; they must
 * outlive the server. */
typedef struct api_auth {
    const auth_settings_t *settings;
    auth_store_t *tokens;
} api_auth_t;

/* Starts serving on cfg->listen (and cfg->unix_socket when set) with a thread pool, taking
 * over the sockets in inherited (NULL: none) instead of binding. Logs the address it serves
 * ("listening on http://127.0.0.1:PORT"), port 0 resolved. gpu_metrics, the GPU gauges
 * /metrics adds, is borrowed and must outlive the server; NULL for none. auth decides who
 * each request's user is (api/http_identity.c). */
int api_server_start(const config_t *cfg, sched_t *sched, gpu_metrics_t *gpu_metrics,
                     const api_auth_t *auth, const api_listeners_t *inherited, api_server_t **ret);
/* Applies a reloaded configuration: each request that begins from now on reads cfg (copied)
 * and is judged by auth, whom the server takes and frees once no request uses it; a request
 * under way ends with the settings it began with. cfg's keys that change only at a restart
 * must hold the values the server started with (config_keep_restart_only). Any thread; 0, or
 * -ENOMEM with nothing changed and auth still the caller's. */
int api_server_reload(api_server_t *srv, const config_t *cfg, auth_settings_t *auth);
/* Stops accepting new submissions: from now on they answer 503 (reads still work). */
void api_server_stop_intake(api_server_t *srv);
/* Before the daemon executes itself again (daemon/util/restart.h): stops accepting connections and
 * returns the listening sockets, left open without close-on-exec for the next process (-1
 * where that failed: the next process binds anew). api_server_free then leaves them open. */
api_listeners_t api_server_keep_listeners(api_server_t *srv);
/* Closes the listening sockets, ends every connection and frees the server. Accepts NULL. */
void api_server_free(api_server_t *srv);
