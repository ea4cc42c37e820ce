/* conv2d on CUDA: an implicit-GEMM convolution on tensor cores with the epilogue fused into its
 * single store, and a direct kernel for depthwise and narrow grouped shapes.
 *
 * The implicit GEMM, per group g:  out[m, k] = sum_kk A[m, kk] * B[kk, k]  with
 *   m  = (n, p, q)            M = N * P * Q
 *   k  = output channel       K = K / groups
 *   kk = (r, s, c)            C/groups * R * S  (channels fastest)
 * To feed it with 16-byte cp.async loads, x is first repacked from NCHW to NHWC with each
 * group's channels zero-padded to a multiple of 16 bytes, and w from KCRS to K,R,S,C likewise;
 * then every 16-byte chunk of a row of A is either wholly inside the image or wholly padding.
 * The repacked tensors are inputs in another layout, not intermediate results: the convolution
 * itself, the epilogue and the NCHW store happen in one pass, out of registers.
 *
 * f16 / bf16 use mma.sync m16n8k16 with f32 accumulation. f32 uses 3xTF32 (a = big + small,
 * a*b ~ big*big + big*small + small*big on m16n8k8 TF32), which keeps f32 accuracy on tensor
 * cores. The epilogue (bias, batchnorm) is folded per call into y = acc * scale[k] + shift[k]
 * (computed in double) by the same "prep" launch that repacks x and w.
 *
 * Batched form: n calls with one batch key share every shape. Their pointers travel in the
 * kernel parameters (up to CONV_INLINE_SEGS calls) or in a table in scratch, and grid z (grid y
 * for the direct kernel) runs over the calls, so n calls cost the launches of one: prep, then
 * the convolution. */
#include "conv2d.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The bias / batchnorm vectors of one call: slot order of CONV2D_IN_BIAS .. CONV2D_IN_BN_VAR. */
#define CONV_N_VECS (CONV2D_N_INPUTS - CONV2D_IN_BIAS)

/* What one call of a batch needs on the device; the table of them lives in scratch. */
typedef struct conv_seg {
    const void *x;
    const void *w;
    const void *vec[CONV_N_VECS];
    int vec_dtype[CONV_N_VECS];
    void *out;
    double eps;
} conv_seg_t;

/* The calls of one run: up to CONV_INLINE_SEGS travel inside the kernel parameters (no copy
 * to the device before the launch); more go to a table in scratch. */
#define CONV_INLINE_SEGS 8
typedef struct conv_batch {
    const conv_seg_t *table; /* NULL: the calls are in seg[] */
    int n_calls;
    conv_seg_t seg[CONV_INLINE_SEGS];
} conv_batch_t;

static __device__ __forceinline__ const conv_seg_t *conv_seg_of(const conv_batch_t &b, int call)
{
    return b.table ? &b.table[call] : &b.seg[call];
}

/* The shape of every call of a batch, passed by value to each kernel. */
typedef struct conv_shape {
    int n, c, h, w;     /* x */
    int k, r, s;        /* w: output channels and kernel size */
    int p, q;           /* out spatial size */
    int sh, sw, ph, pw; /* stride, padding */
    int dh, dw;         /* dilation */
    int groups, cg, kg; /* groups; input and output channels per group */
    int cgp;            /* GEMM path: channels per group padded to a 16-byte multiple */
    int kred;           /* GEMM path: reduction length r * s * cgp */
    uint32_t epilogue;
} conv_shape_t;

/* ---- element types ---- */

template <typename T> struct conv_elem;
template <> struct conv_elem<float> {
    static __device__ __forceinline__ float to_f32(float v)
    {
        return v;
    }
    static __device__ __forceinline__ float from_f32(float v)
    {
        return v;
    }
};
template <> struct conv_elem<__half> {
    static __device__ __forceinline__ float to_f32(__half v)
    {
        return __half2float(v);
    }
    static __device__ __forceinline__ __half from_f32(float v)
    {
        return __float2half_rn(v);
    }
};
template <> struct conv_elem<__nv_bfloat16> {
    static __device__ __forceinline__ float to_f32(__nv_bfloat16 v)
    {
        return __bfloat162float(v);
    }
    static __device__ __forceinline__ __nv_bfloat16 from_f32(float v)
    {
        return __float2bfloat16_rn(v);
    }
};

static __device__ double conv_load_vec(const void *v, int dtype, int k)
{
    switch (dtype) {
    case DTYPE_F16:
        return __half2float(((const __half *)v)[k]);
    case DTYPE_BF16:
        return __bfloat162float(((const __nv_bfloat16 *)v)[k]);
    default:
        return ((const float *)v)[k];
    }
}

/* ---- kernels ---- */

/* One thread per output element, straight from NCHW x and KCRS w, f32 accumulation. For
 * depthwise and grouped convolutions with few channels per group, where a GEMM tile would be
 * mostly padding. */
