#include "gpu_support.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK_CUDA(call)                                                                       \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                      \
                    cudaGetErrorString(e_));                                                   \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

void gpu_require_devices(int n)
{
    int have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess) have = 0;
    if (have < n) {
        fprintf(stderr, "%d CUDA device(s), %d needed: skipped\n", have, n);
        exit(77);
    }
}

void gpu_require(void)
{
    gpu_require_devices(1);
}

/* Scratch from the device's stream-ordered pool on the context's stream, as the daemon's device
 * workers give it: freeing right after queuing work is safe, and timing it costs no sync. */
static void *scratch_alloc(void *pool, size_t bytes)
{
    void *p = NULL;
    return cudaMallocAsync(&p, bytes ? bytes : 1, (cudaStream_t)pool) == cudaSuccess ? p : NULL;
}

static void scratch_free(void *pool, void *ptr)
{
    cudaFreeAsync(ptr, (cudaStream_t)pool);
}

op_cuda_ctx_t *gpu_ctx_new(void)
{
    gpu_require();
    op_cuda_ctx_t *ctx = calloc(1, sizeof *ctx);
    CHECK_CUDA(cudaSetDevice(0));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublasLtHandle_t lt;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS)
        abort();
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas, stream) != 0)
        abort();
    ctx->blas = blas;
    ctx->stream = stream;
    ctx->blaslt = lt;
    ctx->device = 0;
    ctx->scratch_alloc = scratch_alloc;
    ctx->scratch_free = scratch_free;
    ctx->pool = stream;
    /* Keep freed scratch in the pool between calls instead of returning it to the driver. */
    cudaMemPool_t mempool;
    uint64_t keep = UINT64_MAX;
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&mempool, 0));
    CHECK_CUDA(cudaMemPoolSetAttribute(mempool, cudaMemPoolAttrReleaseThreshold, &keep));
    return ctx;
}

void gpu_ctx_free(op_cuda_ctx_t *ctx)
{
    if (!ctx)
        return;
    cudaStreamSynchronize(ctx->stream);
    cublasLtDestroy(ctx->blaslt);
    cublasDestroy(ctx->blas);
    cudaStreamDestroy(ctx->stream);
    free(ctx);
}

void *gpu_alloc_poisoned(size_t n)
{
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, n ? n : 1));
    CHECK_CUDA(cudaMemset(p, 0xff, n ? n : 1));
    /* cudaMemset may still run when it returns, on the legacy stream, which does not order
     * the ops' non-blocking stream: without this the poison could land after the results. */
    CHECK_CUDA(cudaDeviceSynchronize());
    return p;
}

void gpu_free(void *dptr)
{
    cudaFree(dptr);
}

void gpu_upload(void *dptr, const void *host, size_t n)
{
    CHECK_CUDA(cudaMemcpy(dptr, host, n, cudaMemcpyHostToDevice));
}

void gpu_download(void *host, const void *dptr, size_t n)
{
    CHECK_CUDA(cudaMemcpy(host, dptr, n, cudaMemcpyDeviceToHost));
}

void gpu_sync(const op_cuda_ctx_t *ctx)
{
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
}

void fill_random(dtype_t dt, void *data, int64_t n, double lo, double hi, unsigned *seed)
{
    for (int64_t i = 0; i < n; i++) {
        double u = (double)rand_r(seed) / RAND_MAX;
        tensor_store(dt, data, i, lo + u * (hi - lo));
    }
}

double rel_norm_error(dtype_t dt, const void *a, const void *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = tensor_load(dt, a, i), y = tensor_load(dt, b, i);
        if (isnan(x) != isnan(y))
            return INFINITY;
        if (isnan(x))
            continue;
        num += (x - y) * (x - y);
        den += y * y;
    }
    return sqrt(num) / fmax(sqrt(den), 1e-30);
}
