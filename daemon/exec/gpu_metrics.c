/* GPU gauges: NVML loaded at run time, a sampler thread, and the Prometheus rendering.
 *
 * The sampler thread alone loads NVML, looks the devices up and reads them; the other threads
 * only copy the latest snapshot, under the mutex. */
#include "executor.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "daemon/util/log.h"

#define NVML_LIBRARY "libnvidia-ml.so.1"

/* The part of nvml.h used here, as the driver's ABI defines it: nvmlReturn_t is an enum whose
 * NVML_SUCCESS is 0, nvmlDevice_t an opaque pointer, and the two structs below are laid out
 * as in the header. NVML_TEMPERATURE_GPU is the die sensor of nvmlTemperatureSensors_t. */
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlUtilization_st {
    unsigned int gpu, memory; /* percent of the last sample period */
} nvmlUtilization_t;
typedef struct nvmlMemory_st {
    unsigned long long total, free, used; /* bytes */
} nvmlMemory_t;
#define NVML_SUCCESS 0
#define NVML_TEMPERATURE_GPU 0

/* The entry points, found with dlsym; lib is NULL while NVML is not loaded. */
typedef struct nvml {
    void *lib;
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*shutdown)(void);
    const char *(*error_string)(nvmlReturn_t result);
    nvmlReturn_t (*handle_by_uuid)(const char *uuid, nvmlDevice_t *device);
    nvmlReturn_t (*utilization_rates)(nvmlDevice_t device, nvmlUtilization_t *utilization);
    nvmlReturn_t (*memory_info)(nvmlDevice_t device, nvmlMemory_t *memory);
    nvmlReturn_t (*temperature)(nvmlDevice_t device, int sensor, unsigned int *temp);
    nvmlReturn_t (*power_usage)(nvmlDevice_t device, unsigned int *milliwatts);
} nvml_t;

struct gpu_metrics {
    int n;
    gpu_metrics_device_t *devices;
    int interval_ms;
    gpu_memory_fallback_fn fallback;
    void *ud;
    pthread_t thread;

    /* The sampler thread's own. */
    nvml_t nvml;
    nvmlDevice_t *handles; /* per device; NULL where NVML does not know the device */
    gpu_sample_t *scratch; /* the sample being taken */

    pthread_mutex_t lock; /* guards what follows */
    pthread_cond_t wake;  /* signalled by gpu_metrics_stop() */
    bool stopping;
    int n_sampled;         /* 0 until the first sample, then n */
    gpu_sample_t *samples; /* the latest sample */
};

/* dlsym into a function pointer: POSIX guarantees that a data pointer from dlsym holds a
 * function's address, and copying the bytes avoids a cast that ISO C leaves undefined. */
static bool nvml_symbol(void *lib, const char *name, void *ret_fn)
{
    void *sym = dlsym(lib, name);
    if (!sym) return false;
    memcpy(ret_fn, &sym, sizeof sym);
    return true;
}

/* Loads the library, finds every entry point and initialises NVML. 0 with *nvml filled, or a
 * negative errno with why in reason and *nvml untouched. */
static int nvml_load(nvml_t *nvml, char *reason, size_t reason_size)
{
    void *lib = dlopen(NVML_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(reason, reason_size, "%s", why ? why : "cannot be loaded");
        return -ENOENT;
    }
    nvml_t n = {.lib = lib};
    const struct {
        const char *name;
        void *fn;
    } symbols[] = {
        {"nvmlInit_v2", &n.init},
        {"nvmlShutdown", &n.shutdown},
        {"nvmlErrorString", &n.error_string},
        {"nvmlDeviceGetHandleByUUID", &n.handle_by_uuid},
        {"nvmlDeviceGetUtilizationRates", &n.utilization_rates},
        {"nvmlDeviceGetMemoryInfo", &n.memory_info},
        {"nvmlDeviceGetTemperature", &n.temperature},
        {"nvmlDeviceGetPowerUsage", &n.power_usage},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++)
        if (!nvml_symbol(lib, symbols[i].name, symbols[i].fn)) {
            snprintf(reason, reason_size, "%s has no %s", NVML_LIBRARY, symbols[i].name);
            dlclose(lib);
            return -ENOENT;
        }
    nvmlReturn_t r = n.init();
    if (r != NVML_SUCCESS) {
        snprintf(reason, reason_size, "nvmlInit_v2: %s", n.error_string(r));
        dlclose(lib);
        return -EIO;
    }
    *nvml = n;
    return 0;
}

static void nvml_unload(nvml_t *nvml)
{
    if (!nvml->lib) return;
    nvml->shutdown();
    dlclose(nvml->lib);
    nvml->lib = NULL;
}

