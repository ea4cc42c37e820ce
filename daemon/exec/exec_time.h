/* A batch's measured device time shared among its jobs, the same way on every backend: each
 * job's gpu_ns is its share by cost estimate, and the shares sum to exactly the batch's time,
 * which every job's batch_ns records. Private to daemon/exec/ (and its unit test). */
#pragma once

#include <stdint.h>

#include "executor.h"

/* Sets each of b's jobs' gpu_ns to its share of total_ns (clamped at 0), weighted by its
 * call's cost (bytes + flops + 1; equal costs, equal shares; 0 for a job left out of the run,
 * job_t.skipped), and batch_ns to total_ns. The
 * integer shares are the differences of the rounded running sums, so that they add up to
 * total_ns exactly and the rounding remainder falls on the same jobs every time. */
void exec_time_share(exec_batch_t *b, int64_t total_ns);
