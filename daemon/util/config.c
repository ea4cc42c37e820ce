/* The configuration: one table of keys (config_keys below) drives the defaults, the INI file,
 * the command-line flags, --check-config and the --help text, so that a key exists in all of
 * them or in none. This file holds the table, its values' parsers and checks, the INI file and
 * what a reload keeps; the [user.NAME] and [group.NAME] sections are in config_policy.c, the
 * command line and --help in config_cli.c (config_key.h is what the three share). */
#include "config.h"
#include "config_key.h"
#include "budget.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

static int check_listen(const char *value, char *reason, size_t reason_size);
static int check_unix_socket(const char *value, char *reason, size_t reason_size);
static int check_socket_mode(const char *value, char *reason, size_t reason_size);
static int check_group_name(const char *value, char *reason, size_t reason_size);
static int check_not_empty(const char *value, char *reason, size_t reason_size);
static int check_devices(const char *value, char *reason, size_t reason_size);

static const char *const backend_choices[] = {"auto", "cuda", "cpu", NULL};
static const char *const log_level_choices[] = {"error", "warn", "info", "debug", NULL};
static const char *const log_format_choices[] = {"text", "json", NULL};
static const char *const auth_mode_choices[] = {"none", "token", "peercred", "token,peercred",
                                                NULL};

/* Each macro refuses, at compile time, a field whose C type does not match the key's type: the
 * array size below is negative (an error) unless _Generic picks the expected type. */
#define FIELD_OF_TYPE(field, ctype)                                                                \
    .offset = offsetof(config_t, field) +                                                          \
              0 * sizeof(char[_Generic(((config_t *)0)->field, ctype : 1, default                  \
                                       : -1)]),                                                    \
    .size = sizeof(((config_t *)0)->field)
#define FIELD_STRING(field)                                                                        \
    .offset = offsetof(config_t, field) +                                                          \
              0 * sizeof(char[_Generic(&((config_t *)0)->field[0], char * : 1, default             \
                                       : -1)]),                                                    \
    .size = sizeof(((config_t *)0)->field)

#define KEY_STRING(sec, field, chk, dflt, hlp)                                                     \
    {                                                                                              \
        .section = sec, .name = #field, .type = CONFIG_STRING, FIELD_STRING(field), .check = chk,  \
        .def = dflt, .help = hlp                                                                   \
    }
#define KEY_ENUM(sec, field, list, dflt, hlp)                                                      \
    {                                                                                              \
        .section = sec, .name = #field, .type = CONFIG_ENUM, FIELD_STRING(field), .choices = list, \
        .def = dflt, .help = hlp                                                                   \
    }
#define KEY_BOOL(sec, field, dflt, hlp)                                                            \
    {                                                                                              \
        .section = sec, .name = #field, .type = CONFIG_BOOL, FIELD_OF_TYPE(field, bool),           \
        .def = dflt, .help = hlp                                                                   \
    }
#define KEY_INT(sec, field, lo, hi, dflt, hlp)                                                     \
    {                                                                                              \
        .section = sec, .name = #field, .type = CONFIG_INT, FIELD_OF_TYPE(field, int), .min = lo,  \
        .max = hi, .def = dflt, .help = hlp                                                        \
    }
/* An int in [lo, hi], or 0 to turn off what the key controls. */
#define KEY_INT_OR_OFF(sec, field, lo, hi, dflt, hlp)                                              \
    {                                                                                              \
        .section = sec, .name = #field, .type = CONFIG_INT, FIELD_OF_TYPE(field, int), .min = lo,  \
        .max = hi, .zero_is_off = true, .def = dflt, .help = hlp                                   \
    }
/* A power of two in [lo, hi]. */
#define KEY_INT_POW2(sec, field, lo, hi, dflt, hlp)                                                \
    {                                                                                              \
        .section = sec, .name = #field, .type = CONFIG_INT, FIELD_OF_TYPE(field, int), .min = lo,  \
        .max = hi, .power_of_two = true, .def = dflt, .help = hlp                                  \
    }
#define KEY_SIZE(sec, field, lo, hi, dflt, hlp)                                                    \
    {                                                                                              \
        .section = sec, .name = #field, .type = CONFIG_SIZE, FIELD_OF_TYPE(field, uint64_t),       \
        .umin = lo, .umax = hi, .def = dflt, .help = hlp                                           \
    }

/* A duration written in hours ("100", "0.5"), kept in µs, at most hi µs; 0 for none. */
#define KEY_HOURS(sec, field, hi, dflt, hlp)                                                       \
    {                                                                                              \
        .section = sec, .name = #field, .type = CONFIG_HOURS, FIELD_OF_TYPE(field, uint64_t),      \
        .umax = hi, .def = dflt, .help = hlp                                                       \
    }

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define TIB (UINT64_C(1) << 40)

