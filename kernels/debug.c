/* debug_sleep, debug_fault: validation, the CPU implementations and the op table entries. */
#include "debug.h"

#include <errno.h>
#include <string.h>
#include <time.h>

static const char *const debug_input_names[] = {"x"};
static const char *const debug_sleep_params[] = {"ms", NULL};
static const char *const debug_fault_params[] = {"crash", NULL};
static const char *const debug_out_names[] = {"out"};

/* What both ops share: out has x's descriptor, and the call never batches. */
static void debug_fill_call(op_call_t *call, const debug_params_t *p)
{
    memset(call->params.bytes, 0, sizeof call->params.bytes);
    *OP_PARAMS(call, debug_params_t) = *p;
    call->n_out = 1;
    call->out_names[0] = debug_out_names[0];
    call->out[0] = call->in[0];
    call->cost.bytes = 2.0 * (double)p->bytes;
    call->cost.flops = 0;
    call->batch_key[0] = '\0';
}

static int debug_sleep_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    int r = op_params_check_keys(call->op, params, err);
    if (r < 0) return r;
    const json_t *v = params ? json_object_get(params, "ms") : NULL;
    if (!v || json_is_null(v))
        return op_error(err, -EINVAL, "params.ms",
                        "params.ms is required: the job's length in milliseconds (0..%d)",
                        DEBUG_SLEEP_MAX_MS);
    debug_params_t p = {.bytes = tensor_desc_bytes(&call->in[0])};
    r = op_param_int(params, "ms", 0, 0, DEBUG_SLEEP_MAX_MS, &p.ms, err);
    if (r < 0) return r;
    debug_fill_call(call, &p);
    return 0;
}

static int debug_fault_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    int r = op_params_check_keys(call->op, params, err);
    if (r < 0) return r;
    debug_params_t p = {.bytes = tensor_desc_bytes(&call->in[0])};
    r = op_param_bool(params, "crash", false, &p.crash, err);
    if (r < 0) return r;
    debug_fill_call(call, &p);
    return 0;
}

/* The longest nap of debug_sleep between two looks at its cancel flag. */
#define DEBUG_SLEEP_SLICE_MS 10

/* Copies x, then sleeps the whole of params.ms, in slices of DEBUG_SLEEP_SLICE_MS between which
 * it stops early (-ECANCELED) once its caller cancels it: the tests' long job that a cancel must
 * cut short. A signal cuts nanosleep short, so each slice sleeps what is left of it. */
static int debug_sleep_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                               op_error_t *err)
{
    const debug_params_t *p = OP_PARAMS(call, const debug_params_t);
    if (p->bytes) memcpy(out[0], in[0], p->bytes);
    for (int64_t left_ms = p->ms; left_ms > 0; left_ms -= DEBUG_SLEEP_SLICE_MS) {
        if (op_call_cancelled(call)) return op_error_cancelled(err);
        int64_t ms = left_ms < DEBUG_SLEEP_SLICE_MS ? left_ms : DEBUG_SLEEP_SLICE_MS;
        struct timespec left = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
        while (nanosleep(&left, &left) < 0 && errno == EINTR) {
        }
    }
    return 0;
}

/* Fails the job; with params.crash, crashes the process instead, through a real invalid
 * write (SIGSEGV), as an op that overruns its memory would. */
static int debug_fault_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                               op_error_t *err)
{
    if (OP_PARAMS(call, const debug_params_t)->crash) {
        volatile char *volatile nowhere = NULL;
        *nowhere = 1;
    }
    return op_error(err, -EIO, "", "debug_fault: injected fault");
}

const op_def_t op_debug_sleep = {
    .name = "debug_sleep",
    .summary = "test only: out = x, after at least params.ms milliseconds",
    .n_inputs = 1,
    .input_names = debug_input_names,
    .required_inputs = 0x1,
    .param_names = debug_sleep_params,
    .test_only = true,
    .validate = debug_sleep_validate,
    .run_cpu = debug_sleep_run_cpu,
    .run_cuda = OP_CUDA(op_debug_sleep_run_cuda),
};

const op_def_t op_debug_fault = {
    .name = "debug_fault",
    .summary = "test only: fails on the CPU; on CUDA, a kernel's illegal address kills the context",
    .n_inputs = 1,
    .input_names = debug_input_names,
    .required_inputs = 0x1,
    .param_names = debug_fault_params,
    .test_only = true,
    .validate = debug_fault_validate,
    .run_cpu = debug_fault_run_cpu,
    .run_cuda = OP_CUDA(op_debug_fault_run_cuda),
};
