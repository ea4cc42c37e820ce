/* The sort op on CUDA: CUB radix and segmented sorts over order keys (see sort.h).
 *
 * n calls with one batch key are planned as one "group": their rows are segments of one
 * concatenated sort. A pack kernel writes order keys (and row-local indices or values) into
 * scratch, CUB sorts, and an unpack kernel turns order keys back into keys, gathers values or
 * widens indices, and scatters every call's part to its own outputs. A single call skips the
 * concatenation and sorts into its own output buffers.
 *
 * CUB is instantiated for u32 and u64 keys only (i32/f32 map to u32 order keys, i64/f64 to u64),
 * each keys-only or with a u32 payload: 4-byte values ride along directly; other values and
 * argsort carry the row-local index and are gathered or widened afterwards. */
#include "sort.h"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A group never exceeds what 32-bit offsets address. */
#define SORT_GROUP_MAX_ELEMENTS ((int64_t)UINT32_MAX)
/* Rows up to this length sort well in DeviceSegmentedSort's shared-memory paths. */
#define SORT_SMALL_ROW 4096
/* Rows at least this long (on average) each fill the GPU: a few of them sort one by one. */
#define SORT_LARGE_ROW (1 << 20)
#define SORT_MAX_LOOP_ROWS 64
#define SORT_THREADS 256
#define SORT_MAX_GRID_Y 65535

enum sort_payload { SORT_PAYLOAD_NONE, SORT_PAYLOAD_VALUES32, SORT_PAYLOAD_INDEX };

/* How a group's rows are sorted. */
enum sort_mode {
    SORT_MODE_RADIX,     /* one row: DeviceRadixSort */
    SORT_MODE_SEGMENTED, /* many short rows: DeviceSegmentedSort::StableSort* */
    SORT_MODE_TAGGED,    /* 32-bit keys, long rows: the row id above the key, one radix sort */
    SORT_MODE_LOOP,      /* a few very long rows: one DeviceRadixSort each */
};

/* One call's part of a group, in device memory for the kernels. */
typedef struct sort_seg {
    const void *keys_in;
    const void *values_in;
    void *keys_out;
    void *values_out; /* values or i64 indices */
    uint32_t count;   /* rows * len */
    uint32_t len;
    int64_t base;     /* first element in the concatenated buffers */
    int64_t row_base; /* first row among the group's rows */
} sort_seg_t;

/* What the kernels need to know besides the segment table. */
typedef struct sort_pass {
    dtype_t key_dtype;
    bool descending;
    bool tagged;
    bool keys;      /* pack: write order keys; unpack: write keys back */
    int payload;    /* enum sort_payload */
    bool values;    /* VALUES32: pack/unpack copies values through scratch */
    int value_size; /* INDEX: bytes per gathered value, 0 for argsort */
} sort_pass_t;

static __global__ void sort_pack_kernel(const sort_seg_t *segs, int seg0, sort_pass_t ps,
                                        void *order_keys, uint32_t *payload)
{
    const sort_seg_t s = segs[seg0 + blockIdx.y];
    /* 64-bit stride: a count near 2^32 must not wrap the index. */
    for (uint64_t jj = blockIdx.x * blockDim.x + threadIdx.x; jj < s.count;
         jj += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t j = (uint32_t)jj;
        int64_t at = s.base + j;
        if (ps.keys) {
            if (sort_key_is_wide(ps.key_dtype)) {
                uint64_t bits = ((const uint64_t *)s.keys_in)[j];
                ((uint64_t *)order_keys)[at] = sort_order_key64(ps.key_dtype, bits, ps.descending);
            } else {
                uint32_t bits = ((const uint32_t *)s.keys_in)[j];
                uint32_t k = sort_order_key32(ps.key_dtype, bits, ps.descending);
                if (ps.tagged)
                    ((uint64_t *)order_keys)[at] = (uint64_t)(s.row_base + j / s.len) << 32 | k;
                else
                    ((uint32_t *)order_keys)[at] = k;
            }
        }
        if (ps.payload == SORT_PAYLOAD_INDEX)
            payload[at] = j % s.len;
        else if (ps.payload == SORT_PAYLOAD_VALUES32 && ps.values)
            payload[at] = ((const uint32_t *)s.values_in)[j];
    }
}

