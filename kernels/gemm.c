/* The gemm op: validation, the CPU reference and the op table entry. The CUDA side is gemm.cu.
 *
 * out = alpha * op(a) * op(b) + beta * c, row-major, with leading dims as a batch. f32, f16 and
 * bf16 accumulate in f32 on the GPU and in double here; f64 accumulates in f64 on the GPU and in
 * long double here (see gemm.h for its bound); i8 inputs give exact i32 results while they fit
 * in 32 bits (beyond that the GPU wraps and this reference saturates). */
#include "gemm.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const gemm_input_names[] = {"a", "b", "c"};
static const char *const gemm_param_names[] = {"trans_a", "trans_b", "alpha", "beta", "tf32", NULL};

/* cuBLAS takes int dimensions. */
#define GEMM_MAX_DIM ((int64_t)INT32_MAX)

#define GEMM_DTYPES                                                                                \
    (OP_DTYPE_BIT(DTYPE_F32) | OP_DTYPE_BIT(DTYPE_F16) | OP_DTYPE_BIT(DTYPE_BF16) |                \
     OP_DTYPE_BIT(DTYPE_F64) | OP_DTYPE_BIT(DTYPE_I8))
/* c has the output's dtype: a's, or i32 for i8. */
#define GEMM_C_DTYPES                                                                              \
    (OP_DTYPE_BIT(DTYPE_F32) | OP_DTYPE_BIT(DTYPE_F16) | OP_DTYPE_BIT(DTYPE_BF16) |                \
     OP_DTYPE_BIT(DTYPE_F64) | OP_DTYPE_BIT(DTYPE_I32))

static const op_input_sig_t gemm_input_sigs[] = {
    {GEMM_DTYPES, 2, TENSOR_MAX_DIMS},
    {GEMM_DTYPES, 2, TENSOR_MAX_DIMS},
    {GEMM_C_DTYPES, 2, TENSOR_MAX_DIMS},
};
static const op_param_sig_t gemm_param_sigs[] = {
    {"trans_a", OP_PARAM_BOOL, -HUGE_VAL, HUGE_VAL, "false", NULL, "Use a transposed."},
    {"trans_b", OP_PARAM_BOOL, -HUGE_VAL, HUGE_VAL, "false", NULL, "Use b transposed."},
    {"alpha", OP_PARAM_NUMBER, -HUGE_VAL, HUGE_VAL, "1.0", NULL, "The factor of op(a)*op(b)."},
    {"beta", OP_PARAM_NUMBER, -HUGE_VAL, HUGE_VAL, "0.0", NULL, "The factor of c."},
    {"tf32", OP_PARAM_BOOL, -HUGE_VAL, HUGE_VAL, "false", NULL,
     "Let the GPU multiply f32 inputs in TF32."},
};
static const op_sig_t gemm_sig = {
    .inputs = gemm_input_sigs,
    .params = gemm_param_sigs,
    .rules = "b has a's dtype; the inner dims of op(a) and op(b) agree and their leading (batch) "
             "dims are equal or absent; m, n and k are at most 2^31 - 1; c, when given, has the "
             "output's dtype (a's, i32 for i8) and shape; a nonzero beta needs c; tf32 applies "
             "to f32 only; for i8, alpha and beta are 32-bit integers.",
};

static bool gemm_dtype_ok(dtype_t dt)
{
    return GEMM_DTYPES & OP_DTYPE_BIT(dt);
}

/* An i8 gemm scales in int32: alpha and beta must be integers that fit. */
static int gemm_check_int_scalar(const char *field, double v, op_error_t *err)
{
    if (v != floor(v) || v < INT32_MIN || v > INT32_MAX)
        return op_error(err, -EINVAL, field, "%s must be a 32-bit integer for i8 inputs, not %g",
                        field, v);
    return 0;
}

static int gemm_parse_params(const json_t *params, gemm_params_t *p, op_error_t *err)
{
    int r = op_param_bool(params, "trans_a", false, &p->trans_a, err);
    if (r == 0) r = op_param_bool(params, "trans_b", false, &p->trans_b, err);
    if (r == 0) r = op_param_bool(params, "tf32", false, &p->tf32, err);
    if (r == 0) r = op_param_double(params, "alpha", 1.0, &p->alpha, err);
    if (r == 0) r = op_param_double(params, "beta", 0.0, &p->beta, err);
    return r;
}

