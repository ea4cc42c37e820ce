/* Handlers of /v1/buffers (uploads go to the scheduler, metadata comes from the store). A buffer is
 * uploaded (raw bytes with ?dtype=&shape=, or a .npy file) or kept from a job's output
 * (?job=&output=). */
#include "api_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_codec.h"

/* The descriptor of an application/octet-stream upload of a body of length bytes, from ?dtype=
 * and ?shape=. 0, or API_DONE after answering. */
static int raw_upload_desc(api_request_t *req, uint64_t length, tensor_desc_t *ret)
{
    const config_t *cfg = req->cfg;
    const char *dtype = api_query(req, "dtype"), *shape = api_query(req, "shape");
    tensor_desc_t d = {0};
    if (!dtype || dtype_parse(dtype, &d.dtype) < 0) {
        api_respond_error(req, 400, "invalid_argument", "query.dtype",
                          "dtype must be one of f32, f16, bf16, f64, i8, i32, u32, i64");
        return API_DONE;
    }
    if (!shape) {
        api_respond_error(req, 400, "invalid_argument", "query.shape",
                          "shape is required, like shape=2,3 (empty for a scalar)");
        return API_DONE;
    }
    op_error_t cerr;
    if (codec_shape_parse_csv(shape, &d, &cerr) < 0) {
        api_respond_error(req, 400, "invalid_argument", cerr.field, "%s", cerr.message);
        return API_DONE;
    }
    int r = tensor_desc_check(&d, cfg->max_tensor_bytes);
    if (r == -E2BIG) {
        api_respond_error(req, 413, "payload_too_large", "query.shape",
                          "a buffer of %" PRIu64 " bytes exceeds the limit of %" PRIu64,
                          tensor_desc_bytes(&d), cfg->max_tensor_bytes);
        return API_DONE;
    }
    if (r < 0) {
        api_respond_error(req, 400, "invalid_argument", "query.shape",
                          "shape's byte size overflows");
        return API_DONE;
    }
    if (length != tensor_desc_bytes(&d)) {
        api_respond_error(req, 400, "invalid_argument", "body",
                          "body has %" PRIu64 " bytes but dtype and shape need %" PRIu64, length,
                          tensor_desc_bytes(&d));
        return API_DONE;
    }
    *ret = d;
    return 0;
}

/* A large durable upload streams to a blob file. An ephemeral one (?durable=false) of raw
 * bytes streams into the executor's resident copy (api_buffer_upload_begin), never held whole
 * in host memory nor written to disk; any other ephemeral one (a .npy file) goes into memory
 * allocated whole at once, so that a large one is not copied by growing. */
api_body_sink_t api_buffer_put_streams_body(const api_env_t *env, const char *content_type,
                                            uint64_t length, api_query_peek_fn peek, void *cls)
{
    const char *durable = peek(cls, "durable");
    bool raw = content_type &&
               api_media_is(content_type, strlen(content_type), "application/octet-stream");
    if (durable && strcmp(durable, "false") == 0)
        return raw && !peek(cls, "job") && !peek(cls, "output") ? API_BODY_UPLOAD
                                                                : API_BODY_MEMORY_WHOLE;
    bool to_file = length > env->cfg->inline_blob_bytes && content_type &&
                   (raw || api_media_is(content_type, strlen(content_type), "application/x-npy"));
    return to_file ? API_BODY_FILE : API_BODY_MEMORY;
}

static void buffer_put_reply(void *token, const sched_result_t *res)
{
    api_request_t *req = token;
    if (res->err == -EDQUOT)
        api_respond_error(req, 413, "quota_exceeded", res->limit, "%s", res->message);
    else if (res->err)
        api_respond_errno(req, res->err, res->message);
    else if (!res->buffer)
        api_respond_error(req, 500, "internal", NULL, "the scheduler returned no buffer");
    else
        api_respond_json(req, 201, job_json_from_buffer(res->buffer));
    api_request_resume(req);
}

/* True, after answering 400 with message, when ?dtype= or ?shape= was given. */
static bool dtype_or_shape_given(api_request_t *req, const char *message)
{
    const char *field = api_query(req, "dtype")   ? "query.dtype"
                        : api_query(req, "shape") ? "query.shape"
                                                  : NULL;
    if (field) api_respond_error(req, 400, "invalid_argument", field, "%s", message);
    return field != NULL;
}

