/* exec_time_share: a batch's measured time shared among its jobs by cost, summing exactly to
 * the batch's time, with nothing for a job left out of the run. */
#include <check.h>
#include <stdlib.h>

#include "daemon/exec/exec_time.h"

#define N 7

static job_t jobs[N];
static job_t *ptrs[N];
static exec_batch_t batch;

static void setup(void)
{
    for (int i = 0; i < N; i++) {
        jobs[i] = (job_t){0};
        ptrs[i] = &jobs[i];
    }
    batch = (exec_batch_t){.jobs = ptrs, .n = N};
}

static int64_t shares_sum(void)
{
    int64_t sum = 0;
    for (int i = 0; i < batch.n; i++) {
        ck_assert_int_ge(jobs[i].gpu_ns, 0);
        sum += jobs[i].gpu_ns;
    }
    return sum;
}

START_TEST(test_shares_sum_to_the_batch_time_whatever_the_costs)
{
    static const int64_t totals[] = {0, 1, 6, 7, 1000003, 999999999937LL};
    for (size_t t = 0; t < sizeof totals / sizeof totals[0]; t++) {
        for (int i = 0; i < N; i++)
            jobs[i].call.cost.flops = (double)((i * 7919 + t) % 13) * 1e3;
        exec_time_share(&batch, totals[t]);
        ck_assert_int_eq(shares_sum(), totals[t]);
        for (int i = 0; i < N; i++)
            ck_assert_int_eq(jobs[i].batch_ns, totals[t]);
    }
}
END_TEST

START_TEST(test_shares_follow_cost)
{
    jobs[0].call.cost.flops = 3e6 - 1; /* weight bytes + flops + 1 */
    for (int i = 1; i < N; i++)
        jobs[i].call.cost.flops = 1e6 - 1;
    exec_time_share(&batch, 9000000);
    ck_assert_int_eq(jobs[0].gpu_ns, 3000000);
    for (int i = 1; i < N; i++)
        ck_assert_int_eq(jobs[i].gpu_ns, 1000000);
}
END_TEST

START_TEST(test_a_job_left_out_gets_nothing)
{
    jobs[2].skipped = true;
    jobs[N - 1].skipped = true;
    exec_time_share(&batch, 5000);
    ck_assert_int_eq(jobs[2].gpu_ns, 0);
    ck_assert_int_eq(jobs[N - 1].gpu_ns, 0);
    ck_assert_int_eq(jobs[0].gpu_ns, 1000);
    ck_assert_int_eq(shares_sum(), 5000);
    for (int i = 0; i < N; i++)
        jobs[i].skipped = true;
    exec_time_share(&batch, 40);
    ck_assert_int_eq(shares_sum(), 40);
    for (int i = 0; i < N - 1; i++)
        ck_assert_int_eq(jobs[i].gpu_ns, 0);
}
END_TEST

START_TEST(test_a_negative_time_counts_as_none)
{
    exec_time_share(&batch, -5);
    ck_assert_int_eq(shares_sum(), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("exec_time");
    TCase *tc = tcase_create("share");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_shares_sum_to_the_batch_time_whatever_the_costs);
    tcase_add_test(tc, test_shares_follow_cost);
    tcase_add_test(tc, test_a_job_left_out_gets_nothing);
    tcase_add_test(tc, test_a_negative_time_counts_as_none);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
