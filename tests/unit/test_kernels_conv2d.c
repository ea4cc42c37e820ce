/* conv2d on the CPU: the reference against hand-computed cases and against an independent
 * f64 loop on random shapes, every epilogue combination, and validation errors. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/conv2d.h"
#include "support/op_test.h"

/* One conv2d call under test: descriptors, host data and the params as JSON text. */
typedef struct conv_case {
    op_call_t call;
    void *in[CONV2D_N_INPUTS];
    void *out;
} conv_case_t;

/* Validates a call made of the given descriptors (vec[j] NULL: input absent); returns the
 * validate() result and leaves the error in *err. */
static int validate_descs(op_call_t *call, const tensor_desc_t *x, const tensor_desc_t *w,
                          const tensor_desc_t *const vec[5], const char *params_json,
                          op_error_t *err)
{
    const tensor_desc_t *in[CONV2D_N_INPUTS] = {[CONV2D_IN_X] = x, [CONV2D_IN_W] = w};
    for (int j = 0; vec && j < 5; j++)
        in[CONV2D_IN_BIAS + j] = vec[j];
    return op_test_validate("conv2d", params_json, in, CONV2D_N_INPUTS, call, err);
}

/* Runs the reference on f32 data given as arrays (vec[j] NULL: absent); returns out. */
static float *run_f32(const tensor_desc_t *x, const float *xdata, const tensor_desc_t *w,
                      const float *wdata, const float *const vec[5], const char *params_json,
                      op_call_t *ret_call)
{
    tensor_desc_t vd = td(DTYPE_F32, w->shape[0]);
    const tensor_desc_t *vdescs[5] = {0};
    for (int j = 0; j < 5; j++)
        vdescs[j] = vec && vec[j] ? &vd : NULL;
    op_error_t err;
    int r = validate_descs(ret_call, x, w, vdescs, params_json, &err);
    ck_assert_msg(r == 0, "validate: %s: %s", err.field, err.message);
    const void *in[CONV2D_N_INPUTS] = {xdata, wdata};
    for (int j = 0; j < 5; j++)
        in[CONV2D_IN_BIAS + j] = vec ? vec[j] : NULL;
    float *out = malloc(tensor_desc_bytes(&ret_call->out[0]) + 1);
    op_test_run_call(ret_call, in, (void *[]){out});
    return out;
}

static void assert_floats(const float *got, const double *want, int n)
{
    for (int i = 0; i < n; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= 1e-6 * (1 + fabs(want[i])),
                      "element %d: got %.9g, want %.9g", i, got[i], want[i]);
}

/* ---- hand-computed cases ---- */

static const float x3x3[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};

START_TEST(test_conv2d_cpu_diagonal_kernel_sums_diagonal_pairs)
{
    tensor_desc_t x = td(DTYPE_F32, 1, 1, 3, 3), w = td(DTYPE_F32, 1, 1, 2, 2);
    const float wd[4] = {1, 0, 0, 1};
    op_call_t call;
    float *out = run_f32(&x, x3x3, &w, wd, NULL, NULL, &call);
    ck_assert_int_eq(call.out[0].ndim, 4);
    ck_assert_int_eq(call.out[0].shape[2], 2);
    ck_assert_int_eq(call.out[0].shape[3], 2);
    const double want[4] = {1 + 5, 2 + 6, 4 + 8, 5 + 9};
    assert_floats(out, want, 4);
    free(out);
}
END_TEST

START_TEST(test_conv2d_cpu_padding_and_stride_read_zeros_outside)
{
    /* pad 1, stride 2: output (p, q) sees x(2p - 1, 2q - 1) and x(2p, 2q). */
    tensor_desc_t x = td(DTYPE_F32, 1, 1, 3, 3), w = td(DTYPE_F32, 1, 1, 2, 2);
    const float wd[4] = {1, 0, 0, 1};
    op_call_t call;
    float *out = run_f32(&x, x3x3, &w, wd, NULL, "{\"padding\": 1, \"stride\": 2}", &call);
    ck_assert_int_eq(call.out[0].shape[2], 2);
    ck_assert_int_eq(call.out[0].shape[3], 2);
    const double want[4] = {0 + 1, 0 + 3, 0 + 7, 5 + 9};
    assert_floats(out, want, 4);
    free(out);
}
END_TEST

