/* The gemm op on CUDA against the CPU reference on fresh random inputs: every dtype (f32, tf32,
 * f16, bf16, f64, i8 -> i32) at sizes that are not multiples of any tile, every transpose, beta
 * with c, leading dims (batched, b shared, a shared), k = 0, and n calls in one run_cuda
 * (pointer-array form, and one by one for big calls), i8 through its transposed copies at
 * partial tiles, and large calls run twice (the second from the algorithm cache). Outputs are
 * poisoned before every run.
 * Bounds on the relative norm error: f32 1e-5, tf32 1e-3, f16/bf16 1e-2, f64 1e-12, i8 exact
 * (test_gpu_f64.c holds f64 to gemm.h's bound element by element). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/gemm.h"
#include "support/gpu_support.h"
#include "support/run_suite.h"

static op_cuda_ctx_t *ctx;
static unsigned seed;

typedef struct gemm_kind {
    const char *name;
    dtype_t dtype;
    const char *params; /* added to every call's params */
    double tolerance;   /* 0: exact */
} gemm_kind_t;

static const gemm_kind_t kinds[6] = {
    {"f32", DTYPE_F32, "\"tf32\": false", 1e-5}, {"tf32", DTYPE_F32, "\"tf32\": true", 1e-3},
    {"f16", DTYPE_F16, "\"tf32\": false", 1e-2}, {"bf16", DTYPE_BF16, "\"tf32\": false", 1e-2},
    {"i8", DTYPE_I8, "\"tf32\": false", 0},      {"f64", DTYPE_F64, "\"tf32\": false", 1e-12},
};
#define N_KINDS (int)(sizeof kinds / sizeof kinds[0])

typedef struct gemm_job {
    op_call_t call;
    void *host_in[3], *want, *got;
    void *dev_in[3], *dev_out;
} gemm_job_t;

/* Shapes of a and b from m, n, k, the transposes and the leading dims of each; random inputs
 * on the host and the device, and a poisoned device output. No reference yet. */
static void gemm_job_inputs(gemm_job_t *job, const gemm_kind_t *kind, int64_t m, int64_t n,
                            int64_t k, bool ta, bool tb, int lead_a, int lead_b, bool with_c,
                            double alpha, double beta)
{
    memset(job, 0, sizeof *job);
    op_call_t *call = &job->call;
    call->op = op_find("gemm");
    ck_assert_ptr_eq(call->op, &op_gemm); /* registered in the table */
    const int64_t lead_dims[2] = {2, 3};
    tensor_desc_t *a = &call->in[0], *b = &call->in[1], *c = &call->in[2];
    a->dtype = b->dtype = kind->dtype;
    a->ndim = lead_a + 2;
    b->ndim = lead_b + 2;
    for (int i = 0; i < 2; i++)
        a->shape[i] = b->shape[i] = c->shape[i] = lead_dims[i];
    a->shape[lead_a] = ta ? k : m;
    a->shape[lead_a + 1] = ta ? m : k;
    b->shape[lead_b] = tb ? n : k;
    b->shape[lead_b + 1] = tb ? k : n;
    int lead_c = lead_a > lead_b ? lead_a : lead_b;
    c->dtype = kind->dtype == DTYPE_I8 ? DTYPE_I32 : kind->dtype;
    c->ndim = lead_c + 2;
    c->shape[lead_c] = m;
    c->shape[lead_c + 1] = n;
    call->has_in[0] = call->has_in[1] = true;
    call->has_in[2] = with_c;
    char params_json[256];
    snprintf(params_json, sizeof params_json,
             "{\"trans_a\": %s, \"trans_b\": %s, \"alpha\": %.17g, \"beta\": %.17g, %s}",
             ta ? "true" : "false", tb ? "true" : "false", alpha, beta, kind->params);
    json_error_t jerr;
    json_t *params = json_loads(params_json, 0, &jerr);
    ck_assert_ptr_nonnull(params);
    op_error_t err;
    ck_assert_msg(call->op->validate(params, call, &err) == 0, "%s: %s", err.field, err.message);
    json_decref(params);
    for (int j = 0; j < 3; j++) {
        if (!call->has_in[j]) continue;
        size_t bytes = tensor_desc_bytes(&call->in[j]);
        job->host_in[j] = malloc(bytes ? bytes : 1);
        /* i8 over its whole range; i32 c large enough to matter next to the products. */
        double range = dtype_is_float(call->in[j].dtype) ? 1 : (j < 2 ? 127 : 1000);
        fill_random(call->in[j].dtype, job->host_in[j], tensor_desc_numel(&call->in[j]), -range,
                    range, &seed);
        job->dev_in[j] = gpu_alloc_poisoned(bytes);
        gpu_upload(job->dev_in[j], job->host_in[j], bytes);
    }
    size_t out_bytes = tensor_desc_bytes(&call->out[0]);
    job->want = malloc(out_bytes ? out_bytes : 1);
    job->got = malloc(out_bytes ? out_bytes : 1);
    job->dev_out = gpu_alloc_poisoned(out_bytes);
}

