/* Elementwise, reduction and quantization cases, each on 1 GiB of x (f32, bf16, and f64 for the
 * arithmetic and the reductions), plus the device-to-device copy ceiling they are measured
 * against. bench/peer/torch_elementwise.py times the same work
 * in PyTorch under the same case names, with the same byte counts. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kernels/elementwise.h"
#include "kernels/quantize.h"
#include "kernels/reduce.h"
#include "support/gpu_support.h"

#define EWB_GIB (1ull << 30)
#define EWB_WARMUP 3
#define EWB_ITERS 30
/* Random bytes are generated for this much of each input and repeated over the rest: filling
 * gigabytes element by element on the host would take most of a minute. */
#define EWB_PATTERN_BYTES (8u << 20)

static void ewb_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_elementwise: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* Device memory of `bytes` holding random values of dtype dt in [lo, hi]: a random pattern,
 * then copies of it doubling in length. */
static void *ewb_alloc_random(dtype_t dt, size_t bytes, double lo, double hi, unsigned *seed)
{
    void *d = NULL;
    ewb_check(cudaMalloc(&d, bytes ? bytes : 1), "cudaMalloc");
    size_t pattern = bytes < EWB_PATTERN_BYTES ? bytes : EWB_PATTERN_BYTES;
    void *host = malloc(pattern ? pattern : 1);
    fill_random(dt, host, (int64_t)(pattern / dtype_size(dt)), lo, hi, seed);
    ewb_check(cudaMemcpy(d, host, pattern, cudaMemcpyHostToDevice), "upload");
    free(host);
    for (size_t done = pattern; done < bytes;) {
        size_t n = done < bytes - done ? done : bytes - done;
        ewb_check(cudaMemcpy((char *)d + done, d, n, cudaMemcpyDeviceToDevice), "fill");
        done += n;
    }
    return d;
}

typedef struct ewb_run {
    const op_cuda_ctx_t *ctx;
    const op_call_t *call;
    const void *in[OP_MAX_TENSORS];
    void *out[OP_MAX_TENSORS];
} ewb_run_t;

static void ewb_run_op(void *arg)
{
    ewb_run_t *r = arg;
    const op_call_t *calls[1] = {r->call};
    const void *const *ins[1] = {r->in};
    void *const *outs[1] = {r->out};
    op_error_t err;
    if (r->call->op->run_cuda(r->ctx, 1, calls, ins, outs, &err) < 0) {
        fprintf(stderr, "bench_elementwise: %s failed: %s\n", r->call->op->name, err.message);
        exit(1);
    }
}

/* Validates op on the given inputs with params, fills the inputs with random values in
 * [lo, hi], times run_cuda and prints the row with the call's own cost. */
static void ewb_case(const op_cuda_ctx_t *ctx, const char *name, const op_def_t *op,
                     const char *params_json, int n_in, const tensor_desc_t *in, double lo,
                     double hi)
{
    op_call_t call = {.op = op};
    for (int j = 0; j < n_in; j++) {
        call.in[j] = in[j];
        call.has_in[j] = true;
    }
    json_error_t jerr;
    json_t *params = params_json ? json_loads(params_json, 0, &jerr) : NULL;
    op_error_t err;
    if (op->validate(params, &call, &err) < 0) {
        fprintf(stderr, "bench %s: invalid call: %s: %s\n", name, err.field, err.message);
        exit(1);
    }
    json_decref(params);
    ewb_run_t run = {.ctx = ctx, .call = &call};
    unsigned seed = 1234;
    for (int j = 0; j < n_in; j++)
        run.in[j] = ewb_alloc_random(in[j].dtype, tensor_desc_bytes(&in[j]), lo, hi, &seed);
    for (int j = 0; j < call.n_out; j++)
        run.out[j] = gpu_alloc_poisoned(tensor_desc_bytes(&call.out[j]));
    double ms = bench_time_ms(ctx, ewb_run_op, &run, EWB_WARMUP, EWB_ITERS);
    bench_row(name, ms, call.cost.bytes, call.cost.flops);
    for (int j = 0; j < n_in; j++)
        gpu_free((void *)run.in[j]);
    for (int j = 0; j < call.n_out; j++)
        gpu_free(run.out[j]);
}

typedef struct ewb_copy {
    cudaStream_t stream;
    void *dst;
    const void *src;
    size_t bytes;
} ewb_copy_t;

static void ewb_run_copy(void *arg)
{
    ewb_copy_t *c = arg;
    ewb_check(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, c->stream),
              "copy");
}

