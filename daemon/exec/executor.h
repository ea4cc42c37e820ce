/* The executors' contract: the interface through which the scheduler hands batches of jobs to a
 * backend (the CPU worker pool, the CUDA device workers, or a test's fake) and learns that they
 * finished; the blob reader through which a backend reads input bytes; the backends and their
 * selection; and the GPU gauges of /metrics.
 *
 * The scheduler calls submit() on its loop thread; submit never blocks on the work. The
 * executor runs the batch on a thread of its own and then calls the `done` callback, from that
 * thread, exactly once per accepted batch; the one exception is a batch abandoned before it
 * started (abandon, cancel), which may be reported from within that hook, on the loop thread (the
 * scheduler's `done` writes no outputs for failed jobs and posts a message to its loop, so it
 * may be called there). The scheduler installs `done` and `done_ud` (in sched_set_executor)
 * before the first submit. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/job/job.h"
#include "daemon/util/config.h"

/* How a batch comes back when it did not run to its end through no fault of its own (its
 * device was reset). */
typedef enum exec_retry {
    EXEC_RETRY_NONE,        /* it ran: its jobs end as the executor says */
    EXEC_RETRY_UNSTARTED,   /* it never reached the device: run it again, no attempt counted */
    EXEC_RETRY_INTERRUPTED, /* it was on the device: run it again while attempts remain, else
                             * its jobs end with the error the executor set on them */
} exec_retry_t;

typedef struct exec_batch {
    int n;        /* jobs, all with the same call.batch_key (n == 1 for unbatchable calls) */
    job_t **jobs; /* borrowed from the scheduler for the batch's lifetime */
    /* Written by the executor before done(): each job's outputs (out[j].data, malloc'd) and,
     * for a job that failed, its error_code/message; plus run_device, gpu_ns and
     * batch_size. A job left with error_code "" succeeded. */
    exec_retry_t retry;
    /* When the batch started to run (mono_us(), daemon/util/id.h), 0 while it waits in the
     * executor: the watchdog's clock starts here. The executor stores it, on its own thread,
     * with exec_batch_started(); the scheduler reads it with exec_batch_started_us(). */
    int64_t started_us;
    void *sched_priv; /* the scheduler's own */
    /* The executor's own: the device memory fit() holds for the batch (held), on which device
     * (-1: the backend's one pool) and how many bytes, until the batch starts or unfit(). */
    bool held;
    int held_device;
    uint64_t held_bytes;
} exec_batch_t;

/* The batch starts to run now (any thread; atomic, so the loop may read it meanwhile). */
static inline void exec_batch_started(exec_batch_t *b, int64_t mono_now_us)
{
    __atomic_store_n(&b->started_us, mono_now_us, __ATOMIC_RELEASE);
}

/* When the batch started to run (mono_us()), or 0 while it waits in the executor. */
static inline int64_t exec_batch_started_us(const exec_batch_t *b)
{
    return __atomic_load_n(&b->started_us, __ATOMIC_ACQUIRE);
}

/* The device time that job, one of b's, has used so far, at mono_now_us (mono_us()): its
 * share, by cost as exec_time.h weighs it, of the time since b started to run (0 while b waits
 * in the executor), as the job would be charged were the batch to end now. For a job ended
 * while its launch goes on (cancelled, or failed by the watchdog). It reads only what the
 * executor does not write (the jobs' calls and b's start): the loop may call it while b runs. */
int64_t exec_job_time_so_far(const exec_batch_t *b, const job_t *job, int64_t mono_now_us);

/* What a cancel of a job in the executor did (executor_ops_t.cancel). */
typedef enum exec_cancel {
    EXEC_CANCEL_DEQUEUED, /* it had not started: it never runs */
    EXEC_CANCEL_STOPPED,  /* its worker stops it at its next check (a CPU op) */
    EXEC_CANCEL_DROPPED,  /* it runs to its end (a launched kernel, or one that had ended): its
                           * result is dropped */
} exec_cancel_t;

/* Marks the job cancelled for the executor's threads (any thread; atomic). */
static inline void exec_job_cancel(job_t *job)
{
    __atomic_store_n(&job->cancel_requested, true, __ATOMIC_RELEASE);
}

