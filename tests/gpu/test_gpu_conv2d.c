/* conv2d on CUDA against the CPU reference: fresh random inputs, outputs poisoned first, every
 * dtype, shapes that take the implicit GEMM and the direct kernel, every epilogue combination
 * and the batched form. Relative norm error: f32 < 1e-5, f16 / bf16 < 1e-2. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/conv2d.h"
#include "support/gpu_support.h"
#include "support/run_suite.h"

static op_cuda_ctx_t *ctx;

typedef struct conv_gpu_shape {
    const char *name;
    int n, c, h, w, k, r, s, groups;
    int sh, sw, ph, pw, dh, dw;
} conv_gpu_shape_t;

/* The comment after each says which CUDA path it takes (GEMM: groups' channels Cg >= 8 and
 * Kg >= 16; else the direct kernel). */
static const conv_gpu_shape_t shapes[] = {
    {"odd_3x3_rgb", 1, 3, 7, 7, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1},                /* direct */
    {"1x1", 2, 16, 13, 11, 24, 1, 1, 1, 1, 1, 0, 0, 1, 1},                    /* GEMM narrow */
    {"3x3", 2, 32, 15, 15, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1},                    /* GEMM narrow */
    {"5x5_padded_channels", 1, 20, 17, 19, 40, 5, 5, 1, 1, 1, 2, 2, 1, 1},    /* GEMM, Cg % 8 */
    {"stride2", 2, 32, 16, 16, 64, 3, 3, 1, 2, 2, 1, 1, 1, 1},                /* GEMM */
    {"dilation2", 1, 16, 20, 20, 32, 3, 3, 1, 1, 1, 2, 2, 2, 2},              /* GEMM */
    {"groups2", 2, 64, 9, 9, 64, 3, 3, 2, 1, 1, 1, 1, 1, 1},                  /* GEMM per group */
    {"groups4_narrow", 1, 8, 6, 6, 8, 3, 3, 4, 1, 1, 1, 1, 1, 1},             /* direct */
    {"depthwise", 2, 32, 12, 12, 32, 3, 3, 32, 1, 1, 1, 1, 1, 1},             /* direct */
    {"depthwise_5x5_stride2", 1, 24, 11, 11, 24, 5, 5, 24, 2, 2, 2, 2, 1, 1}, /* direct */
    {"n8", 8, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1},                     /* GEMM */
    {"asymmetric_k130", 1, 40, 13, 21, 130, 3, 2, 1, 2, 1, 0, 2, 1, 2},  /* GEMM wide, K % 128 */
    {"resnet_256", 2, 256, 14, 14, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1},      /* GEMM wide */
    {"images_cross_tiles", 3, 8, 33, 35, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1}, /* GEMM narrow */
    {"rect_3x1", 1, 12, 10, 9, 20, 3, 1, 1, 1, 1, 1, 0, 1, 1},           /* GEMM, Cg % 8 */
};

static const conv_gpu_shape_t *shape_named(const char *name)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, name) == 0) return &shapes[i];
    ck_abort_msg("no shape %s", name);
    return NULL;
}

static double bound_of(dtype_t dt)
{
    return dt == DTYPE_F32 ? 1e-5 : 1e-2;
}

/* Host and device copies of one call's tensors. */
typedef struct conv_gpu_call {
    op_call_t call;
    void *host_in[CONV2D_N_INPUTS];
    void *dev_in[CONV2D_N_INPUTS];
    void *host_ref, *dev_out;
} conv_gpu_call_t;

static void params_json(const conv_gpu_shape_t *t, unsigned epi, char *buf, size_t size)
{
    int len = snprintf(buf, size,
                       "{\"stride\": [%d, %d], \"padding\": [%d, %d], \"dilation\": [%d, %d], "
                       "\"groups\": %d, \"eps\": 1e-3, \"epilogue\": [",
                       t->sh, t->sw, t->ph, t->pw, t->dh, t->dw, t->groups);
    const char *names[3] = {"bias", "batchnorm", "relu"};
    bool first = true;
    for (int i = 0; i < 3; i++)
        if (epi & (1u << i)) {
            len += snprintf(buf + len, size - len, "%s\"%s\"", first ? "" : ", ", names[i]);
            first = false;
        }
    snprintf(buf + len, size - len, "]}");
}

