# End-to-end suites: each starts the real gpujobd (GPUJOBD_BIN, set by gj_test) on the CPU
# backend with a temp state dir and talks HTTP to it.
gj_test(test_e2e_jobs SOURCES test_e2e_jobs.c support/daemon_harness.c
        LIBS gpujobd_core PkgConfig::CURL)
gj_test(test_e2e_restart SOURCES test_e2e_restart.c support/daemon_harness.c
        LIBS gpujobd_core PkgConfig::CURL)
gj_test(test_e2e_bad_input SOURCES test_e2e_bad_input.c support/daemon_harness.c
        LIBS gpujobd_core PkgConfig::CURL)
# The jobs and restart suites again on a store of four shards (store.h).
foreach(suite test_e2e_jobs test_e2e_restart)
  add_test(NAME ${suite}_sharded COMMAND ${suite})
  set_tests_properties(${suite}_sharded PROPERTIES TIMEOUT 900
    ENVIRONMENT "GPUJOBD_BIN=$<TARGET_FILE:gpujobd>;GPUJOB_SOURCE_DIR=${PROJECT_SOURCE_DIR};GPUJOB_E2E_SHARDS=4")
endforeach()
# The binary under test must be built before the suites run.
add_dependencies(test_e2e_jobs gpujobd)
add_dependencies(test_e2e_restart gpujobd)
add_dependencies(test_e2e_bad_input gpujobd)

# The daemon on its CUDA backend (label gpu; skipped without a GPU).
if(GPUJOB_WITH_CUDA)
  gj_test(test_gpu_daemon SOURCES test_gpu_daemon.c support/daemon_harness.c
          support/gpu_daemon.c LIBS gpujobd_core gj_gpu_support PkgConfig::CURL GPU)
  add_dependencies(test_gpu_daemon gpujobd)
  # Placement, pinning, resident buffers and a fault across two GPUs (skipped with fewer).
  gj_test(test_gpu_multi SOURCES test_gpu_multi.c support/daemon_harness.c support/gpu_daemon.c
          LIBS gpujobd_core gj_gpu_support PkgConfig::CURL GPU)
  add_dependencies(test_gpu_multi gpujobd)
endif()
