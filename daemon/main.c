/* gpujobd: the process. Reads the configuration, opens the store, starts the scheduler with
 * its backend and the HTTP server, and waits for signals: SIGTERM/SIGINT stop intake, drain
 * running work within the configured bound and exit 0, leaving queued jobs for the next start;
 * SIGUSR1 (a GPU lost its CUDA context: daemon/util/restart.h) drains the same way and executes the
 * daemon again on the same sockets; SIGHUP reloads the configuration (daemon_reload). */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "api/api.h"
#include "daemon/auth/auth.h"
#include "daemon/exec/executor.h"
#include "daemon/util/config.h"
#include "daemon/util/crash_guard.h"
#include "kernels/op.h"
#include "daemon/util/log.h"
#include "daemon/util/policy.h"
#include "daemon/util/restart.h"
#include "daemon/sched/scheduler.h"
#include "daemon/util/service_notify.h"
#include "daemon/store/store.h"

#ifdef GPUJOB_JEMALLOC
/* jemalloc's options, read when it starts, before main(); MALLOC_CONF may add to them. A burst
 * of submissions leaves hundreds of MiB of freed pages in its arenas, which jemalloc returns
 * to the system only as they decay (10 s), and decays them only when an arena is used again:
 * an idle daemon would keep them for good. A background thread (one serves every arena)
 * decays them on time whether or not anything else happens. It starts with every signal
 * blocked, so the signals still reach the main thread's sigwait. */
const char *malloc_conf = "background_thread:true,max_background_threads:1";
#endif

/* The parts of a running daemon, in the order they start. */
typedef struct daemon_parts {
    store_t *st;
    sched_t *sched;
    executor_t *ex;
    gpu_metrics_t *gpu_metrics;
    auth_store_t *tokens;
    api_server_t *api;
} daemon_parts_t;

/* Opens the store and starts the scheduler with its backend and the HTTP server, on the
 * listening sockets a previous process handed over if any. 0, or 1 after logging why (and
 * closing what had started). */
static int daemon_start(const config_t *cfg, const auth_settings_t *auth, daemon_parts_t *d)
{
    int r = store_open(cfg, &d->st);
    if (r < 0) {
        log_error("Failed to open the store in '%s': %s", cfg->state_dir, strerror(-r));
        return 1;
    }
    /* The token store has logged why it failed. */
    if (auth_store_open(cfg->state_dir, &d->tokens) < 0) {
        store_close(d->st);
        return 1;
    }
    /* Before any worker runs a job: a job that crashes the process is failed at the next
     * start instead of crashing that one too (crash_guard.h). */
    r = crash_guard_install(cfg->state_dir);
    if (r >= 0) r = sched_new(cfg, d->st, &d->sched);
    /* The executor's workers read input bytes through readers of their own on the store. */
    exec_blob_reader_t blobs = exec_store_blob_reader(d->st);
    if (r >= 0) r = backend_new(cfg, &blobs, &d->ex);
    if (r >= 0) {
        /* The GPU gauges are an extra: without them the daemon serves on. */
        int m = backend_gpu_metrics_start(cfg, d->ex, &d->gpu_metrics);
        if (m < 0) log_warn("No GPU gauges in /metrics: %s", strerror(-m));
        sched_set_executor(d->sched, d->ex);
        r = sched_start(d->sched);
    }
    api_listeners_t inherited;
    restart_listeners(&inherited.tcp, &inherited.local);
    api_auth_t api_auth = {auth, d->tokens};
    if (r >= 0) r = api_server_start(cfg, d->sched, d->gpu_metrics, &api_auth, &inherited, &d->api);
    if (r < 0) {
        log_error("Failed to start: %s", strerror(-r));
        gpu_metrics_stop(d->gpu_metrics);
        sched_free(d->sched);
        auth_store_close(d->tokens);
        store_close(d->st);
        return 1;
    }
    return 0;
}

static void reload_kept(const char *section, const char *key, void *userdata)
{
    (void)userdata;
    log_warn("reload: %s.%s changes only at restart; kept", section, key);
}

/* Builds what a reload applies from the same command line as at start (defaults, the
 * --config file, the flags): the configuration, with the running value of every key that
 * changes only at a restart (each such change logged), its [auth] settings and its policy.
 * 0, or -EINVAL with the reason in err and nothing built. */
