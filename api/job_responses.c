/* Answers that carry jobs: the JSON of lists and submissions (outputs described, without
 * their data), and the JSON of a job or a list of them with their outputs inlined, as JSON
 * numbers or in a binary section after the JSON. */
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
        size_t n = resp->n_jobs;
        resp->jobs = NULL;
        resp->n_jobs = 0;
        api_respond_jobs_whole(req, resp->status, jobs, n, resp->jobs_list);
        for (size_t i = 0; i < n; i++)
            job_free(jobs[i]);
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

void api_respond_jobs_whole(api_request_t *req, int status, job_t *const *jobs, size_t n, bool list)
{
    job_json_section_t section = {0};
    job_json_section_t *into = accepts_binary(req) ? &section : NULL;
    json_t *body = list ? json_array() : NULL;
    for (size_t i = 0; i < (list ? n : 1); i++) {
        /* One section for all of them: each output's binary_offset counts from its start. */
        json_t *o = job_json_from_job(jobs[i], req->cfg->max_inline_output_bytes, load_tensor,
                                      req->env, into);
        if (!list) {
            body = o;
        } else if (json_array_append_new(body, o) < 0) {
            json_decref(body);
            body = NULL;
            break;
        }
    }
    api_respond_json(req, status, body);
    if (body && into) {
        req->resp.framed = true;
        req->resp.section = section;
    } else {
        free(section.bytes);
    }
}

void api_respond_job(api_request_t *req, int status, const job_t *job)
{
    api_respond_jobs_whole(req, status, (job_t *const *)&job, 1, false);
}