template <typename T, bool AFFINE, bool RELU>
static __global__ void conv_direct_kernel(const __grid_constant__ conv_batch_t batch,
                                          conv_shape_t sh, const float *scale_shift)
{
    const int64_t total = (int64_t)sh.n * sh.k * sh.p * sh.q;
    for (int call = blockIdx.y; call < batch.n_calls; call += gridDim.y) {
        const conv_seg_t *sg = conv_seg_of(batch, call);
        const T *x = (const T *)sg->x, *w = (const T *)sg->w;
        T *out = (T *)sg->out;
        const float *scale = AFFINE ? scale_shift + (size_t)call * 2 * sh.k : NULL;
        const float *shift = AFFINE ? scale + sh.k : NULL;
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
             i += (int64_t)gridDim.x * blockDim.x) {
            int oq = (int)(i % sh.q);
            int64_t t = i / sh.q;
            int op = (int)(t % sh.p);
            t /= sh.p;
            int k = (int)(t % sh.k);
            int n = (int)(t / sh.k);
            const T *xg = x + ((int64_t)n * sh.c + (int64_t)(k / sh.kg) * sh.cg) * sh.h * sh.w;
            const T *wk = w + (int64_t)k * sh.cg * sh.r * sh.s;
            const int ih0 = op * sh.sh - sh.ph, iw0 = oq * sh.sw - sh.pw;
            float acc = 0.f;
            for (int c = 0; c < sh.cg; c++)
                for (int r = 0; r < sh.r; r++) {
                    int ih = ih0 + r * sh.dh;
                    if (ih < 0 || ih >= sh.h) continue;
                    const T *xrow = xg + ((int64_t)c * sh.h + ih) * sh.w;
                    const T *wrow = wk + ((int64_t)c * sh.r + r) * sh.s;
                    for (int s = 0; s < sh.s; s++) {
                        int iw = iw0 + s * sh.dw;
                        if (iw >= 0 && iw < sh.w)
                            acc = fmaf(conv_elem<T>::to_f32(xrow[iw]),
                                       conv_elem<T>::to_f32(wrow[s]), acc);
                    }
                }
            if (AFFINE) acc = fmaf(acc, scale[k], shift[k]);
            if (RELU) acc = fmaxf(acc, 0.f);
            out[i] = conv_elem<T>::from_f32(acc);
        }
    }
}

/* Folds bias and batchnorm of one call into scale_shift = {scale[K], shift[K]} so that the
 * epilogue is y = acc * scale + shift. Computed in double: the fold itself adds no error beyond
 * the final f32 rounding of scale and shift. */
static __device__ void conv_fold(const conv_seg_t *sg, int k_out, uint32_t epilogue, int k,
                                 float *scale_shift)
{
    double bias =
        (epilogue & CONV2D_EPI_BIAS) ? conv_load_vec(sg->vec[0], sg->vec_dtype[0], k) : 0.0;
    double sc = 1.0, sf = bias;
    if (epilogue & CONV2D_EPI_BATCHNORM) {
        double g = conv_load_vec(sg->vec[1], sg->vec_dtype[1], k);
        double b = conv_load_vec(sg->vec[2], sg->vec_dtype[2], k);
        double mean = conv_load_vec(sg->vec[3], sg->vec_dtype[3], k);
        double var = conv_load_vec(sg->vec[4], sg->vec_dtype[4], k);
        sc = g / sqrt(var + sg->eps);
        sf = (bias - mean) * sc + b;
    }
    scale_shift[k] = (float)sc;
    scale_shift[k_out + k] = (float)sf;
}

/* Tiles of the x repack: 32 pixels by 64 (padded) channels of one image. */
#define CONV_PACK_HW 32
#define CONV_PACK_C 64

template <typename T> struct alignas(2 * sizeof(T)) conv_pair {
    T a, b;
};

/* Repacks one tile of x from NCHW to [N][H][W][groups][cgp] (zero in the padding channels),
 * through shared memory so that reads and writes are both coalesced; writes go two channels
 * at a time (cgp is even). 256 threads. */
template <typename T>
static __device__ void conv_pack_x_tile(const conv_batch_t &batch, const conv_shape_t &sh, int tile,
                                        T *xh, T (*smem)[CONV_PACK_HW + 1])
{
    /* 32-bit index math throughout (64-bit division is a long subroutine); the entry keeps
     * the repacked x of every call within int32 elements. */
    const int hw_total = sh.h * sh.w, cp_total = sh.groups * sh.cgp;
    const int tiles_hw = (hw_total + CONV_PACK_HW - 1) / CONV_PACK_HW;
    const int tiles_c = (cp_total + CONV_PACK_C - 1) / CONV_PACK_C;
    const int tz = tile / tiles_hw, th = tile - tz * tiles_hw;
    const int z = tz / tiles_c, tc = tz - z * tiles_c;
    const int call = z / sh.n, n = z - call * sh.n;
    const T *x = (const T *)conv_seg_of(batch, call)->x + (int64_t)n * sh.c * hw_total;
    T *dst = xh + ((int64_t)call * sh.n + n) * hw_total * cp_total;
    const int hw0 = th * CONV_PACK_HW, c0 = tc * CONV_PACK_C;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hw = hw0 + lane;
    /* Padded channel c0 + warp as (group, channel in group), then stepped by 8 per row. */
    int g = (c0 + warp) / sh.cgp, cg = c0 + warp - g * sh.cgp;
#pragma unroll
    for (int i = warp; i < CONV_PACK_C; i += 8) {
        T v = conv_elem<T>::from_f32(0.f);
        if (c0 + i < cp_total && cg < sh.cg && hw < hw_total)
            v = x[(g * sh.cg + cg) * hw_total + hw]; /* within x: int32 by validation */
        smem[i][lane] = v;
        for (cg += 8; cg >= sh.cgp; cg -= sh.cgp)
            g++;
    }
    __syncthreads();
    for (int i = warp; i < CONV_PACK_HW; i += 8) {
        const int hw = hw0 + i, cp = c0 + 2 * lane;
        if (hw < hw_total && cp < cp_total) {
            conv_pair<T> v = {smem[2 * lane][i], smem[2 * lane + 1][i]};
            *(conv_pair<T> *)(dst + (int64_t)hw * cp_total + cp) = v;
        }
    }
    __syncthreads();
}

/* Everything before the convolution, in one launch of 256-thread blocks: blocks
 * [0, x_blocks) repack x tiles, the next w_blocks repack w from KCRS to [K][R][S][cgp], the
 * rest fold the epilogue vectors. Each part is grid-strided over its own blocks. */
