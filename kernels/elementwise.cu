/* add, mul, saxpy on CUDA: one kernel per (op, dtype, broadcast) that runs any number of calls
 * of any sizes in one launch over a segment list, and a twin for the common single call that
 * takes the call by value and skips the segment search.
 *
 * Both give every block one tile: the launch is as many blocks as tiles. Each thread moves
 * EW_UNROLL 16-byte vectors of x (and of y), all loads issued before any arithmetic, through
 * the evict-first streaming path. One vector per thread and a block per tile is the fastest
 * of the shapes tried on the H200, ahead of more vectors per thread and of a grid-stride loop
 * (bench/README.md, "Kernel shapes"). */
#include "elementwise.h"
#include "elementwise_cuda.cuh"

/* 16-byte vectors of x (and of y) per thread per tile; see above. */
#define EW_UNROLL 1

/* One call of a batch, as the kernel sees it. */
struct ew_seg {
    const void *x;
    const void *y;
    void *out;
    int64_t n;
    int64_t tile_begin; /* global number of the segment's first tile */
    double a;
    uint32_t a_u32;
    int aligned; /* x, y and out all 16-byte aligned: the vector path may run */
};

template <int K> static __device__ __forceinline__ float ew_apply(float a, float x, float y)
{
    if (K == EW_ADD) return __fadd_rn(x, y);
    if (K == EW_MUL) return __fmul_rn(x, y);
    return __fadd_rn(__fmul_rn(a, x), y);
}

template <int K> static __device__ __forceinline__ double ew_apply(double a, double x, double y)
{
    if (K == EW_ADD) return __dadd_rn(x, y);
    if (K == EW_MUL) return __dmul_rn(x, y);
    return __dadd_rn(__dmul_rn(a, x), y);
}

template <int K>
static __device__ __forceinline__ uint32_t ew_apply(uint32_t a, uint32_t x, uint32_t y)
{
    if (K == EW_ADD) return x + y;
    if (K == EW_MUL) return x * y;
    return a * x + y;
}

static __device__ __forceinline__ void ew_factor(const ew_seg &s, float *a)
{
    *a = (float)s.a;
}
static __device__ __forceinline__ void ew_factor(const ew_seg &s, double *a)
{
    *a = s.a;
}
static __device__ __forceinline__ void ew_factor(const ew_seg &s, uint32_t *a)
{
    *a = s.a_u32;
}

template <typename D> static constexpr int64_t ew_tile_elems()
{
    return (int64_t)GJ_BLOCK * EW_UNROLL * (16 / sizeof(typename D::S));
}

/* Tile `tile` (numbered within the segment) of one call. A full, aligned tile moves 16-byte
 * vectors; the last, partial tile goes element by element. The index math is multiplications
 * and shifts only. */
template <typename D, int K, bool YS>
static __device__ __forceinline__ void ew_tile(const ew_seg &s, int64_t tile)
{
    typedef typename D::S S;
    typedef typename D::C C;
    constexpr int V = 16 / sizeof(S);
    constexpr int64_t TILE = ew_tile_elems<D>();
    const S *x = (const S *)s.x, *y = (const S *)s.y;
    S *out = (S *)s.out;
    const int64_t base = tile * TILE;
    const int64_t len = s.n - base < TILE ? s.n - base : TILE;
    C a;
    ew_factor(s, &a);
    const C y0 = YS ? D::load(y[0]) : C();
    if (len == TILE && s.aligned) {
        gj_vec<S> xv[EW_UNROLL], yv[EW_UNROLL];
        const int64_t v0 = tile * (TILE / V) + threadIdx.x;
#pragma unroll
        for (int u = 0; u < EW_UNROLL; u++) {
            xv[u].raw = gj_load16_stream(x, v0 + u * GJ_BLOCK);
            if (!YS) yv[u].raw = gj_load16_stream(y, v0 + u * GJ_BLOCK);
        }
#pragma unroll
        for (int u = 0; u < EW_UNROLL; u++) {
            gj_vec<S> ov;
#pragma unroll
            for (int e = 0; e < V; e++)
                ov.e[e] =
                    D::store(ew_apply<K>(a, D::load(xv[u].e[e]), YS ? y0 : D::load(yv[u].e[e])));
            gj_store16_stream(out, v0 + u * GJ_BLOCK, ov.raw);
        }
    } else {
        for (int64_t i = base + threadIdx.x; i < base + len; i += GJ_BLOCK)
            out[i] = D::store(ew_apply<K>(a, D::load(x[i]), YS ? y0 : D::load(y[i])));
    }
}