static int reload_build(const config_t *running, int argc, char **argv, config_t *next,
                        auth_settings_t **ret_auth, policy_t **ret_policy, char *err,
                        size_t err_size)
{
    config_action_t action;
    int r = config_from_args(next, argc, argv, &action, err, err_size);
    if (r < 0) return r;
    config_keep_restart_only(next, running, reload_kept, NULL);
    /* Validated again: a new value may not fit a kept one. */
    r = config_validate(next, err, err_size);
    auth_settings_t *auth = NULL;
    if (r >= 0) r = auth_settings_new(next, &auth, err, err_size);
    if (r < 0) return r;
    policy_t *policy;
    r = policy_new(next, &policy);
    if (r < 0) {
        auth_settings_free(auth);
        snprintf(err, err_size, "%s", strerror(-r));
        return r;
    }
    *ret_auth = auth;
    *ret_policy = policy;
    return 0;
}

/* SIGHUP: reads the configuration again and applies what may change on a running daemon, the
 * [limits], [auth], users, groups and weights, to the HTTP server (each request from now on)
 * and the scheduler (its policy), without closing a connection or touching a job. A file that
 * does not check out is refused, with the reason, and every setting stays as it was. */
static void daemon_reload(const config_t *running, daemon_parts_t *d, int argc, char **argv)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    char state[96];
    /* MONOTONIC_USEC= is what systemd 253 and later match the READY=1 against; older ones
     * ignore it. */
    snprintf(state, sizeof state, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading",
             (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000);
    service_notify(state);
    config_t *next = malloc(sizeof *next);
    auth_settings_t *auth = NULL;
    policy_t *policy = NULL;
    char err[512] = "out of memory";
    int r =
        next ? reload_build(running, argc, argv, next, &auth, &policy, err, sizeof err) : -ENOMEM;
    if (r >= 0) r = api_server_reload(d->api, next, auth);
    if (r < 0) {
        if (r == -ENOMEM) snprintf(err, sizeof err, "out of memory");
        log_error("reload refused: %s; the settings in force stay", err);
        auth_settings_free(auth);
        policy_unref(policy);
    } else {
        /* The server owns auth now. */
        sched_set_policy(d->sched, policy);
        log_info("reloaded the configuration");
    }
    free(next);
    service_notify("READY=1\nSTATUS=serving");
}

/* Waits for a signal that ends this process: SIGTERM, SIGINT or SIGUSR1 (which it returns).
 * SIGHUP reloads the configuration and waits on. */
static int wait_for_stop(const sigset_t *signals, const config_t *cfg, daemon_parts_t *d, int argc,
                         char **argv)
{
    int sig = 0;
    for (;;) {
        if (sigwait(signals, &sig) != 0) continue;
        if (sig != SIGHUP) return sig;
        log_info("SIGHUP: reloading the configuration");
        daemon_reload(cfg, d, argc, argv);
    }
}

/* Stops intake, drains, and frees every part; with restart, keeps the listening sockets (and
 * the state directory's lock) for the next process and executes it. 0, or 1 when the restart
 * failed. */
static int daemon_stop(daemon_parts_t *d, bool restart, int lock_fd, char *const argv[])
{
    api_listeners_t kept = {-1, -1};
    if (restart) kept = api_server_keep_listeners(d->api);
    api_server_stop_intake(d->api);
    sched_stop(d->sched);
    api_server_free(d->api);
    /* After the server (its /metrics reads the gauges), before the executor goes. */
    gpu_metrics_stop(d->gpu_metrics);
    sched_free(d->sched);
    auth_store_close(d->tokens);
    store_close(d->st);
    if (restart &&
        (store_lock_keep_across_exec(lock_fd) < 0 || restart_exec(argv, kept.tcp, kept.local) < 0))
        return 1;
    log_info("stopped");
    return 0;
}

/* Raises the soft limit on open descriptors to the hard one (LimitNOFILE= in the unit):
 * connections, blob files and the store's files all take one, and the HTTP server sizes its
 * connection limit from it (server.max_connections). */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max) return;
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        log_warn("Failed to raise the descriptor limit from %llu to %llu: %s",
                 (unsigned long long)was, (unsigned long long)rl.rlim_max, strerror(errno));
}

