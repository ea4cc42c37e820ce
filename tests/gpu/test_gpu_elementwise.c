/* GPU tests of add, mul, saxpy, sum, dot, quantize and dequantize: every op and dtype, at sizes
 * around the block and tile sizes, single and batched (calls of different sizes in one
 * run_cuda), on tensors that do and do not start on a 16-byte boundary, against the CPU
 * reference on fresh random inputs with the outputs poisoned first. Exits 77 (skipped) without
 * a GPU. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/op.h"
#include "support/gpu_support.h"
#include "support/run_suite.h"

#define MAX_CALLS 8

static op_cuda_ctx_t *ctx;
static unsigned base_seed; /* advances with every case */
static unsigned run_seed;  /* the seed the run started from, printed on failure */

/* 1 << 16 is a whole number of tiles for every op and dtype. */
static const int64_t sizes[] = {0, 1, 1000, 4097, 1 << 16, (1 << 20) + 3};
#define N_SIZES (int)(sizeof sizes / sizeof sizes[0])

/* One call: its params and inputs, each filled uniformly in [lo, hi]. Every input and output
 * of the call starts `offset` elements (of its own dtype) into its device allocation, so that
 * a non-zero offset moves it off the 16-byte boundary cudaMalloc gives. */
typedef struct call_spec {
    const char *params;
    int n_in;
    tensor_desc_t in[2];
    double lo[2], hi[2];
    int offset;
} call_spec_t;

static tensor_desc_t vec(dtype_t dt, int64_t n)
{
    return (tensor_desc_t){.dtype = dt, .ndim = 1, .shape = {n}};
}

static tensor_desc_t scalar(dtype_t dt)
{
    return (tensor_desc_t){.dtype = dt, .ndim = 0};
}

/* Compares one output: bit for bit when tol is 0 or the dtype is an integer, else by relative
 * norm error. what names the case in failure messages. */
static void compare_output(const char *what, const tensor_desc_t *d, const void *gpu,
                           const void *cpu, double tol)
{
    int64_t n = tensor_desc_numel(d);
    if (tol == 0 || !dtype_is_float(d->dtype)) {
        size_t size = dtype_size(d->dtype);
        /* The first difference, found before asserting: Check records every assertion. */
        int64_t i = 0;
        while (i < n &&
               memcmp((const char *)gpu + i * size, (const char *)cpu + i * size, size) == 0)
            i++;
        ck_assert_msg(i == n, "%s: element %lld of %lld: GPU %g, CPU %g (seed %u)", what,
                      (long long)i, (long long)n, i < n ? tensor_load(d->dtype, gpu, i) : 0,
                      i < n ? tensor_load(d->dtype, cpu, i) : 0, run_seed);
        return;
    }
    double e = rel_norm_error(d->dtype, gpu, cpu, n);
    ck_assert_msg(e < tol, "%s: relative error %g >= %g (seed %u)", what, e, tol, run_seed);
}

/* Runs n calls of op in one run_cuda (twice with `repeat`, demanding identical bits) and each
 * on the CPU, and compares every output with tolerance tol (see compare_output). */