START_TEST(test_conv2d_cpu_dilation_spreads_the_taps)
{
    /* A 2x2 kernel of ones with dilation 2 covers the four corners of the 3x3 input. */
    tensor_desc_t x = td(DTYPE_F32, 1, 1, 3, 3), w = td(DTYPE_F32, 1, 1, 2, 2);
    const float wd[4] = {1, 1, 1, 1};
    op_call_t call;
    float *out = run_f32(&x, x3x3, &w, wd, NULL, "{\"dilation\": 2}", &call);
    ck_assert_int_eq(call.out[0].shape[2], 1);
    ck_assert_int_eq(call.out[0].shape[3], 1);
    const double want[1] = {1 + 3 + 7 + 9};
    assert_floats(out, want, 1);
    free(out);
}
END_TEST

START_TEST(test_conv2d_cpu_groups_keep_channels_apart)
{
    tensor_desc_t x = td(DTYPE_F32, 1, 2, 1, 1);
    const float xd[2] = {2, 3};
    /* groups 2: out0 = 10 * x0, out1 = 100 * x1. */
    tensor_desc_t wg = td(DTYPE_F32, 2, 1, 1, 1);
    const float wgd[2] = {10, 100};
    op_call_t call;
    float *out = run_f32(&x, xd, &wg, wgd, NULL, "{\"groups\": 2}", &call);
    const double want_g[2] = {20, 300};
    assert_floats(out, want_g, 2);
    free(out);
    /* groups 1: each output mixes both channels. */
    tensor_desc_t w1 = td(DTYPE_F32, 2, 2, 1, 1);
    const float w1d[4] = {1, 2, 3, 4};
    out = run_f32(&x, xd, &w1, w1d, NULL, NULL, &call);
    const double want_1[2] = {1 * 2 + 2 * 3, 3 * 2 + 4 * 3};
    assert_floats(out, want_1, 2);
    free(out);
}
END_TEST

START_TEST(test_conv2d_cpu_epilogue_bias_batchnorm_relu_by_hand)
{
    /* conv = 2 * 3 = 6 for channel 0 and -1 * 3 = -3 for channel 1. */
    tensor_desc_t x = td(DTYPE_F32, 1, 1, 1, 1), w = td(DTYPE_F32, 2, 1, 1, 1);
    const float xd[1] = {3}, wd[2] = {2, -1};
    const float bias[2] = {1, 0.5f}, scale[2] = {2, 1}, shift[2] = {0.25f, -1};
    const float mean[2] = {3, 0}, var[2] = {3.99f, 0.24f};
    const float *vec[5] = {bias, scale, shift, mean, var};
    op_call_t call;
    float *out =
        run_f32(&x, xd, &w, wd, vec,
                "{\"epilogue\": [\"bias\", \"batchnorm\", \"relu\"], \"eps\": 0.01}", &call);
    /* ch0: (6 + 1 - 3) / sqrt(4) * 2 + 0.25 = 4.25; ch1: (-3 + 0.5) / 0.5 - 1 = -6 -> 0. */
    const double want[2] = {4.25, 0};
    assert_floats(out, want, 2);
    free(out);
}
END_TEST

START_TEST(test_conv2d_cpu_empty_reduction_gives_the_epilogue_of_zero)
{
    /* C = 0: the sum is empty, so out = bias everywhere. */
    tensor_desc_t x = td(DTYPE_F32, 1, 0, 2, 2), w = td(DTYPE_F32, 2, 0, 1, 1);
    const float bias[2] = {1.5f, -2};
    const float *vec[5] = {bias};
    op_call_t call;
    float *out = run_f32(&x, NULL, &w, NULL, vec, "{\"epilogue\": [\"bias\"]}", &call);
    const double want[8] = {1.5, 1.5, 1.5, 1.5, -2, -2, -2, -2};
    assert_floats(out, want, 8);
    free(out);
}
END_TEST

START_TEST(test_conv2d_cpu_empty_batch_has_empty_output)
{
    tensor_desc_t x = td(DTYPE_F32, 0, 3, 5, 5), w = td(DTYPE_F32, 4, 3, 3, 3);
    float wd[4 * 3 * 3 * 3] = {0};
    op_call_t call;
    float *out = run_f32(&x, NULL, &w, wd, NULL, NULL, &call);
    ck_assert_int_eq(call.out[0].shape[0], 0);
    ck_assert_int_eq(call.out[0].shape[1], 4);
    ck_assert_int_eq(tensor_desc_numel(&call.out[0]), 0);
    free(out);
}
END_TEST

