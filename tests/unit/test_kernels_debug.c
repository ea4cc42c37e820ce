/* CPU tests of the test-only ops debug_sleep and debug_fault: hidden from the op table until
 * op_table_enable_test_ops(true), debug_sleep copies x in any dtype and shape and takes at least
 * params.ms, debug_fault fails with its message, neither batches, and bad params name their
 * field. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/debug.h"
#include "support/op_test.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* True when op_at() lists the op named name among the first op_count() entries. */
static bool listed(const char *name)
{
    for (int i = 0; i < op_count(); i++)
        if (strcmp(op_at(i)->name, name) == 0) return true;
    return false;
}

START_TEST(test_test_ops_are_hidden_unless_enabled)
{
    op_table_enable_test_ops(false);
    int n_public = op_count();
    ck_assert_ptr_null(op_find("debug_sleep"));
    ck_assert_ptr_null(op_find("debug_fault"));
    ck_assert(!listed("debug_sleep") && !listed("debug_fault"));
    ck_assert_ptr_null(op_at(n_public));
    for (int i = 0; i < n_public; i++)
        ck_assert_msg(!op_at(i)->test_only, "op %s is test-only but listed", op_at(i)->name);
    const op_def_t *first = op_at(0);

    op_table_enable_test_ops(true);
    ck_assert_int_eq(op_count(), n_public + 2);
    ck_assert_ptr_eq(op_find("debug_sleep"), &op_debug_sleep);
    ck_assert_ptr_eq(op_find("debug_fault"), &op_debug_fault);
    ck_assert(listed("debug_sleep") && listed("debug_fault"));
    /* The other ops keep their places: the test-only ones come after them. */
    ck_assert_ptr_eq(op_at(0), first);
    ck_assert(op_debug_sleep.test_only && op_debug_fault.test_only);

    op_table_enable_test_ops(false);
    ck_assert_int_eq(op_count(), n_public);
    ck_assert_ptr_null(op_find("debug_sleep"));
    ck_assert_ptr_nonnull(op_find("add"));
}
END_TEST

START_TEST(test_debug_sleep_copies_x_in_any_dtype_and_shape)
{
    op_table_enable_test_ops(true);
    const tensor_desc_t descs[] = {
        td(DTYPE_F32, 2, 3),  td(DTYPE_I8, 5),           td(DTYPE_F64),
        td(DTYPE_BF16, 0, 4), td(DTYPE_I64, 1, 2, 1, 3),
    };
    for (size_t k = 0; k < sizeof descs / sizeof descs[0]; k++) {
        const tensor_desc_t *in[1] = {&descs[k]};
        op_call_t call;
        op_test_validate_ok("debug_sleep", "{\"ms\": 0}", in, 1, &call);
        ck_assert_int_eq(call.n_out, 1);
        ck_assert_str_eq(call.out_names[0], "out");
        ck_assert(tensor_desc_equal(&call.out[0], &descs[k]));
        ck_assert_str_eq(call.batch_key, "");
        size_t bytes = tensor_desc_bytes(&descs[k]);
        unsigned char *x = malloc(bytes + 1), *out = malloc(bytes + 1);
        for (size_t i = 0; i < bytes; i++)
            x[i] = (unsigned char)(i * 37 + k);
        op_test_run_call(&call, (const void *[]){x}, (void *[]){out});
        ck_assert_msg(bytes == 0 || memcmp(x, out, bytes) == 0, "case %zu: out differs from x", k);
        free(x);
        free(out);
    }
}
END_TEST

START_TEST(test_debug_sleep_takes_at_least_ms_on_the_cpu)
{
    op_table_enable_test_ops(true);
    const int ms = 120;
    float x[4] = {1, -2, 3.5f, 0}, out[4];
    tensor_desc_t d = td(DTYPE_F32, 4);
    double t0 = now_s();
    op_test_run("debug_sleep", "{\"ms\": 120}", (const tensor_desc_t *[]){&d}, (const void *[]){x},
                1, (void *[]){out});
    double elapsed = now_s() - t0;
    ck_assert_mem_eq(out, x, sizeof x);
    ck_assert_msg(elapsed >= ms / 1000.0, "debug_sleep of %d ms returned after %.3f s", ms,
                  elapsed);
    ck_assert_msg(elapsed < ms / 1000.0 + 2.0, "debug_sleep of %d ms took %.3f s", ms, elapsed);
}
END_TEST

