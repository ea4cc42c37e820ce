/* bench/kernels: times each op's CUDA implementation with CUDA events (warm-up, then the
 * median of many runs) and prints one CSV row per case:
 *     case,ms,bytes,flops
 * bench/peer/torch_*.py print the same cases for PyTorch and the copy ceiling, and
 * bench/kernels/report.py joins both into the table of bench/README.md. */
#pragma once

#include "kernels/op.h"

/* Times fn(arg) (which queues work on ctx->stream) and returns the median in ms. */
double bench_time_ms(const op_cuda_ctx_t *ctx, void (*fn)(void *arg), void *arg, int warmup,
                     int iters);
/* Prints a row: the case name (e.g. "add/f32/1GiB"), its median time, bytes moved and flops. */
void bench_row(const char *name, double ms, double bytes, double flops);
/* Validates `call` (inputs filled by the caller) with params, allocates device inputs filled
 * with random data and outputs, times op->run_cuda on n identical calls, prints the row, frees.
 * bytes and flops reported are n times the call's cost. Returns 0 or fails loudly. */
int bench_op(const op_cuda_ctx_t *ctx, const char *name, op_call_t *call, const char *params_json,
             int n, int iters);

/* One function per op family, each printing its cases. */
void bench_elementwise(const op_cuda_ctx_t *ctx);
void bench_sort(const op_cuda_ctx_t *ctx);
void bench_gemm(const op_cuda_ctx_t *ctx);
void bench_conv2d(const op_cuda_ctx_t *ctx);