/* A buffer made from the output of a job that succeeded (?job=&output=): its bytes are
 * copied within the daemon, not sent back and forth by the client, so a pipeline keeps one
 * job's result for the next (resident, in device memory, with ?resident=true). The job and
 * its output, to read once the quota allows; 0, or API_DONE after answering. */
static int job_output_source(api_request_t *req, job_t **ret_job, const job_tensor_t **ret_t)
{
    const char *job_id = api_query(req, "job"), *output = api_query(req, "output");
    if (!job_id || !output) {
        api_respond_error(req, 400, "invalid_argument", job_id ? "query.output" : "query.job",
                          "job and output name a job's output together");
        return API_DONE;
    }
    if (dtype_or_shape_given(req, "a buffer made from a job's output takes its dtype and shape"))
        return API_DONE;
    /* A large body may have been streamed to a file as it came (api_buffer_put_streams_body
     * decides from the headers, before the query is read); the request's end removes that
     * file. */
    if (req->body_len || req->body_file) {
        api_respond_error(req, 400, "invalid_argument", "body",
                          "a buffer made from a job's output takes no body");
        return API_DONE;
    }
    return api_job_find_output(req, job_id, "query.job", output, "query.output", ret_job, ret_t);
}

/* True, after answering 413, when nbytes more bytes would pass the user's quota of stored
 * bytes (a durable buffer), or of resident bytes for a resident buffer (or a quota could not
 * be read). */
static bool buffer_quota_refuses(api_request_t *req, uint64_t nbytes, bool resident, bool durable)
{
    policy_limits_t l;
    api_user_limits(req, &l);
    resident = resident && l.value[CONFIG_POLICY_MAX_RESIDENT_BYTES];
    durable = durable && l.value[CONFIG_POLICY_MAX_STORED_BYTES];
    if (!resident && !durable) return false;
    store_reader_t *rd = api_request_reader(req);
    if (!rd) return true;
    store_usage_t u;
    char why[160];
    int r = store_usage_get(rd, req->user.name, &u);
    if (r < 0) {
        api_respond_errno(req, r, "reading the resident quota failed");
        return true;
    }
    config_policy_key_t key = CONFIG_POLICY_MAX_STORED_BYTES;
    bool over = durable && policy_bytes_exceeded(&l, key, req->user.name, (uint64_t)u.buffer_bytes,
                                                 nbytes, why, sizeof why);
    if (!over && resident) {
        key = CONFIG_POLICY_MAX_RESIDENT_BYTES;
        over = policy_bytes_exceeded(&l, key, req->user.name, (uint64_t)u.resident_bytes, nbytes,
                                     why, sizeof why);
    }
    if (over) api_respond_error(req, 413, "quota_exceeded", l.source[key], "%s", why);
    return over;
}

/* The descriptor of a .npy upload, from its header, and where its data starts in the body
 * (a streamed upload keeps only its header in memory). 0, or API_DONE after answering. */
static int npy_upload_desc(api_request_t *req, tensor_desc_t *ret, size_t *ret_offset)
{
    if (dtype_or_shape_given(req, "a .npy upload takes dtype and shape from its header"))
        return API_DONE;
    op_error_t cerr;
    uint64_t max = req->cfg->max_tensor_bytes;
    tensor_desc_t d;
    size_t offset;
    int r;
    if (req->body_file) {
        r = codec_npy_parse_header(req->body, req->body_head_len, max, &d, &offset, &cerr);
        if (r == 0) r = codec_npy_check_data_bytes(&d, req->body_len - offset, &cerr);
    } else {
        r = codec_npy_parse(req->body, req->body_len, max, &d, &offset, &cerr);
    }
    if (r < 0) {
        int status = r == -E2BIG ? 413 : 400;
        api_respond_error(req, status, NULL, cerr.field, "%s", cerr.message);
        return API_DONE;
    }
    *ret = d;
    *ret_offset = offset;
    return 0;
}

/* Where a new buffer's bytes come from. */
typedef struct upload {
    tensor_desc_t desc;
    size_t offset;              /* of the data in the body (a .npy header comes first) */
    job_t *job;                 /* whose output the buffer is made from, if any (owned) */
    const job_tensor_t *output; /* that output, in job */
} upload_t;

/* The source of a buffer upload: a job's output, a raw body with ?dtype=&shape=, or a .npy
 * file. 0, or API_DONE after answering. */
