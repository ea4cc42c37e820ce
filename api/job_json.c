#include "job_json.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/store/store.h"
#include "json_scan.h"
#include "tensor_codec.h"

/* A deadline further away than this (about 31 years) is surely a unit mistake. */
#define MAX_DEADLINE_MS 1000000000000LL
/* The same bound for a time limit. */
#define MAX_TIME_LIMIT_MS MAX_DEADLINE_MS

/* Fills *err (when not NULL) and returns r (a negative errno). */
static int api_error_set(api_error_t *err, int r, int status, const char *code, const char *field,
                         const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int api_error_set(api_error_t *err, int r, int status, const char *code, const char *field,
                         const char *fmt, ...)
{
    if (!err) return r;
    err->status = status;
    snprintf(err->code, sizeof err->code, "%s", code);
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return r;
}

/* "prefix.rel", or rel alone when there is no prefix (or prefix alone when rel is ""). */
static const char *field_path(char *buf, size_t size, const char *prefix, const char *rel)
{
    if (!prefix || !*prefix)
        snprintf(buf, size, "%s", rel);
    else if (!*rel)
        snprintf(buf, size, "%s", prefix);
    else
        snprintf(buf, size, "%s.%s", prefix, rel);
    return buf;
}

static int invalid(api_error_t *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int invalid(api_error_t *err, const char *field, const char *fmt, ...)
{
    char message[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return api_error_set(err, -EINVAL, 400, "invalid_argument", field, "%s", message);
}

/* Maps a codec failure: a tensor over the byte limit is 413, memory 500, the rest 400. */
static int codec_failure(api_error_t *err, int r, const op_error_t *cerr)
{
    if (r == -E2BIG)
        return api_error_set(err, r, 413, "payload_too_large", cerr->field, "%s", cerr->message);
    if (r == -ENOMEM)
        return api_error_set(err, r, 500, "internal", cerr->field, "%s", cerr->message);
    return api_error_set(err, r, 400, "invalid_argument", cerr->field, "%s", cerr->message);
}

/* Maps an op's validation failure: a size over a limit (an output over max_tensor_bytes, a
 * shape whose byte size does not fit in 63 bits, a dim past what the op's kernels index) is
 * 413 like an input over the limit; the rest 400. field is the full path of the field. */
static int validate_failure(api_error_t *err, int r, const char *field, const op_error_t *oerr)
{
    if (r == -E2BIG || r == -EOVERFLOW)
        return api_error_set(err, r, 413, "payload_too_large", field, "%s", oerr->message);
    return api_error_set(err, r, 400, "invalid_argument", field, "%s", oerr->message);
}

static bool key_in(const char *key, const char *const *keys)
{
    for (; *keys; keys++)
        if (strcmp(*keys, key) == 0) return true;
    return false;
}

/* Rejects keys of obj not in allowed, naming the first one. */
static int check_keys(const json_t *obj, const char *const *allowed, const char *prefix,
                      api_error_t *err)
{
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value)
    {
        if (!key_in(key, allowed)) {
            char field[128];
            return invalid(err, field_path(field, sizeof field, prefix, key), "unknown key '%s'",
                           key);
        }
    }
    return 0;
}

/* The tensor's bytes from the body's binary section, at the spec's binary_offset. */
static int tensor_from_binary(const json_t *offset, const job_json_env_t *env, const char *field,
                              job_tensor_t *t, api_error_t *err)
{
    if (!env->binary)
        return invalid(err, field,
                       "binary_offset needs a binary section: send the body as "
                       "application/octet-stream with a Gpujob-Json-Length header");
    json_int_t at = json_is_integer(offset) ? json_integer_value(offset) : -1;
    if (at < 0) return invalid(err, field, "binary_offset must be an integer >= 0");
    if ((uint64_t)at > env->binary_len || t->nbytes > env->binary_len - (uint64_t)at)
        return invalid(err, field,
                       "the tensor's %" PRIu64 " bytes from binary_offset %" JSON_INTEGER_FORMAT
                       " pass the end of the binary section (%zu bytes)",
                       t->nbytes, at, env->binary_len);
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    if (!t->data) return api_error_set(err, -ENOMEM, 500, "internal", field, "out of memory");
    memcpy(t->data, env->binary + at, t->nbytes);
    return 0;
}

/* The span a tensor's data or b64 names in a scanned document's tree: json_scan() put its
 * index there, and nothing else can be there. NULL when it is not one (a bug, never the
 * client's text). */
static const json_span_t *scan_span(const json_scan_t *scan, const json_t *v)
{
    json_int_t i = json_is_integer(v) ? json_integer_value(v) : -1;
    return i >= 0 && (size_t)i < scan->n_spans ? &scan->spans[i] : NULL;
}

static int span_lost(api_error_t *err, const char *field)
{
    return api_error_set(err, -EFAULT, 500, "internal", field,
                         "the tensor's data was lost between scanning and parsing the body");
}

/* The tensor's data from the span that a scanned document's data names: the values the
 * scanner read as it checked them when they fit the tensor (its dtype, its element count),
 * else those of the span's text, read now, which also finds what does not fit. */
static int tensor_from_span(json_scan_t *scan, const json_span_t *span, const char *field,
                            job_tensor_t *t, op_error_t *cerr)
{
    if (span->values && span->values_dtype == t->desc.dtype &&
        (int64_t)span->n_values == tensor_desc_numel(&t->desc)) {
        t->data = json_scan_take_values(scan, (size_t)(span - scan->spans));
        return 0;
    }
    return codec_data_from_text(scan->text + span->off, span->len, &t->desc, field, &t->data, cerr);
}

/* The tensor's bytes from base64 text: the b64 value of the spec, or of the span that a
 * scanned document's tree names in its place (its characters, or the JSON of a value that
 * was not a plain string). */
static int tensor_from_b64(const json_t *b64, const job_json_env_t *env, const char *field,
                           job_tensor_t *t, api_error_t *err)
{
    const char *text = NULL;
    size_t len = 0;
    json_t *loaded = NULL;
    if (env->scan) {
        const json_span_t *span = scan_span(env->scan, b64);
        if (!span) return span_lost(err, field);
        if (span->kind == JSON_SPAN_B64) {
            text = env->scan->text + span->off;
            len = span->len;
        } else {
            b64 = loaded =
                json_loadb(env->scan->text + span->off, span->len, JSON_DECODE_ANY, NULL);
        }
    }
    if (!text && json_is_string(b64)) {
        text = json_string_value(b64);
        len = json_string_length(b64);
    }
    if (!text) {
        json_decref(loaded);
        return invalid(err, field, "b64 must be a base64 string");
    }
    void *bytes = NULL;
    size_t n = 0;
    op_error_t cerr = {0};
    int r = codec_b64_decode(text, len, &bytes, &n, &cerr);
    json_decref(loaded);
    if (r < 0) {
        snprintf(cerr.field, sizeof cerr.field, "%s", field);
        return codec_failure(err, r, &cerr);
    }
    if (n != t->nbytes) {
        free(bytes);
        return invalid(err, field, "b64 holds %zu bytes but dtype and shape need %" PRIu64, n,
                       t->nbytes);
    }
    t->data = bytes;
    return 0;
}

/* Fills t from a tensor spec: inline data, b64, bytes of the binary section or a buffer
 * reference. path is "inputs.x" with the caller's prefix. *ret_device: a resident buffer's
 * device, else left alone. */
static int parse_tensor(const json_t *spec, const job_json_env_t *env, const char *path,
                        job_tensor_t *t, int *ret_device, api_error_t *err)
{
    static const char *const keys[] = {"dtype",  "shape",         "data", "b64",
                                       "buffer", "binary_offset", NULL};
    char field[128];
    if (!json_is_object(spec))
        return invalid(err, path,
                       "a tensor must be an object with dtype, shape and data, "
                       "b64, binary_offset or buffer");
    int r = check_keys(spec, keys, path, err);
    if (r < 0) return r;

    const json_t *data = json_object_get(spec, "data");
    const json_t *b64 = json_object_get(spec, "b64");
    const json_t *binary = json_object_get(spec, "binary_offset");
    const json_t *buffer = json_object_get(spec, "buffer");
    int sources = !!data + !!b64 + !!binary + !!buffer;
    if (sources == 0)
        return invalid(err, path, "one of data, b64, binary_offset or buffer is required");
    if (sources > 1)
        return invalid(err, path, "give only one of data, b64, binary_offset or buffer");

    if (buffer) {
        field_path(field, sizeof field, path, "buffer");
        if (json_object_get(spec, "dtype") || json_object_get(spec, "shape"))
            return invalid(err,
                           field_path(field, sizeof field, path,
                                      json_object_get(spec, "dtype") ? "dtype" : "shape"),
                           "dtype and shape come from the buffer; leave them out");
        if (!json_is_string(buffer) || !id_valid('b', json_string_value(buffer)))
            return invalid(err, field, "buffer must be a buffer id");
        const char *id = json_string_value(buffer);
        r = env->buffer_desc ? env->buffer_desc(env->ud, env->owner, id, &t->desc, ret_device)
                             : -ENOENT;
        if (r == -ENOENT)
            return api_error_set(err, r, 404, "not_found", field, "buffer '%s' not found", id);
        if (r < 0)
            return api_error_set(err, r, 500, "internal", field, "buffer '%s' unreadable: %s", id,
                                 strerror(-r));
        snprintf(t->buffer_id, sizeof t->buffer_id, "%s", id);
        t->nbytes = tensor_desc_bytes(&t->desc);
        return 0;
    }

    op_error_t cerr = {0};
    r = codec_desc_from_json(json_object_get(spec, "dtype"), json_object_get(spec, "shape"), path,
                             env->cfg->max_tensor_bytes, &t->desc, &cerr);
    if (r < 0) return codec_failure(err, r, &cerr);
    t->nbytes = tensor_desc_bytes(&t->desc);

    if (data) {
        field_path(field, sizeof field, path, "data");
        const json_span_t *span = env->scan ? scan_span(env->scan, data) : NULL;
        if (env->scan && !span) return span_lost(err, field);
        r = span ? tensor_from_span(env->scan, span, field, t, &cerr)
                 : codec_data_from_json(data, &t->desc, field, &t->data, &cerr);
        return r < 0 ? codec_failure(err, r, &cerr) : 0;
    }
    if (binary)
        return tensor_from_binary(binary, env,
                                  field_path(field, sizeof field, path, "binary_offset"), t, err);
    return tensor_from_b64(b64, env, field_path(field, sizeof field, path, "b64"), t, err);
}

static int parse_inputs(const json_t *inputs, const job_json_env_t *env, const char *prefix,
                        job_t *job, api_error_t *err)
{
    const op_def_t *op = job->call.op;
    char field[128], path[128];
    field_path(field, sizeof field, prefix, "inputs");
    if (!inputs) return invalid(err, field, "inputs is required");
    if (!json_is_object(inputs)) return invalid(err, field, "inputs must be an object");

    const char *name;
    json_t *spec;
    json_object_foreach((json_t *)inputs, name, spec)
    {
        snprintf(path, sizeof path, "%.63s.%.63s", field, name);
        int j = op_input_index(op, name);
        if (j < 0) {
            char names[256] = "";
            for (int k = 0; k < op->n_inputs; k++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                         op->input_names[k]);
            return invalid(err, path, "op '%s' has no input '%s' (inputs: %s)", op->name, name,
                           names);
        }
        job_tensor_t *t = &job->in[j];
        snprintf(t->name, sizeof t->name, "%s", op->input_names[j]);
        int device = -1;
        int r = parse_tensor(spec, env, path, t, &device, err);
        if (r < 0) return r;
        /* Run where the (first) resident input lives, while that device serves. */
        if (job->preferred_device < 0) job->preferred_device = device;
        if (device >= 0) job->resident_inputs |= (uint16_t)(1u << j);
        job->call.in[j] = t->desc;
        job->call.has_in[j] = true;
    }
    for (int j = 0; j < op->n_inputs; j++)
        if ((op->required_inputs >> j & 1) && !job->call.has_in[j]) {
            snprintf(path, sizeof path, "%.63s.%.63s", field, op->input_names[j]);
            return invalid(err, path, "op '%s' requires input '%s'", op->name, op->input_names[j]);
        }
    return 0;
}

/* The time limit a job gets when it gives none: the default within the user's bound. */
static int64_t default_time_limit_ms(const job_json_env_t *env)
{
    int64_t def = env->cfg->default_time_limit_ms, max = env->max_time_limit_ms;
    return def > 0 && (max <= 0 || def <= max) ? def : max > 0 ? max : 0;
}

/* time_limit_ms: absent, the default; null, none (only where the user has no bound); else an
 * integer in [1, MAX_TIME_LIMIT_MS] within the user's bound (422 time_limit_too_long, naming the
 * key that set the bound, as the policy's refusals do). */
static int parse_time_limit(const json_t *obj, const job_json_env_t *env, const char *prefix,
                            job_t *job, api_error_t *err)
{
    char field[128];
    field_path(field, sizeof field, prefix, "time_limit_ms");
    const json_t *v = json_object_get(obj, "time_limit_ms");
    int64_t ms = default_time_limit_ms(env);
    if (v && json_is_null(v))
        ms = 0;
    else if (v && json_is_integer(v) && json_integer_value(v) > 0 &&
             json_integer_value(v) <= MAX_TIME_LIMIT_MS)
        ms = json_integer_value(v);
    else if (v)
        return invalid(err, field, "time_limit_ms must be null or an integer in [1, %lld]",
                       (long long)MAX_TIME_LIMIT_MS);
    int64_t max = env->max_time_limit_ms;
    if (max > 0 && (ms == 0 || ms > max)) {
        const char *key = env->max_time_limit_key ? env->max_time_limit_key : "";
        char asked[48] = "null (no limit)";
        if (ms) snprintf(asked, sizeof asked, "%lld ms", (long long)ms);
        return api_error_set(err, -EINVAL, 422, "time_limit_too_long", key,
                             "%s = %s asks for more than %s = %lld ms allows", field, asked, key,
                             (long long)max);
    }
    job->time_limit_ms = ms;
    return 0;
}

static int parse_scalars(const json_t *obj, const job_json_env_t *env, const char *prefix,
                         job_t *job, api_error_t *err)
{
    char field[128];
    const json_t *v = json_object_get(obj, "priority");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < -100 || json_integer_value(v) > 100)
            return invalid(err, field_path(field, sizeof field, prefix, "priority"),
                           "priority must be an integer in [-100, 100]");
        job->priority = (int)json_integer_value(v);
    }
    v = json_object_get(obj, "device");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1023)
            return invalid(err, field_path(field, sizeof field, prefix, "device"),
                           "device must be null or a device index in [0, 1023]");
        job->device = (int)json_integer_value(v);
    }
    v = json_object_get(obj, "deadline_ms");
    int64_t deadline_ms = env->cfg->default_deadline_ms;
    if (v) {
        if (json_is_null(v))
            deadline_ms = 0;
        else if (json_is_integer(v) && json_integer_value(v) > 0 &&
                 json_integer_value(v) <= MAX_DEADLINE_MS)
            deadline_ms = json_integer_value(v);
        else
            return invalid(err, field_path(field, sizeof field, prefix, "deadline_ms"),
                           "deadline_ms must be null or an integer in [1, %lld]",
                           (long long)MAX_DEADLINE_MS);
    }
    job->deadline_us = deadline_ms > 0 ? env->now_us + deadline_ms * 1000 : 0;
    return parse_time_limit(obj, env, prefix, job, err);
}

