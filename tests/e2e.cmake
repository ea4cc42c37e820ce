# End-to-end suites: each starts the real gpujobd (GPUJOBD_BIN, set by gj_test) on the CPU
# backend with a temp state dir and talks HTTP to it.
gj_test(test_e2e_jobs SOURCES test_e2e_jobs.c support/daemon_harness.c
        LIBS gpujobd_core PkgConfig::CURL)
gj_test(test_e2e_restart SOURCES test_e2e_restart.c support/daemon_harness.c
        LIBS gpujobd_core PkgConfig::CURL)
gj_test(test_e2e_bad_input SOURCES test_e2e_bad_input.c support/daemon_harness.c
        LIBS gpujobd_core PkgConfig::CURL)
# The binary under test must be built before the suites run.
add_dependencies(test_e2e_jobs gpujobd)
add_dependencies(test_e2e_restart gpujobd)
add_dependencies(test_e2e_bad_input gpujobd)
