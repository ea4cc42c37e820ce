/* `gpujobd token create|list|revoke`: the admin's hands on the token store, run against the
 * state directory, beside the daemon or without it. */
#define _GNU_SOURCE /* timegm */
#include "auth.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char auth_cli_usage[] =
    "Usage: gpujobd token create --user NAME --name LABEL [--expires DURATION | --expires-at "
    "TIME]\n"
    "       gpujobd token list [--user NAME]\n"
    "       gpujobd token revoke ID\n"
    "Manages the API tokens in STATE_DIR/auth.db; each also takes --config FILE and\n"
    "--state-dir DIR, read as the daemon reads them. create prints the token once, on its own\n"
    "line on stdout: it cannot be shown again. DURATION is a number with s, m, h or d (30d);\n"
    "TIME is YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ, in UTC.\n";

typedef struct cli_args {
    const char *config, *state_dir, *user, *name, *expires, *expires_at;
    int first_operand; /* argv index of the first word after the options */
} cli_args_t;

/* "30d", "12h", "90m", "3600s" or "3600": seconds in *ret. 0 or -EINVAL. */
static int duration_parse(const char *s, int64_t *ret)
{
    char *end;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    int64_t unit = *end == 'd' ? 86400 : *end == 'h' ? 3600 : *end == 'm' ? 60 : 1;
    if (*end && strchr("dhms", *end)) end++;
    if (errno || end == s || *end || n <= 0 || n > INT64_MAX / unit / 2) return -EINVAL;
    *ret = n * unit;
    return 0;
}

/* "YYYY-MM-DD" or "YYYY-MM-DDTHH:MM:SSZ", UTC: seconds since the epoch in *ret. */
static int time_parse(const char *s, int64_t *ret)
{
    struct tm tm = {0};
    const char *end = strptime(s, "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (!end || *end) {
        memset(&tm, 0, sizeof tm);
        end = strptime(s, "%Y-%m-%d", &tm);
    }
    if (!end || *end) return -EINVAL;
    *ret = (int64_t)timegm(&tm);
    return 0;
}

static void time_format(int64_t t, char *buf, size_t size)
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (t == 0 || !gmtime_r(&tt, &tm) || !strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(buf, size, "-");
}

