/* Jobs and buffers in JSON: request bodies of POST /v1/jobs into validated job_t, and
 * job_t / buffer_t into the JSON of DESIGN.md §2. No HTTP and no store here: what the parser
 * needs from the outside (ops, buffer descriptors) comes through job_json_env_t. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/util/config.h"
#include "daemon/job/job.h"

/* An error on its way to the client: the HTTP status, the error code of the JSON body
 * ("invalid_argument"), the field path ("[3].inputs.x.dtype", "" for none) and a message. */
typedef struct api_error {
    int status;
    char code[32];
    char field[128];
    char message[320];
} api_error_t;

typedef struct job_json_env {
    const config_t *cfg;
    const char *owner; /* the submitting user */
    int64_t now_us;    /* "now" for deadlines and created_us */
    /* The submitting user's bound on time_limit_ms (its max_time_limit_ms, policy.h; 0: none),
     * named in a refusal by max_time_limit_key. A job that gives no limit gets
     * cfg->default_time_limit_ms within that bound, or the bound when the default is 0. With
     * time_limit_by_cost, a job whose op's cost estimate (op_cost_ms) passes its limit is
     * refused: the backend (CUDA) cannot stop a launched kernel, so the limit must hold up
     * front. */
    int64_t max_time_limit_ms;
    const char *max_time_limit_key;
    bool time_limit_by_cost;
    /* The op table (op_find in the daemon; tests give their own). */
    const op_def_t *(*find_op)(const char *name);
    /* Whether the daemon's backend runs op (sched_runs_op in the daemon); NULL: every op. */
    bool (*runs_op)(void *ud, const op_def_t *op);
    /* Descriptor of buffer id as seen by owner: 0, or -ENOENT when it is missing or belongs
     * to someone else (both answer 404). *ret_device: the served device a resident buffer
     * lives on (a job using it prefers that device), else -1. NULL: buffer references are
     * refused. */
    int (*buffer_desc)(void *ud, const char *owner, const char *id, tensor_desc_t *ret,
                       int *ret_device);
    void *ud;
    /* The body's binary section, which tensors name with binary_offset (NULL: none). */
    const unsigned char *binary;
    size_t binary_len;
    /* Set by job_json_parse_body() alone, for its own parse: the tensor data cut out of the
     * document, which its tree then names by index (the values the scanner read are taken
     * from it). Callers leave it NULL. */
    struct json_scan *scan;
} job_json_env_t;

/* Parses a POST /v1/jobs body: one job object or a list of 1..cfg->max_jobs_per_request of
 * them, all-or-nothing. idem_key ("" or NULL for none) becomes each job's idempotency key,
 * suffixed ":INDEX" for a list. *ret_jobs is a malloc'd array of n owned jobs. */
int job_json_parse_request(const json_t *root, const job_json_env_t *env, const char *idem_key,
                           job_t ***ret_jobs, size_t *ret_n, bool *ret_is_list, api_error_t *err);
/* The same from the body's text (len bytes of JSON), without a tree of its tensor data: the
 * data is cut out by json_scan() and read straight into typed buffers, and the rest parsed by
 * jansson within cfg->max_json_tree_bytes of memory (413 past it). A list longer than
 * max_jobs_per_request is refused before anything of it is parsed. */
int job_json_parse_body(const char *text, size_t len, const job_json_env_t *env,
                        const char *idem_key, job_t ***ret_jobs, size_t *ret_n, bool *ret_is_list,
                        api_error_t *err);
/* Frees n jobs and the array. */
void job_json_free_jobs(job_t **jobs, size_t n);

/* Loads the bytes of an output tensor for inlining: 0 and a new malloc'd block, or a negative
 * errno (the output is then described without data). */
typedef int (*job_json_load_fn)(void *ud, const job_tensor_t *t, void **ret_data);

/* The binary section of an answer, as a request has one (Gpujob-Json-Length): the bytes of
 * inline outputs, which their JSON names with binary_offset instead of carrying as data. Free
 * bytes when done. */
typedef struct job_json_section {
    unsigned char *bytes;
    size_t len, cap;
} job_json_section_t;

/* RFC 3339 UTC with microseconds ("2026-01-02T03:04:05.000006Z") as a JSON string (a new
 * reference), or JSON null for 0. */
json_t *job_json_time(int64_t us);

/* The job's JSON (a new reference, NULL on allocation failure). Outputs of at most
 * inline_max bytes carry their data: from t->data when in memory, else through load (which may
 * be NULL: then only in-memory data is inlined). With a section, that data is appended to it
 * and named by "binary_offset"; without, it is "data", JSON numbers. */
json_t *job_json_from_job(const job_t *job, uint64_t inline_max, job_json_load_fn load,
                          void *load_ud, job_json_section_t *section);
/* {"dtype", "shape", "bytes"}: a new reference. */
json_t *job_json_tensor_desc(const tensor_desc_t *d);
json_t *job_json_from_buffer(const buffer_t *buf);
