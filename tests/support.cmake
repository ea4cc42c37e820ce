# Shared test support. The op catalog's CPU suites share support/op_test.c (every build).
add_library(gj_op_test STATIC support/op_test.c)
target_include_directories(gj_op_test PUBLIC ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(gj_op_test PUBLIC gpujob_kernels PkgConfig::CHECK)

# GPU helpers (CUDA builds only).
if(GPUJOB_WITH_CUDA)
  add_library(gj_gpu_support STATIC support/gpu_support.c)
  target_include_directories(gj_gpu_support PUBLIC ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(gj_gpu_support PUBLIC gpujob_kernels CUDA::cudart CUDA::cublasLt CUDA::cublas m)
endif()