const config_key_t config_keys[] = {
    KEY_STRING("server", listen, check_listen, "127.0.0.1:8080",
               "TCP address HOST:PORT (IPv6 as [::1]:8080); port 0 picks a free one"),
    KEY_STRING("server", unix_socket, check_unix_socket, "",
               "also serve on this Unix socket, whose peer uid is the user; empty for none"),
    KEY_STRING("server", unix_socket_mode, check_socket_mode, "0666",
               "permissions of the Unix socket, octal: who may connect to it (0660 with "
               "unix_socket_group: that group's members)"),
    KEY_STRING("server", unix_socket_group, check_group_name, "",
               "group of the Unix socket (a Unix group, which the daemon's user must be in); "
               "empty for the daemon's own"),
    KEY_STRING("server", state_dir, check_not_empty, "/var/lib/gpujobd",
               "directory of the job database and blob files"),
    KEY_ENUM("server", backend, backend_choices, "auto",
             "auto (cuda when a GPU is present, else cpu), cuda or cpu"),
    KEY_ENUM("server", log_level, log_level_choices, "info", "error, warn, info or debug"),
    KEY_ENUM("server", log_format, log_format_choices, "text",
             "text, or json: one JSON object a line"),
    KEY_INT("server", http_threads, 1, 1024, "8", "HTTP worker threads"),
    KEY_INT("server", max_connections, 0, 1000000, "0",
            "open HTTP connections at once, per listener, at most 124 a thread of http_threads; "
            "0: as many as the descriptor limit fits"),
    KEY_INT("server", max_connections_per_ip, 0, 1000000, "64",
            "TCP connections with a request in flight from one client address; 0 for no limit"),
    KEY_INT("server", idle_timeout_s, 1, 86400, "60",
            "seconds an HTTP connection may sit idle, mid-request included, before it is closed"),
    KEY_INT("server", header_timeout_s, 1, 3600, "10",
            "seconds a request's headers may take to arrive, however slowly they trickle in"),
    KEY_INT("server", body_timeout_s, 1, 86400, "300",
            "seconds a request's body may take to arrive once its headers are in"),
    KEY_INT("server", drain_timeout_ms, 0, 3600000, "30000",
            "on SIGTERM, how long running work may take to finish (ms)"),
    KEY_STRING("server", tls_cert, NULL, "",
               "PEM certificate (chain) file: the TCP listener serves HTTPS; empty for HTTP"),
    KEY_STRING("server", tls_key, NULL, "",
               "PEM private key file of tls_cert; set both or neither"),

    KEY_SIZE("limits", max_body_bytes, KIB, 64 * GIB, "256MiB", "one HTTP request body (bytes)"),
    KEY_SIZE("limits", max_tensor_bytes, KIB, TIB, "4GiB", "one tensor (bytes)"),
    KEY_INT("limits", max_jobs_per_request, 1, 1000000, "10000", "jobs in one array submission"),
    KEY_SIZE("limits", max_json_tree_bytes, KIB, 64 * GIB, "64MiB",
             "memory for parsing one job body, its tensor data aside (bytes); past it, 413"),
    KEY_SIZE("limits", large_parse_bytes, 0, 64 * GIB, "1MiB",
             "job bodies from this size on are parsed in one of max_large_parses slots (bytes)"),
    KEY_INT("limits", max_large_parses, 1, 1024, "2",
            "large job bodies parsed at once; past it, 503 with Retry-After"),
    KEY_INT("limits", max_queued_per_user, 0, 100000000, "100000",
            "queued jobs of one user; past it, 429; 0: the user may not submit (403)"),
    KEY_INT("limits", max_running_per_user, 1, 1000000, "1024", "running jobs of one user"),
    KEY_SIZE("limits", max_resident_bytes_per_user, 0, 64 * TIB, "0",
             "bytes of one user's resident buffers (device memory); 0 for no limit"),
    KEY_SIZE("limits", max_stored_bytes_per_user, 0, UINT64_MAX, "0",
             "bytes of one user's buffers in the store; past it, 413; 0 for no limit"),
    KEY_INT("limits", requests_per_s_per_user, 0, 1000000, "0",
            "requests per second one user may make on average; past it, 429 with Retry-After; "
            "0 for no limit"),
    KEY_INT("limits", request_burst_per_user, 1, 1000000, "100",
            "requests one user may make at once on top of requests_per_s_per_user"),
    KEY_INT("limits", max_job_cost_ms, 0, INT_MAX, "0",
            "largest single job by its estimated run time (its op's bytes at 1 GB/s and flops at "
            "100 GFLOP/s, in ms); past it, 413; 0 for no limit"),
    KEY_INT("limits", default_time_limit_ms, 0, INT_MAX, "0",
            "time limit of a job that gives no time_limit_ms (ms); 0 for max_time_limit_ms"),
    KEY_INT("limits", max_time_limit_ms, 0, INT_MAX, "86400000",
            "longest time_limit_ms a job may ask for (ms); past it, 422; 0 for no bound"),
    KEY_INT("limits", device_memory_percent_per_user, 0, 100, "50",
            "percent of the device memory pool one user's resident buffers and running jobs "
            "may hold; 0 for no limit"),
    KEY_SIZE("limits", max_inline_output_bytes, 0, GIB, "64KiB",
             "outputs up to this size are inlined in a job's JSON (bytes)"),
    KEY_INT("limits", max_wait_ms, 0, 86400000, "300000",
            "longest long-poll a client may ask for (ms)"),
    KEY_HOURS("limits", gpu_hours_per_day_per_user, BUDGET_MAX_US, "0",
              "GPU time one user's jobs may be charged per calendar day (UTC), in hours; past "
              "it, submissions answer 429 until the next day; 0 for no budget"),
    KEY_HOURS("limits", gpu_hours_per_month_per_user, BUDGET_MAX_US, "0",
              "GPU time one user's jobs may be charged per calendar month (UTC), in hours; past "
              "it, submissions answer 429 until the next month; 0 for no budget"),

    KEY_INT("scheduler", max_batch, 1, 65536, "256", "jobs in one batched launch"),
    KEY_INT("scheduler", max_delay_us, 0, 1000000, "200",
            "how long a partial batch may wait for company (us)"),
    KEY_INT("scheduler", fair_share_half_life_s, 1, 31536000, "604800",
            "half-life of the recent device time fair share compares users by (s); days, as "
            "a lab's fairness is over days of use"),
    KEY_INT("scheduler", commit_delay_us, 0, 1000000, "0",
            "group-commit window for submissions (us); 0: the loop's next turn"),
    KEY_INT("scheduler", default_deadline_ms, 0, INT_MAX, "0",
            "deadline of jobs that give none (ms); 0 for none"),
    KEY_INT("scheduler", max_attempts, 1, 100, "3",
            "runs of one job across restarts before it fails"),
    KEY_INT("scheduler", cpu_threads, 0, 1024, "0", "CPU backend workers; 0 for one per core"),
    KEY_SIZE("scheduler", cpu_memory_cap, 0, UINT64_MAX, "0",
             "memory the CPU backend's running jobs may hold at once, their inputs and outputs "
             "(bytes); a batch past it waits; 0 for no bound"),
    KEY_INT("scheduler", watchdog_min_ms, 0, INT_MAX, "60000",
            "a batch running past max(this, watchdog_cost_factor x its estimated time) fails "
            "and its device is recovered (ms); 0 disables the watchdog"),
    KEY_INT("scheduler", watchdog_cost_factor, 1, 1000000, "10",
            "how many times its cost estimate a batch may run before the watchdog fires"),
    KEY_INT("scheduler", weight, 1, 1000, "1",
            "a user's fair share of the devices: a user of weight 3 gets three times the share "
            "of a user of weight 1 when both have work queued"),

    KEY_SIZE("store", inline_blob_bytes, 0, 512 * MIB, "65536",
             "tensors up to this size live in database rows, larger ones in files (bytes)"),
    KEY_BOOL("store", sync_full, "true",
             "answer submissions once their commit is fsync'd (they run meanwhile), or fsync none"),
    KEY_INT_POW2("store", shards, 1, 16, "1", /* STORE_MAX_SHARDS */
                 "database files the jobs are spread over, so that their writes run side by side: "
                 "1, 2, 4, 8 or 16; fixed when the state directory is created"),
    KEY_INT("store", retention_s, 60, INT_MAX, "604800",
            "finished jobs and their outputs expire after this (s)"),
    KEY_INT("store", checkpoint_interval_s, 1, 86400, "60", "WAL checkpoint period (s)"),
    KEY_INT("store", gc_interval_s, 1, 86400, "300", "retention sweep period (s)"),
    KEY_SIZE("store", max_bytes, 0, UINT64_MAX, "0",
             "bound on the bytes the store keeps (database pages in use and blob files); past "
             "it the oldest finished jobs' outputs go, then those jobs; 0 for none (bytes)"),

    KEY_STRING("gpu", devices, check_devices, "all",
               "GPUs to use: all, or a list of indices or UUIDs such as 0,2"),
    KEY_INT("gpu", streams_per_device, 1, 64, "4", "CUDA streams per GPU"),
    KEY_INT("gpu", spin_us, 0, 10000, "100",
            "a launch's end is polled for this long before its waiter sleeps in the driver (µs)"),
    KEY_SIZE("gpu", device_memory_cap, 0, UINT64_MAX, "0",
             "device memory the pool may hold per GPU (bytes); 0 for 90% of the total"),
    KEY_INT_OR_OFF("gpu", metrics_interval_ms, 100, 60000, "1000",
                   "GPU utilisation, memory, temperature and power for /metrics are sampled "
                   "this often (ms); 0 for never"),

    KEY_ENUM("auth", mode, auth_mode_choices, "token,peercred",
             "who the caller is: none (no access control, for a single-user workstation; every "
             "listener must be loopback), token (a Bearer token), peercred (the account the "
             "kernel names: the Unix socket's peer uid, a loopback TCP client's socket owner) "
             "or token,peercred (both; a Bearer token over TCP, else the kernel's answer)"),
    KEY_STRING("auth", admins, NULL, "",
               "admins, who see and manage every user's jobs, buffers and tokens: user names "
               "and @groups, comma-separated"),
    KEY_BOOL("auth", allow_insecure_tokens, "false",
             "accept tokens over plain HTTP on a listener beyond loopback, where anyone on the "
             "path can read them (otherwise such a listener needs server.tls_cert)"),
    KEY_STRING("auth", allow_users, NULL, "",
               "who may connect, on both transports: user names, comma-separated; with "
               "allow_groups, either admits; both empty for everyone (admins always may)"),
    KEY_STRING("auth", allow_groups, NULL, "",
               "who may connect: members of these Unix groups (NSS), comma-separated"),

    KEY_BOOL("debug", test_ops, "false",
             "offer the test-only ops debug_sleep and debug_fault (never in production)"),
};

