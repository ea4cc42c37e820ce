# The sort and gemm ops: CPU tests (CI) and GPU tests against the CPU reference.
gj_test(test_kernels_sort SOURCES test_kernels_sort.c LIBS gj_op_test)
gj_test(test_kernels_gemm SOURCES test_kernels_gemm.c LIBS gj_op_test)
if(GPUJOB_WITH_CUDA)
  gj_test(test_gpu_sort SOURCES test_gpu_sort.c LIBS gj_gpu_support GPU)
  gj_test(test_gpu_gemm SOURCES test_gpu_gemm.c LIBS gj_gpu_support GPU)
endif()