/* Checks the dtypes of a and b and that both are at least matrices. */
static int gemm_check_operands(const tensor_desc_t *a, const tensor_desc_t *b, op_error_t *err)
{
    char as[96], bs[96];
    if (!gemm_dtype_ok(a->dtype))
        return op_error(err, -EINVAL, "inputs.a.dtype",
                        "gemm takes f32, f16, bf16, f64 or i8 inputs, not %s",
                        dtype_name(a->dtype));
    if (b->dtype != a->dtype)
        return op_error(err, -EINVAL, "inputs.b.dtype", "b must be %s like a, not %s",
                        dtype_name(a->dtype), dtype_name(b->dtype));
    if (a->ndim < 2)
        return op_error(err, -EINVAL, "inputs.a.shape", "a must have at least 2 dims, not %s",
                        tensor_shape_str(a, as, sizeof as));
    if (b->ndim < 2)
        return op_error(err, -EINVAL, "inputs.b.shape", "b must have at least 2 dims, not %s",
                        tensor_shape_str(b, bs, sizeof bs));
    return 0;
}

/* Sets p's dtypes and its m, n, k from the last two dims of a and b and the transposes, and
 * checks that the inner dims agree and that each fits cuBLAS. */
static int gemm_set_dims(const tensor_desc_t *a, const tensor_desc_t *b, gemm_params_t *p,
                         op_error_t *err)
{
    char as[96], bs[96];
    p->dtype = a->dtype;
    p->out_dtype = a->dtype == DTYPE_I8 ? DTYPE_I32 : a->dtype;
    int64_t a_rows = a->shape[a->ndim - 2], a_cols = a->shape[a->ndim - 1];
    int64_t b_rows = b->shape[b->ndim - 2], b_cols = b->shape[b->ndim - 1];
    p->m = p->trans_a ? a_cols : a_rows;
    p->k = p->trans_a ? a_rows : a_cols;
    p->n = p->trans_b ? b_rows : b_cols;
    int64_t kb = p->trans_b ? b_cols : b_rows;
    if (kb != p->k)
        return op_error(err, -EINVAL, "inputs.b.shape",
                        "b %s%s does not match a %s%s: inner dims %lld and %lld differ",
                        tensor_shape_str(b, bs, sizeof bs), p->trans_b ? " (transposed)" : "",
                        tensor_shape_str(a, as, sizeof as), p->trans_a ? " (transposed)" : "",
                        (long long)kb, (long long)p->k);
    if (p->m > GEMM_MAX_DIM || p->n > GEMM_MAX_DIM || p->k > GEMM_MAX_DIM)
        return op_error(err, -E2BIG, p->n > GEMM_MAX_DIM ? "inputs.b.shape" : "inputs.a.shape",
                        "gemm dims m, n, k must each be below 2^31");
    return 0;
}

/* Sets p's batch and sharing from the leading dims of a and b and computes the output
 * [batch dims..., m, n]. 0 and *ret_out, or a negative errno with err filled. */
static int gemm_output_desc(const tensor_desc_t *a, const tensor_desc_t *b, gemm_params_t *p,
                            tensor_desc_t *ret_out, op_error_t *err)
{
    char as[96], bs[96];
    /* Leading dims: equal on both sides, or absent on one (that operand is shared). */
    int lead_a = a->ndim - 2, lead_b = b->ndim - 2;
    if (lead_a > 0 && lead_b > 0 &&
        (lead_a != lead_b || memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)lead_a)))
        return op_error(err, -EINVAL, "inputs.b.shape", "the batch dims of b %s and a %s differ",
                        tensor_shape_str(b, bs, sizeof bs), tensor_shape_str(a, as, sizeof as));
    const tensor_desc_t *lead = lead_a > 0 ? a : b;
    int n_lead = lead_a > 0 ? lead_a : lead_b;
    p->a_batched = lead_a > 0;
    p->b_batched = lead_b > 0;
    tensor_desc_t out = {.dtype = p->out_dtype, .ndim = n_lead + 2};
    memcpy(out.shape, lead->shape, sizeof out.shape[0] * (size_t)n_lead);
    out.shape[n_lead] = p->m;
    out.shape[n_lead + 1] = p->n;
    /* With k = 0 the inputs are empty whatever m and n are, so the output may be huge. */
    if (size_product(lead->shape, n_lead, &p->batch) < 0 || tensor_desc_check(&out, UINT64_MAX) < 0)
        return op_error(err, -EOVERFLOW, "outputs.out", "the output %s is too large",
                        tensor_shape_str(&out, as, sizeof as));
    *ret_out = out;
    return 0;
}

