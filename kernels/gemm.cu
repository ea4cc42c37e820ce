/* The gemm op on CUDA.
 *
 * One call goes through cuBLASLt, row-major by the usual transposition: the row-major
 * out[m, n] = op(a) op(b) is the column-major out^T[n, m] = op(b)^T op(a)^T, so b is Lt's
 * first operand and a its second, with no data moved. Leading dims become a strided batch (or,
 * when b is shared and a is not transposed, one taller GEMM). The algorithm comes from
 * cublasLtMatmulAlgoGetHeuristic, cached per problem in a small thread-safe table.
 *
 * i8 always goes to cuBLASLt as "TN" (both operands k-contiguous), the only layout its IMMA
 * tensor-core kernels take: b (and a, when transposed) is transposed into scratch first, an
 * O(k n) copy against the O(m n k) product. In any other layout cuBLASLt offers only
 * non-tensor-core kernels for int8, an order of magnitude slower than the tensor cores with
 * the copy (bench/README.md, "Kernel shapes").
 *
 * f64 is CUBLAS_COMPUTE_64F with f64 alpha and beta (and f64 c), in every form below: on
 * Hopper cuBLAS runs it on the FP64 tensor cores (DMMA), IEEE f64 arithmetic throughout, which
 * is what gemm.h's bound rests on; the fallback kernel accumulates f64 in f64 too.
 *
 * n calls with one batch key (same shape, dtype, flags and scalars) go out as one
 * cublasGemmBatchedEx over pointer arrays, unless each call alone fills the GPU.
 *
 * Where cuBLAS has no algorithm (i8 shapes that break the IMMA alignment rules, k = 0, ...), a
 * plain tiled kernel of our own computes the same result, so no valid call ever fails. */
#include "gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#define GEMM_WORKSPACE_BYTES ((size_t)32 << 20)
#define GEMM_TILE 16
#define GEMM_MAX_GRID_YZ 65535
#define GEMM_CACHE_SIZE 64
/* Calls at least this big (m*n*k*batch) each fill the GPU: n of them run one by one through
 * cuBLASLt rather than as one pointer-array GEMM. */
#define GEMM_LARGE_CALL ((int64_t)1 << 30)
/* gemm_lt_run's answer when cuBLASLt has no algorithm for the problem. */
#define GEMM_UNSUPPORTED 1
/* The i8 transpose's tile: 64 x 64 bytes per block, 4 x 4 bytes per thread. */
#define GEMM_TR_TILE 64
#define GEMM_TR_THREADS 256

/* ------------------------------------------------------------------ kernels */