#define CONFIG_KEY_COUNT (sizeof config_keys / sizeof config_keys[0])

const size_t config_key_count = CONFIG_KEY_COUNT;

static const char *const config_sections[] = {"server", "limits", "scheduler", "store",
                                              "gpu",    "auth",   "debug"};

void config_err_printf(char *err, size_t err_size, const char *fmt, ...)
{
    if (!err || err_size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
}

const config_key_t *config_key_find(const char *section, const char *name)
{
    for (size_t i = 0; i < CONFIG_KEY_COUNT; i++)
        if (strcmp(config_keys[i].section, section) == 0 && strcmp(config_keys[i].name, name) == 0)
            return &config_keys[i];
    return NULL;
}

static bool section_exists(const char *section)
{
    for (size_t i = 0; i < sizeof config_sections / sizeof config_sections[0]; i++)
        if (strcmp(config_sections[i], section) == 0) return true;
    return false;
}

/* Finds section/name in the table, or explains why not in reason (unknown section, unknown key,
 * or a key that lives in another section). */
static const config_key_t *key_lookup(const char *section, const char *name, char *reason,
                                      size_t reason_size)
{
    const config_key_t *key = config_key_find(section, name);
    if (key) return key;
    if (!section_exists(section)) {
        snprintf(reason, reason_size,
                 "unknown section '%.*s' (sections: server, limits, scheduler, store, gpu, "
                 "auth, debug, user.NAME, group.NAME)",
                 CONFIG_QUOTE_MAX, section);
        return NULL;
    }
    for (size_t i = 0; i < CONFIG_KEY_COUNT; i++)
        if (strcmp(config_keys[i].name, name) == 0) {
            snprintf(reason, reason_size, "unknown key '%.*s' in [%s] (it belongs in [%s])",
                     CONFIG_QUOTE_MAX, name, section, config_keys[i].section);
            return NULL;
        }
    snprintf(reason, reason_size, "unknown key '%.*s' in [%s]", CONFIG_QUOTE_MAX, name, section);
    return NULL;
}

/* Writes n as the largest binary unit that divides it exactly ("256MiB", "65537"). */
static void size_format(uint64_t n, char *buf, size_t buf_size)
{
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    static const uint64_t scales[] = {TIB, GIB, MIB, KIB};
    for (size_t i = 0; n != 0 && i < 4; i++)
        if (n % scales[i] == 0) {
            snprintf(buf, buf_size, "%" PRIu64 "%s", n / scales[i], units[i]);
            return;
        }
    snprintf(buf, buf_size, "%" PRIu64, n);
}

int config_parse_int(const char *value, int64_t min, int64_t max, int64_t *ret, char *reason,
                     size_t reason_size)
{
    /* strtoll would skip leading blanks: a plain integer starts with a digit or a sign. */
    if (!isdigit((unsigned char)value[0]) &&
        !((value[0] == '-' || value[0] == '+') && isdigit((unsigned char)value[1]))) {
        snprintf(reason, reason_size, "expected an integer, got '%.*s'", CONFIG_QUOTE_MAX, value);
        return -EINVAL;
    }
    char *end = NULL;
    errno = 0;
    long long n = strtoll(value, &end, 10);
    if (*end != '\0') {
        snprintf(reason, reason_size, "expected an integer, got '%.*s'", CONFIG_QUOTE_MAX, value);
        return -EINVAL;
    }
    if (errno == ERANGE || n < min || n > max) {
        snprintf(reason, reason_size, "%.*s is out of range (%" PRId64 "..%" PRId64 ")",
                 CONFIG_QUOTE_MAX, value, min, max);
        return -ERANGE;
    }
    *ret = n;
    return 0;
}

int config_parse_size(const char *value, uint64_t min, uint64_t max, uint64_t *ret, char *reason,
                      size_t reason_size)
{
    static const struct {
        const char *suffix;
        uint64_t scale;
    } suffixes[] = {
        {"", 1},    {"K", KIB},   {"KiB", KIB}, {"M", MIB},   {"MiB", MIB},
        {"G", GIB}, {"GiB", GIB}, {"T", TIB},   {"TiB", TIB},
    };
    if (!isdigit((unsigned char)value[0])) {
        snprintf(reason, reason_size,
                 "expected a size in bytes with an optional K, M, G, T, KiB, MiB, GiB or TiB "
                 "suffix, got '%.*s'",
                 CONFIG_QUOTE_MAX, value);
        return -EINVAL;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(value, &end, 10);
    bool overflow = errno == ERANGE;
    while (*end == ' ')
        end++;
    uint64_t scale = 0;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++)
        if (strcmp(end, suffixes[i].suffix) == 0) scale = suffixes[i].scale;
    if (scale == 0) {
        snprintf(reason, reason_size,
                 "bad size suffix '%.*s' in '%.*s' (expected K, M, G, T, KiB, MiB, GiB or TiB)",
                 CONFIG_QUOTE_MAX, end, CONFIG_QUOTE_MAX, value);
        return -EINVAL;
    }
    char lo[32], hi[32];
    size_format(min, lo, sizeof lo);
    size_format(max, hi, sizeof hi);
    if (overflow || n > UINT64_MAX / scale || n * scale < min || n * scale > max) {
        snprintf(reason, reason_size, "%.*s is out of range (%s..%s)", CONFIG_QUOTE_MAX, value, lo,
                 hi);
        return -EINVAL;
    }
    *ret = n * scale;
    return 0;
}

static int parse_bool(const char *value, bool *ret, char *reason, size_t reason_size)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(value, yes[i]) == 0) {
            *ret = true;
            return 0;
        }
        if (strcasecmp(value, no[i]) == 0) {
            *ret = false;
            return 0;
        }
    }
    snprintf(reason, reason_size, "expected true/false, yes/no, on/off or 1/0, got '%.*s'",
             CONFIG_QUOTE_MAX, value);
    return -EINVAL;
}

