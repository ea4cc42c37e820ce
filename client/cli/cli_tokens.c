/* `gpujob token create|list|revoke`: the user's own API tokens, through the daemon. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* "90d", "12h", "30m", "45s", "2w" or plain seconds, 1 s to ten years: 0 or -EINVAL. */
static int parse_duration(const char *text, int64_t *ret)
{
    static const struct {
        char unit;
        int64_t s;
    } units[] = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}, {'w', 7 * 86400}};
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || v < 1 || errno == ERANGE || text[0] == '-' || text[0] == '+') return -EINVAL;
    int64_t scale = end[0] ? 0 : 1;
    for (size_t i = 0; i < sizeof units / sizeof units[0] && end[0] && !end[1]; i++)
        if (end[0] == units[i].unit) scale = units[i].s;
    const int64_t ten_years = 10LL * 366 * 86400;
    if (scale == 0 || v > ten_years / scale) return -EINVAL;
    *ret = v * scale;
    return 0;
}

static json_t *token_json(const gpujob_token_t *t)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "id", t->id, "name", t->name, "owner", t->owner,
                          "created_at", t->created_at);
    json_object_set_new(o, "expires_at",
                        t->expires_at[0] ? json_string(t->expires_at) : json_null());
    json_object_set_new(o, "last_used_at",
                        t->last_used_at[0] ? json_string(t->last_used_at) : json_null());
    return o;
}

/* token create: the token's text alone on stdout (for $(...)), what it is on stderr. */
static int token_create(cli_t *cli, const char *name, int64_t expires_in_s)
{
    gpujob_token_t t;
    char text[GPUJOB_TOKEN_SIZE];
    int r = gpujob_token_create(cli->client, name, expires_in_s, &t, text);
    if (r < 0) return cli_api_error(cli, "token create", r);
    if (cli->json) {
        json_t *o = token_json(&t);
        json_object_set_new(o, "token", json_string(text));
        cli_print_json(o);
    } else {
        printf("%s\n", text);
        fprintf(stderr,
                "gpujob: token %s ('%s') of %s, expires %s. It is shown this once: use it as\n"
                "GPUJOB_TOKEN; revoke it with 'gpujob token revoke %s'.\n",
                t.id, t.name, t.owner, t.expires_at[0] ? t.expires_at : "never", t.id);
    }
    explicit_bzero(text, sizeof text);
    return CLI_EXIT_OK;
}

static int token_list(cli_t *cli, const char *user)
{
    gpujob_token_t *list = NULL;
    size_t n = 0;
    int r = gpujob_token_list(cli->client, user, &list, &n);
    if (r < 0) return cli_api_error(cli, "token list", r);
    if (cli->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, token_json(&list[i]));
        cli_print_json(json_pack("{s:o}", "tokens", arr));
    } else {
        cli_table_t *t = cli_table_new(6);
        const char *head[] = {"ID", "NAME", "OWNER", "CREATED", "EXPIRES", "LAST USED"};
        cli_table_add(t, head);
        for (size_t i = 0; i < n; i++) {
            const gpujob_token_t *k = &list[i];
            const char *row[] = {k->id,
                                 k->name,
                                 k->owner,
                                 k->created_at,
                                 k->expires_at[0] ? k->expires_at : "never",
                                 k->last_used_at[0] ? k->last_used_at : "-"};
            cli_table_add(t, row);
        }
        cli_table_print(t);
        cli_table_free(t);
    }
    free(list);
    return CLI_EXIT_OK;
}

int cli_cmd_token(cli_t *cli, int argc, char **argv)
{
    static const char usage[] =
        "usage: gpujob token create NAME [--expires DURATION] [--json]\n"
        "       gpujob token list [--user USER] [--json]\n"
        "       gpujob token revoke ID\n"
        "Mints a token for you (over the server's Unix socket; it prints the token once, to use\n"
        "as GPUJOB_TOKEN from elsewhere), lists your tokens (an admin: anyone's) without their\n"
        "secrets, or revokes one.\n"
        "  --expires DURATION   the token's life: 90d, 12h, 30m, 45s, 2w (default: never)\n"
        "  --user USER          list USER's tokens (admins only, unless USER is you)\n";
    enum { OPT_EXPIRES = 2000, OPT_USER };
    static const struct option opts[] = {COMMON_LONG_OPTIONS,
                                         {"expires", required_argument, NULL, OPT_EXPIRES},
                                         {"user", required_argument, NULL, OPT_USER},
                                         {0}};
    int64_t expires = 0;
    const char *user = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') return fputs(usage, stdout), CLI_EXIT_OK;
        if (opt == OPT_EXPIRES && parse_duration(optarg, &expires) < 0)
            return cli_usage_error("token",
                                   "--expires '%s' is not a duration such as 90d, 12h or "
                                   "30m (ten years at most)",
                                   optarg);
        if (opt == OPT_USER) user = optarg;
        if (opt != OPT_EXPIRES && opt != OPT_USER && !cli_common_option(cli, opt))
            return cli_usage_error("token", "unknown option");
    }
    const char *verb = optind < argc ? argv[optind] : "";
    int want = strcmp(verb, "list") == 0 ? 1 : 2;
    if (strcmp(verb, "create") && strcmp(verb, "list") && strcmp(verb, "revoke"))
        return cli_usage_error("token", "wants create NAME, list or revoke ID");
    if (argc - optind != want)
        return cli_usage_error("token", "%s wants %s", verb,
                               want == 1 ? "no argument" : "one argument");
    if ((expires && strcmp(verb, "create")) || (user && strcmp(verb, "list")))
        return cli_usage_error("token", "--expires goes with create, --user with list");
    int status = cli_connect(cli);
    if (status) return status;
    if (strcmp(verb, "create") == 0) return token_create(cli, argv[optind + 1], expires);
    if (strcmp(verb, "list") == 0) return token_list(cli, user);
    int r = gpujob_token_revoke(cli->client, argv[optind + 1]);
    if (r < 0) return cli_api_error(cli, "token revoke", r);
    if (cli->json)
        cli_print_json(json_pack("{s:b}", "revoked", 1));
    else
        printf("revoked\n");
    return CLI_EXIT_OK;
}