/* One call, by value: the unbatched launch needs no segment upload and no search. */
template <typename D, int K, bool YS>
static __global__ void __launch_bounds__(GJ_BLOCK) ew_kernel_one(ew_seg one, int64_t tiles)
{
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x)
        ew_tile<D, K, YS>(one, t);
}

/* nseg calls: a block finds the segment of its tile by binary search. */
template <typename D, int K, bool YS>
static __global__ void __launch_bounds__(GJ_BLOCK)
    ew_kernel_batch(const ew_seg *segs, int nseg, int64_t tiles)
{
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        const ew_seg s = segs[gj_seg_find(segs, nseg, t)];
        ew_tile<D, K, YS>(s, t - s.tile_begin);
    }
}

template <typename D, int K, bool YS>
static int ew_launch(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                     const void *const *const *in, void *const *const *out, op_error_t *err)
{
    const int64_t tile_elems = ew_tile_elems<D>();
    ew_seg *segs = (ew_seg *)malloc((size_t)n * sizeof *segs);
    if (!segs) return op_error(err, -ENOMEM, "", "out of host memory for %d segments", n);
    int nseg = 0;
    int64_t tiles = 0;
    for (int i = 0; i < n; i++) {
        const ew_params_t *p = OP_PARAMS(calls[i], const ew_params_t);
        if (p->n == 0) continue;
        ew_seg s = {in[i][0], in[i][1], out[i][0], p->n, tiles, p->a, p->a_u32, 0};
        s.aligned = gj_aligned16(s.x) && (YS || gj_aligned16(s.y)) && gj_aligned16(s.out);
        segs[nseg++] = s;
        tiles += (p->n + tile_elems - 1) / tile_elems;
    }
    int r = 0;
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    const unsigned grid = gj_grid_one_tile_per_block(tiles);
    if (nseg == 1) {
        ew_kernel_one<D, K, YS><<<grid, GJ_BLOCK, 0, stream>>>(segs[0], tiles);
        r = gj_check_launch(err);
    } else if (nseg > 1) {
        void *dev = NULL;
        r = gj_upload(ctx, segs, (size_t)nseg * sizeof *segs, &dev, err);
        if (r == 0) {
            ew_kernel_batch<D, K, YS>
                <<<grid, GJ_BLOCK, 0, stream>>>((const ew_seg *)dev, nseg, tiles);
            r = gj_check_launch(err);
            ctx->scratch_free(ctx->pool, dev);
        }
    }
    free(segs);
    return r;
}

template <int K, typename D>
static int ew_dispatch_bcast(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                             const void *const *const *in, void *const *const *out, op_error_t *err)
{
    if (OP_PARAMS(calls[0], const ew_params_t)->y_scalar)
        return ew_launch<D, K, true>(ctx, n, calls, in, out, err);
    return ew_launch<D, K, false>(ctx, n, calls, in, out, err);
}

/* Equal batch keys guarantee that every call has calls[0]'s dtype and broadcasting. */
template <int K>
static int ew_dispatch(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                       const void *const *const *in, void *const *const *out, op_error_t *err)
{
    switch (OP_PARAMS(calls[0], const ew_params_t)->dtype) {
    case DTYPE_F32:
        return ew_dispatch_bcast<K, gj_f32>(ctx, n, calls, in, out, err);
    case DTYPE_F16:
        return ew_dispatch_bcast<K, gj_f16>(ctx, n, calls, in, out, err);
    case DTYPE_BF16:
        return ew_dispatch_bcast<K, gj_bf16>(ctx, n, calls, in, out, err);
    case DTYPE_F64:
        return ew_dispatch_bcast<K, gj_f64>(ctx, n, calls, in, out, err);
    case DTYPE_I32:
        return ew_dispatch_bcast<K, gj_i32>(ctx, n, calls, in, out, err);
    default:
        return op_error(err, -EINVAL, "inputs.x.dtype", "unsupported dtype");
    }
}

extern "C" int op_add_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                               const void *const *const *in, void *const *const *out,
                               op_error_t *err)
{
    return ew_dispatch<EW_ADD>(ctx, n, calls, in, out, err);
}

extern "C" int op_mul_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                               const void *const *const *in, void *const *const *out,
                               op_error_t *err)
{
    return ew_dispatch<EW_MUL>(ctx, n, calls, in, out, err);
}

extern "C" int op_saxpy_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                                 const void *const *const *in, void *const *const *out,
                                 op_error_t *err)
{
    return ew_dispatch<EW_SAXPY>(ctx, n, calls, in, out, err);
}
