/* POST /v1/jobs bodies through the job JSON parser and validator with the real op table, as
 * the daemon's handler calls it: JSON, then optionally a binary section that tensors name with
 * binary_offset. Input layout: the JSON text, a NUL byte, the binary section (no NUL: none).
 * Every accepted job's tensors must pass the 128-bit size check, and must turn back into JSON. */
#include <errno.h>
#include <string.h>

#include "api/job_json.h"
#include "fuzz_check.h"

static const char *known_buffer = "b0123456789abcdef01234567";

/* Buffers: known_buffer is alice's f32 [3] in host memory; every other id is missing. */
static int fuzz_buffer_desc(void *ud, const char *owner, const char *id, tensor_desc_t *ret,
                            int *ret_device)
{
    if (strcmp(id, known_buffer) != 0 || strcmp(owner, "alice") != 0) return -ENOENT;
    *ret = (tensor_desc_t){.dtype = DTYPE_F32, .ndim = 1, .shape = {3}};
    *ret_device = -1;
    return 0;
}

static const config_t *fuzz_config(void)
{
    static config_t cfg;
    static bool done;
    if (!done) {
        config_defaults(&cfg);
        cfg.max_tensor_bytes = 1 << 20;
        cfg.max_jobs_per_request = 8;
        done = true;
    }
    return &cfg;
}

static void check_job(const job_t *job)
{
    fuzz_check_call(&job->call);
    for (int j = 0; j < job->call.op->n_inputs; j++)
        if (job->call.has_in[j]) fuzz_check_desc(&job->call.in[j]);
    json_t *back = job_json_from_job(job, 1 << 20, NULL, NULL, NULL);
    if (!back) __builtin_trap();
    json_decref(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)data, json_len, JSON_DECODE_ANY, &jerr);
    if (!root) return 0;

    job_json_env_t env = {.cfg = fuzz_config(),
                          .owner = "alice",
                          .now_us = 1700000000000000LL,
                          .find_op = op_find,
                          .buffer_desc = fuzz_buffer_desc,
                          .binary = nul ? nul + 1 : NULL,
                          .binary_len = nul ? size - json_len - 1 : 0};
    job_t **jobs = NULL;
    size_t n = 0;
    bool is_list;
    api_error_t err;
    if (job_json_parse_request(root, &env, "key", &jobs, &n, &is_list, &err) == 0) {
        for (size_t i = 0; i < n; i++)
            check_job(jobs[i]);
        job_json_free_jobs(jobs, n);
    } else if (err.status < 400 || err.status > 599) {
        __builtin_trap();
    }
    json_decref(root);
    return 0;
}
