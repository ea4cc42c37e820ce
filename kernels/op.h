/* The op table: every op gpujobd can run, behind one interface.
 *
 * kernels/ knows nothing of HTTP, SQLite or the scheduler. A caller (the daemon) fills an
 * op_call_t with the descriptors of the inputs it was given, asks the op to validate it with its
 * JSON params (which also yields the output descriptors, a batch key and a cost estimate), and
 * then runs the call on the CPU, or n >= 1 calls with the same batch key at once on CUDA.
 *
 * Conventions: functions return 0 or a negative errno; on failure they fill *err with the path
 * of the offending field ("params.alpha", "inputs.a.shape") and a message meant for the user. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OP_MAX_TENSORS 8
#define OP_PARAMS_BYTES 96
#define OP_BATCH_KEY_LEN 128

typedef struct op_error {
    char field[128]; /* "inputs.x.data[3]"; "" when the error concerns no single field */
    char message[256];
} op_error_t;

/* Fills *err (when err is not NULL) and returns code; printf-style message. */
int op_error(op_error_t *err, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

typedef struct op_cost {
    double bytes; /* bytes read + written by the op's kernels */
    double flops; /* arithmetic operations (a multiply-add counts 2) */
} op_cost_t;

/* A cost as a time: its bytes at 1 GB/s and its flops at 100 GFLOP/s, rates the CPU
 * references sustain at the least. The watchdog's bound and the largest job a user may submit
 * (limits.max_job_cost_ms) are both in these milliseconds. */
double op_cost_ms(op_cost_t cost);

struct op_def;

/* One validated call of an op. The caller fills op, in[] and has_in[] (slots in the order of
 * op->input_names; has_in[j] false for an absent optional input); validate() fills the rest.
 * The struct is plain data: it may be copied and compared with memcmp after memset(0). */
typedef struct op_call {
    const struct op_def *op;
    /* The op's parsed params: a POD struct of the op's own, at most OP_PARAMS_BYTES. */
    union {
        unsigned char bytes[OP_PARAMS_BYTES];
        double align_;
    } params;
    tensor_desc_t in[OP_MAX_TENSORS];
    bool has_in[OP_MAX_TENSORS];
    int n_out;
    const char *out_names[OP_MAX_TENSORS]; /* static strings */
    tensor_desc_t out[OP_MAX_TENSORS];
    op_cost_t cost;
    /* Calls with equal keys may run together in one run_cuda(); "" means never batch. */
    char batch_key[OP_BATCH_KEY_LEN];
    /* Set by whoever runs the call on the CPU, else NULL: a flag that turns true (read it with
     * op_call_cancelled) when the result is no longer wanted. A long CPU implementation checks
     * it between chunks of its work and then returns -ECANCELED; validation ignores it. */
    const bool *cancel;
} op_call_t;

/* Whether the caller of a CPU run no longer wants its result (op_call_t.cancel): an atomic
 * read, cheap enough for once per chunk of work. */
static inline bool op_call_cancelled(const op_call_t *call)
{
    return call->cancel && __atomic_load_n(call->cancel, __ATOMIC_ACQUIRE);
}

/* The error of a CPU run that stopped because op_call_cancelled() said so. */
int op_error_cancelled(op_error_t *err);

#define OP_PARAMS(call, type) ((type *)(void *)(call)->params.bytes)

/* What a CUDA run may use. All memory comes from the caller: device pointers for the tensors,
 * and scratch from the caller's stream-ordered pool. Types are void* so that C code without the
 * CUDA headers can hold this struct. */
typedef struct op_cuda_ctx {
    void *stream; /* cudaStream_t; every launch and copy goes on it */
    void *blaslt; /* cublasLtHandle_t owned by the device worker */
    void *blas;   /* cublasHandle_t owned by the device worker, bound to this stream */
    int device;   /* CUDA device ordinal, current on the calling thread */
    /* Stream-ordered scratch memory. Returns NULL when the pool cannot satisfy the request; the
     * op then fails with -ENOMEM. Freed memory may be reused by later work on the stream. */
    void *(*scratch_alloc)(void *pool, size_t bytes);
    void (*scratch_free)(void *pool, void *ptr);
    void *pool;
} op_cuda_ctx_t;

/* What the op table says of each input and param on its own: the dtypes and ranks an input may
 * have, a param's type, bounds and default. `gpujobd --print-ops` prints it (op_sig_json) and
 * api/openapi.yaml's per-op job schemas are generated from that. validate() checks all of it
 * and, beyond it, the relations between values (shapes that must agree, a dtype that must be
 * another input's, a param that depends on an input) that op_sig_t.rules states in words. */
#define OP_DTYPE_BIT(dt) (1u << (dt))
#define OP_DTYPES_ANY ((1u << DTYPE_COUNT) - 1)

typedef struct op_input_sig {
    uint32_t dtypes;        /* OP_DTYPE_BIT of every dtype the input may have */
    int min_rank, max_rank; /* bounds of its number of dims */
} op_input_sig_t;

typedef enum op_param_kind {
    OP_PARAM_BOOL,
    OP_PARAM_NUMBER,   /* a finite number in [lo, hi] */
    OP_PARAM_INT,      /* an integer in [lo, hi] */
    OP_PARAM_INT_PAIR, /* an integer or [h, w], each in [lo, hi] (op_param_pair) */
    OP_PARAM_NAMES,    /* a list of distinct names out of choices */
} op_param_kind_t;

typedef struct op_param_sig {
    const char *name;
    op_param_kind_t kind;
    double lo, hi;              /* -HUGE_VAL / HUGE_VAL: unbounded */
    const char *dflt;           /* the default as JSON text; NULL: the param is required */
    const char *const *choices; /* OP_PARAM_NAMES: the names, NULL-terminated */
    const char *doc;            /* one sentence */
} op_param_sig_t;

typedef struct op_sig {
    const op_input_sig_t *inputs; /* n_inputs, in input_names' order */
    const op_param_sig_t *params; /* one per param_names entry, in its order */
    const char *rules;            /* the relations validate() checks beyond the above */
} op_sig_t;

typedef struct op_def {
    const char *name;
    const char *summary;            /* one line for /v1/info */
    int n_inputs;                   /* slots in input_names */
    const char *const *input_names; /* e.g. {"x", "y"} */
    uint32_t required_inputs;       /* bit j set: input j is required */
    const char *const *param_names; /* NULL-terminated; others are rejected */
    const op_sig_t *sig;            /* NULL only for test-only and tests' own ops */
    /* A test-only op (kernels/debug.h): invisible to op_find/op_count/op_at unless
     * op_table_enable_test_ops(true) was called. */
    bool test_only;

    /* Parses params (may be NULL: all defaults), checks dtypes and shapes of call->in, and
     * fills call->params, n_out, out_names, out, cost and batch_key. The caller has already
     * checked required inputs are present and each descriptor passed tensor_desc_check(). */
    int (*validate)(const json_t *params, op_call_t *call, op_error_t *err);

    /* Runs one validated call on host memory. in[j] is NULL for an absent optional input;
     * out[j] is writable memory of call->out[j]'s size (its contents undefined on entry). Host
     * scratch comes from size_malloc() and is a fixed multiple (at most 16 bytes an element) of
     * a validated input's or output's element count, so that the limits checked at submission
     * bound it too; a NULL is -ENOMEM, never a crash. */
    int (*run_cpu)(const op_call_t *call, const void *const *in, void *const *out, op_error_t *err);

    /* Runs n validated calls with equal batch keys on ctx->stream, asynchronously: it returns
     * once the work is queued. in[i][j] / out[i][j] are device pointers of call i. A CUDA error
     * is returned (-EIO, message from cudaGetErrorString), never aborted on. NULL when gpujobd
     * was built without CUDA. */
    int (*run_cuda)(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                    const void *const *const *in, void *const *const *out, op_error_t *err);
} op_def_t;

/* Validates a call as the daemon must before accepting it: runs call->op->validate() and then
 * checks every output descriptor as inputs are checked at the door (tensor_desc_check() against
 * max_out_bytes; UINT64_MAX checks only that the shape is bounded), so that no op can hand the
 * executor an output that wraps or that exceeds the limit. On an output's failure the field is
 * "outputs.<name>" and the code -EOVERFLOW or -E2BIG. The one entry point for validation outside
 * tests of a single op. */
int op_call_validate(const json_t *params, uint64_t max_out_bytes, op_call_t *call,
                     op_error_t *err);

/* The table. op_find returns NULL for an unknown name. Test-only ops are left out of all three
 * unless op_table_enable_test_ops(true) was called. */
const op_def_t *op_find(const char *name);
int op_count(void);
const op_def_t *op_at(int i);
/* Shows (true) or hides (false, the default) the test-only ops. Called once at startup
 * ([debug] test_ops) before other threads use the table; tests may toggle it between uses. */
void op_table_enable_test_ops(bool enable);
/* The backends a validated call can run on. */
typedef enum op_backend { OP_BACKEND_CPU, OP_BACKEND_CUDA } op_backend_t;
/* Whether backend can run calls of op: the op has an implementation for that backend in this
 * build. Input dtypes need no question of their own: every op's validate() accepts only the
 * dtypes that all of its implementations take (the GPU suites run each dtype on both). Asked at
 * submission, so that a job its backend cannot run is refused then, never found at launch. */
bool op_supports(const op_def_t *op, op_backend_t backend);
/* Index of an input name in op->input_names, or -1. */
int op_input_index(const op_def_t *op, const char *name);

/* The op's name, summary, rules, inputs (name, required, dtypes, ranks) and params (name, type,
 * bounds, default, required) as a new JSON object; NULL when out of memory, when the op has no
 * signature, or when its signature's params do not follow param_names. */
json_t *op_sig_json(const op_def_t *op);

/* Checks that params is NULL or an object whose keys are all in op->param_names. */
int op_params_check_keys(const op_def_t *op, const json_t *params, op_error_t *err);
/* Typed param getters: absent (or JSON null) gives the default; a wrong type is an error
 * naming "params.<key>". */
int op_param_bool(const json_t *params, const char *key, bool dflt, bool *ret, op_error_t *err);
int op_param_double(const json_t *params, const char *key, double dflt, double *ret,
                    op_error_t *err);
/* An integer in [lo, hi]. */
int op_param_int(const json_t *params, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                 int64_t *ret, op_error_t *err);
/* An integer or a pair [h, w] (conv2d's stride, padding, dilation), each in [lo, hi]. */
int op_param_pair(const json_t *params, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                  int64_t ret[2], op_error_t *err);

#ifdef GPUJOB_WITH_CUDA
#define OP_CUDA(fn) fn
#else
#define OP_CUDA(fn) NULL
#endif

#ifdef __cplusplus
}
#endif
