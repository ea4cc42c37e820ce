/* The CUDA backend's threads against a model of the CUDA runtime that the test drives: the
 * worker of each device, which launches, and the waiter of each stream, which ends what was
 * launched. A launch's done event stays pending until the test's "device" thread reaches it,
 * and a fault makes every call on its device fail, as a lost context does. No GPU is needed:
 * what is checked is the threads' hand-offs (each batch reported exactly once, with its outputs
 * or an error; device memory accounted back to zero, and held by fit() for a batch until it
 * ends; a shutdown after a fault that neither hangs nor loses a batch). Under AddressSanitizer the
 * last test also catches a waiter left inside cudaEventSynchronize touching freed memory. What the
 * real runtime does is checked by the gpu-labelled tests on the H200. The backend's files
 * (daemon/exec/exec_cuda.c and cuda_*.c) are compiled into this test, so that they call the model
 * below. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/exec/cuda_internal.h"
#include "daemon/store/store.h"
#include "daemon/util/config.h"
#include "daemon/util/restart.h"

/* ------------------------------------------------------------------ the model runtime */

#define DEVICES 2

struct CUstream_st {
    int device;
    int pending; /* done events recorded on it and not reached */
};

struct CUevent_st {
    struct CUstream_st *stream;
    bool is_done_event; /* created with cudaEventBlockingSync: the slots' done events */
    bool pending;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t reached; /* an event was reached, or a device lost */
    bool hold;              /* done events stay pending until the device thread reaches them */
    cudaError_t lost[DEVICES];
    struct CUevent_st *done_events[64];
    int n_done_events;
    int waiter_start_delay_us; /* a waiter's first CUDA call comes this late */
    int sync_wake_delay_us;    /* a thread in cudaEventSynchronize wakes this late */
} rt = {.lock = PTHREAD_MUTEX_INITIALIZER, .reached = PTHREAD_COND_INITIALIZER};

static __thread int current_device;

static cudaError_t lost_on(int device)
{
    pthread_mutex_lock(&rt.lock);
    cudaError_t e = rt.lost[device];
    pthread_mutex_unlock(&rt.lock);
    return e;
}

static void lose(int device)
{
    pthread_mutex_lock(&rt.lock);
    rt.lost[device] = cudaErrorIllegalAddress;
    pthread_cond_broadcast(&rt.reached);
    pthread_mutex_unlock(&rt.lock);
}

/* The device reaches every done event recorded on it so far. */
static void reach_all(int device)
{
    pthread_mutex_lock(&rt.lock);
    for (int i = 0; i < rt.n_done_events; i++) {
        struct CUevent_st *e = rt.done_events[i];
        if (e->pending && e->stream->device == device) {
            e->pending = false;
            e->stream->pending--;
        }
    }
    pthread_cond_broadcast(&rt.reached);
    pthread_mutex_unlock(&rt.lock);
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = DEVICES;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "model device %d", device);
    p->totalGlobalMem = (size_t)1 << 30;
    p->major = 9;
    p->multiProcessorCount = 132;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    char name[16] = "";
    pthread_getname_np(pthread_self(), name, sizeof name);
    if (rt.waiter_start_delay_us && strstr(name, "-wait")) usleep(rt.waiter_start_delay_us);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    return e ? "an illegal memory access was encountered" : "no error";
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device)
{
    *pool = (cudaMemPool_t)(intptr_t)(device + 1);
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value)
{
    (void)pool, (void)attr, (void)value;
    return cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep)
{
    (void)pool, (void)keep;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    *free_bytes = *total = (size_t)1 << 30;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    *s = calloc(1, sizeof **s);
    (*s)->device = current_device;
    return cudaSuccess;
}

