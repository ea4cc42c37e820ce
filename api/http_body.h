/* Private to api/: a request's body as it arrives (http_body.c), for the HTTP adapter
 * (http_server.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "api_internal.h"

typedef struct http_body {
    size_t cap;            /* bytes allocated at req->body */
    bool too_large;        /* the body passed max_body_bytes: answered 413 once it has ended */
    int upload_err;        /* writing a streamed body failed: answered once it has ended */
    bool npy_head_pending; /* a streamed .npy upload whose data has not started yet */
} http_body_t;

/* Takes in a chunk of req's body: into req->upload, req->body_file or req->body, whichever the
 * request began with; or drops it once the body has passed the limit or failed to be written
 * (b says which). */
void http_body_append(http_body_t *b, api_request_t *req, const char *data, size_t n);
