/* The gpujob command-line tool: shared state of the subcommands and the human-output helpers. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "gpujob.h"

/* Exit statuses, documented in gpujob(1). */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_JOB_FAILED = 1,  /* the job ended failed or cancelled */
    CLI_EXIT_USAGE = 2,       /* bad arguments, or a local file that cannot be read or written */
    CLI_EXIT_SERVER = 3,      /* the daemon answered with an error */
    CLI_EXIT_UNREACHABLE = 4, /* no answer: daemon down, connection lost, request timed out */
    CLI_EXIT_TIMEOUT = 5,     /* the job was not final when the wait's --timeout ran out */
};

typedef struct cli {
    const char *url;    /* NULL: $GPUJOB_URL or the default socket */
    const char *cacert; /* --cacert: CA file for https://; NULL: $GPUJOB_CA_FILE or the system's */
    bool json;          /* machine-readable output */
    gpujob_client_t *client;
} cli_t;

/* Options every subcommand accepts, handled by cli_common_option; a subcommand numbers its own
 * options from 2000. */
enum { OPT_URL = 1000, OPT_JSON, OPT_VERSION, OPT_CACERT };
#define COMMON_LONG_OPTIONS                                                                        \
    {"url", required_argument, NULL, OPT_URL}, {"json", no_argument, NULL, OPT_JSON},              \
        {"cacert", required_argument, NULL, OPT_CACERT},                                           \
    {                                                                                              \
        "help", no_argument, NULL, 'h'                                                             \
    }
/* Handles a common option (getopt's optarg); returns true when opt was one. */
bool cli_common_option(cli_t *cli, int opt);
/* Prints "gpujob CMD: MESSAGE" and a hint to stderr; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reports a failed library call and picks the exit status from the kind of failure. */
int cli_api_error(cli_t *cli, const char *what, int r);
/* Makes cli->client from the options: CLI_EXIT_OK, or the exit status of a failure (said). */
int cli_connect(cli_t *cli);
/* Prints JSON indented: a value (taken: it is freed), or a text (as is when it does not parse). */
void cli_print_json(json_t *v);
void cli_print_json_text(const char *text);

/* The subcommands of their own files. */
int cli_cmd_usage(cli_t *cli, int argc, char **argv);
int cli_cmd_token(cli_t *cli, int argc, char **argv);

/* Human-readable durations ("850 us", "12.3 ms", "4.20 s", "3m07s", "2h05m"; "-" for ms < 0)
 * and sizes ("512 B", "1.5 KiB"), written into buf; each returns buf. */
char *cli_duration(double ms, char *buf, size_t size);
char *cli_size(uint64_t bytes, char *buf, size_t size);
/* "[2, 3]" into buf; returns buf. */
char *cli_shape(int ndim, const int64_t *shape, char *buf, size_t size);

/* A table printed with aligned columns. cli_table_add takes ncols strings (copied). */
typedef struct cli_table cli_table_t;
cli_table_t *cli_table_new(int ncols);
void cli_table_add(cli_table_t *t, const char *const *cells);
void cli_table_print(const cli_table_t *t);
void cli_table_free(cli_table_t *t);

/* Human output of a usage report: what the user holds now, the totals of the jobs that ended
 * in its range, and a table of its rows (day, user, op). */
void cli_usage_print(const gpujob_usage_report_t *report);