/* With env->time_limit_by_cost, refuses (422 time_limit_too_short) a job whose op's cost
 * estimate passes its time limit: the backend could not stop it there. */
static int check_limit_covers_cost(const job_json_env_t *env, const char *prefix, const job_t *job,
                                   api_error_t *err)
{
    if (!env->time_limit_by_cost || job->time_limit_ms <= 0) return 0;
    double ms = op_cost_ms(job->call.cost);
    if (ms <= (double)job->time_limit_ms) return 0;
    char field[128];
    return api_error_set(err, -EINVAL, 422, "time_limit_too_short",
                         field_path(field, sizeof field, prefix, "time_limit_ms"),
                         "op '%s' is estimated at %.0f ms (its cost at 1 GB/s and 100 GFLOP/s), "
                         "past time_limit_ms = %lld: this backend cannot stop a launched kernel, "
                         "so a job's estimate must fit its limit",
                         job->call.op->name, ms, (long long)job->time_limit_ms);
}

/* Parses one job object into a new validated job (state queued, a new id, owner and
 * created_us from env, tensors decoded into memory, outputs described by the op). prefix is
 * prepended to error fields ("[3]" gives "[3].inputs.x"; "" for none). 0, or a negative errno
 * with *err filled (400, 404 for a missing buffer, 413 for an input or output tensor over the
 * limit or too large to compute). */
