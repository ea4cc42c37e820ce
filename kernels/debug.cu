/* debug_sleep, debug_fault on CUDA. Both are test-only ops (see debug.h).
 *
 * debug_sleep is one block: its threads copy x to out, then thread 0 waits params.ms on the
 * device's global nanosecond timer, napping with __nanosleep so that the spin takes no issue
 * slots from work on other streams. The op never batches, so a launch is one call; should a
 * caller pass n > 1 anyway, the calls run one after another on the stream.
 *
 * debug_fault writes through an address no allocation can have, with a global-space store so
 * that the address is not taken for shared or local memory: the context gets the sticky
 * cudaErrorIllegalAddress of a real out-of-bounds write. */
#include "debug.h"
#include "elementwise_cuda.cuh"

#define DEBUG_BLOCK 256
/* The nap between two reads of the timer, in nanoseconds: a wake-up comes at most about this
 * late, which is noise next to a sleep of milliseconds. */
#define DEBUG_NAP_NS 20000
/* Where debug_fault writes: in the unmapped first page of the address space. */
#define DEBUG_FAULT_ADDRESS ((uintptr_t)0x10)

static __device__ __forceinline__ uint64_t debug_globaltimer(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __global__ void __launch_bounds__(DEBUG_BLOCK)
    debug_sleep_kernel(const unsigned char *x, unsigned char *out, uint64_t bytes, uint64_t ns)
{
    uint64_t done = 0;
    if ((((uintptr_t)x | (uintptr_t)out) & 15) == 0) {
        const uint64_t vecs = bytes / 16;
        for (uint64_t i = threadIdx.x; i < vecs; i += DEBUG_BLOCK)
            ((uint4 *)out)[i] = ((const uint4 *)x)[i];
        done = vecs * 16;
    }
    for (uint64_t i = done + threadIdx.x; i < bytes; i += DEBUG_BLOCK)
        out[i] = x[i];
    __syncthreads();
    if (threadIdx.x != 0) return;
    const uint64_t start = debug_globaltimer();
    while (debug_globaltimer() - start < ns)
        __nanosleep(DEBUG_NAP_NS);
}

static __global__ void debug_fault_kernel(int *bad)
{
    __stcg(bad, 1);
}

extern "C" int op_debug_sleep_run_cuda(const op_cuda_ctx_t *ctx, int n,
                                       const op_call_t *const *calls, const void *const *const *in,
                                       void *const *const *out, op_error_t *err)
{
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    for (int i = 0; i < n; i++) {
        const debug_params_t *p = OP_PARAMS(calls[i], const debug_params_t);
        debug_sleep_kernel<<<1, DEBUG_BLOCK, 0, stream>>>((const unsigned char *)in[i][0],
                                                          (unsigned char *)out[i][0], p->bytes,
                                                          (uint64_t)p->ms * 1000000u);
        int r = gj_check_launch(err);
        if (r < 0) return r;
    }
    return 0;
}

/* Returns 0 once the faulting kernel is queued: the fault itself comes later, on the stream. */
extern "C" int op_debug_fault_run_cuda(const op_cuda_ctx_t *ctx, int n,
                                       const op_call_t *const *calls, const void *const *const *in,
                                       void *const *const *out, op_error_t *err)
{
    /* params.crash crashes the host process, as on the CPU (debug.h). */
    if (OP_PARAMS(calls[0], const debug_params_t)->crash) {
        volatile char *volatile nowhere = NULL;
        *nowhere = 1;
    }
    debug_fault_kernel<<<1, 1, 0, (cudaStream_t)ctx->stream>>>((int *)DEBUG_FAULT_ADDRESS);
    return gj_check_launch(err);
}