/* ---- against an independent loop ---- */

typedef struct conv_shape_case {
    int n, c, h, w, k, r, s, groups;
    int sh, sw, ph, pw, dh, dw;
    unsigned epilogue;
} conv_shape_case_t;

static int out_size(int in, int pad, int dil, int ker, int stride)
{
    int span = in + 2 * pad - dil * (ker - 1) - 1;
    return span < 0 ? 0 : span / stride + 1;
}

/* The convolution written the other way round from the reference: every input element
 * scatters into the outputs it touches. y must be zeroed, [N, K, P, Q]. */
static void scatter_conv(const conv_shape_case_t *t, const double *x, const double *w, int P, int Q,
                         double *y)
{
    int cg = t->c / t->groups, kg = t->k / t->groups;
    for (int n = 0; n < t->n; n++)
        for (int k = 0; k < t->k; k++)
            for (int c = 0; c < cg; c++)
                for (int r = 0; r < t->r; r++)
                    for (int s = 0; s < t->s; s++)
                        for (int ih = 0; ih < t->h; ih++)
                            for (int iw = 0; iw < t->w; iw++) {
                                int hp = ih + t->ph - r * t->dh, wp = iw + t->pw - s * t->dw;
                                if (hp < 0 || wp < 0 || hp % t->sh || wp % t->sw) continue;
                                int op = hp / t->sh, oq = wp / t->sw;
                                if (op >= P || oq >= Q) continue;
                                int ci = (k / kg) * cg + c;
                                y[((n * t->k + k) * P + op) * Q + oq] +=
                                    x[((n * t->c + ci) * t->h + ih) * t->w + iw] *
                                    w[((k * cg + c) * t->r + r) * t->s + s];
                            }
}

static void params_json_of(const conv_shape_case_t *t, char *buf, size_t size)
{
    int len = snprintf(buf, size,
                       "{\"stride\": [%d, %d], \"padding\": [%d, %d], \"dilation\": [%d, %d], "
                       "\"groups\": %d, \"eps\": 0.001, \"epilogue\": [",
                       t->sh, t->sw, t->ph, t->pw, t->dh, t->dw, t->groups);
    const char *names[3] = {"bias", "batchnorm", "relu"};
    bool first = true;
    for (int i = 0; i < 3; i++)
        if (t->epilogue & (1u << i)) {
            len += snprintf(buf + len, size - len, "%s\"%s\"", first ? "" : ", ", names[i]);
            first = false;
        }
    snprintf(buf + len, size - len, "]}");
}

/* Runs the reference on random data of dtype dt for shape t, and compares with the scatter
 * loop plus the epilogue written out, within tol relative to each element. */