static __device__ __forceinline__ float gemm_load(const float *p, int64_t i)
{
    return p[i];
}
static __device__ __forceinline__ float gemm_load(const __half *p, int64_t i)
{
    return __half2float(p[i]);
}
static __device__ __forceinline__ float gemm_load(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
static __device__ __forceinline__ double gemm_load(const double *p, int64_t i)
{
    return p[i];
}
static __device__ __forceinline__ int gemm_load(const int8_t *p, int64_t i)
{
    return p[i];
}
static __device__ __forceinline__ int gemm_load(const int32_t *p, int64_t i)
{
    return p[i];
}
static __device__ __forceinline__ void gemm_store(float *p, int64_t i, float v)
{
    p[i] = v;
}
static __device__ __forceinline__ void gemm_store(__half *p, int64_t i, float v)
{
    p[i] = __float2half_rn(v);
}
static __device__ __forceinline__ void gemm_store(__nv_bfloat16 *p, int64_t i, float v)
{
    p[i] = __float2bfloat16_rn(v);
}
static __device__ __forceinline__ void gemm_store(double *p, int64_t i, double v)
{
    p[i] = v;
}
static __device__ __forceinline__ void gemm_store(int32_t *p, int64_t i, int v)
{
    p[i] = v;
}

/* Where matrix z of an operand lives: ptrs[z] when there is a pointer table, else
 * base + z * stride (elements). */
typedef struct gemm_operand {
    const void *const *ptrs;
    const void *base;
    int64_t stride;
} gemm_operand_t;

template <typename T> static __device__ __forceinline__ T *gemm_matrix(gemm_operand_t o, int64_t z)
{
    return o.ptrs ? (T *)o.ptrs[z] : (T *)o.base + z * o.stride;
}

/* The fallback's whole problem: count GEMMs of one shape. */
typedef struct gemm_fallback {
    int64_t m, n, k, count;
    bool trans_a, trans_b, use_c;
    gemm_operand_t a, b, c, d; /* d is written (its pointers cast back to non-const) */
    float alpha_f, beta_f;
    double alpha_d, beta_d;
    int alpha_i, beta_i;
} gemm_fallback_t;

/* A plain shared-memory tiled GEMM, one 16x16 output tile per block and grid-stride over
 * tiles and matrices; Tacc is double for f64, float for the other float types and int for i8.
 * c may alias d. */
template <typename Tin, typename Tacc, typename Tout>
static __global__ void gemm_fallback_kernel(gemm_fallback_t g)
{
    __shared__ Tacc as[GEMM_TILE][GEMM_TILE + 1];
    __shared__ Tacc bs[GEMM_TILE][GEMM_TILE + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t tiles_m = (g.m + GEMM_TILE - 1) / GEMM_TILE,
            tiles_n = (g.n + GEMM_TILE - 1) / GEMM_TILE;
    for (int64_t z = blockIdx.z; z < g.count; z += gridDim.z)
        for (int64_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y)
            for (int64_t tn = blockIdx.x; tn < tiles_n; tn += gridDim.x) {
                const Tin *A = gemm_matrix<const Tin>(g.a, z);
                const Tin *B = gemm_matrix<const Tin>(g.b, z);
                int64_t i = tm * GEMM_TILE + ty, j = tn * GEMM_TILE + tx;
                Tacc acc = 0;
                for (int64_t q0 = 0; q0 < g.k; q0 += GEMM_TILE) {
                    int64_t aq = q0 + tx, bq = q0 + ty;
                    as[ty][tx] = i < g.m && aq < g.k
                                     ? gemm_load(A, g.trans_a ? aq * g.m + i : i * g.k + aq)
                                     : 0;
                    bs[ty][tx] = bq < g.k && j < g.n
                                     ? gemm_load(B, g.trans_b ? j * g.k + bq : bq * g.n + j)
                                     : 0;
                    __syncthreads();
                    for (int q = 0; q < GEMM_TILE; q++)
                        acc += as[ty][q] * bs[q][tx];
                    __syncthreads();
                }
                if (i < g.m && j < g.n) {
                    int64_t at = i * g.n + j;
                    Tout *D = gemm_matrix<Tout>(g.d, z);
                    if constexpr (std::is_same<Tacc, int>::value) {
                        int v = g.alpha_i * acc;
                        if (g.use_c) v += g.beta_i * gemm_load(gemm_matrix<const Tout>(g.c, z), at);
                        gemm_store(D, at, v);
                    } else if constexpr (std::is_same<Tacc, double>::value) {
                        double v = g.alpha_d * acc;
                        if (g.use_c) v += g.beta_d * gemm_load(gemm_matrix<const Tout>(g.c, z), at);
                        gemm_store(D, at, v);
                    } else {
                        float v = g.alpha_f * acc;
                        if (g.use_c) v += g.beta_f * gemm_load(gemm_matrix<const Tout>(g.c, z), at);
                        gemm_store(D, at, v);
                    }
                }
            }
}

/* dst[z] = src[z]^T for count row-major rows x cols matrices stored back to back. */
template <typename T>
static __global__ void gemm_transpose_kernel(const T *src, T *dst, int64_t rows, int64_t cols,
                                             int64_t count)
{
    __shared__ T tile[32][33];
    int64_t tiles_r = (rows + 31) / 32, tiles_c = (cols + 31) / 32;
    for (int64_t z = blockIdx.z; z < count; z += gridDim.z)
        for (int64_t tr = blockIdx.y; tr < tiles_r; tr += gridDim.y)
            for (int64_t tc = blockIdx.x; tc < tiles_c; tc += gridDim.x) {
                const T *s = src + z * rows * cols;
                T *d = dst + z * rows * cols;
                for (int r = threadIdx.y; r < 32; r += blockDim.y) {
                    int64_t row = tr * 32 + r, col = tc * 32 + threadIdx.x;
                    if (row < rows && col < cols) tile[r][threadIdx.x] = s[row * cols + col];
                }
                __syncthreads();
                for (int r = threadIdx.y; r < 32; r += blockDim.y) {
                    int64_t orow = tc * 32 + r, ocol = tr * 32 + threadIdx.x;
                    if (orow < cols && ocol < rows) d[orow * rows + ocol] = tile[threadIdx.x][r];
                }
                __syncthreads();
            }
}

/* The 4 x 4 bytes of four row words w[0..3] (row q, byte b = element (q, b)) transposed:
 * word b of the result holds byte b of each input word, rows in order. */
static __device__ __forceinline__ void gemm_transpose_4x4(const uint32_t w[4], uint32_t o[4])
{
    const uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), hi01 = __byte_perm(w[0], w[1], 0x7362);
    const uint32_t lo23 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
    o[0] = __byte_perm(lo01, lo23, 0x5410);
    o[1] = __byte_perm(lo01, lo23, 0x7632);
    o[2] = __byte_perm(hi01, hi23, 0x5410);
    o[3] = __byte_perm(hi01, hi23, 0x7632);
}

/* dst[z] = src[z]^T for count row-major rows x cols int8 matrices stored back to back, rows and
 * cols multiples of 4 and both pointers 4-byte aligned; src and dst are taken as words. The
 * byte-wise transpose above moves a byte per load and store; here each thread loads a 4 x 4
 * block as four words, transposes it in registers, and the 64 x 64 tile goes out through
 * shared memory as whole rows of words, so every global access is a word and coalesced. */
static __global__ void __launch_bounds__(GEMM_TR_THREADS)
    gemm_transpose_i8x4_kernel(const uint32_t *src, uint32_t *dst, int64_t rows, int64_t cols,
                               int64_t count)
{
    constexpr int TW = GEMM_TR_TILE / 4;            /* words per tile row */
    __shared__ uint32_t tile[GEMM_TR_TILE][TW + 1]; /* [row of dst][word of dst], padded */
    const int64_t src_words = cols / 4, dst_words = rows / 4;
    const int64_t tiles_r = (rows + GEMM_TR_TILE - 1) / GEMM_TR_TILE,
                  tiles_c = (cols + GEMM_TR_TILE - 1) / GEMM_TR_TILE;
    const int tx = threadIdx.x % TW, ty = threadIdx.x / TW; /* word column, 4-row group */
    for (int64_t z = blockIdx.z; z < count; z += gridDim.z)
        for (int64_t tr = blockIdx.y; tr < tiles_r; tr += gridDim.y)
            for (int64_t tc = blockIdx.x; tc < tiles_c; tc += gridDim.x) {
                const uint32_t *s = src + z * rows * src_words;
                uint32_t *d = dst + z * cols * dst_words;
                const int64_t row = tr * GEMM_TR_TILE + 4 * ty, word = tc * TW + tx;
                if (row < rows && word < src_words) {
                    uint32_t w[4], o[4];
#pragma unroll
                    for (int q = 0; q < 4; q++)
                        w[q] = s[(row + q) * src_words + word];
                    gemm_transpose_4x4(w, o);
#pragma unroll
                    for (int b = 0; b < 4; b++)
                        tile[4 * tx + b][ty] = o[b];
                }
                __syncthreads();
                for (int j = ty; j < GEMM_TR_TILE; j += GEMM_TR_THREADS / TW) {
                    const int64_t drow = tc * GEMM_TR_TILE + j, dword = tr * TW + tx;
                    if (drow < cols && dword < dst_words) d[drow * dst_words + dword] = tile[j][tx];
                }
                __syncthreads();
            }
}

/* dst[z][i] = src[z][i]: c into out before a pointer-array GEMM that updates out in place. */
template <typename T>
static __global__ void gemm_copy_kernel(const void *const *src, void *const *dst, int64_t elems,
                                        int64_t count)
{
    for (int64_t z = blockIdx.y; z < count; z += gridDim.y) {
        const T *s = (const T *)src[z];
        T *d = (T *)dst[z];
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < elems;
             i += (int64_t)gridDim.x * blockDim.x)
            d[i] = s[i];
    }
}

