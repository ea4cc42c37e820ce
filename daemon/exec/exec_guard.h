/* The executors' side of the poison-job guard (daemon/util/crash_guard.h): a thread marks the
 * jobs it works on, so that a crash while it does fails those jobs at the next start instead of
 * running them again. A backend that runs a batch's jobs one at a time (the CPU) marks each job
 * alone, so that a crash blames that job only; one that runs a batch in one launch (CUDA)
 * cannot tell which job crashed it and marks the whole batch. Private to daemon/exec/. */
#pragma once

#include "executor.h"

/* The calling thread works on b's jobs until exec_guard_clear(). */
void exec_guard_batch(const exec_batch_t *b);
/* The calling thread works on job alone until exec_guard_clear(). */
void exec_guard_job(const job_t *job);
/* The calling thread works on no job. */
void exec_guard_clear(void);