/* Copies one value of `size` bytes; size is uniform across the launch. */
static __device__ __forceinline__ void sort_copy_value(void *dst, int64_t d, const void *src,
                                                       int64_t s, int size)
{
    switch (size) {
    case 1:
        ((uint8_t *)dst)[d] = ((const uint8_t *)src)[s];
        break;
    case 2:
        ((uint16_t *)dst)[d] = ((const uint16_t *)src)[s];
        break;
    case 4:
        ((uint32_t *)dst)[d] = ((const uint32_t *)src)[s];
        break;
    default:
        ((uint64_t *)dst)[d] = ((const uint64_t *)src)[s];
        break;
    }
}

static __global__ void sort_unpack_kernel(const sort_seg_t *segs, int seg0, sort_pass_t ps,
                                          const void *order_keys, const uint32_t *payload)
{
    const sort_seg_t s = segs[seg0 + blockIdx.y];
    /* 64-bit stride: a count near 2^32 must not wrap the index. */
    for (uint64_t jj = blockIdx.x * blockDim.x + threadIdx.x; jj < s.count;
         jj += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t j = (uint32_t)jj;
        int64_t at = s.base + j;
        if (ps.keys) {
            if (sort_key_is_wide(ps.key_dtype)) {
                uint64_t k = ((const uint64_t *)order_keys)[at];
                ((uint64_t *)s.keys_out)[j] = sort_key64_from_order(ps.key_dtype, k, ps.descending);
            } else {
                /* A tagged key's low half is the order key; its row id is already implied. */
                uint32_t k = ps.tagged ? (uint32_t)((const uint64_t *)order_keys)[at]
                                       : ((const uint32_t *)order_keys)[at];
                ((uint32_t *)s.keys_out)[j] = sort_key32_from_order(ps.key_dtype, k, ps.descending);
            }
        }
        if (ps.payload == SORT_PAYLOAD_INDEX) {
            uint32_t index = payload[at];
            if (ps.value_size == 0)
                ((int64_t *)s.values_out)[j] = index;
            else
                sort_copy_value(s.values_out, j, s.values_in, (int64_t)(j - j % s.len) + index,
                                ps.value_size);
        } else if (ps.payload == SORT_PAYLOAD_VALUES32 && ps.values) {
            ((uint32_t *)s.values_out)[j] = payload[at];
        }
    }
}

/* offsets[r] = first element of row r, for r in [0, n_rows]; segments are found by binary
 * search on row_base. */
static __global__ void sort_offsets_kernel(const sort_seg_t *segs, int n_segs, int64_t n_rows,
                                           int64_t *offsets)
{
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r <= n_rows;
         r += (int64_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = n_segs - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (segs[mid].row_base <= r)
                lo = mid;
            else
                hi = mid - 1;
        }
        const sort_seg_t &s = segs[lo];
        offsets[r] = r == n_rows ? s.base + s.count : s.base + (r - s.row_base) * s.len;
    }
}

/* Everything sort_group decides on the host. */
typedef struct sort_plan {
    sort_seg_t *segs; /* host copy, calls with no keys left out */
    int n_segs;
    int64_t n_items, n_rows, max_len, max_count;
    enum sort_mode mode;
    int end_bit;
    bool pairs; /* CUB carries a u32 payload */
} sort_plan_t;

/* Scratch allocations of one group, all returned together (the pool is stream-ordered, so
 * returning them right after queuing the work that uses them is safe). */
typedef struct sort_scratch {
    const op_cuda_ctx_t *ctx;
    void *ptr[8];
    int n;
} sort_scratch_t;

static void *sort_scratch_get(sort_scratch_t *s, size_t bytes)
{
    void *p = s->ctx->scratch_alloc(s->ctx->pool, bytes ? bytes : 1);
    if (p) s->ptr[s->n++] = p;
    return p;
}