static void check_calls(const char *op_name, int n, const call_spec_t *specs, double tol,
                        bool repeat)
{
    ck_assert_int_le(n, MAX_CALLS);
    const op_def_t *op = op_find(op_name);
    ck_assert_ptr_nonnull(op);
    op_call_t calls[MAX_CALLS];
    const op_call_t *call_ptrs[MAX_CALLS];
    void *host_in[MAX_CALLS][2] = {{0}};
    const void *dev_in[MAX_CALLS][OP_MAX_TENSORS] = {{0}};
    void *dev_out[MAX_CALLS][OP_MAX_TENSORS] = {{0}};
    /* The allocations the offset pointers above lie in. */
    void *dev_in_base[MAX_CALLS][OP_MAX_TENSORS] = {{0}};
    void *dev_out_base[MAX_CALLS][OP_MAX_TENSORS] = {{0}};
    const void *const *in_rows[MAX_CALLS];
    void *const *out_rows[MAX_CALLS];
    unsigned seed = base_seed;
    for (int i = 0; i < n; i++) {
        op_call_t *c = &calls[i];
        memset(c, 0, sizeof *c);
        c->op = op;
        json_error_t jerr;
        json_t *params = specs[i].params ? json_loads(specs[i].params, 0, &jerr) : NULL;
        for (int j = 0; j < specs[i].n_in; j++) {
            c->in[j] = specs[i].in[j];
            c->has_in[j] = true;
        }
        op_error_t err;
        int r = op->validate(params, c, &err);
        json_decref(params);
        ck_assert_msg(r == 0, "%s: %s: %s", op_name, err.field, err.message);
        for (int j = 0; j < specs[i].n_in; j++) {
            size_t bytes = tensor_desc_bytes(&c->in[j]);
            host_in[i][j] = malloc(bytes ? bytes : 1);
            fill_random(c->in[j].dtype, host_in[i][j], tensor_desc_numel(&c->in[j]), specs[i].lo[j],
                        specs[i].hi[j], &seed);
            size_t pad = (size_t)specs[i].offset * dtype_size(c->in[j].dtype);
            dev_in_base[i][j] = gpu_alloc_poisoned(bytes + pad);
            void *d = (char *)dev_in_base[i][j] + pad;
            gpu_upload(d, host_in[i][j], bytes);
            dev_in[i][j] = d;
        }
        for (int j = 0; j < c->n_out; j++) {
            size_t pad = (size_t)specs[i].offset * dtype_size(c->out[j].dtype);
            dev_out_base[i][j] = gpu_alloc_poisoned(tensor_desc_bytes(&c->out[j]) + pad);
            dev_out[i][j] = (char *)dev_out_base[i][j] + pad;
        }
        call_ptrs[i] = c;
        in_rows[i] = dev_in[i];
        out_rows[i] = dev_out[i];
    }
    void *first[MAX_CALLS][OP_MAX_TENSORS] = {{0}};
    for (int run = 0; run < (repeat ? 2 : 1); run++) {
        op_error_t err;
        int r = op->run_cuda(ctx, n, call_ptrs, in_rows, out_rows, &err);
        ck_assert_msg(r == 0, "%s run_cuda: %s", op_name, err.message);
        gpu_sync(ctx);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < calls[i].n_out; j++) {
                size_t bytes = tensor_desc_bytes(&calls[i].out[j]);
                void *got = malloc(bytes ? bytes : 1);
                gpu_download(got, dev_out[i][j], bytes);
                if (run == 0) {
                    first[i][j] = got;
                } else {
                    ck_assert_msg(memcmp(got, first[i][j], bytes) == 0,
                                  "%s call %d output %d: two GPU runs differ", op_name, i, j);
                    free(got);
                }
            }
    }
    for (int i = 0; i < n; i++) {
        const op_call_t *c = &calls[i];
        void *cpu_out[OP_MAX_TENSORS] = {0};
        for (int j = 0; j < c->n_out; j++) {
            size_t bytes = tensor_desc_bytes(&c->out[j]);
            cpu_out[j] = malloc(bytes ? bytes : 1);
        }
        const void *cpu_in[OP_MAX_TENSORS] = {host_in[i][0], host_in[i][1]};
        op_error_t err;
        ck_assert_int_eq(op->run_cpu(c, cpu_in, cpu_out, &err), 0);
        for (int j = 0; j < c->n_out; j++) {
            char what[160];
            snprintf(what, sizeof what, "%s %s call %d/%d (%lld elements) output %s", op_name,
                     dtype_name(c->in[0].dtype), i, n, (long long)tensor_desc_numel(&c->in[0]),
                     c->out_names[j]);
            compare_output(what, &c->out[j], first[i][j], cpu_out[j], tol);
            free(cpu_out[j]);
            free(first[i][j]);
        }
        for (int j = 0; j < 2; j++) {
            free(host_in[i][j]);
            gpu_free(dev_in_base[i][j]);
        }
        for (int j = 0; j < c->n_out; j++)
            gpu_free(dev_out_base[i][j]);
    }
    base_seed = seed;
}

static const dtype_t ew_dtypes[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_F64, DTYPE_I32};