/* gemm_job_inputs, and the CPU reference of the whole output in job->want. */
static void gemm_job_prepare(gemm_job_t *job, const gemm_kind_t *kind, int64_t m, int64_t n,
                             int64_t k, bool ta, bool tb, int lead_a, int lead_b, bool with_c,
                             double alpha, double beta)
{
    gemm_job_inputs(job, kind, m, n, k, ta, tb, lead_a, lead_b, with_c, alpha, beta);
    op_error_t err;
    ck_assert_int_eq(job->call.op->run_cpu(&job->call, (const void *const *)job->host_in,
                                           (void *const *)&job->want, &err),
                     0);
}

/* Runs n jobs in one run_cuda and checks each against the CPU reference. */
static void gemm_jobs_check(gemm_job_t *jobs, int n, const gemm_kind_t *kind, const char *what)
{
    const op_call_t **calls = calloc((size_t)n, sizeof *calls);
    const void *const **ins = calloc((size_t)n, sizeof *ins);
    void *const **outs = calloc((size_t)n, sizeof *outs);
    for (int i = 0; i < n; i++) {
        calls[i] = &jobs[i].call;
        ins[i] = (const void *const *)jobs[i].dev_in;
        outs[i] = &jobs[i].dev_out;
        ck_assert_str_eq(calls[i]->batch_key, calls[0]->batch_key);
    }
    op_error_t err;
    int r = calls[0]->op->run_cuda(ctx, n, calls, ins, outs, &err);
    ck_assert_msg(r == 0, "%s %s: run_cuda: %s", kind->name, what, err.message);
    gpu_sync(ctx);
    for (int i = 0; i < n; i++) {
        const tensor_desc_t *o = &jobs[i].call.out[0];
        size_t bytes = tensor_desc_bytes(o);
        gpu_download(jobs[i].got, jobs[i].dev_out, bytes);
        if (kind->tolerance == 0) {
            for (int64_t e = 0; e < tensor_desc_numel(o); e++)
                ck_assert_msg(
                    tensor_load(o->dtype, jobs[i].got, e) == tensor_load(o->dtype, jobs[i].want, e),
                    "%s %s call %d: element %lld: %g != %g", kind->name, what, i, (long long)e,
                    tensor_load(o->dtype, jobs[i].got, e), tensor_load(o->dtype, jobs[i].want, e));
        } else {
            double rel = rel_norm_error(o->dtype, jobs[i].got, jobs[i].want, tensor_desc_numel(o));
            ck_assert_msg(rel < kind->tolerance, "%s %s call %d: relative error %g >= %g",
                          kind->name, what, i, rel, kind->tolerance);
        }
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 3; j++) {
            free(jobs[i].host_in[j]);
            gpu_free(jobs[i].dev_in[j]);
        }
        free(jobs[i].want);
        free(jobs[i].got);
        gpu_free(jobs[i].dev_out);
    }
    free(calls);
    free(ins);
    free(outs);
}

static const int64_t sizes[5] = {1, 17, 64, 129, 512};

START_TEST(test_gpu_gemm_every_dtype_matches_cpu_at_odd_sizes)
{
    for (int t = 0; t < N_KINDS; t++)
        for (int im = 0; im < 5; im++)
            for (int in = 0; in < 5; in++)
                for (int ik = 0; ik < 5; ik++) {
                    gemm_job_t job;
                    gemm_job_prepare(&job, &kinds[t], sizes[im], sizes[in], sizes[ik], false, false,
                                     0, 0, false, 1, 0);
                    char what[64];
                    snprintf(what, sizeof what, "m=%lld n=%lld k=%lld", (long long)sizes[im],
                             (long long)sizes[in], (long long)sizes[ik]);
                    gemm_jobs_check(&job, 1, &kinds[t], what);
                }
}
END_TEST

START_TEST(test_gpu_gemm_transposes_with_alpha_beta_and_c)
{
    const int64_t shapes[3][3] = {{129, 64, 17}, {64, 128, 512}, {17, 1, 129}};
    for (int t = 0; t < N_KINDS; t++)
        for (int s = 0; s < 3; s++)
            for (int tr = 0; tr < 4; tr++)
                for (int with_c = 0; with_c < 2; with_c++) {
                    gemm_job_t job;
                    double alpha = kinds[t].dtype == DTYPE_I8 ? -3 : 0.75;
                    gemm_job_prepare(&job, &kinds[t], shapes[s][0], shapes[s][1], shapes[s][2],
                                     tr & 1, tr & 2, 0, 0, with_c, alpha, with_c ? 2 : 0);
                    char what[96];
                    snprintf(what, sizeof what, "shape %d trans_a=%d trans_b=%d c=%d", s, tr & 1,
                             (tr & 2) != 0, with_c);
                    gemm_jobs_check(&job, 1, &kinds[t], what);
                }
}
END_TEST