static void sort_scratch_release(sort_scratch_t *s)
{
    for (int i = 0; i < s->n; i++)
        s->ctx->scratch_free(s->ctx->pool, s->ptr[i]);
    s->n = 0;
}

static int sort_cuda_error(op_error_t *err, cudaError_t e)
{
    return op_error(err, -EIO, "", "CUDA: %s", cudaGetErrorString(e));
}

template <typename K>
static cudaError_t sort_radix(bool pairs, void *tmp, size_t *tmp_bytes, const K *kin, K *kout,
                              const uint32_t *vin, uint32_t *vout, uint32_t n, int end_bit,
                              cudaStream_t stream)
{
    if (pairs)
        return cub::DeviceRadixSort::SortPairs(tmp, *tmp_bytes, kin, kout, vin, vout, n, 0, end_bit,
                                               stream);
    return cub::DeviceRadixSort::SortKeys(tmp, *tmp_bytes, kin, kout, n, 0, end_bit, stream);
}

/* Queues CUB's sort of the whole group, or with tmp == NULL only sizes its temp storage. */
template <typename K>
static cudaError_t sort_cub(const sort_plan_t *plan, void *tmp, size_t *tmp_bytes, const K *kin,
                            K *kout, const uint32_t *vin, uint32_t *vout, const int64_t *offsets,
                            cudaStream_t stream)
{
    switch (plan->mode) {
    case SORT_MODE_SEGMENTED:
        if (plan->pairs)
            return cub::DeviceSegmentedSort::StableSortPairs(tmp, *tmp_bytes, kin, kout, vin, vout,
                                                             plan->n_items, plan->n_rows, offsets,
                                                             offsets + 1, stream);
        return cub::DeviceSegmentedSort::StableSortKeys(tmp, *tmp_bytes, kin, kout, plan->n_items,
                                                        plan->n_rows, offsets, offsets + 1, stream);
    case SORT_MODE_LOOP:
        /* Temp storage sized for the longest row serves every shorter one. */
        if (!tmp)
            return sort_radix<K>(plan->pairs, NULL, tmp_bytes, kin, kout, vin, vout,
                                 (uint32_t)plan->max_len, plan->end_bit, stream);
        for (int i = 0; i < plan->n_segs; i++) {
            const sort_seg_t *s = &plan->segs[i];
            for (int64_t row = 0; row * s->len < s->count; row++) {
                int64_t at = s->base + row * s->len;
                cudaError_t e = sort_radix<K>(plan->pairs, tmp, tmp_bytes, kin + at, kout + at,
                                              vin ? vin + at : NULL, vout ? vout + at : NULL,
                                              s->len, plan->end_bit, stream);
                if (e != cudaSuccess) return e;
            }
        }
        return cudaSuccess;
    default:
        return sort_radix<K>(plan->pairs, tmp, tmp_bytes, kin, kout, vin, vout,
                             (uint32_t)plan->n_items, plan->end_bit, stream);
    }
}

static int sort_bit_length(uint64_t x)
{
    return x ? 64 - __builtin_clzll(x) : 0;
}

/* Picks how the group's rows are sorted; see enum sort_mode. */
static void sort_plan_mode(sort_plan_t *plan, dtype_t key_dtype)
{
    bool wide = sort_key_is_wide(key_dtype);
    if (plan->n_rows == 1)
        plan->mode = SORT_MODE_RADIX;
    else if (plan->max_len <= SORT_SMALL_ROW)
        plan->mode = SORT_MODE_SEGMENTED;
    else if (plan->n_items / plan->n_rows >= SORT_LARGE_ROW && plan->n_rows <= SORT_MAX_LOOP_ROWS)
        plan->mode = SORT_MODE_LOOP;
    else if (!wide)
        plan->mode = SORT_MODE_TAGGED;
    else
        plan->mode = SORT_MODE_SEGMENTED;
    plan->end_bit = plan->mode == SORT_MODE_TAGGED
                        ? 32 + sort_bit_length((uint64_t)plan->n_rows - 1)
                    : wide ? 64
                           : 32;
}