/* Checks params.tf32, alpha and beta against the inputs' dtype. */
static int gemm_check_scalars(const gemm_params_t *p, op_error_t *err)
{
    if (p->tf32 && p->dtype != DTYPE_F32)
        return op_error(err, -EINVAL, "params.tf32", "params.tf32 applies only to f32 inputs");
    if (p->dtype == DTYPE_I8) {
        int r = gemm_check_int_scalar("params.alpha", p->alpha, err);
        if (r == 0) r = gemm_check_int_scalar("params.beta", p->beta, err);
        if (r < 0) return r;
    }
    return 0;
}

/* Checks input c, when given, against the output, and that a nonzero beta has a c to scale. */
static int gemm_check_c(const tensor_desc_t *c, const gemm_params_t *p, const tensor_desc_t *out,
                        op_error_t *err)
{
    if (p->beta != 0 && !p->has_c)
        return op_error(err, -EINVAL, "params.beta",
                        "params.beta is %g but there is no input c to scale", p->beta);
    if (!p->has_c) return 0;
    if (c->dtype != p->out_dtype)
        return op_error(err, -EINVAL, "inputs.c.dtype", "c must be %s, not %s",
                        dtype_name(p->out_dtype), dtype_name(c->dtype));
    if (!tensor_desc_equal(c, out)) {
        char as[96], bs[96];
        tensor_desc_t want = *out;
        want.dtype = c->dtype;
        return op_error(err, -EINVAL, "inputs.c.shape", "c must have the output's shape %s, not %s",
                        tensor_shape_str(&want, as, sizeof as), tensor_shape_str(c, bs, sizeof bs));
    }
    return 0;
}

/* Calls batch together only when one pointer-array GEMM can run them all: the same shape,
 * dtype, transposes, scalars and sharing. %a keeps alpha and beta exact. */
static void gemm_set_batch_key(op_call_t *call, const gemm_params_t *p)
{
    int len = snprintf(call->batch_key, sizeof call->batch_key,
                       "gemm/%s%s/%c%c/%lldx%lldx%lldx%lld/%c%c%c/%a/%a", dtype_name(p->dtype),
                       p->tf32 ? "-tf32" : "", p->trans_a ? 't' : 'n', p->trans_b ? 't' : 'n',
                       (long long)p->m, (long long)p->n, (long long)p->k, (long long)p->batch,
                       p->a_batched ? 'a' : '-', p->b_batched ? 'b' : '-', p->has_c ? 'c' : '-',
                       p->alpha, p->beta);
    if (len < 0 || (size_t)len >= sizeof call->batch_key) call->batch_key[0] = '\0';
}

static int gemm_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    int r = op_params_check_keys(call->op, params, err);
    if (r < 0) return r;
    gemm_params_t p = {0};
    r = gemm_parse_params(params, &p, err);
    if (r < 0) return r;

    const tensor_desc_t *a = &call->in[0], *b = &call->in[1], *c = &call->in[2];
    tensor_desc_t out;
    if ((r = gemm_check_operands(a, b, err)) < 0 || (r = gemm_set_dims(a, b, &p, err)) < 0 ||
        (r = gemm_output_desc(a, b, &p, &out, err)) < 0 || (r = gemm_check_scalars(&p, err)) < 0)
        return r;
    p.has_c = call->has_in[2];
    if ((r = gemm_check_c(c, &p, &out, err)) < 0) return r;

    memcpy(OP_PARAMS(call, gemm_params_t), &p, sizeof p);
    call->n_out = 1;
    call->out_names[0] = "out";
    call->out[0] = out;
    call->cost.flops = 2.0 * (double)p.batch * (double)p.m * (double)p.n * (double)p.k;
    call->cost.bytes = (double)tensor_desc_bytes(a) + (double)tensor_desc_bytes(b) +
                       (double)tensor_desc_bytes(&out) * (p.beta != 0 ? 2 : 1);
    gemm_set_batch_key(call, &p);
    return 0;
}

/* op(x)[i][j] of a row-major matrix of rows x cols (cols when not transposed). */
static int64_t gemm_at(bool trans, int64_t i, int64_t j, int64_t rows_op, int64_t cols_op)
{
    return trans ? j * rows_op + i : i * cols_op + j;
}

/* lacc[j] += av * op(b)[q][j] for every j of an f64 row: loads typed, since tensor_load's
 * switch per element would cost more than the long double arithmetic. */
