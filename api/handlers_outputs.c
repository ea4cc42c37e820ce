/* The handler of GET /v1/jobs/{id}/outputs/{name}: one output of a job that succeeded, as
 * JSON, raw bytes or a .npy file, chosen by ?format= or the Accept header. */
#include "api_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_codec.h"

/* In the order of format_names. */
typedef enum output_format { FORMAT_JSON, FORMAT_RAW, FORMAT_NPY } output_format_t;

/* The formats by ?format= name, and by media type in the order an Accept item is tried
 * against them; the wildcards mean JSON. */
static const char *const format_names[] = {"json", "raw", "npy"};
static const char *const format_media[] = {"application/json", "application/octet-stream",
                                           "application/x-npy", "*/*", "application/*"};
static const output_format_t media_formats[] = {FORMAT_JSON, FORMAT_RAW, FORMAT_NPY, FORMAT_JSON,
                                                FORMAT_JSON};

/* Picks the format from ?format= or else the Accept header (first acceptable item wins; no
 * header means JSON). 0, or API_DONE after answering 400/406. */
static int choose_format(api_request_t *req, output_format_t *ret)
{
    const char *q = api_query(req, "format");
    if (q) {
        for (size_t i = 0; i < sizeof format_names / sizeof format_names[0]; i++)
            if (strcmp(format_names[i], q) == 0) {
                *ret = (output_format_t)i;
                return 0;
            }
        api_respond_error(req, 400, "invalid_argument", "query.format",
                          "format must be json, raw or npy");
        return API_DONE;
    }
    if (!req->accept || !*req->accept) {
        *ret = FORMAT_JSON;
        return 0;
    }
    int i = api_accept_pick(req, format_media, sizeof format_media / sizeof format_media[0]);
    if (i < 0) {
        api_respond_error(req, 406, "not_acceptable", "header.Accept",
                          "outputs are served as application/json, application/octet-stream or "
                          "application/x-npy");
        return API_DONE;
    }
    *ret = media_formats[i];
    return 0;
}

static void respond_output(api_request_t *req, const job_tensor_t *t, output_format_t format,
                           void *bytes)
{
    char shape[160];
    switch (format) {
    case FORMAT_RAW:
        api_respond_bytes(req, 200, "application/octet-stream", bytes, t->nbytes);
        api_response_add_header(&req->resp, "X-Dtype", "%s", dtype_name(t->desc.dtype));
        shape[0] = '\0';
        for (int i = 0; i < t->desc.ndim; i++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", i ? "," : "",
                     (long long)t->desc.shape[i]);
        api_response_add_header(&req->resp, "X-Shape", "%s", shape);
        return;
    case FORMAT_NPY: {
        void *file;
        size_t len;
        int r = codec_npy_write(&t->desc, bytes, &file, &len);
        free(bytes);
        if (r == -ENOTSUP)
            api_respond_error(req, 406, "not_acceptable", "header.Accept",
                              "dtype %s has no .npy equivalent; ask for "
                              "application/octet-stream",
                              dtype_name(t->desc.dtype));
        else if (r < 0)
            api_respond_errno(req, r, "writing the .npy file failed");
        else
            api_respond_bytes(req, 200, "application/x-npy", file, len);
        return;
    }
    case FORMAT_JSON: {
        json_t *o = job_json_tensor_desc(&t->desc);
        json_object_set_new(o, "name", json_string(t->name));
        json_object_set_new(o, "data", codec_data_to_json(&t->desc, bytes));
        free(bytes);
        api_respond_json(req, 200, o);
        return;
    }
    }
}

int api_handle_job_output(api_request_t *req)
{
    static const char *const allowed[] = {"format", NULL};
    if (api_query_check(req, allowed)) return API_DONE;
    output_format_t format = FORMAT_JSON;
    if (choose_format(req, &format)) return API_DONE;
    job_t *job;
    const job_tensor_t *t;
    if (api_job_find_output(req, api_path_param(req, "id"), "id", api_path_param(req, "name"),
                            "name", &job, &t))
        return API_DONE;
    void *bytes;
    if (format == FORMAT_JSON && t->nbytes > req->cfg->max_body_bytes)
        api_respond_error(req, 406, "not_acceptable", "header.Accept",
                          "output '%s' is too large for JSON; ask for "
                          "application/octet-stream or application/x-npy",
                          t->name);
    else if (api_job_read_output(req, t, &bytes) == 0)
        respond_output(req, t, format, bytes);
    job_free(job);
    return API_DONE;
}