/* The job's own run begins now (any thread; atomic, so the loop may read it meanwhile). */
static inline void exec_job_run_start(job_t *job, int64_t mono_now_us)
{
    __atomic_store_n(&job->run_started_us, mono_now_us, __ATOMIC_RELEASE);
}

/* When the job's own run began (mono_us()), or 0 before. */
static inline int64_t exec_job_run_started(const job_t *job)
{
    return __atomic_load_n(&job->run_started_us, __ATOMIC_ACQUIRE);
}

/* The job's own run is over (any thread; atomic): its result stands, whatever its limit. */
static inline void exec_job_run_end(job_t *job, int64_t mono_now_us)
{
    __atomic_store_n(&job->run_ended_us, mono_now_us, __ATOMIC_RELEASE);
}

/* When the job's own run ended (mono_us()), or 0 while it runs or before. */
static inline int64_t exec_job_run_ended(const job_t *job)
{
    return __atomic_load_n(&job->run_ended_us, __ATOMIC_ACQUIRE);
}

/* Whether the job was cancelled while in the executor (exec_job_cancel). */
static inline bool exec_job_cancelled(const job_t *job)
{
    return __atomic_load_n(&job->cancel_requested, __ATOMIC_ACQUIRE);
}

/* Leaves a job cancelled before it ran out of its batch's run: it ends "cancelled" and gets no
 * share of the batch's device time (exec_time.h). Executor threads only. */
static inline void exec_job_skip(job_t *job, const char *why)
{
    job->skipped = true;
    job_set_error(job, "cancelled", "%s", why);
}

/* Whether every job of batch was cancelled (exec_job_cancel): nothing of it is left to run. */
static inline bool exec_batch_all_cancelled(const exec_batch_t *batch)
{
    for (int i = 0; i < batch->n; i++)
        if (!exec_job_cancelled(batch->jobs[i])) return false;
    return true;
}

/* The device memory a job's launch takes from its device's pool: each input's and output's
 * bytes, aligned as the CUDA backend lays them out (EXEC_MEMORY_ALIGN), but those of inputs read
 * from a buffer resident in device memory (job_t.resident_inputs), which live in memory of
 * their own, counted as their owner's resident bytes. The CPU backend's working memory counts
 * the same way. */
#define EXEC_MEMORY_ALIGN 256
uint64_t exec_job_device_bytes(const job_t *job);
/* exec_job_device_bytes summed over the batch's jobs. */
uint64_t exec_batch_device_bytes(const exec_batch_t *b);

typedef void (*exec_done_fn)(exec_batch_t *batch, void *ud);

typedef struct executor executor_t;

/* An ephemeral buffer's bytes on their way into a backend's resident copy (upload_open): the
 * part every backend shares, at the start of the backend's own state. */
typedef struct exec_upload {
    executor_t *ex;
    uint64_t nbytes;  /* the buffer's, announced at the open */
    uint64_t written; /* so far */
    int device;       /* where the copy lives; -1 on a backend without devices */
} exec_upload_t;

