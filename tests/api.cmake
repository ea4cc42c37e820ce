# The HTTP API (api/): codecs and job JSON, and the router with its handlers driven through a
# fake scheduler and store (api_fakes.c), checked against api/openapi.yaml.
gj_test(test_api_codec SOURCES test_api_codec.c api_fakes.c LIBS gpujobd_core)
gj_test(test_api_routes SOURCES test_api_routes.c api_fakes.c LIBS gpujobd_core)
