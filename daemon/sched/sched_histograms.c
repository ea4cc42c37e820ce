/* The job latency and batch size histograms of /metrics: the loop thread counts each
 * observation in its bucket (one atomic add), any thread reads them and makes them cumulative. */
#include "sched_internal.h"

/* From a millisecond to ten minutes: a tiny job answered at once, to a long queue's wait. */
static const double latency_bounds_s[SCHED_LATENCY_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60, 600,
};
/* Powers of two to [scheduler] max_batch's default (256), then coarser to its largest value. */
static const double batch_bounds[SCHED_BATCH_BUCKETS] = {1,  2,   4,   8,    16,   32,
                                                         64, 128, 256, 1024, 4096, 65536};

/* The index of the first bound at least v, or n (the +Inf bucket) past them all. */
static int bucket_of(const double *bounds, int n, double v)
{
    int i = 0;
    while (i < n && v > bounds[i])
        i++;
    return i;
}

void sched_observe_job_end(sched_t *s, const job_t *job)
{
    if (job->created_us <= 0 || job->finished_us < job->created_us) return;
    int64_t us = job->finished_us - job->created_us;
    int b = bucket_of(latency_bounds_s, SCHED_LATENCY_BUCKETS, (double)us / 1e6);
    atomic_fetch_add(&s->latency_bucket[b], 1);
    atomic_fetch_add(&s->latency_sum_us, (long)us);
}

void sched_observe_batch(sched_t *s, long n)
{
    atomic_fetch_add(&s->batch_bucket[bucket_of(batch_bounds, SCHED_BATCH_BUCKETS, (double)n)], 1);
    atomic_fetch_add(&s->batch_jobs_sum, n);
}

/* Makes n per-bucket counts (and the +Inf one after them) cumulative into h. */
static void cumulate(sched_histogram_t *h, const double *bounds, int n, atomic_long *buckets)
{
    h->n = n;
    h->bounds = bounds;
    long total = 0;
    for (int i = 0; i <= n; i++) {
        total += atomic_load(&buckets[i]);
        if (i < n) h->le[i] = total;
    }
    h->count = total;
}

void sched_get_histograms(sched_t *s, sched_histograms_t *ret)
{
    sched_histograms_t h = {0};
    cumulate(&h.latency_s, latency_bounds_s, SCHED_LATENCY_BUCKETS, s->latency_bucket);
    h.latency_s.sum = (double)atomic_load(&s->latency_sum_us) / 1e6;
    cumulate(&h.batch_jobs, batch_bounds, SCHED_BATCH_BUCKETS, s->batch_bucket);
    h.batch_jobs.sum = (double)atomic_load(&s->batch_jobs_sum);
    *ret = h;
}
