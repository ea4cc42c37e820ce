/* quantize, dequantize on CUDA, any number of calls per launch over a segment list.
 *
 * quantize without a given scale is two passes: a max pass that folds max|x| of each channel
 * into scratch with integer atomicMax on the float's bits (exact for non-negative floats, so
 * the order of the atomics cannot change the result), then the apply pass that writes q and the
 * scale. Both passes walk "units": unit k of a call covers element tile k (if the call has
 * that many tiles) and scale entries [k * GJ_BLOCK, (k + 1) * GJ_BLOCK), so that a call with
 * no elements still writes its scale.
 *
 * Full tiles load 16-byte vectors whatever the channel axis: a thread walks the elements of a
 * vector with their channel found once per vector and then stepped, so no element costs a
 * division. dequantize reads 4-byte words of q and writes each as one float4, so both sides of
 * a warp's access are contiguous. */
#include "quantize.h"
#include "elementwise_cuda.cuh"

/* 16-byte vectors of input per thread per tile. */
#define QUANT_UNROLL 4
/* 4-byte words of q per thread per tile of dequantize: two is the fastest of two, four and
 * eight on the H200 (bench/README.md, "Kernel shapes"). */
#define DEQUANT_UNROLL 2
#define DEQUANT_TILE ((int64_t)GJ_BLOCK * DEQUANT_UNROLL * 4)
/* Per-channel max with at most this many channels collects in shared memory first. */
#define QUANT_SMEM_CHANNELS 4096

/* One call of a batch, as the kernels see it. */
struct quant_seg {
    const void *x;         /* x (quantize) or q (dequantize) */
    const float *scale_in; /* the given scale, or NULL */
    void *out;             /* q (quantize) or out (dequantize) */
    float *scale_out;      /* quantize's scale output */
    unsigned *cmax;        /* per-channel max |x| bits, in scratch (quantize without scale) */
    int64_t n, channels, inner;
    int64_t tiles;      /* element tiles */
    int64_t tile_begin; /* global number of the segment's first unit */
    int aligned;        /* input and output aligned for the vector path of full tiles */
};

static __device__ __forceinline__ signed char quant_round(float v)
{
    int r = __float2int_rn(v); /* NaN -> 0, out of range saturates */
    return (signed char)(r < -127 ? -127 : r > 127 ? 127 : r);
}

static __device__ __forceinline__ float quant_scale_of(const quant_seg &s, int64_t c)
{
    if (s.scale_in) return s.scale_in[c];
    float sc = __fdiv_rn(__uint_as_float(s.cmax[c]), 127.0f);
    return sc == 0.0f ? 1.0f : sc;
}

static __device__ __forceinline__ int64_t quant_channel(const quant_seg &s, int64_t i)
{
    int64_t within, c;
    gj_divmod(gj_divmod(i, s.inner, &within), s.channels, &c);
    return c;
}

/* Where element i lies: its channel c, and r, its place in the run of `inner` consecutive
 * elements of one channel. quant_pos_next moves to element i + 1 without dividing. */
struct quant_pos {
    int64_t c, r;
};

static __device__ __forceinline__ quant_pos quant_pos_at(const quant_seg &s, int64_t i)
{
    quant_pos p;
    gj_divmod(gj_divmod(i, s.inner, &p.r), s.channels, &p.c);
    return p;
}

static __device__ __forceinline__ void quant_pos_next(const quant_seg &s, quant_pos *p)
{
    if (++p->r == s.inner) {
        p->r = 0;
        if (++p->c == s.channels) p->c = 0;
    }
}

template <typename In, int UNROLL> static constexpr int64_t quant_tile_elems()
{
    return (int64_t)GJ_BLOCK * UNROLL * (16 / sizeof(typename In::S));
}

/* The segment of global unit t and the unit's number within it. */
static __device__ __forceinline__ quant_seg quant_find(const quant_seg &one, const quant_seg *segs,
                                                       int nseg, int64_t t, int64_t *unit)
{
    if (!segs) {
        *unit = t;
        return one;
    }
    quant_seg s = segs[gj_seg_find(segs, nseg, t)];
    *unit = t - s.tile_begin;
    return s;
}