/* Values are matched ignoring case ("CPU"); a field set directly must hold the canonical
 * spelling, since the rest of the daemon compares with strcmp(). */
static int parse_enum(const char *value, const char *const *choices, bool ignore_case,
                      const char **ret, char *reason, size_t reason_size)
{
    char list[128] = "";
    for (size_t i = 0; choices[i]; i++) {
        if ((ignore_case ? strcasecmp(value, choices[i]) : strcmp(value, choices[i])) == 0) {
            *ret = choices[i];
            return 0;
        }
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", choices[i]);
    }
    snprintf(reason, reason_size, "expected one of %s, got '%.*s'", list, CONFIG_QUOTE_MAX, value);
    return -EINVAL;
}

/* Splits "HOST:PORT" or "[IPV6]:PORT"; the host comes back without brackets, ready for
 * getaddrinfo(). Outputs are written only on success. */
static int listen_parse(const char *value, char *host, size_t host_size, int *ret_port,
                        char *reason, size_t reason_size)
{
    const char *host_start = value, *host_end = NULL, *port = NULL;
    if (value[0] == '[') {
        host_start = value + 1;
        host_end = strchr(host_start, ']');
        if (host_end && host_end[1] == ':') port = host_end + 2;
    } else {
        host_end = strrchr(value, ':');
        if (host_end) port = host_end + 1;
        /* A bare IPv6 address cannot be told apart from its port. */
        if (host_end && memchr(value, ':', (size_t)(host_end - value))) {
            snprintf(reason, reason_size,
                     "expected HOST:PORT, got '%.*s' (write IPv6 addresses as [::1]:8080)",
                     CONFIG_QUOTE_MAX, value);
            return -EINVAL;
        }
    }
    if (!port || host_end == host_start) {
        snprintf(reason, reason_size, "expected HOST:PORT (IPv6 as [::1]:8080), got '%.*s'",
                 CONFIG_QUOTE_MAX, value);
        return -EINVAL;
    }
    int64_t port_number = 0;
    if (port[0] == '+' || port[0] == '-' ||
        config_parse_int(port, 0, 65535, &port_number, reason, reason_size) < 0) {
        snprintf(reason, reason_size, "port '%.*s' in '%.*s' is not a number in 0..65535",
                 CONFIG_QUOTE_MAX, port, CONFIG_QUOTE_MAX, value);
        return -EINVAL;
    }
    size_t host_len = (size_t)(host_end - host_start);
    if (host && host_len >= host_size) {
        snprintf(reason, reason_size, "host in '%.*s' is longer than %zu bytes", CONFIG_QUOTE_MAX,
                 value, host_size - 1);
        return -EINVAL;
    }
    if (host) {
        memcpy(host, host_start, host_len);
        host[host_len] = '\0';
    }
    *ret_port = (int)port_number;
    return 0;
}

