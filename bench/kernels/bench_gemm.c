/* gemm cases: 8192^3 in bf16, f16, tf32, f32, f64 (the FP64 tensor cores' DGEMM) and i8
 * (TFLOP/s against torch.matmul and torch._int_mm), i8 also with b given transposed ([n, k], so
 * no copy is made before the tensor-core GEMM), and 4096 GEMMs of 64^3 in bf16, f32 and f64
 * three ways: n calls in one run_cuda (the pointer-array form), one call with a leading dim of
 * 4096 (strided batch), and a loop of 4096 single calls. bench/peer/torch_gemm.py times the same
 * work in PyTorch. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kernels/gemm.h"
#include "support/gpu_support.h"

static void gemm_bench_call(op_call_t *call, dtype_t dt, int64_t batch, int64_t m, int64_t n,
                            int64_t k)
{
    memset(call, 0, sizeof *call);
    call->op = &op_gemm;
    if (batch > 1) {
        call->in[0] = (tensor_desc_t){dt, 3, {batch, m, k}};
        call->in[1] = (tensor_desc_t){dt, 3, {batch, k, n}};
    } else {
        call->in[0] = (tensor_desc_t){dt, 2, {m, k}};
        call->in[1] = (tensor_desc_t){dt, 2, {k, n}};
    }
    call->has_in[0] = call->has_in[1] = true;
}

typedef struct gemm_loop {
    const op_cuda_ctx_t *ctx;
    const op_call_t *call;
    const void *in[3];
    void *out[1];
    int n;
} gemm_loop_t;

/* n separate run_cuda calls of one GEMM each: what the batched form saves. */
static void gemm_loop_run(void *arg)
{
    gemm_loop_t *l = arg;
    const void *const *ins[1] = {l->in};
    void *const *outs[1] = {l->out};
    op_error_t err;
    for (int i = 0; i < l->n; i++)
        if (op_gemm.run_cuda(l->ctx, 1, &l->call, ins, outs, &err) < 0) {
            fprintf(stderr, "bench gemm loop: %s\n", err.message);
            exit(1);
        }
}

static void gemm_bench_loop(const op_cuda_ctx_t *ctx, const char *name, dtype_t dt, int64_t m,
                            int64_t n, int64_t k, int count)
{
    op_call_t call;
    gemm_bench_call(&call, dt, 1, m, n, k);
    op_error_t err;
    if (op_gemm.validate(NULL, &call, &err) < 0) {
        fprintf(stderr, "bench %s: %s\n", name, err.message);
        exit(1);
    }
    gemm_loop_t l = {ctx, &call, {NULL}, {NULL}, count};
    unsigned seed = 99;
    for (int j = 0; j < 2; j++) {
        size_t bytes = tensor_desc_bytes(&call.in[j]);
        void *host = malloc(bytes);
        fill_random(dt, host, tensor_desc_numel(&call.in[j]), -1, 1, &seed);
        l.in[j] = gpu_alloc_poisoned(bytes);
        gpu_upload((void *)l.in[j], host, bytes);
        free(host);
    }
    l.out[0] = gpu_alloc_poisoned(tensor_desc_bytes(&call.out[0]));
    double ms = bench_time_ms(ctx, gemm_loop_run, &l, 2, 20);
    bench_row(name, ms, count * call.cost.bytes, count * call.cost.flops);
    gpu_free((void *)l.in[0]);
    gpu_free((void *)l.in[1]);
    gpu_free(l.out[0]);
}

void bench_gemm(const op_cuda_ctx_t *ctx)
{
    static const struct {
        const char *name;
        dtype_t dt;
        const char *params;
    } big[] = {
        {"gemm/bf16/8192x8192x8192", DTYPE_BF16, NULL},
        {"gemm/f16/8192x8192x8192", DTYPE_F16, NULL},
        {"gemm/tf32/8192x8192x8192", DTYPE_F32, "{\"tf32\": true}"},
        {"gemm/f32/8192x8192x8192", DTYPE_F32, NULL},
        {"gemm/f64/8192x8192x8192", DTYPE_F64, NULL},
        {"gemm/i8/8192x8192x8192", DTYPE_I8, NULL},
        {"gemm/i8/8192x8192x8192/trans_b", DTYPE_I8, "{\"trans_b\": true}"},
    };
    op_call_t call;
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        gemm_bench_call(&call, big[i].dt, 1, 8192, 8192, 8192);
        bench_op(ctx, big[i].name, &call, big[i].params, 1, 20);
    }
    static const struct {
        const char *prefix;
        dtype_t dt;
    } small[] = {{"gemm/bf16/64x64x64x4096", DTYPE_BF16},
                 {"gemm/f32/64x64x64x4096", DTYPE_F32},
                 {"gemm/f64/64x64x64x4096", DTYPE_F64}};
    char name[96];
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        gemm_bench_call(&call, small[i].dt, 1, 64, 64, 64);
        snprintf(name, sizeof name, "%s/batched", small[i].prefix);
        bench_op(ctx, name, &call, NULL, 4096, 50);
        gemm_bench_call(&call, small[i].dt, 4096, 64, 64, 64);
        snprintf(name, sizeof name, "%s/strided", small[i].prefix);
        bench_op(ctx, name, &call, NULL, 1, 50);
        snprintf(name, sizeof name, "%s/loop", small[i].prefix);
        gemm_bench_loop(ctx, name, small[i].dt, 64, 64, 64, 4096);
    }
}