/* Max pass, per tensor: this thread's max |x| over tile `tile` (fmaxf drops NaNs). */
template <typename D>
static __device__ __forceinline__ float quant_max_tile_tensor(const quant_seg &s, int64_t tile)
{
    typedef typename D::S S;
    constexpr int V = 16 / sizeof(S);
    constexpr int64_t TILE = quant_tile_elems<D, QUANT_UNROLL>();
    const S *x = (const S *)s.x;
    const int64_t base = tile * TILE;
    const int64_t len = s.n - base < TILE ? s.n - base : TILE;
    float m = 0.0f;
    if (len == TILE && s.aligned) {
        gj_vec<S> xv[QUANT_UNROLL];
        const int64_t v0 = base / V + threadIdx.x;
#pragma unroll
        for (int u = 0; u < QUANT_UNROLL; u++)
            xv[u].raw = gj_load16(x, v0 + u * GJ_BLOCK);
#pragma unroll
        for (int u = 0; u < QUANT_UNROLL; u++)
#pragma unroll
            for (int e = 0; e < V; e++)
                m = fmaxf(m, fabsf(D::load(xv[u].e[e])));
    } else {
        for (int64_t i = base + threadIdx.x; i < base + len; i += GJ_BLOCK)
            m = fmaxf(m, fabsf(D::load(x[i])));
    }
    return m;
}

/* Folds the block's per-thread maxima into *dst: one atomic per block and segment. */
static __device__ __forceinline__ void quant_max_flush(float m, unsigned *dst, float *red)
{
    m = gj_block_reduce(m, gj_op_max(), 0.0f, red);
    if (threadIdx.x == 0 && m > 0.0f) atomicMax(dst, __float_as_uint(m));
}

/* Max pass, per channel. A tile inside one run of a channel (long runs: channels along a
 * leading axis) is reduced like a per-tensor tile, with one atomic per block. Otherwise each
 * thread keeps a running max while its elements stay in one channel and folds it in when the
 * channel changes: into shared memory when the channels fit (then once per channel into
 * global), else straight into global memory. Both branches are block-uniform. */
template <typename D>
static __device__ __forceinline__ void quant_max_tile_channel(const quant_seg &s, int64_t tile,
                                                              unsigned *smem_c, float *red)
{
    typedef typename D::S S;
    constexpr int V = 16 / sizeof(S);
    constexpr int64_t TILE = quant_tile_elems<D, QUANT_UNROLL>();
    const S *x = (const S *)s.x;
    const int64_t base = tile * TILE;
    const int64_t len = s.n - base < TILE ? s.n - base : TILE;
    int64_t first_r, last_r;
    const int64_t first_run = gj_divmod(base, s.inner, &first_r);
    if (gj_divmod(base + len - 1, s.inner, &last_r) == first_run) {
        int64_t c;
        gj_divmod(first_run, s.channels, &c);
        quant_max_flush(quant_max_tile_tensor<D>(s, tile), &s.cmax[c], red);
        return;
    }
    const bool shared = s.channels <= QUANT_SMEM_CHANNELS;
    if (shared) {
        for (int64_t c = threadIdx.x; c < s.channels; c += GJ_BLOCK)
            smem_c[c] = 0;
        __syncthreads();
    }
    unsigned *dst = shared ? smem_c : s.cmax;
    int64_t cur_c = -1;
    unsigned cur = 0;
    /* Folds |v| of channel c into the running max; false for NaN, which the max ignores. */
    auto fold = [&](int64_t c, float v) {
        if (c != cur_c) {
            if (cur) atomicMax(&dst[cur_c], cur);
            cur_c = c;
            cur = 0;
        }
        const float a = fabsf(v);
        if (a > 0.0f) cur = max(cur, __float_as_uint(a));
    };
    if (len == TILE && s.aligned) {
        gj_vec<S> xv[QUANT_UNROLL];
        const int64_t v0 = tile * (TILE / V) + threadIdx.x;
#pragma unroll
        for (int u = 0; u < QUANT_UNROLL; u++)
            xv[u].raw = gj_load16(x, v0 + u * GJ_BLOCK);
#pragma unroll
        for (int u = 0; u < QUANT_UNROLL; u++) {
            quant_pos p = quant_pos_at(s, (v0 + u * GJ_BLOCK) * V);
#pragma unroll
            for (int e = 0; e < V; e++) {
                fold(p.c, D::load(xv[u].e[e]));
                quant_pos_next(s, &p);
            }
        }
    } else {
        for (int64_t i = base + threadIdx.x; i < base + len; i += GJ_BLOCK)
            fold(quant_channel(s, i), D::load(x[i]));
    }
    if (cur) atomicMax(&dst[cur_c], cur);
    if (shared) {
        __syncthreads();
        for (int64_t c = threadIdx.x; c < s.channels; c += GJ_BLOCK)
            if (smem_c[c]) atomicMax(&s.cmax[c], smem_c[c]);
        __syncthreads();
    }
}

