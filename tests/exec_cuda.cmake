# The CUDA backend's threads against a model of the CUDA runtime (no GPU needed): the test
# compiles daemon/exec_cuda.c itself, so gpujobd_core's copy is never linked in.
if(GPUJOB_WITH_CUDA)
  gj_test(test_exec_cuda SOURCES test_exec_cuda.c LIBS gpujobd_core)
endif()