static int job_json_parse(const json_t *obj, const job_json_env_t *env, const char *prefix,
                          job_t **ret, api_error_t *err)
{
    static const char *const keys[] = {"op",     "params",      "inputs",        "priority",
                                       "device", "deadline_ms", "time_limit_ms", NULL};
    char field[128];
    if (!json_is_object(obj)) return invalid(err, prefix, "a job must be a JSON object");
    int r = check_keys(obj, keys, prefix, err);
    if (r < 0) return r;

    const json_t *opv = json_object_get(obj, "op");
    field_path(field, sizeof field, prefix, "op");
    if (!opv) return invalid(err, field, "op is required");
    if (!json_is_string(opv)) return invalid(err, field, "op must be a string");
    const op_def_t *op = env->find_op(json_string_value(opv));
    if (!op) return invalid(err, field, "unknown op '%s'", json_string_value(opv));
    if (env->runs_op && !env->runs_op(env->ud, op))
        return api_error_set(err, -ENOTSUP, 422, "unsupported", field,
                             "op '%s' cannot run on this daemon's backend", op->name);

    const json_t *params = json_object_get(obj, "params");
    if (json_is_null(params)) params = NULL;
    if (params && !json_is_object(params))
        return invalid(err, field_path(field, sizeof field, prefix, "params"),
                       "params must be an object");

    job_t *job = job_new();
    if (!job) return api_error_set(err, -ENOMEM, 500, "internal", "", "out of memory");
    job->call.op = op;
    r = parse_scalars(obj, env, prefix, job, err);
    if (r >= 0) r = parse_inputs(json_object_get(obj, "inputs"), env, prefix, job, err);
    if (r >= 0) {
        op_error_t oerr = {0};
        r = op_params_check_keys(op, params, &oerr);
        if (r >= 0) r = op_call_validate(params, env->cfg->max_tensor_bytes, &job->call, &oerr);
        if (r < 0)
            r = validate_failure(err, r, field_path(field, sizeof field, prefix, oerr.field),
                                 &oerr);
    }
    if (r >= 0) r = check_limit_covers_cost(env, prefix, job, err);
    if (r >= 0) {
        job->params_json = params ? json_dumps(params, JSON_COMPACT) : strdup("{}");
        if (!job->params_json)
            r = api_error_set(err, -ENOMEM, 500, "internal", "", "out of memory");
    }
    if (r < 0) {
        job_free(job);
        return r;
    }
    job_describe_outputs(job);
    id_new('j', job->id);
    snprintf(job->owner, sizeof job->owner, "%s", env->owner);
    job->state = JOB_QUEUED;
    job->created_us = env->now_us;
    *ret = job;
    return 0;
}