/* Per tensor, a block keeps its running max across the tiles of one segment and folds it in
 * when its tiles move on to another segment (block-uniform, so the barriers are safe). */
template <typename D, bool PC>
static __global__ void __launch_bounds__(GJ_BLOCK)
    quant_max_kernel(quant_seg one, const quant_seg *segs, int nseg, int64_t units)
{
    __shared__ unsigned smem_c[PC ? QUANT_SMEM_CHANNELS : 1];
    __shared__ float red[GJ_BLOCK / 32];
    float m = 0.0f;
    unsigned *dst = NULL;
    for (int64_t t = blockIdx.x; t < units; t += gridDim.x) {
        int64_t tile;
        const quant_seg s = quant_find(one, segs, nseg, t, &tile);
        if (tile >= s.tiles) continue; /* a scale-only unit */
        if (PC) {
            quant_max_tile_channel<D>(s, tile, smem_c, red);
            continue;
        }
        if (s.cmax != dst) {
            if (dst) quant_max_flush(m, dst, red);
            dst = s.cmax;
            m = 0.0f;
        }
        m = fmaxf(m, quant_max_tile_tensor<D>(s, tile));
    }
    if (!PC && dst) quant_max_flush(m, dst, red);
}

/* Packs V int8 results into one store of V bytes. */
template <int V> struct quant_bytes;
template <> struct quant_bytes<4> {
    union {
        unsigned raw;
        signed char e[4];
    };
};
template <> struct quant_bytes<8> {
    union {
        uint2 raw;
        signed char e[8];
    };
};

/* Apply pass of quantize: q of one tile. Per channel, a thread derives a channel's scale once
 * for each run of its elements in that channel. */
template <typename D, bool PC>
static __device__ __forceinline__ void quant_apply_tile(const quant_seg &s, int64_t tile)
{
    typedef typename D::S S;
    constexpr int V = 16 / sizeof(S);
    constexpr int64_t TILE = quant_tile_elems<D, QUANT_UNROLL>();
    const S *x = (const S *)s.x;
    signed char *q = (signed char *)s.out;
    const int64_t base = tile * TILE;
    const int64_t len = s.n - base < TILE ? s.n - base : TILE;
    float scale = PC ? 0.0f : quant_scale_of(s, 0);
    int64_t scale_c = PC ? -1 : 0;
    if (len == TILE && s.aligned) {
        gj_vec<S> xv[QUANT_UNROLL];
        const int64_t v0 = tile * (TILE / V) + threadIdx.x;
#pragma unroll
        for (int u = 0; u < QUANT_UNROLL; u++)
            xv[u].raw = gj_load16(x, v0 + u * GJ_BLOCK);
#pragma unroll
        for (int u = 0; u < QUANT_UNROLL; u++) {
            const int64_t vi = v0 + u * GJ_BLOCK;
            quant_bytes<V> qb;
            quant_pos p = {0, 0};
            if (PC) p = quant_pos_at(s, vi * V);
#pragma unroll
            for (int e = 0; e < V; e++) {
                if (PC) {
                    if (p.c != scale_c) {
                        scale_c = p.c;
                        scale = quant_scale_of(s, p.c);
                    }
                    quant_pos_next(s, &p);
                }
                qb.e[e] = quant_round(__fdiv_rn(D::load(xv[u].e[e]), scale));
            }
            ((decltype(qb.raw) *)q)[vi] = qb.raw;
        }
    } else {
        for (int64_t i = base + threadIdx.x; i < base + len; i += GJ_BLOCK) {
            if (PC) scale = quant_scale_of(s, quant_channel(s, i));
            q[i] = quant_round(__fdiv_rn(D::load(x[i]), scale));
        }
    }
}

template <typename D, bool PC>
static __global__ void __launch_bounds__(GJ_BLOCK)
    quant_apply_kernel(quant_seg one, const quant_seg *segs, int nseg, int64_t units)
{
    for (int64_t t = blockIdx.x; t < units; t += gridDim.x) {
        int64_t unit;
        const quant_seg s = quant_find(one, segs, nseg, t, &unit);
        const int64_t c = unit * GJ_BLOCK + threadIdx.x;
        if (c < s.channels) s.scale_out[c] = quant_scale_of(s, c);
        if (unit < s.tiles) quant_apply_tile<D, PC>(s, unit);
    }
}

