/* Jobs: building submissions (gpujob_spec_t), submitting them with idempotency keys and
 * retries, reading jobs back (get, list, long-poll wait), cancelling, and downloading outputs. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "gpujob_internal.h"

/* ---- States ------------------------------------------------------------------------------ */

static const char *const state_names[] = {"queued", "running", "succeeded", "failed", "cancelled"};

const char *gpujob_state_name(gpujob_state_t s)
{
    return (unsigned)s < GPUJOB_STATE_UNKNOWN ? state_names[s] : "unknown";
}

int gpujob_state_parse(const char *name, gpujob_state_t *ret)
{
    for (int i = 0; name && i < GPUJOB_STATE_UNKNOWN; i++)
        if (strcmp(name, state_names[i]) == 0) {
            *ret = (gpujob_state_t)i;
            return 0;
        }
    return -EINVAL;
}

bool gpujob_state_is_final(gpujob_state_t s)
{
    return s == GPUJOB_SUCCEEDED || s == GPUJOB_FAILED || s == GPUJOB_CANCELLED;
}

/* ---- Specs ------------------------------------------------------------------------------- */

/* An input's bytes in the spec's binary section. */
typedef struct spec_bytes {
    char *name;
    size_t offset, len;
} spec_bytes_t;

struct gpujob_spec {
    /* The job object as it will be sent, its inputs' bytes named by binary_offset into
     * section: submissions send them raw after the JSON (Gpujob-Json-Length), sparing both
     * sides base64 (on the daemon, 5x the rest of its HTTP work per tiny job). */
    json_t *obj;
    unsigned char *section;
    size_t section_len, section_cap;
    spec_bytes_t *bytes;
    size_t n_bytes;
};

int gpujob_spec_new(const char *op, gpujob_spec_t **ret)
{
    if (!op || !op[0]) return -EINVAL;
    gpujob_spec_t *spec = calloc(1, sizeof *spec);
    if (!spec) return -ENOMEM;
    spec->obj = json_pack("{s:s, s:{}, s:{}}", "op", op, "params", "inputs");
    if (!spec->obj) {
        free(spec);
        return -ENOMEM;
    }
    *ret = spec;
    return 0;
}

void gpujob_spec_free(gpujob_spec_t *spec)
{
    if (!spec) return;
    json_decref(spec->obj);
    for (size_t i = 0; i < spec->n_bytes; i++)
        free(spec->bytes[i].name);
    free(spec->bytes);
    free(spec->section);
    free(spec);
}

static int spec_add_input(gpujob_spec_t *spec, const char *name, json_t *value)
{
    json_t *inputs = json_object_get(spec->obj, "inputs");
    if (!value) return -ENOMEM;
    if (json_object_get(inputs, name)) {
        json_decref(value);
        return -EEXIST;
    }
    return json_object_set_new(inputs, name, value) < 0 ? -ENOMEM : 0;
}

/* Inputs travel as their raw bytes: exact for every dtype (no decimal round trip). */
int gpujob_spec_input(gpujob_spec_t *spec, const char *name, const gpujob_tensor_t *t)
{
    size_t bytes = 0;
    if (!name || !name[0] || !t) return -EINVAL;
    int r = gjc_tensor_bytes(t->dtype, t->ndim, t->shape, &bytes);
    if (r < 0) return r;
    if (bytes != t->nbytes || (bytes && !t->data)) return -EINVAL;
    if (json_object_get(json_object_get(spec->obj, "inputs"), name)) return -EEXIST;
    if (spec->section_len + bytes > spec->section_cap) {
        size_t cap = spec->section_cap ? spec->section_cap : 4096;
        while (cap < spec->section_len + bytes)
            cap *= 2;
        unsigned char *grown = realloc(spec->section, cap);
        if (!grown) return -ENOMEM;
        spec->section = grown;
        spec->section_cap = cap;
    }
    spec_bytes_t *list = realloc(spec->bytes, (spec->n_bytes + 1) * sizeof *list);
    if (!list) return -ENOMEM;
    spec->bytes = list;
    json_t *shape = json_array();
    for (int i = 0; shape && i < t->ndim; i++)
        json_array_append_new(shape, json_integer(t->shape[i]));
    json_t *value = shape
                        ? json_pack("{s:s, s:o, s:I}", "dtype", gpujob_dtype_name(t->dtype),
                                    "shape", shape, "binary_offset", (json_int_t)spec->section_len)
                        : NULL;
    char *copy = strdup(name);
    if (!copy || (r = spec_add_input(spec, name, value)) < 0) {
        free(copy);
        return copy ? r : -ENOMEM;
    }
    if (bytes) memcpy(spec->section + spec->section_len, t->data, bytes);
    spec->bytes[spec->n_bytes++] = (spec_bytes_t){copy, spec->section_len, bytes};
    spec->section_len += bytes;
    return 0;
}

