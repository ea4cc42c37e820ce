/* Outputs: a finished job's output downloaded whole, raw or as .npy, into the caller's buffer,
 * a new one, or a tensor described by the answer's X-Dtype and X-Shape headers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpujob_internal.h"

static char *output_path(gpujob_client_t *c, const char *id, const char *name)
{
    if (!name || !name[0]) {
        gjc_fail(c, -EINVAL, "empty output name");
        return NULL;
    }
    char *escaped = gjc_escape(c, name), *suffix = NULL, *path = NULL;
    if (escaped && asprintf(&suffix, "/outputs/%s", escaped) >= 0)
        path = gjc_job_path(c, id, suffix);
    else
        gjc_fail(c, -ENOMEM, "out of memory");
    free(escaped);
    free(suffix);
    return path;
}

static const char *format_media(gpujob_format_t format)
{
    return format == GPUJOB_FORMAT_NPY ? "application/x-npy" : "application/octet-stream";
}

/* Downloads an output, into sink when given (cap bytes) else into resp->body. */
static int output_get(gpujob_client_t *c, const char *id, const char *name, gpujob_format_t format,
                      void *sink, size_t cap, gjc_response_t *resp)
{
    gjc_clear_error(c);
    if (format != GPUJOB_FORMAT_RAW && format != GPUJOB_FORMAT_NPY)
        return gjc_fail(c, -EINVAL, "unknown output format %d", (int)format);
    char *path = output_path(c, id, name);
    if (!path) return -EINVAL;
    gjc_request_t req = {.method = "GET",
                         .path = path,
                         .accept = format_media(format),
                         .sink = sink,
                         .sink_cap = cap};
    int r = gjc_perform(c, &req, resp);
    if (r >= 0 && resp->sink_overflow)
        r = gjc_fail(c, -ENOBUFS, "output '%s' of job %s is larger than the %zu-byte buffer", name,
                     id, cap);
    if (r >= 0) r = gjc_check_status(c, resp, 200, 0);
    free(path);
    return r;
}

int gpujob_output_read(gpujob_client_t *c, const char *id, const char *name, gpujob_format_t format,
                       void *buf, size_t cap, size_t *ret_len)
{
    if (!buf && cap > 0) {
        gjc_clear_error(c);
        return gjc_fail(c, -EINVAL, "no buffer");
    }
    /* A zero-capacity sink still needs a non-NULL pointer to select sink mode. */
    static char empty;
    gjc_response_t resp = {.retry_after_s = -1};
    int r = output_get(c, id, name, format, buf ? buf : &empty, cap, &resp);
    size_t len = resp.sink_len;
    gjc_response_clear(&resp);
    if (r < 0) return r;
    *ret_len = len;
    return 0;
}

int gpujob_output_fetch(gpujob_client_t *c, const char *id, const char *name,
                        gpujob_format_t format, void **ret_data, size_t *ret_len)
{
    gjc_response_t resp = {.retry_after_s = -1};
    int r = output_get(c, id, name, format, NULL, 0, &resp);
    if (r < 0) {
        gjc_response_clear(&resp);
        return r;
    }
    *ret_data = resp.body; /* ownership passes to the caller */
    *ret_len = resp.len;
    return 0;
}

/* Parses the X-Shape header: sizes separated by commas ("2,3"; "" for a scalar). */
static int shape_parse(const char *text, int *ret_ndim, int64_t *shape)
{
    int ndim = 0;
    const char *p = text;
    while (*p == ' ' || *p == '[')
        p++;
    while (*p && *p != ']') {
        char *end = NULL;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || ndim == GPUJOB_MAX_DIMS) return -EBADMSG;
        shape[ndim++] = v;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',') p++;
        while (*p == ' ')
            p++;
    }
    *ret_ndim = ndim;
    return 0;
}

int gpujob_output_tensor(gpujob_client_t *c, const char *id, const char *name, gpujob_tensor_t *ret)
{
    gjc_response_t resp = {.retry_after_s = -1};
    int r = output_get(c, id, name, GPUJOB_FORMAT_RAW, NULL, 0, &resp);
    gpujob_tensor_t t;
    gpujob_dtype_t dt;
    int64_t shape[GPUJOB_MAX_DIMS];
    int ndim = 0;
    if (r >= 0 &&
        (gpujob_dtype_parse(resp.x_dtype, &dt) < 0 || shape_parse(resp.x_shape, &ndim, shape) < 0 ||
         gpujob_tensor_init(&t, dt, ndim, shape, NULL) < 0 || t.nbytes != resp.len))
        r = gjc_fail(c, -EBADMSG,
                     "output '%s': headers X-Dtype '%s' X-Shape '%s' do not describe %zu bytes",
                     name, resp.x_dtype, resp.x_shape, resp.len);
    if (r < 0) {
        gjc_response_clear(&resp);
        return r;
    }
    t.data = resp.body; /* ownership passes to the tensor */
    *ret = t;
    return 0;
}