/* The error bound of an elementwise result in dtype dt. */
static double ew_tol(dtype_t dt)
{
    switch (dt) {
    case DTYPE_F32:
        return 1e-5;
    case DTYPE_F16:
    case DTYPE_BF16:
        return 1e-2;
    default:
        /* f64 and i32: bit for bit (elementwise.h). */
        return 0;
    }
}

/* An elementwise call on n elements; i32 inputs span most of the range so results wrap. */
static call_spec_t ew_spec(const char *op, dtype_t dt, int64_t n, bool y_scalar, int k)
{
    bool is_int = dt == DTYPE_I32;
    double lim = is_int ? 2e9 : 1;
    call_spec_t s = {.n_in = 2, .lo = {-lim, -lim}, .hi = {lim, lim}};
    s.in[0] = vec(dt, n);
    s.in[1] = y_scalar ? scalar(dt) : vec(dt, n);
    /* saxpy: factors differ per call of a batch, and are integers for i32. */
    static const char *const float_a[] = {"{\"a\": -1.75}", "{\"a\": 0.3}", "{\"a\": 3}"};
    static const char *const int_a[] = {"{\"a\": -3}", "{\"a\": 7}", "{\"a\": 65537}"};
    if (strcmp(op, "saxpy") == 0) s.params = (is_int ? int_a : float_a)[k % 3];
    return s;
}

static const char *const ew_ops[] = {"add", "mul", "saxpy"};

START_TEST(test_elementwise_matches_cpu_in_every_dtype_and_size)
{
    for (int o = 0; o < 3; o++)
        for (int t = 0; t < 5; t++)
            for (int k = 0; k < N_SIZES; k++) {
                call_spec_t s = ew_spec(ew_ops[o], ew_dtypes[t], sizes[k], false, k);
                check_calls(ew_ops[o], 1, &s, ew_tol(ew_dtypes[t]), false);
                s = ew_spec(ew_ops[o], ew_dtypes[t], sizes[k], true, k);
                check_calls(ew_ops[o], 1, &s, ew_tol(ew_dtypes[t]), false);
            }
}
END_TEST

/* One element past the boundary, every tensor of the call: full tiles must take the element
 * path and give the same results; in a batch, aligned and unaligned calls run side by side. */
START_TEST(test_elementwise_unaligned_tensors_match_cpu_single_and_batched)
{
    const int64_t n = (1 << 16) + 5;
    for (int o = 0; o < 3; o++)
        for (int t = 0; t < 5; t++)
            for (int ys = 0; ys < 2; ys++) {
                call_spec_t s[3];
                for (int i = 0; i < 3; i++) {
                    s[i] = ew_spec(ew_ops[o], ew_dtypes[t], n - i, ys, i);
                    s[i].offset = i == 1 ? 0 : 1;
                }
                check_calls(ew_ops[o], 1, &s[0], ew_tol(ew_dtypes[t]), false);
                check_calls(ew_ops[o], 3, s, ew_tol(ew_dtypes[t]), false);
            }
}
END_TEST

START_TEST(test_elementwise_batch_of_mixed_sizes_matches_cpu)
{
    const int64_t mixed[] = {4097, 0, 1, (1 << 20) + 3, 1000, 33};
    for (int o = 0; o < 3; o++)
        for (int t = 0; t < 5; t++)
            for (int ys = 0; ys < 2; ys++) {
                call_spec_t s[6];
                for (int i = 0; i < 6; i++)
                    s[i] = ew_spec(ew_ops[o], ew_dtypes[t], mixed[i], ys, i);
                check_calls(ew_ops[o], 6, s, ew_tol(ew_dtypes[t]), false);
            }
}
END_TEST

/* Reductions: inputs in [-0.5, 1.5] keep the sum well away from 0, so a relative error
 * measures the accumulation rather than the cancellation of random signs. */
static call_spec_t red_spec(const char *op, dtype_t dt, int64_t n)
{
    bool is_int = dt == DTYPE_I32;
    call_spec_t s = {.n_in = strcmp(op, "dot") == 0 ? 2 : 1};
    for (int j = 0; j < s.n_in; j++) {
        s.in[j] = vec(dt, n);
        s.lo[j] = is_int ? -2e9 : -0.5;
        s.hi[j] = is_int ? 2e9 : 1.5;
    }
    return s;
}

