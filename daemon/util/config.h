/* gpujobd's configuration: one table of keys (config.c) read from an INI file with inih and
 * overridden by command-line flags. Every key is documented in config/gpujobd.conf. */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The keys of a [user.NAME] or [group.NAME] section: each overrides, for the users it names,
 * the default of the same meaning in [limits] or [scheduler] (daemon/util/policy.h resolves
 * them). */
typedef enum config_policy_key {
    CONFIG_POLICY_MAX_QUEUED,         /* limits.max_queued_per_user */
    CONFIG_POLICY_MAX_RUNNING,        /* limits.max_running_per_user */
    CONFIG_POLICY_MAX_RESIDENT_BYTES, /* limits.max_resident_bytes_per_user */
    CONFIG_POLICY_MAX_STORED_BYTES,   /* limits.max_stored_bytes_per_user */
    CONFIG_POLICY_RATE,               /* limits.requests_per_s_per_user */
    CONFIG_POLICY_BURST,              /* limits.request_burst_per_user */
    CONFIG_POLICY_MAX_JOB_COST_MS,    /* limits.max_job_cost_ms */
    CONFIG_POLICY_MAX_TIME_LIMIT_MS,  /* limits.max_time_limit_ms */
    CONFIG_POLICY_DEVICE_MEMORY_PCT,  /* limits.device_memory_percent_per_user */
    CONFIG_POLICY_WEIGHT,             /* scheduler.weight */
    /* limits.gpu_hours_per_day_per_user and gpu_hours_per_month_per_user: GPU-time budgets,
     * in µs (daemon/util/budget.h) */
    CONFIG_POLICY_GPU_HOURS_PER_DAY,
    CONFIG_POLICY_GPU_HOURS_PER_MONTH,
    CONFIG_POLICY_KEY_COUNT,
} config_policy_key_t;

#define CONFIG_MAX_POLICY_SECTIONS 64
#define CONFIG_POLICY_NAME_SIZE 64 /* a user or group name, as job.h's OWNER_SIZE */

/* One [user.NAME] or [group.NAME] section: the keys it sets (bit k of set for key k). */
typedef struct config_policy_section {
    bool is_group;
    char name[CONFIG_POLICY_NAME_SIZE];
    int line; /* where the section first appears, for messages */
    uint32_t set;
    uint64_t value[CONFIG_POLICY_KEY_COUNT];
} config_policy_section_t;

typedef struct config {
    /* [server] */
    char listen[256];           /* "HOST:PORT"; port 0 picks a free one (logged) */
    char unix_socket[PATH_MAX]; /* "" for none */
    char unix_socket_mode[8];   /* its permissions, octal ("0666") */
    char unix_socket_group[64]; /* its group; "" for the daemon's own */
    char state_dir[PATH_MAX];
    char backend[8];    /* "auto", "cuda", "cpu" */
    char log_level[8];  /* "error", "warn", "info", "debug" */
    char log_format[8]; /* "text", or "json": one JSON object a line */
    int http_threads;
    int max_connections;        /* per listener; 0: sized from the descriptor limit */
    int max_connections_per_ip; /* TCP requests in flight from one address; 0: no limit */
    int idle_timeout_s;      /* an idle HTTP connection is closed after it (long polls excepted) */
    int header_timeout_s;    /* a request's headers must be in within it, however slow */
    int body_timeout_s;      /* and its body within this after its headers */
    int drain_timeout_ms;    /* SIGTERM: how long running work may take to finish */
    char tls_cert[PATH_MAX]; /* PEM certificate chain of the TCP listener; "" for plain HTTP */
    char tls_key[PATH_MAX];  /* PEM private key of tls_cert; set both or neither */

    /* [limits] */
    uint64_t max_body_bytes;      /* one HTTP request body */
    uint64_t max_tensor_bytes;    /* one tensor */
    int max_jobs_per_request;     /* array submissions */
    uint64_t max_json_tree_bytes; /* jansson's memory for one body without its tensor data */
    uint64_t large_parse_bytes;   /* bodies from this size on parse in one of the slots below */
    int max_large_parses;         /* large bodies parsed at once; past it, 503 */
    int max_queued_per_user;      /* queued jobs of one owner; past it, 429 */
    int max_running_per_user;
    uint64_t max_resident_bytes_per_user; /* resident buffers of one owner; 0: no limit */
    uint64_t max_stored_bytes_per_user;   /* buffers of one owner in the store; 0: no limit */
    int requests_per_s_per_user;          /* a user's request rate (token bucket); 0: no limit */
    int request_burst_per_user;           /* requests a user may make at once above the rate */
    int max_job_cost_ms;       /* largest single job by its estimated run time; 0: no limit */
    int default_time_limit_ms; /* time limit of jobs that give none; 0: max_time_limit_ms */
    int max_time_limit_ms;     /* longest time limit a job may ask for; 0: no bound */
    int device_memory_percent_per_user; /* of the device pool, resident + running; 0: none */
    uint64_t max_inline_output_bytes;   /* outputs up to this are inlined in job JSON */
    int max_wait_ms;                    /* longest long-poll a client may ask for */
    /* GPU-time budgets of one user per UTC day and month, in µs (the file gives hours:
     * daemon/util/budget.h); 0: none. */
    uint64_t gpu_hours_per_day_per_user;
    uint64_t gpu_hours_per_month_per_user;

    /* [scheduler] */
    int max_batch;              /* jobs in one batched launch */
    int max_delay_us;           /* how long a partial batch may wait for company */
    int fair_share_half_life_s; /* half-life of the decayed usage fair share compares */
    int commit_delay_us;        /* group-commit window for submissions */
    int default_deadline_ms;    /* 0: none */
    int max_attempts;           /* runs of one job across restarts before it fails */
    int cpu_threads;            /* CPU backend workers; 0 = number of cores */
    uint64_t cpu_memory_cap;    /* CPU backend: its running jobs' inputs and outputs; 0: none */
    int watchdog_min_ms;      /* least time a batch may run before the watchdog fails it; 0: off */
    int watchdog_cost_factor; /* times its estimated run time a batch may take */
    int weight;               /* a user's fair share, relative to the others' */

    /* [store] */
    uint64_t inline_blob_bytes; /* tensors up to this live in SQLite rows, larger in files */
    bool sync_full;             /* synchronous=FULL (fsync each commit) vs NORMAL */
    int shards;                 /* database files the jobs are spread over (store.h) */
    int retention_s;            /* finished jobs and their outputs expire after this */
    int checkpoint_interval_s;  /* WAL checkpoint timer */
    int gc_interval_s;          /* retention sweep timer */
    uint64_t max_bytes;         /* bound on what the store keeps; 0 = none (store.h) */

    /* [gpu] (CUDA backend) */
    char devices[256]; /* "all", "0,2", or GPU UUIDs */
    int streams_per_device;
    int spin_us;                /* a launch's end polled this long before sleeping in the driver */
    uint64_t device_memory_cap; /* bytes per device the pool may hold; 0 = 90% of total */
    int metrics_interval_ms;    /* GPU gauges of /metrics sampled this often; 0 = off */

    /* [auth] (daemon/auth/auth.h) */
    char mode[32];              /* "none", "token", "peercred" or "token,peercred" */
    char admins[1024];          /* users and @groups, comma-separated */
    bool allow_insecure_tokens; /* tokens over plain HTTP beyond loopback */
    char allow_users[1024];     /* who may connect: user names, comma-separated; "" for all */
    char allow_groups[1024];    /* and members of these Unix groups; "" for all */

    /* [debug] */
    bool test_ops; /* show the test-only ops (debug_sleep, debug_fault) */

    /* [user.NAME] and [group.NAME]: per-user policy overrides, in file order. */
    int n_policy_sections;
    config_policy_section_t policy_sections[CONFIG_MAX_POLICY_SECTIONS];
} config_t;