template <typename T>
static __global__ void __launch_bounds__(256)
    conv_prep_kernel(const __grid_constant__ conv_batch_t batch, conv_shape_t sh, T *xh, T *wh,
                     float *scale_shift, int x_blocks, int w_blocks)
{
    __shared__ T smem[CONV_PACK_C][CONV_PACK_HW + 1];
    const int b = blockIdx.x;
    if (b < x_blocks) {
        const int hw_total = sh.h * sh.w, cp_total = sh.groups * sh.cgp;
        const int tiles = batch.n_calls * sh.n * ((hw_total + CONV_PACK_HW - 1) / CONV_PACK_HW) *
                          ((cp_total + CONV_PACK_C - 1) / CONV_PACK_C);
        for (int t = b; t < tiles; t += x_blocks)
            conv_pack_x_tile<T>(batch, sh, t, xh, smem);
    } else if (b < x_blocks + w_blocks) {
        /* 32-bit index math: the entry keeps k * kred within int32. */
        const int per_call = sh.k * sh.kred, rs_total = sh.r * sh.s;
        for (int call = 0; call < batch.n_calls; call++) {
            const T *w = (const T *)conv_seg_of(batch, call)->w;
            T *dst = wh + (int64_t)call * per_call;
            for (int i = (b - x_blocks) * 256 + threadIdx.x; i < per_call; i += w_blocks * 256) {
                const int k = i / sh.kred, kk = i - k * sh.kred;
                const int rs = kk / sh.cgp, c = kk - rs * sh.cgp;
                dst[i] =
                    c < sh.cg ? w[(k * sh.cg + c) * rs_total + rs] : conv_elem<T>::from_f32(0.f);
            }
        }
    } else {
        const int fold_blocks = gridDim.x - x_blocks - w_blocks;
        const int64_t total = (int64_t)batch.n_calls * sh.k;
        for (int64_t i = (int64_t)(b - x_blocks - w_blocks) * 256 + threadIdx.x; i < total;
             i += (int64_t)fold_blocks * 256) {
            const int call = (int)(i / sh.k), k = (int)(i % sh.k);
            conv_fold(conv_seg_of(batch, call), sh.k, sh.epilogue, k,
                      scale_shift + (size_t)call * 2 * sh.k);
        }
    }
}

/* ---- the implicit GEMM ---- */

static __device__ __forceinline__ void conv_cp_async16(void *smem, const void *gmem, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int bytes = valid ? 16 : 0; /* 0: the 16 bytes are zero-filled, nothing is read */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}

static __device__ __forceinline__ void conv_cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> static __device__ __forceinline__ void conv_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void conv_ldmatrix_x4(uint32_t r[4], const void *smem)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* c += a * b on one m16n8k16 tile (f16 or bf16 in, f32 accumulate). */
template <typename T>
static __device__ __forceinline__ void conv_mma16816(float c[4], const uint32_t a[4],
                                                     const uint32_t b[2]);
template <>
__device__ __forceinline__ void conv_mma16816<__half>(float c[4], const uint32_t a[4],
                                                      const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void conv_mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                             const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

static __device__ __forceinline__ void conv_mma_tf32(float c[4], const uint32_t a[4],
                                                     const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Splits x into a TF32 big part and a TF32 remainder, for 3xTF32. */
static __device__ __forceinline__ void conv_split_tf32(float x, uint32_t *big, uint32_t *small)
{
    uint32_t b, s;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(b) : "f"(x));
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(s) : "f"(x - __uint_as_float(b)));
    *big = b;
    *small = s;
}

/* Tile configuration of the implicit GEMM: a BM x BN output tile per block, BK of the
 * reduction per pipeline stage, warps of WM x WN. */
template <typename T, int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_> struct conv_cfg {
    typedef T elem;
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int CE = 16 / (int)sizeof(T); /* elements per 16-byte chunk */
    static constexpr int PITCH = BK + CE;          /* smem row pitch: +16 bytes, no conflicts */
    static constexpr int CPR = BK / CE;            /* chunks per tile row */
    static constexpr int RPP = THREADS / CPR;      /* tile rows loaded per pass */
    static constexpr int A_ITERS = BM / RPP, B_ITERS = BN / RPP;
    static constexpr int MI = WM / 16, NI = WN / 8; /* mma tiles per warp */
    static constexpr int OUT_PITCH = BM + CE;
    static constexpr size_t PIPE_BYTES = (size_t)STAGES * (BM + BN) * PITCH * sizeof(T);
    static constexpr size_t OUT_BYTES = (size_t)BN * OUT_PITCH * sizeof(T) + BM * sizeof(int);
    static constexpr size_t SMEM_BYTES = PIPE_BYTES > OUT_BYTES ? PIPE_BYTES : OUT_BYTES;
    static_assert(THREADS % CPR == 0 && BM % RPP == 0 && BN % RPP == 0, "loader mapping");
    static_assert(NI % 2 == 0, "B fragments are loaded two n8 tiles at a time");
};