static int check_listen(const char *value, char *reason, size_t reason_size)
{
    int port = 0;
    return listen_parse(value, NULL, 0, &port, reason, reason_size);
}

static int check_unix_socket(const char *value, char *reason, size_t reason_size)
{
    /* bind() takes at most sizeof(sun_path) - 1 bytes of path; say so now, not at startup. */
    size_t max = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
    if (strlen(value) > max) {
        snprintf(reason, reason_size,
                 "'%.*s...' is longer than %zu bytes, the limit of a Unix socket path",
                 CONFIG_QUOTE_MAX, value, max);
        return -EINVAL;
    }
    return 0;
}

/* Permission bits in octal, 0 to 0777, such as 0660. */
static int check_socket_mode(const char *value, char *reason, size_t reason_size)
{
    size_t len = strlen(value);
    if (len < 3 || len > 4 || strspn(value, "01234567") != len || (len == 4 && value[0] != '0')) {
        snprintf(reason, reason_size,
                 "expected permission bits in octal, 000 to 0777 (such as 0660), got '%.*s'",
                 CONFIG_QUOTE_MAX, value);
        return -EINVAL;
    }
    return 0;
}

unsigned config_unix_socket_mode(const config_t *cfg)
{
    return (unsigned)strtoul(cfg->unix_socket_mode, NULL, 8) & 0777;
}

