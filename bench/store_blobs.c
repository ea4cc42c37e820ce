/* Where should tensor bytes live: in SQLite rows or in fsync'd files named by a row?
 *
 * For each size, writes N one-tensor jobs through the store both ways, in group commits of
 * GROUP jobs per transaction as the scheduler does, then reads every tensor back through a
 * reader. Also times store_job_insert of 10,000 small jobs in one transaction. Run by hand:
 *
 *   bench_store_blobs [--sync full|normal] [--dir DIR]
 *
 * DIR (default /var/tmp) should be on the disk the daemon's state directory will use: a tmpfs
 * makes every fsync free and the comparison meaningless. */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/util/log.h"
#include "daemon/store/store.h"

#define GROUP 32
#define SMALL_JOBS 10000

static const char *const bench_inputs[] = {"x"};
static const op_def_t bench_op = {
    .name = "bench_blob",
    .summary = "a job that only carries a tensor",
    .n_inputs = 1,
    .input_names = bench_inputs,
    .required_inputs = 1,
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    return remove(path);
}

static void die(const char *what, int r)
{
    fprintf(stderr, "bench_store_blobs: %s: %s\n", what, strerror(-r));
    exit(1);
}

static job_t *make_job(const void *bytes, uint64_t nbytes)
{
    job_t *job = job_new();
    if (!job) die("job_new", -ENOMEM);
    snprintf(job->owner, sizeof job->owner, "bench");
    job->call.op = &bench_op;
    job->call.has_in[0] = true;
    job_tensor_t *t = &job->in[0];
    snprintf(t->name, sizeof t->name, "x");
    t->desc = (tensor_desc_t){.dtype = DTYPE_I8, .ndim = 1, .shape = {(int64_t)nbytes}};
    t->nbytes = nbytes;
    job->call.in[0] = t->desc;
    t->data = malloc(nbytes ? nbytes : 1);
    if (!t->data) die("malloc", -ENOMEM);
    memcpy(t->data, bytes, nbytes);
    return job;
}

typedef struct timing {
    double write_s, read_s;
} timing_t;

/* Writes n tensors of size bytes with the given inline limit, then reads them back. */
static timing_t run_one(const char *base, bool sync_full, uint64_t inline_limit, uint64_t size,
                        int n)
{
    config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.shards = 1;
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s/bench_store.XXXXXX", base);
    if (!mkdtemp(cfg.state_dir)) die("mkdtemp", -errno);
    cfg.inline_blob_bytes = inline_limit;
    cfg.sync_full = sync_full;
    store_t *st;
    int r = store_open(&cfg, &st);
    if (r < 0) die("store_open", r);

    unsigned char *bytes = malloc(size);
    for (uint64_t i = 0; i < size; i++)
        bytes[i] = (unsigned char)(i * 131 + 7);
    char(*blobs)[128] = calloc((size_t)n, sizeof *blobs);
    timing_t t = {0, 0};

    for (int done = 0; done < n;) {
        job_t *group[GROUP];
        int g = n - done < GROUP ? n - done : GROUP;
        for (int i = 0; i < g; i++)
            group[i] = make_job(bytes, size);
        double t0 = now_s();
        /* As the scheduler: large bytes to files first, then one transaction for the group. */
        for (int i = 0; i < g; i++) {
            char *blob = NULL;
            if ((r = store_blob_write(st, group[i]->in[0].data, size, &blob)) < 0)
                die("store_blob_write", r);
            group[i]->in[0].blob = blob;
        }
        if ((r = store_begin(st)) < 0) die("store_begin", r);
        for (int i = 0; i < g; i++)
            if ((r = store_job_insert(st, group[i])) < 0) die("store_job_insert", r);
        if ((r = store_commit(st)) < 0) die("store_commit", r);
        t.write_s += now_s() - t0;
        for (int i = 0; i < g; i++) {
            snprintf(blobs[done + i], sizeof blobs[0], "%s", group[i]->in[0].blob);
            job_free(group[i]);
        }
        done += g;
    }

    store_reader_t *rd;
    if ((r = store_reader_open(st, &rd)) < 0) die("store_reader_open", r);
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        void *data;
        if ((r = store_blob_read(rd, blobs[i], size, &data)) < 0) die("store_blob_read", r);
        free(data);
    }
    t.read_s = now_s() - t0;
    store_reader_close(rd);
    store_close(st);
    free(blobs);
    free(bytes);
    nftw(cfg.state_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return t;
}