void job_json_free_jobs(job_t **jobs, size_t n)
{
    for (size_t i = 0; jobs && i < n; i++)
        job_free(jobs[i]);
    free(jobs);
}

static int too_many_jobs(api_error_t *err, size_t n, const job_json_env_t *env)
{
    return api_error_set(err, -E2BIG, 413, "payload_too_large", "",
                         "%zu jobs in one request; at most %d are allowed", n,
                         env->cfg->max_jobs_per_request);
}

/* job_json_parse_request() with env->scan as the caller set it. */
static int parse_jobs(const json_t *root, const job_json_env_t *env, const char *idem_key,
                      job_t ***ret_jobs, size_t *ret_n, bool *ret_is_list, api_error_t *err)
{
    bool is_list = json_is_array(root);
    size_t n = is_list ? json_array_size(root) : 1;
    if (!is_list && !json_is_object(root))
        return invalid(err, "", "the body must be a job object or a list of job objects");
    if (n == 0) return invalid(err, "", "the list of jobs is empty");
    if (n > (size_t)env->cfg->max_jobs_per_request) return too_many_jobs(err, n, env);
    bool has_key = idem_key && *idem_key;
    if (has_key && is_list && strlen(idem_key) + 1 + 20 >= IDEM_KEY_SIZE)
        return invalid(err, "header.Idempotency-Key",
                       "Idempotency-Key must be at most %d characters for a list of jobs",
                       IDEM_KEY_SIZE - 1 - 21);

    job_t **jobs = calloc(n, sizeof *jobs);
    if (!jobs) return api_error_set(err, -ENOMEM, 500, "internal", "", "out of memory");
    for (size_t i = 0; i < n; i++) {
        char prefix[24] = "";
        if (is_list) snprintf(prefix, sizeof prefix, "[%zu]", i);
        int r =
            job_json_parse(is_list ? json_array_get(root, i) : root, env, prefix, &jobs[i], err);
        if (r < 0) {
            job_json_free_jobs(jobs, i);
            return r;
        }
        if (has_key) job_idem_key_format(jobs[i]->idempotency_key, idem_key, is_list, i);
    }
    *ret_jobs = jobs;
    *ret_n = n;
    *ret_is_list = is_list;
    return 0;
}