static void check_against_scatter(const conv_shape_case_t *t, dtype_t dt, double tol,
                                  unsigned *seed)
{
    int P = out_size(t->h, t->ph, t->dh, t->r, t->sh),
        Q = out_size(t->w, t->pw, t->dw, t->s, t->sw);
    int cg = t->c / t->groups;
    int nx = t->n * t->c * t->h * t->w, nw = t->k * cg * t->r * t->s, ny = t->n * t->k * P * Q;
    size_t es = dtype_size(dt);
    void *xd = malloc(nx * es + 1), *wd = malloc(nw * es + 1);
    double *x = malloc(nx * sizeof(double) + 1), *w = malloc(nw * sizeof(double) + 1);
    for (int i = 0; i < nx; i++) {
        tensor_store(dt, xd, i, (double)rand_r(seed) / RAND_MAX * 2 - 1);
        x[i] = tensor_load(dt, xd, i);
    }
    for (int i = 0; i < nw; i++) {
        tensor_store(dt, wd, i, (double)rand_r(seed) / RAND_MAX * 2 - 1);
        w[i] = tensor_load(dt, wd, i);
    }
    float vecs[5][64];
    for (int j = 0; j < 5; j++)
        for (int k = 0; k < t->k; k++)
            vecs[j][k] = j == 4 ? 0.5f + (float)rand_r(seed) / RAND_MAX   /* var > 0 */
                                : (float)rand_r(seed) / RAND_MAX * 2 - 1; /* others */

    conv_case_t cc;
    memset(&cc, 0, sizeof cc);
    tensor_desc_t xdesc = td(dt, t->n, t->c, t->h, t->w);
    tensor_desc_t wdesc = td(dt, t->k, cg, t->r, t->s);
    tensor_desc_t vdesc = td(DTYPE_F32, t->k);
    const tensor_desc_t *vds[5] = {0};
    const void *in[CONV2D_N_INPUTS] = {xd, wd};
    for (int j = 0; j < 5; j++)
        if ((j == 0 && (t->epilogue & CONV2D_EPI_BIAS)) ||
            (j > 0 && (t->epilogue & CONV2D_EPI_BATCHNORM))) {
            vds[j] = &vdesc;
            in[CONV2D_IN_BIAS + j] = vecs[j];
        }
    char params[256];
    params_json_of(t, params, sizeof params);
    op_error_t err;
    int r = validate_descs(&cc.call, &xdesc, &wdesc, vds, params, &err);
    ck_assert_msg(r == 0, "validate %s: %s: %s", params, err.field, err.message);
    ck_assert_int_eq(cc.call.out[0].shape[2], P);
    ck_assert_int_eq(cc.call.out[0].shape[3], Q);
    void *out = malloc(ny * es + 1);
    op_test_run_call(&cc.call, in, (void *[]){out});

    double *y = calloc(ny + 1, sizeof *y);
    scatter_conv(t, x, w, P, Q, y);
    for (int i = 0; i < ny; i++) {
        int k = (i / (P * Q)) % t->k;
        double v = y[i];
        if (t->epilogue & CONV2D_EPI_BIAS) v += vecs[0][k];
        if (t->epilogue & CONV2D_EPI_BATCHNORM)
            v = (v - vecs[3][k]) / sqrt(vecs[4][k] + 0.001) * vecs[1][k] + vecs[2][k];
        if ((t->epilogue & CONV2D_EPI_RELU) && v < 0) v = 0;
        double got = tensor_load(dt, out, i);
        ck_assert_msg(fabs(got - v) <= tol * (1 + fabs(v)),
                      "%s %s: element %d: got %.9g, want %.9g", dtype_name(dt), params, i, got, v);
    }
    free(xd);
    free(wd);
    free(x);
    free(w);
    free(out);
    free(y);
}

static int rand_in(unsigned *seed, int lo, int hi)
{
    return lo + rand_r(seed) % (hi - lo + 1);
}

/* A random shape with random stride, padding, dilation and groups (depthwise a quarter of the
 * time), redrawn until the output is not empty. */
static conv_shape_case_t random_shape(unsigned *seed)
{
    for (;;) {
        conv_shape_case_t t = {0};
        int mode = rand_in(seed, 0, 3);
        t.groups = mode == 0 ? 1 : rand_in(seed, 1, 4);
        int cg = rand_in(seed, 1, 4), kg = rand_in(seed, 1, 4);
        if (mode == 3) cg = kg = 1; /* depthwise: groups == C == K */
        t.n = rand_in(seed, 1, 3);
        t.c = cg * t.groups;
        t.k = kg * t.groups;
        t.h = rand_in(seed, 1, 9);
        t.w = rand_in(seed, 1, 9);
        t.r = rand_in(seed, 1, 4);
        t.s = rand_in(seed, 1, 4);
        t.sh = rand_in(seed, 1, 3);
        t.sw = rand_in(seed, 1, 3);
        t.ph = rand_in(seed, 0, 2);
        t.pw = rand_in(seed, 0, 2);
        t.dh = rand_in(seed, 1, 3);
        t.dw = rand_in(seed, 1, 3);
        if (out_size(t.h, t.ph, t.dh, t.r, t.sh) >= 1 && out_size(t.w, t.pw, t.dw, t.s, t.sw) >= 1)
            return t;
    }
}

START_TEST(test_conv2d_cpu_matches_scatter_loop_on_random_shapes)
{
    unsigned seed = 20240601;
    printf("conv2d random shapes: seed %u\n", seed);
    for (int i = 0; i < 200; i++) {
        conv_shape_case_t t = random_shape(&seed);
        check_against_scatter(&t, DTYPE_F32, 1e-6, &seed);
    }
}
END_TEST