/* Leading dims on both sides (strided batch), on a only (b shared: one taller GEMM unless a is
 * transposed), on b only (a shared: batch stride 0). */
START_TEST(test_gpu_gemm_leading_dims_batched_and_shared)
{
    const int lead[3][2] = {{2, 2}, {2, 0}, {0, 2}};
    for (int t = 0; t < N_KINDS; t++)
        for (int l = 0; l < 3; l++)
            for (int tr = 0; tr < 4; tr++) {
                gemm_job_t job;
                gemm_job_prepare(&job, &kinds[t], 33, 64, 20, tr & 1, tr & 2, lead[l][0],
                                 lead[l][1], tr == 3, 1, tr == 3 ? -1 : 0);
                char what[96];
                snprintf(what, sizeof what, "lead a=%d b=%d trans %d", lead[l][0], lead[l][1], tr);
                gemm_jobs_check(&job, 1, &kinds[t], what);
            }
}
END_TEST

START_TEST(test_gpu_gemm_k_zero_and_empty_outputs)
{
    for (int t = 0; t < N_KINDS; t++) {
        gemm_job_t job;
        gemm_job_prepare(&job, &kinds[t], 17, 5, 0, false, false, 0, 0, true, 1, 2);
        gemm_jobs_check(&job, 1, &kinds[t], "k=0 with c");
        gemm_job_prepare(&job, &kinds[t], 0, 5, 3, false, false, 0, 0, false, 1, 0);
        gemm_jobs_check(&job, 1, &kinds[t], "m=0");
    }
}
END_TEST

/* n calls of one shape in one run_cuda: the pointer-array form, with leading dims inside each
 * call and c, and big calls that go one by one. */
START_TEST(test_gpu_gemm_batched_calls_in_one_run_match_cpu)
{
    const struct {
        int64_t m, n, k;
        bool ta, tb, with_c;
        int lead_a, lead_b, calls;
    } cases[4] = {
        {64, 64, 64, false, false, false, 0, 0, 7},
        {17, 129, 33, true, false, true, 0, 0, 5},
        {20, 12, 8, false, true, true, 2, 0, 3},
        {1024, 1024, 1024, false, false, false, 0, 0, 2}, /* 2^30 each: one by one */
    };
    for (int t = 0; t < N_KINDS; t++)
        for (int s = 0; s < 4; s++) {
            if (s == 3 && kinds[t].dtype != DTYPE_BF16) continue; /* CPU time */
            gemm_job_t jobs[7];
            for (int i = 0; i < cases[s].calls; i++)
                gemm_job_prepare(&jobs[i], &kinds[t], cases[s].m, cases[s].n, cases[s].k,
                                 cases[s].ta, cases[s].tb, cases[s].lead_a, cases[s].lead_b,
                                 cases[s].with_c, kinds[t].dtype == DTYPE_I8 ? 2 : 1.25,
                                 cases[s].with_c ? -1 : 0);
            char what[64];
            snprintf(what, sizeof what, "%d calls of case %d", cases[s].calls, s);
            gemm_jobs_check(jobs, cases[s].calls, &kinds[t], what);
        }
}
END_TEST

/* i8 runs on cuBLASLt's tensor cores only in the TN layout, so every other layout is copied
 * transposed first: here with k and n (and m, for a transposed a) multiples of 4 but not of the
 * copy's 64-byte tiles, so that partial tiles are copied, single and with leading dims. */
START_TEST(test_gpu_gemm_i8_transposed_copies_at_partial_tiles_match_cpu)
{
    const gemm_kind_t *i8 = &kinds[4];
    const int lead[3][2] = {{0, 0}, {2, 2}, {2, 0}};
    for (int l = 0; l < 3; l++)
        for (int tr = 0; tr < 4; tr++) {
            gemm_job_t job;
            gemm_job_prepare(&job, i8, 100, 196, 68, tr & 1, tr & 2, lead[l][0], lead[l][1],
                             tr == 1, -2, tr == 1 ? 3 : 0);
            char what[96];
            snprintf(what, sizeof what, "100x196x68 lead a=%d b=%d trans %d", lead[l][0],
                     lead[l][1], tr);
            gemm_jobs_check(&job, 1, i8, what);
        }
}
END_TEST

/* Checks `samples` entries of job's output (downloaded into job->got) against alpha a.b + beta
 * c in double, by the relative norm error over the samples (i8: exactly). */
