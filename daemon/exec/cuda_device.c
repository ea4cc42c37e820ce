/* A device's setup and teardown: its properties, the slots' streams, events, cuBLAS handles
 * and waiter threads, and its memory pool. Selected devices are set up side by side. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "daemon/util/log.h"
#include "daemon/util/restart.h"

/* Logs which step of device_setup failed, and why. */
static int setup_failed(const device_worker_t *dw, const char *step, const char *why)
{
    log_error("gpu %d: %s failed: %s", dw->device, step, why);
    return -ENODEV;
}

/* The slots' streams, events, cuBLAS handles, staging and waiters; and the device's pool. */
static int device_setup(device_worker_t *dw)
{
    cudaError_t e = cudaSetDevice(dw->device);
    dw->has_context = e == cudaSuccess;
    if (e != cudaSuccess || (e = cudaDeviceGetDefaultMemPool(&dw->pool, dw->device)) != cudaSuccess)
        return setup_failed(dw, "selecting the device and its pool", cudaGetErrorString(e));
    /* Keep freed memory in the pool up to the cap instead of returning it at every sync. */
    uint64_t threshold = dw->cap;
    cudaMemPoolSetAttribute(dw->pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    for (int k = 0; k < dw->n_slots; k++) {
        slot_t *s = &dw->slots[k];
        cublasStatus_t b;
        if ((e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess ||
            (e = cudaEventCreate(&s->start)) != cudaSuccess ||
            (e = cudaEventCreate(&s->stop)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming |
                                                        cudaEventBlockingSync)) != cudaSuccess)
            return setup_failed(dw, "creating a stream and its events", cudaGetErrorString(e));
        if ((b = cublasLtCreate(&s->lt)) != CUBLAS_STATUS_SUCCESS ||
            (b = cublasCreate(&s->blas)) != CUBLAS_STATUS_SUCCESS ||
            (b = cublasSetStream(s->blas, s->stream)) != CUBLAS_STATUS_SUCCESS)
            return setup_failed(dw, "creating the cuBLAS handles", cublasGetStatusString(b));
        if (cuda_slot_grow_pinned(s, CUDA_STAGING_MIN) < 0)
            return setup_failed(dw, "allocating a stream's pinned staging", "out of memory");
        int r = pthread_create(&s->waiter, NULL, cuda_slot_waiter, s);
        if (r != 0) return setup_failed(dw, "starting a stream's waiter thread", strerror(r));
        s->waiter_started = true;
    }
    return 0;
}

/* Undoes device_setup: after the work drained, or on a lost context, where the calls fail
 * harmlessly before the reset. */
static void device_teardown(device_worker_t *dw)
{
    if (!dw->has_context) return;
    cudaSetDevice(dw->device);
    for (int k = 0; k < dw->n_slots; k++) {
        slot_t *s = &dw->slots[k];
        if (s->stream) cudaStreamSynchronize(s->stream);
        if (s->blas) cublasDestroy(s->blas);
        if (s->lt) cublasLtDestroy(s->lt);
        if (s->start) cudaEventDestroy(s->start);
        if (s->stop) cudaEventDestroy(s->stop);
        if (s->done) cudaEventDestroy(s->done);
        if (s->stream) cudaStreamDestroy(s->stream);
        if (s->pinned) cudaFreeHost(s->pinned);
        s->blas = NULL;
        s->lt = NULL;
        s->start = s->stop = s->done = NULL;
        s->stream = NULL;
        s->pinned = NULL;
        s->pinned_size = 0;
    }
    cudaGetLastError();
}

/* The device's description and the worker's memory; no context yet (device_setup). */
int cuda_worker_init(cuda_exec_t *ex, device_worker_t *dw, int device)
{
    dw->ex = ex;
    dw->device = device;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        return -ENODEV;
    }
    snprintf(dw->name, sizeof dw->name, "%s", prop.name);
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(dw->uuid, sizeof dw->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
    dw->resets = restart_device_resets(device);
    dw->cc_major = prop.major;
    dw->cc_minor = prop.minor;
    dw->sms = prop.multiProcessorCount;
    dw->mem_total = prop.totalGlobalMem;
    dw->cap = ex->cfg->device_memory_cap ? ex->cfg->device_memory_cap
                                         : (size_t)(0.9 * (double)prop.totalGlobalMem);
    dw->n_slots = ex->cfg->streams_per_device > 0 ? ex->cfg->streams_per_device : 1;
    dw->slots = calloc((size_t)dw->n_slots, sizeof *dw->slots);
    dw->q_cap = 2 * dw->n_slots;
    dw->queue = calloc((size_t)dw->q_cap, sizeof *dw->queue);
    dw->upload = cuda_upload_staging_new();
    if (!dw->slots || !dw->queue || !dw->upload) {
        cuda_upload_staging_free(dw->upload);
        dw->upload = NULL;
        free(dw->slots);
        dw->slots = NULL; /* nothing for cuda_worker_release to tear down */
        return -ENOMEM;
    }
    for (int k = 0; k < dw->n_slots; k++) {
        dw->slots[k] = (slot_t){.dw = dw, .ex = ex, .device = device};
        pthread_cond_init(&dw->slots[k].wake, NULL);
    }
    return 0;
}

/* Stops the waiters, undoes device_setup and frees what cuda_worker_init allocated. */
void cuda_worker_release(device_worker_t *dw)
{
    if (dw->slots) {
        cuda_waiters_stop(dw);
        device_teardown(dw);
        for (int k = 0; k < dw->n_slots; k++) {
            free(dw->slots[k].used);
            pthread_cond_destroy(&dw->slots[k].wake);
        }
    }
    cuda_residents_free(dw);
    cuda_upload_staging_free(dw->upload);
    dw->upload = NULL;
    free(dw->slots);
    free(dw->queue);
    dw->slots = NULL;
}

/* Sets one device up, on a thread of its own; the result in dw->setup_rc. */
static void *setup_thread(void *arg)
{
    device_worker_t *dw = arg;
    dw->setup_rc = device_setup(dw);
    if (dw->setup_rc == 0) cuda_refresh_memory(dw);
    return NULL;
}

/* Sets the selected devices up side by side: with eager module loading a context takes
 * seconds, which a restart after a fault pays again. Devices that fail are dropped from
 * ex->devices. */
void cuda_devices_setup(cuda_exec_t *ex)
{
    if (ex->n_devices == 0) return;
    pthread_t threads[ex->n_devices];
    bool started[ex->n_devices];
    for (int d = 0; d < ex->n_devices; d++) {
        started[d] = pthread_create(&threads[d], NULL, setup_thread, &ex->devices[d]) == 0;
        if (!started[d]) setup_thread(&ex->devices[d]);
    }
    for (int d = 0; d < ex->n_devices; d++)
        if (started[d]) pthread_join(threads[d], NULL);
    int kept = 0;
    for (int d = 0; d < ex->n_devices; d++) {
        device_worker_t *dw = &ex->devices[d];
        if (dw->setup_rc < 0) {
            log_error("gpu %d: initialisation failed: %s", dw->device, strerror(-dw->setup_rc));
            cuda_worker_release(dw);
            continue;
        }
        log_info("gpu %d: %s (%s), compute %d.%d, %d SMs, %.1f GiB, pool cap %.1f GiB, %d "
                 "streams",
                 dw->device, dw->name, dw->uuid, dw->cc_major, dw->cc_minor, dw->sms,
                 (double)dw->mem_total / (1 << 30), (double)dw->cap / (1 << 30), dw->n_slots);
        if (kept != d) {
            ex->devices[kept] = *dw;
            for (int k = 0; k < dw->n_slots; k++)
                ex->devices[kept].slots[k].dw = &ex->devices[kept];
            memset(dw, 0, sizeof *dw);
        }
        kept++;
    }
    ex->n_devices = kept;
}

/* Parses cfg->devices ("all", or a comma list of ordinals or UUIDs) against what is present. */
bool cuda_device_selected(const char *spec, int ordinal, const char *uuid)
{
    if (strcmp(spec, "all") == 0) return true;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if ((*end == '\0' && v == ordinal) || strcmp(tok, uuid) == 0) return true;
    }
    return false;
}

int cuda_device_count(void)
{
    /* Before the process's first CUDA call. Loaded lazily (CUDA's default), a kernel's first
     * launch waits until every kernel running on the device has finished, even on another
     * stream, so the first use of an op, or of a GEMM shape's cuBLAS kernel, would stall behind
     * the longest job. Eager loading costs seconds at start and some device memory (cuBLAS's
     * kernels), once. An administrator's own CUDA_MODULE_LOADING wins. */
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}
