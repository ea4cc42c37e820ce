/* Helpers shared by the CPU test suites of the op catalog; see op_test.h. */
#include "support/op_test.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/run_suite.h"

tensor_desc_t op_test_desc(dtype_t dt, int ndim, const int64_t *shape)
{
    ck_assert_msg(ndim >= 0 && ndim <= TENSOR_MAX_DIMS, "test descriptor with %d dims", ndim);
    tensor_desc_t d = {.dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++)
        d.shape[i] = shape[i];
    return d;
}

/* Writes "x f32[2, 3], y f32[]" (absent inputs left out) into buf, so that a failed assertion
 * says which call it was about even when a test loops over a table of cases. */
static void op_test_describe_inputs(const op_def_t *op, const tensor_desc_t *const inputs[],
                                    int n_inputs, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int j = 0; j < n_inputs && len < size; j++) {
        if (!inputs[j]) continue;
        char shape[128];
        tensor_shape_str(inputs[j], shape, sizeof shape);
        int n = snprintf(buf + len, size - len, "%s%s %s%s", len ? ", " : "", op->input_names[j],
                         dtype_name(inputs[j]->dtype), shape);
        if (n < 0) break;
        len += (size_t)n;
    }
}

int op_test_validate(const char *op_name, const char *params_json,
                     const tensor_desc_t *const inputs[], int n_inputs, op_call_t *call,
                     op_error_t *err)
{
    memset(call, 0, sizeof *call);
    memset(err, 0, sizeof *err);
    call->op = op_find(op_name);
    ck_assert_msg(call->op != NULL, "no op '%s' in the table", op_name);
    ck_assert_msg(n_inputs >= 0 && n_inputs <= call->op->n_inputs,
                  "%s takes %d inputs, the test gave %d", op_name, call->op->n_inputs, n_inputs);
    for (int j = 0; j < n_inputs; j++) {
        if (!inputs[j]) continue;
        call->in[j] = *inputs[j];
        call->has_in[j] = true;
    }
    json_error_t jerr;
    json_t *params = params_json ? json_loads(params_json, 0, &jerr) : NULL;
    ck_assert_msg(!params_json || params, "bad test JSON %s: %s", params_json, jerr.text);
    int r = call->op->validate(params, call, err);
    json_decref(params);
    return r;
}

void op_test_validate_ok(const char *op_name, const char *params_json,
                         const tensor_desc_t *const inputs[], int n_inputs, op_call_t *ret_call)
{
    op_error_t err;
    int r = op_test_validate(op_name, params_json, inputs, n_inputs, ret_call, &err);
    if (r == 0) return;
    char descs[512];
    op_test_describe_inputs(ret_call->op, inputs, n_inputs, descs, sizeof descs);
    ck_abort_msg("%s(%s) params %s: validate gave %d (%s: %s)", op_name, descs,
                 params_json ? params_json : "none", r, err.field, err.message);
}

void op_test_expect_error(const char *op_name, const char *params_json,
                          const tensor_desc_t *const inputs[], int n_inputs, int code,
                          const char *field)
{
    op_call_t call;
    op_error_t err;
    int r = op_test_validate(op_name, params_json, inputs, n_inputs, &call, &err);
    char descs[512];
    op_test_describe_inputs(call.op, inputs, n_inputs, descs, sizeof descs);
    const char *params = params_json ? params_json : "none";
    ck_assert_msg(r == code, "%s(%s) params %s: got %d (%s: %s), want %d on %s", op_name, descs,
                  params, r, err.field, err.message, code, field);
    ck_assert_msg(strcmp(err.field, field) == 0, "%s(%s) params %s: field '%s', want '%s' (%s)",
                  op_name, descs, params, err.field, field, err.message);
    ck_assert_msg(err.message[0] != '\0', "%s(%s) params %s: no message for %s", op_name, descs,
                  params, field);
}

void op_test_run_call(const op_call_t *call, const void *const in[], void *const out[])
{
    for (int j = 0; j < call->n_out; j++)
        if (out[j]) memset(out[j], 0xa5, tensor_desc_bytes(&call->out[j]));
    op_error_t err = {0};
    int r = call->op->run_cpu(call, in, out, &err);
    ck_assert_msg(r == 0, "%s run_cpu gave %d (%s: %s)", call->op->name, r, err.field, err.message);
}

void op_test_run(const char *op_name, const char *params_json, const tensor_desc_t *const inputs[],
                 const void *const data[], int n_inputs, void *const out[])
{
    op_call_t call;
    op_test_validate_ok(op_name, params_json, inputs, n_inputs, &call);
    op_test_run_call(&call, data, out);
}

int op_test_run_suite(Suite *s)
{
    return run_suite(s);
}
