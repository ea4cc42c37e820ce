/* Buffers (uploads kept by the daemon for later jobs) and the daemon's self-description
 * (/v1/info). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpujob_internal.h"

/* ---- Buffers ----------------------------------------------------------------------------- */

static int buffer_from_json(gpujob_client_t *c, const json_t *o, gpujob_buffer_t *ret)
{
    gpujob_tensor_t desc;
    const char *id = json_string_value(json_object_get(o, "id"));
    const char *created = json_string_value(json_object_get(o, "created_at"));
    if (!id || strlen(id) >= sizeof ret->id || gjc_desc_from_json(o, &desc) < 0)
        return gjc_fail(c, -EBADMSG, "the answer is not a buffer description");
    gpujob_buffer_t b = {.dtype = desc.dtype, .ndim = desc.ndim, .bytes = desc.nbytes};
    memcpy(b.shape, desc.shape, sizeof b.shape);
    snprintf(b.id, sizeof b.id, "%s", id);
    snprintf(b.created_at, sizeof b.created_at, "%s", created ? created : "");
    b.resident = json_is_true(json_object_get(o, "resident"));
    *ret = b;
    return 0;
}

static int buffer_post(gpujob_client_t *c, const char *query, const char *content_type,
                       const void *body, size_t len, gpujob_buffer_t *ret)
{
    char *path = NULL;
    if (asprintf(&path, "/v1/buffers?%s", query) < 0) return gjc_fail(c, -ENOMEM, "out of memory");
    gjc_request_t req = {.method = "POST",
                         .path = path,
                         .content_type = content_type,
                         .body = body,
                         .body_len = len,
                         .accept = "application/json"};
    json_t *root = NULL;
    int r = gjc_call_json(c, &req, 201, 0, &root, NULL);
    free(path);
    if (r < 0) return r;
    r = buffer_from_json(c, root, ret);
    json_decref(root);
    return r;
}

int gpujob_buffer_put(gpujob_client_t *c, const gpujob_tensor_t *t, bool resident,
                      gpujob_buffer_t *ret)
{
    gjc_clear_error(c);
    size_t bytes = 0;
    if (!t || gjc_tensor_bytes(t->dtype, t->ndim, t->shape, &bytes) < 0 || bytes != t->nbytes ||
        (bytes && !t->data))
        return gjc_fail(c, -EINVAL, "the tensor's dtype, shape and byte count disagree");
    char query[GPUJOB_MAX_DIMS * 24 + 64];
    int n =
        snprintf(query, sizeof query, "dtype=%s&resident=%s&shape=", gpujob_dtype_name(t->dtype),
                 resident ? "true" : "false");
    for (int i = 0; i < t->ndim; i++)
        n += snprintf(query + n, sizeof query - (size_t)n, "%s%lld", i ? "%2C" : "",
                      (long long)t->shape[i]);
    return buffer_post(c, query, "application/octet-stream", t->data, bytes, ret);
}

int gpujob_buffer_put_npy(gpujob_client_t *c, const void *file, size_t len, bool resident,
                          gpujob_buffer_t *ret)
{
    gjc_clear_error(c);
    if (!file || len == 0) return gjc_fail(c, -EINVAL, "empty .npy file");
    return buffer_post(c, resident ? "resident=true" : "resident=false", "application/x-npy", file,
                       len, ret);
}

int gpujob_buffer_put_file(gpujob_client_t *c, const char *path, bool resident,
                           gpujob_buffer_t *ret)
{
    gjc_clear_error(c);
    char msg[300] = "";
    gpujob_tensor_t t;
    /* Parsing first reports a bad file here, with its name, rather than as a 400 from afar. */
    int r = gpujob_npy_load(path, &t, msg, sizeof msg);
    if (r < 0) return gjc_fail(c, r, "%s", msg);
    r = gpujob_buffer_put(c, &t, resident, ret);
    gpujob_tensor_clear(&t);
    return r;
}

int gpujob_buffer_keep(gpujob_client_t *c, const char *job_id, const char *output, bool resident,
                       gpujob_buffer_t *ret)
{
    gjc_clear_error(c);
    if (!job_id || !job_id[0] || !output || !output[0])
        return gjc_fail(c, -EINVAL, "empty job id or output name");
    char *job = gjc_escape(c, job_id), *name = gjc_escape(c, output), *query = NULL;
    int r = 0;
    if (!job || !name ||
        asprintf(&query, "job=%s&output=%s&resident=%s", job, name, resident ? "true" : "false") <
            0) {
        query = NULL;
        r = gjc_fail(c, -ENOMEM, "out of memory");
    }
    free(job);
    free(name);
    if (r == 0) r = buffer_post(c, query, NULL, NULL, 0, ret);
    free(query);
    return r;
}