/* ------------------------------------------------------------------ launch wrappers */

static unsigned gemm_grid_dim(int64_t want, int64_t cap)
{
    return (unsigned)(want < 1 ? 1 : want < cap ? want : cap);
}

template <typename Tin, typename Tacc, typename Tout>
static void gemm_fallback_launch_t(const gemm_fallback_t *g, cudaStream_t stream)
{
    dim3 grid(gemm_grid_dim((g->n + GEMM_TILE - 1) / GEMM_TILE, INT32_MAX),
              gemm_grid_dim((g->m + GEMM_TILE - 1) / GEMM_TILE, GEMM_MAX_GRID_YZ),
              gemm_grid_dim(g->count, GEMM_MAX_GRID_YZ));
    gemm_fallback_kernel<Tin, Tacc, Tout><<<grid, dim3(GEMM_TILE, GEMM_TILE), 0, stream>>>(*g);
}

static void gemm_fallback_launch(dtype_t dt, const gemm_fallback_t *g, cudaStream_t stream)
{
    switch (dt) {
    case DTYPE_F32:
        gemm_fallback_launch_t<float, float, float>(g, stream);
        break;
    case DTYPE_F16:
        gemm_fallback_launch_t<__half, float, __half>(g, stream);
        break;
    case DTYPE_BF16:
        gemm_fallback_launch_t<__nv_bfloat16, float, __nv_bfloat16>(g, stream);
        break;
    case DTYPE_F64:
        gemm_fallback_launch_t<double, double, double>(g, stream);
        break;
    default:
        gemm_fallback_launch_t<int8_t, int, int32_t>(g, stream);
        break;
    }
}

static void gemm_transpose_launch_i8(const int8_t *src, int8_t *dst, int64_t rows, int64_t cols,
                                     int64_t count, cudaStream_t stream)
{
    if (rows % 4 == 0 && cols % 4 == 0 && ((uintptr_t)src & 3) == 0 && ((uintptr_t)dst & 3) == 0) {
        dim3 grid(gemm_grid_dim((cols + GEMM_TR_TILE - 1) / GEMM_TR_TILE, INT32_MAX),
                  gemm_grid_dim((rows + GEMM_TR_TILE - 1) / GEMM_TR_TILE, GEMM_MAX_GRID_YZ),
                  gemm_grid_dim(count, GEMM_MAX_GRID_YZ));
        gemm_transpose_i8x4_kernel<<<grid, GEMM_TR_THREADS, 0, stream>>>(
            (const uint32_t *)src, (uint32_t *)dst, rows, cols, count);
        return;
    }
    dim3 grid(gemm_grid_dim((cols + 31) / 32, INT32_MAX),
              gemm_grid_dim((rows + 31) / 32, GEMM_MAX_GRID_YZ),
              gemm_grid_dim(count, GEMM_MAX_GRID_YZ));
    gemm_transpose_kernel<int8_t><<<grid, dim3(32, 8), 0, stream>>>(src, dst, rows, cols, count);
}