/* Queues one launch per chunk of SORT_MAX_GRID_Y calls; blockIdx.y picks the call. */
template <typename Kernel, typename... Args>
static void sort_launch_per_seg(const sort_plan_t *plan, int sms, cudaStream_t stream,
                                Kernel kernel, const sort_seg_t *d_segs, Args... args)
{
    int64_t blocks = (plan->max_count + SORT_THREADS - 1) / SORT_THREADS;
    unsigned gx = (unsigned)(blocks < 4 * sms ? blocks : 4 * sms);
    for (int c0 = 0; c0 < plan->n_segs; c0 += SORT_MAX_GRID_Y) {
        int gy = plan->n_segs - c0 < SORT_MAX_GRID_Y ? plan->n_segs - c0 : SORT_MAX_GRID_Y;
        kernel<<<dim3(gx, (unsigned)gy), SORT_THREADS, 0, stream>>>(d_segs, c0, args...);
    }
}

/* How a planned group's keys and values travel: what CUB sorts beside the keys, and which
 * buffers a single call lends directly instead of scratch copies. */
typedef struct sort_layout {
    int payload;    /* enum sort_payload */
    int value_size; /* bytes per value when the call has values, else 0 */
    bool identity;  /* u32 ascending: the stored keys are already the order keys */
    bool direct_keys_in, direct_keys_out, direct_values;
    size_t key_size; /* bytes per order key */
} sort_layout_t;

/* Chooses the payload and the direct buffers of a group whose mode is planned, and sets
 * plan->pairs. */
static sort_layout_t sort_layout_plan(const sort_params_t *p, sort_plan_t *plan)
{
    sort_layout_t lay = {};
    lay.payload = SORT_PAYLOAD_NONE;
    if (p->argsort) {
        lay.payload = SORT_PAYLOAD_INDEX;
    } else if (p->has_values) {
        lay.value_size = (int)dtype_size(p->value_dtype);
        lay.payload = lay.value_size == 4 ? SORT_PAYLOAD_VALUES32 : SORT_PAYLOAD_INDEX;
    }
    plan->pairs = lay.payload != SORT_PAYLOAD_NONE;

    /* A single call sorts straight between its own buffers where the layout allows. */
    bool single = plan->n_segs == 1;
    lay.identity = p->key_dtype == DTYPE_U32 && !p->descending;
    lay.direct_keys_in = single && lay.identity && plan->mode != SORT_MODE_TAGGED;
    lay.direct_keys_out = single && plan->mode != SORT_MODE_TAGGED;
    lay.direct_values = single && lay.payload == SORT_PAYLOAD_VALUES32;
    lay.key_size = sort_key_is_wide(p->key_dtype) || plan->mode == SORT_MODE_TAGGED ? 8 : 4;
    return lay;
}

/* The device buffers of one group's sort. */
typedef struct sort_buffers {
    const void *kin;
    void *kout;
    const uint32_t *vin; /* NULL without pairs */
    uint32_t *vout;      /* NULL without pairs */
    sort_seg_t *d_segs;
    int64_t *offsets; /* SORT_MODE_SEGMENTED only, else NULL */
} sort_buffers_t;

/* Takes from scratch every buffer the layout does not borrow from the single call. 0 and
 * *ret_bufs, or -ENOMEM with err filled (what was taken stays in scratch to be released). */