int gpujob_spec_input_buffer(gpujob_spec_t *spec, const char *name, const char *buffer_id)
{
    if (!name || !name[0] || !buffer_id || !buffer_id[0]) return -EINVAL;
    return spec_add_input(spec, name, json_pack("{s:s}", "buffer", buffer_id));
}

static int spec_param(gpujob_spec_t *spec, const char *key, json_t *value)
{
    if (!key || !key[0]) {
        json_decref(value);
        return -EINVAL;
    }
    if (!value) return -ENOMEM;
    return json_object_set_new(json_object_get(spec->obj, "params"), key, value) < 0 ? -ENOMEM : 0;
}

int gpujob_spec_param_double(gpujob_spec_t *spec, const char *key, double v)
{
    return spec_param(spec, key, json_real(v));
}

int gpujob_spec_param_int(gpujob_spec_t *spec, const char *key, int64_t v)
{
    return spec_param(spec, key, json_integer(v));
}

int gpujob_spec_param_bool(gpujob_spec_t *spec, const char *key, bool v)
{
    return spec_param(spec, key, json_boolean(v));
}

int gpujob_spec_param_string(gpujob_spec_t *spec, const char *key, const char *v)
{
    if (!v) return -EINVAL;
    return spec_param(spec, key, json_string(v));
}

int gpujob_spec_param_json(gpujob_spec_t *spec, const char *key, const char *text)
{
    if (!text) return -EINVAL;
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    if (!v) return -EINVAL;
    return spec_param(spec, key, v);
}

void gpujob_spec_set_priority(gpujob_spec_t *spec, int priority)
{
    json_object_set_new(spec->obj, "priority", json_integer(priority));
}

void gpujob_spec_set_device(gpujob_spec_t *spec, int device)
{
    if (device < 0)
        json_object_del(spec->obj, "device");
    else
        json_object_set_new(spec->obj, "device", json_integer(device));
}

void gpujob_spec_set_deadline_ms(gpujob_spec_t *spec, int64_t deadline_ms)
{
    if (deadline_ms <= 0)
        json_object_del(spec->obj, "deadline_ms");
    else
        json_object_set_new(spec->obj, "deadline_ms", json_integer(deadline_ms));
}

/* A copy of spec's job object whose inputs name their bytes at base + binary_offset
 * (b64: NULL), or carry them in base64 (b64: true). */
static json_t *spec_object(const gpujob_spec_t *spec, size_t base, bool b64)
{
    json_t *obj = json_deep_copy(spec->obj);
    json_t *inputs = json_object_get(obj, "inputs");
    for (size_t i = 0; obj && i < spec->n_bytes; i++) {
        const spec_bytes_t *b = &spec->bytes[i];
        json_t *in = json_object_get(inputs, b->name);
        int r;
        if (b64) {
            char *text = gjc_base64(spec->section + b->offset, b->len);
            r = text ? json_object_set_new(in, "b64", json_string(text)) : -1;
            json_object_del(in, "binary_offset");
            free(text);
        } else {
            r = json_object_set_new(in, "binary_offset",
                                    json_integer((json_int_t)(base + b->offset)));
        }
        if (r < 0) {
            json_decref(obj);
            obj = NULL;
        }
    }
    return obj;
}

/* The spec as one JSON document, its bytes in base64: what a curl user would send. */
char *gpujob_spec_json(const gpujob_spec_t *spec)
{
    json_t *obj = spec_object(spec, 0, true);
    char *text = obj ? gjc_json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    return text;
}

/* ---- Jobs -------------------------------------------------------------------------------- */

struct gpujob_job {
    json_t *root;
    char *text;            /* gjc_json_dumps of root, made on first use */
    gjc_section_t section; /* the answer's binary section: outputs' bytes */
};

