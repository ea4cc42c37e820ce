/* The op table's support query: every op the table lists runs on the CPU, on CUDA exactly
 * when this build has its CUDA implementation, and an op without an implementation for a
 * backend is reported unsupported there. And the long CPU ops stop once cancelled
 * (op_call_t.cancel). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/op_test.h"

START_TEST(test_every_listed_op_runs_on_the_cpu)
{
    op_table_enable_test_ops(true);
    ck_assert_int_gt(op_count(), 0);
    for (int i = 0; i < op_count(); i++)
        ck_assert_msg(op_supports(op_at(i), OP_BACKEND_CPU), "%s", op_at(i)->name);
    op_table_enable_test_ops(false);
}
END_TEST

/* Validates op's call with every required input of dtype dt and the first one's rank (dims of
 * 1); *ret_field gets the error's field, "" on success. */
static void validate_with_dtype(const op_def_t *op, dtype_t dt, char ret_field[128])
{
    int64_t ones[TENSOR_MAX_DIMS] = {1, 1, 1, 1, 1, 1, 1, 1};
    tensor_desc_t desc = op_test_desc(dt, op->sig->inputs[0].min_rank, ones);
    const tensor_desc_t *in[OP_MAX_TENSORS] = {0};
    for (int j = 0; j < op->n_inputs; j++)
        if (op->required_inputs >> j & 1) in[j] = &desc;
    op_call_t call;
    op_error_t err = {0};
    int r = op_test_validate(op->name, NULL, in, op->n_inputs, &call, &err);
    snprintf(ret_field, 128, "%s", r < 0 ? err.field : "");
}

/* The signature that --print-ops prints, and api/openapi.yaml's job schemas with it, says
 * what validate() does: every public op has one, printable, and its first input's dtypes are
 * exactly those that validate() does not refuse on that input's dtype. */
START_TEST(test_every_op_signature_says_which_dtypes_validate_takes)
{
    ck_assert_int_gt(op_count(), 0);
    for (int i = 0; i < op_count(); i++) {
        const op_def_t *op = op_at(i);
        ck_assert_msg(op->sig != NULL, "%s has no signature", op->name);
        json_t *sig = op_sig_json(op);
        ck_assert_msg(sig != NULL, "%s's signature does not print", op->name);
        json_decref(sig);
        char dtype_field[128], field[128];
        snprintf(dtype_field, sizeof dtype_field, "inputs.%s.dtype", op->input_names[0]);
        for (int dt = 0; dt < DTYPE_COUNT; dt++) {
            validate_with_dtype(op, (dtype_t)dt, field);
            bool listed = op->sig->inputs[0].dtypes & OP_DTYPE_BIT(dt);
            ck_assert_msg(listed == (strcmp(field, dtype_field) != 0),
                          "%s, %s: signature %s it, validate() %s it (field '%s')", op->name,
                          dtype_name((dtype_t)dt), listed ? "lists" : "leaves out",
                          strcmp(field, dtype_field) ? "takes" : "refuses", field);
        }
    }
}
END_TEST

START_TEST(test_cuda_support_follows_the_build)
{
    op_table_enable_test_ops(true);
    for (int i = 0; i < op_count(); i++) {
#ifdef GPUJOB_WITH_CUDA
        ck_assert_msg(op_supports(op_at(i), OP_BACKEND_CUDA), "%s", op_at(i)->name);
#else
        ck_assert_msg(!op_supports(op_at(i), OP_BACKEND_CUDA), "%s", op_at(i)->name);
#endif
    }
    op_table_enable_test_ops(false);
}
END_TEST

START_TEST(test_an_op_without_an_implementation_is_unsupported_there)
{
    op_def_t cpu_only = *op_find("saxpy");
    cpu_only.run_cuda = NULL;
    ck_assert(op_supports(&cpu_only, OP_BACKEND_CPU));
    ck_assert(!op_supports(&cpu_only, OP_BACKEND_CUDA));
    op_def_t cuda_only = *op_find("saxpy");
    cuda_only.run_cpu = NULL;
    ck_assert(!op_supports(&cuda_only, OP_BACKEND_CPU));
    ck_assert(!op_supports(NULL, OP_BACKEND_CPU));
}
END_TEST

/* Runs a validated call on zeroed inputs with its cancel flag at cancelled; returns run_cpu's
 * result. */
static int run_flagged(const op_call_t *validated, int n_in, bool cancelled)
{
    op_call_t call = *validated;
    call.cancel = &cancelled;
    void *in[OP_MAX_TENSORS] = {0}, *out[OP_MAX_TENSORS] = {0};
    for (int j = 0; j < n_in; j++)
        in[j] = calloc(1, tensor_desc_bytes(&call.in[j]) + 1);
    for (int j = 0; j < call.n_out; j++)
        out[j] = calloc(1, tensor_desc_bytes(&call.out[j]) + 1);
    op_error_t err = {0};
    int r = call.op->run_cpu(&call, (const void *const *)in, out, &err);
    if (r == -ECANCELED) ck_assert_int_gt(strlen(err.message), 0);
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        free(in[j]);
        free(out[j]);
    }
    return r;
}

/* gemm, sort and conv2d look at their cancel flag between chunks of their work: set, they stop
 * with -ECANCELED before the first chunk; clear, they run to their end. */
START_TEST(test_long_cpu_ops_stop_once_cancelled)
{
    tensor_desc_t m = td(DTYPE_F32, 8, 8), x = td(DTYPE_F32, 1, 2, 8, 8),
                  w = td(DTYPE_F32, 2, 2, 3, 3);
    struct {
        const char *op;
        const tensor_desc_t *in[2];
        int n_in;
    } cases[] = {{"gemm", {&m, &m}, 2}, {"sort", {&m}, 1}, {"conv2d", {&x, &w}, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        op_call_t call;
        op_test_validate_ok(cases[i].op, NULL, cases[i].in, cases[i].n_in, &call);
        ck_assert_msg(run_flagged(&call, cases[i].n_in, true) == -ECANCELED, "%s", cases[i].op);
        ck_assert_msg(run_flagged(&call, cases[i].n_in, false) == 0, "%s", cases[i].op);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels_table");
    TCase *tc = tcase_create("supports");
    tcase_add_test(tc, test_every_listed_op_runs_on_the_cpu);
    tcase_add_test(tc, test_cuda_support_follows_the_build);
    tcase_add_test(tc, test_every_op_signature_says_which_dtypes_validate_takes);
    tcase_add_test(tc, test_an_op_without_an_implementation_is_unsupported_there);
    tcase_add_test(tc, test_long_cpu_ops_stop_once_cancelled);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
