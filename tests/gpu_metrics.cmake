# The GPU gauges of /metrics (daemon/gpu_metrics.c): sampler, fallback and rendering. Runs on
# any machine: its devices are fakes that NVML, where present, does not know.
gj_test(test_gpu_metrics SOURCES test_gpu_metrics.c LIBS gpujobd_core)