typedef struct executor_ops {
    const char *name;     /* "cpu", "cuda" */
    op_backend_t backend; /* which implementation of each op it runs (kernels/op.h) */
    /* Whether cancel stops a running job (the CPU's ops look at a flag between chunks of their
     * work), so that a job's time limit is kept by stopping it there; false where a launched
     * kernel runs to its end (CUDA), where a limit is kept up front, by the job's cost estimate
     * at submission, and a job that overruns it is failed with its result dropped. */
    bool stops_running;
    /* Accepts a batch; 0, or -EAGAIN when it has no free slot (try later). */
    int (*submit)(executor_t *ex, exec_batch_t *batch);
    /* Batches it could accept right now: on any device (device < 0), or on that device (for
     * jobs pinned to it; a device the backend does not have counts as free, so that submit
     * can fail the batch). */
    int (*free_slots)(executor_t *ex, int device);
    /* Describes the backend and its devices for /v1/info; a new reference. */
    json_t *(*describe)(executor_t *ex);
    /* Stops taking work, waits up to timeout_ms for running batches (their done callbacks
     * still run), then joins the threads and frees everything. */
    void (*destroy)(executor_t *ex, int timeout_ms);

    /* Resident buffers; NULL where the backend has no device memory (the CPU backend has
     * only the upload hooks and buffer_deleted, for ephemeral buffers). */
    /* The device a new resident buffer of nbytes should live on, or -1 for none. Any thread. */
    int (*place_buffer)(executor_t *ex, uint64_t nbytes);
    /* A resident buffer is stored (its row committed): the backend may load it onto its
     * device ahead of its first job. Loop thread. */
    void (*buffer_added)(executor_t *ex, const buffer_t *buf);
    /* The buffer is gone from the store: free its device copy once no launch uses it. */
    void (*buffer_deleted)(executor_t *ex, const char *id);
    /* Opens the resident copy of an ephemeral buffer of nbytes on device (place_buffer's
     * choice, -1 where the backend has none) before any of its bytes arrives, so that an
     * upload streams into it as the request brings them and is never held whole in host
     * memory on the way: device memory on the CUDA backend, fed through pinned staging, host
     * memory on the CPU one. Its memory is taken now. 0; -ENOSPC when the device has no room;
     * -EBUSY when the device's upload staging is all in use; -ENOMEM; -EIO after a device
     * error. Any thread; an upload's later calls come from one thread at a time. NULL where
     * the backend keeps no resident copies. */
    int (*upload_open)(executor_t *ex, int device, uint64_t nbytes, exec_upload_t **ret);
    /* Appends n bytes to up at offset up->written, which the caller then advances (and keeps
     * within up->nbytes). 0, or -EIO after a device error, after which up can only be
     * aborted. */
    int (*upload_write)(exec_upload_t *up, const void *data, size_t n);
    /* All of up's bytes are written: the copy becomes buffer id's resident copy, lent to the
     * jobs that read it from now on, before the buffer's row is stored (a job that finds the
     * row finds the copy); buffer_deleted() frees it. Frees up whatever the outcome. 0,
     * -ENOMEM, or -EIO after a device error. */
    int (*upload_keep)(exec_upload_t *up, const char *id);
    /* Frees up and its copy, whatever was written; accepts NULL. */
    void (*upload_abort)(exec_upload_t *up);
    /* True when device is one this backend runs jobs on. Any thread. */
    bool (*serves_device)(executor_t *ex, int device);

    /* The scheduler's watchdog gave up on an accepted batch that made no progress within its
     * bound, and has failed its jobs. The executor gets its capacity back as best it can (the
     * CPU backend starts a replacement worker; the CUDA backend resets the device as after a
     * sticky fault) and still calls done() for the batch exactly once, whenever the batch
     * returns, or never if the process restarts first; a batch that never started may be
     * reported from within abandon, each of its jobs failed with `watchdog_timeout`: until then the
     * scheduler keeps the batch's jobs, which a stuck worker may still write to. Loop thread; NULL
     * where the backend has no way to recover (the watchdog then only fails the jobs). */
    void (*abandon)(executor_t *ex, exec_batch_t *batch);
    /* The scheduler ended job, one of batch's, as cancelled (its record is stored, its waiters
     * answered): the executor frees what the job holds as soon as it can, marks it
     * (exec_job_cancel) and says what it did. Its batch-mates run on and keep their results;
     * done() still comes exactly once for the batch, maybe from within cancel when no job of a
     * batch not yet started is left to run. The scheduler drops the job's result whatever the
     * executor wrote. Loop thread; NULL where the backend can do nothing (the result is then
     * dropped when the batch returns, as for EXEC_CANCEL_DROPPED). */
    exec_cancel_t (*cancel)(executor_t *ex, exec_batch_t *batch, job_t *job);
    /* A job that cancel said it would stop (EXEC_CANCEL_STOPPED) still runs after the
     * scheduler's grace: its op does not look at its flag often enough. The executor gets the
     * worker's place back as abandon does (a replacement takes it), leaving the worker to finish
     * the job, and then its batch's other jobs, on its own and to report the batch then. True
     * when it did so; false when the job had stopped meanwhile. Loop thread; NULL where cancel
     * never answers EXEC_CANCEL_STOPPED. */
    bool (*stop_overdue)(executor_t *ex, exec_batch_t *batch, job_t *job);

    /* Device memory. The scheduler asks fit() before it hands a batch over: 0 when a device
     * it may run on has room for it now (that device and those bytes are then held for it, in
     * b->held*, until submit() takes it, which runs it there, or unfit() gives them back);
     * -ENOSPC when running batches and resident buffers hold the room it needs: it waits, in
     * the scheduler's queue; -EAGAIN when no device it may run on has a free slot; -E2BIG when
     * it needs more than the whole pool of every device it may run on: it never fits, and
     * submit() fails such a batch (`exceeds_device_memory`) should it be handed over. Loop
     * thread; NULL where nothing bounds memory. */
    int (*fit)(executor_t *ex, exec_batch_t *b);
    /* Gives back what fit() held for b, which is not handed over after all. Loop thread. */
    void (*unfit)(executor_t *ex, exec_batch_t *b);
    /* The pool that fit() bounds: its bytes on every device together (0: no bound), the
     * largest of one device in *ret_largest, and in *ret_key the configuration key that sets
     * it (a static string). Any thread; NULL where nothing bounds memory. */
    uint64_t (*memory_pool)(executor_t *ex, uint64_t *ret_largest, const char **ret_key);
} executor_ops_t;

