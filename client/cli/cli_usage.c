/* `gpujob usage`: its options, and its human output: what the user holds now, the totals of the
 * jobs that ended in the report's range, the user's GPU-time budgets, and one table row per
 * user, day and op of the daemon's rollup. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* The cells of one row (or of the totals) from JOBS on: counts, run and device time. */
static void usage_cells(const gpujob_usage_row_t *row, char cells[6][32])
{
    snprintf(cells[0], 32, "%" PRId64, row->jobs);
    snprintf(cells[1], 32, "%" PRId64, row->succeeded);
    snprintf(cells[2], 32, "%" PRId64, row->failed);
    snprintf(cells[3], 32, "%" PRId64, row->cancelled);
    cli_duration((double)row->run_us / 1e3, cells[4], 32);
    cli_duration((double)row->gpu_ns / 1e6, cells[5], 32);
}

static void usage_table_print(const gpujob_usage_report_t *report)
{
    cli_table_t *t = cli_table_new(9);
    const char *head[] = {"DATE",   "USER",      "OP",  "JOBS", "SUCCEEDED",
                          "FAILED", "CANCELLED", "RUN", "GPU"};
    cli_table_add(t, head);
    char cells[6][32];
    for (size_t i = 0; i < report->n_rows; i++) {
        const gpujob_usage_row_t *row = &report->rows[i];
        usage_cells(row, cells);
        const char *line[] = {row->date, row->user, row->op,  cells[0], cells[1],
                              cells[2],  cells[3],  cells[4], cells[5]};
        cli_table_add(t, line);
    }
    usage_cells(&report->totals, cells);
    const char *total[] = {"total",  "",       "",       cells[0], cells[1],
                           cells[2], cells[3], cells[4], cells[5]};
    cli_table_add(t, total);
    cli_table_print(t);
    cli_table_free(t);
}

/* One budget's line: "budget:    day 1h (KEY): 12.3 s used, 59.8 min left, resets AT". */
static void budget_print(const gpujob_budget_t *g)
{
    char budget[64], used[64], left[64];
    cli_duration(g->gpu_ms, budget, sizeof budget);
    cli_duration(g->used_gpu_ms, used, sizeof used);
    cli_duration(g->left_gpu_ms, left, sizeof left);
    printf("budget:    %s %s of GPU time (%s): %s used, %s left%s; resets %s\n", g->window, budget,
           g->key, used, left, g->exceeded ? " (spent: new jobs are refused)" : "", g->reset_at);
}

void cli_usage_print(const gpujob_usage_report_t *report)
{
    const gpujob_usage_t *u = &report->summary;
    const gpujob_usage_row_t *tot = &report->totals;
    char a[64], b[64];
    printf("user:      %s\n", strcmp(u->owner, "*") == 0 ? "all users" : u->owner);
    printf("days:      %s to %s (UTC)\n", report->since[0] ? report->since : "the first",
           report->until[0] ? report->until : "the last");
    printf("now:       %" PRId64 " queued, %" PRId64 " running; %" PRId64 " buffers (%s)\n",
           u->jobs[GPUJOB_QUEUED], u->jobs[GPUJOB_RUNNING], u->buffers,
           cli_size((uint64_t)u->buffer_bytes, a, sizeof a));
    printf("ended:     %" PRId64 " jobs: %" PRId64 " succeeded, %" PRId64 " failed, %" PRId64
           " cancelled\n",
           tot->jobs, tot->succeeded, tot->failed, tot->cancelled);
    printf("run time:  %s (gpu %s)\n", cli_duration((double)tot->run_us / 1e3, a, sizeof a),
           cli_duration((double)tot->gpu_ns / 1e6, b, sizeof b));
    printf("moved:     %s in, %s out\n", cli_size((uint64_t)tot->bytes_in, a, sizeof a),
           cli_size((uint64_t)tot->bytes_out, b, sizeof b));
    for (size_t i = 0; i < report->n_budgets; i++)
        budget_print(&report->budgets[i]);
    if (report->n_rows == 0) return;
    putchar('\n');
    usage_table_print(report);
}

/* Parses usage's options into q: CLI_EXIT_OK, or the exit status of a usage error. */
static int usage_parse_options(cli_t *cli, int argc, char **argv, gpujob_usage_query_t *q,
                               bool *ret_help)
{
    static const char usage[] =
        "usage: gpujob usage [--since DAY] [--until DAY] [--user USER | --all] [--json]\n"
        "Shows the jobs you have queued and running, your buffers, and what your jobs that\n"
        "ended used: totals, your GPU-time budgets (used, left, when they reset), then one\n"
        "row per day and op (days are UTC, and outlive the jobs).\n"
        "  --since DAY   from this day on (2026-03-01, or an RFC 3339 time)\n"
        "  --until DAY   up to and including this day\n"
        "  --user USER   USER's usage (admins only, unless USER is you)\n"
        "  --all         every user's usage, one row per user, day and op (admins only)\n";
    enum { OPT_SINCE = 2000, OPT_UNTIL, OPT_USER, OPT_ALL };
    static const struct option opts[] = {COMMON_LONG_OPTIONS,
                                         {"since", required_argument, NULL, OPT_SINCE},
                                         {"until", required_argument, NULL, OPT_UNTIL},
                                         {"user", required_argument, NULL, OPT_USER},
                                         {"all", no_argument, NULL, OPT_ALL},
                                         {0}};
    bool all = false;
    int opt;
    *ret_help = false;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(usage, stdout);
            *ret_help = true;
            return CLI_EXIT_OK;
        }
        if (opt == OPT_SINCE) q->since = optarg;
        if (opt == OPT_UNTIL) q->until = optarg;
        if (opt == OPT_USER) q->user = optarg;
        if (opt == OPT_ALL) all = true;
        if (opt < OPT_SINCE && !cli_common_option(cli, opt))
            return cli_usage_error("usage", "unknown option");
    }
    if (optind != argc) return cli_usage_error("usage", "unexpected argument '%s'", argv[optind]);
    if (all && q->user) return cli_usage_error("usage", "--user and --all exclude each other");
    if (all) q->user = "all";
    return cli_connect(cli);
}

int cli_cmd_usage(cli_t *cli, int argc, char **argv)
{
    gpujob_usage_query_t q = {0};
    bool help;
    int status = usage_parse_options(cli, argc, argv, &q, &help);
    if (status || help) return status;
    gpujob_usage_report_t *report = NULL;
    int r = gpujob_usage_report(cli->client, &q, &report);
    if (r < 0) return cli_api_error(cli, "usage", r);
    if (cli->json)
        cli_print_json_text(report->json);
    else
        cli_usage_print(report);
    gpujob_usage_report_free(report);
    return CLI_EXIT_OK;
}
