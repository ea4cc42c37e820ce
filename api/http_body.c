/* How a request's body is taken in as libmicrohttpd hands over its chunks: kept in memory
 * under the size limit, streamed into a blob file (a .npy upload's header gathered first), or
 * streamed into an ephemeral buffer's resident copy; past the limit, or after a write failed,
 * the rest is dropped and the request answered once its body has ended. */
#include "http_body.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_codec.h"

/* A streamed .npy upload's start, up to its data, is gathered in memory: at most this much. */
#define NPY_HEAD_MAX (64 * 1024)

static void body_stream(http_body_t *b, api_request_t *req, const char *data, size_t n)
{
    int r = store_blob_stream_write(req->body_file, data, n);
    if (r < 0) {
        b->upload_err = r;
        store_blob_stream_abort(req->body_file);
        req->body_file = NULL;
    }
    req->body_len += n;
}

/* Hands a chunk of an ephemeral buffer's body to its resident copy; after a failed write the
 * rest is only counted, and the handler answers. */
static void body_upload(api_request_t *req, const char *data, size_t n)
{
    if (!req->upload_err) req->upload_err = sched_upload_write(req->upload, data, n);
    req->body_len += n;
}

/* Keeps a chunk of the body in memory. */
static void body_keep(http_body_t *b, api_request_t *req, const char *data, size_t n)
{
    uint64_t max = req->cfg->max_body_bytes;
    if (req->body_len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < req->body_len + n + 1)
            cap *= 2;
        if (cap > max + 1) cap = max + 1;
        char *grown = realloc(req->body, cap);
        if (!grown) {
            /* Out of memory is treated as over the limit: the client gets 413, not a crash. */
            b->too_large = true;
            free(req->body);
            req->body = NULL;
            req->body_len = 0;
            return;
        }
        req->body = grown;
        b->cap = cap;
    }
    memcpy(req->body + req->body_len, data, n);
    req->body_len += n;
    req->body[req->body_len] = '\0';
}

/* A streamed .npy upload: its bytes stay in memory until they reach the data, which goes to
 * the file from there on. A body that does not start as a .npy file, or whose header is
 * longer than NPY_HEAD_MAX, stays in memory whole, as a small upload does: the handler then
 * says what is wrong with it. */
static void body_npy_head(http_body_t *b, api_request_t *req, const char *data, size_t n)
{
    body_keep(b, req, data, n);
    if (b->too_large) return;
    req->body_head_len = req->body_len;
    size_t offset;
    int r = codec_npy_data_offset(req->body, req->body_len, &offset);
    if (r == 0 && offset > NPY_HEAD_MAX) r = -E2BIG;
    if (r == -EAGAIN || (r == 0 && req->body_len < offset)) return;
    b->npy_head_pending = false;
    if (r < 0) {
        store_blob_stream_abort(req->body_file);
        req->body_file = NULL;
        return;
    }
    size_t data_len = req->body_len - offset;
    req->body_head_len = req->body_len = offset;
    body_stream(b, req, req->body + offset, data_len);
}

/* Appends an upload chunk, or drops it once the body has passed the limit or failed to be
 * written. */
void http_body_append(http_body_t *b, api_request_t *req, const char *data, size_t n)
{
    uint64_t max = req->cfg->max_body_bytes;
    if (b->too_large || b->upload_err) return;
    if (req->body_len + n > max) {
        b->too_large = true;
        free(req->body);
        req->body = NULL;
        req->body_len = 0;
        store_blob_stream_abort(req->body_file);
        req->body_file = NULL;
        sched_upload_abort(req->upload);
        req->upload = NULL;
        return;
    }
    if (req->upload)
        body_upload(req, data, n);
    else if (req->body_file && b->npy_head_pending)
        body_npy_head(b, req, data, n);
    else if (req->body_file)
        body_stream(b, req, data, n);
    else
        body_keep(b, req, data, n);
}