static void gemm_check_samples(const gemm_job_t *job, const gemm_kind_t *kind, int samples,
                               const char *what)
{
    const gemm_params_t *p = OP_PARAMS(&job->call, const gemm_params_t);
    const tensor_desc_t *o = &job->call.out[0];
    double err2 = 0, ref2 = 0;
    for (int t = 0; t < samples; t++) {
        /* The corners, then random entries. */
        int64_t i = t < 4 ? (t & 1) * (p->m - 1) : rand_r(&seed) % p->m;
        int64_t j = t < 4 ? (t >> 1) * (p->n - 1) : rand_r(&seed) % p->n;
        double ref = 0;
        for (int64_t q = 0; q < p->k; q++)
            ref += tensor_load(p->dtype, job->host_in[0], i * p->k + q) *
                   tensor_load(p->dtype, job->host_in[1], q * p->n + j);
        ref = p->alpha * ref + p->beta * tensor_load(o->dtype, job->host_in[2], i * p->n + j);
        double got = tensor_load(o->dtype, job->got, i * p->n + j);
        if (kind->tolerance == 0)
            ck_assert_msg(got == ref, "%s %s: out[%lld, %lld] = %g, want %g", kind->name, what,
                          (long long)i, (long long)j, got, ref);
        err2 += (got - ref) * (got - ref);
        ref2 += ref * ref;
    }
    double rel = sqrt(err2) / fmax(sqrt(ref2), 1e-30);
    ck_assert_msg(kind->tolerance == 0 || rel < kind->tolerance,
                  "%s %s: relative error %g >= %g over %d samples", kind->name, what, rel,
                  kind->tolerance, samples);
}

/* 2048 x 2048 x 1024 in every dtype: the first run asks the heuristic, the second takes the
 * cached choice, and both must match; c (with beta) must come out of both untouched. Checked
 * on sampled entries: the full CPU reference would take minutes. */
START_TEST(test_gpu_gemm_large_call_matches_cpu_on_samples_twice)
{
    for (int t = 0; t < N_KINDS; t++) {
        gemm_job_t job;
        bool ints = kinds[t].dtype == DTYPE_I8;
        gemm_job_inputs(&job, &kinds[t], 2048, 2048, 1024, false, false, 0, 0, true,
                        ints ? 3 : 1.25, ints ? -2 : -0.5);
        const op_call_t *calls[1] = {&job.call};
        const void *const *ins[1] = {(const void *const *)job.dev_in};
        void *const *outs[1] = {&job.dev_out};
        const tensor_desc_t *o = &job.call.out[0];
        size_t out_bytes = tensor_desc_bytes(o), c_bytes = tensor_desc_bytes(&job.call.in[2]);
        void *c_after = malloc(c_bytes);
        for (int run = 0; run < 2; run++) {
            op_error_t err;
            int r = job.call.op->run_cuda(ctx, 1, calls, ins, outs, &err);
            ck_assert_msg(r == 0, "%s run %d: run_cuda: %s", kinds[t].name, run, err.message);
            gpu_sync(ctx);
            gpu_download(job.got, job.dev_out, out_bytes);
            gemm_check_samples(&job, &kinds[t], 1000, run == 0 ? "tuning run" : "cached run");
            gpu_download(c_after, job.dev_in[2], c_bytes);
            ck_assert_msg(memcmp(c_after, job.host_in[2], c_bytes) == 0, "%s run %d: c changed",
                          kinds[t].name, run);
            gpu_free(job.dev_out);
            job.dev_out = gpu_alloc_poisoned(out_bytes);
        }
        free(c_after);
        for (int j = 0; j < 3; j++) {
            free(job.host_in[j]);
            gpu_free(job.dev_in[j]);
        }
        free(job.want);
        free(job.got);
        gpu_free(job.dev_out);
    }
}
END_TEST

int main(void)
{
    ctx = gpu_ctx_new(); /* exits 77 without a GPU */
    seed = (unsigned)time(NULL);
    printf("test_gpu_gemm: seed %u\n", seed);
    Suite *s = suite_create("gpu_gemm");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_gpu_gemm_every_dtype_matches_cpu_at_odd_sizes);
    tcase_add_test(tc, test_gpu_gemm_transposes_with_alpha_beta_and_c);
    tcase_add_test(tc, test_gpu_gemm_leading_dims_batched_and_shared);
    tcase_add_test(tc, test_gpu_gemm_k_zero_and_empty_outputs);
    tcase_add_test(tc, test_gpu_gemm_batched_calls_in_one_run_match_cpu);
    tcase_add_test(tc, test_gpu_gemm_i8_transposed_copies_at_partial_tiles_match_cpu);
    tcase_add_test(tc, test_gpu_gemm_large_call_matches_cpu_on_samples_twice);
    suite_add_tcase(s, tc);
    int status = run_suite_nofork(s);
    gpu_ctx_free(ctx);
    return status;
}
