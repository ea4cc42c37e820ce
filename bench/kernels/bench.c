#include "bench.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gpu_support.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_time_ms(const op_cuda_ctx_t *ctx, void (*fn)(void *arg), void *arg, int warmup,
                     int iters)
{
    cudaStream_t s = ctx->stream;
    for (int i = 0; i < warmup; i++)
        fn(arg);
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    double *t = calloc((size_t)iters, sizeof *t);
    for (int i = 0; i < iters; i++) {
        cudaEventRecord(start, s);
        fn(arg);
        cudaEventRecord(stop, s);
        cudaEventSynchronize(stop);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        t[i] = ms;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    double median = t[iters / 2];
    free(t);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "bench: CUDA error: %s\n", cudaGetErrorString(e));
        exit(1);
    }
    return median;
}

void bench_row(const char *name, double ms, double bytes, double flops)
{
    printf("%s,%.6f,%.0f,%.0f\n", name, ms, bytes, flops);
    fflush(stdout);
}

typedef struct op_run {
    const op_cuda_ctx_t *ctx;
    int n;
    const op_call_t **calls;
    const void *const **in;
    void *const **out;
} op_run_t;

static void run_op(void *arg)
{
    op_run_t *r = arg;
    op_error_t err;
    if (r->calls[0]->op->run_cuda(r->ctx, r->n, r->calls, r->in, r->out, &err) < 0) {
        fprintf(stderr, "bench: %s failed: %s\n", r->calls[0]->op->name, err.message);
        exit(1);
    }
}

int bench_op(const op_cuda_ctx_t *ctx, const char *name, op_call_t *call, const char *params_json,
             int n, int iters)
{
    json_error_t jerr;
    json_t *params = params_json ? json_loads(params_json, 0, &jerr) : NULL;
    op_error_t err;
    if (call->op->validate(params, call, &err) < 0) {
        fprintf(stderr, "bench %s: invalid call: %s: %s\n", name, err.field, err.message);
        exit(1);
    }
    json_decref(params);
    /* All n calls share input and output memory: the kernels only read inputs, and the
     * outputs' contents do not matter for timing. */
    const void *in[OP_MAX_TENSORS] = {0};
    void *out[OP_MAX_TENSORS] = {0};
    unsigned seed = 1234;
    for (int j = 0; j < call->op->n_inputs; j++) {
        if (!call->has_in[j])
            continue;
        size_t bytes = tensor_desc_bytes(&call->in[j]);
        void *host = malloc(bytes ? bytes : 1);
        fill_random(call->in[j].dtype, host, tensor_desc_numel(&call->in[j]), -1, 1, &seed);
        void *d = gpu_alloc_poisoned(bytes);
        gpu_upload(d, host, bytes);
        free(host);
        in[j] = d;
    }
    for (int j = 0; j < call->n_out; j++)
        out[j] = gpu_alloc_poisoned(tensor_desc_bytes(&call->out[j]));
    const op_call_t **calls = calloc((size_t)n, sizeof *calls);
    const void *const **ins = calloc((size_t)n, sizeof *ins);
    void *const **outs = calloc((size_t)n, sizeof *outs);
    for (int i = 0; i < n; i++) {
        calls[i] = call;
        ins[i] = in;
        outs[i] = out;
    }
    op_run_t run = {ctx, n, calls, ins, outs};
    double ms = bench_time_ms(ctx, run_op, &run, 3, iters);
    bench_row(name, ms, n * call->cost.bytes, n * call->cost.flops);
    free(calls);
    free(ins);
    free(outs);
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        gpu_free((void *)in[j]);
        gpu_free(out[j]);
    }
    return 0;
}