/* dequantize: out = q * scale of one tile. A full tile gives each thread DEQUANT_UNROLL words
 * of four q, GJ_BLOCK words apart, and writes each word as one float4: a warp reads 128
 * contiguous bytes and writes 512 per instruction. */
template <bool PC>
static __device__ __forceinline__ void dequant_tile(const quant_seg &s, int64_t tile)
{
    const signed char *q = (const signed char *)s.x;
    float *out = (float *)s.out;
    const int64_t base = tile * DEQUANT_TILE;
    const int64_t len = s.n - base < DEQUANT_TILE ? s.n - base : DEQUANT_TILE;
    const float sc = PC ? 0.0f : s.scale_in[0];
    if (len == DEQUANT_TILE && s.aligned) {
        quant_bytes<4> w[DEQUANT_UNROLL];
        const int64_t w0 = tile * (DEQUANT_TILE / 4) + threadIdx.x;
#pragma unroll
        for (int u = 0; u < DEQUANT_UNROLL; u++)
            w[u].raw = __ldcs((const unsigned *)q + w0 + u * GJ_BLOCK);
#pragma unroll
        for (int u = 0; u < DEQUANT_UNROLL; u++) {
            const int64_t wi = w0 + u * GJ_BLOCK;
            float r[4];
            quant_pos p = {0, 0};
            if (PC) p = quant_pos_at(s, wi * 4);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                r[e] = __fmul_rn((float)w[u].e[e], PC ? s.scale_in[p.c] : sc);
                if (PC) quant_pos_next(s, &p);
            }
            __stcs((float4 *)out + wi, make_float4(r[0], r[1], r[2], r[3]));
        }
    } else {
        for (int64_t i = base + threadIdx.x; i < base + len; i += GJ_BLOCK) {
            const float scale = PC ? s.scale_in[quant_channel(s, i)] : sc;
            out[i] = __fmul_rn((float)q[i], scale);
        }
    }
}

template <bool PC>
static __global__ void __launch_bounds__(GJ_BLOCK)
    dequant_kernel(quant_seg one, const quant_seg *segs, int nseg, int64_t units)
{
    for (int64_t t = blockIdx.x; t < units; t += gridDim.x) {
        int64_t unit;
        const quant_seg s = quant_find(one, segs, nseg, t, &unit);
        dequant_tile<PC>(s, unit);
    }
}

/* Builds the segments of n calls with tiles of tile_elems elements; with `with_scale_units`,
 * each call has at least enough units to write its scale. Returns the total units. */
static int64_t quant_segments(int n, const op_call_t *const *calls, const void *const *const *in,
                              void *const *const *out, int64_t tile_elems, bool quantize,
                              quant_seg *segs)
{
    int64_t units = 0;
    for (int i = 0; i < n; i++) {
        const quant_params_t *p = OP_PARAMS(calls[i], const quant_params_t);
        quant_seg s = {};
        s.x = in[i][0];
        s.scale_in = p->has_scale ? (const float *)in[i][1] : NULL;
        s.out = out[i][0];
        s.scale_out = quantize ? (float *)out[i][1] : NULL;
        s.n = p->n;
        s.channels = p->channels;
        s.inner = p->inner;
        s.tiles = (p->n + tile_elems - 1) / tile_elems;
        s.tile_begin = units;
        /* quantize: 16-byte vectors of x, q stored 4 or 8 bytes at a time; dequantize: words
         * of q, float4 of out. */
        s.aligned = quantize ? gj_aligned16(s.x) && gj_aligned16(s.out)
                             : gj_aligned4(s.x) && gj_aligned16(s.out);
        int64_t scale_units = quantize ? (p->channels + GJ_BLOCK - 1) / GJ_BLOCK : 0;
        units += s.tiles > scale_units ? s.tiles : scale_units;
        segs[i] = s;
    }
    return units;
}