/* Builds one call with fresh random inputs, its CPU reference result, device copies of the
 * inputs and a poisoned device output. The epilogue vectors alternate between f32 and x's
 * dtype so that both are exercised. */
static void call_setup(conv_gpu_call_t *g, const conv_gpu_shape_t *t, dtype_t dt, unsigned epi,
                       unsigned *seed)
{
    memset(g, 0, sizeof *g);
    op_call_t *call = &g->call;
    call->op = &op_conv2d;
    call->in[CONV2D_IN_X] = (tensor_desc_t){dt, 4, {t->n, t->c, t->h, t->w}};
    call->in[CONV2D_IN_W] = (tensor_desc_t){dt, 4, {t->k, t->c / t->groups, t->r, t->s}};
    call->has_in[CONV2D_IN_X] = call->has_in[CONV2D_IN_W] = true;
    for (int j = CONV2D_IN_BIAS; j < CONV2D_N_INPUTS; j++) {
        bool needed = j == CONV2D_IN_BIAS ? (epi & CONV2D_EPI_BIAS) : (epi & CONV2D_EPI_BATCHNORM);
        if (!needed) continue;
        call->in[j] = (tensor_desc_t){j % 2 ? DTYPE_F32 : dt, 1, {t->k}};
        call->has_in[j] = true;
    }
    char params[256];
    params_json(t, epi, params, sizeof params);
    json_error_t jerr;
    json_t *pj = json_loads(params, 0, &jerr);
    op_error_t err;
    int r = op_conv2d.validate(pj, call, &err);
    json_decref(pj);
    ck_assert_msg(r == 0, "%s: validate: %s: %s", t->name, err.field, err.message);

    for (int j = 0; j < CONV2D_N_INPUTS; j++) {
        if (!call->has_in[j]) continue;
        size_t bytes = tensor_desc_bytes(&call->in[j]);
        int64_t numel = tensor_desc_numel(&call->in[j]);
        g->host_in[j] = malloc(bytes + 1);
        if (j == CONV2D_IN_BN_VAR) /* a variance is positive */
            fill_random(call->in[j].dtype, g->host_in[j], numel, 0.25, 2, seed);
        else
            fill_random(call->in[j].dtype, g->host_in[j], numel, -1, 1, seed);
        g->dev_in[j] = gpu_alloc_poisoned(bytes);
        gpu_upload(g->dev_in[j], g->host_in[j], bytes);
    }
    size_t out_bytes = tensor_desc_bytes(&call->out[0]);
    g->host_ref = malloc(out_bytes + 1);
    void *outs[1] = {g->host_ref};
    ck_assert_int_eq(op_conv2d.run_cpu(call, (const void *const *)g->host_in, outs, &err), 0);
    g->dev_out = gpu_alloc_poisoned(out_bytes);
}

/* Downloads the device result and checks it against the reference; frees everything. */
static void call_check_and_free(conv_gpu_call_t *g, const char *what)
{
    size_t out_bytes = tensor_desc_bytes(&g->call.out[0]);
    void *got = malloc(out_bytes + 1);
    gpu_download(got, g->dev_out, out_bytes);
    dtype_t dt = g->call.out[0].dtype;
    double e = rel_norm_error(dt, got, g->host_ref, tensor_desc_numel(&g->call.out[0]));
    ck_assert_msg(e < bound_of(dt), "%s: relative norm error %g (bound %g)", what, e, bound_of(dt));
    free(got);
    free(g->host_ref);
    gpu_free(g->dev_out);
    for (int j = 0; j < CONV2D_N_INPUTS; j++) {
        free(g->host_in[j]);
        gpu_free(g->dev_in[j]);
    }
}