static void gemm_copy_launch(size_t elem_size, const void *const *src, void *const *dst,
                             int64_t elems, int64_t count, cudaStream_t stream)
{
    dim3 grid(gemm_grid_dim((elems + 255) / 256, 1024), gemm_grid_dim(count, GEMM_MAX_GRID_YZ));
    if (elem_size == 2)
        gemm_copy_kernel<uint16_t><<<grid, 256, 0, stream>>>(src, dst, elems, count);
    else if (elem_size == 8)
        gemm_copy_kernel<uint64_t><<<grid, 256, 0, stream>>>(src, dst, elems, count);
    else
        gemm_copy_kernel<uint32_t><<<grid, 256, 0, stream>>>(src, dst, elems, count);
}

/* ------------------------------------------------------------------ cuBLASLt */

static int gemm_cuda_error(op_error_t *err, cudaError_t e)
{
    return op_error(err, -EIO, "", "CUDA: %s", cudaGetErrorString(e));
}

static int gemm_blas_error(op_error_t *err, const char *what, cublasStatus_t s)
{
    return op_error(err, -EIO, "", "CUDA: %s: %s", what, cublasGetStatusString(s));
}

static cudaDataType_t gemm_cuda_type(dtype_t dt)
{
    switch (dt) {
    case DTYPE_F32:
        return CUDA_R_32F;
    case DTYPE_F16:
        return CUDA_R_16F;
    case DTYPE_BF16:
        return CUDA_R_16BF;
    case DTYPE_F64:
        return CUDA_R_64F;
    case DTYPE_I8:
        return CUDA_R_8I;
    default:
        return CUDA_R_32I;
    }
}

