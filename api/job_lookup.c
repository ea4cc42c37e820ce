/* Finding a job the user may see, one of its outputs, and that output's bytes: what the job
 * handlers (get, output download) and the buffer handlers (a buffer kept from a job's output)
 * share. Another owner's job answers 404, as if it did not exist. */
#include "api_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int api_job_find(api_request_t *req, const char *id, const char *field, job_t **ret)
{
    if (api_id_check(req, 'j', id, field)) return API_DONE;
    store_reader_t *rd = api_request_reader(req);
    if (!rd) return API_DONE;
    job_t *job = NULL;
    int r = store_job_get(rd, id, &job);
    if (r == 0 && !api_request_may_see(req, job->owner)) {
        job_free(job);
        r = -ENOENT;
    }
    if (r == -ENOENT) {
        api_respond_not_found(req, 'j', id, field);
        return API_DONE;
    }
    if (r < 0) {
        api_respond_errno(req, r, "reading the job failed");
        return API_DONE;
    }
    *ret = job;
    return 0;
}

int api_job_find_output(api_request_t *req, const char *id, const char *id_field, const char *name,
                        const char *name_field, job_t **ret_job, const job_tensor_t **ret_t)
{
    job_t *job;
    if (api_job_find(req, id, id_field, &job)) return API_DONE;
    if (job->state != JOB_SUCCEEDED) {
        api_respond_error(req, 409, "conflict", id_field,
                          "job '%s' is %s; outputs exist once it has succeeded", job->id,
                          job_state_name(job->state));
        job_free(job);
        return API_DONE;
    }
    const job_tensor_t *t = NULL;
    for (int j = 0; j < OP_MAX_TENSORS && !t; j++)
        if (job->out[j].name[0] && strcmp(job->out[j].name, name) == 0) t = &job->out[j];
    if (!t) {
        api_respond_error(req, 404, "not_found", name_field, "job '%s' has no output '%.64s'",
                          job->id, name);
        job_free(job);
        return API_DONE;
    }
    if (store_blob_expired(t->blob)) {
        api_respond_error(req, 410, "expired", name_field,
                          "output '%.64s' of job '%s' was expired early: the store was past its "
                          "bound ([store] max_bytes)",
                          name, job->id);
        job_free(job);
        return API_DONE;
    }
    *ret_job = job;
    *ret_t = t;
    return 0;
}

int api_job_read_output(api_request_t *req, const job_tensor_t *t, void **ret_bytes)
{
    void *bytes = NULL;
    int r = 0;
    if (t->data) {
        bytes = malloc(t->nbytes ? t->nbytes : 1);
        if (!bytes)
            r = -ENOMEM;
        else
            memcpy(bytes, t->data, t->nbytes);
    } else if (t->blob) {
        r = store_blob_read(req->env->reader(req->env), t->blob, t->nbytes, &bytes);
    } else {
        r = -EIO;
    }
    if (r < 0) {
        /* A missing blob of a succeeded job is the store's fault, not a missing resource. */
        api_respond_errno(req, r == -ENOENT ? -EIO : r, "reading the output failed");
        return API_DONE;
    }
    *ret_bytes = bytes;
    return 0;
}
