/* Test doubles for the API's neighbours: a scheduler that answers inline (on the caller's
 * thread, which is allowed: the API suspends before it posts) with scripted results, an
 * in-memory store behind the store_reader_t read functions, and a small op table.
 *
 * They are link-time fakes: api_fakes.c defines the sched_* and store_* read functions that
 * api/ calls, so the linker takes them instead of the real objects of gpujobd_core. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"

typedef struct fake_sched {
    int next_err; /* error of the next reply (0: success) */
    const char *next_message;
    const job_t *retry_job; /* submit: reply with this job instead (an idempotent retry) */
    const job_t *reply_job; /* wait and cancel reply with this job (borrowed) */
    int submits, waits, cancels, buffer_puts, buffer_deletes;
    size_t last_n; /* jobs of the last submit */
    int last_timeout_ms;
    bool last_owner_was_null;
    char last_owner[OWNER_SIZE];
    char last_id[ID_SIZE];
    job_t *submitted[64]; /* jobs of successful submits, owned */
    int n_submitted;
    buffer_t *last_buffer; /* the last buffer put, owned */
    sched_stats_t stats;
    sched_user_gauge_t user_gauges[4]; /* what sched_get_user_gauges answers */
    int n_user_gauges;
    long users_with_jobs;
    const char *backend_json;   /* what describe answers; NULL: {"name": "fake"} */
    const char *unsupported_op; /* an op the fake backend cannot run; NULL: none */
} fake_sched_t;

extern fake_sched_t fake_sched;

/* Forgets every call, job, buffer and blob of the fakes. */
void fakes_reset(void);

/* The in-memory store: adds a copy of job (with its tensors' bytes held as blobs). */
void fake_store_add_job(const job_t *job);
void fake_store_add_buffer(const buffer_t *buf);
/* A reader pointer to hand to the API (never dereferenced). */
store_reader_t *fake_reader(void);

/* The test op table: "tadd" (inputs x required, y optional, param alpha; x and y of one float
 * dtype and shape; output "out" like x). */
const op_def_t *fake_find_op(const char *name);

/* The answer v as a client reads it: written by the daemon's writer (api/json_write.h), raw
 * nodes included, and parsed back by jansson. A new reference; aborts (failing the calling
 * test) when the writer fails or writes what jansson cannot read. This file links without
 * Check: the libFuzzer target of the API links it too. */
json_t *fake_as_sent(const json_t *v);
