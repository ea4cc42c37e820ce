# conv2d: the CPU reference and validation (CI), and the CUDA implementation against it (GPU).
gj_test(test_kernels_conv2d SOURCES test_kernels_conv2d.c LIBS gj_op_test)
if(GPUJOB_WITH_CUDA)
  gj_test(test_gpu_conv2d SOURCES test_gpu_conv2d.c LIBS gj_gpu_support GPU)
endif()
