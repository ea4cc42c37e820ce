/* The executor interface: how the scheduler hands batches of jobs to a backend (the CPU
 * worker pool, the CUDA device workers, or a test's fake) and learns that they finished.
 *
 * The scheduler calls submit() on its loop thread; submit never blocks on the work. The
 * executor runs the batch on a thread of its own and then calls the `done` callback, from that
 * thread, exactly once per accepted batch. The scheduler installs `done` and `done_ud` (in
 * sched_set_executor) before the first submit. */
#pragma once

#include <jansson.h>
#include <stdbool.h>

#include "daemon/job/job.h"
#include "daemon/store/store.h"

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
    void *sched_priv; /* the scheduler's own */
} exec_batch_t;

typedef void (*exec_done_fn)(exec_batch_t *batch, void *ud);

typedef struct executor executor_t;

typedef struct executor_ops {
    const char *name; /* "cpu", "cuda" */
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

    /* Resident buffers; NULL where the backend has no device memory (the CPU). */
    /* The device a new resident buffer of nbytes should live on, or -1 for none. Any thread. */
    int (*place_buffer)(executor_t *ex, uint64_t nbytes);
    /* A resident buffer is stored (its row committed): the backend may load it onto its
     * device ahead of its first job. Loop thread. */
    void (*buffer_added)(executor_t *ex, const buffer_t *buf);
    /* The buffer is gone from the store: free its device copy once no launch uses it. */
    void (*buffer_deleted)(executor_t *ex, const char *id);
    /* True when device is one this backend runs jobs on. Any thread. */
    bool (*serves_device)(executor_t *ex, int device);
} executor_ops_t;

struct executor {
    const executor_ops_t *ops;
    exec_done_fn done;
    void *done_ud;
};

/* The CPU backend: cfg->cpu_threads workers running the ops' CPU references. Input bytes that
 * are not in memory are read through store readers opened on cfg. */
int exec_cpu_new(const config_t *cfg, executor_t **ret);

#ifdef GPUJOB_WITH_CUDA
/* CUDA devices present (0 when there is no driver or no GPU). */
int cuda_device_count(void);
/* The CUDA backend: a worker per selected GPU (cfg->devices). -ENODEV when none is usable. */
int exec_cuda_new(const config_t *cfg, executor_t **ret);
#endif