/* The warp's share of one BK slice: MI x NI mma tiles, fragments from shared memory. */
template <typename CFG, typename T>
static __device__ __forceinline__ void conv_mma_stage_half(float (&acc)[CFG::MI][CFG::NI][4],
                                                           const T *as, const T *bs, int lane)
{
#pragma unroll
    for (int kk = 0; kk < CFG::BK; kk += 16) {
        uint32_t a[CFG::MI][4], b[CFG::NI][2];
#pragma unroll
        for (int i = 0; i < CFG::MI; i++)
            conv_ldmatrix_x4(a[i], as + (i * 16 + (lane & 15)) * CFG::PITCH + kk + (lane >> 4) * 8);
#pragma unroll
        for (int j = 0; j < CFG::NI; j += 2) {
            uint32_t r[4];
            conv_ldmatrix_x4(r, bs + (j * 8 + (lane & 7) + (lane >> 4) * 8) * CFG::PITCH + kk +
                                    ((lane >> 3) & 1) * 8);
            b[j][0] = r[0];
            b[j][1] = r[1];
            b[j + 1][0] = r[2];
            b[j + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < CFG::MI; i++)
#pragma unroll
            for (int j = 0; j < CFG::NI; j++)
                conv_mma16816<T>(acc[i][j], a[i], b[j]);
    }
}

template <typename CFG>
static __device__ __forceinline__ void
conv_mma_stage_f32(float (&acc)[CFG::MI][CFG::NI][4], const float *as, const float *bs, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    constexpr int KS = CFG::BK / 8;
    uint32_t ab[KS][CFG::MI][4], asm_[KS][CFG::MI][4], bb[KS][CFG::NI][2], bsm[KS][CFG::NI][2];
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
#pragma unroll
        for (int i = 0; i < CFG::MI; i++) {
            const float *row = as + (i * 16 + g) * CFG::PITCH + ks * 8 + t;
            conv_split_tf32(row[0], &ab[ks][i][0], &asm_[ks][i][0]);
            conv_split_tf32(row[8 * CFG::PITCH], &ab[ks][i][1], &asm_[ks][i][1]);
            conv_split_tf32(row[4], &ab[ks][i][2], &asm_[ks][i][2]);
            conv_split_tf32(row[8 * CFG::PITCH + 4], &ab[ks][i][3], &asm_[ks][i][3]);
        }
#pragma unroll
        for (int j = 0; j < CFG::NI; j++) {
            const float *row = bs + (j * 8 + g) * CFG::PITCH + ks * 8 + t;
            conv_split_tf32(row[0], &bb[ks][j][0], &bsm[ks][j][0]);
            conv_split_tf32(row[4], &bb[ks][j][1], &bsm[ks][j][1]);
        }
    }
    /* The tensor cores' f32 accumulation does not round to nearest, so its error grows with
     * the length of the chain; each stage's products go to a fresh partial sum that one
     * correctly rounded add folds into acc. Small cross terms first, big product last. */
#pragma unroll
    for (int i = 0; i < CFG::MI; i++)
#pragma unroll
        for (int j = 0; j < CFG::NI; j++) {
            float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                conv_mma_tf32(part, asm_[ks][i], bb[ks][j]);
                conv_mma_tf32(part, ab[ks][i], bsm[ks][j]);
                conv_mma_tf32(part, ab[ks][i], bb[ks][j]);
            }
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] += part[e];
        }
}

template <typename CFG, typename T> struct conv_stage_mma {
    static __device__ __forceinline__ void run(float (&acc)[CFG::MI][CFG::NI][4], const T *as,
                                               const T *bs, int lane)
    {
        conv_mma_stage_half<CFG, T>(acc, as, bs, lane);
    }
};
template <typename CFG> struct conv_stage_mma<CFG, float> {
    static __device__ __forceinline__ void run(float (&acc)[CFG::MI][CFG::NI][4], const float *as,
                                               const float *bs, int lane)
    {
        conv_mma_stage_f32<CFG>(acc, as, bs, lane);
    }
};

/* The implicit-GEMM convolution. Grid: x over M tiles, y over (group, N tile), z over calls.
 * xh / wh are the repacked inputs of all calls back to back; the output of each call goes
 * straight to its NCHW tensor after the epilogue, staged through shared memory so that the
 * stores along P*Q are coalesced. */