int job_json_parse_request(const json_t *root, const job_json_env_t *env, const char *idem_key,
                           job_t ***ret_jobs, size_t *ret_n, bool *ret_is_list, api_error_t *err)
{
    job_json_env_t plain = *env;
    plain.scan = NULL;
    return parse_jobs(root, &plain, idem_key, ret_jobs, ret_n, ret_is_list, err);
}

/* The jansson allocations of the body this thread parses, against the request's limit. Only
 * allocations are counted, never frees: their sum bounds the peak from above, and needs no
 * header on the blocks, so a block is freed by plain free() whoever allocated it. */
typedef struct parse_budget {
    bool active, exceeded;
    uint64_t left;
} parse_budget_t;

static _Thread_local parse_budget_t parse_budget;
static pthread_once_t parse_budget_once = PTHREAD_ONCE_INIT;

static void *parse_budget_malloc(size_t n)
{
    parse_budget_t *b = &parse_budget;
    /* The allocator's own header: a json_t of a few bytes costs more than its size. */
    uint64_t cost = (uint64_t)n + 16;
    if (b->active) {
        if (cost > b->left) {
            b->exceeded = true;
            return NULL;
        }
        b->left -= cost;
    }
    return malloc(n);
}

static void parse_budget_install(void)
{
    json_set_alloc_funcs(parse_budget_malloc, free);
}

