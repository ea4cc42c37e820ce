/* A batch's device time shared among its jobs by cost (exec_time.h). */
#include "exec_time.h"

#include <math.h>

/* A job's part of its batch's time, by its call's cost estimate. */
static double cost_weight(const job_t *job)
{
    return job->call.cost.bytes + job->call.cost.flops + 1.0;
}

/* A job left out of the run (cancelled before it ran) used none of the time. */
static double job_weight(const job_t *job)
{
    return job->skipped ? 0 : cost_weight(job);
}

/* The part of the time that the jobs up to one whose running weight is running have used.
 * Every job left out: nothing until the last, which takes whatever was measured. */
static double share_upto(double running, double total_weight)
{
    return total_weight > 0 ? running / total_weight : 0;
}

void exec_time_share(exec_batch_t *b, int64_t total_ns)
{
    if (total_ns < 0) total_ns = 0;
    double total_weight = 0;
    for (int i = 0; i < b->n; i++)
        total_weight += job_weight(b->jobs[i]);
    /* Job i gets round(total * W_i / W) - round(total * W_{i-1} / W), W_i the running sum of
     * the weights: the last running sum is total itself, so nothing is lost or made up. */
    double running = 0;
    int64_t given = 0;
    for (int i = 0; i < b->n; i++) {
        job_t *job = b->jobs[i];
        running += job_weight(job);
        int64_t upto = i == b->n - 1
                           ? total_ns
                           : (int64_t)llround((double)total_ns * share_upto(running, total_weight));
        if (upto < given) upto = given;
        if (upto > total_ns) upto = total_ns;
        job->gpu_ns = upto - given;
        job->batch_ns = total_ns;
        given = upto;
    }
}

int64_t exec_job_time_so_far(const exec_batch_t *b, const job_t *job, int64_t mono_now_us)
{
    int64_t started = exec_batch_started_us(b);
    if (started <= 0 || mono_now_us <= started) return 0;
    /* Which jobs the executor leaves out is its own to write while the batch runs: every job
     * counts here, and the batch's end gives the measured share. */
    double total = 0, mine = 0;
    for (int i = 0; i < b->n; i++) {
        total += cost_weight(b->jobs[i]);
        if (b->jobs[i] == job) mine = cost_weight(job);
    }
    if (!(total > 0)) return 0;
    return (int64_t)llround((double)(mono_now_us - started) * 1000.0 * (mine / total));
}
