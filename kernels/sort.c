/* The sort op: validation, the CPU reference and the op table entry. The CUDA side is sort.cu.
 *
 * Keys are sorted along their last dimension; every leading index is an independent row. The
 * sort is stable (equal keys keep their input order, descending too), so argsort's indices are
 * the one stable permutation and the CPU and CUDA results agree bit for bit. Sorting does no
 * arithmetic: f64 keys, like every other dtype, come back exactly (NaNs as the canonical NaN),
 * so its accuracy bound is equality with this reference. */
#include "sort.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sort_input_names[] = {"keys", "values"};
static const char *const sort_param_names[] = {"descending", "argsort", NULL};

/* Each call's keys must fit one CUB sort with 32-bit offsets and 32-bit row-local indices. */
#define SORT_MAX_ELEMENTS ((int64_t)UINT32_MAX)

#define SORT_KEY_DTYPES                                                                            \
    (OP_DTYPE_BIT(DTYPE_U32) | OP_DTYPE_BIT(DTYPE_I32) | OP_DTYPE_BIT(DTYPE_F32) |                 \
     OP_DTYPE_BIT(DTYPE_I64) | OP_DTYPE_BIT(DTYPE_F64))

static const op_input_sig_t sort_input_sigs[] = {
    {SORT_KEY_DTYPES, 0, TENSOR_MAX_DIMS},
    {OP_DTYPES_ANY, 0, TENSOR_MAX_DIMS},
};
static const op_param_sig_t sort_param_sigs[] = {
    {"descending", OP_PARAM_BOOL, -HUGE_VAL, HUGE_VAL, "false", NULL,
     "Largest key first (still stable)."},
    {"argsort", OP_PARAM_BOOL, -HUGE_VAL, HUGE_VAL, "false", NULL,
     "Output indices (i64) of the sorted order instead of values."},
};
static const op_sig_t sort_sig = {
    .inputs = sort_input_sigs,
    .params = sort_param_sigs,
    .rules = "values has keys' shape; argsort is not given with values; at most 2^32 - 1 keys.",
};

static bool sort_key_dtype_ok(dtype_t dt)
{
    return SORT_KEY_DTYPES & OP_DTYPE_BIT(dt);
}

static int sort_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    int r = op_params_check_keys(call->op, params, err);
    if (r < 0) return r;
    sort_params_t p = {0};
    r = op_param_bool(params, "descending", false, &p.descending, err);
    if (r < 0) return r;
    r = op_param_bool(params, "argsort", false, &p.argsort, err);
    if (r < 0) return r;

    const tensor_desc_t *keys = &call->in[0];
    if (!sort_key_dtype_ok(keys->dtype))
        return op_error(err, -EINVAL, "inputs.keys.dtype",
                        "sort keys must be u32, i32, f32, i64 or f64, not %s",
                        dtype_name(keys->dtype));
    if (tensor_desc_numel(keys) > SORT_MAX_ELEMENTS)
        return op_error(err, -E2BIG, "inputs.keys.shape", "sort takes at most %lld keys per call",
                        (long long)SORT_MAX_ELEMENTS);
    p.key_dtype = keys->dtype;
    p.has_values = call->has_in[1];
    if (p.has_values) {
        const tensor_desc_t *values = &call->in[1];
        char ks[96], vs[96];
        if (values->ndim != keys->ndim ||
            memcmp(values->shape, keys->shape, sizeof keys->shape[0] * (size_t)keys->ndim) != 0)
            return op_error(err, -EINVAL, "inputs.values.shape",
                            "values must have the shape of keys %s, not %s",
                            tensor_shape_str(keys, ks, sizeof ks),
                            tensor_shape_str(values, vs, sizeof vs));
        if (p.argsort)
            return op_error(err, -EINVAL, "params.argsort",
                            "argsort returns indices and cannot be combined with input values");
        p.value_dtype = values->dtype;
    }
    /* A scalar is one row of one key. With no keys at all there is nothing to sort, and the
     * leading dims of an empty tensor may multiply to anything, so rows is then 0. */
    p.len = keys->ndim ? keys->shape[keys->ndim - 1] : 1;
    p.rows = p.len ? tensor_desc_numel(keys) / p.len : 0;

    memcpy(OP_PARAMS(call, sort_params_t), &p, sizeof p);
    call->n_out = 1;
    call->out_names[0] = "keys";
    call->out[0] = *keys;
    if (p.has_values || p.argsort) {
        call->n_out = 2;
        call->out_names[1] = p.has_values ? "values" : "indices";
        call->out[1] = *keys;
        call->out[1].dtype = p.has_values ? p.value_dtype : DTYPE_I64;
    }
    double bytes = 0;
    for (int j = 0; j < 2; j++)
        if (call->has_in[j]) bytes += (double)tensor_desc_bytes(&call->in[j]);
    for (int j = 0; j < call->n_out; j++)
        bytes += (double)tensor_desc_bytes(&call->out[j]);
    call->cost.bytes = bytes;
    call->cost.flops = 0;
    /* Rows of any length sort together as one segmented sort; what must agree is how. */
    snprintf(call->batch_key, sizeof call->batch_key, "sort/%s/%s%s/%s", dtype_name(p.key_dtype),
             p.has_values ? "values:" : (p.argsort ? "argsort" : "keys"),
             p.has_values ? dtype_name(p.value_dtype) : "", p.descending ? "desc" : "asc");
    return 0;
}