START_TEST(test_debug_fault_fails_on_the_cpu_with_its_message)
{
    op_table_enable_test_ops(true);
    tensor_desc_t d = td(DTYPE_I32, 3);
    op_call_t call;
    op_test_validate_ok("debug_fault", NULL, (const tensor_desc_t *[]){&d}, 1, &call);
    ck_assert_int_eq(call.n_out, 1);
    ck_assert(tensor_desc_equal(&call.out[0], &d));
    ck_assert_str_eq(call.batch_key, "");
    int32_t x[3] = {1, 2, 3}, out[3];
    op_error_t err = {0};
    int r = call.op->run_cpu(&call, (const void *[]){x}, (void *[]){out}, &err);
    ck_assert_int_lt(r, 0);
    ck_assert_str_eq(err.message, "debug_fault: injected fault");
}
END_TEST

/* The longest sleep stops at its first look at a cancel flag that is set: the suite's timeout,
 * far below the sleep, fails the test otherwise. Without a flag, or with one that stays clear,
 * a short sleep runs to its end. */
START_TEST(test_debug_sleep_stops_early_once_cancelled)
{
    op_table_enable_test_ops(true);
    tensor_desc_t d = td(DTYPE_F32, 2);
    op_call_t call;
    op_test_validate_ok("debug_sleep", "{\"ms\": 60000}", (const tensor_desc_t *[]){&d}, 1, &call);
    bool cancelled = true;
    call.cancel = &cancelled;
    float x[2] = {1, 2}, out[2];
    op_error_t err = {0};
    ck_assert_int_eq(call.op->run_cpu(&call, (const void *[]){x}, (void *[]){out}, &err),
                     -ECANCELED);
    ck_assert_int_gt(strlen(err.message), 0);

    op_test_validate_ok("debug_sleep", "{\"ms\": 30}", (const tensor_desc_t *[]){&d}, 1, &call);
    cancelled = false;
    call.cancel = &cancelled;
    ck_assert_int_eq(call.op->run_cpu(&call, (const void *[]){x}, (void *[]){out}, &err), 0);
    ck_assert(out[0] == 1 && out[1] == 2);
}
END_TEST

START_TEST(test_bad_params_name_their_field)
{
    op_table_enable_test_ops(true);
    tensor_desc_t d = td(DTYPE_F32, 2);
    const tensor_desc_t *in[1] = {&d};
    static const char *const bad_ms[] = {NULL,
                                         "{}",
                                         "{\"ms\": null}",
                                         "{\"ms\": -1}",
                                         "{\"ms\": 60001}",
                                         "{\"ms\": 1.5}",
                                         "{\"ms\": \"10\"}",
                                         "{\"ms\": true}",
                                         "{\"ms\": [10]}"};
    for (size_t i = 0; i < sizeof bad_ms / sizeof bad_ms[0]; i++)
        op_test_expect_error("debug_sleep", bad_ms[i], in, 1, -EINVAL, "params.ms");
    op_test_expect_error("debug_sleep", "{\"ms\": 1, \"seconds\": 1}", in, 1, -EINVAL,
                         "params.seconds");
    op_test_expect_error("debug_fault", "{\"ms\": 1}", in, 1, -EINVAL, "params.ms");
    op_call_t call;
    op_test_validate_ok("debug_sleep", "{\"ms\": 60000}", in, 1, &call);
    ck_assert_int_eq(OP_PARAMS(&call, debug_params_t)->ms, DEBUG_SLEEP_MAX_MS);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kernels_debug");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, test_test_ops_are_hidden_unless_enabled);
    tcase_add_test(tc, test_debug_sleep_copies_x_in_any_dtype_and_shape);
    tcase_add_test(tc, test_debug_sleep_takes_at_least_ms_on_the_cpu);
    tcase_add_test(tc, test_debug_fault_fails_on_the_cpu_with_its_message);
    tcase_add_test(tc, test_debug_sleep_stops_early_once_cancelled);
    tcase_add_test(tc, test_bad_params_name_their_field);
    suite_add_tcase(s, tc);
    return op_test_run_suite(s);
}
