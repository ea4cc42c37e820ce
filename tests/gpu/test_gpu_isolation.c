/* No job reads another's bytes, on the CUDA backend: after one user's jobs have filled the
 * device's memory pool, the pinned staging and a resident buffer with a marker pattern,
 * another user's jobs of every op on degenerate and partial shapes get outputs with no byte
 * of the marker and exactly their expected values. The cases and checks are those of
 * tests/e2e/test_e2e_isolation.c (support/isolation_cases.h), which proves them on the CPU. */
#include <check.h>
#include <stdlib.h>

#include "support/gpu_daemon.h"
#include "support/gpu_support.h"
#include "support/isolation_cases.h"

START_TEST(test_no_output_on_the_gpu_carries_bytes_of_an_earlier_users_jobs)
{
    iso_env_t env;
    iso_env_init(&env, "");
    e2e_daemon_t *d = gpu_daemon_start(env.config);
    iso_check_daemon(d, &env);
    e2e_daemon_free(d);
    iso_env_done(&env);
}
END_TEST

int main(void)
{
    gpu_require();
    Suite *s = suite_create("gpu_isolation");
    TCase *tc = tcase_create("isolation");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_no_output_on_the_gpu_carries_bytes_of_an_earlier_users_jobs);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