static cublasComputeType_t gemm_compute_type(const gemm_params_t *p)
{
    if (p->dtype == DTYPE_I8) return CUBLAS_COMPUTE_32I;
    /* Native f64: cuBLAS runs it on the FP64 tensor cores where the GPU has them. */
    if (p->dtype == DTYPE_F64) return CUBLAS_COMPUTE_64F;
    return p->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* One column-major Lt problem D = op(X) op(Y) (+ C), X being our b and Y our a. Everything
 * that decides the algorithm is in the key part, so that it can be memcmp'd in the cache. */
typedef struct gemm_lt_key {
    int device;
    int in_type, out_type, compute;
    int op_x, op_y;
    int beta_nonzero;
    int32_t batch;
    uint64_t rows_x, cols_x, rows_y, cols_y, rows_d, cols_d;
    int64_t stride_x, stride_y, stride_d;
    uint32_t align_x, align_y, align_c, align_d;
} gemm_lt_key_t;

typedef struct gemm_lt_problem {
    gemm_lt_key_t key;
    const void *x, *y, *c;
    void *d;
    float alpha_f, beta_f;
    double alpha_d, beta_d;
    int32_t alpha_i, beta_i;
    double flops;
} gemm_lt_problem_t;

typedef struct gemm_algo_entry {
    bool used, found;
    gemm_lt_key_t key;
    cublasLtMatmulAlgo_t algo;
} gemm_algo_entry_t;

/* The heuristic's answers (found or not), shared by every device worker thread. */
static gemm_algo_entry_t gemm_algo_cache[GEMM_CACHE_SIZE];
static int gemm_algo_cache_next;
static pthread_mutex_t gemm_algo_cache_lock = PTHREAD_MUTEX_INITIALIZER;

static bool gemm_algo_cache_get(const gemm_lt_key_t *key, bool *ret_found,
                                cublasLtMatmulAlgo_t *ret_algo)
{
    bool hit = false;
    pthread_mutex_lock(&gemm_algo_cache_lock);
    for (int i = 0; i < GEMM_CACHE_SIZE && !hit; i++)
        if (gemm_algo_cache[i].used && memcmp(&gemm_algo_cache[i].key, key, sizeof *key) == 0) {
            hit = true;
            *ret_found = gemm_algo_cache[i].found;
            *ret_algo = gemm_algo_cache[i].algo;
        }
    pthread_mutex_unlock(&gemm_algo_cache_lock);
    return hit;
}

static void gemm_algo_cache_put(const gemm_lt_key_t *key, bool found,
                                const cublasLtMatmulAlgo_t *algo)
{
    pthread_mutex_lock(&gemm_algo_cache_lock);
    /* Two workers may have asked for the same problem at once: the later answer replaces the
     * earlier rather than taking a second slot. */
    gemm_algo_entry_t *e = NULL;
    for (int i = 0; i < GEMM_CACHE_SIZE && !e; i++)
        if (gemm_algo_cache[i].used && memcmp(&gemm_algo_cache[i].key, key, sizeof *key) == 0)
            e = &gemm_algo_cache[i];
    if (!e) {
        e = &gemm_algo_cache[gemm_algo_cache_next];
        gemm_algo_cache_next = (gemm_algo_cache_next + 1) % GEMM_CACHE_SIZE;
    }
    e->used = true;
    e->found = found;
    e->key = *key;
    if (found) e->algo = *algo;
    pthread_mutex_unlock(&gemm_algo_cache_lock);
}

/* The alignment an algorithm may assume for matrix z of an operand: that of its base and of
 * its batch stride, at most 256 bytes. */
static uint32_t gemm_alignment(const void *ptr, int64_t stride_bytes)
{
    uint64_t v = (uint64_t)(uintptr_t)ptr | (uint64_t)stride_bytes | 256;
    return (uint32_t)(v & (~v + 1));
}

/* Describes out = alpha op(a) op(b) + beta c of p, with a, b as given (trans_a/trans_b may differ
 * from p's after a transposition into scratch). */
static void gemm_lt_problem_init(gemm_lt_problem_t *pr, const op_cuda_ctx_t *ctx,
                                 const gemm_params_t *p, bool ta, bool tb, const void *a,
                                 const void *b, const void *c, void *d)
{
    memset(pr, 0, sizeof *pr);
    gemm_lt_key_t *k = &pr->key;
    size_t in_size = dtype_size(p->dtype), out_size = dtype_size(p->out_dtype);
    /* A shared b and an untransposed a: the batch is one GEMM with batch * m rows. */
    bool fold = p->batch > 1 && p->a_batched && !p->b_batched && !ta;
    int64_t cols = fold ? p->batch * p->m : p->m;
    k->device = ctx->device;
    k->in_type = gemm_cuda_type(p->dtype);
    k->out_type = gemm_cuda_type(p->out_dtype);
    k->compute = gemm_compute_type(p);
    k->op_x = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    k->op_y = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    k->batch = (int32_t)(fold ? 1 : p->batch);
    k->rows_x = (uint64_t)(tb ? p->k : p->n);
    k->cols_x = (uint64_t)(tb ? p->n : p->k);
    k->rows_y = (uint64_t)(ta ? p->m : p->k);
    k->cols_y = (uint64_t)(ta ? p->k : cols);
    k->rows_d = (uint64_t)p->n;
    k->cols_d = (uint64_t)cols;
    k->stride_x = p->b_batched && !fold ? p->k * p->n : 0;
    k->stride_y = p->a_batched && !fold ? p->m * p->k : 0;
    k->stride_d = fold ? 0 : p->m * p->n;
    bool use_c = p->has_c && p->beta != 0;
    k->beta_nonzero = use_c;
    k->align_x = gemm_alignment(b, k->stride_x * (int64_t)in_size);
    k->align_y = gemm_alignment(a, k->stride_y * (int64_t)in_size);
    k->align_d = gemm_alignment(d, k->stride_d * (int64_t)out_size);
    k->align_c = use_c ? gemm_alignment(c, k->stride_d * (int64_t)out_size) : k->align_d;
    pr->x = b;
    pr->y = a;
    pr->c = use_c ? c : d;
    pr->d = d;
    pr->alpha_f = (float)p->alpha;
    pr->beta_f = use_c ? (float)p->beta : 0.0f;
    pr->alpha_d = p->alpha;
    pr->beta_d = use_c ? p->beta : 0.0;
    pr->alpha_i = (int32_t)p->alpha;
    pr->beta_i = use_c ? (int32_t)p->beta : 0;
    pr->flops = 2.0 * (double)p->m * (double)p->n * (double)p->k * (double)p->batch;
}

static cublasStatus_t gemm_layout(cublasLtMatrixLayout_t *ret, int type, uint64_t rows,
                                  uint64_t cols, int32_t batch, int64_t stride)
{
    cublasStatus_t s =
        cublasLtMatrixLayoutCreate(ret, (cudaDataType_t)type, rows, cols, (int64_t)rows);
    if (s != CUBLAS_STATUS_SUCCESS || batch <= 1) return s;
    s = cublasLtMatrixLayoutSetAttribute(*ret, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                         sizeof batch);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutSetAttribute(*ret, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &stride, sizeof stride);
    return s;
}

/* The Lt objects of one problem, as gemm_lt_run builds them. */
typedef struct gemm_lt_desc {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lx, ly, ld;
} gemm_lt_desc_t;

static cublasStatus_t gemm_lt_matmul(const op_cuda_ctx_t *ctx, const gemm_lt_problem_t *pr,
                                     const gemm_lt_desc_t *desc, const cublasLtMatmulAlgo_t *algo,
                                     void *workspace)
{
    const void *alpha = &pr->alpha_f, *beta = &pr->beta_f;
    if (pr->key.compute == CUBLAS_COMPUTE_32I) alpha = &pr->alpha_i, beta = &pr->beta_i;
    if (pr->key.compute == CUBLAS_COMPUTE_64F) alpha = &pr->alpha_d, beta = &pr->beta_d;
    return cublasLtMatmul((cublasLtHandle_t)ctx->blaslt, desc->op, alpha, pr->x, desc->lx, pr->y,
                          desc->ly, beta, pr->c, desc->ld, pr->d, desc->ld, algo, workspace,
                          GEMM_WORKSPACE_BYTES, (cudaStream_t)ctx->stream);
}

/* Asks the heuristic (through the cache) for the problem's algorithm. Its first answer is used
 * as it is: timing its next candidates on first use picks no faster algorithm on the H200
 * (bench/README.md, "Kernel shapes"). */
static cublasStatus_t gemm_lt_algo(const op_cuda_ctx_t *ctx, const gemm_lt_problem_t *pr,
                                   const gemm_lt_desc_t *desc, void *workspace, bool *ret_found,
                                   cublasLtMatmulAlgo_t *ret_algo)
{
    const gemm_lt_key_t *k = &pr->key;
    if (gemm_algo_cache_get(k, ret_found, ret_algo)) return CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreference_t pref;
    cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    size_t ws = GEMM_WORKSPACE_BYTES;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                         &k->align_x, sizeof k->align_x);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                         &k->align_y, sizeof k->align_y);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                         &k->align_c, sizeof k->align_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                         &k->align_d, sizeof k->align_d);
    cublasLtMatmulHeuristicResult_t result;
    int n_results = 0;
    s = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)ctx->blaslt, desc->op, desc->lx, desc->ly,
                                       desc->ld, desc->ld, pref, 1, &result, &n_results);
    cublasLtMatmulPreferenceDestroy(pref);
    /* "Not supported" is an answer, not an error: the caller falls back. */
    bool found = s == CUBLAS_STATUS_SUCCESS && n_results > 0;
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) return s;
    gemm_algo_cache_put(k, found, found ? &result.algo : NULL);
    *ret_found = found;
    if (found) *ret_algo = result.algo;
    return CUBLAS_STATUS_SUCCESS;
}

