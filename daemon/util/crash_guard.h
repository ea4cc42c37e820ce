/* The poison-job guard: a job whose run crashes the process must not crash it again after the
 * restart. Recovery re-queues the jobs a dead daemon left `running` (at-least-once), which is
 * right after a kill -9 but wrong for the job that killed it: that one would crash every start.
 *
 * Each thread that runs jobs keeps the ids of the jobs it runs now in a slot of its own,
 * formatted ahead of time (crash_guard_enter before the run, crash_guard_leave after). A handler
 * for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, on an alternate signal stack so that a stack
 * overflow reaches it too, appends the faulting thread's ids to STATE_DIR/poisoned with
 * write(2) (the only calls it makes are async-signal-safe), then lets the default action kill
 * the process. A fatal signal sent by another process (kill -SEGV) blames nobody, nor does a
 * crash on a thread that runs no job: those jobs re-run as after a kill -9.
 *
 * At the next start the scheduler reads the file (crash_guard_take), fails the listed jobs that
 * the store still has running, and empties it (crash_guard_clear). */
#pragma once

#include <stddef.h>

#include "id.h"

/* A job that was running on the thread that took a fatal signal. */
typedef struct crash_guard_victim {
    char id[ID_SIZE];
    int signo;
} crash_guard_victim_t;

/* Opens (creating, 0600) STATE_DIR/poisoned for appending and installs the fatal-signal
 * handlers. Once per process, before any thread runs a job. 0, or a negative errno. */
int crash_guard_install(const char *state_dir);

/* The calling thread runs jobs: gives it a slot for up to max_jobs ids at a time and an
 * alternate signal stack. 0, or -ENOMEM (the thread then runs unguarded). Works whether or not
 * the guard is installed, so that tests of the executors need no handler. */
int crash_guard_thread_enter(int max_jobs);
/* The thread runs no more jobs: its slot and its alternate stack go. */
void crash_guard_thread_leave(void);

/* The calling thread starts the run of n jobs (ids[i]); past its max_jobs, the rest are not
 * recorded. Without a slot (crash_guard_thread_enter failed or was not called), nothing. */
void crash_guard_enter(const char *const *ids, int n);
/* The run is over: a fatal signal now blames nobody. */
void crash_guard_leave(void);

/* The jobs that crashed the process before this start, as the file lists them: a new array in
 * *ret (free() it; NULL when n is 0) and its length in *ret_n. A line that is not a record is
 * skipped. 0 (nothing when the guard is not installed), or a negative errno. */
int crash_guard_take(crash_guard_victim_t **ret, size_t *ret_n);
/* Empties the file, once its jobs are dealt with. 0, or a negative errno. */
int crash_guard_clear(void);
