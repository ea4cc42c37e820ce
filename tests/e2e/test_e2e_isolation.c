/* No job reads another's bytes, on the CPU backend: after one user's jobs have filled the
 * worker's heap with a marker pattern, another user's jobs of every op on degenerate and
 * partial shapes get outputs with no byte of the marker and exactly their expected values
 * (support/isolation_cases.h has the cases; tests/gpu/test_gpu_isolation.c runs the same on
 * CUDA). */
#include <check.h>
#include <stdlib.h>

#include "support/daemon_harness.h"
#include "support/isolation_cases.h"

/* One CPU worker: the phase-2 outputs are allocated by the thread whose heap the marker jobs
 * filled and freed. Whether a given output lands on marker bytes is up to the allocator,
 * though, so the daemon also runs with jemalloc's junk filling (its allocator unless built
 * with GPUJOB_JEMALLOC=OFF): every block it hands out then starts as 0xa5 bytes, the marker,
 * and an op that leaves any output byte unwritten is caught every time. */
START_TEST(test_no_output_carries_bytes_of_an_earlier_users_jobs)
{
    iso_env_t env;
    iso_env_init(&env, "[scheduler]\ncpu_threads = 1\n");
    ck_assert_int_eq(ISO_MARKER_BYTE, 0xa5); /* jemalloc's junk byte for new blocks */
    setenv("MALLOC_CONF", "junk:alloc", 1);  /* read by the daemon's allocator only */
    e2e_daemon_t *d = e2e_daemon_start_ok(env.config);
    unsetenv("MALLOC_CONF");
    iso_check_daemon(d, &env);
    e2e_daemon_free(d);
    iso_env_done(&env);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_isolation");
    TCase *tc = tcase_create("isolation");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_no_output_carries_bytes_of_an_earlier_users_jobs);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