static int upload_source(api_request_t *req, upload_t *ret)
{
    upload_t u = {0};
    if (api_query(req, "job") || api_query(req, "output")) {
        if (job_output_source(req, &u.job, &u.output)) return API_DONE;
        u.desc = u.output->desc;
    } else if (api_content_type_is(req, "application/octet-stream")) {
        if (raw_upload_desc(req, req->body_len, &u.desc)) return API_DONE;
    } else if (api_content_type_is(req, "application/x-npy")) {
        if (npy_upload_desc(req, &u.desc, &u.offset)) return API_DONE;
    } else {
        api_respond_error(req, 415, "unsupported_media_type", "header.Content-Type",
                          "upload a buffer as application/octet-stream (with ?dtype=&shape=) or "
                          "application/x-npy");
        return API_DONE;
    }
    *ret = u;
    return 0;
}

/* Gives buf its bytes from the upload (u->job is freed). 0, or API_DONE after answering. */
static int upload_take_bytes(api_request_t *req, upload_t *u, buffer_t *buf)
{
    if (u->job) {
        int r = api_job_read_output(req, u->output, &buf->data);
        job_free(u->job);
        u->job = NULL;
        return r;
    }
    if (req->body_file) {
        /* Streamed to its file as it arrived: synced now, the buffer's bytes from there on. */
        int r = store_blob_stream_finish(req->body_file, &buf->blob);
        req->body_file = NULL;
        if (r < 0) {
            api_respond_errno(req, r, "storing the upload failed");
            return API_DONE;
        }
        return 0;
    }
    /* The body becomes the buffer's bytes without a copy. */
    buf->data = req->body ? req->body : malloc(1);
    req->body = NULL;
    if (!buf->data) {
        api_respond_error(req, 500, "internal", NULL, "out of memory");
        return API_DONE;
    }
    if (u->offset) memmove(buf->data, (char *)buf->data + u->offset, tensor_desc_bytes(&u->desc));
    return 0;
}

/* ?resident= and ?durable=: an ephemeral buffer (durable=false) lives only in the backend's
 * resident copy, so it must be resident. 0, or API_DONE after answering. */
static int buffer_kind(api_request_t *req, bool *ret_resident, bool *ret_durable)
{
    bool resident, durable;
    if (api_query_bool(req, "resident", false, &resident) ||
        api_query_bool(req, "durable", true, &durable))
        return API_DONE;
    if (!durable && !resident) {
        api_respond_error(req, 400, "invalid_argument", "query.durable",
                          "durable=false needs resident=true: an ephemeral buffer lives only in "
                          "the backend's resident copy");
        return API_DONE;
    }
    *ret_resident = resident;
    *ret_durable = durable;
    return 0;
}

/* Stores buf, made of desc, whose bytes are in buf (or, for a streamed ephemeral upload, all
 * in up, taken). API_PENDING. */
static int buffer_post(api_request_t *req, buffer_t *buf, exec_upload_t *up,
                       const tensor_desc_t *desc, bool resident, bool durable)
{
    id_new('b', buf->id);
    snprintf(buf->owner, sizeof buf->owner, "%s", req->user.name);
    buf->desc = *desc;
    buf->nbytes = tensor_desc_bytes(desc);
    buf->resident = resident;
    buf->durable = durable;
    buf->created_us = now_us();
    api_request_suspend(req);
    sched_buffer_put_upload(req->env->sched, buf, up, buffer_put_reply, req);
    return API_PENDING;
}

int api_buffer_upload_begin(api_request_t *req, uint64_t length)
{
    static const char *const allowed[] = {"dtype", "shape", "resident", "durable", NULL};
    bool resident, durable;
    tensor_desc_t d;
    if (api_query_check(req, allowed) || buffer_kind(req, &resident, &durable) ||
        raw_upload_desc(req, length, &d) ||
        buffer_quota_refuses(req, tensor_desc_bytes(&d), resident, durable))
        return API_DONE;
    int r = sched_upload_open(req->env->sched, tensor_desc_bytes(&d), &req->upload);
    if (r == -EBUSY)
        api_respond_errno(req, -EAGAIN, "too many ephemeral uploads to the device at once");
    else if (r == -ENOSPC)
        api_respond_errno(req, r, "no device has room for the ephemeral buffer");
    else if (r < 0)
        api_respond_errno(req, r, "the backend could not take the ephemeral buffer");
    return r < 0 ? API_DONE : 0;
}

