/* What the files of libgpujob share and do not export: the client handle, one HTTP exchange,
 * and the mapping of answers to error values. Everything here has hidden visibility. */
#pragma once

#include <curl/curl.h>
#include <jansson.h>
#include <stdarg.h>

#include "gpujob.h"

#define GJC_HIDDEN __attribute__((visibility("hidden")))

struct gpujob_client {
    CURL *curl;
    char *address;     /* as given: "http://..." or "unix:/..." */
    char *base_url;    /* "http://127.0.0.1:8080" or "http://localhost" for a socket */
    char *unix_path;   /* NULL for TCP */
    char *auth_header; /* "Authorization: Bearer ..." or NULL */
    char *ca_file;     /* PEM CA certificates that verify an https:// daemon; NULL: the system's */
    long request_timeout_ms, connect_timeout_ms;
    int retries;
    bool binary_outputs; /* asks for jobs' inline outputs in a binary section */
    /* The last call's outcome. */
    char errmsg[512];
    char err_code[64];
    char err_field[160];
    long http_status;
};

/* One request. path is already escaped ("/v1/jobs/ID/wait?timeout=5"). */
typedef struct gjc_request {
    const char *method; /* "GET", "POST", "DELETE" */
    const char *path;
    const char *content_type; /* of body; NULL when none */
    const void *body;
    size_t body_len;
    const char *accept;          /* NULL: no Accept header */
    const char *idempotency_key; /* NULL: none */
    size_t json_length;          /* Gpujob-Json-Length: body is JSON, then bytes; 0: none */
    long extra_timeout_ms;       /* added to the request timeout (long polls) */
    /* When sink is set, a 2xx body goes there (at most sink_cap bytes) instead of into the
     * response's malloc'd body. */
    void *sink;
    size_t sink_cap;
} gjc_request_t;

typedef struct gjc_response {
    long status;
    char *body; /* NUL-terminated; malloc'd, owned */
    size_t len, cap;
    size_t sink_len;
    bool sink_overflow;
    char x_dtype[16];
    char x_shape[160];
    long retry_after_s; /* -1 when absent */
    /* Gpujob-Json-Length: the body is that many bytes of JSON, then a binary section. */
    bool framed;
    size_t json_length;
} gjc_response_t;

/* The binary section of a framed answer: the bytes of body from offset on. body is owned. */
typedef struct gjc_section {
    char *body;
    size_t offset, len;
} gjc_section_t;

/* Resets the per-call error state; every public call taking a client begins with it. */
GJC_HIDDEN void gjc_clear_error(gpujob_client_t *c);
/* Sets the message and returns r. */
GJC_HIDDEN int gjc_fail(gpujob_client_t *c, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Performs one exchange. 0 when an answer came back, whatever its status; a negative error
 * value (-ECONNREFUSED, -ETIMEDOUT, -ECONNRESET, ...) with the message set when none did. */
GJC_HIDDEN int gjc_perform(gpujob_client_t *c, const gjc_request_t *req, gjc_response_t *resp);
/* Checks resp->status is expect (or, when expect2 is non-zero, expect2): 0, or the error value
 * of the status with the daemon's error code, field and message recorded. */
GJC_HIDDEN int gjc_check_status(gpujob_client_t *c, const gjc_response_t *resp, long expect,
                                long expect2);
/* Parses the body as JSON (a new reference), only its JSON when framed: 0 or -EBADMSG. */
GJC_HIDDEN int gjc_parse_body(gpujob_client_t *c, const gjc_response_t *resp, json_t **ret);
/* Moves a framed answer's binary section out of resp into *ret (all zero when it has none). */
GJC_HIDDEN void gjc_take_section(gjc_response_t *resp, gjc_section_t *ret);
/* perform + check + parse in one: a JSON body from an answer of status expect (or expect2),
 * and its binary section into *ret_section when that is not NULL. */
GJC_HIDDEN int gjc_call_json(gpujob_client_t *c, const gjc_request_t *req, long expect,
                             long expect2, json_t **ret, gjc_section_t *ret_section);
/* The Accept header of requests answered with a job: binary sections first when c asks for
 * them. */
GJC_HIDDEN const char *gjc_job_accept(const gpujob_client_t *c);
GJC_HIDDEN void gjc_response_clear(gjc_response_t *resp);
/* A URL-escaped copy of a path segment (malloc'd) or NULL. */
GJC_HIDDEN char *gjc_escape(gpujob_client_t *c, const char *segment);
/* GET path?keys[i]=values[i]&... (the n arguments whose value is not NULL, URL-escaped),
 * answered 200 with JSON: gjc_call_json's result. */
GJC_HIDDEN int gjc_get_json_query(gpujob_client_t *c, const char *path, const char *const *keys,
                                  const char *const *values, size_t n, json_t **ret);

/* Wraps a parsed job (steals the reference, and the section's body when section is not NULL).
 * NULL on allocation failure. */
GJC_HIDDEN gpujob_job_t *gjc_job_new(json_t *root, gjc_section_t *section);
/* Wraps the n jobs of an answer, root one job (n == 1) or a list of n, each with an id, into
 * ret_jobs (an array of n the caller provides, written only on success): every job holds the
 * answer's binary section, shared, not copied. Steals root and the section's body (section may
 * be NULL). 0 or -ENOMEM. */
GJC_HIDDEN int gjc_jobs_new(json_t *root, size_t n, gjc_section_t *section,
                            gpujob_job_t **ret_jobs);
/* "/v1/jobs/ID" + suffix with ID escaped (malloc'd); NULL with the error set. */
GJC_HIDDEN char *gjc_job_path(gpujob_client_t *c, const char *id, const char *suffix);
/* The body that submits specs (gpujob_spec.c): their JSON, then their inputs' bytes; NULL
 * when out of memory. */
GJC_HIDDEN char *gjc_submission_body(const gpujob_spec_t *const *specs, size_t n,
                                     size_t *ret_json_len, size_t *ret_len, bool *ret_binary);
/* Reads a tensor description {"dtype", "shape"} into *ret (no data). 0 or -EBADMSG. */
GJC_HIDDEN int gjc_desc_from_json(const json_t *o, gpujob_tensor_t *ret);
/* Sizes: numel and bytes with overflow checks. 0, -EINVAL or -EOVERFLOW. */
GJC_HIDDEN int gjc_tensor_bytes(gpujob_dtype_t dt, int ndim, const int64_t *shape,
                                size_t *ret_bytes);
/* Writes len bytes to path through a temporary file beside it, renamed into place, so that
 * a reader never sees half a file: 0 or a negative errno (the temporary file removed). */
GJC_HIDDEN int gjc_write_file(const char *path, const void *data, size_t len);
/* Standard base64 (a new NUL-terminated string) or NULL. */
GJC_HIDDEN char *gjc_base64(const void *data, size_t len);
/* json_dumps(v, flags) with each real as its shortest text in the daemon's form ("0.2", "2.0",
 * "1e-7"), so that numbers read from an answer print as the daemon sent them: a new malloc'd
 * text, or NULL when memory ran out. */
GJC_HIDDEN char *gjc_json_dumps(const json_t *v, size_t flags);
/* Element conversions for inline JSON data of 16-bit float types. */
GJC_HIDDEN uint16_t gjc_f32_to_f16(float f);
GJC_HIDDEN uint16_t gjc_f32_to_bf16(float f);
