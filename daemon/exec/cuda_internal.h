/* The CUDA backend's parts and what they share. Private to daemon/exec/.
 *
 * exec_cuda.c      the executor interface: submit, free slots, description, shutdown
 * cuda_device.c    a device's setup and teardown: properties, streams, handles, pool, waiters
 * cuda_worker.c    the device worker thread: what starts when, and the drain
 * cuda_slots.c     stream slots: a batch's launch, its waiter, its completion
 * cuda_resident.c  resident buffers: placement, loading, references, freeing
 * cuda_ephemeral.c ephemeral buffers: an upload streamed through pinned staging to the device
 * cuda_recovery.c  a lost context: the culprit, and every batch handed back
 *
 * One lock (cuda_exec_t.lock) guards every worker's queue, slots and flags, and one condition
 * variable (cuda_exec_t.cond) announces any change a worker may be waiting for. */
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "executor.h"

#define CUDA_ALIGN EXEC_MEMORY_ALIGN
/* How stale the free-memory figure of /v1/info may get while the worker is busy. */
#define CUDA_MEMORY_CHECK_NS (100 * 1000000L)

typedef enum device_state {
    DEVICE_READY,
    DEVICE_RESETTING, /* its context was lost: it takes no work until the daemon restarts */
    DEVICE_FAILED,    /* could not be set up: takes no work */
} device_state_t;

typedef struct device_worker device_worker_t;
typedef struct slot slot_t;
typedef struct cuda_exec cuda_exec_t;

/* A buffer kept in device memory. Guarded by the executor's lock; freed by its worker. */
typedef struct resident {
    char id[ID_SIZE];
    void *dptr;
    uint64_t nbytes;
    int refs;     /* launches using it now */
    bool deleted; /* gone from the store: free it when refs reach 0 */
} resident_t;

struct slot {
    device_worker_t *dw;
    /* The waiter's own copies: the worker's struct moves while the waiters start
     * (cuda_devices_setup). */
    cuda_exec_t *ex;
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasHandle_t blas;
    cudaEvent_t start, stop;
    cudaEvent_t done; /* recorded after a launch's last copy; blocking sync, no timing */
    pthread_t waiter;
    bool waiter_started;
    bool waiter_quit;
    bool waiter_in_sync; /* in cudaEventSynchronize, which may never return (a hung kernel) */
    pthread_cond_t wake; /* the waiter's: a new launch, or its end */
    void *pinned;        /* staging, grown on demand, reused across batches */
    size_t pinned_size;
    void *d_in, *d_out;  /* device memory of the running batch, from the pool */
    exec_batch_t *batch; /* NULL when free */
    bool exclusive;      /* the batch runs alone on the device (a re-run: cuda_is_rerun) */
    resident_t **used;   /* resident buffers the running batch reads, each holding a ref */
    size_t n_used, cap_used;
    bool launched;   /* the batch's work is on the stream (events recorded) */
    bool finished;   /* to be completed: its done event was reached, or it failed or faulted */
    bool ran;        /* its done event was reached without an error: the outputs are in staging */
    bool completing; /* its waiter completes it and frees the slot: no one else touches it */
    unsigned launch; /* launches so far: the waiter waits for the done event of each */
    size_t reserved; /* bytes counted against the device cap */
};