static int args_parse(int argc, char **argv, cli_args_t *ret)
{
    static const struct option options[] = {
        {"config", required_argument, NULL, 'c'},  {"state-dir", required_argument, NULL, 's'},
        {"user", required_argument, NULL, 'u'},    {"name", required_argument, NULL, 'n'},
        {"expires", required_argument, NULL, 'e'}, {"expires-at", required_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    cli_args_t a = {0};
    int c;
    optind = 0;
    opterr = 1;
    while ((c = getopt_long(argc, argv, "c:h", options, NULL)) != -1) {
        const char **slot = c == 'c'   ? &a.config
                            : c == 's' ? &a.state_dir
                            : c == 'u' ? &a.user
                            : c == 'n' ? &a.name
                            : c == 'e' ? &a.expires
                            : c == 'a' ? &a.expires_at
                                       : NULL;
        if (!slot) return -EINVAL;
        *slot = optarg;
    }
    a.first_operand = optind;
    *ret = a;
    return 0;
}

/* The state directory the daemon would use with these --config and --state-dir. */
static int state_dir_of(const cli_args_t *a, char *ret, size_t size)
{
    config_t *cfg = malloc(sizeof *cfg);
    if (!cfg) return -ENOMEM;
    config_defaults(cfg);
    char err[512] = "";
    int r = a->config ? config_load_file(cfg, a->config, err, sizeof err) : 0;
    if (r < 0)
        fprintf(stderr, "gpujobd token: %s\n", err);
    else
        snprintf(ret, size, "%s", a->state_dir ? a->state_dir : cfg->state_dir);
    free(cfg);
    return r;
}

static int cli_create(auth_store_t *st, const cli_args_t *a)
{
    int64_t expires = 0, now = (int64_t)time(NULL), span;
    if (!a->user || !a->name || (a->expires && a->expires_at)) {
        fputs(auth_cli_usage, stderr);
        return 2;
    }
    if (a->expires && duration_parse(a->expires, &span) == 0)
        expires = now + span;
    else if (a->expires_at && time_parse(a->expires_at, &expires) == 0 && expires <= now)
        expires = -1;
    if ((a->expires || a->expires_at) && expires <= 0) {
        fprintf(stderr, "gpujobd token: --expires%s '%s' is not a %s\n", a->expires ? "" : "-at",
                a->expires ? a->expires : a->expires_at,
                a->expires ? "duration such as 30d, 12h or 90m" : "future time such as 2030-01-31");
        return 2;
    }
    char token[AUTH_TOKEN_SIZE], when[32];
    auth_token_info_t info;
    int r = auth_token_create(st, a->user, a->name, expires, &info, token);
    if (r == -EINVAL) {
        fprintf(stderr,
                "gpujobd token: --user and --name must be non-empty, printable and "
                "shorter than %d and %d bytes\n",
                AUTH_USER_SIZE, AUTH_NAME_SIZE);
        return 2;
    }
    if (r < 0) return 1;
    time_format(info.expires, when, sizeof when);
    printf("%s\n", token);
    fprintf(stderr, "token %s '%s' for %s, expires %s; it is shown only this once\n", info.id,
            info.name, info.owner, info.expires ? when : "never");
    return 0;
}

static int cli_list(auth_store_t *st, const cli_args_t *a)
{
    auth_token_info_t *list = NULL;
    size_t n = 0;
    if (auth_token_list(st, a->user, &list, &n) < 0) return 1;
    printf("%-12s  %-20s  %-16s  %-20s  %-20s  %s\n", "ID", "NAME", "OWNER", "CREATED", "EXPIRES",
           "LAST USED");
    for (size_t i = 0; i < n; i++) {
        char created[32], expires[32], used[32];
        time_format(list[i].created, created, sizeof created);
        time_format(list[i].expires, expires, sizeof expires);
        time_format(list[i].last_used, used, sizeof used);
        printf("%-12s  %-20s  %-16s  %-20s  %-20s  %s\n", list[i].id, list[i].name, list[i].owner,
               created, expires, used);
    }
    free(list);
    return 0;
}

static int cli_revoke(auth_store_t *st, const char *id)
{
    int r = auth_token_revoke(st, id, NULL);
    if (r == -ENOENT) fprintf(stderr, "gpujobd token: no token '%.*s'\n", 64, id);
    if (r < 0) return 1;
    printf("revoked %s\n", id);
    return 0;
}

int auth_cli_main(int argc, char **argv)
{
    cli_args_t a;
    const char *verb = argc > 1 ? argv[1] : "";
    if (args_parse(argc - 1, argv + 1, &a) < 0) return 2;
    int operands = argc - 1 - a.first_operand;
    bool ok = (strcmp(verb, "create") == 0 || strcmp(verb, "list") == 0) ? operands == 0
              : strcmp(verb, "revoke") == 0                              ? operands == 1
                                                                         : false;
    if (!ok) {
        fputs(auth_cli_usage, strcmp(verb, "--help") == 0 ? stdout : stderr);
        return strcmp(verb, "--help") == 0 ? 0 : 2;
    }
    char state_dir[PATH_MAX];
    if (state_dir_of(&a, state_dir, sizeof state_dir) < 0) return 2;
    /* The token store is the daemon user's alone, as the rest of the state directory. */
    umask(077);
    auth_store_t *st = NULL;
    if (auth_store_open(state_dir, &st) < 0) return 1;
    int rc = verb[0] == 'c'   ? cli_create(st, &a)
             : verb[0] == 'l' ? cli_list(st, &a)
                              : cli_revoke(st, argv[1 + a.first_operand]);
    auth_store_close(st);
    return rc;
}