START_TEST(test_conv2d_cpu_every_epilogue_combination_matches)
{
    unsigned seed = 777;
    printf("conv2d epilogues: seed %u\n", seed);
    for (unsigned epi = 0; epi < 8; epi++)
        for (int i = 0; i < 10; i++) {
            conv_shape_case_t t = random_shape(&seed);
            t.epilogue = epi;
            check_against_scatter(&t, DTYPE_F32, 1e-6, &seed);
        }
}
END_TEST

START_TEST(test_conv2d_cpu_half_types_round_once_at_the_end)
{
    /* Same inputs as the f64 loop sees (already rounded to the dtype); only the final store
     * rounds, so the error is within half an ulp of f16 (2^-11) or bf16 (2^-8). */
    unsigned seed = 99;
    printf("conv2d f16/bf16: seed %u\n", seed);
    for (int i = 0; i < 40; i++) {
        conv_shape_case_t t = random_shape(&seed);
        t.epilogue = (unsigned)i % 8;
        check_against_scatter(&t, i % 2 ? DTYPE_F16 : DTYPE_BF16, i % 2 ? 1.0 / 2048 : 1.0 / 256,
                              &seed);
    }
}
END_TEST

/* ---- validation ---- */

START_TEST(test_conv2d_validate_fills_output_cost_and_batch_key)
{
    tensor_desc_t x = td(DTYPE_BF16, 2, 4, 7, 9), w = td(DTYPE_BF16, 6, 2, 3, 3);
    op_call_t a, b;
    op_error_t err;
    const char *params = "{\"stride\": [2, 1], \"padding\": [0, 2], \"dilation\": [1, 2], "
                         "\"groups\": 2}";
    ck_assert_int_eq(validate_descs(&a, &x, &w, NULL, params, &err), 0);
    ck_assert_int_eq(a.n_out, 1);
    ck_assert_str_eq(a.out_names[0], "out");
    ck_assert_int_eq(a.out[0].dtype, DTYPE_BF16);
    /* P = (7 - 2 - 1) / 2 + 1 = 3, Q = (9 + 4 - 4 - 1) / 1 + 1 = 9 */
    ck_assert_int_eq(a.out[0].shape[0], 2);
    ck_assert_int_eq(a.out[0].shape[1], 6);
    ck_assert_int_eq(a.out[0].shape[2], 3);
    ck_assert_int_eq(a.out[0].shape[3], 9);
    ck_assert(a.cost.flops >= 2.0 * 2 * 6 * 3 * 9 * 2 * 3 * 3);
    ck_assert(a.cost.bytes >= (2 * 4 * 7 * 9 + 6 * 2 * 3 * 3 + 2 * 6 * 3 * 9) * 2.0);
    ck_assert(a.batch_key[0] != '\0');
    /* Same shapes and params batch together; another input size does not. */
    ck_assert_int_eq(validate_descs(&b, &x, &w, NULL, params, &err), 0);
    ck_assert_str_eq(a.batch_key, b.batch_key);
    tensor_desc_t x2 = td(DTYPE_BF16, 2, 4, 8, 9);
    ck_assert_int_eq(validate_descs(&b, &x2, &w, NULL, params, &err), 0);
    ck_assert_str_ne(a.batch_key, b.batch_key);
    ck_assert_int_eq(validate_descs(&b, &x, &w, NULL,
                                    "{\"stride\": [2, 1], \"padding\": [0, 2], "
                                    "\"dilation\": [1, 2], \"groups\": 2, "
                                    "\"epilogue\": [\"relu\"]}",
                                    &err),
                     0);
    ck_assert_str_ne(a.batch_key, b.batch_key);
}
END_TEST

typedef struct bad_case {
    const char *what;
    tensor_desc_t x, w;
    unsigned vecs;         /* bit j: vector j present, [K] f32 */
    tensor_desc_t bad_vec; /* when ndim > 0: replaces vector 0 (bias) */
    const char *params;
    int code;
    const char *field;
} bad_case_t;

#define X4(dt, a, b, c, d)                                                                         \
    {                                                                                              \
        .dtype = dt, .ndim = 4, .shape = { a, b, c, d }                                            \
    }