static char *buffer_path(gpujob_client_t *c, const char *id)
{
    if (!id || !id[0]) {
        gjc_fail(c, -EINVAL, "empty buffer id");
        return NULL;
    }
    char *escaped = gjc_escape(c, id), *path = NULL;
    if (!escaped || asprintf(&path, "/v1/buffers/%s", escaped) < 0) {
        path = NULL;
        gjc_fail(c, -ENOMEM, "out of memory");
    }
    free(escaped);
    return path;
}

int gpujob_buffer_get(gpujob_client_t *c, const char *id, gpujob_buffer_t *ret)
{
    gjc_clear_error(c);
    char *path = buffer_path(c, id);
    if (!path) return id && id[0] ? -ENOMEM : -EINVAL;
    gjc_request_t req = {.method = "GET", .path = path, .accept = "application/json"};
    json_t *root = NULL;
    int r = gjc_call_json(c, &req, 200, 0, &root, NULL);
    free(path);
    if (r < 0) return r;
    r = buffer_from_json(c, root, ret);
    json_decref(root);
    return r;
}

int gpujob_buffer_delete(gpujob_client_t *c, const char *id)
{
    gjc_clear_error(c);
    char *path = buffer_path(c, id);
    if (!path) return id && id[0] ? -ENOMEM : -EINVAL;
    gjc_request_t req = {.method = "DELETE", .path = path, .accept = "application/json"};
    gjc_response_t resp = {.retry_after_s = -1};
    int r = gjc_perform(c, &req, &resp);
    /* 200 with the buffer or 204 without a body: both mean it is gone. */
    if (r >= 0) r = gjc_check_status(c, &resp, 200, 204);
    gjc_response_clear(&resp);
    free(path);
    return r;
}

/* ---- Info -------------------------------------------------------------------------------- */

struct gpujob_info {
    json_t *root;
    char *text;
};

int gpujob_info(gpujob_client_t *c, gpujob_info_t **ret)
{
    gjc_clear_error(c);
    gjc_request_t req = {.method = "GET", .path = "/v1/info", .accept = "application/json"};
    json_t *root = NULL;
    int r = gjc_call_json(c, &req, 200, 0, &root, NULL);
    if (r < 0) return r;
    if (!json_is_object(root) || !json_is_string(json_object_get(root, "version"))) {
        json_decref(root);
        return gjc_fail(c, -EBADMSG, "GET /v1/info: the answer has no version");
    }
    gpujob_info_t *info = calloc(1, sizeof *info);
    if (info) info->text = gjc_json_dumps(root, JSON_COMPACT);
    if (!info || !info->text) {
        free(info);
        json_decref(root);
        return gjc_fail(c, -ENOMEM, "out of memory");
    }
    info->root = root;
    *ret = info;
    return 0;
}

void gpujob_info_free(gpujob_info_t *info)
{
    if (!info) return;
    json_decref(info->root);
    free(info->text);
    free(info);
}

const char *gpujob_info_version(const gpujob_info_t *info)
{
    return json_string_value(json_object_get(info->root, "version"));
}

const char *gpujob_info_backend(const gpujob_info_t *info)
{
    json_t *backend = json_object_get(info->root, "backend");
    const char *b = json_is_string(backend) ? json_string_value(backend)
                                            : json_string_value(json_object_get(backend, "name"));
    return b ? b : "";
}

size_t gpujob_info_device_count(const gpujob_info_t *info)
{
    return json_array_size(json_object_get(json_object_get(info->root, "backend"), "devices"));
}

size_t gpujob_info_op_count(const gpujob_info_t *info)
{
    return json_array_size(json_object_get(info->root, "ops"));
}

static const char *op_string(const gpujob_info_t *info, size_t i, const char *key)
{
    json_t *op = json_array_get(json_object_get(info->root, "ops"), i);
    return json_string_value(json_object_get(op, key));
}

const char *gpujob_info_op_name(const gpujob_info_t *info, size_t i)
{
    return op_string(info, i, "name");
}

const char *gpujob_info_op_summary(const gpujob_info_t *info, size_t i)
{
    return op_string(info, i, "summary");
}

const char *gpujob_info_json(const gpujob_info_t *info)
{
    return info->text;
}