template <typename CFG, bool AFFINE, bool RELU>
static __global__ void __launch_bounds__(CFG::THREADS)
    conv_igemm_kernel(const __grid_constant__ conv_batch_t batch, conv_shape_t sh,
                      const typename CFG::elem *xh, const typename CFG::elem *wh,
                      const float *scale_shift)
{
    typedef typename CFG::elem T;
    extern __shared__ __align__(16) unsigned char conv_smem[];
    T *smem = (T *)conv_smem;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp / CFG::WARPS_N, warp_n = warp % CFG::WARPS_N;
    const int call = blockIdx.z;
    const int tiles_n = (sh.kg + CFG::BN - 1) / CFG::BN;
    const int grp = blockIdx.y / tiles_n;
    const int m0 = blockIdx.x * CFG::BM, n0 = (blockIdx.y % tiles_n) * CFG::BN;
    const int pq = sh.p * sh.q, m_total = sh.n * pq;
    const int cp_total = sh.groups * sh.cgp;

    const T *x = xh + (int64_t)call * sh.n * sh.h * sh.w * cp_total + grp * sh.cgp;
    const T *w = wh + (int64_t)call * sh.k * sh.kred;

    /* Loader state: this thread copies chunk column `col` of rows row0 + i * RPP of A and B.
     * For A it keeps each row's image origin; the reduction position (r, s, c) of its chunk
     * advances by BK per stage, the same for every row. */
    const int col = tid % CFG::CPR, row0 = tid / CFG::CPR;
    const T *a_img[CFG::A_ITERS];
    int a_ih0[CFG::A_ITERS], a_iw0[CFG::A_ITERS];
    uint32_t a_valid = 0;
#pragma unroll
    for (int i = 0; i < CFG::A_ITERS; i++) {
        int m = m0 + row0 + i * CFG::RPP;
        int mm = m < m_total ? m : 0;
        int img = mm / pq, rem = mm % pq;
        a_img[i] = x + (int64_t)img * sh.h * sh.w * cp_total;
        a_ih0[i] = (rem / sh.q) * sh.sh - sh.ph;
        a_iw0[i] = (rem % sh.q) * sh.sw - sh.pw;
        if (m < m_total) a_valid |= 1u << i;
    }
    const T *b_row[CFG::B_ITERS];
    uint32_t b_valid = 0;
#pragma unroll
    for (int i = 0; i < CFG::B_ITERS; i++) {
        int n = n0 + row0 + i * CFG::RPP;
        b_row[i] = w + (int64_t)(grp * sh.kg + (n < sh.kg ? n : 0)) * sh.kred;
        if (n < sh.kg) b_valid |= 1u << i;
    }
    int ld_kk = col * CFG::CE, ld_c = ld_kk % sh.cgp, ld_rs = ld_kk / sh.cgp;
    int ld_r = ld_rs / sh.s, ld_s = ld_rs % sh.s;

    const int k_tiles = (sh.kred + CFG::BK - 1) / CFG::BK;
    T *const a_stage0 = smem, *const b_stage0 = smem + CFG::STAGES * CFG::BM * CFG::PITCH;

    /* Queues the copies of the next stage and advances the reduction position. */
    auto load_stage = [&](int stage) {
        T *as = a_stage0 + stage * CFG::BM * CFG::PITCH + col * CFG::CE;
        T *bs = b_stage0 + stage * CFG::BN * CFG::PITCH + col * CFG::CE;
        const bool k_ok = ld_kk < sh.kred;
        const int dh = ld_r * sh.dh, dw = ld_s * sh.dw;
#pragma unroll
        for (int i = 0; i < CFG::A_ITERS; i++) {
            int ih = a_ih0[i] + dh, iw = a_iw0[i] + dw;
            bool ok = k_ok && ((a_valid >> i) & 1) && (unsigned)ih < (unsigned)sh.h &&
                      (unsigned)iw < (unsigned)sh.w;
            const T *src = ok ? a_img[i] + ((int64_t)ih * sh.w + iw) * cp_total + ld_c : xh;
            conv_cp_async16(as + (row0 + i * CFG::RPP) * CFG::PITCH, src, ok);
        }
#pragma unroll
        for (int i = 0; i < CFG::B_ITERS; i++) {
            bool ok = k_ok && ((b_valid >> i) & 1);
            const T *src = ok ? b_row[i] + ld_kk : wh;
            conv_cp_async16(bs + (row0 + i * CFG::RPP) * CFG::PITCH, src, ok);
        }
        ld_kk += CFG::BK;
        ld_c += CFG::BK;
        while (ld_c >= sh.cgp) {
            ld_c -= sh.cgp;
            if (++ld_s == sh.s) {
                ld_s = 0;
                ++ld_r;
            }
        }
    };

    float acc[CFG::MI][CFG::NI][4];
#pragma unroll
    for (int i = 0; i < CFG::MI; i++)
#pragma unroll
        for (int j = 0; j < CFG::NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0.f;

#pragma unroll
    for (int st = 0; st < CFG::STAGES - 1; st++) {
        if (st < k_tiles) load_stage(st);
        conv_cp_async_commit();
    }
    for (int kt = 0; kt < k_tiles; kt++) {
        conv_cp_async_wait<CFG::STAGES - 2>();
        __syncthreads();
        int next = kt + CFG::STAGES - 1;
        if (next < k_tiles) load_stage(next % CFG::STAGES);
        conv_cp_async_commit();
        const int stage = kt % CFG::STAGES;
        conv_stage_mma<CFG, T>::run(
            acc, a_stage0 + stage * CFG::BM * CFG::PITCH + warp_m * CFG::WM * CFG::PITCH,
            b_stage0 + stage * CFG::BN * CFG::PITCH + warp_n * CFG::WN * CFG::PITCH, lane);
    }
    conv_cp_async_wait<0>();
    __syncthreads();

    /* Epilogue in registers, then one store per element through shared memory. */
    T *cs = smem;
    int *m_base = (int *)(conv_smem + (size_t)CFG::BN * CFG::OUT_PITCH * sizeof(T));
    const int g = lane >> 2, t = lane & 3;
    const float *scale = AFFINE ? scale_shift + (size_t)call * 2 * sh.k : NULL;
    const float *shift = AFFINE ? scale + sh.k : NULL;
#pragma unroll
    for (int j = 0; j < CFG::NI; j++) {
        float sc[2] = {1.f, 1.f}, sf[2] = {0.f, 0.f};
        const int nl = warp_n * CFG::WN + j * 8 + 2 * t;
        if (AFFINE)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (n0 + nl + e < sh.kg) {
                    sc[e] = scale[grp * sh.kg + n0 + nl + e];
                    sf[e] = shift[grp * sh.kg + n0 + nl + e];
                }
#pragma unroll
        for (int i = 0; i < CFG::MI; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int ml = warp_m * CFG::WM + i * 16 + g + (e >> 1) * 8;
                float v = acc[i][j][e];
                if (AFFINE) v = fmaf(v, sc[e & 1], sf[e & 1]);
                if (RELU) v = fmaxf(v, 0.f);
                cs[(nl + (e & 1)) * CFG::OUT_PITCH + ml] = conv_elem<T>::from_f32(v);
            }
    }
    for (int ml = tid; ml < CFG::BM; ml += CFG::THREADS) {
        int m = m0 + ml;
        m_base[ml] = m < m_total ? (m / pq) * sh.k * pq + m % pq : -1;
    }
    __syncthreads();
    T *out = (T *)conv_seg_of(batch, call)->out;
    for (int idx = tid; idx < CFG::BM * CFG::BN; idx += CFG::THREADS) {
        const int nl = idx / CFG::BM, ml = idx % CFG::BM;
        const int base = m_base[ml];
        if (base >= 0 && n0 + nl < sh.kg)
            out[base + (grp * sh.kg + n0 + nl) * pq] = cs[nl * CFG::OUT_PITCH + ml];
    }
}

/* ---- launch wrappers ---- */

/* Three tile shapes per type; the launch picks the one that wastes least (see
 * conv_igemm_cost). TALL (192 x 128, one block per SM) fits layers whose M is about 132 * 192,
 * such as ResNet's 14x14 layers at batch 64. f32 has no TALL: its 3xTF32 fragments would not
 * fit the registers, so NARROW stands in for it. */
typedef conv_cfg<__half, 128, 64, 64, 32, 32, 4> conv_cfg_f16_narrow;
typedef conv_cfg<__half, 128, 128, 32, 64, 32, 4> conv_cfg_f16_wide;
typedef conv_cfg<__half, 192, 128, 64, 48, 64, 3> conv_cfg_f16_tall;
typedef conv_cfg<__nv_bfloat16, 128, 64, 64, 32, 32, 4> conv_cfg_bf16_narrow;
typedef conv_cfg<__nv_bfloat16, 128, 128, 32, 64, 32, 4> conv_cfg_bf16_wide;
typedef conv_cfg<__nv_bfloat16, 192, 128, 64, 48, 64, 3> conv_cfg_bf16_tall;
typedef conv_cfg<float, 128, 64, 16, 32, 32, 3> conv_cfg_f32_narrow;
typedef conv_cfg<float, 128, 128, 16, 64, 32, 3> conv_cfg_f32_wide;

/* Everything a launch needs, gathered once by the entry. */
typedef struct conv_launch {
    cudaStream_t stream;
    int device, sm_count;
    conv_batch_t batch;
    conv_shape_t sh;
    bool gemm;          /* implicit GEMM (else the direct kernel) */
    void *xh, *wh;      /* GEMM path: repacked inputs of all calls */
    float *scale_shift; /* folded epilogue, or NULL when there is none */
} conv_launch_t;

/* Blocks of one igemm configuration that fit on an SM, after opting in to its shared memory.
 * 0 when the configuration cannot run. The opt-in belongs to the CUDA context, which a device
 * reset replaces, so it is made on every call (a cheap driver call; making it twice is
 * harmless); the occupancy it allows is a property of the device, cached. */
template <typename CFG, bool AFFINE, bool RELU> static int conv_igemm_occupancy(int device)
{
    static int cached[64];
    if (cudaFuncSetAttribute(conv_igemm_kernel<CFG, AFFINE, RELU>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)CFG::SMEM_BYTES) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it, the caller picks another configuration */
        return 0;
    }
    if (device >= 0 && device < 64 && cached[device] > 0) return cached[device];
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, conv_igemm_kernel<CFG, AFFINE, RELU>,
                                                      CFG::THREADS,
                                                      CFG::SMEM_BYTES) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (device >= 0 && device < 64) cached[device] = blocks;
    return blocks;
}