/* Loads NVML and finds each device's handle, logging once where the readings will come from. */
static void sampler_open(gpu_metrics_t *m)
{
    char reason[256] = "";
    if (nvml_load(&m->nvml, reason, sizeof reason) < 0) {
        log_info("gpu metrics: NVML unavailable (%s): memory from CUDA, no utilisation, "
                 "temperature or power; sampled every %d ms",
                 reason, m->interval_ms);
        return;
    }
    int found = 0;
    for (int i = 0; i < m->n; i++) {
        nvmlReturn_t r = m->nvml.handle_by_uuid(m->devices[i].uuid, &m->handles[i]);
        if (r == NVML_SUCCESS) {
            found++;
            continue;
        }
        m->handles[i] = NULL;
        log_info("gpu metrics: gpu %d ('%s') not found by NVML (%s): memory from CUDA, no "
                 "utilisation, temperature or power",
                 m->devices[i].index, m->devices[i].uuid, m->nvml.error_string(r));
    }
    log_info("gpu metrics: %d of %d GPUs read through NVML (%s), sampled every %d ms", found, m->n,
             NVML_LIBRARY, m->interval_ms);
}

/* Reads device i into s: from NVML what it answers, memory from the fallback when NVML did
 * not give it. A reading NVML refuses (NOT_SUPPORTED on some boards) is left out. */
static void sample_device(gpu_metrics_t *m, int i, gpu_sample_t *s)
{
    memset(s, 0, sizeof *s);
    s->index = m->devices[i].index;
    memcpy(s->uuid, m->devices[i].uuid, sizeof s->uuid);
    s->source = "none";
    nvmlDevice_t h = m->nvml.lib ? m->handles[i] : NULL;
    if (h) {
        nvmlUtilization_t util;
        nvmlMemory_t mem;
        unsigned int temp = 0, milliwatts = 0;
        if (m->nvml.utilization_rates(h, &util) == NVML_SUCCESS) {
            s->utilization_pct = util.gpu > 100 ? 100 : util.gpu;
            s->valid |= GPU_SAMPLE_UTILIZATION;
        }
        if (m->nvml.memory_info(h, &mem) == NVML_SUCCESS) {
            s->memory_used = mem.used;
            s->memory_total = mem.total;
            s->source = "nvml";
            s->valid |= GPU_SAMPLE_MEMORY;
        }
        if (m->nvml.temperature(h, NVML_TEMPERATURE_GPU, &temp) == NVML_SUCCESS) {
            s->temperature_c = (int)temp;
            s->valid |= GPU_SAMPLE_TEMPERATURE;
        }
        if (m->nvml.power_usage(h, &milliwatts) == NVML_SUCCESS) {
            s->power_w = milliwatts / 1000.0;
            s->valid |= GPU_SAMPLE_POWER;
        }
    }
    if (!(s->valid & GPU_SAMPLE_MEMORY) && m->fallback) {
        uint64_t free_b = 0, total_b = 0;
        int r = m->fallback(s->index, &free_b, &total_b, m->ud);
        if (r >= 0 && free_b <= total_b) {
            s->memory_used = total_b - free_b;
            s->memory_total = total_b;
            s->source = "cuda";
            s->valid |= GPU_SAMPLE_MEMORY;
        } else {
            log_debug("gpu metrics: gpu %d: no memory reading: %s", s->index,
                      r < 0 ? strerror(-r) : "free exceeds total");
        }
    }
}

static void *sampler_main(void *arg)
{
    gpu_metrics_t *m = arg;
    prctl(PR_SET_NAME, "gj-metrics");
    sampler_open(m);
    pthread_mutex_lock(&m->lock);
    while (!m->stopping) {
        pthread_mutex_unlock(&m->lock);
        for (int i = 0; i < m->n; i++)
            sample_device(m, i, &m->scratch[i]);
        pthread_mutex_lock(&m->lock);
        memcpy(m->samples, m->scratch, (size_t)m->n * sizeof *m->samples);
        m->n_sampled = m->n;

        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += m->interval_ms / 1000;
        deadline.tv_nsec += (long)(m->interval_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
        while (!m->stopping && pthread_cond_timedwait(&m->wake, &m->lock, &deadline) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&m->lock);
    nvml_unload(&m->nvml);
    return NULL;
}

static void metrics_free(gpu_metrics_t *m)
{
    free(m->devices);
    free(m->handles);
    free(m->scratch);
    free(m->samples);
    free(m);
}

int gpu_metrics_start(const gpu_metrics_device_t *devices, int n, int interval_ms,
                      gpu_memory_fallback_fn fallback, void *ud, gpu_metrics_t **ret)
{
    if (!devices || n <= 0 || interval_ms <= 0 || !ret) return -EINVAL;
    gpu_metrics_t *m = calloc(1, sizeof *m);
    if (!m) return -ENOMEM;
    m->n = n;
    m->interval_ms = interval_ms;
    m->fallback = fallback;
    m->ud = ud;
    m->devices = calloc((size_t)n, sizeof *m->devices);
    m->handles = calloc((size_t)n, sizeof *m->handles);
    m->scratch = calloc((size_t)n, sizeof *m->scratch);
    m->samples = calloc((size_t)n, sizeof *m->samples);
    if (!m->devices || !m->handles || !m->scratch || !m->samples) {
        metrics_free(m);
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        m->devices[i].index = devices[i].index;
        snprintf(m->devices[i].uuid, sizeof m->devices[i].uuid, "%s", devices[i].uuid);
    }

    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&m->wake, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&m->lock, NULL);
    int r = pthread_create(&m->thread, NULL, sampler_main, m);
    if (r != 0) {
        pthread_cond_destroy(&m->wake);
        pthread_mutex_destroy(&m->lock);
        metrics_free(m);
        return -r;
    }
    *ret = m;
    return 0;
}

void gpu_metrics_stop(gpu_metrics_t *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->lock);
    m->stopping = true;
    pthread_cond_signal(&m->wake);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->thread, NULL);
    pthread_cond_destroy(&m->wake);
    pthread_mutex_destroy(&m->lock);
    metrics_free(m);
}