static int sort_buffers_get(const sort_plan_t *plan, const sort_layout_t *lay,
                            sort_scratch_t *scratch, sort_buffers_t *ret_bufs, op_error_t *err)
{
    size_t n = (size_t)plan->n_items;
    const sort_seg_t *s0 = &plan->segs[0];
    const void *kin =
        lay->direct_keys_in ? s0->keys_in : sort_scratch_get(scratch, n * lay->key_size);
    void *kout = lay->direct_keys_out ? s0->keys_out : sort_scratch_get(scratch, n * lay->key_size);
    const uint32_t *vin = NULL;
    uint32_t *vout = NULL;
    if (plan->pairs) {
        vin = lay->direct_values ? (const uint32_t *)s0->values_in
                                 : (const uint32_t *)sort_scratch_get(scratch, n * 4);
        vout = lay->direct_values ? (uint32_t *)s0->values_out
                                  : (uint32_t *)sort_scratch_get(scratch, n * 4);
    }
    sort_seg_t *d_segs =
        (sort_seg_t *)sort_scratch_get(scratch, (size_t)plan->n_segs * sizeof *d_segs);
    int64_t *offsets = plan->mode == SORT_MODE_SEGMENTED
                           ? (int64_t *)sort_scratch_get(scratch, (size_t)(plan->n_rows + 1) * 8)
                           : NULL;
    if (!kin || !kout || (plan->pairs && (!vin || !vout)) || !d_segs ||
        (plan->mode == SORT_MODE_SEGMENTED && !offsets))
        return op_error(err, -ENOMEM, "", "out of device scratch memory sorting %lld keys",
                        (long long)plan->n_items);
    *ret_bufs = sort_buffers_t{kin, kout, vin, vout, d_segs, offsets};
    return 0;
}

/* Queues the pack pass where it has work, then the segment offsets CUB's segmented sort
 * reads. Launch errors are left for the caller's cudaGetLastError(). */
static void sort_queue_pack(const sort_plan_t *plan, const sort_layout_t *lay,
                            const sort_pass_t &pack, const sort_buffers_t *b, int sms,
                            cudaStream_t stream)
{
    if (pack.keys || lay->payload == SORT_PAYLOAD_INDEX ||
        (lay->payload == SORT_PAYLOAD_VALUES32 && !lay->direct_values))
        sort_launch_per_seg(plan, sms, stream, sort_pack_kernel, b->d_segs, pack, (void *)b->kin,
                            (uint32_t *)b->vin);
    if (b->offsets) {
        int64_t blocks = (plan->n_rows + SORT_THREADS) / SORT_THREADS;
        unsigned grid = (unsigned)(blocks < 4 * sms ? blocks : 4 * sms);
        sort_offsets_kernel<<<grid, SORT_THREADS, 0, stream>>>(b->d_segs, plan->n_segs,
                                                               plan->n_rows, b->offsets);
    }
}

/* Sizes CUB's temp storage, takes it from scratch and queues the sort of b's keys (and
 * values) from kin to kout. 0, or a negative errno with err filled. */
static int sort_queue_cub(const sort_plan_t *plan, const sort_layout_t *lay,
                          const sort_buffers_t *b, sort_scratch_t *scratch, cudaStream_t stream,
                          op_error_t *err)
{
    size_t tmp_bytes = 0;
    cudaError_t e =
        lay->key_size == 8
            ? sort_cub<uint64_t>(plan, NULL, &tmp_bytes, NULL, NULL, NULL, NULL, NULL, stream)
            : sort_cub<uint32_t>(plan, NULL, &tmp_bytes, NULL, NULL, NULL, NULL, NULL, stream);
    if (e != cudaSuccess) return sort_cuda_error(err, e);
    void *tmp = sort_scratch_get(scratch, tmp_bytes);
    if (!tmp)
        return op_error(err, -ENOMEM, "", "out of device scratch memory (%zu bytes of sort temp)",
                        tmp_bytes);
    e = lay->key_size == 8
            ? sort_cub<uint64_t>(plan, tmp, &tmp_bytes, (const uint64_t *)b->kin,
                                 (uint64_t *)b->kout, b->vin, b->vout, b->offsets, stream)
            : sort_cub<uint32_t>(plan, tmp, &tmp_bytes, (const uint32_t *)b->kin,
                                 (uint32_t *)b->kout, b->vin, b->vout, b->offsets, stream);
    if (e != cudaSuccess) return sort_cuda_error(err, e);
    return 0;
}