/* Relative time of a configuration: blocks co-resident on an SM share it, so an SM's time is
 * the tile area it holds per wave, times the waves. Padding of partial tiles counts as work. */
template <typename CFG, bool AFFINE, bool RELU>
static double conv_igemm_cost(const conv_launch_t &L)
{
    const conv_shape_t &sh = L.sh;
    const int occ = conv_igemm_occupancy<CFG, AFFINE, RELU>(L.device);
    if (occ <= 0) return INFINITY;
    const int64_t m_tiles = ((int64_t)sh.n * sh.p * sh.q + CFG::BM - 1) / CFG::BM;
    const int64_t tiles = m_tiles * sh.groups * ((sh.kg + CFG::BN - 1) / CFG::BN) * L.batch.n_calls;
    const int64_t slots = (int64_t)L.sm_count * occ;
    const int64_t waves = (tiles + slots - 1) / slots;
    return (double)waves * occ * CFG::BM * CFG::BN;
}

template <typename CFG, bool AFFINE, bool RELU>
static cudaError_t conv_igemm_launch(const conv_launch_t &L)
{
    const conv_shape_t &sh = L.sh;
    const int m_total = sh.n * sh.p * sh.q;
    dim3 grid((m_total + CFG::BM - 1) / CFG::BM, sh.groups * ((sh.kg + CFG::BN - 1) / CFG::BN),
              L.batch.n_calls);
    conv_igemm_kernel<CFG, AFFINE, RELU><<<grid, CFG::THREADS, CFG::SMEM_BYTES, L.stream>>>(
        L.batch, sh, (const typename CFG::elem *)L.xh, (const typename CFG::elem *)L.wh,
        L.scale_shift);
    return cudaGetLastError();
}

/* Grid y of the igemm launch for a tile width bn; the entry keeps it within 65535. */
static int64_t conv_igemm_grid_y(const conv_shape_t &sh, int bn)
{
    return (int64_t)sh.groups * ((sh.kg + bn - 1) / bn);
}

/* The prep launch: x and w repack (GEMM path) and the epilogue fold, whichever are needed. */
template <typename T> static cudaError_t conv_prep_launch(const conv_launch_t &L)
{
    const conv_shape_t &sh = L.sh;
    int64_t x_blocks = 0, w_blocks = 0, f_blocks = 0;
    const int64_t cap = (int64_t)L.sm_count * 8;
    if (L.gemm) {
        const int64_t hw = (int64_t)sh.h * sh.w, cp_total = (int64_t)sh.groups * sh.cgp;
        x_blocks = (int64_t)L.batch.n_calls * sh.n * ((hw + CONV_PACK_HW - 1) / CONV_PACK_HW) *
                   ((cp_total + CONV_PACK_C - 1) / CONV_PACK_C);
        w_blocks = ((int64_t)L.batch.n_calls * sh.k * sh.kred + 255) / 256;
    }
    if (L.scale_shift) f_blocks = ((int64_t)L.batch.n_calls * sh.k + 255) / 256;
    /* One block per x tile: the tiles are small and evenly sized. */
    x_blocks = x_blocks < (1 << 20) ? x_blocks : (1 << 20);
    w_blocks = w_blocks < cap ? w_blocks : cap;
    f_blocks = f_blocks < cap ? f_blocks : cap;
    if (x_blocks + w_blocks + f_blocks == 0) return cudaSuccess;
    conv_prep_kernel<T><<<(unsigned)(x_blocks + w_blocks + f_blocks), 256, 0, L.stream>>>(
        L.batch, sh, (T *)L.xh, (T *)L.wh, L.scale_shift, (int)x_blocks, (int)w_blocks);
    return cudaGetLastError();
}