static void gemm_row_f64(long double *lacc, double av, const double *b, bool trans_b, int64_t q,
                         int64_t k, int64_t n)
{
    if (trans_b) {
        for (int64_t j = 0; j < n; j++)
            lacc[j] += (long double)av * b[j * k + q];
        return;
    }
    const double *row = b + q * n;
    for (int64_t j = 0; j < n; j++)
        lacc[j] += (long double)av * row[j];
}

static int gemm_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                        op_error_t *err)
{
    const gemm_params_t *p = OP_PARAMS((op_call_t *)call, gemm_params_t);
    int64_t m = p->m, n = p->n, k = p->k;
    /* An empty output has nothing to compute, however large k and the batch: without this the
     * loops below would still walk batch * m * k products of a's rows for n = 0. */
    if (p->batch == 0 || m == 0 || n == 0) return 0;
    bool use_c = p->has_c && p->beta != 0;
    bool exact = p->dtype == DTYPE_I8, wide = p->dtype == DTYPE_F64;
    /* One accumulator per column of an output row, of one type per call: int64 for i8 (exact),
     * long double for f64 (a reference more precise than the GPU's f64), double for the 16- and
     * 32-bit floats (their products are exact in it). */
    void *acc = size_malloc(n, sizeof(long double));
    if (!acc) return op_error(err, -ENOMEM, "", "out of memory");
    double *dacc = acc;
    long double *lacc = acc;
    int64_t *iacc = acc;
    /* Integral scalars only where the product is exact (i8): validate bounds them there, and a
     * float's alpha may be past int64's range. */
    int64_t alpha_i = exact ? (int64_t)p->alpha : 0, beta_i = exact ? (int64_t)p->beta : 0;
    int r = 0;
    for (int64_t z = 0; z < p->batch && r == 0; z++) {
        int64_t a0 = p->a_batched ? z * m * k : 0, b0 = p->b_batched ? z * k * n : 0;
        int64_t o0 = z * m * n;
        for (int64_t i = 0; i < m; i++) {
            /* A cancelled run stops within one output row's work. */
            if (op_call_cancelled(call)) {
                r = op_error_cancelled(err);
                break;
            }
            for (int64_t j = 0; j < n; j++) {
                if (exact)
                    iacc[j] = 0;
                else if (wide)
                    lacc[j] = 0;
                else
                    dacc[j] = 0;
            }
            for (int64_t q = 0; q < k; q++) {
                double av = tensor_load(p->dtype, in[0], a0 + gemm_at(p->trans_a, i, q, m, k));
                if (wide) {
                    gemm_row_f64(lacc, av, (const double *)in[1] + b0, p->trans_b, q, k, n);
                    continue;
                }
                for (int64_t j = 0; j < n; j++) {
                    double bv = tensor_load(p->dtype, in[1], b0 + gemm_at(p->trans_b, q, j, k, n));
                    if (exact)
                        iacc[j] += (int64_t)av * (int64_t)bv;
                    else
                        dacc[j] += av * bv;
                }
            }
            for (int64_t j = 0; j < n; j++) {
                int64_t at = o0 + i * n + j;
                double v;
                if (exact) {
                    int64_t r = alpha_i * iacc[j];
                    if (use_c) r += beta_i * (int64_t)tensor_load(DTYPE_I32, in[2], at);
                    v = (double)r;
                } else if (wide) {
                    long double w = (long double)p->alpha * lacc[j];
                    if (use_c) w += (long double)p->beta * tensor_load(DTYPE_F64, in[2], at);
                    v = (double)w;
                } else {
                    v = p->alpha * dacc[j];
                    if (use_c) v += p->beta * tensor_load(p->out_dtype, in[2], at);
                }
                tensor_store(p->out_dtype, out[0], at, v);
            }
        }
    }
    free(acc);
    return r;
}

const op_def_t op_gemm = {
    .name = "gemm",
    .summary = "out = alpha*op(a)*op(b) + beta*c; f32/tf32, f16, bf16, f64, i8->i32; leading dims "
               "batch",
    .n_inputs = 3,
    .input_names = gemm_input_names,
    .required_inputs = (1u << 0) | (1u << 1),
    .param_names = gemm_param_names,
    .sig = &gemm_sig,
    .validate = gemm_validate,
    .run_cpu = gemm_run_cpu,
    .run_cuda = OP_CUDA(op_gemm_run_cuda),
};
