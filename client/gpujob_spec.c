/* Specs: a job to submit (gpujob_spec_t) built input by input and parameter by parameter, and
 * its encodings: one JSON document with base64 data (gpujob_spec_json), and the body that
 * submits a list of them, JSON then the inputs' bytes raw. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gpujob_internal.h"

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

void gpujob_spec_set_time_limit_ms(gpujob_spec_t *spec, int64_t time_limit_ms)
{
    if (time_limit_ms <= 0)
        json_object_del(spec->obj, "time_limit_ms");
    else
        json_object_set_new(spec->obj, "time_limit_ms", json_integer(time_limit_ms));
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

/* The body that submits specs: their JSON (one job as an object, so that its answer is an
 * object; several as a list), then their binary sections one after another, each spec's
 * offsets moved past the sections before it. Returns it (malloc'd) with the JSON's length,
 * the whole length and whether it names a binary section (even an empty one, for inputs of
 * no bytes); NULL when out of memory. */
char *gjc_submission_body(const gpujob_spec_t *const *specs, size_t n, size_t *ret_json_len,
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
