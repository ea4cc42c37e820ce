/* A job's and a batch's device memory, as fit() bounds it and the scheduler counts it per user
 * (executor.h). */
#include "executor.h"

static uint64_t aligned(uint64_t n)
{
    return (n + EXEC_MEMORY_ALIGN - 1) & ~(uint64_t)(EXEC_MEMORY_ALIGN - 1);
}

uint64_t exec_job_device_bytes(const job_t *job)
{
    const op_call_t *c = &job->call;
    uint64_t n = 0;
    for (int j = 0; c->op && j < c->op->n_inputs && j < OP_MAX_TENSORS; j++)
        if (c->has_in[j] && !(job->resident_inputs >> j & 1))
            n += aligned(tensor_desc_bytes(&c->in[j]));
    for (int j = 0; j < c->n_out && j < OP_MAX_TENSORS; j++)
        n += aligned(tensor_desc_bytes(&c->out[j]));
    return n;
}

uint64_t exec_batch_device_bytes(const exec_batch_t *b)
{
    uint64_t n = 0;
    for (int i = 0; i < b->n; i++)
        n += exec_job_device_bytes(b->jobs[i]);
    return n;
}