static int invalid_json(api_error_t *err, const char *text, size_t offset, const char *why)
{
    int line, column;
    json_scan_position(text, offset, &line, &column);
    return api_error_set(err, -EINVAL, 400, "invalid_json", "body",
                         "invalid JSON at line %d column %d: %s", line, column, why);
}

/* Parses the scanned document's skeleton with jansson within the tree budget, then its jobs. */
static int parse_skeleton(json_scan_t *scan, const job_json_env_t *env, const char *idem_key,
                          job_t ***ret_jobs, size_t *ret_n, bool *ret_is_list, api_error_t *err)
{
    json_error_t jerr;
    json_t *root = json_loadb(scan->skeleton, scan->skeleton_len,
                              JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) {
        size_t at = json_scan_text_offset(scan, jerr.position > 0 ? (size_t)jerr.position - 1 : 0);
        return invalid_json(err, scan->text, at, jerr.text);
    }
    job_json_env_t scanned = *env;
    scanned.scan = scan;
    int r = parse_jobs(root, &scanned, idem_key, ret_jobs, ret_n, ret_is_list, err);
    json_decref(root);
    return r;
}

static int tree_budget_exceeded(api_error_t *err, const job_json_env_t *env)
{
    return api_error_set(err, -E2BIG, 413, "payload_too_large", "body",
                         "parsing this JSON takes more than limits.max_json_tree_bytes (%" PRIu64
                         " bytes) of memory besides its tensor data",
                         env->cfg->max_json_tree_bytes);
}