/* Sums of f32, f16 and bf16 inputs are f32; f64 gives f64; i32 gives i64 (exact). */
static double red_tol(dtype_t dt)
{
    return dt == DTYPE_F64 ? 1e-12 : dt == DTYPE_I32 ? 0 : 1e-5;
}

START_TEST(test_sum_and_dot_match_cpu_and_repeat_bit_identically)
{
    const char *ops[] = {"sum", "dot"};
    for (int o = 0; o < 2; o++)
        for (int t = 0; t < 5; t++)
            for (int k = 0; k < N_SIZES; k++) {
                call_spec_t s = red_spec(ops[o], ew_dtypes[t], sizes[k]);
                check_calls(ops[o], 1, &s, red_tol(ew_dtypes[t]), true);
            }
}
END_TEST

START_TEST(test_sum_and_dot_batch_of_mixed_sizes_matches_cpu)
{
    const int64_t mixed[] = {(1 << 20) + 3, 0, 1, 4097, 1000, 70000, 16384};
    const char *ops[] = {"sum", "dot"};
    for (int o = 0; o < 2; o++)
        for (int t = 0; t < 5; t++) {
            call_spec_t s[7];
            for (int i = 0; i < 7; i++)
                s[i] = red_spec(ops[o], ew_dtypes[t], mixed[i]);
            check_calls(ops[o], 7, s, red_tol(ew_dtypes[t]), true);
        }
}
END_TEST

/* Runs one sum call alone and as the last call of a batch, on the same device input. */
START_TEST(test_sum_in_a_batch_gives_the_same_bits_as_alone)
{
    const op_def_t *op = op_find("sum");
    const int64_t n = 300001, other = 5000;
    op_call_t calls[2] = {{.op = op}, {.op = op}};
    calls[0].in[0] = vec(DTYPE_F32, other);
    calls[1].in[0] = vec(DTYPE_F32, n);
    calls[0].has_in[0] = calls[1].has_in[0] = true;
    op_error_t err;
    ck_assert_int_eq(op->validate(NULL, &calls[0], &err), 0);
    ck_assert_int_eq(op->validate(NULL, &calls[1], &err), 0);
    float *host = malloc((size_t)n * sizeof *host);
    unsigned seed = base_seed++;
    fill_random(DTYPE_F32, host, n, -0.5, 1.5, &seed);
    void *x = gpu_alloc_poisoned((size_t)n * 4), *y = gpu_alloc_poisoned((size_t)other * 4);
    gpu_upload(x, host, (size_t)n * 4);
    gpu_upload(y, host, (size_t)other * 4);
    void *out_alone = gpu_alloc_poisoned(4), *out_batched = gpu_alloc_poisoned(4);
    void *out_other = gpu_alloc_poisoned(4);
    const void *in_x[1] = {x}, *in_y[1] = {y};
    void *o_alone[1] = {out_alone}, *o_batched[1] = {out_batched}, *o_other[1] = {out_other};
    const op_call_t *one[1] = {&calls[1]};
    const void *const *ins1[1] = {in_x};
    void *const *outs1[1] = {o_alone};
    ck_assert_int_eq(op->run_cuda(ctx, 1, one, ins1, outs1, &err), 0);
    const op_call_t *two[2] = {&calls[0], &calls[1]};
    const void *const *ins2[2] = {in_y, in_x};
    void *const *outs2[2] = {o_other, o_batched};
    ck_assert_int_eq(op->run_cuda(ctx, 2, two, ins2, outs2, &err), 0);
    gpu_sync(ctx);
    float a, b;
    gpu_download(&a, out_alone, 4);
    gpu_download(&b, out_batched, 4);
    ck_assert_msg(memcmp(&a, &b, 4) == 0, "alone %.9g, batched %.9g", a, b);
    free(host);
    gpu_free(x);
    gpu_free(y);
    gpu_free(out_alone);
    gpu_free(out_batched);
    gpu_free(out_other);
}
END_TEST

static const dtype_t q_dtypes[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};

/* A quantize call on x of the given shape; per channel along axis when params says so, with a
 * given scale of scale_desc when with_scale (small enough that some values clamp). */
