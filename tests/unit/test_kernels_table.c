/* The op table's support query: every op the table lists runs on the CPU, on CUDA exactly
 * when this build has its CUDA implementation, and an op without an implementation for a
 * backend is reported unsupported there. */
#include <check.h>
#include <stdlib.h>

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

int main(void)
{
    Suite *s = suite_create("kernels_table");
    TCase *tc = tcase_create("supports");
    tcase_add_test(tc, test_every_listed_op_runs_on_the_cpu);
    tcase_add_test(tc, test_cuda_support_follows_the_build);
    tcase_add_test(tc, test_an_op_without_an_implementation_is_unsupported_there);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
