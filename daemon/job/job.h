/* The job model shared by the API, the scheduler, the store and the executors.
 *
 * A job_t is one op applied to named input tensors, producing named output tensors. The API
 * builds it (validated), the scheduler owns it while the daemon holds it in memory, the store
 * persists it, and an executor runs it. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/util/id.h"
#include "kernels/op.h"

#define OWNER_SIZE 64     /* user names */
#define IDEM_KEY_SIZE 128 /* Idempotency-Key header values */
#define ERROR_CODE_SIZE 32
#define ERROR_MESSAGE_SIZE 256
#define JOB_OP_NAME_SIZE 128

typedef enum job_state {
    JOB_QUEUED,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    JOB_FAILED,
    JOB_CANCELLED,
    JOB_STATE_COUNT
} job_state_t;

const char *job_state_name(job_state_t s);
int job_state_parse(const char *name, job_state_t *ret);
bool job_state_is_final(job_state_t s);

/* Where a tensor's bytes live. Exactly one of: data (in memory, owned by the tensor),
 * buffer_id (an uploaded buffer, read when the job runs), or blob (the store's own locator,
 * for bytes it has persisted; opaque outside the store). */
typedef struct job_tensor {
    char name[32];
    tensor_desc_t desc;
    uint64_t nbytes;
    void *data; /* malloc'd, owned; NULL when not in memory */
    char buffer_id[ID_SIZE];
    char *blob; /* malloc'd, owned by the tensor; NULL when none */
} job_tensor_t;

typedef struct job {
    char id[ID_SIZE];
    char owner[OWNER_SIZE];
    char idempotency_key[IDEM_KEY_SIZE]; /* "" when none */
    /* A job read back from the store carries its op by name, with call.op NULL until
     * job_resolve_op; "" for a job built from a request, whose call.op is set. */
    char op_name[JOB_OP_NAME_SIZE];
    op_call_t call;       /* validated; call.op is the op */
    char *params_json;    /* the params as submitted, compact JSON; owned */
    int priority;         /* higher runs first */
    int device;           /* pinned device, or -1 for any */
    int preferred_device; /* where its resident input lives (-1: none): a
                             pin while that device serves; not stored */
    /* Its inputs read from a buffer resident in device memory, bit j for input j: they take no
     * room in its launch's memory (exec_job_device_bytes). Set at submission; not stored (a job
     * read back from the store counts every input). */
    uint16_t resident_inputs;
    int64_t deadline_us; /* absolute wall-clock µs, 0 for none */
    /* The longest it may run, in ms, 0 for no limit: counted from the start of its own run in
     * the executor (run_started_us), past it the job fails with `time_limit`. */
    int64_t time_limit_ms;
    job_state_t state;
    int attempts;                                /* runs started, restarts included */
    int64_t created_us, started_us, finished_us; /* wall clock, µs since the epoch; 0 unset */
    /* This job's share of its batch's measured device time (CUDA events on a GPU, the worker's
     * clock on the CPU backend), by cost: the shares of a batch's jobs sum to batch_ns. */
    int64_t gpu_ns;
    int64_t batch_ns; /* the measured device time of the whole batch that ran it */
    int run_device;   /* device that ran it, -1 for none or the CPU */
    int batch_size;   /* jobs in the launch that ran it (1: alone) */
    /* Set once, atomically, by the executor's cancel hook when the job is cancelled while its
     * batch is in the executor; read by the executor's threads (executor.h). */
    bool cancel_requested;
    bool skipped; /* the executor left it out of its batch's run (cancelled before it ran) */
    /* When its own run began (mono_us()), 0 before: its batch's launch on a GPU, the moment its
     * worker came to it on the CPU, where a batch's jobs run in turn. Written by the executor's
     * threads, read by the scheduler's time limits meanwhile (exec_job_run_started, atomic);
     * not stored. */
    int64_t run_started_us;
    int64_t run_ended_us; /* when its own run ended (mono_us()), 0 before; as run_started_us */
    /* in[j] is op input slot j (see call.op->input_names); present iff call.has_in[j]. */
    job_tensor_t in[OP_MAX_TENSORS];
    /* out[j] matches call.out[j] / call.out_names[j], j < call.n_out. */
    job_tensor_t out[OP_MAX_TENSORS];
    char error_code[ERROR_CODE_SIZE]; /* "" unless failed or cancelled */
    char error_message[ERROR_MESSAGE_SIZE];
    /* Why a queued job waits, as the scheduler explained it when it answered for the job
     * (sched_explain.c); waiting_reason is "" when not explained (a stored copy). Not stored. */
    char waiting_reason[16]; /* fair_share, user_limit, batching, device_memory, devices_busy */
    char waiting_limit[112]; /* user_limit: the policy key, e.g. "user.alice.max_running" */
    long waiting_position;   /* jobs that will run before it (an estimate, sched_explain.c) */
} job_t;