/* Runs n calls of one shape, dtype and epilogue in one run_cuda and checks each. */
static void run_and_check(const conv_gpu_shape_t *t, dtype_t dt, unsigned epi, int n,
                          unsigned *seed)
{
    conv_gpu_call_t *g = calloc((size_t)n, sizeof *g);
    const op_call_t **calls = calloc((size_t)n, sizeof *calls);
    const void *const **ins = calloc((size_t)n, sizeof *ins);
    void *const **outs = calloc((size_t)n, sizeof *outs);
    for (int i = 0; i < n; i++) {
        call_setup(&g[i], t, dt, epi, seed);
        ck_assert_str_eq(g[i].call.batch_key, g[0].call.batch_key);
        calls[i] = &g[i].call;
        ins[i] = (const void *const *)g[i].dev_in;
        outs[i] = &g[i].dev_out;
    }
    op_error_t err;
    int r = op_conv2d.run_cuda(ctx, n, calls, ins, outs, &err);
    ck_assert_msg(r == 0, "%s: run_cuda: %s", t->name, err.message);
    gpu_sync(ctx);
    for (int i = 0; i < n; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s %s epilogue %u call %d/%d", t->name, dtype_name(dt), epi, i,
                 n);
        call_check_and_free(&g[i], what);
    }
    free(g);
    free(calls);
    free(ins);
    free(outs);
}

static const dtype_t dtypes[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};

START_TEST(test_gpu_conv2d_every_shape_and_dtype_matches_cpu)
{
    unsigned seed = 4242;
    printf("conv2d shapes: seed %u\n", seed);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int d = 0; d < 3; d++) {
            run_and_check(&shapes[s], dtypes[d], 0, 1, &seed);
            run_and_check(&shapes[s], dtypes[d],
                          CONV2D_EPI_BIAS | CONV2D_EPI_BATCHNORM | CONV2D_EPI_RELU, 1, &seed);
        }
}
END_TEST

START_TEST(test_gpu_conv2d_every_epilogue_combination_matches_cpu)
{
    unsigned seed = 5150;
    printf("conv2d epilogues: seed %u\n", seed);
    const char *names[] = {"3x3", "groups2", "depthwise", "odd_3x3_rgb"};
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 3; d++)
            for (unsigned epi = 0; epi < 8; epi++)
                run_and_check(shape_named(names[s]), dtypes[d], epi, 1, &seed);
}
END_TEST

START_TEST(test_gpu_conv2d_batched_calls_each_match_cpu)
{
    unsigned seed = 31337;
    printf("conv2d batched: seed %u\n", seed);
    const char *names[] = {"3x3", "asymmetric_k130", "groups2", "depthwise", "odd_3x3_rgb"};
    for (int s = 0; s < 5; s++)
        for (int d = 0; d < 3; d++) {
            run_and_check(shape_named(names[s]), dtypes[d],
                          CONV2D_EPI_BIAS | CONV2D_EPI_BATCHNORM | CONV2D_EPI_RELU, 3, &seed);
            run_and_check(shape_named(names[s]), dtypes[d], CONV2D_EPI_RELU, 5, &seed);
            /* More calls than travel in the kernel parameters: the pointer table in scratch. */
            run_and_check(shape_named(names[s]), dtypes[d], CONV2D_EPI_BIAS, 11, &seed);
        }
}
END_TEST

START_TEST(test_gpu_conv2d_empty_batch_queues_nothing)
{
    conv_gpu_shape_t t = *shape_named("3x3");
    t.n = 0;
    unsigned seed = 1;
    conv_gpu_call_t g;
    call_setup(&g, &t, DTYPE_BF16, CONV2D_EPI_RELU, &seed);
    const op_call_t *calls[1] = {&g.call};
    const void *const *ins[1] = {(const void *const *)g.dev_in};
    void *const *outs[1] = {&g.dev_out};
    op_error_t err;
    ck_assert_int_eq(op_conv2d.run_cuda(ctx, 1, calls, ins, outs, &err), 0);
    gpu_sync(ctx);
    call_check_and_free(&g, "empty batch");
}
END_TEST

int main(void)
{
    ctx = gpu_ctx_new(); /* exits 77 without a GPU */
    Suite *s = suite_create("gpu_conv2d");
    TCase *tc = tcase_create("cuda");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_gpu_conv2d_every_shape_and_dtype_matches_cpu);
    tcase_add_test(tc, test_gpu_conv2d_every_epilogue_combination_matches_cpu);
    tcase_add_test(tc, test_gpu_conv2d_batched_calls_each_match_cpu);
    tcase_add_test(tc, test_gpu_conv2d_empty_batch_queues_nothing);
    suite_add_tcase(s, tc);
    int status = run_suite_nofork(s);
    gpu_ctx_free(ctx);
    return status;
}