int job_json_parse_body(const char *text, size_t len, const job_json_env_t *env,
                        const char *idem_key, job_t ***ret_jobs, size_t *ret_n, bool *ret_is_list,
                        api_error_t *err)
{
    /* The budget counts the trees jansson builds from here on: the scan's checks of the rare
     * values it hands to jansson (a data value holding objects, say) as well as the skeleton's. */
    pthread_once(&parse_budget_once, parse_budget_install);
    parse_budget = (parse_budget_t){.active = true, .left = env->cfg->max_json_tree_bytes};
    json_scan_t scan;
    json_scan_error_t serr;
    int r = json_scan(text, len, (size_t)env->cfg->max_jobs_per_request, env->cfg->max_tensor_bytes,
                      &scan, &serr);
    if (parse_budget.exceeded) {
        parse_budget.active = false;
        if (r == 0) json_scan_done(&scan);
        return tree_budget_exceeded(err, env);
    }
    if (r < 0) parse_budget.active = false;
    if (r == -EINVAL) return invalid_json(err, text, serr.offset, serr.text);
    if (r < 0) return api_error_set(err, r, 500, "internal", "", "out of memory");
    if (scan.is_list && scan.n_jobs > (size_t)env->cfg->max_jobs_per_request) {
        parse_budget.active = false;
        json_scan_done(&scan);
        return too_many_jobs(err, scan.n_jobs, env);
    }

    job_t **jobs = NULL;
    size_t n = 0;
    bool is_list = false;
    r = parse_skeleton(&scan, env, idem_key, &jobs, &n, &is_list, err);
    bool exceeded = parse_budget.exceeded;
    parse_budget.active = false;
    json_scan_done(&scan);
    if (r == 0 && exceeded) job_json_free_jobs(jobs, n);
    if (exceeded) return tree_budget_exceeded(err, env);
    if (r < 0) return r;
    *ret_jobs = jobs;
    *ret_n = n;
    *ret_is_list = is_list;
    return 0;
}

/* --- to JSON --- */

