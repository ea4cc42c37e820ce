/* The end of a Check test program's main(). */
#pragma once

#include <check.h>
#include <stdlib.h>

/* Runs every test of suite s (which it frees) and returns the exit status of the test program:
 * EXIT_SUCCESS when none failed. */
static inline int run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* run_suite() in this one process (CK_NOFORK): for the GPU suites, whose CUDA context is made
 * once, before any fork could break it. */
static inline int run_suite_nofork(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
