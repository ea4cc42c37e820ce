/* Every op's validate() on random input descriptors and params. Each accepted call's outputs
 * must have byte sizes that a 128-bit recomputation confirms (fuzz_check.h), and a call small
 * enough to run quickly is then run on the CPU with outputs of exactly the validated size, so
 * that the sanitizers see any write past them.
 *
 * Input layout: op index, then per input slot a presence byte, dtype, rank and dims, then per
 * param of the op a kind byte and its value. Dims and values come mostly from a table of
 * edge cases (0, 1, 2^31, 2^62 + 1, INT64_MAX, ...). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

static const int64_t edge_dims[] = {0,
                                    1,
                                    2,
                                    3,
                                    4,
                                    7,
                                    16,
                                    255,
                                    1 << 16,
                                    (int64_t)1 << 31,
                                    ((int64_t)1 << 32) + 1,
                                    (int64_t)1 << 62,
                                    ((int64_t)1 << 62) + 1,
                                    INT64_MAX,
                                    -1};
#define N_EDGE (sizeof edge_dims / sizeof edge_dims[0])

static int64_t take_dim(fuzz_bytes_t *b)
{
    uint64_t k = fuzz_take(b, 1);
    if (k < 128) return edge_dims[k % N_EDGE];
    if (k < 224) return (int64_t)(k - 128); /* small sizes: shapes that can run */
    return (int64_t)fuzz_take(b, 8);
}

/* A JSON value for one param: absent (NULL), or a new reference. */
static json_t *take_param(fuzz_bytes_t *b)
{
    switch (fuzz_take(b, 1) % 12) {
    case 0:
        return NULL;
    case 1:
        return json_null();
    case 2:
        return json_integer((int8_t)fuzz_take(b, 1));
    case 3:
        return json_integer(take_dim(b));
    case 4: {
        uint64_t bits = fuzz_take(b, 8);
        double v;
        memcpy(&v, &bits, sizeof v);
        return json_real(v); /* jansson refuses NaN and infinities: then NULL */
    }
    case 5:
        return json_boolean(fuzz_take(b, 1) & 1);
    case 6:
        return json_pack("[II]", (json_int_t)(int8_t)fuzz_take(b, 1),
                         (json_int_t)(int8_t)fuzz_take(b, 1));
    case 7:
        return json_pack("[II]", (json_int_t)take_dim(b), (json_int_t)take_dim(b));
    case 8:
        return json_string("x");
    case 9:
        return json_real((double)(int8_t)fuzz_take(b, 1) / 4.0);
    case 10:
        return json_pack("[I]", (json_int_t)take_dim(b));
    default:
        return json_object();
    }
}

static json_t *take_params(fuzz_bytes_t *b, const op_def_t *op)
{
    json_t *params = json_object();
    for (const char *const *name = op->param_names; name && *name; name++) {
        json_t *v = take_param(b);
        if (v) json_object_set_new(params, *name, v);
    }
    if (fuzz_take(b, 1) == 0xff) json_object_set_new(params, "no_such_param", json_integer(1));
    return params;
}

/* Runs a validated call on the CPU with inputs of arbitrary bytes and outputs of exactly the
 * validated sizes, when its tensors and work are small. */
static void run_small_call(const op_call_t *call)
{
    uint64_t total = 0;
    for (int j = 0; j < call->op->n_inputs; j++)
        if (call->has_in[j]) total += tensor_desc_bytes(&call->in[j]);
    for (int j = 0; j < call->n_out; j++)
        total += tensor_desc_bytes(&call->out[j]);
    if (total > (1u << 20) || call->cost.flops > 4e6 || call->cost.bytes > 8e6) return;

    const void *in[OP_MAX_TENSORS] = {0};
    void *out[OP_MAX_TENSORS] = {0};
    for (int j = 0; j < call->op->n_inputs; j++) {
        if (!call->has_in[j]) continue;
        size_t n = tensor_desc_bytes(&call->in[j]);
        unsigned char *p = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++)
            p[i] = (unsigned char)(i * 37 + j);
        in[j] = p;
    }
    for (int j = 0; j < call->n_out; j++)
        out[j] = malloc(tensor_desc_bytes(&call->out[j]));
    op_error_t err;
    call->op->run_cpu(call, in, out, &err);
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        free((void *)in[j]);
        free(out[j]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_bytes_t b = {data, size};
    int n_ops = op_count();
    const op_def_t *op = op_at((int)(fuzz_take(&b, 1) % (uint64_t)n_ops));
    uint64_t max_bytes = fuzz_take(&b, 1) & 1 ? UINT64_MAX : (1u << 20);

    op_call_t call;
    memset(&call, 0, sizeof call);
    call.op = op;
    for (int j = 0; j < op->n_inputs; j++) {
        bool required = op->required_inputs & (1u << j);
        call.has_in[j] = required || (fuzz_take(&b, 1) & 1);
        if (!call.has_in[j]) continue;
        tensor_desc_t *d = &call.in[j];
        d->dtype = (dtype_t)(fuzz_take(&b, 1) % DTYPE_COUNT);
        d->ndim = (int)(fuzz_take(&b, 1) % (TENSOR_MAX_DIMS + 1));
        for (int i = 0; i < d->ndim; i++)
            d->shape[i] = take_dim(&b);
        /* The daemon checks each input so before it asks the op. */
        if (tensor_desc_check(d, max_bytes) != 0) return 0;
        fuzz_check_desc(d);
    }
    json_t *params = take_params(&b, op);
    op_error_t err;
    /* As the daemon asks: the op's validate, then every output against the byte limit. */
    if (op_params_check_keys(op, params, &err) == 0 &&
        op_call_validate(params, max_bytes, &call, &err) == 0) {
        fuzz_check_call(&call);
        run_small_call(&call);
    }
    json_decref(params);
    return 0;
}
