/* sum, dot on CUDA: a deterministic segmented reduction in two launches for any number of
 * calls. The first launch reduces every tile of every call to one partial in a fixed tree and
 * writes it to scratch (no atomics); the second reduces each call's partials in a fixed order
 * and writes its output. Tiles have a fixed number of elements, so a call's result depends only
 * on its data, not on the grid size or on the other calls of its batch. */
#include "reduce.h"
#include "elementwise_cuda.cuh"

/* A tile is RED_ITERS rounds of RED_UNROLL 16-byte vectors per thread: 64 KiB of f32 input per
 * tile keeps the partials (and the second launch) small next to the input. reduce.h's f64
 * bound counts the additions these sizes give (32 elements a thread, tiles of 8192). */
#define RED_UNROLL 4
#define RED_ITERS 4

/* One call of a batch, as the kernels see it. */
struct red_seg {
    const void *x;
    const void *y;
    void *out;
    int64_t n;
    int64_t tile_begin; /* global number of the segment's first tile (and partial) */
    int64_t tiles;
    int aligned;
};

/* How an input type accumulates: A is the accumulator, step() adds one element (or product)
 * with explicit rounding so that the compiler cannot reassociate or fuse differently. */
template <typename D> struct red_acc;
template <> struct red_acc<gj_f32> {
    typedef float A;
};
template <> struct red_acc<gj_f16> {
    typedef float A;
};
template <> struct red_acc<gj_bf16> {
    typedef float A;
};
template <> struct red_acc<gj_f64> {
    typedef double A;
};
template <> struct red_acc<gj_i32> {
    typedef unsigned long long A;
};

template <typename D, bool DOT>
static __device__ __forceinline__ float red_step(float acc, typename D::S x, typename D::S y)
{
    return DOT ? __fmaf_rn(D::load(x), D::load(y), acc) : __fadd_rn(acc, D::load(x));
}

template <typename D, bool DOT>
static __device__ __forceinline__ double red_step(double acc, double x, double y)
{
    return DOT ? __fma_rn(x, y, acc) : __dadd_rn(acc, x);
}

template <typename D, bool DOT>
static __device__ __forceinline__ unsigned long long red_step(unsigned long long acc, int32_t x,
                                                              int32_t y)
{
    long long v = DOT ? (long long)x * (long long)y : (long long)x;
    return acc + (unsigned long long)v;
}

template <typename D> static constexpr int64_t red_tile_elems()
{
    return (int64_t)GJ_BLOCK * RED_UNROLL * RED_ITERS * (16 / sizeof(typename D::S));
}

/* This thread's share of tile `tile` of one call. Thread t takes the same elements in the same
 * order on the vector path and on the element path (used for the partial last tile and for
 * unaligned inputs), so the result never depends on the path taken. */
template <typename D, bool DOT>
static __device__ __forceinline__ typename red_acc<D>::A red_tile(const red_seg &s, int64_t tile)
{
    typedef typename D::S S;
    typedef typename red_acc<D>::A A;
    constexpr int V = 16 / sizeof(S);
    constexpr int64_t TILE = red_tile_elems<D>();
    const S *x = (const S *)s.x, *y = (const S *)s.y;
    const int64_t base = tile * TILE;
    const int64_t len = s.n - base < TILE ? s.n - base : TILE;
    A acc = 0;
    if (len == TILE && s.aligned) {
#pragma unroll 1
        for (int it = 0; it < RED_ITERS; it++) {
            gj_vec<S> xv[RED_UNROLL], yv[RED_UNROLL];
            const int64_t v0 = base / V + (int64_t)it * RED_UNROLL * GJ_BLOCK + threadIdx.x;
#pragma unroll
            for (int u = 0; u < RED_UNROLL; u++) {
                xv[u].raw = gj_load16(x, v0 + u * GJ_BLOCK);
                if (DOT) yv[u].raw = gj_load16(y, v0 + u * GJ_BLOCK);
            }
#pragma unroll
            for (int u = 0; u < RED_UNROLL; u++)
#pragma unroll
                for (int e = 0; e < V; e++)
                    acc = red_step<D, DOT>(acc, xv[u].e[e], DOT ? yv[u].e[e] : xv[u].e[e]);
        }
    } else {
        for (int k = 0; k < RED_ITERS * RED_UNROLL; k++) {
            const int64_t i0 = base + ((int64_t)k * GJ_BLOCK + threadIdx.x) * V;
            for (int e = 0; e < V; e++)
                if (i0 + e < base + len)
                    acc = red_step<D, DOT>(acc, x[i0 + e], DOT ? y[i0 + e] : x[i0 + e]);
        }
    }
    return acc;
}

/* First launch: partials[t] = the sum of global tile t, grid-stride over all tiles. */
template <typename D, bool DOT>
static __global__ void __launch_bounds__(GJ_BLOCK)
    red_partials_kernel(red_seg one, const red_seg *segs, int nseg, int64_t tiles,
                        typename red_acc<D>::A *partials)
{
    typedef typename red_acc<D>::A A;
    __shared__ A smem[GJ_BLOCK / 32];
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        A acc;
        if (!segs) {
            acc = red_tile<D, DOT>(one, t);
        } else {
            const red_seg s = segs[gj_seg_find(segs, nseg, t)];
            acc = red_tile<D, DOT>(s, t - s.tile_begin);
        }
        acc = gj_block_reduce(acc, gj_op_add(), A(0), smem);
        if (threadIdx.x == 0) partials[t] = acc;
    }
}

