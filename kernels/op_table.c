/* The one table of ops. Each op family's file exports its op_def_t; adding an op is one line
 * here. The references are strong on purpose: they pull every family's object out of the
 * static library into whatever links it. */
#include "op.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

extern const op_def_t op_add, op_mul, op_saxpy, op_sum, op_dot, op_sort, op_gemm, op_conv2d,
    op_quantize, op_dequantize, op_debug_sleep, op_debug_fault;

static const op_def_t *const all_ops[] = {
    &op_add,  &op_mul,    &op_saxpy,    &op_sum,        &op_dot,         &op_sort,
    &op_gemm, &op_conv2d, &op_quantize, &op_dequantize, &op_debug_sleep, &op_debug_fault,
};

/* The linked ops, the test-only ones last: the visible ops are always a prefix, n_public long
 * while the test-only ops are hidden and n_linked long while they are shown. */
static const op_def_t *linked_ops[sizeof all_ops / sizeof all_ops[0]];
static int n_linked = -1, n_public;
static bool test_ops_enabled;

static void table_init(void)
{
    if (n_linked >= 0) return;
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < sizeof all_ops / sizeof all_ops[0]; i++)
            if (all_ops[i] && all_ops[i]->test_only == (pass == 1)) linked_ops[n++] = all_ops[i];
        if (pass == 0) n_public = n;
    }
    n_linked = n;
}

void op_table_enable_test_ops(bool enable)
{
    table_init();
    test_ops_enabled = enable;
}

int op_count(void)
{
    table_init();
    return test_ops_enabled ? n_linked : n_public;
}

const op_def_t *op_at(int i)
{
    int n = op_count();
    return i >= 0 && i < n ? linked_ops[i] : NULL;
}

const op_def_t *op_find(const char *name)
{
    int n = op_count();
    for (int i = 0; name && i < n; i++)
        if (strcmp(linked_ops[i]->name, name) == 0) return linked_ops[i];
    return NULL;
}

bool op_supports(const op_def_t *op, op_backend_t backend)
{
    if (!op) return false;
    switch (backend) {
    case OP_BACKEND_CPU:
        return op->run_cpu != NULL;
    case OP_BACKEND_CUDA:
        return op->run_cuda != NULL;
    }
    return false;
}

int op_input_index(const op_def_t *op, const char *name)
{
    for (int j = 0; j < op->n_inputs; j++)
        if (strcmp(op->input_names[j], name) == 0) return j;
    return -1;
}

int op_error(op_error_t *err, int code, const char *field, const char *fmt, ...)
{
    if (!err) return code;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return code;
}

int op_error_cancelled(op_error_t *err)
{
    return op_error(err, -ECANCELED, "", "stopped: the job was cancelled");
}

/* Checks each output of a validated call against the bound and max_out_bytes. */
static int op_call_check_outputs(const op_call_t *call, uint64_t max_out_bytes, op_error_t *err)
{
    for (int j = 0; j < call->n_out; j++) {
        const tensor_desc_t *d = &call->out[j];
        int r = tensor_desc_check(d, max_out_bytes);
        if (r == 0) continue;
        char field[64], shape[160];
        snprintf(field, sizeof field, "outputs.%s", call->out_names[j]);
        tensor_shape_str(d, shape, sizeof shape);
        if (r == -E2BIG)
            return op_error(err, r, field,
                            "output '%s' %s %s would take %" PRIu64
                            " bytes, over the limit of %" PRIu64 " bytes for one tensor",
                            call->out_names[j], dtype_name(d->dtype), shape, tensor_desc_bytes(d),
                            max_out_bytes);
        return op_error(err, r == -EINVAL ? r : -EOVERFLOW, field,
                        "output '%s' %s %s is too large: its byte size does not fit in 63 bits",
                        call->out_names[j], dtype_name(d->dtype), shape);
    }
    return 0;
}

double op_cost_ms(op_cost_t cost)
{
    return (cost.bytes / 1e9 + cost.flops / 1e11) * 1000.0;
}

int op_call_validate(const json_t *params, uint64_t max_out_bytes, op_call_t *call, op_error_t *err)
{
    int r = call->op->validate(params, call, err);
    if (r < 0) return r;
    return op_call_check_outputs(call, max_out_bytes, err);
}