START_TEST(test_conv2d_validate_rejects_bad_input_naming_the_field)
{
    const bad_case_t cases[] = {
        {"channel mismatch",
         X4(DTYPE_F32, 1, 4, 5, 5),
         X4(DTYPE_F32, 2, 3, 3, 3),
         0,
         {0},
         NULL,
         -EINVAL,
         "inputs.w.shape"},
        {"grouped channel mismatch",
         X4(DTYPE_F32, 1, 4, 5, 5),
         X4(DTYPE_F32, 2, 4, 3, 3),
         0,
         {0},
         "{\"groups\": 2}",
         -EINVAL,
         "inputs.w.shape"},
        {"groups not dividing C",
         X4(DTYPE_F32, 1, 4, 5, 5),
         X4(DTYPE_F32, 3, 1, 3, 3),
         0,
         {0},
         "{\"groups\": 3}",
         -EINVAL,
         "params.groups"},
        {"groups not dividing K",
         X4(DTYPE_F32, 1, 4, 5, 5),
         X4(DTYPE_F32, 3, 2, 3, 3),
         0,
         {0},
         "{\"groups\": 2}",
         -EINVAL,
         "params.groups"},
        {"groups zero",
         X4(DTYPE_F32, 1, 4, 5, 5),
         X4(DTYPE_F32, 4, 4, 3, 3),
         0,
         {0},
         "{\"groups\": 0}",
         -EINVAL,
         "params.groups"},
        {"unknown epilogue",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         1,
         {0},
         "{\"epilogue\": [\"bias\", \"gelu\"]}",
         -EINVAL,
         "params.epilogue"},
        {"epilogue out of order",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         1,
         {0},
         "{\"epilogue\": [\"relu\", \"bias\"]}",
         -EINVAL,
         "params.epilogue"},
        {"epilogue twice",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         "{\"epilogue\": [\"relu\", \"relu\"]}",
         -EINVAL,
         "params.epilogue"},
        {"epilogue not a list",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         "{\"epilogue\": \"relu\"}",
         -EINVAL,
         "params.epilogue"},
        {"missing bn_var",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0xe,
         {0},
         "{\"epilogue\": [\"batchnorm\"]}",
         -EINVAL,
         "inputs.bn_var"},
        {"missing bias",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         "{\"epilogue\": [\"bias\"]}",
         -EINVAL,
         "inputs.bias"},
        {"bias without epilogue",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         1,
         {0},
         NULL,
         -EINVAL,
         "inputs.bias"},
        {"bias wrong length",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 2, 1, 3, 3),
         1,
         {.dtype = DTYPE_F32, .ndim = 1, .shape = {3}},
         "{\"epilogue\": [\"bias\"]}",
         -EINVAL,
         "inputs.bias.shape"},
        {"bias wrong dtype",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 2, 1, 3, 3),
         1,
         {.dtype = DTYPE_I32, .ndim = 1, .shape = {2}},
         "{\"epilogue\": [\"bias\"]}",
         -EINVAL,
         "inputs.bias.dtype"},
        {"x integer",
         X4(DTYPE_I32, 1, 1, 5, 5),
         X4(DTYPE_I32, 1, 1, 3, 3),
         0,
         {0},
         NULL,
         -EINVAL,
         "inputs.x.dtype"},
        {"x f64",
         X4(DTYPE_F64, 1, 1, 5, 5),
         X4(DTYPE_F64, 1, 1, 3, 3),
         0,
         {0},
         NULL,
         -EINVAL,
         "inputs.x.dtype"},
        {"w dtype differs",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F16, 1, 1, 3, 3),
         0,
         {0},
         NULL,
         -EINVAL,
         "inputs.w.dtype"},
        {"x not 4-d",
         {.dtype = DTYPE_F32, .ndim = 3, .shape = {1, 5, 5}},
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         NULL,
         -EINVAL,
         "inputs.x.shape"},
        {"empty kernel",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 0, 3),
         0,
         {0},
         NULL,
         -EINVAL,
         "inputs.w.shape"},
        {"output smaller than 1",
         X4(DTYPE_F32, 1, 1, 2, 2),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         NULL,
         -EINVAL,
         "params"},
        {"dilated output smaller than 1",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         "{\"dilation\": [1, 3], \"padding\": [1, 0]}",
         -EINVAL,
         "params"},
        {"stride zero",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         "{\"stride\": 0}",
         -EINVAL,
         "params.stride"},
        {"padding negative",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         "{\"padding\": [1, -1]}",
         -EINVAL,
         "params.padding"},
        {"dilation of three",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         "{\"dilation\": [1, 2, 3]}",
         -EINVAL,
         "params.dilation"},
        {"eps negative",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         "{\"eps\": -1}",
         -EINVAL,
         "params.eps"},
        {"unknown param",
         X4(DTYPE_F32, 1, 1, 5, 5),
         X4(DTYPE_F32, 1, 1, 3, 3),
         0,
         {0},
         "{\"bias\": true}",
         -EINVAL,
         "params.bias"},
        {"output too large",
         X4(DTYPE_F16, 1024, 1, 1024, 1024),
         X4(DTYPE_F16, 1024, 1, 1, 1),
         0,
         {0},
         NULL,
         -E2BIG,
         "outputs.out"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case_t *bc = &cases[i];
        tensor_desc_t vec = td(DTYPE_F32, bc->w.ndim == 4 ? bc->w.shape[0] : 1);
        const tensor_desc_t *vds[5] = {0};
        for (int j = 0; j < 5; j++)
            if (bc->vecs & (1u << j)) vds[j] = &vec;
        if (bc->bad_vec.ndim > 0) vds[0] = &bc->bad_vec;
        op_call_t call;
        op_error_t err;
        int r = validate_descs(&call, &bc->x, &bc->w, vds, bc->params, &err);
        ck_assert_msg(r == bc->code, "%s: got %d (%s: %s), want %d", bc->what, r, err.field,
                      err.message, bc->code);
        ck_assert_msg(strcmp(err.field, bc->field) == 0, "%s: field '%s', want '%s' (%s)", bc->what,
                      err.field, bc->field, err.message);
        ck_assert_msg(err.message[0] != '\0', "%s: no message", bc->what);
    }
}
END_TEST

