/* Marks the jobs a worker thread runs in its crash guard slot (exec_guard.h). */
#include "exec_guard.h"

#include "daemon/util/crash_guard.h"

void exec_guard_batch(const exec_batch_t *b)
{
    const char *ids[b->n > 0 ? b->n : 1];
    for (int i = 0; i < b->n; i++)
        ids[i] = b->jobs[i]->id;
    crash_guard_enter(ids, b->n);
}

void exec_guard_job(const job_t *job)
{
    const char *id = job->id;
    crash_guard_enter(&id, 1);
}

void exec_guard_clear(void)
{
    crash_guard_leave();
}