/* A group name: empty (none), or printable characters without blanks, commas or ':'. */
static int check_group_name(const char *value, char *reason, size_t reason_size)
{
    for (const char *p = value; *p; p++)
        if (!isgraph((unsigned char)*p) || *p == ',' || *p == ':') {
            snprintf(reason, reason_size, "'%.*s' is not a group name", CONFIG_QUOTE_MAX, value);
            return -EINVAL;
        }
    return 0;
}

static int check_not_empty(const char *value, char *reason, size_t reason_size)
{
    if (value[0] == '\0') {
        snprintf(reason, reason_size, "must not be empty");
        return -EINVAL;
    }
    return 0;
}

/* "all", or a comma-separated list of indices and GPU/MIG UUIDs, each named once. */
static int check_devices(const char *value, char *reason, size_t reason_size)
{
    if (strcmp(value, "all") == 0) return 0;
    const char *p = value;
    for (;;) {
        size_t len = strcspn(p, ",");
        bool is_index = len > 0 && len <= 4 && strspn(p, "0123456789") == len;
        bool is_uuid = len > 4 && (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0) &&
                       strcspn(p, " \t") >= len;
        if (!is_index && !is_uuid) {
            snprintf(reason, reason_size,
                     "expected 'all' or a comma-separated list of device indices or UUIDs "
                     "(GPU-..., MIG-...), got '%.*s'",
                     CONFIG_QUOTE_MAX, value);
            return -EINVAL;
        }
        for (const char *q = value; q < p; q += strcspn(q, ",") + 1)
            if (strcspn(q, ",") == len && strncmp(q, p, len) == 0) {
                snprintf(reason, reason_size, "device '%.*s' is listed twice in '%.*s'", (int)len,
                         p, CONFIG_QUOTE_MAX, value);
                return -EINVAL;
            }
        if (p[len] == '\0') return 0;
        p += len + 1;
    }
}

static bool int_key_allows(const config_key_t *key, int64_t n)
{
    return (n >= key->min && n <= key->max && (!key->power_of_two || (n & (n - 1)) == 0)) ||
           (key->zero_is_off && n == 0);
}

/* An int key's range as messages give it: "1..1024", "0, or 100..60000", or "a power of two in
 * 1..16". */
static void int_key_range(const config_key_t *key, char *buf, size_t buf_size)
{
    snprintf(buf, buf_size, "%s%s%" PRId64 "..%" PRId64, key->zero_is_off ? "0, or " : "",
             key->power_of_two ? "a power of two in " : "", key->min, key->max);
}

/* Parses value for key and stores it in cfg; cfg is untouched on error, and reason says why
 * (without naming the key: callers add the file, line or flag). */
static int key_set(config_t *cfg, const config_key_t *key, const char *value, char *reason,
                   size_t reason_size)
{
    /* A value in double quotes means the same as without them, as in most INI dialects. */
    char unquoted[PATH_MAX + 2];
    size_t len = strlen(value);
    if (len >= 2 && value[0] == '"' && value[len - 1] == '"' && len - 2 < sizeof unquoted) {
        memcpy(unquoted, value + 1, len - 2);
        unquoted[len - 2] = '\0';
        value = unquoted;
        len -= 2;
    }

    void *field = config_key_field(cfg, key);
    switch (key->type) {
    case CONFIG_STRING:
        if (len >= key->size) {
            snprintf(reason, reason_size, "'%.*s...' is longer than %zu bytes", CONFIG_QUOTE_MAX,
                     value, key->size - 1);
            return -EINVAL;
        }
        if (key->check && key->check(value, reason, reason_size) < 0) return -EINVAL;
        /* Zero the tail too, so that equal configurations compare equal byte for byte. */
        memset(field, 0, key->size);
        memcpy(field, value, len);
        return 0;
    case CONFIG_ENUM: {
        const char *choice = NULL;
        if (parse_enum(value, key->choices, true, &choice, reason, reason_size) < 0) return -EINVAL;
        memset(field, 0, key->size);
        snprintf(field, key->size, "%s", choice);
        return 0;
    }
    case CONFIG_BOOL:
        return parse_bool(value, (bool *)field, reason, reason_size);
    case CONFIG_INT: {
        int64_t n = 0;
        int r = config_parse_int(value, key->zero_is_off ? 0 : key->min, key->max, &n, reason,
                                 reason_size);
        if (r == -ERANGE || (r == 0 && !int_key_allows(key, n))) {
            char range[64];
            int_key_range(key, range, sizeof range);
            snprintf(reason, reason_size, "%.*s is out of range (%s)", CONFIG_QUOTE_MAX, value,
                     range);
            return -EINVAL;
        }
        if (r < 0) return -EINVAL;
        *(int *)field = (int)n;
        return 0;
    }
    case CONFIG_SIZE:
        return config_parse_size(value, key->umin, key->umax, (uint64_t *)field, reason,
                                 reason_size);
    case CONFIG_HOURS:
        return budget_parse_hours(value, key->umax, (uint64_t *)field, reason, reason_size);
    }
    snprintf(reason, reason_size, "internal error: unknown key type");
    return -EINVAL;
}