/* Sorts the planned group: pack, CUB, unpack. Scratch comes from and goes back to *scratch. */
static int sort_group_run(const op_cuda_ctx_t *ctx, const sort_params_t *p, sort_plan_t *plan,
                          sort_scratch_t *scratch, op_error_t *err)
{
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    int sms = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device);
    if (e != cudaSuccess) return sort_cuda_error(err, e);

    sort_plan_mode(plan, p->key_dtype);
    const sort_layout_t lay = sort_layout_plan(p, plan);
    sort_buffers_t b = {};
    int r = sort_buffers_get(plan, &lay, scratch, &b, err);
    if (r < 0) return r;
    e = cudaMemcpyAsync(b.d_segs, plan->segs, (size_t)plan->n_segs * sizeof *b.d_segs,
                        cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return sort_cuda_error(err, e);

    sort_pass_t pack = {p->key_dtype,        p->descending, plan->mode == SORT_MODE_TAGGED,
                        !lay.direct_keys_in, lay.payload,   !lay.direct_values,
                        lay.value_size};
    sort_queue_pack(plan, &lay, pack, &b, sms, stream);
    e = cudaGetLastError();
    if (e != cudaSuccess) return sort_cuda_error(err, e);

    r = sort_queue_cub(plan, &lay, &b, scratch, stream, err);
    if (r < 0) return r;

    sort_pass_t unpack = pack;
    unpack.keys = !(lay.direct_keys_out && lay.identity);
    if (unpack.keys || lay.payload == SORT_PAYLOAD_INDEX ||
        (lay.payload == SORT_PAYLOAD_VALUES32 && !lay.direct_values))
        sort_launch_per_seg(plan, sms, stream, sort_unpack_kernel, b.d_segs, unpack,
                            (const void *)b.kout, (const uint32_t *)b.vout);
    e = cudaGetLastError();
    return e == cudaSuccess ? 0 : sort_cuda_error(err, e);
}

/* Sorts calls[0..n) (with one batch key, at most SORT_GROUP_MAX_ELEMENTS keys together, unless
 * a single call) as one group. */
static int sort_group(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                      const void *const *const *in, void *const *const *out, op_error_t *err)
{
    sort_plan_t plan = {};
    plan.segs = (sort_seg_t *)calloc((size_t)n, sizeof *plan.segs);
    if (!plan.segs) return op_error(err, -ENOMEM, "", "out of memory planning a sort");
    for (int i = 0; i < n; i++) {
        const sort_params_t *q = OP_PARAMS((op_call_t *)calls[i], sort_params_t);
        int64_t count = q->rows * q->len;
        if (count == 0) continue;
        sort_seg_t *s = &plan.segs[plan.n_segs++];
        s->keys_in = in[i][0];
        s->values_in = q->has_values ? in[i][1] : NULL;
        s->keys_out = out[i][0];
        s->values_out = calls[i]->n_out > 1 ? out[i][1] : NULL;
        s->count = (uint32_t)count;
        s->len = (uint32_t)q->len;
        s->base = plan.n_items;
        s->row_base = plan.n_rows;
        plan.n_items += count;
        plan.n_rows += q->rows;
        if (q->len > plan.max_len) plan.max_len = q->len;
        if (count > plan.max_count) plan.max_count = count;
    }
    int r = 0;
    if (plan.n_segs > 0) {
        sort_scratch_t scratch = {ctx, {0}, 0};
        r = sort_group_run(ctx, OP_PARAMS((op_call_t *)calls[0], sort_params_t), &plan, &scratch,
                           err);
        sort_scratch_release(&scratch);
    }
    free(plan.segs);
    return r;
}

extern "C" int op_sort_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                                const void *const *const *in, void *const *const *out,
                                op_error_t *err)
{
    for (int i = 0; i < n;) {
        /* As many calls as fit one group's 32-bit offsets. */
        int64_t total = 0;
        int j = i;
        while (j < n) {
            const sort_params_t *q = OP_PARAMS((op_call_t *)calls[j], sort_params_t);
            int64_t count = q->rows * q->len;
            if (j > i && total + count > SORT_GROUP_MAX_ELEMENTS) break;
            total += count;
            j++;
        }
        int r = sort_group(ctx, j - i, calls + i, in + i, out + i, err);
        if (r < 0) return r;
        i = j;
    }
    return 0;
}