typedef struct sort_item {
    uint64_t key; /* order key */
    uint32_t index;
} sort_item_t;

/* Ties broken by input position make qsort's result the stable order. */
static int sort_item_cmp(const void *a, const void *b)
{
    const sort_item_t *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static uint64_t sort_load_order_key(const sort_params_t *p, const void *keys, int64_t i)
{
    if (sort_key_is_wide(p->key_dtype))
        return sort_order_key64(p->key_dtype, ((const uint64_t *)keys)[i], p->descending);
    return sort_order_key32(p->key_dtype, ((const uint32_t *)keys)[i], p->descending);
}

static void sort_store_key(const sort_params_t *p, void *keys, int64_t i, uint64_t order_key)
{
    if (sort_key_is_wide(p->key_dtype))
        ((uint64_t *)keys)[i] = sort_key64_from_order(p->key_dtype, order_key, p->descending);
    else
        ((uint32_t *)keys)[i] =
            sort_key32_from_order(p->key_dtype, (uint32_t)order_key, p->descending);
}

static int sort_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                        op_error_t *err)
{
    const sort_params_t *p = OP_PARAMS((op_call_t *)call, sort_params_t);
    if (p->len == 0 || p->rows == 0) return 0;
    sort_item_t *items = size_malloc(p->len, sizeof *items);
    if (!items)
        return op_error(err, -ENOMEM, "", "out of memory sorting %lld keys", (long long)p->len);
    size_t value_size = p->has_values ? dtype_size(p->value_dtype) : 0;
    int r = 0;
    for (int64_t row = 0; row < p->rows; row++) {
        /* A cancelled run stops between rows. */
        if (op_call_cancelled(call)) {
            r = op_error_cancelled(err);
            break;
        }
        int64_t base = row * p->len;
        for (int64_t j = 0; j < p->len; j++)
            items[j] = (sort_item_t){sort_load_order_key(p, in[0], base + j), (uint32_t)j};
        qsort(items, (size_t)p->len, sizeof *items, sort_item_cmp);
        for (int64_t j = 0; j < p->len; j++) {
            sort_store_key(p, out[0], base + j, items[j].key);
            if (p->argsort) ((int64_t *)out[1])[base + j] = items[j].index;
            if (p->has_values)
                memcpy((char *)out[1] + (size_t)(base + j) * value_size,
                       (const char *)in[1] + (size_t)(base + items[j].index) * value_size,
                       value_size);
        }
    }
    free(items);
    return r;
}

const op_def_t op_sort = {
    .name = "sort",
    .summary = "stable sort along the last dim (rows independent), with values or argsort",
    .n_inputs = 2,
    .input_names = sort_input_names,
    .required_inputs = 1u << 0,
    .param_names = sort_param_names,
    .sig = &sort_sig,
    .validate = sort_validate,
    .run_cpu = sort_run_cpu,
    .run_cuda = OP_CUDA(op_sort_run_cuda),
};