/* Queues the problem on cuBLASLt. Returns 0, GEMM_UNSUPPORTED when Lt has no algorithm for
 * it, or a negative errno. */
static int gemm_lt_run(const op_cuda_ctx_t *ctx, const gemm_lt_problem_t *pr, void *workspace,
                       op_error_t *err)
{
    const gemm_lt_key_t *k = &pr->key;
    cudaDataType_t scale = k->compute == CUBLAS_COMPUTE_32I   ? CUDA_R_32I
                           : k->compute == CUBLAS_COMPUTE_64F ? CUDA_R_64F
                                                              : CUDA_R_32F;
    gemm_lt_desc_t desc = {NULL, NULL, NULL, NULL};
    int32_t op_x = k->op_x, op_y = k->op_y;
    cublasStatus_t s = cublasLtMatmulDescCreate(&desc.op, (cublasComputeType_t)k->compute, scale);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_x,
                                           sizeof op_x);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_y,
                                           sizeof op_y);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = gemm_layout(&desc.lx, k->in_type, k->rows_x, k->cols_x, k->batch, k->stride_x);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = gemm_layout(&desc.ly, k->in_type, k->rows_y, k->cols_y, k->batch, k->stride_y);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = gemm_layout(&desc.ld, k->out_type, k->rows_d, k->cols_d, k->batch, k->stride_d);
    bool found = false;
    cublasLtMatmulAlgo_t algo;
    if (s == CUBLAS_STATUS_SUCCESS) s = gemm_lt_algo(ctx, pr, &desc, workspace, &found, &algo);
    if (s == CUBLAS_STATUS_SUCCESS && found) {
        s = gemm_lt_matmul(ctx, pr, &desc, &algo, workspace);
        if (s == CUBLAS_STATUS_NOT_SUPPORTED) found = false, s = CUBLAS_STATUS_SUCCESS;
    }
    if (desc.ld) cublasLtMatrixLayoutDestroy(desc.ld);
    if (desc.ly) cublasLtMatrixLayoutDestroy(desc.ly);
    if (desc.lx) cublasLtMatrixLayoutDestroy(desc.lx);
    if (desc.op) cublasLtMatmulDescDestroy(desc.op);
    if (s != CUBLAS_STATUS_SUCCESS) return gemm_blas_error(err, "cublasLtMatmul", s);
    return found ? 0 : GEMM_UNSUPPORTED;
}

/* ------------------------------------------------------------------ one call */

static void gemm_fallback_init(gemm_fallback_t *g, const gemm_params_t *p, int64_t count)
{
    memset(g, 0, sizeof *g);
    g->m = p->m;
    g->n = p->n;
    g->k = p->k;
    g->count = count;
    g->trans_a = p->trans_a;
    g->trans_b = p->trans_b;
    g->use_c = p->has_c && p->beta != 0;
    g->alpha_f = (float)p->alpha;
    g->beta_f = (float)p->beta;
    g->alpha_d = p->alpha;
    g->beta_d = p->beta;
    g->alpha_i = (int)p->alpha;
    g->beta_i = (int)p->beta;
}

/* Scratch of one run_cuda, returned together at its end (the pool is stream-ordered). */
typedef struct gemm_scratch {
    const op_cuda_ctx_t *ctx;
    void *ptr[8];
    int n;
} gemm_scratch_t;

static void *gemm_scratch_get(gemm_scratch_t *s, size_t bytes)
{
    if (s->n == 8) return NULL;
    void *p = s->ctx->scratch_alloc(s->ctx->pool, bytes ? bytes : 1);
    if (p) s->ptr[s->n++] = p;
    return p;
}

