/* GPU gauges for /metrics: utilisation, memory used and total, temperature and power of each
 * device the CUDA backend runs, sampled by one thread of their own into a snapshot that any
 * thread may copy.
 *
 * The readings come from NVML, which the driver ships as libnvidia-ml.so.1 where GPUs are but
 * for which our build machines have no header or stub: the library is loaded at run time
 * (dlopen) with the few declarations this module needs. Without it, or for a device NVML does
 * not know by its UUID, memory comes from a fallback the caller supplies (what the CUDA
 * backend's workers last read with cudaMemGetInfo) and the other readings are left out, never
 * made up.
 *
 * Plain C: no CUDA or NVML header, so that it builds and is tested on machines with neither. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* Room for "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" and for MIG identifiers. */
#define GPU_METRICS_UUID_SIZE 96

typedef struct gpu_metrics gpu_metrics_t;

/* A device to sample: its CUDA ordinal and its UUID as CUDA and NVML spell it. */
typedef struct gpu_metrics_device {
    int index;
    char uuid[GPU_METRICS_UUID_SIZE];
} gpu_metrics_device_t;

/* Which readings of a sample are real; the others are zero and must not be reported. */
enum {
    GPU_SAMPLE_UTILIZATION = 1 << 0,
    GPU_SAMPLE_MEMORY = 1 << 1,
    GPU_SAMPLE_TEMPERATURE = 1 << 2,
    GPU_SAMPLE_POWER = 1 << 3,
};

/* One device's readings at one instant. */
typedef struct gpu_sample {
    int index;
    char uuid[GPU_METRICS_UUID_SIZE];
    unsigned valid;           /* GPU_SAMPLE_* bits */
    const char *source;       /* where memory came from: "nvml", "cuda", or "none"; static */
    unsigned utilization_pct; /* of the last sample period the GPU was busy, 0..100 */
    uint64_t memory_used, memory_total; /* bytes */
    int temperature_c;
    double power_w;
} gpu_sample_t;

/* The device's free and total memory in bytes, for devices NVML cannot read. Called on the
 * sampler thread only. 0, or a negative errno (memory is then reported unavailable). */
typedef int (*gpu_memory_fallback_fn)(int index, uint64_t *ret_free, uint64_t *ret_total, void *ud);

/* Loads NVML if it can (logging once, at info level, where the readings will come from) and
 * starts the sampler thread, which takes a sample at once and then every interval_ms. The n
 * devices are copied; fallback (may be NULL) and ud must stay valid until gpu_metrics_stop().
 * 0, -EINVAL (no device, or interval_ms <= 0), -ENOMEM, or the error of pthread_create. */
int gpu_metrics_start(const gpu_metrics_device_t *devices, int n, int interval_ms,
                      gpu_memory_fallback_fn fallback, void *ud, gpu_metrics_t **ret);
/* Wakes the sampler, joins it (promptly: it never sleeps through a stop), unloads NVML and
 * frees everything. Accepts NULL. */
void gpu_metrics_stop(gpu_metrics_t *m);

/* Devices sampled: the size of the array gpu_metrics_snapshot() may fill. */
int gpu_metrics_device_count(const gpu_metrics_t *m);
/* Copies the latest sample of up to max devices into out; safe from any thread. Returns the
 * number copied: 0 until the first sample is taken. */
int gpu_metrics_snapshot(gpu_metrics_t *m, gpu_sample_t *out, int max);

/* Renders samples as Prometheus text: for each gauge that at least one sample has, its
 * "# HELP" and "# TYPE" lines once, then one line per device that has it, labelled
 * {device="INDEX",uuid="UUID"}. Gauges: gpujobd_gpu_utilization_ratio (0..1),
 * gpujobd_gpu_memory_used_bytes, gpujobd_gpu_memory_total_bytes,
 * gpujobd_gpu_temperature_celsius, gpujobd_gpu_power_watts. A new string (free() it), "" when
 * there is nothing to report; NULL when out of memory. */
char *gpu_metrics_format_prometheus(const gpu_sample_t *samples, int n);
