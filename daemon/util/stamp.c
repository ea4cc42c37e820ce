/* The hand-off stamps (stamp.h): one open record written by any thread, the closed ones kept
 * in memory and written out at exit. Compiled to nothing without GPUJOB_STAMPS. */
#include "stamp.h"

#ifdef GPUJOB_STAMPS

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The most requests kept: a benchmark's few seconds at one client. */
#define STAMP_RECORDS 200000

static _Atomic int64_t open_record[STAMP_N];
static int64_t (*records)[STAMP_N];
static size_t n_records;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const names[] = {
#define STAMP_NAME(name, text) text,
    STAMP_POINTS(STAMP_NAME)
#undef STAMP_NAME
};

/* Keeps the open record, if any (under lock). */
static void record_close(void)
{
    if (!atomic_load(&open_record[STAMP_BODY]) || n_records == STAMP_RECORDS) return;
    for (int p = 0; p < STAMP_N; p++)
        records[n_records][p] = atomic_load(&open_record[p]);
    n_records++;
}

/* Writes the records to GPUJOB_STAMPS_FILE: a header of the points' names, then per request
 * each point's microseconds since its body came in (empty when it did not pass there). */
static void stamps_write(void)
{
    const char *path = getenv("GPUJOB_STAMPS_FILE");
    pthread_mutex_lock(&lock);
    record_close();
    FILE *f = path ? fopen(path, "w") : NULL;
    for (int p = 0; f && p < STAMP_N; p++)
        fprintf(f, "%s%s", names[p], p + 1 < STAMP_N ? "," : "\n");
    for (size_t i = 0; f && i < n_records; i++)
        for (int p = 0; p < STAMP_N; p++) {
            int64_t t = records[i][p];
            if (t >= records[i][STAMP_BODY]) fprintf(f, "%.3f", (t - records[i][STAMP_BODY]) / 1e3);
            fputs(p + 1 < STAMP_N ? "," : "\n", f);
        }
    if (f) fclose(f);
    pthread_mutex_unlock(&lock);
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void stamp_begin(void)
{
    pthread_mutex_lock(&lock);
    if (!records) {
        records = calloc(STAMP_RECORDS, sizeof *records);
        atexit(stamps_write);
    }
    if (records) record_close();
    for (int p = 0; p < STAMP_N; p++)
        atomic_store(&open_record[p], 0);
    atomic_store(&open_record[STAMP_BODY], mono_ns());
    pthread_mutex_unlock(&lock);
}

void stamp_mark(stamp_point_t p)
{
    int64_t zero = 0;
    atomic_compare_exchange_strong(&open_record[p], &zero, mono_ns());
}

#else

/* ISO C wants a declaration in every file. */
typedef int stamp_off_t;

#endif
