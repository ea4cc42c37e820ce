/* The scheduler suites' fake executor (fake_exec.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "support/fake_exec.h"

static int fake_submit(executor_t *base, exec_batch_t *b)
{
    fake_exec_t *f = (fake_exec_t *)base;
    pthread_mutex_lock(&f->lock);
    int r = -EAGAIN;
    if (f->turn_down > 0)
        f->turn_down--;
    else if (f->n_got - f->n_done < f->slots) {
        exec_batch_started(b, mono_us()); /* the fake runs a batch as soon as it takes it */
        f->got[f->n_got++] = b;
        pthread_cond_broadcast(&f->cond);
        r = 0;
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

static int fake_free_slots(executor_t *base, int device)
{
    fake_exec_t *f = (fake_exec_t *)base;
    pthread_mutex_lock(&f->lock);
    int n = f->slots - (f->n_got - f->n_done);
    if (device == 0 && f->device0_free >= 0 && f->device0_free < n) n = f->device0_free;
    pthread_mutex_unlock(&f->lock);
    return n > 0 ? n : 0;
}

static json_t *fake_describe(executor_t *base)
{
    return json_pack("{s:s}", "name", "fake");
}

static void fake_destroy(executor_t *base, int timeout_ms) {}

/* Remembers the batch the watchdog gave up on; like a stuck worker, it reports the batch only
 * when the test completes it. */
static void fake_abandon(executor_t *base, exec_batch_t *b)
{
    fake_exec_t *f = (fake_exec_t *)base;
    pthread_mutex_lock(&f->lock);
    f->abandoned = b;
    f->n_abandoned++;
    pthread_mutex_unlock(&f->lock);
}

/* Remembers the cancel's batch and job, and says it stopped the job (it reports the batch only
 * when the test completes it). */
static exec_cancel_t fake_cancel(executor_t *base, exec_batch_t *b, job_t *job)
{
    fake_exec_t *f = (fake_exec_t *)base;
    pthread_mutex_lock(&f->lock);
    f->cancel_batch = b;
    f->cancel_job = job;
    pthread_mutex_unlock(&f->lock);
    return EXEC_CANCEL_STOPPED;
}

static const executor_ops_t fake_ops = {
    .name = "fake",
    .submit = fake_submit,
    .free_slots = fake_free_slots,
    .describe = fake_describe,
    .destroy = fake_destroy,
    .abandon = fake_abandon,
    .cancel = fake_cancel,
};

void fake_exec_wait_batches(fake_exec_t *f, int n)
{
    pthread_mutex_lock(&f->lock);
    for (int i = 0; f->n_got < n && i < 500; i++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&f->cond, &f->lock, &ts);
    }
    pthread_mutex_unlock(&f->lock);
}

int fake_exec_wait_jobs(fake_exec_t *f, int n)
{
    int total = 0;
    for (int tries = 0; tries < 500; tries++) {
        pthread_mutex_lock(&f->lock);
        total = 0;
        for (int i = 0; i < f->n_got; i++)
            total += f->got[i]->n;
        int seen = f->n_got;
        pthread_mutex_unlock(&f->lock);
        if (total >= n) break;
        fake_exec_wait_batches(f, seen + 1);
    }
    return total;
}

void fake_exec_complete(fake_exec_t *f, int i)
{
    exec_batch_t *b = f->got[i];
    int64_t now = mono_us();
    for (int k = 0; k < b->n; k++) {
        job_t *job = b->jobs[k];
        for (int j = 0; j < job->call.n_out; j++) {
            job_tensor_t *t = &job->out[j];
            snprintf(t->name, sizeof t->name, "%s", job->call.out_names[j]);
            t->desc = job->call.out[j];
            t->nbytes = tensor_desc_bytes(&t->desc);
            t->data = calloc(1, t->nbytes ? t->nbytes : 1);
        }
        job->batch_size = b->n;
        /* Its device time: its share of the time since the fake took the batch. */
        job->gpu_ns = exec_job_time_so_far(b, job, now);
    }
    pthread_mutex_lock(&f->lock);
    f->n_done++;
    pthread_mutex_unlock(&f->lock);
    f->base.done(b, f->base.done_ud);
}

void fake_exec_give_back(fake_exec_t *f, int i, exec_retry_t retry)
{
    exec_batch_t *b = f->got[i];
    b->retry = retry;
    for (int k = 0; k < b->n && retry == EXEC_RETRY_INTERRUPTED; k++)
        job_set_error(b->jobs[k], "device_reset", "CUDA: an illegal memory access (test)");
    pthread_mutex_lock(&f->lock);
    f->n_done++;
    pthread_mutex_unlock(&f->lock);
    f->base.done(b, f->base.done_ud);
}

exec_batch_t *fake_exec_wait_abandoned(fake_exec_t *f)
{
    for (int i = 0; i < 1000; i++) {
        pthread_mutex_lock(&f->lock);
        exec_batch_t *b = f->abandoned;
        pthread_mutex_unlock(&f->lock);
        if (b) return b;
        usleep(10 * 1000);
    }
    return NULL;
}

fake_exec_t *fake_exec_new(void)
{
    fake_exec_t *f = calloc(1, sizeof *f);
    ck_assert_ptr_nonnull(f);
    f->base.ops = &fake_ops;
    f->device0_free = -1;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cond, NULL);
    return f;
}