static call_spec_t q_spec(dtype_t dt, tensor_desc_t shape, const char *params, bool with_scale,
                          tensor_desc_t scale_desc)
{
    call_spec_t s = {.params = params, .n_in = with_scale ? 2 : 1};
    s.in[0] = shape;
    s.in[0].dtype = dt;
    s.lo[0] = -3;
    s.hi[0] = 3;
    if (with_scale) {
        s.in[1] = scale_desc;
        s.lo[1] = 0.005;
        s.hi[1] = 0.05;
    }
    return s;
}

static call_spec_t dq_spec(tensor_desc_t shape, const char *params, tensor_desc_t scale_desc)
{
    call_spec_t s = {.params = params, .n_in = 2};
    s.in[0] = shape;
    s.in[0].dtype = DTYPE_I8;
    s.lo[0] = -127;
    s.hi[0] = 127;
    s.in[1] = scale_desc;
    s.lo[1] = 0.001;
    s.hi[1] = 1;
    return s;
}

/* Per-channel layouts: channels first, last (a few channels: shared-memory maxima), and in the
 * middle with more channels than fit in shared memory. Runs of one channel are long (whole
 * vectors share a channel), one element (every element of a vector changes channel), or a few
 * elements that do not divide a vector, each over several full tiles. */
static const struct {
    tensor_desc_t shape;
    const char *params;
    int64_t channels;
} layouts[] = {
    {{.ndim = 2, .shape = {7, 1000}}, "{\"axis\": 0}", 7},
    {{.ndim = 2, .shape = {4097, 5}}, "{\"axis\": -1}", 5},
    {{.ndim = 3, .shape = {3, 5000, 4}}, "{\"axis\": 1}", 5000},
    {{.ndim = 2, .shape = {0, 9}}, "{\"axis\": 1}", 9},
    {{.ndim = 2, .shape = {64, 4096}}, "{\"axis\": 0}", 64},
    {{.ndim = 2, .shape = {2048, 24}}, "{\"axis\": -1}", 24},
    {{.ndim = 3, .shape = {8, 1000, 3}}, "{\"axis\": 1}", 1000},
};
#define N_LAYOUTS (int)(sizeof layouts / sizeof layouts[0])

/* q and the scale are computed with the same correctly rounded f32 operations on both sides,
 * so they must agree bit for bit. */
START_TEST(test_quantize_matches_cpu_exactly)
{
    for (int t = 0; t < 3; t++) {
        for (int k = 0; k < N_SIZES; k++)
            for (int given = 0; given < 2; given++) {
                call_spec_t s =
                    q_spec(q_dtypes[t], vec(q_dtypes[t], sizes[k]), NULL, given, scalar(DTYPE_F32));
                check_calls("quantize", 1, &s, 0, false);
            }
        for (int l = 0; l < N_LAYOUTS; l++)
            for (int given = 0; given < 2; given++) {
                call_spec_t s = q_spec(q_dtypes[t], layouts[l].shape, layouts[l].params, given,
                                       vec(DTYPE_F32, layouts[l].channels));
                check_calls("quantize", 1, &s, 0, false);
            }
    }
}
END_TEST

START_TEST(test_quantize_batch_of_mixed_sizes_matches_cpu)
{
    const int64_t mixed[] = {4097, 0, 1, (1 << 20) + 3, 1000};
    for (int t = 0; t < 3; t++)
        for (int given = 0; given < 2; given++) {
            call_spec_t s[N_LAYOUTS > 5 ? N_LAYOUTS : 5];
            for (int i = 0; i < 5; i++)
                s[i] =
                    q_spec(q_dtypes[t], vec(q_dtypes[t], mixed[i]), NULL, given, scalar(DTYPE_F32));
            check_calls("quantize", 5, s, 0, false);
            for (int l = 0; l < N_LAYOUTS; l++)
                s[l] = q_spec(q_dtypes[t], layouts[l].shape, layouts[l].params, given,
                              vec(DTYPE_F32, layouts[l].channels));
            check_calls("quantize", N_LAYOUTS, s, 0, false);
        }
}
END_TEST

/* Offsets of 1 and 4 elements: x (or q) and the outputs off the 16-byte boundary. dequantize
 * keeps its word path for q 4 bytes in (out is then 16 bytes in); the rest take the element
 * path. Per tensor and per channel, single and batched with an aligned call. */