struct device_worker {
    cuda_exec_t *ex;
    int device;
    char name[256];
    char uuid[64];
    int cc_major, cc_minor, sms;
    size_t mem_total;
    size_t cap;    /* bytes the pool may hand to batches */
    size_t in_use; /* reserved by running batches */
    size_t held;   /* held by fit() for batches placed here that have not started yet */
    int n_fitted;  /* batches placed here by fit() and not yet handed over by submit() */
    cudaMemPool_t pool;
    pthread_t thread;
    int n_slots;
    slot_t *slots;
    exec_batch_t **queue; /* accepted, not yet on a slot */
    int q_head, q_len, q_cap;
    resident_t **residents;
    size_t n_residents, cap_residents;
    struct upload_staging *upload; /* ephemeral uploads' staging (cuda_ephemeral.c) */
    char (*preloads)[ID_SIZE];     /* resident buffers stored, to load ahead of their first job */
    size_t n_preloads, cap_preloads;
    bool preloading;       /* a load ahead of a job is being made: work in flight, as a batch is */
    size_t resident_bytes; /* counted against cap beside in_use */
    uint64_t loaded_bytes; /* resident buffers' bytes loaded so far, and the time it took */
    int64_t load_ns;
    unsigned placed; /* buffers placed here, to spread equal devices */
    device_state_t state;
    int resets; /* contexts lost, since the daemon was first started (restart.h) */
    bool thread_started;
    bool has_context; /* cuda_device_setup made the device current: there is something to undo */
    int setup_rc;
    bool abandoned; /* work was left on the device: at the drain deadline, or by recovery */
    /* Written by the worker alone; read under the lock. */
    size_t mem_free;
    int64_t memory_checked_ns;
};

struct cuda_exec {
    executor_t base;
    const config_t *cfg;
    exec_blob_reader_t blobs; /* each worker opens a reader of its own on it */
    pthread_mutex_t lock;     /* guards every worker's queue, slots and flags */
    pthread_cond_t cond;      /* any change a worker may be waiting for */
    bool stopping;
    int64_t drain_deadline_ns; /* once stopping: when the workers give up on their work */
    int n_devices;
    device_worker_t *devices;
    /* Set by the first worker to see its context lost: a fault loses every device's context,
     * so the culprit is the launch that was alone in flight in the whole process then, or
     * none when there were several. */
    bool context_lost;
    cudaError_t lost_error; /* the error that lost it */
    const slot_t *culprit;
};

static inline size_t cuda_align_up(size_t n)
{
    return (n + CUDA_ALIGN - 1) & ~(size_t)(CUDA_ALIGN - 1);
}

static inline int64_t cuda_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Fails every job of b that has no error yet with code and message. */
void cuda_fail_batch(exec_batch_t *b, const char *code, const char *message);
/* What fit() held for b on dw goes back (b starts, is handed back, or is not handed over).
 * Caller holds the lock. */
void cuda_release_held_locked(device_worker_t *dw, exec_batch_t *b);

/* --- cuda_device.c */
/* The device's description and the worker's memory; no context yet (cuda_devices_setup). */
int cuda_worker_init(cuda_exec_t *ex, device_worker_t *dw, int device);
/* Stops its waiters, tears its device down and frees what cuda_worker_init allocated. */
void cuda_worker_release(device_worker_t *dw);
/* Sets the selected devices up side by side; devices that fail leave ex->devices. */
void cuda_devices_setup(cuda_exec_t *ex);
/* True when cfg->devices ("all", or a comma list of ordinals or UUIDs) selects the device. */
bool cuda_device_selected(const char *spec, int ordinal, const char *uuid);

/* --- cuda_worker.c */
/* The device worker thread: takes batches off its queue onto free slots, completes what its
 * waiters leave to it, preloads resident buffers, and drains at shutdown. arg: the worker. */
void *cuda_device_thread(void *arg);
/* The worker's look at the device's free memory, for /v1/info and /metrics. */
void cuda_refresh_memory(device_worker_t *dw);
/* Names the calling thread after its device (as top -H shows it), makes the device current
 * for it and gives it a crash guard slot for batches of up to max_batch jobs (exec_guard.h);
 * the thread calls crash_guard_thread_leave() before it ends. */
void cuda_enter_device_thread(const char *name_format, int device, int max_batch);

/* --- cuda_slots.c */
/* Bytes of a batch's inputs and outputs, each tensor aligned; see the definition. */
void cuda_batch_sizes(const exec_batch_t *b, const void *const *in_ptrs, const device_worker_t *dw,
                      size_t *ret_in, size_t *ret_out);