/* Streams and events are never freed: a waiter left behind may still hold one. */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = calloc(1, sizeof **e);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    *e = calloc(1, sizeof **e);
    (*e)->is_done_event = (flags & cudaEventBlockingSync) != 0;
    if ((*e)->is_done_event) {
        pthread_mutex_lock(&rt.lock);
        rt.done_events[rt.n_done_events++] = *e;
        pthread_mutex_unlock(&rt.lock);
    }
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    (void)e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    pthread_mutex_lock(&rt.lock);
    cudaError_t r = rt.lost[s->device];
    if (!r) {
        e->stream = s;
        if (e->is_done_event && rt.hold) {
            e->pending = true;
            s->pending++;
        }
    }
    pthread_mutex_unlock(&rt.lock);
    return r;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    pthread_mutex_lock(&rt.lock);
    while (e->pending && !rt.lost[e->stream->device])
        pthread_cond_wait(&rt.reached, &rt.lock);
    cudaError_t r = e->pending ? rt.lost[e->stream->device] : cudaSuccess;
    pthread_mutex_unlock(&rt.lock);
    if (rt.sync_wake_delay_us) usleep(rt.sync_wake_delay_us);
    return r;
}

/* What a stream's waiter polls before it sleeps in cudaEventSynchronize (gpu.spin_us). */
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    pthread_mutex_lock(&rt.lock);
    cudaError_t r = !e->pending                  ? cudaSuccess
                    : rt.lost[e->stream->device] ? rt.lost[e->stream->device]
                                                 : cudaErrorNotReady;
    pthread_mutex_unlock(&rt.lock);
    return r;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t stop)
{
    (void)start, (void)stop;
    *ms = 0.1f;
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    pthread_mutex_lock(&rt.lock);
    cudaError_t r = rt.lost[s->device] ? rt.lost[s->device]
                    : s->pending       ? cudaErrorNotReady
                                       : cudaSuccess;
    pthread_mutex_unlock(&rt.lock);
    return r;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    pthread_mutex_lock(&rt.lock);
    while (s->pending && !rt.lost[s->device])
        pthread_cond_wait(&rt.reached, &rt.lock);
    cudaError_t r = rt.lost[s->device];
    pthread_mutex_unlock(&rt.lock);
    return r;
}

cudaError_t cudaDeviceSynchronize(void)
{
    return lost_on(current_device);
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    *p = malloc(n);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t s)
{
    (void)pool, (void)s;
    *p = malloc(n);
    return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    (void)s;
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    (void)dst, (void)src, (void)n, (void)kind;
    return lost_on(s->device);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = (cublasLtHandle_t)1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = (cublasHandle_t)1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    (void)h, (void)s;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    (void)s;
    return "CUBLAS_STATUS_SUCCESS";
}

/* ------------------------------------------------------------------ batches */

static int run_nothing(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                       const void *const *const *in, void *const *const *out, op_error_t *err)
{
    (void)ctx, (void)n, (void)calls, (void)in, (void)out, (void)err;
    return 0;
}

static const op_def_t model_op = {.name = "model", .n_inputs = 0, .run_cuda = run_nothing};

static struct {
    executor_t *ex;
    store_t *st;
    atomic_int reported, reported_twice;
} t;

/* The scheduler's part: counts each batch's reports in its sched_priv. */
static void on_done(exec_batch_t *b, void *ud)
{
    (void)ud;
    intptr_t reports = (intptr_t)b->sched_priv + 1;
    b->sched_priv = (void *)reports;
    if (reports > 1) atomic_fetch_add(&t.reported_twice, 1);
    atomic_fetch_add(&t.reported, 1);
}

static exec_batch_t *new_batch(int device)
{
    exec_batch_t *b = calloc(1, sizeof *b);
    ck_assert_ptr_nonnull(b);
    b->n = 1;
    b->jobs = calloc(1, sizeof *b->jobs);
    b->jobs[0] = job_new();
    job_t *job = b->jobs[0];
    job->call.op = &model_op;
    job->device = device;
    job->preferred_device = -1;
    job->attempts = 1;
    job->call.n_out = 1;
    job->call.out_names[0] = "out";
    job->call.out[0] =
        (tensor_desc_t){.dtype = DTYPE_F32, .ndim = 1, .shape = {1000 + rand() % 5000}};
    return b;
}

/* restart_request() asks the daemon to restart with SIGUSR1; restart_device_resets() counts
 * the requests of each device. */
static void on_restart_request(int sig)
{
    (void)sig;
}

static char state_dir[] = "/tmp/gj-exec-cuda-XXXXXX";

/* The pool of each device that start() gives the backend. */
static size_t pool_cap = (size_t)1 << 28;