START_TEST(test_quantize_and_dequantize_unaligned_tensors_match_cpu)
{
    const int64_t n = (1 << 16) + 3;
    const tensor_desc_t rows = {.ndim = 2, .shape = {64, 4096}};
    for (int off = 1; off <= 4; off += 3) {
        for (int t = 0; t < 3; t++)
            for (int given = 0; given < 2; given++) {
                call_spec_t s[3] = {
                    q_spec(q_dtypes[t], vec(q_dtypes[t], n), NULL, given, scalar(DTYPE_F32)),
                    q_spec(q_dtypes[t], rows, "{\"axis\": 0}", given, vec(DTYPE_F32, 64)),
                    q_spec(q_dtypes[t], rows, "{\"axis\": 0}", given, vec(DTYPE_F32, 64)),
                };
                s[0].offset = s[1].offset = off;
                check_calls("quantize", 1, &s[0], 0, false);
                check_calls("quantize", 1, &s[1], 0, false);
                check_calls("quantize", 2, &s[1], 0, false);
            }
        call_spec_t d[3] = {
            dq_spec(vec(DTYPE_I8, n), NULL, scalar(DTYPE_F32)),
            dq_spec(rows, "{\"axis\": 0}", vec(DTYPE_F32, 64)),
            dq_spec(rows, "{\"axis\": 0}", vec(DTYPE_F32, 64)),
        };
        d[0].offset = d[1].offset = off;
        check_calls("dequantize", 1, &d[0], 0, false);
        check_calls("dequantize", 1, &d[1], 0, false);
        check_calls("dequantize", 2, &d[1], 0, false);
    }
}
END_TEST

START_TEST(test_dequantize_matches_cpu_exactly_single_and_batched)
{
    call_spec_t batch[N_SIZES > N_LAYOUTS ? N_SIZES : N_LAYOUTS];
    for (int k = 0; k < N_SIZES; k++) {
        batch[k] = dq_spec(vec(DTYPE_I8, sizes[k]), NULL, scalar(DTYPE_F32));
        check_calls("dequantize", 1, &batch[k], 0, false);
    }
    check_calls("dequantize", N_SIZES, batch, 0, false);
    for (int l = 0; l < N_LAYOUTS; l++) {
        batch[l] =
            dq_spec(layouts[l].shape, layouts[l].params, vec(DTYPE_F32, layouts[l].channels));
        check_calls("dequantize", 1, &batch[l], 0, false);
    }
    check_calls("dequantize", N_LAYOUTS, batch, 0, false);
}
END_TEST

int main(void)
{
    /* Check's forked children cannot use a CUDA context made by their parent, so the tests run
     * in this process, on one context. */
    ctx = gpu_ctx_new();
    /* GJ_TEST_SEED replays a failed run. */
    const char *seed_env = getenv("GJ_TEST_SEED");
    base_seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : (unsigned)time(NULL);
    run_seed = base_seed;
    printf("test_gpu_elementwise: seed %u (GJ_TEST_SEED=%u replays it)\n", base_seed, base_seed);
    Suite *s = suite_create("gpu_elementwise");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_elementwise_matches_cpu_in_every_dtype_and_size);
    tcase_add_test(tc, test_elementwise_unaligned_tensors_match_cpu_single_and_batched);
    tcase_add_test(tc, test_elementwise_batch_of_mixed_sizes_matches_cpu);
    tcase_add_test(tc, test_sum_and_dot_match_cpu_and_repeat_bit_identically);
    tcase_add_test(tc, test_sum_and_dot_batch_of_mixed_sizes_matches_cpu);
    tcase_add_test(tc, test_sum_in_a_batch_gives_the_same_bits_as_alone);
    tcase_add_test(tc, test_quantize_matches_cpu_exactly);
    tcase_add_test(tc, test_quantize_batch_of_mixed_sizes_matches_cpu);
    tcase_add_test(tc, test_dequantize_matches_cpu_exactly_single_and_batched);
    tcase_add_test(tc, test_quantize_and_dequantize_unaligned_tensors_match_cpu);
    suite_add_tcase(s, tc);
    int status = run_suite_nofork(s);
    gpu_ctx_free(ctx);
    return status;
}
