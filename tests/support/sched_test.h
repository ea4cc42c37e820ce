/* What the scheduler's test suites (tests/unit/test_sched_*.c) share: a real store in a fresh
 * state directory, a scheduler on it, a fake executor that the test drives by hand, and
 * submissions and waits whose answers the test waits for.
 *
 * Every helper asserts with Check, so it may be called only from inside a START_TEST body or a
 * checked fixture. */
#pragma once

#include <check.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"
#include "daemon/util/config.h"
#include "support/fake_exec.h"

/* The test's state directory, its configuration, store, scheduler and fake executor: made by
 * sched_test_setup(), freed by sched_test_teardown(). */
extern char sched_test_dir[];
extern config_t sched_test_cfg;
extern store_t *sched_test_store;
extern sched_t *sched_test_sched;
extern fake_exec_t *sched_test_fake;

/* The store's shards, and its inline_blob_bytes unless 0, for the next sched_test_setup(). */
extern int sched_test_next_shards;
extern uint64_t sched_test_next_inline_bytes;

/* Installs the policy of cfg as it stands now: the scheduler reads per-user limits from its
 * policy, built from cfg when it was made, not from cfg itself. */
void sched_test_policy_apply(void);

/* A fresh state directory, its store and a scheduler on it with a new fake executor, not yet
 * started. sync_full: accepted jobs are made durable by the commit syncer, their answers wait
 * for it. */
void sched_test_setup(bool sync_full);

/* Ends what the fake executor still holds, stops and frees the scheduler and the store, and
 * removes the state directory. */
void sched_test_teardown(void);

/* An answer of the scheduler (sched_result_t) as the test reads it, once done is set. */
typedef struct sched_test_box {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int err;
    char ids[64][ID_SIZE];
    job_state_t states[64];
    size_t n;
    bool replayed;
    bool gated;           /* given while its job's end was being committed (end_gate) */
    int batches_started;  /* the fake executor's batches when the answer came */
    char cancel[16];      /* sched_result_t.cancel, "" when none */
    char reasons[64][16]; /* job_t.waiting_reason of each job answered */
    long positions[64];
    char limit[128];     /* sched_result_t.limit, "" when none */
    int64_t reset_at_us; /* sched_result_t.reset_at_us */
} sched_test_box_t;

/* The scheduler's reply callback: copies res into the box that token points at and wakes its
 * waiter. */
void sched_test_on_reply(void *token, const sched_result_t *res);

/* Makes b empty, ready for an answer; sched_test_box_wait() waits until it has one. */
void sched_test_box_init(sched_test_box_t *b);
void sched_test_box_wait(sched_test_box_t *b);

/* A validated `add` job on f32 vectors of n elements. */
job_t *sched_test_add_job(const char *owner, int n, int priority);

/* The files under the store's blobs directory. */
int sched_test_blob_files(void);

/* Submits jobs (taking them) and waits for the answer, in box. */
void sched_test_submit_any(sched_test_box_t *box, job_t **jobs, size_t n);

/* Submits jobs (taking them) and waits for the commit; returns the ids in box. */
void sched_test_submit(sched_test_box_t *box, job_t **jobs, size_t n);

/* Submits n `add` jobs of owner on vectors of size elements, in one array; ids in box. */
void sched_test_submit_many(sched_test_box_t *box, const char *owner, int n, int size);

/* The state of owner's job id as a wait of timeout_ms answers it. */
job_state_t sched_test_waited_state(const char *owner, const char *id, int timeout_ms);

/* The state of owner's job id once it has ended (waiting up to 5 s). */
job_state_t sched_test_ended_state(const char *owner, const char *id);

/* The state of job id as the store has it, read through a reader of its own. */
job_state_t sched_test_stored_state(const char *id);

/* A job of owner on n elements that goes out in a batch of its own. */
job_t *sched_test_lone_job(const char *owner, int n);

/* No file may grow past the size of the WAL named name now (a soft limit, until
 * sched_test_wal_limit_lift): the next commit cannot append to that WAL. Returns that size. */
off_t sched_test_wal_limit(const char *name, struct rlimit *saved);

/* Lifts the limit of sched_test_wal_limit(), restoring saved. */
void sched_test_wal_limit_lift(const struct rlimit *saved);

/* Checked fixtures: sched_test_setup() then the scheduler started, without and with
 * sync_full. */
void sched_test_start(void);
void sched_test_start_durable(void);

/* A test case called name whose tests each run between setup (a checked fixture: one of the
 * above or a suite's own) and sched_test_teardown(), with 30 s each. */
TCase *sched_test_tcase(const char *name, void (*setup)(void));
