/* Picks and creates the executor named by cfg->backend: "cuda" when built with CUDA and a GPU
 * is present (for "auto"), else "cpu". Logs which backend runs. */
#pragma once

#include "daemon/util/config.h"
#include "executor.h"
#include "gpu_metrics.h"

int backend_new(const config_t *cfg, executor_t **ret);

/* Starts the GPU gauges of /metrics for the devices a CUDA executor runs (as its describe()
 * lists them), sampled every cfg->metrics_interval_ms with memory from CUDA where NVML cannot
 * read it. *ret is NULL, and 0 returned, for the CPU backend or when the interval is 0.
 * Otherwise 0 with a new instance in *ret (stop it with gpu_metrics_stop() before the
 * executor is destroyed), or a negative errno. */
int backend_gpu_metrics_start(const config_t *cfg, executor_t *ex, gpu_metrics_t **ret);
