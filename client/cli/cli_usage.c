/* Human output of `gpujob usage`: what the user holds now, the totals of the jobs that ended in
 * the report's range, and one table row per user, day and op of the daemon's rollup. */
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
    if (report->n_rows == 0) return;
    putchar('\n');
    usage_table_print(report);
}