/* Checks the value a field holds now against its key, as key_set() would have. */
static int key_check(const config_t *cfg, const config_key_t *key, char *reason, size_t reason_size)
{
    const void *field = config_key_field_const(cfg, key);
    switch (key->type) {
    case CONFIG_STRING:
    case CONFIG_ENUM: {
        if (!memchr(field, '\0', key->size)) {
            snprintf(reason, reason_size, "is not a terminated string");
            return -EINVAL;
        }
        if (key->type == CONFIG_ENUM) {
            const char *choice = NULL;
            return parse_enum(field, key->choices, false, &choice, reason, reason_size);
        }
        return key->check ? key->check(field, reason, reason_size) : 0;
    }
    case CONFIG_BOOL:
        return 0;
    case CONFIG_INT: {
        int n = *(const int *)field;
        if (!int_key_allows(key, n)) {
            char range[64];
            int_key_range(key, range, sizeof range);
            snprintf(reason, reason_size, "%d is out of range (%s)", n, range);
            return -EINVAL;
        }
        return 0;
    }
    case CONFIG_SIZE: {
        uint64_t n = *(const uint64_t *)field;
        if (n < key->umin || n > key->umax) {
            char lo[32], hi[32];
            size_format(key->umin, lo, sizeof lo);
            size_format(key->umax, hi, sizeof hi);
            snprintf(reason, reason_size, "%" PRIu64 " is out of range (%s..%s)", n, lo, hi);
            return -EINVAL;
        }
        return 0;
    }
    case CONFIG_HOURS: {
        uint64_t n = *(const uint64_t *)field;
        if (n > key->umax) {
            char hi[32];
            budget_format_hours(key->umax, hi, sizeof hi);
            snprintf(reason, reason_size, "%" PRIu64 " us is out of range (0..%s hours)", n, hi);
            return -EINVAL;
        }
        return 0;
    }
    }
    return 0;
}

void config_defaults(config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < CONFIG_KEY_COUNT; i++) {
        /* The defaults are constants that tests parse too: this cannot fail. */
        char reason[256];
        key_set(cfg, &config_keys[i], config_keys[i].def, reason, sizeof reason);
    }
}

int config_set(config_t *cfg, const char *section, const char *key, const char *value, char *err,
               size_t err_size)
{
    if (!cfg || !section || !key || !value) {
        config_err_printf(err, err_size, "config_set: missing section, key or value");
        return -EINVAL;
    }
    char reason[512];
    int r = config_policy_set(cfg, section, key, value, 0, false, reason, sizeof reason);
    if (r == 0) return 0;
    const config_key_t *k = r == -ENOENT ? key_lookup(section, key, reason, sizeof reason) : NULL;
    if (!k || key_set(cfg, k, value, reason, sizeof reason) < 0) {
        config_err_printf(err, err_size, "%.*s.%.*s: %s", CONFIG_QUOTE_MAX, section,
                          CONFIG_QUOTE_MAX, key, reason);
        return -EINVAL;
    }
    return 0;
}

/* State of one config_load_file(): inih calls ini_read_line() for every line and ini_handle()
 * for every key, so the reader's count is the handler's line number. */
typedef struct ini_load {
    config_t cfg; /* the file is applied to this copy, copied out only if all of it is good */
    const char *path;
    FILE *file;
    int line;
    int err_line;                   /* line of the first error found by us, 0 if none */
    int err_errno;                  /* a read error */
    int key_line[CONFIG_KEY_COUNT]; /* where each key was set, to refuse a second setting */
    char err[1024];
} ini_load_t;

static char *ini_read_line(char *str, int num, void *stream)
{
    ini_load_t *load = stream;
    /* Stop at the first error: what follows would only be reported after it. */
    if (load->err_line || load->err_errno) return NULL;
    if (!fgets(str, num, load->file)) {
        if (ferror(load->file)) load->err_errno = errno ? errno : EIO;
        return NULL;
    }
    load->line++;
    /* inih would read the rest of a line longer than its buffer as a line of its own. */
    if (!strchr(str, '\n') && !feof(load->file)) {
        load->err_line = load->line;
        snprintf(load->err, sizeof load->err, "%s:%d: line longer than %d characters", load->path,
                 load->line, num - 2);
        return NULL;
    }
    return str;
}

