/* debug_sleep and debug_fault: test-only ops, hidden from the op table unless the daemon runs
 * with [debug] test_ops = true (op_table_enable_test_ops). What debug.c (validation, CPU) and
 * debug.cu (CUDA) share.
 *
 * debug_sleep gives end-to-end tests a job that runs for a known time on any backend: out is a
 * copy of x (any dtype and shape), and the call takes at least params.ms milliseconds, slept on
 * the CPU, spun on the device (globaltimer) on CUDA.
 *
 * debug_fault injects a device fault: on CUDA its kernel writes through an invalid pointer, so
 * the context gets a sticky cudaErrorIllegalAddress that surfaces asynchronously on the stream,
 * as a real fault would; run_cuda itself returns 0. On the CPU it fails the job with
 * "debug_fault: injected fault". With params.crash = true, on either backend, it crashes the
 * process instead with a write through NULL on the host (SIGSEGV), as a job that overruns its
 * memory would: the poison-job guard's test (daemon/util/crash_guard.h).
 *
 * Neither op batches (its batch key is ""): run_cuda always gets n == 1, and a debug_sleep job
 * holds its stream or worker for its own ms. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "op.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The longest debug_sleep, in milliseconds. */
#define DEBUG_SLEEP_MAX_MS 60000

/* The parsed params of one validated call (OP_PARAMS(call, debug_params_t)). */
typedef struct debug_params {
    int64_t ms;     /* debug_sleep: how long the call takes at least */
    uint64_t bytes; /* of x, and of out */
    bool crash;     /* debug_fault: crash the process on the CPU (a write through NULL) */
} debug_params_t;

/* The op table entries (reachable through op_find() only while test ops are enabled). */
extern const op_def_t op_debug_sleep;
extern const op_def_t op_debug_fault;

#ifdef GPUJOB_WITH_CUDA
int op_debug_sleep_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                            const void *const *const *in, void *const *const *out, op_error_t *err);
int op_debug_fault_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                            const void *const *const *in, void *const *const *out, op_error_t *err);
#endif

#ifdef __cplusplus
}
#endif