template <typename NARROW, typename WIDE, typename TALL, bool AFFINE, bool RELU>
static cudaError_t conv_igemm_pick(const conv_launch_t &L)
{
    const double narrow = conv_igemm_cost<NARROW, AFFINE, RELU>(L);
    const double wide = conv_igemm_cost<WIDE, AFFINE, RELU>(L);
    const double tall = conv_igemm_cost<TALL, AFFINE, RELU>(L);
    /* On a tie the larger tile wins: it reads less shared memory per mma. */
    if (tall <= wide && tall <= narrow) return conv_igemm_launch<TALL, AFFINE, RELU>(L);
    if (wide <= narrow) return conv_igemm_launch<WIDE, AFFINE, RELU>(L);
    return conv_igemm_launch<NARROW, AFFINE, RELU>(L);
}

template <typename T, bool AFFINE, bool RELU>
static cudaError_t conv_direct_launch(const conv_launch_t &L)
{
    const conv_shape_t &sh = L.sh;
    const int n_calls = L.batch.n_calls;
    const int64_t total = (int64_t)sh.n * sh.k * sh.p * sh.q;
    int64_t blocks = (total + 255) / 256;
    /* Enough blocks to fill the device several times over, shared by the calls of grid y. */
    const int64_t cap = (int64_t)L.sm_count * 8 / (n_calls < 8 ? n_calls : 8);
    if (blocks > cap) blocks = cap > 0 ? cap : 1;
    dim3 grid((unsigned)blocks, (unsigned)(n_calls < 65535 ? n_calls : 65535));
    conv_direct_kernel<T, AFFINE, RELU><<<grid, 256, 0, L.stream>>>(L.batch, sh, L.scale_shift);
    return cudaGetLastError();
}

template <typename T, typename NARROW, typename WIDE, typename TALL, bool AFFINE, bool RELU>
static cudaError_t conv_run_typed(const conv_launch_t &L)
{
    cudaError_t e = conv_prep_launch<T>(L);
    if (e != cudaSuccess) return e;
    if (L.gemm) return conv_igemm_pick<NARROW, WIDE, TALL, AFFINE, RELU>(L);
    return conv_direct_launch<T, AFFINE, RELU>(L);
}

/* Instantiates the kernels for each epilogue shape: an affine step (bias and/or batchnorm,
 * folded) and relu, each present or not. */
template <typename T, typename NARROW, typename WIDE, typename TALL>
static cudaError_t conv_run_epilogue(const conv_launch_t &L)
{
    const bool affine = L.sh.epilogue & (CONV2D_EPI_BIAS | CONV2D_EPI_BATCHNORM);
    const bool relu = L.sh.epilogue & CONV2D_EPI_RELU;
    if (affine && relu) return conv_run_typed<T, NARROW, WIDE, TALL, true, true>(L);
    if (affine) return conv_run_typed<T, NARROW, WIDE, TALL, true, false>(L);
    if (relu) return conv_run_typed<T, NARROW, WIDE, TALL, false, true>(L);
    return conv_run_typed<T, NARROW, WIDE, TALL, false, false>(L);
}

/* ---- entry ---- */