static int run_daemon(const config_t *cfg, const auth_settings_t *auth, int argc, char **argv)
{
    /* Block the signals in every thread; this one waits for them with sigwait(). */
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGHUP);
    sigaddset(&signals, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();

    /* Held until the process ends, and across a restart in place: the store has logged why
     * it was refused. */
    int lock_fd = -1;
    if (store_lock_state_dir(cfg->state_dir, &lock_fd) < 0) return 1;
    daemon_parts_t d = {0};
    if (daemon_start(cfg, auth, &d) != 0) return 1;
    if (auth_settings_open(auth))
        log_warn("auth.mode = none: no access control, for a single-user workstation: every "
                 "local account that connects over TCP is the user 'local' and sees and cancels "
                 "every job of 'local' (allowed only while every listener is loopback); on a "
                 "shared host use the default, auth.mode = token,peercred");
    log_info("gpujobd %s ready", GPUJOBD_VERSION);
    service_notify("READY=1\nSTATUS=serving");

    int sig = wait_for_stop(&signals, cfg, &d, argc, argv);
    bool restart = sig == SIGUSR1;
    if (restart) {
        log_warn("SIGUSR1: draining, then restarting in place on the same sockets (after a "
                 "lost GPU context, the only way to get the GPU back); queued jobs stay queued");
        service_notify("RELOADING=1\nSTATUS=restarting to recover a GPU");
    } else {
        log_info("%s: stopping intake and draining", strsignal(sig));
        service_notify("STOPPING=1\nSTATUS=draining");
    }
    return daemon_stop(&d, restart, lock_fd, argv);
}

/* gpujobd --print-ops: the op table's ops, the test-only ones left out, one a line, each a JSON
 * object with its inputs and params (op_sig_json); scripts/openapi_sync.py generates
 * api/openapi.yaml's OpName enum and per-op job schemas from them. */
static int print_ops(void)
{
    for (int i = 0; i < op_count(); i++) {
        json_t *sig = op_sig_json(op_at(i));
        char *line = sig ? json_dumps(sig, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(sig);
        if (!line) {
            fprintf(stderr, "gpujobd: op '%s': no signature to print\n", op_at(i)->name);
            return 1;
        }
        printf("%s\n", line);
        free(line);
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "token") == 0) return auth_cli_main(argc - 1, argv + 1);
    if (argc == 2 && strcmp(argv[1], "--print-ops") == 0) return print_ops();
    config_t cfg;
    config_action_t action;
    char err[512] = "";
    if (config_from_args(&cfg, argc, argv, &action, err, sizeof err) < 0) {
        fprintf(stderr, "gpujobd: %s\n", err);
        return 2;
    }
    switch (action) {
    case CONFIG_ACTION_HELP:
        fputs(config_usage(), stdout);
        return 0;
    case CONFIG_ACTION_VERSION:
        printf("gpujobd %s\n", GPUJOBD_VERSION);
        return 0;
    case CONFIG_ACTION_CHECK:
    case CONFIG_ACTION_RUN:
        break;
    }
    /* The auth settings are checked with the rest: mode = none beyond loopback never starts. */
    auth_settings_t *auth = NULL;
    if (auth_settings_new(&cfg, &auth, err, sizeof err) < 0) {
        fprintf(stderr, "gpujobd: %s\n", err);
        return 2;
    }
    if (action == CONFIG_ACTION_CHECK) {
        auth_settings_free(auth);
        printf("configuration OK\n");
        return 0;
    }
    /* The state directory holds every user's tensors: whatever the daemon creates there (the
     * databases with their WAL and shared-memory files, blobs, the lock, the crash guard's
     * record, the reserve) is its user's alone. The Unix socket sets its own mode. */
    umask(077);
    log_level_t level = LOG_INFO;
    log_level_parse(cfg.log_level, &level);
    log_set_level(level);
    log_format_t format = LOG_FORMAT_TEXT;
    log_format_parse(cfg.log_format, &format);
    log_set_format(format);
    /* Before any thread exists: the op table is read without locks; the environment. */
    op_table_enable_test_ops(cfg.test_ops);
    restart_init();
    if (cfg.test_ops)
        log_warn("[debug] test_ops is on: jobs may run the test-only ops debug_sleep and "
                 "debug_fault, which can kill a GPU's CUDA context; never use this in production");
    int rc = run_daemon(&cfg, auth, argc, argv);
    auth_settings_free(auth);
    return rc;
}
