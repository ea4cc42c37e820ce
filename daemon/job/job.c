#include "job.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const state_names[JOB_STATE_COUNT] = {
    [JOB_QUEUED] = "queued", [JOB_RUNNING] = "running",     [JOB_SUCCEEDED] = "succeeded",
    [JOB_FAILED] = "failed", [JOB_CANCELLED] = "cancelled",
};

const char *job_state_name(job_state_t s)
{
    return s < JOB_STATE_COUNT ? state_names[s] : "invalid";
}

int job_state_parse(const char *name, job_state_t *ret)
{
    for (int i = 0; name && i < JOB_STATE_COUNT; i++)
        if (strcmp(name, state_names[i]) == 0) {
            *ret = (job_state_t)i;
            return 0;
        }
    return -EINVAL;
}

bool job_state_is_final(job_state_t s)
{
    return s == JOB_SUCCEEDED || s == JOB_FAILED || s == JOB_CANCELLED;
}

const char *job_op_name(const job_t *job)
{
    if (job->call.op) return job->call.op->name;
    return job->op_name[0] ? job->op_name : NULL;
}

job_t *job_new(void)
{
    job_t *job = calloc(1, sizeof *job);
    if (job) {
        job->device = -1;
        job->preferred_device = -1;
        job->run_device = -1;
    }
    return job;
}

static void tensor_clear(job_tensor_t *t)
{
    free(t->data);
    free(t->blob);
    t->data = NULL;
    t->blob = NULL;
}

void job_free(job_t *job)
{
    if (!job) return;
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        tensor_clear(&job->in[j]);
        tensor_clear(&job->out[j]);
    }
    free(job->params_json);
    free(job);
}

job_t *job_copy_shown(const job_t *job)
{
    job_t *copy = malloc(sizeof *copy);
    if (!copy) return NULL;
    *copy = *job;
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        copy->in[j].data = copy->out[j].data = NULL;
        copy->in[j].blob = copy->out[j].blob = NULL;
    }
    copy->params_json = job->params_json ? strdup(job->params_json) : NULL;
    if (job->params_json && !copy->params_json) {
        free(copy);
        return NULL;
    }
    return copy;
}

job_t *job_copy_answer(const job_t *job, uint64_t max_data_bytes)
{
    job_t *copy = job_copy_shown(job);
    bool ok = copy != NULL;
    for (int j = 0; ok && j < OP_MAX_TENSORS; j++) {
        const job_tensor_t *t = &job->out[j];
        job_tensor_t *c = &copy->out[j];
        bool data = t->data && t->nbytes <= max_data_bytes;
        if (t->blob) ok = (c->blob = strdup(t->blob)) != NULL;
        if (ok && data) ok = (c->data = malloc(t->nbytes ? t->nbytes : 1)) != NULL;
        if (ok && data) memcpy(c->data, t->data, t->nbytes);
    }
    if (ok) return copy;
    job_free(copy);
    return NULL;
}

void job_set_error(job_t *job, const char *code, const char *fmt, ...)
{
    snprintf(job->error_code, sizeof job->error_code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(job->error_message, sizeof job->error_message, fmt, ap);
    va_end(ap);
}

void job_describe_outputs(job_t *job)
{
    for (int j = 0; j < job->call.n_out; j++) {
        job_tensor_t *t = &job->out[j];
        snprintf(t->name, sizeof t->name, "%s", job->call.out_names[j]);
        t->desc = job->call.out[j];
        t->nbytes = tensor_desc_bytes(&t->desc);
    }
}

buffer_t *buffer_new(void)
{
    buffer_t *buf = calloc(1, sizeof *buf);
    if (buf) {
        buf->device = -1;
        buf->durable = true;
    }
    return buf;
}

void buffer_free(buffer_t *buf)
{
    if (!buf) return;
    free(buf->data);
    free(buf->blob);
    free(buf);
}

void job_idem_key_format(char ret[IDEM_KEY_SIZE], const char *key, bool in_list, size_t index)
{
    if (in_list)
        snprintf(ret, IDEM_KEY_SIZE, "%s%c%zu", key, JOB_IDEM_LIST_SEP, index);
    else
        snprintf(ret, IDEM_KEY_SIZE, "%s", key);
}

void job_idem_key_shown(const char *job_key, char ret[IDEM_KEY_SIZE])
{
    snprintf(ret, IDEM_KEY_SIZE, "%s", job_key);
    char *sep = strchr(ret, JOB_IDEM_LIST_SEP);
    if (sep) *sep = ':';
}

int64_t job_idem_key_split(const char *job_key, char ret_key[IDEM_KEY_SIZE])
{
    snprintf(ret_key, IDEM_KEY_SIZE, "%s", job_key);
    char *sep = strchr(ret_key, JOB_IDEM_LIST_SEP);
    if (!sep) return -1;
    *sep = '\0';
    return strtoll(sep + 1, NULL, 10);
}
