/* A job as the daemon answers it (gpujob_job_t): its state and the states' names, its fields,
 * and its inline outputs decoded into tensors, from JSON numbers or from the answer's binary
 * section, which the jobs of one answer share. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- Jobs -------------------------------------------------------------------------------- */

/* An answer's binary section, held by every job of that answer (the jobs of a waited list all
 * read their inline outputs from the one section) and freed with the last of them: sharing it
 * costs a pointer and a count per job where copying would cost each job the bytes of all. The
 * count is atomic because the jobs are separate objects to the caller, who may free them on
 * different threads. */
typedef struct job_section {
    unsigned long refs;
    gjc_section_t bytes;
} job_section_t;

struct gpujob_job {
    json_t *root;
    char *text;             /* gjc_json_dumps of root, made on first use */
    job_section_t *section; /* the answer's binary section (outputs' bytes), or NULL */
};

/* Takes section's body (when it has one) into a new shared section with one reference: 0 with
 * *ret NULL when there is no body, -ENOMEM with the body freed. */
static int section_share(gjc_section_t *section, job_section_t **ret)
{
    *ret = NULL;
    if (!section || !section->body) return 0;
    job_section_t *s = malloc(sizeof *s);
    if (!s) {
        free(section->body);
        return -ENOMEM;
    }
    *s = (job_section_t){.refs = 1, .bytes = *section};
    *ret = s;
    return 0;
}

static job_section_t *section_ref(job_section_t *s)
{
    if (s) __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
    return s;
}

static void section_unref(job_section_t *s)
{
    if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    free(s->bytes.body);
    free(s);
}

/* A job of root and section (both references taken); NULL, both released, when out of
 * memory. */
static gpujob_job_t *job_wrap(json_t *root, job_section_t *section)
{
    gpujob_job_t *job = calloc(1, sizeof *job);
    if (!job) {
        json_decref(root);
        section_unref(section);
        return NULL;
    }
    job->root = root;
    job->section = section;
    return job;
}

gpujob_job_t *gjc_job_new(json_t *root, gjc_section_t *section)
{
    job_section_t *shared;
    if (section_share(section, &shared) < 0) {
        json_decref(root);
        return NULL;
    }
    return job_wrap(root, shared);
}

int gjc_jobs_new(json_t *root, size_t n, gjc_section_t *section, gpujob_job_t **ret_jobs)
{
    job_section_t *shared = NULL;
    gpujob_job_t **jobs = calloc(n, sizeof *jobs);
    int r = jobs ? section_share(section, &shared) : -ENOMEM;
    if (!jobs && section) free(section->body);
    size_t made = 0;
    while (r >= 0 && made < n) {
        json_t *item = json_is_array(root) ? json_array_get(root, made) : root;
        if (!(jobs[made] = job_wrap(json_incref(item), section_ref(shared))))
            r = -ENOMEM;
        else
            made++;
    }
    if (r >= 0) memcpy(ret_jobs, jobs, n * sizeof *jobs);
    for (size_t i = 0; r < 0 && i < made; i++)
        gpujob_job_free(jobs[i]);
    section_unref(shared);
    free(jobs);
    json_decref(root);
    return r;
}

void gpujob_job_free(gpujob_job_t *job)
{
    if (!job) return;
    json_decref(job->root);
    free(job->text);
    section_unref(job->section);
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
        /* binary_offset counts from the start of the answer's section, shared by its jobs. */
        gjc_section_t none = {0}, *s = job->section ? &job->section->bytes : &none;
        json_int_t at = json_integer_value(offset);
        if (!json_is_integer(offset) || at < 0 || (size_t)at > s->len ||
            t.nbytes > s->len - (size_t)at)
            return -EBADMSG;
        t.data = malloc(t.nbytes ? t.nbytes : 1);
        if (!t.data) return -ENOMEM;
        if (t.nbytes) memcpy(t.data, s->body + s->offset + at, t.nbytes);
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