static void gemm_scratch_release(gemm_scratch_t *s)
{
    for (int i = 0; i < s->n; i++)
        s->ctx->scratch_free(s->ctx->pool, s->ptr[i]);
    s->n = 0;
}

/* cuBLASLt's int8 tensor-core kernels want "TN": in our terms a untransposed ([m, k]) and b
 * transposed ([n, k]), both k-contiguous. Writes transposed copies into scratch where the call
 * has another layout and runs on them; GEMM_UNSUPPORTED (before copying anything when the
 * leading dimensions rule TN out) if Lt has no algorithm. */
static int gemm_lt_run_i8_tn(const op_cuda_ctx_t *ctx, const gemm_params_t *p, const void *a,
                             const void *b, const void *c, void *d, void *workspace,
                             gemm_scratch_t *scratch, op_error_t *err)
{
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    if (p->k % 4 || p->n % 4) return GEMM_UNSUPPORTED; /* IMMA's leading dimension rule */
    if (p->trans_a) {
        int64_t count = p->a_batched ? p->batch : 1;
        int8_t *at = (int8_t *)gemm_scratch_get(scratch, (size_t)(count * p->m * p->k));
        if (!at) return op_error(err, -ENOMEM, "", "out of device scratch memory");
        gemm_transpose_launch_i8((const int8_t *)a, at, p->k, p->m, count, stream);
        a = at;
    }
    if (!p->trans_b) {
        int64_t count = p->b_batched ? p->batch : 1;
        int8_t *bt = (int8_t *)gemm_scratch_get(scratch, (size_t)(count * p->k * p->n));
        if (!bt) return op_error(err, -ENOMEM, "", "out of device scratch memory");
        gemm_transpose_launch_i8((const int8_t *)b, bt, p->k, p->n, count, stream);
        b = bt;
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return gemm_cuda_error(err, e);
    gemm_lt_problem_t pr;
    gemm_lt_problem_init(&pr, ctx, p, false, true, a, b, c, d);
    return gemm_lt_run(ctx, &pr, workspace, err);
}

/* Queues one call: cuBLASLt (i8: on TN operands first, then in the caller's layout), else the
 * fallback kernel. */
static int gemm_one(const op_cuda_ctx_t *ctx, const gemm_params_t *p, const void *a, const void *b,
                    const void *c, void *d, gemm_scratch_t *scratch, void **workspace,
                    op_error_t *err)
{
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    if (p->m == 0 || p->n == 0 || p->batch == 0) return 0;
    int r = GEMM_UNSUPPORTED;
    /* Lt's batch count is an int32; k = 0 is no GEMM to cuBLAS. The fallback takes both. */
    if (p->k > 0 && p->batch <= INT32_MAX) {
        if (!*workspace) *workspace = gemm_scratch_get(scratch, GEMM_WORKSPACE_BYTES);
        if (!*workspace)
            return op_error(err, -ENOMEM, "", "out of device scratch memory (gemm workspace)");
        /* i8 in the caller's layout, when not TN, is the slow second choice. */
        if (p->dtype == DTYPE_I8)
            r = gemm_lt_run_i8_tn(ctx, p, a, b, c, d, *workspace, scratch, err);
        if (r == GEMM_UNSUPPORTED) {
            gemm_lt_problem_t pr;
            gemm_lt_problem_init(&pr, ctx, p, p->trans_a, p->trans_b, a, b, c, d);
            r = gemm_lt_run(ctx, &pr, *workspace, err);
        }
    }
    if (r != GEMM_UNSUPPORTED) return r;
    gemm_fallback_t g;
    gemm_fallback_init(&g, p, p->batch);
    g.a = {NULL, a, p->a_batched ? p->m * p->k : 0};
    g.b = {NULL, b, p->b_batched ? p->k * p->n : 0};
    g.c = {NULL, c, p->m * p->n};
    g.d = {NULL, d, p->m * p->n};
    gemm_fallback_launch(p->dtype, &g, stream);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : gemm_cuda_error(err, e);
}

/* ------------------------------------------------------------------ n calls at once */

/* One cublasGemmBatchedEx over pointer arrays for every matrix of every call, c copied into
 * out first (cuBLAS updates C in place); the fallback kernel over the same arrays where cuBLAS
 * declines the problem. */
static int gemm_pointer_array(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                              const void *const *const *in, void *const *const *out,
                              gemm_scratch_t *scratch, op_error_t *err)
{
    const gemm_params_t *p = OP_PARAMS((op_call_t *)calls[0], gemm_params_t);
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    if (p->m == 0 || p->n == 0 || p->batch == 0) return 0;
    bool use_c = p->has_c && p->beta != 0;
    int64_t count = n * p->batch;
    size_t in_size = dtype_size(p->dtype), out_size = dtype_size(p->out_dtype);
    /* Tables: a, b, d, and c when used, back to back. */
    int n_tables = use_c ? 4 : 3;
    size_t table_bytes = (size_t)count * sizeof(void *);
    const void **host = (const void **)malloc(table_bytes * (size_t)n_tables);
    if (!host) return op_error(err, -ENOMEM, "", "out of memory");
    for (int i = 0; i < n; i++)
        for (int64_t z = 0; z < p->batch; z++) {
            int64_t at = i * p->batch + z;
            host[at] = (const char *)in[i][0] + (p->a_batched ? z * p->m * p->k * in_size : 0);
            host[count + at] =
                (const char *)in[i][1] + (p->b_batched ? z * p->k * p->n * in_size : 0);
            host[2 * count + at] = (const char *)out[i][0] + z * p->m * p->n * out_size;
            if (use_c) host[3 * count + at] = (const char *)in[i][2] + z * p->m * p->n * out_size;
        }
    const void **tables = (const void **)gemm_scratch_get(scratch, table_bytes * (size_t)n_tables);
    cudaError_t e = tables ? cudaMemcpyAsync(tables, host, table_bytes * (size_t)n_tables,
                                             cudaMemcpyHostToDevice, stream)
                           : cudaSuccess;
    free(host); /* pageable: staged by the time cudaMemcpyAsync returns */
    if (!tables) return op_error(err, -ENOMEM, "", "out of device scratch memory");
    if (e != cudaSuccess) return gemm_cuda_error(err, e);
    const void *const *a_ptrs = tables, *const *b_ptrs = tables + count;
    void *const *d_ptrs = (void *const *)(tables + 2 * count);
    if (use_c) {
        gemm_copy_launch(out_size, tables + 3 * count, d_ptrs, p->m * p->n, count, stream);
        e = cudaGetLastError();
        if (e != cudaSuccess) return gemm_cuda_error(err, e);
    }

    bool done = false;
    if (p->k > 0 && count <= INT32_MAX) {
        float alpha_f = (float)p->alpha, beta_f = use_c ? (float)p->beta : 0.0f;
        double alpha_d = p->alpha, beta_d = use_c ? p->beta : 0.0;
        int32_t alpha_i = (int32_t)p->alpha, beta_i = use_c ? (int32_t)p->beta : 0;
        /* The scalars in the compute type's scale type, as for cuBLASLt. */
        const void *alpha = &alpha_f, *beta = &beta_f;
        if (p->dtype == DTYPE_I8) alpha = &alpha_i, beta = &beta_i;
        if (p->dtype == DTYPE_F64) alpha = &alpha_d, beta = &beta_d;
        cublasHandle_t blas = (cublasHandle_t)ctx->blas;
        cublasStatus_t s = cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasGemmBatchedEx(blas, p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)p->n, (int)p->m,
                                    (int)p->k, alpha, b_ptrs, gemm_cuda_type(p->dtype),
                                    (int)(p->trans_b ? p->k : p->n), a_ptrs,
                                    gemm_cuda_type(p->dtype), (int)(p->trans_a ? p->m : p->k), beta,
                                    d_ptrs, gemm_cuda_type(p->out_dtype), (int)p->n, (int)count,
                                    gemm_compute_type(p), CUBLAS_GEMM_DEFAULT);
        done = s == CUBLAS_STATUS_SUCCESS;
        if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED &&
            s != CUBLAS_STATUS_INVALID_VALUE)
            return gemm_blas_error(err, "cublasGemmBatchedEx", s);
    }
    if (!done) {
        gemm_fallback_t g;
        gemm_fallback_init(&g, p, count);
        g.a = {a_ptrs, NULL, 0};
        g.b = {b_ptrs, NULL, 0};
        g.c = {(const void *const *)d_ptrs, NULL, 0}; /* c was copied into out */
        g.d = {(const void *const *)d_ptrs, NULL, 0};
        gemm_fallback_launch(p->dtype, &g, stream);
    }
    e = cudaGetLastError();
    return e == cudaSuccess ? 0 : gemm_cuda_error(err, e);
}