/* The end of an upload that streamed into req->upload (api_buffer_upload_begin): the buffer,
 * once every byte the open announced is in. API_DONE after answering, or API_PENDING. */
static int buffer_put_streamed(api_request_t *req)
{
    exec_upload_t *up = req->upload;
    req->upload = NULL;
    buffer_t *buf = NULL;
    if (req->upload_err)
        api_respond_errno(req, req->upload_err, "copying the upload to the device failed");
    else if (up->written != up->nbytes)
        api_respond_error(req, 400, "invalid_argument", "body",
                          "body has %" PRIu64 " bytes but dtype and shape need %" PRIu64,
                          up->written, up->nbytes);
    else if (!(buf = buffer_new()))
        api_respond_error(req, 500, "internal", NULL, "out of memory");
    if (!buf) {
        sched_upload_abort(up);
        return API_DONE;
    }
    tensor_desc_t d;
    /* Checked by api_buffer_upload_begin, which answers otherwise. */
    (void)raw_upload_desc(req, up->nbytes, &d);
    return buffer_post(req, buf, up, &d, true, false);
}

int api_handle_buffer_put(api_request_t *req)
{
    static const char *const allowed[] = {"dtype", "shape",  "resident", "durable",
                                          "job",   "output", NULL};
    if (req->upload) return buffer_put_streamed(req);
    bool resident, durable;
    upload_t u;
    if (api_query_check(req, allowed) || buffer_kind(req, &resident, &durable) ||
        upload_source(req, &u))
        return API_DONE;
    /* A buffer over its owner's quotas is refused before its bytes are read or written. */
    uint64_t nbytes = tensor_desc_bytes(&u.desc);
    if (buffer_quota_refuses(req, nbytes, resident, durable)) {
        job_free(u.job);
        return API_DONE;
    }
    buffer_t *buf = buffer_new();
    if (!buf) {
        job_free(u.job);
        api_respond_error(req, 500, "internal", NULL, "out of memory");
        return API_DONE;
    }
    if (upload_take_bytes(req, &u, buf)) {
        buffer_free(buf);
        return API_DONE;
    }
    req->body_len = 0;
    return buffer_post(req, buf, NULL, &u.desc, resident, durable);
}

/* The {id} path parameter, checked. 0, or API_DONE after answering 400. */
static int buffer_id(api_request_t *req, const char **ret_id)
{
    const char *id = api_path_param(req, "id");
    if (api_id_check(req, 'b', id, "id")) return API_DONE;
    *ret_id = id;
    return 0;
}

int api_handle_buffer_get(api_request_t *req)
{
    static const char *const no_args[] = {NULL};
    const char *id;
    if (api_query_check(req, no_args) || buffer_id(req, &id)) return API_DONE;
    store_reader_t *rd = api_request_reader(req);
    if (!rd) return API_DONE;
    buffer_t *buf = NULL;
    int r = store_buffer_get(rd, id, &buf);
    if (r == 0 && !api_request_may_see(req, buf->owner)) r = -ENOENT;
    if (r == -ENOENT)
        api_respond_not_found(req, 'b', id, "id");
    else if (r < 0)
        api_respond_errno(req, r, "reading the buffer failed");
    else
        api_respond_json(req, 200, job_json_from_buffer(buf));
    buffer_free(buf);
    return API_DONE;
}

static void buffer_delete_reply(void *token, const sched_result_t *res)
{
    api_request_t *req = token;
    const char *id = api_path_param(req, "id");
    if (res->err == -ENOENT)
        api_respond_not_found(req, 'b', id, "id");
    else if (res->err)
        api_respond_errno(req, res->err, res->message);
    else
        api_respond_json(req, 200, json_pack("{s:s, s:b}", "id", id, "deleted", 1));
    api_request_resume(req);
}

int api_handle_buffer_delete(api_request_t *req)
{
    static const char *const no_args[] = {NULL};
    const char *id;
    if (api_query_check(req, no_args) || buffer_id(req, &id)) return API_DONE;
    api_request_suspend(req);
    sched_buffer_delete(req->env->sched, api_request_owner_filter(req), id, buffer_delete_reply,
                        req);
    return API_PENDING;
}
