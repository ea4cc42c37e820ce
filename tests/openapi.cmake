# The daemon's answers checked against api/openapi.yaml: a python3 test (PyYAML and jsonschema,
# installed by scripts/deps.sh) that starts the real gpujobd on the CPU backend, sends every
# documented operation at least one request that succeeds and one for each documented error
# status it can provoke, and validates status, Content-Type, headers and JSON bodies. It exits
# 77 (skipped) only when a python module is missing.
add_test(NAME test_openapi_conformance
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_openapi_conformance.py)
set_tests_properties(test_openapi_conformance PROPERTIES
  SKIP_RETURN_CODE 77
  TIMEOUT 120
  ENVIRONMENT "GPUJOBD_BIN=$<TARGET_FILE:gpujobd>;GPUJOB_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
