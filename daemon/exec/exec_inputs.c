/* Input bytes that are not in memory, read through a worker's blob reader. */
#include "exec_inputs.h"

#include <errno.h>
#include <stdio.h>

int exec_input_buffer_get(const exec_blob_reader_t *blobs, void *rd, const job_tensor_t *t,
                          buffer_t **ret, char *why, size_t why_size)
{
    buffer_t *buf = NULL;
    int r = blobs->buffer_get(rd, t->buffer_id, &buf);
    if (r < 0) {
        snprintf(why, why_size, "input '%s': buffer %s no longer exists", t->name, t->buffer_id);
        return r;
    }
    if (buf->nbytes != t->nbytes) {
        snprintf(why, why_size, "input '%s': buffer %s holds %llu bytes, not the %llu of the input",
                 t->name, t->buffer_id, (unsigned long long)buf->nbytes,
                 (unsigned long long)t->nbytes);
        buffer_free(buf);
        return -EINVAL;
    }
    *ret = buf;
    return 0;
}

int exec_input_take_buffer(const exec_blob_reader_t *blobs, void *rd, job_tensor_t *t,
                           buffer_t *buf, char *why, size_t why_size)
{
    if (buf->data) {
        t->data = buf->data;
        buf->data = NULL;
        return 0;
    }
    if (!buf->durable) {
        /* Its bytes were only ever in the backend's resident copy, which is not where this job
         * runs: on another device, or lost with its device. */
        snprintf(why, why_size,
                 "input '%s': ephemeral buffer %s is not in memory where the job runs (its "
                 "device %d lost it, or the job was pinned elsewhere)",
                 t->name, t->buffer_id, buf->device);
        return -ENOENT;
    }
    int r = blobs->read(rd, buf->blob, buf->nbytes, &t->data);
    if (r < 0)
        snprintf(why, why_size, "input '%s': could not read buffer %s", t->name, t->buffer_id);
    return r;
}

int exec_input_load(const exec_blob_reader_t *blobs, void *rd, job_tensor_t *t, char *why,
                    size_t why_size)
{
    if (t->buffer_id[0]) {
        buffer_t *buf = NULL;
        int r = exec_input_buffer_get(blobs, rd, t, &buf, why, why_size);
        if (r < 0) return r;
        r = exec_input_take_buffer(blobs, rd, t, buf, why, why_size);
        buffer_free(buf);
        return r;
    }
    if (!t->blob) {
        snprintf(why, why_size, "input '%s' has no stored bytes", t->name);
        return -ENOENT;
    }
    int r = blobs->read(rd, t->blob, t->nbytes, &t->data);
    if (r < 0) snprintf(why, why_size, "input '%s': could not read its bytes", t->name);
    return r;
}
