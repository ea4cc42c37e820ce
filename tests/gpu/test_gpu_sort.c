/* The sort op on CUDA against the CPU reference, bit for bit: every key dtype, both
 * directions, argsort and values of every size, rows that take each of the CUDA paths (one
 * radix sort, segmented sort, row-tagged radix sort, one sort per long row), and batches of
 * calls of different sizes in one run_cuda. Outputs are poisoned before every run. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/sort.h"
#include "support/gpu_support.h"
#include "support/run_suite.h"

static op_cuda_ctx_t *ctx;
static unsigned seed;

static tensor_desc_t desc(dtype_t dt, int ndim, const int64_t *shape)
{
    tensor_desc_t d = {.dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++)
        d.shape[i] = shape[i];
    return d;
}

static uint32_t f32_bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static uint32_t rand32(void)
{
    return (uint32_t)rand_r(&seed) << 16 ^ (uint32_t)rand_r(&seed);
}

/* Random keys: full-range bits, with runs of ties and, for f32 and f64, NaNs, infinities and
 * zeros of both signs. */
static void fill_keys(dtype_t dt, void *keys, int64_t n)
{
    bool ties = rand_r(&seed) & 1;
    for (int64_t i = 0; i < n; i++) {
        uint32_t r = ties ? rand32() % 64 : rand32();
        switch (dt) {
        case DTYPE_F32: {
            static const uint32_t special[6] = {0x7fc00000u, 0xffc00001u, 0x80000000u,
                                                0x00000000u, 0x7f800000u, 0xff800000u};
            uint32_t bits = rand32() % 8 == 0 ? special[rand32() % 6] : r;
            if (ties && rand32() % 8) bits = f32_bits_of((float)((int)r - 32) / 8);
            memcpy((char *)keys + 4 * i, &bits, 4);
            break;
        }
        case DTYPE_F64: {
            /* Full-range bits (NaNs among them), the special values, and ties. */
            static const uint64_t special[8] = {0x7ff8000000000000ull, 0xfff8000000000001ull,
                                                0x7ff0000000000001ull, 0x8000000000000000ull,
                                                0x0000000000000000ull, 0x7ff0000000000000ull,
                                                0xfff0000000000000ull, 0x0000000000000001ull};
            uint64_t bits =
                rand32() % 8 == 0 ? special[rand32() % 8] : (uint64_t)rand32() << 32 | rand32();
            if (ties && rand32() % 8) {
                double f = (double)((int)r - 32) / 8;
                memcpy(&bits, &f, 8);
            }
            ((uint64_t *)keys)[i] = bits;
            break;
        }
        case DTYPE_I64:
            ((uint64_t *)keys)[i] =
                ties ? (uint64_t)(int64_t)((int)r - 32) << 40 : (uint64_t)rand32() << 32 | rand32();
            break;
        default:
            ((uint32_t *)keys)[i] = ties && dt == DTYPE_I32 ? (uint32_t)((int)r - 32) : r;
            break;
        }
    }
}

/* One call of a batch: its validated call, host inputs and the CPU reference's outputs. */
typedef struct sort_job {
    op_call_t call;
    void *host_in[2], *want[2], *got[2];
    void *dev_in[2], *dev_out[2];
} sort_job_t;

static void job_prepare(sort_job_t *job, const tensor_desc_t *keys, dtype_t value_dtype,
                        bool with_values, const char *params_json)
{
    memset(job, 0, sizeof *job);
    op_call_t *call = &job->call;
    call->op = op_find("sort");
    ck_assert_ptr_eq(call->op, &op_sort); /* registered in the table */
    call->in[0] = *keys;
    call->has_in[0] = true;
    if (with_values) {
        call->in[1] = *keys;
        call->in[1].dtype = value_dtype;
        call->has_in[1] = true;
    }
    json_error_t jerr;
    json_t *params = params_json ? json_loads(params_json, 0, &jerr) : NULL;
    op_error_t err;
    ck_assert_msg(call->op->validate(params, call, &err) == 0, "%s: %s", err.field, err.message);
    json_decref(params);
    for (int j = 0; j < 2; j++) {
        if (!call->has_in[j]) continue;
        size_t bytes = tensor_desc_bytes(&call->in[j]);
        job->host_in[j] = malloc(bytes ? bytes : 1);
        if (j == 0)
            fill_keys(keys->dtype, job->host_in[0], tensor_desc_numel(keys));
        else
            fill_random(value_dtype, job->host_in[1], tensor_desc_numel(keys), -100, 100, &seed);
        job->dev_in[j] = gpu_alloc_poisoned(bytes);
        gpu_upload(job->dev_in[j], job->host_in[j], bytes);
    }
    for (int j = 0; j < call->n_out; j++) {
        size_t bytes = tensor_desc_bytes(&call->out[j]);
        job->want[j] = malloc(bytes ? bytes : 1);
        job->got[j] = malloc(bytes ? bytes : 1);
        job->dev_out[j] = gpu_alloc_poisoned(bytes);
    }
    ck_assert_int_eq(call->op->run_cpu(call, (const void *const *)job->host_in, job->want, &err),
                     0);
}