/* A policy key's name in a section ("max_queued"), and the [section] key ("limits.
 * max_queued_per_user") that is its default. */
const char *config_policy_key_name(config_policy_key_t key);
const char *config_policy_key_default(config_policy_key_t key);
/* The default of a policy key, read from cfg's [limits] or [scheduler] field. */
uint64_t config_policy_default(const config_t *cfg, config_policy_key_t key);

/* Fills every field with its default. */
void config_defaults(config_t *cfg);
/* Reads an INI file over cfg. Unknown sections or keys and bad values are errors: returns
 * -EINVAL with "FILE:LINE: [section] key: reason" in err; -errno when the file can't be read. */
int config_load_file(config_t *cfg, const char *path, char *err, size_t err_size);
/* Sets one key by its INI name ("section.key", e.g. "limits.max_body_bytes") from a string,
 * checking type and bounds. 0 or -EINVAL with a reason naming the key in err. */
int config_set(config_t *cfg, const char *section, const char *key, const char *value, char *err,
               size_t err_size);
/* Checks relations between keys (e.g. listen parses as HOST:PORT). 0 or -EINVAL. */
int config_validate(const config_t *cfg, char *err, size_t err_size);
/* Called by config_keep_restart_only for each key whose new value waits for a restart. */
typedef void (*config_kept_fn)(const char *section, const char *key, void *userdata);
/* Before a reload applies next to a running daemon whose configuration is running: gives next
 * running's value of every key that changes only at a restart (the listeners and the HTTP
 * server's shape, the store, the devices, the scheduler's loop and executors, logging, the
 * debug switches), calling kept (NULL: none) for each such key whose value differed. The keys
 * of [limits] and [auth], scheduler.weight, scheduler.default_deadline_ms and every [user.NAME]
 * and [group.NAME] section keep next's values: a reload applies them. Returns how many keys
 * were kept. */
int config_keep_restart_only(config_t *next, const config_t *running, config_kept_fn kept,
                             void *userdata);
/* Whether the TCP listener serves HTTPS (server.tls_cert and tls_key are set). The Unix socket
 * is always plain. */
bool config_tls_enabled(const config_t *cfg);
/* Splits cfg->listen into host and port. 0 or -EINVAL. */
int config_listen_addr(const config_t *cfg, char *host, size_t host_size, int *port);
/* The permission bits server.unix_socket_mode names (checked when it was set). */
unsigned config_unix_socket_mode(const config_t *cfg);

typedef enum config_action {
    CONFIG_ACTION_RUN,
    CONFIG_ACTION_CHECK,   /* --check-config: validate and exit */
    CONFIG_ACTION_VERSION, /* --version */
    CONFIG_ACTION_HELP,    /* --help */
} config_action_t;

/* Builds the configuration from gpujobd's command line: defaults, then the --config file (if
 * given), then the other flags (--listen, --unix-socket, --state-dir, --backend, --log-level)
 * over it, then config_validate().
 * 0, or -EINVAL with a message naming the flag or key in err. */
int config_from_args(config_t *cfg, int argc, char **argv, config_action_t *ret_action, char *err,
                     size_t err_size);
/* The --help text. */
const char *config_usage(void);