/* Each slot's pinned staging from the device's setup on: a batch whose copies fit allocates no
 * page-locked memory on its launch path. A slot that must grow it gives the smaller buffer
 * back, which waits for every kernel running on the device. */
#define CUDA_STAGING_MIN ((size_t)1 << 20)

/* A device's staging for ephemeral uploads, its pinned memory made by the first upload and kept
 * to the device's teardown; NULL when out of memory. */
struct upload_staging *cuda_upload_staging_new(void);
void cuda_upload_staging_free(struct upload_staging *u);

/* Grows the slot's pinned staging to at least bytes. 0 or -ENOMEM. */
int cuda_slot_grow_pinned(slot_t *slot, size_t bytes);
/* Queues a batch on a free slot; 0 when its waiter now has it, else a negative errno after
 * failing its jobs (-EIO when a CUDA call failed). */
int cuda_slot_launch(slot_t *slot, exec_batch_t *b, void *rd);
/* After the stream finished: outputs out of staging, GPU time shared, memory back. */
cudaError_t cuda_slot_complete(slot_t *slot);
/* Reports a completed slot's batch and frees the slot. */
void cuda_slot_release(slot_t *slot);
/* The slot's waiter thread; arg: the slot. */
void *cuda_slot_waiter(void *arg);
/* Ends the device's waiters; one stuck in a launch is left behind (dw->abandoned). */
void cuda_waiters_stop(device_worker_t *dw);

/* --- cuda_resident.c */
bool cuda_resident_here_locked(const device_worker_t *dw, const char *id);
/* Brings a buffer input where the launch can use it: its device copy in *ret_dptr, or its
 * bytes in t->data. 0, or a negative errno with why written. */
int cuda_fetch_buffer_input(slot_t *slot, void *rd, job_tensor_t *t, const void **ret_dptr,
                            char *why, size_t why_size);
/* Loads a resident buffer ahead of its first job on an idle slot; the context's error when
 * that is lost, else cudaSuccess. */
cudaError_t cuda_preload(slot_t *slot, void *rd, const char *id);
/* Drops the references the slot's batch held. Caller holds the lock. */
void cuda_slot_release_residents_locked(slot_t *slot);
/* A deleted resident buffer no launch uses, unlisted (the caller frees it); NULL when none. */
resident_t *cuda_take_unused_deleted_locked(device_worker_t *dw);
/* Frees every resident copy of the worker (its device gone or shut down). */
void cuda_residents_free(device_worker_t *dw);
/* Device memory for a resident copy on dw's device (current), trimming the pool once if it
 * is in the way. */
cudaError_t cuda_resident_malloc(device_worker_t *dw, void **ret, uint64_t nbytes);
int cuda_place_buffer(executor_t *base, uint64_t nbytes);
void cuda_buffer_added(executor_t *base, const buffer_t *buf);
void cuda_buffer_deleted(executor_t *base, const char *id);
/* --- cuda_ephemeral.c */
int cuda_upload_open(executor_t *base, int device, uint64_t nbytes, exec_upload_t **ret);
int cuda_upload_write(exec_upload_t *up, const void *data, size_t n);
int cuda_upload_keep(exec_upload_t *up, const char *id);
void cuda_upload_abort(exec_upload_t *up);

/* --- cuda_recovery.c */
/* After a failed CUDA call: the sticky error that lost the context, or cudaSuccess. */
cudaError_t cuda_sticky_error(void);
/* True for a batch interrupted before: it runs alone in the process. */
bool cuda_is_rerun(const exec_batch_t *b);
/* Clears the errors of b's jobs. */
void cuda_clear_errors(exec_batch_t *b);
/* Hands every batch of the worker back after its context was lost, and asks for a restart. */
void cuda_recover(device_worker_t *dw, cudaError_t why);
/* The executor's abandon(): the device holding a batch the watchdog gave up on is reset. */
void cuda_abandon(executor_t *base, exec_batch_t *b);