static void bench_small_inserts(const char *base, bool sync_full)
{
    config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.shards = 1;
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s/bench_store.XXXXXX", base);
    if (!mkdtemp(cfg.state_dir)) die("mkdtemp", -errno);
    cfg.inline_blob_bytes = 65536;
    cfg.sync_full = sync_full;
    store_t *st;
    int r = store_open(&cfg, &st);
    if (r < 0) die("store_open", r);
    static job_t *jobs[SMALL_JOBS];
    unsigned char bytes[64] = {1, 2, 3};
    for (int i = 0; i < SMALL_JOBS; i++)
        jobs[i] = make_job(bytes, sizeof bytes);
    double t0 = now_s();
    if ((r = store_begin(st)) < 0) die("store_begin", r);
    for (int i = 0; i < SMALL_JOBS; i++)
        if ((r = store_job_insert(st, jobs[i])) < 0) die("store_job_insert", r);
    if ((r = store_commit(st)) < 0) die("store_commit", r);
    double dt = now_s() - t0;
    printf("store_job_insert of %d small jobs (one 64-byte input each) in one transaction: "
           "%.1f ms (%.0f jobs/s, %.1f us/job)\n\n",
           SMALL_JOBS, dt * 1e3, SMALL_JOBS / dt, dt * 1e6 / SMALL_JOBS);
    for (int i = 0; i < SMALL_JOBS; i++)
        job_free(jobs[i]);
    store_close(st);
    nftw(cfg.state_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int main(int argc, char **argv)
{
    bool sync_full = true;
    const char *base = "/var/tmp";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sync") == 0 && i + 1 < argc) {
            sync_full = strcmp(argv[++i], "normal") != 0;
        } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
            base = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--sync full|normal] [--dir DIR]\n", argv[0]);
            return 2;
        }
    }
    log_set_level(LOG_WARN);
    printf("bench_store_blobs: synchronous=%s, state under %s, group commit of %d jobs\n\n",
           sync_full ? "FULL" : "NORMAL", base, GROUP);
    bench_small_inserts(base, sync_full);

    static const uint64_t sizes[] = {1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 16 << 20};
    printf("%9s %5s | %22s %22s | %22s %22s\n", "size", "N", "write: row us (MB/s)",
           "write: file us (MB/s)", "read: row us (MB/s)", "read: file us (MB/s)");
    uint64_t suggested = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        uint64_t size = sizes[k];
        /* About 64 MiB per run, at least 4 and at most 1000 tensors. */
        int n = (int)((64ull << 20) / size);
        n = n < 4 ? 4 : n > 1000 ? 1000 : n;
        timing_t row = run_one(base, sync_full, UINT64_MAX, size, n);
        timing_t file = run_one(base, sync_full, 0, size, n);
        double mb = (double)size * n / 1e6;
        printf("%7lluKi %5d | %10.1f (%8.1f) %10.1f (%8.1f) | %10.1f (%8.1f) %10.1f (%8.1f)\n",
               (unsigned long long)(size >> 10), n, row.write_s * 1e6 / n, mb / row.write_s,
               file.write_s * 1e6 / n, mb / file.write_s, row.read_s * 1e6 / n, mb / row.read_s,
               file.read_s * 1e6 / n, mb / file.read_s);
        if (row.write_s + row.read_s <= file.write_s + file.read_s) suggested = size;
    }
    printf("\nlargest size where rows are no slower than files (write + read): %llu bytes\n",
           (unsigned long long)suggested);
    return 0;
}