static int ini_handle(void *user, const char *section, const char *name, const char *value)
{
    ini_load_t *load = user;
    if (load->err_line) return 0;
    char reason[512];
    const config_key_t *key = NULL;
    if (section[0] == '\0') {
        snprintf(load->err, sizeof load->err,
                 "%s:%d: %.*s: key outside any section (sections: server, limits, scheduler, "
                 "store, gpu, auth, debug, user.NAME, group.NAME)",
                 load->path, load->line, CONFIG_QUOTE_MAX, name);
        load->err_line = load->line;
        return 0;
    }
    int r = config_policy_set(&load->cfg, section, name, value, load->line, true, reason,
                              sizeof reason);
    if (r == 0) return 1;
    if (r == -ENOENT) key = key_lookup(section, name, reason, sizeof reason);
    if (key) {
        size_t index = (size_t)(key - config_keys);
        if (load->key_line[index]) {
            snprintf(reason, sizeof reason, "set twice (first on line %d)", load->key_line[index]);
            key = NULL;
        } else if (key_set(&load->cfg, key, value, reason, sizeof reason) < 0) {
            key = NULL;
        } else {
            load->key_line[index] = load->line;
        }
    }
    if (!key) {
        snprintf(load->err, sizeof load->err, "%s:%d: [%.*s] %.*s: %s", load->path, load->line,
                 CONFIG_QUOTE_MAX, section, CONFIG_QUOTE_MAX, name, reason);
        load->err_line = load->line;
        return 0;
    }
    return 1;
}

int config_load_file(config_t *cfg, const char *path, char *err, size_t err_size)
{
    if (!cfg || !path) {
        config_err_printf(err, err_size, "config_load_file: missing configuration or path");
        return -EINVAL;
    }
    ini_load_t *load = calloc(1, sizeof *load);
    if (!load) {
        config_err_printf(err, err_size, "%s: out of memory", path);
        return -ENOMEM;
    }
    load->cfg = *cfg;
    load->path = path;
    load->file = fopen(path, "re");
    if (!load->file) {
        int r = -errno;
        config_err_printf(err, err_size, "cannot read '%s': %s", path, strerror(-r));
        free(load);
        return r;
    }
    int line = ini_parse_stream(ini_read_line, load, ini_handle, load);
    fclose(load->file);

    int r = 0;
    if (line > 0 && (load->err_line == 0 || line < load->err_line)) {
        config_err_printf(err, err_size,
                          "%s:%d: syntax error: expected '[section]' or 'key = value'", path, line);
        r = -EINVAL;
    } else if (load->err_line) {
        config_err_printf(err, err_size, "%s", load->err);
        r = -EINVAL;
    } else if (load->err_errno) {
        r = -load->err_errno;
        config_err_printf(err, err_size, "cannot read '%s': %s", path, strerror(-r));
    } else if (line < 0) {
        r = -ENOMEM;
        config_err_printf(err, err_size, "%s: out of memory", path);
    } else {
        *cfg = load->cfg;
    }
    free(load);
    return r;
}

int config_listen_addr(const config_t *cfg, char *host, size_t host_size, int *port)
{
    if (!cfg || !host || host_size == 0 || !port) return -EINVAL;
    char reason[256];
    return listen_parse(cfg->listen, host, host_size, port, reason, sizeof reason);
}

int config_validate(const config_t *cfg, char *err, size_t err_size)
{
    if (!cfg) {
        config_err_printf(err, err_size, "config_validate: no configuration");
        return -EINVAL;
    }
    for (size_t i = 0; i < CONFIG_KEY_COUNT; i++) {
        char reason[512];
        if (key_check(cfg, &config_keys[i], reason, sizeof reason) < 0) {
            config_err_printf(err, err_size, "%s.%s: %s", config_keys[i].section,
                              config_keys[i].name, reason);
            return -EINVAL;
        }
    }
    if (!cfg->tls_cert[0] != !cfg->tls_key[0]) {
        config_err_printf(err, err_size, "server.%s: must be set with server.%s (both or neither)",
                          cfg->tls_cert[0] ? "tls_key" : "tls_cert",
                          cfg->tls_cert[0] ? "tls_cert" : "tls_key");
        return -EINVAL;
    }
    return 0;
}

/* Whether a reload applies a new value of key (config.h, config_keep_restart_only): the
 * [limits] and [auth] keys are read by each request as it begins or through the per-user
 * policy, which a reload swaps (policy.h); so are the fair-share weight and the deadline of
 * jobs that give none. Every other key shapes something built once at start. */
static bool key_reloads(const config_key_t *key)
{
    if (strcmp(key->section, "limits") == 0 || strcmp(key->section, "auth") == 0) return true;
    return strcmp(key->section, "scheduler") == 0 &&
           (strcmp(key->name, "weight") == 0 || strcmp(key->name, "default_deadline_ms") == 0);
}

int config_keep_restart_only(config_t *next, const config_t *running, config_kept_fn kept,
                             void *userdata)
{
    int n = 0;
    for (size_t i = 0; i < CONFIG_KEY_COUNT; i++) {
        const config_key_t *key = &config_keys[i];
        if (key_reloads(key)) continue;
        /* Strings are zero-padded (key_set), so equal values compare equal byte for byte. */
        void *field = config_key_field(next, key);
        const void *was = config_key_field_const(running, key);
        if (memcmp(field, was, key->size) == 0) continue;
        memcpy(field, was, key->size);
        if (kept) kept(key->section, key->name, userdata);
        n++;
    }
    return n;
}

bool config_tls_enabled(const config_t *cfg)
{
    return cfg->tls_cert[0] && cfg->tls_key[0];
}
