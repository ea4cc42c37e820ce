/* sort cases: 2^28 u32 keys, 2^28 f32 keys, 2^28 f64 keys (also as an argsort, which gives the
 * keys and i64 indices as torch.sort does), 2^28 u32 -> u32 key-value pairs (one row each: one
 * radix sort), and 1000 rows of 4096 f32 or f64 keys given as 1000 calls in one run_cuda (the
 * batched form: one segmented sort). Keys are uniformly random bits (u32) or uniform floats in
 * [-1, 1), as torch.randint / torch.rand give them to bench/peer/torch_sort.py. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kernels/sort.h"
#include "support/gpu_support.h"

/* xorshift64: fast enough for 2^28 keys on the host. */
static uint64_t sort_bench_rand64(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint32_t sort_bench_rand(uint64_t *s)
{
    return (uint32_t)(sort_bench_rand64(s) >> 32);
}

static void *sort_bench_upload_keys(dtype_t dt, int64_t n, uint64_t *state)
{
    size_t size = dtype_size(dt);
    char *host = malloc((size_t)n * size);
    for (int64_t i = 0; i < n; i++) {
        if (dt == DTYPE_F64) {
            double f = (double)(sort_bench_rand64(state) >> 11) * 0x1p-52 - 1.0; /* [-1, 1) */
            memcpy(host + i * 8, &f, 8);
        } else if (dt == DTYPE_F32) {
            float f = (float)(sort_bench_rand(state) >> 8) * (1.0f / 8388608.0f) - 1.0f;
            memcpy(host + i * 4, &f, 4);
        } else {
            uint32_t r = sort_bench_rand(state);
            memcpy(host + i * 4, &r, 4);
        }
    }
    void *d = gpu_alloc_poisoned((size_t)n * size);
    gpu_upload(d, host, (size_t)n * size);
    free(host);
    return d;
}

typedef struct sort_bench_run {
    const op_cuda_ctx_t *ctx;
    int n;
    const op_call_t **calls;
    const void *const **in;
    void *const **out;
} sort_bench_run_t;

static void sort_bench_once(void *arg)
{
    sort_bench_run_t *r = arg;
    op_error_t err;
    if (op_sort.run_cuda(r->ctx, r->n, r->calls, r->in, r->out, &err) < 0) {
        fprintf(stderr, "bench sort: %s\n", err.message);
        exit(1);
    }
}

/* Times n calls of `rows` x `len` keys (with u32 values when with_values) with params (JSON
 * text or NULL) in one run_cuda; each call has its own inputs and outputs. */
static void sort_bench_case(const op_cuda_ctx_t *ctx, const char *name, dtype_t dt, int64_t rows,
                            int64_t len, bool with_values, const char *params_json, int n,
                            int iters)
{
    op_call_t call;
    memset(&call, 0, sizeof call);
    call.op = &op_sort;
    call.in[0] = rows > 1 ? (tensor_desc_t){dt, 2, {rows, len}} : (tensor_desc_t){dt, 1, {len}};
    call.has_in[0] = true;
    if (with_values) {
        call.in[1] = call.in[0];
        call.in[1].dtype = DTYPE_U32;
        call.has_in[1] = true;
    }
    op_error_t err;
    json_t *params = params_json ? json_loads(params_json, 0, NULL) : NULL;
    if (op_sort.validate(params, &call, &err) < 0) {
        fprintf(stderr, "bench %s: %s\n", name, err.message);
        exit(1);
    }
    json_decref(params);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    const op_call_t **calls = calloc((size_t)n, sizeof *calls);
    const void *(*in)[2] = calloc((size_t)n, sizeof *in);
    void *(*out)[2] = calloc((size_t)n, sizeof *out);
    const void *const **ins = calloc((size_t)n, sizeof *ins);
    void *const **outs = calloc((size_t)n, sizeof *outs);
    int64_t numel = rows * len;
    for (int i = 0; i < n; i++) {
        calls[i] = &call;
        in[i][0] = sort_bench_upload_keys(dt, numel, &state);
        if (with_values) in[i][1] = sort_bench_upload_keys(DTYPE_U32, numel, &state);
        for (int j = 0; j < call.n_out; j++)
            out[i][j] = gpu_alloc_poisoned(tensor_desc_bytes(&call.out[j]));
        ins[i] = in[i];
        outs[i] = out[i];
    }
    sort_bench_run_t run = {ctx, n, calls, ins, outs};
    double ms = bench_time_ms(ctx, sort_bench_once, &run, 3, iters);
    bench_row(name, ms, n * call.cost.bytes, 0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 2; j++) {
            gpu_free((void *)in[i][j]);
            gpu_free(out[i][j]);
        }
    free(calls);
    free(in);
    free(out);
    free(ins);
    free(outs);
}

void bench_sort(const op_cuda_ctx_t *ctx)
{
    sort_bench_case(ctx, "sort/u32/2^28", DTYPE_U32, 1, 1 << 28, false, NULL, 1, 20);
    sort_bench_case(ctx, "sort/f32/2^28", DTYPE_F32, 1, 1 << 28, false, NULL, 1, 20);
    sort_bench_case(ctx, "sort/u32-u32/2^28", DTYPE_U32, 1, 1 << 28, true, NULL, 1, 20);
    sort_bench_case(ctx, "sort/f32/1000x4096", DTYPE_F32, 1, 4096, false, NULL, 1000, 20);
    sort_bench_case(ctx, "sort/f64/2^28", DTYPE_F64, 1, 1 << 28, false, NULL, 1, 20);
    sort_bench_case(ctx, "sort/f64/2^28/argsort", DTYPE_F64, 1, 1 << 28, false,
                    "{\"argsort\": true}", 1, 20);
    sort_bench_case(ctx, "sort/f64/1000x4096", DTYPE_F64, 1, 4096, false, NULL, 1000, 20);
}