/* Scratch: the segment list (batches only), then the channel maxima (quantize without scale). */
template <typename D, bool PC>
static int quant_launch(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                        const void *const *const *in, void *const *const *out, bool quantize,
                        op_error_t *err)
{
    const int64_t tile_elems = quantize ? quant_tile_elems<D, QUANT_UNROLL>() : DEQUANT_TILE;
    quant_seg *segs = (quant_seg *)malloc((size_t)n * sizeof *segs);
    if (!segs) return op_error(err, -ENOMEM, "", "out of host memory for %d segments", n);
    const int64_t units = quant_segments(n, calls, in, out, tile_elems, quantize, segs);
    const bool find_max = quantize && !OP_PARAMS(calls[0], const quant_params_t)->has_scale;
    int64_t channels = 0;
    for (int i = 0; find_max && i < n; i++)
        channels += segs[i].channels;
    const size_t seg_bytes = n > 1 ? ((size_t)n * sizeof *segs + 15) / 16 * 16 : 0;
    const size_t scratch_bytes = seg_bytes + (size_t)channels * sizeof(unsigned);
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    int r = 0;
    void *scratch = NULL;
    if (units > 0 && scratch_bytes > 0) {
        scratch = ctx->scratch_alloc(ctx->pool, scratch_bytes);
        if (!scratch)
            r = op_error(err, -ENOMEM, "", "no scratch memory for %zu bytes", scratch_bytes);
    }
    if (r == 0 && units > 0) {
        unsigned *cmax = (unsigned *)((char *)scratch + seg_bytes);
        for (int i = 0; find_max && i < n; i++) {
            segs[i].cmax = cmax;
            cmax += segs[i].channels;
        }
        const quant_seg *dev_segs = n > 1 ? (const quant_seg *)scratch : NULL;
        cudaError_t e = cudaSuccess;
        if (n > 1)
            e = cudaMemcpyAsync(scratch, segs, (size_t)n * sizeof *segs, cudaMemcpyHostToDevice,
                                stream);
        if (e == cudaSuccess && channels > 0)
            e = cudaMemsetAsync((char *)scratch + seg_bytes, 0, (size_t)channels * sizeof(unsigned),
                                stream);
        if (e != cudaSuccess) r = gj_cuda_error(err, e);
        /* quantize's per-tensor max pass keeps a running max per block across tiles: few blocks,
         * few atomics. dequantize carries nothing from tile to tile: a block per tile. */
        const unsigned grid =
            quantize ? gj_grid_size(ctx->device, units) : gj_grid_one_tile_per_block(units);
        if (r == 0 && find_max) {
            quant_max_kernel<D, PC><<<grid, GJ_BLOCK, 0, stream>>>(segs[0], dev_segs, n, units);
            r = gj_check_launch(err);
        }
        if (r == 0 && quantize) {
            quant_apply_kernel<D, PC><<<grid, GJ_BLOCK, 0, stream>>>(segs[0], dev_segs, n, units);
            r = gj_check_launch(err);
        }
        if (r == 0 && !quantize) {
            dequant_kernel<PC><<<grid, GJ_BLOCK, 0, stream>>>(segs[0], dev_segs, n, units);
            r = gj_check_launch(err);
        }
    }
    if (scratch) ctx->scratch_free(ctx->pool, scratch);
    free(segs);
    return r;
}

template <typename D>
static int quant_dispatch_axis(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                               const void *const *const *in, void *const *const *out, bool quantize,
                               op_error_t *err)
{
    if (OP_PARAMS(calls[0], const quant_params_t)->per_channel)
        return quant_launch<D, true>(ctx, n, calls, in, out, quantize, err);
    return quant_launch<D, false>(ctx, n, calls, in, out, quantize, err);
}

extern "C" int op_quantize_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                                    const void *const *const *in, void *const *const *out,
                                    op_error_t *err)
{
    switch (OP_PARAMS(calls[0], const quant_params_t)->dtype) {
    case DTYPE_F32:
        return quant_dispatch_axis<gj_f32>(ctx, n, calls, in, out, true, err);
    case DTYPE_F16:
        return quant_dispatch_axis<gj_f16>(ctx, n, calls, in, out, true, err);
    case DTYPE_BF16:
        return quant_dispatch_axis<gj_bf16>(ctx, n, calls, in, out, true, err);
    default:
        return op_error(err, -EINVAL, "inputs.x.dtype", "unsupported dtype");
    }
}

extern "C" int op_dequantize_run_cuda(const op_cuda_ctx_t *ctx, int n,
                                      const op_call_t *const *calls, const void *const *const *in,
                                      void *const *const *out, op_error_t *err)
{
    /* The input type only matters to quantize; dequantize always reads i8. */
    return quant_dispatch_axis<gj_f32>(ctx, n, calls, in, out, false, err);
}