START_TEST(test_conv2d_validate_accepts_vectors_in_x_dtype_and_f32)
{
    tensor_desc_t x = td(DTYPE_BF16, 1, 2, 4, 4), w = td(DTYPE_BF16, 3, 2, 3, 3);
    tensor_desc_t vb = td(DTYPE_BF16, 3), vf = td(DTYPE_F32, 3);
    const tensor_desc_t *vds[5] = {&vb, &vf, &vb, &vf, &vb};
    op_call_t call;
    op_error_t err;
    ck_assert_int_eq(validate_descs(&call, &x, &w, vds,
                                    "{\"epilogue\": [\"bias\", \"batchnorm\"], \"padding\": 1}",
                                    &err),
                     0);
    tensor_desc_t vh = td(DTYPE_F16, 3);
    vds[0] = &vh;
    ck_assert_int_eq(validate_descs(&call, &x, &w, vds,
                                    "{\"epilogue\": [\"bias\", \"batchnorm\"], \"padding\": 1}",
                                    &err),
                     -EINVAL);
    ck_assert_str_eq(err.field, "inputs.bias.dtype");
}
END_TEST

static Suite *conv2d_suite(void)
{
    Suite *s = suite_create("kernels_conv2d");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_conv2d_cpu_diagonal_kernel_sums_diagonal_pairs);
    tcase_add_test(tc, test_conv2d_cpu_padding_and_stride_read_zeros_outside);
    tcase_add_test(tc, test_conv2d_cpu_dilation_spreads_the_taps);
    tcase_add_test(tc, test_conv2d_cpu_groups_keep_channels_apart);
    tcase_add_test(tc, test_conv2d_cpu_epilogue_bias_batchnorm_relu_by_hand);
    tcase_add_test(tc, test_conv2d_cpu_empty_reduction_gives_the_epilogue_of_zero);
    tcase_add_test(tc, test_conv2d_cpu_empty_batch_has_empty_output);
    tcase_add_test(tc, test_conv2d_cpu_matches_scatter_loop_on_random_shapes);
    tcase_add_test(tc, test_conv2d_cpu_every_epilogue_combination_matches);
    tcase_add_test(tc, test_conv2d_cpu_half_types_round_once_at_the_end);
    tcase_add_test(tc, test_conv2d_validate_fills_output_cost_and_batch_key);
    tcase_add_test(tc, test_conv2d_validate_rejects_bad_input_naming_the_field);
    tcase_add_test(tc, test_conv2d_validate_accepts_vectors_in_x_dtype_and_f32);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return op_test_run_suite(conv2d_suite());
}
