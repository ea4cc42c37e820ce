# The elementwise, reduction and quantization ops (kernels/elementwise, reduce, quantize).
gj_test(test_kernels_elementwise SOURCES test_kernels_elementwise.c LIBS gj_op_test)
gj_test(test_kernels_reduce SOURCES test_kernels_reduce.c LIBS gj_op_test)
gj_test(test_kernels_quantize SOURCES test_kernels_quantize.c LIBS gj_op_test)
if(GPUJOB_WITH_CUDA)
  gj_test(test_gpu_elementwise SOURCES test_gpu_elementwise.c LIBS gj_gpu_support GPU)
endif()
