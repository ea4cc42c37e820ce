/* Human output of the gpujob CLI: durations, sizes, shapes and aligned tables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

char *cli_duration(double ms, char *buf, size_t size)
{
    if (ms < 0)
        snprintf(buf, size, "-");
    else if (ms < 1.0)
        snprintf(buf, size, "%.0f us", ms * 1000.0);
    else if (ms < 1000.0)
        snprintf(buf, size, "%.1f ms", ms);
    else if (ms < 60000.0)
        snprintf(buf, size, "%.2f s", ms / 1000.0);
    else if (ms < 3600000.0) {
        long s = (long)(ms / 1000.0);
        snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
    } else {
        long m = (long)(ms / 60000.0);
        snprintf(buf, size, "%ldh%02ldm", m / 60, m % 60);
    }
    return buf;
}

char *cli_size(uint64_t bytes, char *buf, size_t size)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(buf, size, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 3) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, size, "%.1f %s", v, units[u]);
    return buf;
}

char *cli_shape(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; i++)
        used +=
            (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

struct cli_table {
    int ncols;
    size_t nrows, cap;
    char **cells; /* nrows * ncols */
};

cli_table_t *cli_table_new(int ncols)
{
    cli_table_t *t = calloc(1, sizeof *t);
    if (t) t->ncols = ncols;
    return t;
}

void cli_table_add(cli_table_t *t, const char *const *cells)
{
    if (!t) return;
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        char **grown = realloc(t->cells, cap * (size_t)t->ncols * sizeof *grown);
        if (!grown) return;
        t->cells = grown;
        t->cap = cap;
    }
    for (int j = 0; j < t->ncols; j++)
        t->cells[t->nrows * (size_t)t->ncols + (size_t)j] = strdup(cells[j] ? cells[j] : "");
    t->nrows++;
}

/* Columns are as wide as their widest cell plus two spaces; the last is not padded. */
void cli_table_print(const cli_table_t *t)
{
    if (!t) return;
    size_t width[16] = {0};
    for (size_t i = 0; i < t->nrows; i++)
        for (int j = 0; j < t->ncols && j < 16; j++) {
            const char *cell = t->cells[i * (size_t)t->ncols + (size_t)j];
            size_t n = cell ? strlen(cell) : 0;
            if (n > width[j]) width[j] = n;
        }
    for (size_t i = 0; i < t->nrows; i++) {
        for (int j = 0; j < t->ncols; j++) {
            const char *cell = t->cells[i * (size_t)t->ncols + (size_t)j];
            if (j + 1 < t->ncols)
                printf("%-*s  ", (int)width[j], cell ? cell : "");
            else
                printf("%s\n", cell ? cell : "");
        }
    }
}

void cli_table_free(cli_table_t *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
}
