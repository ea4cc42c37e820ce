/* Helpers for GPU tests and benchmarks: a device, a stream, cuBLAS/cuBLASLt handles and
 * stream-ordered scratch (cudaMallocAsync on the stream, as the daemon's device pool gives it),
 * packaged as the op_cuda_ctx_t the kernels take; plus copies and poisoning. */
#pragma once

#include <stddef.h>

#include "kernels/op.h"

/* Exits the test program with 77 (CTest: skipped) when no CUDA device is usable, or fewer
 * than n. */
void gpu_require(void);
void gpu_require_devices(int n);
/* A context on device 0 with a new stream and cuBLASLt handle. Aborts the test on failure. */
op_cuda_ctx_t *gpu_ctx_new(void);
void gpu_ctx_free(op_cuda_ctx_t *ctx);
/* Device memory of n bytes, filled with 0xff bytes (NaN for floats) so that an output the
 * kernel forgot to write is caught. */
void *gpu_alloc_poisoned(size_t n);
void gpu_free(void *dptr);
void gpu_upload(void *dptr, const void *host, size_t n);
void gpu_download(void *host, const void *dptr, size_t n);
/* cudaStreamSynchronize on ctx's stream; fails the test with the CUDA error text. */
void gpu_sync(const op_cuda_ctx_t *ctx);
/* Fills host memory with n random values of dtype dt, uniform in [lo, hi] (integers rounded),
 * from a seed the test prints, so a failure can be replayed. */
void fill_random(dtype_t dt, void *data, int64_t n, double lo, double hi, unsigned *seed);
/* Relative norm error ||a - b|| / max(||b||, tiny), reading both as dtype dt. */
double rel_norm_error(dtype_t dt, const void *a, const void *b, int64_t n);