static __device__ __forceinline__ void red_store(void *out, float v)
{
    *(float *)out = v;
}
static __device__ __forceinline__ void red_store(void *out, double v)
{
    *(double *)out = v;
}
static __device__ __forceinline__ void red_store(void *out, unsigned long long v)
{
    *(long long *)out = (long long)v;
}

/* Second launch: block b reduces the partials of segment b (thread t takes partials t, t + B,
 * ... in order, then the fixed block tree) and writes its output; an empty call gets 0. */
template <typename A>
static __global__ void __launch_bounds__(GJ_BLOCK)
    red_finish_kernel(red_seg one, const red_seg *segs, const A *partials)
{
    __shared__ A smem[GJ_BLOCK / 32];
    const red_seg s = segs ? segs[blockIdx.x] : one;
    A acc = 0;
    for (int64_t i = threadIdx.x; i < s.tiles; i += GJ_BLOCK)
        acc = acc + partials[s.tile_begin + i];
    acc = gj_block_reduce(acc, gj_op_add(), A(0), smem);
    if (threadIdx.x == 0) red_store(s.out, acc);
}

/* Scratch holds the segment list (batches only) followed by the partials. */
template <typename D, bool DOT>
static int red_launch(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                      const void *const *const *in, void *const *const *out, op_error_t *err)
{
    typedef typename red_acc<D>::A A;
    const int64_t tile_elems = red_tile_elems<D>();
    red_seg *segs = (red_seg *)malloc((size_t)n * sizeof *segs);
    if (!segs) return op_error(err, -ENOMEM, "", "out of host memory for %d segments", n);
    int64_t tiles = 0;
    for (int i = 0; i < n; i++) {
        const red_params_t *p = OP_PARAMS(calls[i], const red_params_t);
        red_seg s = {in[i][0], DOT ? in[i][1] : NULL, out[i][0], p->n, tiles, 0, 0};
        s.tiles = (p->n + tile_elems - 1) / tile_elems;
        s.aligned = gj_aligned16(s.x) && (!DOT || gj_aligned16(s.y));
        segs[i] = s;
        tiles += s.tiles;
    }
    const size_t seg_bytes = n > 1 ? ((size_t)n * sizeof *segs + 15) / 16 * 16 : 0;
    const size_t scratch_bytes = seg_bytes + (size_t)tiles * sizeof(A);
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    int r = 0;
    void *scratch = NULL;
    if (scratch_bytes > 0) {
        scratch = ctx->scratch_alloc(ctx->pool, scratch_bytes);
        if (!scratch)
            r = op_error(err, -ENOMEM, "", "no scratch memory for %zu bytes of partials",
                         scratch_bytes);
    }
    const red_seg *dev_segs = n > 1 ? (const red_seg *)scratch : NULL;
    A *partials = (A *)((char *)scratch + seg_bytes);
    if (r == 0 && n > 1) {
        cudaError_t e = cudaMemcpyAsync(scratch, segs, (size_t)n * sizeof *segs,
                                        cudaMemcpyHostToDevice, stream);
        if (e != cudaSuccess) r = gj_cuda_error(err, e);
    }
    if (r == 0 && tiles > 0) {
        unsigned grid = gj_grid_size(ctx->device, tiles);
        red_partials_kernel<D, DOT>
            <<<grid, GJ_BLOCK, 0, stream>>>(segs[0], dev_segs, n, tiles, partials);
        r = gj_check_launch(err);
    }
    if (r == 0) {
        red_finish_kernel<A><<<n, GJ_BLOCK, 0, stream>>>(segs[0], dev_segs, partials);
        r = gj_check_launch(err);
    }
    if (scratch) ctx->scratch_free(ctx->pool, scratch);
    free(segs);
    return r;
}

template <bool DOT>
static int red_dispatch(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                        const void *const *const *in, void *const *const *out, op_error_t *err)
{
    switch (OP_PARAMS(calls[0], const red_params_t)->dtype) {
    case DTYPE_F32:
        return red_launch<gj_f32, DOT>(ctx, n, calls, in, out, err);
    case DTYPE_F16:
        return red_launch<gj_f16, DOT>(ctx, n, calls, in, out, err);
    case DTYPE_BF16:
        return red_launch<gj_bf16, DOT>(ctx, n, calls, in, out, err);
    case DTYPE_F64:
        return red_launch<gj_f64, DOT>(ctx, n, calls, in, out, err);
    case DTYPE_I32:
        return red_launch<gj_i32, DOT>(ctx, n, calls, in, out, err);
    default:
        return op_error(err, -EINVAL, "inputs.x.dtype", "unsupported dtype");
    }
}

extern "C" int op_sum_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                               const void *const *const *in, void *const *const *out,
                               op_error_t *err)
{
    return red_dispatch<false>(ctx, n, calls, in, out, err);
}

extern "C" int op_dot_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                               const void *const *const *in, void *const *const *out,
                               op_error_t *err)
{
    return red_dispatch<true>(ctx, n, calls, in, out, err);
}