/* Runs the n jobs as one run_cuda and checks every output equals the CPU's, bit for bit. */
static void jobs_run_and_check(sort_job_t *jobs, int n, const char *what)
{
    const op_call_t **calls = calloc((size_t)n, sizeof *calls);
    const void *const **ins = calloc((size_t)n, sizeof *ins);
    void *const **outs = calloc((size_t)n, sizeof *outs);
    for (int i = 0; i < n; i++) {
        calls[i] = &jobs[i].call;
        ins[i] = (const void *const *)jobs[i].dev_in;
        outs[i] = jobs[i].dev_out;
    }
    op_error_t err;
    int r = calls[0]->op->run_cuda(ctx, n, calls, ins, outs, &err);
    ck_assert_msg(r == 0, "%s: run_cuda: %s", what, err.message);
    gpu_sync(ctx);
    for (int i = 0; i < n; i++) {
        const op_call_t *call = &jobs[i].call;
        for (int j = 0; j < call->n_out; j++) {
            size_t bytes = tensor_desc_bytes(&call->out[j]);
            gpu_download(jobs[i].got[j], jobs[i].dev_out[j], bytes);
            if (memcmp(jobs[i].got[j], jobs[i].want[j], bytes) == 0) continue;
            size_t es = dtype_size(call->out[j].dtype), at = 0;
            while (memcmp((char *)jobs[i].got[j] + at * es, (char *)jobs[i].want[j] + at * es,
                          es) == 0)
                at++;
            char shape[96];
            ck_abort_msg("%s: call %d %s %s output %s differs first at element %zu (%g vs %g)",
                         what, i, dtype_name(call->in[0].dtype),
                         tensor_shape_str(&call->in[0], shape, sizeof shape), call->out_names[j],
                         at, tensor_load(call->out[j].dtype, jobs[i].got[j], (int64_t)at),
                         tensor_load(call->out[j].dtype, jobs[i].want[j], (int64_t)at));
        }
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 2; j++) {
            free(jobs[i].host_in[j]);
            free(jobs[i].want[j]);
            free(jobs[i].got[j]);
            gpu_free(jobs[i].dev_in[j]);
            gpu_free(jobs[i].dev_out[j]);
        }
    free(calls);
    free(ins);
    free(outs);
}

static const dtype_t key_dtypes[5] = {DTYPE_U32, DTYPE_I32, DTYPE_F32, DTYPE_I64, DTYPE_F64};
#define N_KEY_DTYPES (int)(sizeof key_dtypes / sizeof key_dtypes[0])
static const char *const flavours[4] = {NULL, "{\"descending\": true}", "{\"argsort\": true}",
                                        "{\"argsort\": true, \"descending\": true}"};

START_TEST(test_gpu_sort_one_row_matches_cpu_at_odd_sizes)
{
    const int64_t sizes[5] = {1, 7, 1000, 4097, (1 << 20) + 3};
    for (int t = 0; t < N_KEY_DTYPES; t++)
        for (int s = 0; s < 5; s++)
            for (int f = 0; f < 4; f++) {
                tensor_desc_t k = desc(key_dtypes[t], 1, &sizes[s]);
                sort_job_t job;
                job_prepare(&job, &k, DTYPE_F32, false, flavours[f]);
                char what[128];
                snprintf(what, sizeof what, "one row of %lld, %s", (long long)sizes[s],
                         flavours[f] ? flavours[f] : "ascending");
                jobs_run_and_check(&job, 1, what);
            }
}
END_TEST

/* Shapes chosen to take each multi-row path: short rows (segmented sort), rows over 4096
 * (row-tagged radix sort for 32-bit keys, segmented for i64) and a few rows over 2^20 (one
 * radix sort per row). */