/* The ceiling: a 1 GiB device-to-device copy moves 2 GiB (read + write). */
static void ewb_copy_ceiling(const op_cuda_ctx_t *ctx)
{
    unsigned seed = 99;
    ewb_copy_t c = {(cudaStream_t)ctx->stream, NULL, NULL, EWB_GIB};
    c.src = ewb_alloc_random(DTYPE_F32, EWB_GIB, -1, 1, &seed);
    c.dst = gpu_alloc_poisoned(EWB_GIB);
    double ms = bench_time_ms(ctx, ewb_run_copy, &c, EWB_WARMUP, EWB_ITERS);
    bench_row("ceiling/copy/1GiB", ms, 2.0 * EWB_GIB, 0);
    gpu_free((void *)c.src);
    gpu_free(c.dst);
}

static tensor_desc_t ewb_vec(dtype_t dt, uint64_t bytes)
{
    return (tensor_desc_t){.dtype = dt, .ndim = 1, .shape = {(int64_t)(bytes / dtype_size(dt))}};
}

void bench_elementwise(const op_cuda_ctx_t *ctx)
{

    ewb_copy_ceiling(ctx);
    tensor_desc_t f32[2] = {ewb_vec(DTYPE_F32, EWB_GIB), ewb_vec(DTYPE_F32, EWB_GIB)};
    tensor_desc_t bf16[2] = {ewb_vec(DTYPE_BF16, EWB_GIB), ewb_vec(DTYPE_BF16, EWB_GIB)};
    ewb_case(ctx, "add/f32/1GiB", &op_add, NULL, 2, f32, -1, 1);
    ewb_case(ctx, "add/bf16/1GiB", &op_add, NULL, 2, bf16, -1, 1);
    ewb_case(ctx, "mul/f32/1GiB", &op_mul, NULL, 2, f32, -1, 1);
    ewb_case(ctx, "saxpy/f32/1GiB", &op_saxpy, "{\"a\": 2.5}", 2, f32, -1, 1);
    ewb_case(ctx, "sum/f32/1GiB", &op_sum, NULL, 1, f32, -1, 1);
    ewb_case(ctx, "dot/f32/1GiB", &op_dot, NULL, 2, f32, -1, 1);
    tensor_desc_t f64[2] = {ewb_vec(DTYPE_F64, EWB_GIB), ewb_vec(DTYPE_F64, EWB_GIB)};
    ewb_case(ctx, "add/f64/1GiB", &op_add, NULL, 2, f64, -1, 1);
    ewb_case(ctx, "mul/f64/1GiB", &op_mul, NULL, 2, f64, -1, 1);
    ewb_case(ctx, "saxpy/f64/1GiB", &op_saxpy, "{\"a\": 2.5}", 2, f64, -1, 1);
    ewb_case(ctx, "sum/f64/1GiB", &op_sum, NULL, 1, f64, -1, 1);
    ewb_case(ctx, "dot/f64/1GiB", &op_dot, NULL, 2, f64, -1, 1);
    /* Per tensor without a given scale: a max pass, then the quantize pass. */
    ewb_case(ctx, "quantize/f32/1GiB", &op_quantize, NULL, 1, f32, -3, 3);
    /* The scale comes from the same range as q; its value does not change the work. */
    tensor_desc_t dq[2] = {ewb_vec(DTYPE_I8, EWB_GIB), {.dtype = DTYPE_F32, .ndim = 0}};
    ewb_case(ctx, "dequantize/i8/1GiB", &op_dequantize, NULL, 2, dq, -127, 127);
    /* Per channel along the rows of a [16384, 16384] weight: runs of 16384 elements share a
     * channel, and there are more channels than the max pass keeps in shared memory. */
    tensor_desc_t rows_f32 = {.dtype = DTYPE_F32, .ndim = 2, .shape = {16384, 16384}};
    ewb_case(ctx, "quantize/f32/1GiB/per_channel", &op_quantize, "{\"axis\": 0}", 1, &rows_f32, -3,
             3);
    tensor_desc_t dq_rows[2] = {{.dtype = DTYPE_I8, .ndim = 2, .shape = {32768, 32768}},
                                ewb_vec(DTYPE_F32, 32768 * sizeof(float))};
    ewb_case(ctx, "dequantize/i8/1GiB/per_channel", &op_dequantize, "{\"axis\": 0}", 2, dq_rows,
             -127, 127);
}
