/* CUDA helpers shared by the streaming op families (elementwise.cu, reduce.cu, quantize.cu):
 * element types as load/compute/store triples, 16-byte vectors, a deterministic block
 * reduction, the tile-to-segment search of batched launches, and error reporting.
 *
 * Every batched kernel of these families cuts each call ("segment") into tiles of a fixed
 * number of elements; the tiles of all segments are numbered consecutively, and a block finds
 * the segment of its tile by binary search over the segments' first tile numbers. A tile's
 * work therefore never depends on how many calls were batched or how many blocks ran. */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>

#include "op.h"

#define GJ_BLOCK 256
/* Resident blocks per SM at GJ_BLOCK threads: the grid of a grid-stride loop fills the GPU. */
#define GJ_BLOCKS_PER_SM 8

/* Element types: S is how an element is stored, C what it is computed in. 16-bit floats are
 * stored as raw bits so that every type here is plain data. */
struct gj_f32 {
    typedef float S;
    typedef float C;
    static __device__ __forceinline__ float load(float v)
    {
        return v;
    }
    static __device__ __forceinline__ float store(float v)
    {
        return v;
    }
};
struct gj_f16 {
    typedef unsigned short S;
    typedef float C;
    static __device__ __forceinline__ float load(unsigned short v)
    {
        return __half2float(__ushort_as_half(v));
    }
    static __device__ __forceinline__ unsigned short store(float v)
    {
        return __half_as_ushort(__float2half_rn(v));
    }
};
struct gj_bf16 {
    typedef unsigned short S;
    typedef float C;
    static __device__ __forceinline__ float load(unsigned short v)
    {
        return __bfloat162float(__ushort_as_bfloat16(v));
    }
    static __device__ __forceinline__ unsigned short store(float v)
    {
        return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
};
struct gj_f64 {
    typedef double S;
    typedef double C;
    static __device__ __forceinline__ double load(double v)
    {
        return v;
    }
    static __device__ __forceinline__ double store(double v)
    {
        return v;
    }
};
/* i32 computes in u32, where wrapping modulo 2^32 is defined. */
struct gj_i32 {
    typedef int32_t S;
    typedef uint32_t C;
    static __device__ __forceinline__ uint32_t load(int32_t v)
    {
        return (uint32_t)v;
    }
    static __device__ __forceinline__ int32_t store(uint32_t v)
    {
        return (int32_t)v;
    }
};

/* 16 bytes of elements of storage type S, loaded or stored as one vector. */
template <typename S> union gj_vec {
    uint4 raw;
    S e[16 / sizeof(S)];
};

static __device__ __forceinline__ uint4 gj_load16(const void *base, int64_t vec_index)
{
    return __ldg((const uint4 *)base + vec_index);
}

/* st.global, not a generic store: the pointer arrives in a struct, so the compiler cannot tell
 * that it is global memory. */
static __device__ __forceinline__ void gj_store16(void *base, int64_t vec_index, uint4 v)
{
    __stwb((uint4 *)base + vec_index, v);
}

/* Streaming forms for data touched exactly once (elementwise, dequantize): evict-first in L1
 * and L2 (ld/st.global.cs), so a gigabyte passing through does not push out lines that other
 * work on the device may still use, and written lines go back to memory early. */
static __device__ __forceinline__ uint4 gj_load16_stream(const void *base, int64_t vec_index)
{
    return __ldcs((const uint4 *)base + vec_index);
}

static __device__ __forceinline__ void gj_store16_stream(void *base, int64_t vec_index, uint4 v)
{
    __stcs((uint4 *)base + vec_index, v);
}

static inline bool gj_aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

static inline bool gj_aligned4(const void *p)
{
    return ((uintptr_t)p & 3) == 0;
}

/* a / b and a % b for non-negative a and positive b. 64-bit division is a long software
 * routine on the GPU; the 32-bit one is a handful of instructions, so it is used whenever both
 * operands fit. */
static __device__ __forceinline__ int64_t gj_divmod(int64_t a, int64_t b, int64_t *ret_rem)
{
    if (((uint64_t)a | (uint64_t)b) <= UINT32_MAX) {
        const uint32_t q = (uint32_t)a / (uint32_t)b;
        *ret_rem = (int64_t)((uint32_t)a - q * (uint32_t)b);
        return q;
    }
    const int64_t q = a / b;
    *ret_rem = a - q * b;
    return q;
}

/* Index of the segment holding global tile `tile`: the last k with segs[k].tile_begin <= tile.
 * Empty segments share their successor's tile_begin, so the search lands past them. */
template <typename Seg>
static __device__ __forceinline__ int gj_seg_find(const Seg *segs, int nseg, int64_t tile)
{
    int lo = 0, hi = nseg - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (segs[mid].tile_begin <= tile)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

struct gj_op_add {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const
    {
        return a + b;
    }
};
struct gj_op_max {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const
    {
        return a > b ? a : b;
    }
};

/* Reduces one value per thread of a GJ_BLOCK-thread block with op, in a fixed tree (xor
 * butterflies in each warp, then across the warps' results), so the result's bits depend only
 * on the inputs. The result is valid in thread 0. smem holds GJ_BLOCK / 32 values; the call
 * ends with a barrier, so it may be called again right away. */
template <typename T, typename Op>
static __device__ __forceinline__ T gj_block_reduce(T v, Op op, T identity, T *smem)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < GJ_BLOCK / 32 ? smem[lane] : identity;
        for (int off = 16; off > 0; off >>= 1)
            v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    }
    __syncthreads();
    return v;
}

/* Blocks of a grid-stride launch over `tiles` tiles: enough to fill every SM, never more than
 * there are tiles. */
static inline unsigned gj_grid_size(int device, int64_t tiles)
{
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        sms <= 0)
        sms = 1;
    int64_t cap = (int64_t)sms * GJ_BLOCKS_PER_SM;
    return (unsigned)(tiles < cap ? tiles : cap);
}

/* Blocks of a launch that gives each block one tile (the grid-stride loop then runs once per
 * block; only grids beyond the x-dimension limit loop). For streaming kernels with nothing to
 * carry from tile to tile this beat a grid sized to the SMs by 7-8% on the H200: see
 * elementwise.cu. */
static inline unsigned gj_grid_one_tile_per_block(int64_t tiles)
{
    const int64_t cap = 0x7fffffff;
    return (unsigned)(tiles < 1 ? 1 : tiles < cap ? tiles : cap);
}

static inline int gj_cuda_error(op_error_t *err, cudaError_t e)
{
    return op_error(err, -EIO, "", "CUDA: %s", cudaGetErrorString(e));
}

/* The error of the launches just queued, as an op error. */
static inline int gj_check_launch(op_error_t *err)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : gj_cuda_error(err, e);
}

/* Copies a host array of segments into fresh scratch memory, in stream order; *ret_dev is the
 * scratch block, to be given back with scratch_free after the launches that read it are queued.
 * The host array may be freed at once: a copy from pageable memory returns once it is staged. */
static inline int gj_upload(const op_cuda_ctx_t *ctx, const void *host, size_t bytes,
                            void **ret_dev, op_error_t *err)
{
    void *dev = ctx->scratch_alloc(ctx->pool, bytes);
    if (!dev)
        return op_error(err, -ENOMEM, "", "no scratch memory for %zu bytes of segments", bytes);
    cudaError_t e =
        cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)ctx->stream);
    if (e != cudaSuccess) {
        ctx->scratch_free(ctx->pool, dev);
        return gj_cuda_error(err, e);
    }
    *ret_dev = dev;
    return 0;
}