/* The idempotency key of element index of a list submitted with Idempotency-Key key, as a
 * job_t carries it: key, this separator, index in decimal. The separator is a control
 * character, which the header cannot carry (the API refuses them), so that no single job's
 * key ever takes this form; the store keeps the index in a column of its own, and a list's
 * element and a single job never share a key, whatever the header says. */
#define JOB_IDEM_LIST_SEP '\x1f'
/* Writes the key a job of a submission with Idempotency-Key key carries into ret: key itself
 * for a single job, JOB_IDEM_LIST_SEP and index appended for element index of a list. */
void job_idem_key_format(char ret[IDEM_KEY_SIZE], const char *key, bool in_list, size_t index);
/* Splits a job's key into the header's key (into ret_key) and its index in a list, which it
 * returns; -1 for a single job's key. */
int64_t job_idem_key_split(const char *job_key, char ret_key[IDEM_KEY_SIZE]);
/* The key as answers show it: a list element's as "KEY:INDEX". */
void job_idem_key_shown(const char *job_key, char ret[IDEM_KEY_SIZE]);

/* A new zeroed job (device = run_device = -1). NULL on allocation failure. */
job_t *job_new(void);
/* Frees the job, its params text and every tensor's data and blob. Accepts NULL. */
void job_free(job_t *job);
/* A copy of the job without its tensors' bytes or blob locators: the job as it stands, for an
 * answer given later, when the job itself may have moved on. NULL on allocation failure. */
job_t *job_copy_shown(const job_t *job);
/* job_copy_shown with its outputs' blob locators and the bytes of those in memory of at most
 * max_data_bytes each: the job as it ended, for an answer that inlines its outputs (up to
 * that size) later. NULL on allocation failure. */
job_t *job_copy_answer(const job_t *job, uint64_t max_data_bytes);
/* Describes each output (name, descriptor, bytes) from the validated call. */
void job_describe_outputs(job_t *job);
/* The name of the job's op: its call's, else the stored name; NULL when it has neither. */
const char *job_op_name(const job_t *job);
/* Fills job->call of a job read back from the store from its op_name, params and tensors (a job
 * whose call.op is set already is left alone). A known op re-validates the call, so that params,
 * outputs and batch key are as at submission. A job whose op this build does not have (or that
 * the op no longer accepts) gets a stand-in op of the same name whose validate and run fail with
 * a message saying so: the job keeps its name and tensors and fails cleanly if anyone tries to
 * run it. 0, or -ENOMEM (daemon/job/job_op.c). */
int job_resolve_op(job_t *job);
void job_set_error(job_t *job, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* An uploaded buffer. */
typedef struct buffer {
    char id[ID_SIZE];
    char owner[OWNER_SIZE];
    tensor_desc_t desc;
    uint64_t nbytes;
    bool resident; /* keep in device memory across jobs (CUDA backend) */
    int device;    /* the device a resident buffer was placed on; -1 for none */
    /* False for an ephemeral buffer: its bytes live only in the executor's resident copy (device
     * memory, or host memory on the CPU backend), never on disk; a restart forgets it. */
    bool durable;
    int64_t created_us;
    void *data; /* malloc'd, owned; NULL when not in memory */
    char *blob; /* the store's locator once persisted; owned */
} buffer_t;

buffer_t *buffer_new(void);
void buffer_free(buffer_t *buf);