gpujob_job_t *gjc_job_new(json_t *root, gjc_section_t *section)
{
    gpujob_job_t *job = calloc(1, sizeof *job);
    if (!job) {
        json_decref(root);
        if (section) free(section->body);
        return NULL;
    }
    job->root = root;
    if (section) job->section = *section;
    return job;
}

void gpujob_job_free(gpujob_job_t *job)
{
    if (!job) return;
    json_decref(job->root);
    free(job->text);
    free(job->section.body);
    free(job);
}

static const char *job_string(const gpujob_job_t *job, const char *key)
{
    return json_string_value(json_object_get(job->root, key));
}

static int job_int(const gpujob_job_t *job, const char *key, int absent)
{
    json_t *v = json_object_get(job->root, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : absent;
}

static double job_ms(const gpujob_job_t *job, const char *key)
{
    json_t *v = json_object_get(job->root, key);
    return json_is_number(v) ? json_number_value(v) : -1.0;
}

const char *gpujob_job_id(const gpujob_job_t *job)
{
    const char *id = job_string(job, "id");
    return id ? id : "";
}

const char *gpujob_job_op(const gpujob_job_t *job)
{
    const char *op = job_string(job, "op");
    return op ? op : "";
}

gpujob_state_t gpujob_job_state(const gpujob_job_t *job)
{
    gpujob_state_t s = GPUJOB_STATE_UNKNOWN;
    gpujob_state_parse(job_string(job, "state"), &s);
    return s;
}

int gpujob_job_priority(const gpujob_job_t *job)
{
    return job_int(job, "priority", 0);
}

int gpujob_job_device(const gpujob_job_t *job)
{
    return job_int(job, "device", -1);
}

int gpujob_job_run_device(const gpujob_job_t *job)
{
    return job_int(job, "run_device", -1);
}

int gpujob_job_attempts(const gpujob_job_t *job)
{
    return job_int(job, "attempts", 0);
}

int gpujob_job_batch_size(const gpujob_job_t *job)
{
    return job_int(job, "batch_size", 0);
}

double gpujob_job_queue_ms(const gpujob_job_t *job)
{
    return job_ms(job, "queue_ms");
}

double gpujob_job_run_ms(const gpujob_job_t *job)
{
    return job_ms(job, "run_ms");
}

double gpujob_job_gpu_ms(const gpujob_job_t *job)
{
    return job_ms(job, "gpu_ms");
}

const char *gpujob_job_created_at(const gpujob_job_t *job)
{
    return job_string(job, "created_at");
}

const char *gpujob_job_started_at(const gpujob_job_t *job)
{
    return job_string(job, "started_at");
}

const char *gpujob_job_finished_at(const gpujob_job_t *job)
{
    return job_string(job, "finished_at");
}

const char *gpujob_job_error_code(const gpujob_job_t *job)
{
    return json_string_value(json_object_get(json_object_get(job->root, "error"), "code"));
}

const char *gpujob_job_cancel_outcome(const gpujob_job_t *job)
{
    return json_string_value(json_object_get(job->root, "cancel"));
}

const char *gpujob_job_error_message(const gpujob_job_t *job)
{
    return json_string_value(json_object_get(json_object_get(job->root, "error"), "message"));
}

size_t gpujob_job_output_count(const gpujob_job_t *job)
{
    return json_object_size(json_object_get(job->root, "outputs"));
}

const char *gpujob_job_output_name(const gpujob_job_t *job, size_t i)
{
    const char *key;
    json_t *value;
    size_t k = 0;
    json_object_foreach(json_object_get(job->root, "outputs"), key, value)
    {
        if (k++ == i) return key;
    }
    return NULL;
}

const char *gpujob_job_json(const gpujob_job_t *job)
{
    /* The text is a cache of an immutable object; making it on first use is not a change a
     * caller can observe. */
    gpujob_job_t *mutable_job = (gpujob_job_t *)job;
    if (!mutable_job->text) mutable_job->text = gjc_json_dumps(job->root, JSON_COMPACT);
    return mutable_job->text ? mutable_job->text : "";
}

int gjc_desc_from_json(const json_t *o, gpujob_tensor_t *ret)
{
    gpujob_dtype_t dt;
    const json_t *shape = json_object_get(o, "shape");
    if (gpujob_dtype_parse(json_string_value(json_object_get(o, "dtype")), &dt) < 0 ||
        !json_is_array(shape) || json_array_size(shape) > GPUJOB_MAX_DIMS)
        return -EBADMSG;
    int64_t dims[GPUJOB_MAX_DIMS];
    int ndim = (int)json_array_size(shape);
    for (int i = 0; i < ndim; i++) {
        const json_t *d = json_array_get(shape, (size_t)i);
        if (!json_is_integer(d)) return -EBADMSG;
        dims[i] = json_integer_value(d);
    }
    gpujob_tensor_t t;
    if (gpujob_tensor_init(&t, dt, ndim, dims, NULL) < 0) return -EBADMSG;
    *ret = t;
    return 0;
}

/* A leaf of inline data: a number, or "nan"/"inf"/"-inf", which JSON cannot spell. */
static int leaf_value(const json_t *v, double *ret)
{
    const char *s = json_string_value(v);
    if (json_is_number(v))
        *ret = json_number_value(v);
    else if (s && strcmp(s, "nan") == 0)
        *ret = NAN;
    else if (s && strcmp(s, "inf") == 0)
        *ret = INFINITY;
    else if (s && strcmp(s, "-inf") == 0)
        *ret = -INFINITY;
    else
        return -EBADMSG;
    return 0;
}

static void store_element(gpujob_dtype_t dt, void *data, int64_t i, const json_t *leaf, double v)
{
    /* Integers are taken from the JSON integer itself: a double cannot hold every i64. */
    json_int_t n = json_is_integer(leaf) ? json_integer_value(leaf) : (json_int_t)v;
    switch (dt) {
    case GPUJOB_F32:
        ((float *)data)[i] = (float)v;
        break;
    case GPUJOB_F16:
        ((uint16_t *)data)[i] = gjc_f32_to_f16((float)v);
        break;
    case GPUJOB_BF16:
        ((uint16_t *)data)[i] = gjc_f32_to_bf16((float)v);
        break;
    case GPUJOB_F64:
        ((double *)data)[i] = v;
        break;
    case GPUJOB_I8:
        ((int8_t *)data)[i] = (int8_t)n;
        break;
    case GPUJOB_I32:
        ((int32_t *)data)[i] = (int32_t)n;
        break;
    case GPUJOB_U32:
        ((uint32_t *)data)[i] = (uint32_t)n;
        break;
    case GPUJOB_I64:
        ((int64_t *)data)[i] = (int64_t)n;
        break;
    default:
        break;
    }
}

/* Flattens nested lists of leaves into data; *count counts leaves seen. */
static int decode_data(const json_t *v, gpujob_dtype_t dt, void *data, int64_t numel,
                       int64_t *count)
{
    if (json_is_array(v)) {
        size_t i;
        const json_t *item;
        json_array_foreach(v, i, item)
        {
            int r = decode_data(item, dt, data, numel, count);
            if (r < 0) return r;
        }
        return 0;
    }
    double x;
    if (leaf_value(v, &x) < 0 || *count >= numel) return -EBADMSG;
    store_element(dt, data, (*count)++, v, x);
    return 0;
}

int gpujob_job_output(const gpujob_job_t *job, const char *name, gpujob_tensor_t *ret)
{
    const json_t *o = json_object_get(json_object_get(job->root, "outputs"), name);
    if (!o) return -ENOENT;
    gpujob_tensor_t t;
    int r = gjc_desc_from_json(o, &t);
    if (r < 0) return r;
    const json_t *data = json_object_get(o, "data");
    const json_t *offset = json_object_get(o, "binary_offset");
    if (offset) {
        json_int_t at = json_integer_value(offset);
        if (!json_is_integer(offset) || at < 0 || (size_t)at > job->section.len ||
            t.nbytes > job->section.len - (size_t)at)
            return -EBADMSG;
        t.data = malloc(t.nbytes ? t.nbytes : 1);
        if (!t.data) return -ENOMEM;
        memcpy(t.data, job->section.body + job->section.offset + at, t.nbytes);
    } else if (data) {
        int64_t numel = gpujob_tensor_numel(&t), count = 0;
        t.data = malloc(t.nbytes ? t.nbytes : 1);
        if (!t.data) return -ENOMEM;
        r = decode_data(data, t.dtype, t.data, numel, &count);
        if (r >= 0 && count != numel) r = -EBADMSG;
        if (r < 0) {
            free(t.data);
            return r;
        }
    }
    *ret = t;
    return 0;
}

/* ---- Submitting -------------------------------------------------------------------------- */

/* 32 random hex digits: unique enough that two submissions never share a key. */
static int idempotency_key_new(char key[48])
{
    unsigned char bytes[16];
    size_t got = 0;
    while (got < sizeof bytes) {
        ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        got += (size_t)n;
    }
    strcpy(key, "gj-");
    for (size_t i = 0; i < sizeof bytes; i++)
        snprintf(key + 3 + 2 * i, 3, "%02x", bytes[i]);
    return 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static bool transport_error_is_retryable(int r)
{
    return r == -ECONNRESET || r == -ECONNREFUSED || r == -ETIMEDOUT;
}

/* Sends a submission, again after transient failures, always with the same key: the daemon
 * answers a repeated key with the job it created the first time (200), so a retry can never
 * create a duplicate, whether or not the lost attempt reached it. */
static int submit_body(gpujob_client_t *c, const char *body, size_t len, size_t json_len,
                       bool binary, const char *key, double wait_s, json_t **ret,
                       gjc_section_t *ret_section)
{
    char path[64] = "/v1/jobs";
    if (wait_s >= 0) snprintf(path, sizeof path, "/v1/jobs?wait=%.3f", wait_s);
    gjc_request_t req = {.method = "POST",
                         .path = path,
                         .content_type = binary ? "application/octet-stream" : "application/json",
                         .body = body,
                         .body_len = len,
                         .accept = gjc_job_accept(c),
                         .idempotency_key = key,
                         .json_length = binary ? json_len : 0,
                         .extra_timeout_ms = wait_s > 0 ? (long)(wait_s * 1000.0) : 0};
    long backoff_ms = 100;
    for (int attempt = 0;; attempt++) {
        gjc_response_t resp = {.retry_after_s = -1};
        int r = gjc_perform(c, &req, &resp);
        bool retry = false;
        long wait_ms = backoff_ms;
        if (r < 0) {
            retry = transport_error_is_retryable(r);
        } else if (resp.status == 429 || resp.status == 503) {
            retry = true;
            if (resp.retry_after_s >= 0) wait_ms = resp.retry_after_s * 1000;
        }
        if (retry && attempt < c->retries) {
            gjc_response_clear(&resp);
            sleep_ms(wait_ms);
            backoff_ms *= 2;
            continue;
        }
        if (r >= 0) r = gjc_check_status(c, &resp, 201, 200);
        json_t *root = NULL;
        if (r >= 0) r = gjc_parse_body(c, &resp, &root);
        if (r >= 0) gjc_take_section(&resp, ret_section);
        gjc_response_clear(&resp);
        if (r < 0) return r;
        *ret = root;
        return 0;
    }
}

/* The body that submits specs: their JSON (one job as an object, so that its answer is an
 * object; several as a list), then their binary sections one after another, each spec's
 * offsets moved past the sections before it. Returns it (malloc'd) with the JSON's length,
 * the whole length and whether it names a binary section (even an empty one, for inputs of
 * no bytes); NULL when out of memory. */
static char *submission_body(const gpujob_spec_t *const *specs, size_t n, size_t *ret_json_len,
                             size_t *ret_len, bool *ret_binary)
{
    *ret_binary = false;
    for (size_t i = 0; i < n; i++)
        *ret_binary |= specs[i]->n_bytes > 0;
    json_t *list = n == 1 ? NULL : json_array();
    json_t *payload = list;
    size_t base = 0;
    for (size_t i = 0; i < n && (n == 1 || list); i++) {
        json_t *obj = spec_object(specs[i], base, false);
        if (!obj || (list && json_array_append_new(list, obj) < 0)) {
            json_decref(list);
            return NULL;
        }
        if (!list) payload = obj;
        base += specs[i]->section_len;
    }
    char *text = payload ? json_dumps(payload, JSON_COMPACT) : NULL;
    json_decref(payload);
    size_t json_len = text ? strlen(text) : 0;
    char *body = text ? realloc(text, json_len + base + 1) : NULL;
    if (!body) {
        free(text);
        return NULL;
    }
    for (size_t i = 0, at = json_len; i < n; at += specs[i]->section_len, i++)
        if (specs[i]->section_len) memcpy(body + at, specs[i]->section, specs[i]->section_len);
    *ret_json_len = json_len;
    *ret_len = json_len + base;
    return body;
}

/* gpujob_submit_many, waiting up to wait_s for a single job to end when wait_s >= 0. */
static int submit_specs(gpujob_client_t *c, const gpujob_spec_t *const *specs, size_t n,
                        const char *idempotency_key, double wait_s, gpujob_job_t **ret_jobs)
{
    gjc_clear_error(c);
    if (!specs || n == 0 || !ret_jobs) return gjc_fail(c, -EINVAL, "no jobs to submit");
    char key[48];
    if (idempotency_key) {
        if (!idempotency_key[0] || strlen(idempotency_key) > 127 ||
            strpbrk(idempotency_key, "\r\n"))
            return gjc_fail(c, -EINVAL, "idempotency key must be 1..127 characters on one line");
    } else {
        int r = idempotency_key_new(key);
        if (r < 0) return gjc_fail(c, r, "no random bytes for an idempotency key");
        idempotency_key = key;
    }
    size_t json_len = 0, len = 0;
    bool binary = false;
    char *body = submission_body(specs, n, &json_len, &len, &binary);
    if (!body) return gjc_fail(c, -ENOMEM, "out of memory encoding the submission");

    json_t *root = NULL;
    gjc_section_t section;
    int r = submit_body(c, body, len, json_len, binary, idempotency_key, wait_s, &root, &section);
    free(body);
    if (r < 0) return r;
    bool shape_ok =
        n == 1 ? json_is_object(root) || (json_is_array(root) && json_array_size(root) == 1)
               : json_is_array(root) && json_array_size(root) == n;
    if (!shape_ok) {
        json_decref(root);
        free(section.body);
        return gjc_fail(c, -EBADMSG, "the daemon answered a submission of %zu jobs with %s", n,
                        json_is_array(root) ? "a list of another length" : "no job list");
    }
    gpujob_job_t *jobs[n];
    size_t made = 0;
    for (; made < n; made++) {
        json_t *item = json_is_array(root) ? json_array_get(root, made) : root;
        if (!json_is_string(json_object_get(item, "id"))) break;
        /* Only an answer of one job, which may have waited for its end, has outputs. */
        jobs[made] = gjc_job_new(json_incref(item), n == 1 ? &section : NULL);
        if (n == 1) section = (gjc_section_t){0}; /* the job's now, or freed */
        if (!jobs[made]) break;
    }
    free(section.body);
    json_decref(root);
    if (made < n) {
        for (size_t i = 0; i < made; i++)
            gpujob_job_free(jobs[i]);
        return gjc_fail(c, -EBADMSG, "job %zu of the answer has no id", made);
    }
    memcpy(ret_jobs, jobs, n * sizeof jobs[0]);
    return 0;
}

int gpujob_submit_many(gpujob_client_t *c, const gpujob_spec_t *const *specs, size_t n,
                       const char *idempotency_key, gpujob_job_t **ret_jobs)
{
    return submit_specs(c, specs, n, idempotency_key, -1, ret_jobs);
}

int gpujob_submit(gpujob_client_t *c, const gpujob_spec_t *spec, gpujob_job_t **ret)
{
    return gpujob_submit_wait(c, spec, -1, ret);
}

int gpujob_submit_wait(gpujob_client_t *c, const gpujob_spec_t *spec, double wait_s,
                       gpujob_job_t **ret)
{
    const gpujob_spec_t *specs[1] = {spec};
    if (!spec || !isfinite(wait_s)) {
        gjc_clear_error(c);
        return gjc_fail(c, -EINVAL,
                        spec ? "the wait must be a number of seconds" : "no job to submit");
    }
    return submit_specs(c, specs, 1, NULL, wait_s, ret);
}

/* ---- Reading jobs ------------------------------------------------------------------------ */

/* GETs path (or DELETEs it) and wraps the job it answers. */
static int job_call(gpujob_client_t *c, const char *method, const char *path, long extra_timeout_ms,
                    gpujob_job_t **ret)
{
    gjc_request_t req = {.method = method,
                         .path = path,
                         .accept = gjc_job_accept(c),
                         .extra_timeout_ms = extra_timeout_ms};
    json_t *root = NULL;
    gjc_section_t section;
    int r = gjc_call_json(c, &req, 200, 0, &root, &section);
    if (r < 0) return r;
    if (!json_is_object(root) || !json_is_string(json_object_get(root, "id"))) {
        json_decref(root);
        free(section.body);
        return gjc_fail(c, -EBADMSG, "%s %s: the answer is not a job", method, path);
    }
    gpujob_job_t *job = gjc_job_new(root, &section);
    if (!job) return gjc_fail(c, -ENOMEM, "out of memory");
    *ret = job;
    return 0;
}

/* "/v1/jobs/ID" + suffix with ID escaped; NULL with the error set. */
static char *job_path(gpujob_client_t *c, const char *id, const char *suffix)
{
    if (!id || !id[0]) {
        gjc_fail(c, -EINVAL, "empty job id");
        return NULL;
    }
    char *escaped = gjc_escape(c, id), *path = NULL;
    if (!escaped || asprintf(&path, "/v1/jobs/%s%s", escaped, suffix) < 0) path = NULL;
    free(escaped);
    if (!path) gjc_fail(c, -ENOMEM, "out of memory");
    return path;
}

int gpujob_get(gpujob_client_t *c, const char *id, gpujob_job_t **ret)
{
    gjc_clear_error(c);
    char *path = job_path(c, id, "");
    if (!path) return id && id[0] ? -ENOMEM : -EINVAL;
    int r = job_call(c, "GET", path, 0, ret);
    free(path);
    return r;
}

int gpujob_cancel(gpujob_client_t *c, const char *id, gpujob_job_t **ret)
{
    gjc_clear_error(c);
    char *path = job_path(c, id, "");
    if (!path) return id && id[0] ? -ENOMEM : -EINVAL;
    gpujob_job_t *job = NULL;
    int r = job_call(c, "DELETE", path, 0, &job);
    free(path);
    if (r < 0) return r;
    if (ret)
        *ret = job;
    else
        gpujob_job_free(job);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The longest single long poll: under the daemon's default max_wait_ms (300 s) and short
 * enough that a lost connection is noticed within a minute. */
#define WAIT_POLL_MAX_S 25.0

int gpujob_wait_progress(gpujob_client_t *c, const char *id, double timeout_s, double interval_s,
                         gpujob_progress_fn progress, void *userdata, gpujob_job_t **ret)
{
    gjc_clear_error(c);
    if (!id || !id[0]) return gjc_fail(c, -EINVAL, "empty job id");
    double start = now_s();
    for (;;) {
        double elapsed = now_s() - start;
        double poll = WAIT_POLL_MAX_S;
        if (progress && interval_s > 0 && interval_s < poll) poll = interval_s;
        if (timeout_s >= 0 && timeout_s - elapsed < poll) poll = timeout_s - elapsed;
        if (poll < 0) poll = 0;
        char suffix[64];
        snprintf(suffix, sizeof suffix, "/wait?timeout=%.3f", poll);
        char *path = job_path(c, id, suffix);
        if (!path) return -ENOMEM;
        double poll_start = now_s();
        gpujob_job_t *job = NULL;
        int r = job_call(c, "GET", path, (long)(poll * 1000.0), &job);
        free(path);
        if (r < 0) return r;
        gpujob_state_t state = gpujob_job_state(job);
        if (gpujob_state_is_final(state)) {
            *ret = job;
            return 0;
        }
        elapsed = now_s() - start;
        if (progress && progress(job, elapsed, userdata) != 0) {
            gpujob_job_free(job);
            return gjc_fail(c, -ECANCELED, "wait for job %s stopped", id);
        }
        gpujob_job_free(job);
        if (timeout_s >= 0 && elapsed >= timeout_s)
            return gjc_fail(c, -ETIMEDOUT, "job %s is still %s after %.1f s", id,
                            gpujob_state_name(state), elapsed);
        /* A daemon that answers a long poll early must not turn this loop into a busy one. */
        if (now_s() - poll_start < poll / 2) sleep_ms(20);
    }
}

int gpujob_wait(gpujob_client_t *c, const char *id, double timeout_s, gpujob_job_t **ret)
{
    return gpujob_wait_progress(c, id, timeout_s, 0, NULL, NULL, ret);
}

/* ---- Lists ------------------------------------------------------------------------------- */

struct gpujob_job_list {
    gpujob_job_t **jobs;
    size_t n;
    char *next;
};

void gpujob_job_list_free(gpujob_job_list_t *list)
{
    if (!list) return;
    for (size_t i = 0; i < list->n; i++)
        gpujob_job_free(list->jobs[i]);
    free(list->jobs);
    free(list->next);
    free(list);
}

size_t gpujob_job_list_count(const gpujob_job_list_t *list)
{
    return list->n;
}

const gpujob_job_t *gpujob_job_list_at(const gpujob_job_list_t *list, size_t i)
{
    return i < list->n ? list->jobs[i] : NULL;
}

const char *gpujob_job_list_next(const gpujob_job_list_t *list)
{
    return list->next;
}

static int query_add(gpujob_client_t *c, char **query, const char *key, const char *value)
{
    if (!value) return 0;
    char *escaped = gjc_escape(c, value), *q = NULL;
    int n = escaped ? asprintf(&q, "%s%s%s=%s", *query, (*query)[0] ? "&" : "?", key, escaped) : -1;
    free(escaped);
    if (n < 0) return -ENOMEM;
    free(*query);
    *query = q;
    return 0;
}

int gjc_get_json_query(gpujob_client_t *c, const char *path, const char *const *keys,
                       const char *const *values, size_t n, json_t **ret)
{
    char *q = strdup(""), *target = NULL;
    int r = q ? 0 : -ENOMEM;
    for (size_t i = 0; i < n && r >= 0; i++)
        r = query_add(c, &q, keys[i], values[i]);
    if (r >= 0 && asprintf(&target, "%s%s", path, q) < 0) r = -ENOMEM;
    free(q);
    if (r < 0) return gjc_fail(c, r, "out of memory");
    gjc_request_t req = {.method = "GET", .path = target, .accept = "application/json"};
    r = gjc_call_json(c, &req, 200, 0, ret, NULL);
    free(target);
    return r;
}

int gpujob_list(gpujob_client_t *c, const gpujob_list_query_t *query, gpujob_job_list_t **ret)
{
    gjc_clear_error(c);
    gpujob_list_query_t none = {0};
    if (!query) query = &none;
    char limit[24];
    snprintf(limit, sizeof limit, "%d", query->limit);
    static const char *const keys[] = {"state", "op", "limit", "after"};
    const char *values[] = {query->state, query->op, query->limit ? limit : NULL, query->after};
    json_t *root = NULL;
    int r = gjc_get_json_query(c, "/v1/jobs", keys, values, 4, &root);
    if (r < 0) return r;
    json_t *jobs = json_object_get(root, "jobs"), *next = json_object_get(root, "next");
    if (!json_is_array(jobs) || (next && !json_is_null(next) && !json_is_string(next))) {
        json_decref(root);
        return gjc_fail(c, -EBADMSG, "GET /v1/jobs: the answer has no job list");
    }
    gpujob_job_list_t *list = calloc(1, sizeof *list);
    size_t n = json_array_size(jobs);
    if (list) list->jobs = calloc(n ? n : 1, sizeof *list->jobs);
    if (list && list->jobs && json_is_string(next)) list->next = strdup(json_string_value(next));
    bool ok = list && list->jobs && (!json_is_string(next) || list->next);
    for (size_t i = 0; ok && i < n; i++) {
        list->jobs[i] = gjc_job_new(json_incref(json_array_get(jobs, i)), NULL);
        if (!list->jobs[i])
            ok = false;
        else
            list->n++;
    }
    json_decref(root);
    if (!ok) {
        gpujob_job_list_free(list);
        return gjc_fail(c, -ENOMEM, "out of memory");
    }
    *ret = list;
    return 0;
}

/* ---- Outputs ----------------------------------------------------------------------------- */

static char *output_path(gpujob_client_t *c, const char *id, const char *name)
{
    if (!name || !name[0]) {
        gjc_fail(c, -EINVAL, "empty output name");
        return NULL;
    }
    char *escaped = gjc_escape(c, name), *suffix = NULL, *path = NULL;
    if (escaped && asprintf(&suffix, "/outputs/%s", escaped) >= 0)
        path = job_path(c, id, suffix);
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