int gpu_metrics_device_count(const gpu_metrics_t *m)
{
    return m ? m->n : 0;
}

int gpu_metrics_snapshot(gpu_metrics_t *m, gpu_sample_t *out, int max)
{
    if (!m || !out || max <= 0) return 0;
    pthread_mutex_lock(&m->lock);
    int n = m->n_sampled < max ? m->n_sampled : max;
    memcpy(out, m->samples, (size_t)n * sizeof *out);
    pthread_mutex_unlock(&m->lock);
    return n;
}

/* Writes s as a Prometheus label value: backslash, double quote and newline escaped. */
static void write_label_value(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            fprintf(out, "\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", out);
        else
            fputc(*s, out);
    }
}

/* The gauges, in the order they are rendered. */
typedef enum gauge {
    GAUGE_UTILIZATION,
    GAUGE_MEMORY_USED,
    GAUGE_MEMORY_TOTAL,
    GAUGE_TEMPERATURE,
    GAUGE_POWER,
    GAUGE_COUNT,
} gauge_t;

static const struct {
    const char *name, *help;
    unsigned valid; /* the GPU_SAMPLE_* bit a sample needs for it */
} gauges[GAUGE_COUNT] = {
    [GAUGE_UTILIZATION] = {"gpujobd_gpu_utilization_ratio",
                           "Fraction of the last sample period in which a kernel ran on the GPU.",
                           GPU_SAMPLE_UTILIZATION},
    [GAUGE_MEMORY_USED] = {"gpujobd_gpu_memory_used_bytes",
                           "Device memory not free, by any process, the driver's reserve included.",
                           GPU_SAMPLE_MEMORY},
    [GAUGE_MEMORY_TOTAL] = {"gpujobd_gpu_memory_total_bytes", "Device memory in all.",
                            GPU_SAMPLE_MEMORY},
    [GAUGE_TEMPERATURE] = {"gpujobd_gpu_temperature_celsius", "GPU die temperature.",
                           GPU_SAMPLE_TEMPERATURE},
    [GAUGE_POWER] = {"gpujobd_gpu_power_watts", "Power drawn by the board.", GPU_SAMPLE_POWER},
};

static void write_value(FILE *out, const gpu_sample_t *s, gauge_t gauge)
{
    switch (gauge) {
    case GAUGE_UTILIZATION:
        fprintf(out, "%g\n", s->utilization_pct / 100.0);
        break;
    case GAUGE_MEMORY_USED:
        fprintf(out, "%llu\n", (unsigned long long)s->memory_used);
        break;
    case GAUGE_MEMORY_TOTAL:
        fprintf(out, "%llu\n", (unsigned long long)s->memory_total);
        break;
    case GAUGE_TEMPERATURE:
        fprintf(out, "%d\n", s->temperature_c);
        break;
    case GAUGE_POWER:
        fprintf(out, "%.3f\n", s->power_w);
        break;
    case GAUGE_COUNT:
        break;
    }
}

char *gpu_metrics_format_prometheus(const gpu_sample_t *samples, int n)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out) return NULL;
    for (gauge_t g = 0; g < GAUGE_COUNT; g++) {
        bool header = false;
        for (int i = 0; i < n; i++) {
            const gpu_sample_t *s = &samples[i];
            if (!(s->valid & gauges[g].valid)) continue;
            if (!header) {
                fprintf(out, "# HELP %s %s\n# TYPE %s gauge\n", gauges[g].name, gauges[g].help,
                        gauges[g].name);
                header = true;
            }
            fprintf(out, "%s{device=\"%d\",uuid=\"", gauges[g].name, s->index);
            write_label_value(out, s->uuid);
            fputs("\"} ", out);
            write_value(out, s, g);
        }
    }
    bool failed = ferror(out) != 0;
    if (fclose(out) != 0 || failed) {
        free(text);
        return NULL;
    }
    return text;
}
