/* The executors' side of the poison-job guard (daemon/util/crash_guard.h): a thread marks the
 * batch it works on, so that a crash while it does fails the batch's jobs at the next start
 * instead of running them again. Private to daemon/exec/. */
#pragma once

#include "executor.h"

/* The calling thread works on b's jobs until exec_guard_clear(). */
void exec_guard_batch(const exec_batch_t *b);
/* The calling thread works on no batch. */
void exec_guard_clear(void);