json_t *job_json_time(int64_t us)
{
    if (us <= 0) return json_null();
    time_t secs = (time_t)(us / 1000000);
    struct tm tm;
    char buf[40];
    gmtime_r(&secs, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%06dZ", (int)(us % 1000000));
    return json_string(buf);
}

json_t *job_json_tensor_desc(const tensor_desc_t *d)
{
    json_t *shape = json_array();
    for (int i = 0; i < d->ndim; i++)
        json_array_append_new(shape, json_integer(d->shape[i]));
    return json_pack("{s:s, s:o, s:I}", "dtype", dtype_name(d->dtype), "shape", shape, "bytes",
                     (json_int_t)tensor_desc_bytes(d));
}

static json_t *ms_or_null(int64_t from_us, int64_t to_us)
{
    if (from_us <= 0 || to_us <= 0) return json_null();
    return json_real((double)(to_us - from_us) / 1000.0);
}

/* Appends n bytes to the section: the offset they start at, or -1 when out of memory. */
static json_int_t section_append(job_json_section_t *section, const void *bytes, size_t n)
{
    if (section->cap - section->len < n) {
        size_t cap = section->cap ? section->cap : 4096;
        while (cap - section->len < n)
            cap *= 2;
        unsigned char *grown = realloc(section->bytes, cap);
        if (!grown) return -1;
        section->bytes = grown;
        section->cap = cap;
    }
    if (n) memcpy(section->bytes + section->len, bytes, n);
    section->len += n;
    return (json_int_t)(section->len - n);
}

static json_t *output_json(const job_tensor_t *t, uint64_t inline_max, job_json_load_fn load,
                           void *load_ud, job_json_section_t *section)
{
    json_t *o = job_json_tensor_desc(&t->desc);
    if (o && store_blob_expired(t->blob)) {
        /* Its bytes went early, the store being past its bound: the descriptor says so. */
        json_object_set_new(o, "expired", json_true());
        return o;
    }
    if (!o || t->nbytes > inline_max) return o;
    void *bytes = t->data;
    if (!bytes && load && load(load_ud, t, &bytes) < 0) bytes = NULL;
    if (bytes && section) {
        json_int_t at = section_append(section, bytes, t->nbytes);
        if (at >= 0) json_object_set_new(o, "binary_offset", json_integer(at));
    } else if (bytes) {
        json_object_set_new(o, "data", codec_data_to_json(&t->desc, bytes));
    }
    if (bytes != t->data) free(bytes);
    return o;
}

json_t *job_json_from_job(const job_t *job, uint64_t inline_max, job_json_load_fn load,
                          void *load_ud, job_json_section_t *section)
{
    json_t *params = job->params_json ? json_loads(job->params_json, 0, NULL) : NULL;
    json_t *inputs = json_object(), *outputs = json_object();
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        const job_tensor_t *t = &job->in[j];
        if (!t->name[0]) continue;
        json_t *o = job_json_tensor_desc(&t->desc);
        if (t->buffer_id[0]) json_object_set_new(o, "buffer", json_string(t->buffer_id));
        json_object_set_new(inputs, t->name, o);
    }
    /* Outputs exist only once a job succeeded; before that the slots hold expectations. */
    for (int j = 0; job->state == JOB_SUCCEEDED && j < OP_MAX_TENSORS; j++)
        if (job->out[j].name[0])
            json_object_set_new(outputs, job->out[j].name,
                                output_json(&job->out[j], inline_max, load, load_ud, section));

    bool final = job_state_is_final(job->state);
    int64_t queue_end = job->started_us ? job->started_us : job->finished_us;
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(job->id));
    json_object_set_new(o, "owner", json_string(job->owner));
    json_object_set_new(o, "op", job_op_name(job) ? json_string(job_op_name(job)) : json_null());
    json_object_set_new(o, "params", params ? params : json_object());
    json_object_set_new(o, "state", json_string(job_state_name(job->state)));
    json_object_set_new(o, "priority", json_integer(job->priority));
    json_object_set_new(o, "device", job->device >= 0 ? json_integer(job->device) : json_null());
    /* A list's element shows its key as the header's, a colon and its index. */
    char key[IDEM_KEY_SIZE];
    job_idem_key_shown(job->idempotency_key, key);
    json_object_set_new(o, "idempotency_key", key[0] ? json_string(key) : json_null());
    json_object_set_new(o, "deadline_at", job_json_time(job->deadline_us));
    json_object_set_new(o, "time_limit_ms",
                        job->time_limit_ms > 0 ? json_integer(job->time_limit_ms) : json_null());
    json_object_set_new(o, "created_at", job_json_time(job->created_us));
    json_object_set_new(o, "started_at", job_json_time(job->started_us));
    json_object_set_new(o, "finished_at", job_json_time(job->finished_us));
    json_object_set_new(o, "attempts", json_integer(job->attempts));
    json_object_set_new(o, "run_device",
                        job->run_device >= 0 ? json_integer(job->run_device) : json_null());
    json_object_set_new(o, "batch_size",
                        job->batch_size > 0 ? json_integer(job->batch_size) : json_null());
    json_object_set_new(o, "queue_ms", ms_or_null(job->created_us, queue_end));
    json_object_set_new(o, "run_ms", ms_or_null(job->started_us, job->finished_us));
    json_object_set_new(
        o, "gpu_ms", final && job->started_us ? json_real((double)job->gpu_ns / 1e6) : json_null());
    json_object_set_new(o, "batch_gpu_ms",
                        final && job->started_us ? json_real((double)job->batch_ns / 1e6)
                                                 : json_null());
    json_object_set_new(o, "error",
                        job->error_code[0] ? json_pack("{s:s, s:s}", "code", job->error_code,
                                                       "message", job->error_message)
                                           : json_null());
    if (job->state == JOB_QUEUED && job->waiting_reason[0]) {
        json_t *w = json_pack("{s:s, s:I}", "reason", job->waiting_reason, "position",
                              (json_int_t)job->waiting_position);
        if (job->waiting_limit[0]) json_object_set_new(w, "limit", json_string(job->waiting_limit));
        json_object_set_new(o, "waiting", w);
    }
    json_object_set_new(o, "inputs", inputs);
    json_object_set_new(o, "outputs", outputs);
    return o;
}

json_t *job_json_from_buffer(const buffer_t *buf)
{
    json_t *o = job_json_tensor_desc(&buf->desc);
    if (!o) return NULL;
    json_object_set_new(o, "id", json_string(buf->id));
    json_object_set_new(o, "resident", json_boolean(buf->resident));
    json_object_set_new(o, "durable", json_boolean(buf->durable));
    json_object_set_new(o, "device", buf->device >= 0 ? json_integer(buf->device) : json_null());
    json_object_set_new(o, "created_at", job_json_time(buf->created_us));
    return o;
}
