/* gpujobd's command line: the flags, read in two passes (the --config file first, then the
 * other flags over it, whatever their order), and the --help text built from the key table. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_key.h"

/* Flags that are not also single letters get values above any character. */
enum {
    OPT_LISTEN = 256,
    OPT_UNIX_SOCKET,
    OPT_STATE_DIR,
    OPT_BACKEND,
    OPT_LOG_LEVEL,
    OPT_SET,
    OPT_CHECK_CONFIG,
};

static const struct option config_options[] = {
    {"config", required_argument, NULL, 'c'},
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"unix-socket", required_argument, NULL, OPT_UNIX_SOCKET},
    {"state-dir", required_argument, NULL, OPT_STATE_DIR},
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"set", required_argument, NULL, OPT_SET},
    {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
    {"version", no_argument, NULL, 'V'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The leading ':' makes getopt report a missing argument as ':' rather than '?'. */
static const char config_short_options[] = ":c:Vh";

/* The flags that are shorthands for one key. */
static const struct {
    int opt;
    const char *flag, *section, *key;
} config_flag_keys[] = {
    {OPT_LISTEN, "--listen", "server", "listen"},
    {OPT_UNIX_SOCKET, "--unix-socket", "server", "unix_socket"},
    {OPT_STATE_DIR, "--state-dir", "server", "state_dir"},
    {OPT_BACKEND, "--backend", "server", "backend"},
    {OPT_LOG_LEVEL, "--log-level", "server", "log_level"},
};

/* getopt_long accepts unambiguous abbreviations such as --list for --listen. */
static int count_long_options_with_prefix(const char *prefix, int prefix_len)
{
    int count = 0;
    for (const struct option *o = config_options; o->name; o++)
        if (strncmp(o->name, prefix, (size_t)prefix_len) == 0) count++;
    return count;
}

/* Names the option getopt just refused: argv[optind - 1] is the word that held it. */
static void report_bad_option(int c, int argc, char **argv, char *err, size_t err_size)
{
    const char *word = optind >= 1 && optind - 1 < argc ? argv[optind - 1] : "";
    int name_len = (int)strcspn(word, "=");
    bool is_long = strncmp(word, "--", 2) == 0;
    if (c == ':' && is_long)
        config_err_printf(err, err_size, "option '%.*s' requires an argument", name_len, word);
    else if (c == ':')
        config_err_printf(err, err_size, "option '-%c' requires an argument", optopt);
    else if (is_long && optopt != 0)
        config_err_printf(err, err_size, "option '%.*s' does not take an argument", name_len, word);
    else if (is_long && count_long_options_with_prefix(word + 2, name_len - 2) > 1)
        config_err_printf(err, err_size, "ambiguous option '%.*s' (see --help)", name_len, word);
    else if (is_long)
        config_err_printf(err, err_size, "unknown option '%.*s' (see --help)", name_len, word);
    else
        config_err_printf(err, err_size, "unknown option '-%c' (see --help)", optopt);
}

/* Applies one "section.key=value" from --set. */
static int apply_set_flag(config_t *cfg, const char *arg, char *err, size_t err_size)
{
    /* The key follows the last dot before '=': a section may hold dots (user.alice). */
    const char *eq = strchr(arg, '=');
    const char *dot = NULL;
    for (const char *p = arg; eq && p < eq; p++)
        if (*p == '.') dot = p;
    if (!dot || !eq || dot == arg || eq == dot + 1) {
        config_err_printf(err, err_size, "--set: expected SECTION.KEY=VALUE, got '%.*s'",
                          CONFIG_QUOTE_MAX, arg);
        return -EINVAL;
    }
    char section[64], key[64];
    size_t section_len = (size_t)(dot - arg), key_len = (size_t)(eq - dot - 1);
    if (section_len >= sizeof section || key_len >= sizeof key) {
        config_err_printf(err, err_size, "--set: unknown key '%.*s'", (int)(eq - arg), arg);
        return -EINVAL;
    }
    memcpy(section, arg, section_len);
    section[section_len] = '\0';
    memcpy(key, dot + 1, key_len);
    key[key_len] = '\0';
    char reason[768];
    if (config_set(cfg, section, key, eq + 1, reason, sizeof reason) < 0) {
        config_err_printf(err, err_size, "--set: %s", reason);
        return -EINVAL;
    }
    return 0;
}

/* getopt keeps its position in globals: optind = 0 makes glibc start over, so that this may be
 * called more than once (tests do). Not thread-safe, like getopt itself. */
static void getopt_restart(void)
{
    optind = 0;
    opterr = 0;
}

/* What the first pass over the command line finds. */
typedef struct config_args_scan {
    config_action_t action;
    bool help, version;
    const char *config_path; /* borrowed from argv; NULL without --config */
} config_args_scan_t;

/* The first pass: finds the errors in the command line, the action and the --config file, which
 * is read before any other flag whatever its position. The key flags are left to
 * config_apply_flags(). 0 and *ret_scan, or -EINVAL with the error in err. */
static int config_scan_args(int argc, char **argv, config_args_scan_t *ret_scan, char *err,
                            size_t err_size)
{
    config_args_scan_t scan = {.action = CONFIG_ACTION_RUN};
    int c;
    getopt_restart();
    while (argc > 0 &&
           (c = getopt_long(argc, argv, config_short_options, config_options, NULL)) != -1) {
        switch (c) {
        case 'c':
            if (scan.config_path) {
                config_err_printf(err, err_size, "--config given twice ('%.*s' and '%.*s')",
                                  CONFIG_QUOTE_MAX, scan.config_path, CONFIG_QUOTE_MAX, optarg);
                return -EINVAL;
            }
            scan.config_path = optarg;
            break;
        case 'h':
            scan.help = true;
            break;
        case 'V':
            scan.version = true;
            break;
        case OPT_CHECK_CONFIG:
            scan.action = CONFIG_ACTION_CHECK;
            break;
        case ':':
        case '?':
            report_bad_option(c, argc, argv, err, err_size);
            return -EINVAL;
        default:
            break; /* key flags: applied in the second pass */
        }
    }
    if (argc > 0 && optind < argc) {
        config_err_printf(err, err_size, "unexpected argument '%.*s' (see --help)",
                          CONFIG_QUOTE_MAX, argv[optind]);
        return -EINVAL;
    }
    *ret_scan = scan;
    return 0;
}

/* The second pass: applies the key flags to cfg in command-line order, over the file. 0, or a
 * negative errno with the error in err. */
static int config_apply_flags(config_t *cfg, int argc, char **argv, char *err, size_t err_size)
{
    int r = 0, c;
    getopt_restart();
    while (r >= 0 && argc > 0 &&
           (c = getopt_long(argc, argv, config_short_options, config_options, NULL)) != -1) {
        if (c == OPT_SET) {
            r = apply_set_flag(cfg, optarg, err, err_size);
            continue;
        }
        for (size_t i = 0; i < sizeof config_flag_keys / sizeof config_flag_keys[0]; i++) {
            if (config_flag_keys[i].opt != c) continue;
            char reason[768];
            r = config_set(cfg, config_flag_keys[i].section, config_flag_keys[i].key, optarg,
                           reason, sizeof reason);
            if (r < 0) config_err_printf(err, err_size, "%s: %s", config_flag_keys[i].flag, reason);
        }
    }
    return r;
}

int config_from_args(config_t *cfg, int argc, char **argv, config_action_t *ret_action, char *err,
                     size_t err_size)
{
    if (!cfg || !ret_action || argc < 0 || (argc > 0 && !argv)) {
        config_err_printf(err, err_size, "config_from_args: missing argument");
        return -EINVAL;
    }
    config_args_scan_t scan;
    int r = config_scan_args(argc, argv, &scan, err, err_size);
    if (r < 0) return r;

    config_t *next = malloc(sizeof *next);
    if (!next) {
        config_err_printf(err, err_size, "out of memory");
        return -ENOMEM;
    }
    config_defaults(next);
    /* --help and --version answer without reading anything, so that they work whatever state
     * the configuration is in. */
    if (scan.help || scan.version) {
        *cfg = *next;
        free(next);
        *ret_action = scan.help ? CONFIG_ACTION_HELP : CONFIG_ACTION_VERSION;
        return 0;
    }

    if (scan.config_path) r = config_load_file(next, scan.config_path, err, err_size);
    if (r >= 0) r = config_apply_flags(next, argc, argv, err, err_size);
    if (r >= 0) r = config_validate(next, err, err_size);
    if (r >= 0) {
        *cfg = *next;
        *ret_action = scan.action;
    }
    free(next);
    return r;
}

static const char config_usage_head[] =
    "Usage: gpujobd [OPTION]...\n"
    "Runs the GPU job daemon. Its settings are the defaults, then the --config file, then the\n"
    "other options below over it, whatever their order on the command line.\n"
    "\n"
    "Options:\n"
    "  -c, --config FILE            read settings from an INI file (see gpujobd.conf)\n"
    "      --listen HOST:PORT       TCP address to serve on (server.listen); port 0 picks a\n"
    "                               free one; IPv6 as [::1]:8080\n"
    "      --unix-socket PATH       also serve on a Unix socket, whose peer uid is the user\n"
    "                               (server.unix_socket)\n"
    "      --state-dir DIR          job database and blobs (server.state_dir)\n"
    "      --backend auto|cuda|cpu  where jobs run (server.backend)\n"
    "      --log-level error|warn|info|debug\n"
    "                               (server.log_level)\n"
    "      --set SECTION.KEY=VALUE  set any key below, e.g. --set scheduler.max_batch=64\n"
    "      --check-config           check the configuration, print 'configuration OK' and\n"
    "                               exit 0, or print the error and exit 2\n"
    "      --print-ops              print the ops, one a line, each a JSON object with its\n"
    "                               inputs and params, and exit (given alone)\n"
    "  -V, --version                print the version and exit\n"
    "  -h, --help                   print this help and exit\n"
    "\n"
    "Keys, as [SECTION] KEY in the file or SECTION.KEY for --set, with their defaults.\n"
    "Sizes take K, M, G, T, KiB, MiB, GiB or TiB (all powers of 1024); booleans are\n"
    "true/false, yes/no, on/off or 1/0:\n";

static char *config_usage_text;

static void config_usage_build(void)
{
    size_t size = sizeof config_usage_head;
    for (size_t i = 0; i < config_key_count; i++)
        size += strlen(config_keys[i].section) + strlen(config_keys[i].name) +
                strlen(config_keys[i].def) + strlen(config_keys[i].help) + 16;
    char *text = malloc(size);
    if (!text) return;
    size_t used = (size_t)snprintf(text, size, "%s", config_usage_head);
    for (size_t i = 0; i < config_key_count && used < size; i++) {
        const config_key_t *key = &config_keys[i];
        used +=
            (size_t)snprintf(text + used, size - used, "  %s.%s = %s%s\n      %s\n", key->section,
                             key->name, key->def, key->def[0] ? "" : "\"\"", key->help);
    }
    config_usage_text = text;
}

const char *config_usage(void)
{
    /* Built once from the table, so the help lists exactly the keys there are. */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, config_usage_build);
    return config_usage_text ? config_usage_text : config_usage_head;
}
