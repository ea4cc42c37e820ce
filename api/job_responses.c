/* Answers that carry jobs: the JSON of lists and submissions (outputs described, without
 * their data), and the JSON of a single job with its outputs inlined, as JSON numbers or in a
 * binary section after the JSON. */
#include "api_internal.h"

#include <errno.h>
#include <stdlib.h>

/* Reads an output's bytes through the calling thread's reader (for inlining). */
static int load_tensor(void *ud, const job_tensor_t *t, void **ret_data)
{
    api_env_t *env = ud;
    store_reader_t *rd = t->blob ? env->reader(env) : NULL;
    if (!rd) return -ENOENT;
    return store_blob_read(rd, t->blob, t->nbytes, ret_data);
}

json_t *api_job_json(const job_t *job)
{
    return job_json_from_job(job, 0, NULL, NULL, NULL);
}

json_t *api_jobs_json(job_t *const *jobs, size_t n, bool list)
{
    if (!list) return n ? api_job_json(jobs[0]) : NULL;
    json_t *body = json_array();
    for (size_t i = 0; body && i < n; i++)
        json_array_append_new(body, api_job_json(jobs[i]));
    return body;
}

void api_response_build(api_request_t *req)
{
    api_response_t *resp = &req->resp;
    if (!resp->jobs) return;
    if (resp->jobs_whole) {
        job_t **jobs = resp->jobs;
        resp->jobs = NULL;
        resp->n_jobs = 0;
        api_respond_job(req, resp->status, jobs[0]);
        job_free(jobs[0]);
        free(jobs);
        return;
    }
    api_respond_json(req, resp->status, api_jobs_json(resp->jobs, resp->n_jobs, resp->jobs_list));
}

/* True when the Accept header names application/octet-stream before application/json (a
 * client that reads binary sections); absent, or naming neither, JSON. */
static bool accepts_binary(const api_request_t *req)
{
    static const char *const media[] = {"application/json", "application/octet-stream"};
    return api_accept_pick(req, media, 2) == 1;
}

void api_respond_job(api_request_t *req, int status, const job_t *job)
{
    job_json_section_t section = {0};
    bool binary = accepts_binary(req);
    json_t *o = job_json_from_job(job, req->cfg->max_inline_output_bytes, load_tensor, req->env,
                                  binary ? &section : NULL);
    api_respond_json(req, status, o);
    if (o && binary) {
        req->resp.framed = true;
        req->resp.section = section;
    } else {
        free(section.bytes);
    }
}