/* The backend on the model's devices, with a real store for its workers' readers. */
static void start(int streams)
{
    static config_t cfg;
    ck_assert_ptr_nonnull(mkdtemp(state_dir));
    config_defaults(&cfg);
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s", state_dir);
    cfg.streams_per_device = streams;
    cfg.device_memory_cap = pool_cap;
    ck_assert_int_eq(store_open(&cfg, &t.st), 0);
    signal(SIGUSR1, on_restart_request);
    static exec_blob_reader_t blobs;
    blobs = exec_store_blob_reader(t.st);
    ck_assert_int_eq(exec_cuda_new(&cfg, &blobs, &t.ex), 0);
    t.ex->done = on_done;
}

/* Stops the backend, giving running batches up to a second, and removes its store. */
static void stop(void)
{
    t.ex->ops->destroy(t.ex, 1000);
    store_close(t.st);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", state_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Waits up to timeout_s for n reports; returns how many came. */
static int wait_reported(int n, int timeout_s)
{
    for (int i = 0; i < timeout_s * 1000 && atomic_load(&t.reported) < n; i++)
        usleep(1000);
    return atomic_load(&t.reported);
}

static size_t device_memory_in_use(int d)
{
    cuda_exec_t *ex = (cuda_exec_t *)t.ex;
    pthread_mutex_lock(&ex->lock);
    size_t in_use = ex->devices[d].in_use;
    pthread_mutex_unlock(&ex->lock);
    return in_use;
}

/* The devices: reach the events recorded on them, one device at a time, at random moments. */
static atomic_bool devices_stop;

static void *run_devices(void *arg)
{
    (void)arg;
    for (unsigned i = 0; !atomic_load(&devices_stop); i++) {
        usleep((useconds_t)(rand() % 200));
        reach_all((int)(i % DEVICES));
    }
    return NULL;
}

/* Submits n batches, each as soon as a device takes it; fault_at >= 0 loses every device
 * before that batch. Returns how many were taken. */
static int submit_batches(exec_batch_t **batches, int n, int fault_at)
{
    int taken = 0;
    for (int i = 0; i < n; i++) {
        if (i == fault_at)
            for (int d = 0; d < DEVICES; d++)
                lose(d);
        batches[i] = new_batch(-1);
        int r;
        for (int tries = 0; (r = t.ex->ops->submit(t.ex, batches[i])) == -EAGAIN && tries < 2000;
             tries++)
            usleep(100);
        if (r != 0) break; /* after a fault no device takes work */
        taken++;
    }
    return taken;
}

static void free_batches(exec_batch_t **batches, int n)
{
    for (int i = 0; i < n; i++) {
        if (!batches[i]) continue;
        job_free(batches[i]->jobs[0]);
        free(batches[i]->jobs);
        free(batches[i]);
    }
}

/* ------------------------------------------------------------------ tests */

START_TEST(test_every_batch_is_reported_once_with_its_outputs)
{
    enum { N = 2000 };
    rt.hold = true;
    start(3);
    pthread_t devices;
    pthread_create(&devices, NULL, run_devices, NULL);
    static exec_batch_t *batches[N];
    int taken = submit_batches(batches, N, -1);
    ck_assert_int_eq(taken, N);
    ck_assert_int_eq(wait_reported(N, 20), N);
    atomic_store(&devices_stop, true);
    pthread_join(devices, NULL);
    ck_assert_int_eq(atomic_load(&t.reported_twice), 0);
    int ran_on[DEVICES] = {0};
    for (int i = 0; i < N; i++) {
        job_t *job = batches[i]->jobs[0];
        ck_assert_msg(job->error_code[0] == '\0', "batch %d failed: %s", i, job->error_message);
        ck_assert_ptr_nonnull(job->out[0].data);
        ck_assert_uint_eq(job->out[0].nbytes, 4 * job->call.out[0].shape[0]);
        ck_assert(job->run_device >= 0 && job->run_device < DEVICES);
        ran_on[job->run_device]++;
    }
    ck_assert_msg(ran_on[0] > 0 && ran_on[1] > 0, "both devices take work: %d, %d", ran_on[0],
                  ran_on[1]);
    for (int d = 0; d < DEVICES; d++)
        ck_assert_uint_eq(device_memory_in_use(d), 0);
    stop();
    free_batches(batches, N);
}
END_TEST

START_TEST(test_a_fault_hands_every_batch_back_once)
{
    enum { N = 2000 };
    rt.hold = true;
    start(3);
    pthread_t devices;
    pthread_create(&devices, NULL, run_devices, NULL);
    static exec_batch_t *batches[N];
    int taken = submit_batches(batches, N, N / 2);
    ck_assert_int_ge(taken, N / 2);
    ck_assert_int_eq(wait_reported(taken, 20), taken);
    atomic_store(&devices_stop, true);
    pthread_join(devices, NULL);
    ck_assert_int_eq(atomic_load(&t.reported_twice), 0);
    int handed_back = 0;
    for (int i = 0; i < taken; i++) {
        const exec_batch_t *b = batches[i];
        /* A batch that did not run to its end says why, or asks to run again. */
        if (b->jobs[0]->error_code[0] || b->retry != EXEC_RETRY_NONE)
            handed_back++;
        else
            ck_assert_ptr_nonnull(b->jobs[0]->out[0].data);
    }
    ck_assert_int_gt(handed_back, 0);
    for (int d = 0; d < DEVICES; d++) {
        ck_assert_int_eq(restart_device_resets(d), 1);
        ck_assert_uint_eq(device_memory_in_use(d), 0);
    }
    stop();
    free_batches(batches, N);
}
END_TEST

START_TEST(test_a_launch_made_before_its_waiter_first_runs_is_reported)
{
    rt.waiter_start_delay_us = 200000;
    start(1);
    exec_batch_t *b = new_batch(0);
    ck_assert_int_eq(t.ex->ops->submit(t.ex, b), 0);
    ck_assert_int_eq(wait_reported(1, 5), 1);
    ck_assert_str_eq(b->jobs[0]->error_code, "");
    stop();
    free_batches(&b, 1);
}
END_TEST

static void *end_device1_later(void *arg)
{
    (void)arg;
    usleep(300000);
    reach_all(1);
    return NULL;
}

START_TEST(test_a_shutdown_after_a_fault_leaves_a_waiter_inside_its_launch_alone)
{
    /* Device 1's launch is still running when device 0 faults: recover() hands it back, and its
     * waiter stays inside cudaEventSynchronize until the kernel ends, during the shutdown, and
     * wakes after the shutdown's own wait for the stream. */
    rt.hold = true;
    rt.sync_wake_delay_us = 20000;
    start(1);
    exec_batch_t *on0 = new_batch(0), *on1 = new_batch(1);
    ck_assert_int_eq(t.ex->ops->submit(t.ex, on0), 0);
    ck_assert_int_eq(t.ex->ops->submit(t.ex, on1), 0);
    usleep(100000);
    lose(0);
    ck_assert_int_eq(wait_reported(2, 5), 2);
    /* Two launches were in flight: neither can be told to be the culprit, and each ends as
     * interrupted by the reset, even the one whose stream reported the fault. */
    for (int i = 0; i < 2; i++) {
        const exec_batch_t *b = i ? on1 : on0;
        ck_assert_int_eq(b->retry, EXEC_RETRY_INTERRUPTED);
        ck_assert_str_eq(b->jobs[0]->error_code, "device_reset");
    }
    pthread_t kernel_ends;
    pthread_create(&kernel_ends, NULL, end_device1_later, NULL);
    stop();
    pthread_join(kernel_ends, NULL);
    usleep(300000); /* the waiter wakes, told to quit */
    ck_assert_int_eq(atomic_load(&t.reported), 2);
    ck_assert_int_eq(atomic_load(&t.reported_twice), 0);
    free_batches((exec_batch_t *[]){on0, on1}, 2);
}
END_TEST

/* A batch of one job writing an output of nbytes, pinned to device (-1: none). */
static exec_batch_t *sized_batch(int device, size_t nbytes)
{
    exec_batch_t *b = new_batch(device);
    b->jobs[0]->call.out[0].shape[0] = (int64_t)(nbytes / 4);
    return b;
}

static size_t device_held(int d)
{
    cuda_exec_t *ex = (cuda_exec_t *)t.ex;
    pthread_mutex_lock(&ex->lock);
    size_t held = ex->devices[d].held;
    pthread_mutex_unlock(&ex->lock);
    return held;
}

/* Pools of 1 MiB on each device. A batch of 600 KiB fits device 0 and holds its room until it
 * starts there, then uses it until it ends; meanwhile another batch of 600 KiB pinned to
 * device 0 waits for memory (-ENOSPC), an unpinned one fits device 1, and one of 2 MiB never
 * fits anywhere (-E2BIG) and, handed over all the same, fails with exceeds_device_memory. Once
 * the first ends, its room is back. One pinned to a device the host lacks fails at submit. */
START_TEST(test_fit_holds_a_pools_room_until_its_batch_ends)
{
    rt.hold = true;
    pool_cap = (size_t)1 << 20;
    start(1);
    uint64_t largest = 0;
    const char *key = NULL;
    ck_assert_uint_eq(t.ex->ops->memory_pool(t.ex, &largest, &key), 2u << 20);
    ck_assert_uint_eq(largest, 1u << 20);
    ck_assert_str_eq(key, "gpu.device_memory_cap");
    exec_batch_t *a = sized_batch(0, 600 << 10), *b = sized_batch(0, 600 << 10);
    exec_batch_t *c = sized_batch(-1, 600 << 10), *huge = sized_batch(-1, 2 << 20);
    ck_assert_int_eq(t.ex->ops->fit(t.ex, a), 0);
    ck_assert_int_eq(a->held_device, 0);
    ck_assert_uint_eq(device_held(0), 600 << 10);
    ck_assert_int_eq(t.ex->ops->fit(t.ex, b), -ENOSPC);
    ck_assert_int_eq(t.ex->ops->submit(t.ex, a), 0);
    for (int i = 0; i < 5000 && device_memory_in_use(0) == 0; i++)
        usleep(1000);
    ck_assert_uint_eq(device_memory_in_use(0), 600 << 10);
    ck_assert_uint_eq(device_held(0), 0);
    ck_assert_int_eq(t.ex->ops->fit(t.ex, b), -ENOSPC);
    ck_assert_int_eq(t.ex->ops->fit(t.ex, c), 0);
    ck_assert_int_eq(c->held_device, 1);
    t.ex->ops->unfit(t.ex, c);
    ck_assert_uint_eq(device_held(1), 0);
    ck_assert_int_eq(t.ex->ops->fit(t.ex, huge), -E2BIG);
    ck_assert_int_eq(t.ex->ops->submit(t.ex, huge), 0);
    ck_assert_int_eq(wait_reported(1, 5), 1);
    ck_assert_str_eq(huge->jobs[0]->error_code, "exceeds_device_memory");

    reach_all(0);
    ck_assert_int_eq(wait_reported(2, 5), 2);
    ck_assert_str_eq(a->jobs[0]->error_code, "");
    ck_assert_uint_eq(device_memory_in_use(0), 0);
    ck_assert_int_eq(t.ex->ops->fit(t.ex, b), 0);
    t.ex->ops->unfit(t.ex, b);
    ck_assert_uint_eq(device_held(0), 0);

    /* Pinned to a device this host does not have, it fits, holding nothing, and fails. */
    exec_batch_t *elsewhere = sized_batch(7, 1024);
    ck_assert_int_eq(t.ex->ops->fit(t.ex, elsewhere), 0);
    ck_assert(!elsewhere->held);
    ck_assert_int_eq(t.ex->ops->submit(t.ex, elsewhere), 0);
    ck_assert_int_eq(wait_reported(3, 5), 3);
    ck_assert_str_eq(elsewhere->jobs[0]->error_code, "no_such_device");
    stop();
    free_batches((exec_batch_t *[]){a, b, c, huge, elsewhere}, 5);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("exec_cuda");
    TCase *tc = tcase_create("threads");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_every_batch_is_reported_once_with_its_outputs);
    tcase_add_test(tc, test_a_fault_hands_every_batch_back_once);
    tcase_add_test(tc, test_a_launch_made_before_its_waiter_first_runs_is_reported);
    tcase_add_test(tc, test_a_shutdown_after_a_fault_leaves_a_waiter_inside_its_launch_alone);
    tcase_add_test(tc, test_fit_holds_a_pools_room_until_its_batch_ends);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
