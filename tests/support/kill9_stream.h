/* End-to-end test support: a stream of submissions that a kill -9 cuts, and the check of what
 * survived it. A thread of its own posts add jobs one after another and records each one the
 * daemon acknowledged (201); the test kills the daemon with -9 while the stream runs, restarts
 * it, and then finds every acknowledged job final, succeeded with its own output: no
 * acknowledged job is lost or mixed up with another.
 *
 * The jobs are add on i32: x = [k, k+1], y = [1, 1], so out = [k+1, k+2] tells which
 * submission a job came from. Functions named *_ok() fail the test (Check) instead of
 * returning an error. */
#pragma once

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "support/daemon_harness.h"

/* The add job for k (a new reference). */
json_t *e2e_add_job_new(int k);
/* Whether job (a job's JSON) succeeded with out = [k+1, k+2]; when not, why (a sentence of
 * at most size bytes) goes to why. */
bool e2e_add_result_ok(const json_t *job, int k, char *why, size_t size);

/* What the stream recorded: the i-th acknowledged submission (i < n) made job ids[i] from ks[i],
 * and its answer carried the job's success (ended[i]: a waited submission whose job ended in
 * time). refused counts the connections refused, the first of which ends the stream. The
 * other fields belong to the stream. */
typedef struct e2e_kill9_stream {
    atomic_int n;
    char **ids;
    int *ks;
    bool *ended;
    int refused;

    e2e_daemon_t *d;
    const char *path;
    double started, until;
    int cap;
    pthread_t thread;
} e2e_kill9_stream_t;

/* Starts st's thread, which posts add jobs to path ("/v1/jobs", or "/v1/jobs?wait=30" for
 * waited submissions; a borrowed string that must outlive the stream) until a connection is
 * refused (the daemon was killed), `seconds` have passed, or it recorded cap submissions. */
void e2e_kill9_stream_start_ok(e2e_kill9_stream_t *st, e2e_daemon_t *d, const char *path,
                               double seconds, int cap);
/* Waits until the stream has run for min_s seconds and has min_acked submissions
 * acknowledged: how long that takes depends on the machine's load, which a fixed time would
 * leave to chance. Fails the test after 60 s. */
void e2e_kill9_stream_wait_ok(e2e_kill9_stream_t *st, double min_s, int min_acked);
/* Kills the daemon with -9 and waits for the stream's thread to end; prints how many
 * submissions were acknowledged, and fails the test when fewer than 20 were. */
void e2e_kill9_stream_kill_ok(e2e_kill9_stream_t *st);
/* After the restart: waits for each acknowledged job to end and fails the test unless it
 * succeeded with its own output; check (NULL for none) then asserts more of each job, given
 * its final JSON. Returns how many of the answers carried their job's success. */
int e2e_kill9_stream_verify_ok(const e2e_kill9_stream_t *st,
                               void (*check)(const json_t *job, void *arg), void *arg);
/* Frees what the stream recorded. */
void e2e_kill9_stream_clear(e2e_kill9_stream_t *st);