START_TEST(test_gpu_sort_rows_match_cpu_on_every_path)
{
    const int64_t shapes[4][2] = {{1000, 7}, {64, 1000}, {33, 4097}, {3, (1 << 20) + 3}};
    for (int t = 0; t < N_KEY_DTYPES; t++)
        for (int s = 0; s < 4; s++)
            for (int f = 0; f < 4; f++) {
                tensor_desc_t k = desc(key_dtypes[t], 2, shapes[s]);
                sort_job_t job;
                job_prepare(&job, &k, DTYPE_F32, false, flavours[f]);
                char what[128];
                snprintf(what, sizeof what, "rows %lldx%lld, %s", (long long)shapes[s][0],
                         (long long)shapes[s][1], flavours[f] ? flavours[f] : "ascending");
                jobs_run_and_check(&job, 1, what);
            }
}
END_TEST

START_TEST(test_gpu_sort_values_of_every_size_follow_keys)
{
    const dtype_t vdts[5] = {DTYPE_U32, DTYPE_F64, DTYPE_F32, DTYPE_BF16, DTYPE_I8};
    const int64_t shapes[3][2] = {{1, 4097}, {100, 37}, {5, 9000}};
    for (int t = 0; t < N_KEY_DTYPES; t++)
        for (int v = 0; v < 5; v++)
            for (int s = 0; s < 3; s++) {
                tensor_desc_t k = desc(key_dtypes[t], 2, shapes[s]);
                sort_job_t job;
                job_prepare(&job, &k, vdts[v], true, (s & 1) ? "{\"descending\": true}" : NULL);
                char what[128];
                snprintf(what, sizeof what, "values %s", dtype_name(vdts[v]));
                jobs_run_and_check(&job, 1, what);
            }
}
END_TEST

/* n calls of different shapes (one of them empty) in one run_cuda, for each path. */
START_TEST(test_gpu_sort_batched_calls_of_different_sizes_match_cpu)
{
    const int64_t small[5][2] = {{3, 5}, {1, 1}, {0, 4}, {17, 100}, {1, 4096}};
    const int64_t mixed[4][2] = {{1, 5000}, {2, 7}, {4, 70000}, {1, 1}};
    const int64_t large[3][2] = {{1, (1 << 20) + 3}, {1, 1 << 20}, {2, (1 << 20) + 1}};
    const struct {
        const int64_t (*shapes)[2];
        int n;
    } groups[3] = {{small, 5}, {mixed, 4}, {large, 3}};
    for (int t = 0; t < N_KEY_DTYPES; t++)
        for (int g = 0; g < 3; g++)
            for (int f = 0; f < 6; f++) {
                /* Flavours 4 and 5 carry values: 4-byte ones directly, 2-byte ones gathered. */
                sort_job_t jobs[5];
                for (int i = 0; i < groups[g].n; i++) {
                    tensor_desc_t k = desc(key_dtypes[t], 2, groups[g].shapes[i]);
                    job_prepare(&jobs[i], &k, f == 4 ? DTYPE_I32 : DTYPE_F16, f >= 4,
                                f < 4 ? flavours[f] : (f == 5 ? "{\"descending\": true}" : NULL));
                }
                char what[128];
                snprintf(what, sizeof what, "batch %d of %d calls, flavour %d, %s", g, groups[g].n,
                         f, dtype_name(key_dtypes[t]));
                jobs_run_and_check(jobs, groups[g].n, what);
            }
}
END_TEST

START_TEST(test_gpu_sort_scalar_and_empty_keys)
{
    tensor_desc_t scalar = desc(DTYPE_F32, 0, NULL);
    tensor_desc_t empty = desc(DTYPE_I64, 2, (int64_t[]){5, 0});
    sort_job_t jobs[2];
    job_prepare(&jobs[0], &scalar, DTYPE_F32, false, "{\"argsort\": true}");
    job_prepare(&jobs[1], &empty, DTYPE_F32, false, "{\"argsort\": true}");
    jobs_run_and_check(&jobs[0], 1, "scalar");
    jobs_run_and_check(&jobs[1], 1, "empty");
}
END_TEST

int main(void)
{
    ctx = gpu_ctx_new(); /* exits 77 without a GPU */
    seed = (unsigned)time(NULL);
    printf("test_gpu_sort: seed %u\n", seed);
    Suite *s = suite_create("gpu_sort");
    TCase *tc = tcase_create("sort");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_gpu_sort_one_row_matches_cpu_at_odd_sizes);
    tcase_add_test(tc, test_gpu_sort_rows_match_cpu_on_every_path);
    tcase_add_test(tc, test_gpu_sort_values_of_every_size_follow_keys);
    tcase_add_test(tc, test_gpu_sort_batched_calls_of_different_sizes_match_cpu);
    tcase_add_test(tc, test_gpu_sort_scalar_and_empty_keys);
    suite_add_tcase(s, tc);
    int status = run_suite_nofork(s);
    gpu_ctx_free(ctx);
    return status;
}