struct executor {
    const executor_ops_t *ops;
    exec_done_fn done;
    void *done_ud;
};

/* Where a backend reads the input bytes that are not in memory: stored blobs, by their locator,
 * and uploaded buffers. Each worker thread opens a reader of its own with open() and passes it
 * to the other calls; ctx is the provider's. Errors are negative errno values. */
typedef struct exec_blob_reader {
    void *ctx;
    int (*open)(void *ctx, void **ret_rd);
    void (*close)(void *rd); /* accepts NULL */
    /* A blob's nbytes bytes, in a new malloc'd buffer. */
    int (*read)(void *rd, const char *blob, uint64_t nbytes, void **ret_data);
    /* n bytes at offset of a blob of nbytes, into dst: a large blob a piece at a time. */
    int (*read_at)(void *rd, const char *blob, uint64_t nbytes, uint64_t offset, void *dst,
                   size_t n);
    /* A buffer's descriptor and locator (its bytes too, in data, when they live in the row);
     * -ENOENT when it no longer exists. A new buffer_t: buffer_free() it. */
    int (*buffer_get)(void *rd, const char *id, buffer_t **ret);
} exec_blob_reader_t;

/* The blob reader over st (borrowed: it must outlive the backend): each open() is a store
 * reader of its own. */
struct store;
exec_blob_reader_t exec_store_blob_reader(struct store *st);

/* The CPU backend: cfg->cpu_threads workers running the ops' CPU references. Input bytes that
 * are not in memory are read through readers that each worker opens on *blobs (copied). */
int exec_cpu_new(const config_t *cfg, const exec_blob_reader_t *blobs, executor_t **ret);

#ifdef GPUJOB_WITH_CUDA
/* CUDA devices present (0 when there is no driver or no GPU). */
int cuda_device_count(void);
/* The CUDA backend: a worker per selected GPU (cfg->devices), each reading inputs through a
 * reader of its own opened on *blobs (copied). -ENODEV when no GPU is usable. */
int exec_cuda_new(const config_t *cfg, const exec_blob_reader_t *blobs, executor_t **ret);
#endif

/* Picks and creates the executor named by cfg->backend: "cuda" when built with CUDA and a GPU
 * is present (for "auto"), else "cpu". Logs which backend runs. */
int backend_new(const config_t *cfg, const exec_blob_reader_t *blobs, executor_t **ret);

/* ------------------------------------------------------------------ GPU gauges */

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

/* Starts the GPU gauges of /metrics for the devices a CUDA executor runs (as its describe()
 * lists them), sampled every cfg->metrics_interval_ms with memory from CUDA where NVML cannot
 * read it. *ret is NULL, and 0 returned, for the CPU backend or when the interval is 0.
 * Otherwise 0 with a new instance in *ret (stop it with gpu_metrics_stop() before the
 * executor is destroyed), or a negative errno. */
int backend_gpu_metrics_start(const config_t *cfg, executor_t *ex, gpu_metrics_t **ret);