static size_t conv_align(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

/* Fills the shape every call of the batch shares from the first call, whose elements are es
 * bytes. */
static void conv_shape_init(conv_shape_t &sh, const op_call_t *c0, size_t es)
{
    const conv2d_params_t *p = OP_PARAMS(c0, const conv2d_params_t);
    const tensor_desc_t *xd = &c0->in[CONV2D_IN_X], *wd = &c0->in[CONV2D_IN_W];
    const tensor_desc_t *od = &c0->out[0];
    sh.n = (int)xd->shape[0];
    sh.c = (int)xd->shape[1];
    sh.h = (int)xd->shape[2];
    sh.w = (int)xd->shape[3];
    sh.k = (int)wd->shape[0];
    sh.r = (int)wd->shape[2];
    sh.s = (int)wd->shape[3];
    sh.p = (int)od->shape[2];
    sh.q = (int)od->shape[3];
    sh.sh = p->stride[0];
    sh.sw = p->stride[1];
    sh.ph = p->padding[0];
    sh.pw = p->padding[1];
    sh.dh = p->dilation[0];
    sh.dw = p->dilation[1];
    sh.groups = p->groups;
    sh.cg = sh.c / sh.groups;
    sh.kg = sh.k / sh.groups;
    sh.epilogue = p->epilogue;
    const int ce = (int)(16 / es);
    sh.cgp = (sh.cg + ce - 1) / ce * ce;
    const int64_t kred = (int64_t)sh.r * sh.s * sh.cgp;
    sh.kred = kred <= INT32_MAX ? (int)kred : 0;
}

/* The one scratch allocation of a batch: its parts in the order they are laid out, each
 * rounded by conv_align() and 0 when absent. */
typedef struct conv_scratch_plan {
    bool affine;      /* the epilogue has a bias or batchnorm step to fold */
    bool inline_segs; /* the calls travel in the kernel parameters, not in a table */
    size_t segs_bytes, fold_bytes, xh_bytes, wh_bytes;
    size_t total;
} conv_scratch_plan_t;

/* Chooses the path of n calls of shape L.sh (sets L.gemm) and sizes the scratch it needs, for
 * elements of es bytes. */
static conv_scratch_plan_t conv_plan_batch(conv_launch_t &L, int n, size_t es)
{
    const conv_shape_t &sh = L.sh;
    const int64_t kred = (int64_t)sh.r * sh.s * sh.cgp;
    /* The implicit GEMM pays off once a group has enough channels to fill mma tiles; the
     * repacked tensors and the grid must also stay inside the kernels' int32 indexing. */
    const int64_t xh_elems = (int64_t)sh.n * sh.h * sh.w * sh.groups * sh.cgp;
    const int64_t wh_elems = (int64_t)sh.k * kred;
    L.gemm = sh.kg >= 16 && sh.cg >= 8 && kred <= INT32_MAX && (int64_t)n * xh_elems <= INT32_MAX &&
             wh_elems <= INT32_MAX && conv_igemm_grid_y(sh, 64) <= 65535;

    conv_scratch_plan_t s;
    s.affine = sh.epilogue & (CONV2D_EPI_BIAS | CONV2D_EPI_BATCHNORM);
    s.inline_segs = n <= CONV_INLINE_SEGS;
    s.segs_bytes = s.inline_segs ? 0 : conv_align((size_t)n * sizeof(conv_seg_t));
    s.fold_bytes = s.affine ? conv_align((size_t)n * 2 * sh.k * sizeof(float)) : 0;
    s.xh_bytes = L.gemm ? conv_align((size_t)n * xh_elems * es) : 0;
    s.wh_bytes = L.gemm ? conv_align((size_t)n * wh_elems * es) : 0;
    s.total = s.segs_bytes + s.fold_bytes + s.xh_bytes + s.wh_bytes;
    return s;
}

/* Writes what each of the n calls needs on the device (its pointers, vector dtypes and eps)
 * into host[0..n). */
static void conv_fill_segs(conv_seg_t *host, int n, const op_call_t *const *calls,
                           const void *const *const *in, void *const *const *out)
{
    for (int i = 0; i < n; i++) {
        host[i].x = in[i][CONV2D_IN_X];
        host[i].w = in[i][CONV2D_IN_W];
        for (int v = 0; v < CONV_N_VECS; v++) {
            host[i].vec[v] = in[i][CONV2D_IN_BIAS + v];
            host[i].vec_dtype[v] = calls[i]->in[CONV2D_IN_BIAS + v].dtype;
        }
        host[i].out = out[i][0];
        host[i].eps = OP_PARAMS(calls[i], const conv2d_params_t)->eps;
    }
}

/* Queues the batch's kernels for the element type dt. */
static cudaError_t conv_run_dtype(dtype_t dt, const conv_launch_t &L)
{
    switch (dt) {
    case DTYPE_F16:
        return conv_run_epilogue<__half, conv_cfg_f16_narrow, conv_cfg_f16_wide, conv_cfg_f16_tall>(
            L);
    case DTYPE_BF16:
        return conv_run_epilogue<__nv_bfloat16, conv_cfg_bf16_narrow, conv_cfg_bf16_wide,
                                 conv_cfg_bf16_tall>(L);
    default:
        return conv_run_epilogue<float, conv_cfg_f32_narrow, conv_cfg_f32_wide,
                                 conv_cfg_f32_narrow>(L);
    }
}

extern "C" int op_conv2d_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                                  const void *const *const *in, void *const *const *out,
                                  op_error_t *err)
{
    const op_call_t *c0 = calls[0];
    const dtype_t dt = c0->in[CONV2D_IN_X].dtype;
    const size_t es = dtype_size(dt);

    if (tensor_desc_numel(&c0->out[0]) == 0) return 0;
    if (n > 65535)
        return op_error(err, -EINVAL, "", "conv2d: at most 65535 calls in one batch (got %d)", n);

    conv_launch_t L;
    memset(&L, 0, sizeof L);
    L.stream = (cudaStream_t)ctx->stream;
    L.device = ctx->device;
    cudaError_t e =
        cudaDeviceGetAttribute(&L.sm_count, cudaDevAttrMultiProcessorCount, ctx->device);
    if (e != cudaSuccess) return op_error(err, -EIO, "", "CUDA: %s", cudaGetErrorString(e));
    conv_shape_init(L.sh, c0, es);
    const conv_scratch_plan_t plan = conv_plan_batch(L, n, es);

    conv_seg_t *host =
        plan.inline_segs ? L.batch.seg : (conv_seg_t *)calloc((size_t)n, sizeof *host);
    if (!host) return op_error(err, -ENOMEM, "", "conv2d: out of host memory");
    conv_fill_segs(host, n, calls, in, out);
    L.batch.n_calls = n;
    unsigned char *scratch =
        plan.total ? (unsigned char *)ctx->scratch_alloc(ctx->pool, plan.total) : NULL;
    if (plan.total && !scratch) {
        if (!plan.inline_segs) free(host);
        return op_error(err, -ENOMEM, "", "conv2d: no scratch memory (%zu bytes) for %d call(s)",
                        plan.total, n);
    }
    L.scale_shift = plan.affine ? (float *)(scratch + plan.segs_bytes) : NULL;
    L.xh = L.gemm ? scratch + plan.segs_bytes + plan.fold_bytes : NULL;
    L.wh = L.gemm ? scratch + plan.segs_bytes + plan.fold_bytes + plan.xh_bytes : NULL;
    e = cudaSuccess;
    if (!plan.inline_segs) {
        L.batch.table = (const conv_seg_t *)scratch;
        /* Pageable source: the call returns once the bytes are staged, so host may go now. */
        e = cudaMemcpyAsync(scratch, host, (size_t)n * sizeof *host, cudaMemcpyHostToDevice,
                            L.stream);
        free(host);
    }
    if (e == cudaSuccess) e = conv_run_dtype(dt, L);
    /* Stream-ordered: the memory is reused only by work queued after this. */
    if (scratch) ctx->scratch_free(ctx->pool, scratch);
    if (e != cudaSuccess) return op_error(err, -EIO, "", "CUDA: %s", cudaGetErrorString(e));
    return 0;
}
