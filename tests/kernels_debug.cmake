# The test-only ops debug_sleep and debug_fault (kernels/debug): table visibility, validation
# and the CPU implementations (CI), and debug_sleep on CUDA (GPU).
gj_test(test_kernels_debug SOURCES test_kernels_debug.c LIBS gj_op_test)
if(GPUJOB_WITH_CUDA)
  gj_test(test_gpu_debug SOURCES test_gpu_debug.c LIBS gj_gpu_support gj_op_test GPU)
endif()