extern "C" int op_gemm_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                                const void *const *const *in, void *const *const *out,
                                op_error_t *err)
{
    const gemm_params_t *p = OP_PARAMS((op_call_t *)calls[0], gemm_params_t);
    gemm_scratch_t scratch = {ctx, {0}, 0};
    void *workspace = NULL;
    int r = 0;
    double size = (double)p->m * (double)p->n * (double)p->k * (double)p->batch;
    /* Without a cuBLAS handle from the worker there is no pointer-array form: one by one. */
    if (n == 1 || size >= (double)GEMM_LARGE_CALL || !ctx->blas) {
        for (int i = 0; i < n && r == 0; i++) {
            const gemm_params_t *q = OP_PARAMS((op_call_t *)calls[i], gemm_params_t);
            r = gemm_one(ctx, q, in[i][0], in[i][1], q->has_c ? in[i][2] : NULL, out[i][0],
                         &scratch, &workspace, err);
            /* Transposed i8 copies are per call: give them back before the next one. */
            int kept = 0;
            for (int j = 0; j < scratch.n; j++) {
                if (scratch.ptr[j] == workspace)
                    scratch.ptr[kept++] = workspace;
                else
                    ctx->scratch_free(ctx->pool, scratch.ptr[j]);
            }
            scratch.n = kept;
        }
    } else {
        r = gemm_pointer_array(ctx, n, calls, in, out, &scratch, err);
    }
    gemm_scratch_release(&scratch);
    return r;
}
