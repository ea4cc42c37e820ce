/* A fake executor for the scheduler's test suites (support/sched_test.h): it takes as many
 * batches as the test allows, computes nothing, and ends a batch only when the test completes
 * it or gives it back. */
#pragma once

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>

#include "daemon/exec/executor.h"

/* What the fake was handed and what the test lets it do. */
typedef struct fake_exec {
    executor_t base;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* Set by the test while the loop reads them. */
    atomic_int slots;        /* batches it accepts before the test completes some */
    atomic_int turn_down;    /* submits to answer -EAGAIN although slots are free */
    atomic_int device0_free; /* free slots device 0 reports to pinned jobs; -1: as any */
    exec_batch_t *got[4096]; /* every batch handed over, in order */
    int n_got, n_done;
    exec_batch_t *abandoned; /* the last batch the watchdog gave up on */
    int n_abandoned;
    exec_batch_t *cancel_batch; /* the last cancel's batch and job */
    job_t *cancel_job;
} fake_exec_t;

/* Waits until the executor holds at least n batches in total. */
void fake_exec_wait_batches(fake_exec_t *f, int n);

/* Waits until the batches handed over hold at least n jobs in total; returns that total. */
int fake_exec_wait_jobs(fake_exec_t *f, int n);

/* Completes batch i: every job succeeds with zero-filled outputs, charged its share of the
 * time since the fake took the batch (exec_job_time_so_far). */
void fake_exec_complete(fake_exec_t *f, int i);

/* Hands batch i back as a device reset would: interrupted jobs carry the reset's error. */
void fake_exec_give_back(fake_exec_t *f, int i, exec_retry_t retry);

/* The batch the fake has been told to abandon, waiting up to 10 s for it. */
exec_batch_t *fake_exec_wait_abandoned(fake_exec_t *f);

/* A new fake executor that takes no batch until the test sets slots; free() frees it. */
fake_exec_t *fake_exec_new(void);
