/* bench_sched_throughput: the daemon's job path without HTTP. The scheduler, the store (a real
 * SQLite file with the default settings) and the CPU executor run in-process; a producer
 * thread submits tiny saxpy jobs in arrays, as many arrays in flight as --inflight, and the
 * run ends when every job has succeeded. What it measures is what bounds the daemon's
 * tiny-job rate: the loop thread's work per job (group commit, dispatch, completion), which
 * the HTTP server only adds to.
 *
 *   bench_sched_throughput [--jobs N] [--array A] [--inflight K] [--elements E] [--dir D]
 *
 * Prints a Markdown table: the settings, seconds, jobs/s, CPU µs per job (all threads, and the
 * scheduler's loop thread alone: the figure that bounds the daemon), KiB
 * handed to write(2) per job (SQLite's WAL and checkpoints, segment and blob files) and jobs
 * per launch. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "daemon/util/config.h"
#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"
#include "kernels/op.h"

typedef struct bench {
    sched_t *sched;
    sem_t inflight;
    long jobs, array;
    int elements;
} bench_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Bytes this process has handed to write(2) and friends so far (wchar of /proc/self/io). */
static double written_bytes(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    double v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "wchar: %lf", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

/* CPU seconds of this process's threads named name (gj-loop: the scheduler's loop). */
static double thread_cpu_s(const char *name)
{
    double total = 0;
    DIR *dir = opendir("/proc/self/task");
    for (struct dirent *de; dir && (de = readdir(dir));) {
        char path[300], comm[32] = "", stat[1024];
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (!fgets(comm, sizeof comm, f)) comm[0] = '\0';
        fclose(f);
        comm[strcspn(comm, "\n")] = '\0';
        if (strcmp(comm, name) != 0) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", de->d_name);
        if (!(f = fopen(path, "r"))) continue;
        unsigned long utime = 0, stime = 0;
        /* Fields 14 and 15, after the parenthesised name (which may hold spaces). */
        if (fgets(stat, sizeof stat, f)) {
            const char *p = strrchr(stat, ')');
            if (p)
                sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                       &stime);
        }
        fclose(f);
        total += (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
    }
    if (dir) closedir(dir);
    return total;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* A validated saxpy job on E floats, with its inputs in memory as the API hands them over. */
static job_t *saxpy_job(int elements, unsigned seed)
{
    const op_def_t *op = op_find("saxpy");
    job_t *job = job_new();
    if (!op || !job) return NULL;
    snprintf(job->owner, sizeof job->owner, "bench");
    job->call.op = op;
    job->params_json = strdup("{\"a\":2}");
    json_t *params = json_pack("{s:f}", "a", 2.0);
    for (int j = 0; j < 2; j++) {
        job_tensor_t *t = &job->in[j];
        snprintf(t->name, sizeof t->name, "%s", op->input_names[j]);
        t->desc = (tensor_desc_t){DTYPE_F32, 1, {elements}};
        t->nbytes = tensor_desc_bytes(&t->desc);
        float *v = malloc(t->nbytes);
        for (int i = 0; v && i < elements; i++)
            v[i] = (float)((seed + (unsigned)i * 2654435761u) % 1000) / 1000.0f;
        t->data = v;
        job->call.in[j] = t->desc;
        job->call.has_in[j] = true;
    }
    op_error_t err;
    int r = op->validate(params, &job->call, &err);
    json_decref(params);
    if (r < 0) {
        fprintf(stderr, "saxpy: %s\n", err.message);
        job_free(job);
        return NULL;
    }
    job_describe_outputs(job);
    id_new('j', job->id);
    job->state = JOB_QUEUED;
    job->created_us = now_us();
    return job;
}

static void on_submitted(void *token, const sched_result_t *res)
{
    bench_t *b = token;
    if (res->err)
        fprintf(stderr, "submit: %s\n", res->message ? res->message : strerror(-res->err));
    sem_post(&b->inflight);
}

static void *produce(void *arg)
{
    bench_t *b = arg;
    for (long done = 0; done < b->jobs; done += b->array) {
        long n = b->jobs - done < b->array ? b->jobs - done : b->array;
        job_t **jobs = calloc((size_t)n, sizeof *jobs);
        for (long i = 0; jobs && i < n; i++)
            if (!(jobs[i] = saxpy_job(b->elements, (unsigned)(done + i)))) exit(1);
        sem_wait(&b->inflight);
        sched_submit(b->sched, jobs, (size_t)n, on_submitted, b);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    bench_t b = {.jobs = 100000, .array = 1000, .elements = 1024};
    int inflight = 8;
    const char *dir = NULL;
    static const struct option longopts[] = {
        {"jobs", required_argument, NULL, 'n'},     {"array", required_argument, NULL, 'a'},
        {"inflight", required_argument, NULL, 'k'}, {"elements", required_argument, NULL, 'e'},
        {"dir", required_argument, NULL, 'd'},      {NULL, 0, NULL, 0}};
    for (int c; (c = getopt_long(argc, argv, "", longopts, NULL)) != -1;) {
        switch (c) {
        case 'n':
            b.jobs = atol(optarg);
            break;
        case 'a':
            b.array = atol(optarg);
            break;
        case 'k':
            inflight = atoi(optarg);
            break;
        case 'e':
            b.elements = atoi(optarg);
            break;
        case 'd':
            dir = optarg;
            break;
        default:
            fprintf(stderr,
                    "usage: %s [--jobs N] [--array A] [--inflight K] [--elements E] "
                    "[--dir D]\n",
                    argv[0]);
            return 2;
        }
    }
    if (b.jobs < 1 || b.array < 1 || inflight < 1 || b.elements < 1) return 2;
    char tmp[] = "/tmp/bench-sched-XXXXXX";
    if (!dir && !(dir = mkdtemp(tmp))) return 1;

    config_t cfg;
    config_defaults(&cfg);
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s", dir);
    cfg.cpu_threads = 1;
    cfg.max_queued_per_user = 100000000;
    cfg.max_jobs_per_request = (int)b.array;
    store_t *st = NULL;
    executor_t *ex = NULL;
    exec_blob_reader_t blobs;
    if (store_open(&cfg, &st) < 0 || sched_new(&cfg, st, &b.sched) < 0 ||
        (blobs = exec_store_blob_reader(st), exec_cpu_new(&cfg, &blobs, &ex)) < 0) {
        fprintf(stderr, "bench: could not start the scheduler in %s\n", dir);
        return 1;
    }
    sched_set_executor(b.sched, ex);
    if (sched_start(b.sched) < 0) return 1;
    sem_init(&b.inflight, 0, (unsigned)inflight);

    double t0 = now_s(), c0 = cpu_s(), w0 = written_bytes(), l0 = thread_cpu_s("gj-loop");
    pthread_t producer;
    pthread_create(&producer, NULL, produce, &b);
    sched_stats_t stats;
    do {
        usleep(1000);
        sched_get_stats(b.sched, &stats);
    } while (stats.succeeded_total + stats.failed_total < b.jobs);
    double seconds = now_s() - t0, cpu = cpu_s() - c0, written = written_bytes() - w0,
           loop = thread_cpu_s("gj-loop") - l0;
    pthread_join(producer, NULL);
    sched_stop(b.sched);
    sched_free(b.sched);
    store_close(st);

    printf("| jobs | array | inflight | elements | s | jobs/s | CPU µs/job | loop µs/job | "
           "KiB written/job | jobs/launch | failed |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    printf("| %ld | %ld | %d | %d | %.2f | %.0f | %.1f | %.1f | %.1f | %.1f | %ld |\n", b.jobs,
           b.array, inflight, b.elements, seconds, (double)b.jobs / seconds,
           cpu * 1e6 / (double)b.jobs, loop * 1e6 / (double)b.jobs, written / 1024 / (double)b.jobs,
           (double)b.jobs / (double)stats.batches_total, stats.failed_total);
    if (strcmp(dir, tmp) == 0) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
        if (system(cmd) != 0) fprintf(stderr, "bench: could not remove %s\n", tmp);
    }
    return stats.failed_total ? 1 : 0;
}
