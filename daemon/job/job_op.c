/* The op of a job read back from the store. The store keeps a job's op by name; the op table
 * of this build turns the name back into a validated call. A stored job can outlive its op (a
 * downgrade, an op removed or changed), and it must still be usable then: such a job gets a
 * stand-in op that carries the name and the input names and fails every attempt to validate or
 * run it with a message saying why. Stand-ins and the names they point to are interned for the
 * life of the process (op_call_t holds static strings), so there is one per distinct (name,
 * inputs) pair ever resolved. */
#include "job.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/log.h"

typedef struct interned {
    struct interned *next;
    char text[];
} interned_t;

typedef struct stand_in {
    struct stand_in *next;
    op_def_t def;
    const char *input_names[OP_MAX_TENSORS];
} stand_in_t;

static pthread_mutex_t ops_lock = PTHREAD_MUTEX_INITIALIZER;
static interned_t *interned_names;
static stand_in_t *stand_ins;
static const char *const no_params[] = {NULL};

/* Called with ops_lock held. NULL when out of memory. */
static const char *intern_locked(const char *text)
{
    for (interned_t *it = interned_names; it; it = it->next)
        if (strcmp(it->text, text) == 0) return it->text;
    size_t len = strlen(text);
    interned_t *it = malloc(sizeof *it + len + 1);
    if (!it) return NULL;
    memcpy(it->text, text, len + 1);
    it->next = interned_names;
    interned_names = it;
    return it->text;
}

static int stand_in_validate(const json_t *params, op_call_t *call, op_error_t *err)
{
    return op_error(err, -ENOTSUP, "op",
                    "op '%s' cannot run this stored job in this build of gpujobd", call->op->name);
}

static int stand_in_run_cpu(const op_call_t *call, const void *const *in, void *const *out,
                            op_error_t *err)
{
    return stand_in_validate(NULL, (op_call_t *)call, err);
}

static int stand_in_run_cuda(const op_cuda_ctx_t *ctx, int n, const op_call_t *const *calls,
                             const void *const *const *in, void *const *const *out, op_error_t *err)
{
    return stand_in_validate(NULL, (op_call_t *)calls[0], err);
}

static bool stand_in_matches(const stand_in_t *s, const char *name, int n_inputs,
                             const char *const *input_names)
{
    if (strcmp(s->def.name, name) != 0 || s->def.n_inputs != n_inputs) return false;
    for (int j = 0; j < n_inputs; j++)
        if (strcmp(s->input_names[j], input_names[j]) != 0) return false;
    return true;
}

/* The stand-in for (name, input names); NULL when out of memory. */
static const op_def_t *stand_in_get(const char *name, int n_inputs, const char *const *input_names)
{
    pthread_mutex_lock(&ops_lock);
    stand_in_t *s;
    for (s = stand_ins; s; s = s->next)
        if (stand_in_matches(s, name, n_inputs, input_names)) break;
    if (!s && (s = calloc(1, sizeof *s))) {
        bool ok = (s->def.name = intern_locked(name)) != NULL;
        for (int j = 0; ok && j < n_inputs; j++)
            ok = (s->input_names[j] = intern_locked(input_names[j])) != NULL;
        if (ok) {
            s->def.summary = "not available in this build of gpujobd";
            s->def.n_inputs = n_inputs;
            s->def.input_names = s->input_names;
            s->def.param_names = no_params;
            s->def.validate = stand_in_validate;
            s->def.run_cpu = stand_in_run_cpu;
            s->def.run_cuda = stand_in_run_cuda;
            s->next = stand_ins;
            stand_ins = s;
        } else {
            free(s);
            s = NULL;
        }
    }
    pthread_mutex_unlock(&ops_lock);
    return s ? &s->def : NULL;
}

static const char *intern(const char *text)
{
    pthread_mutex_lock(&ops_lock);
    const char *r = intern_locked(text);
    pthread_mutex_unlock(&ops_lock);
    return r;
}

/* Re-validates the stored call against the op of this build. 0, or the validation error. */
static int revalidate(job_t *job, const op_def_t *op)
{
    op_call_t call;
    memset(&call, 0, sizeof call);
    call.op = op;
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        if (!job->call.has_in[j]) continue;
        if (j >= op->n_inputs || strcmp(job->in[j].name, op->input_names[j]) != 0) return -EINVAL;
        call.has_in[j] = true;
        call.in[j] = job->call.in[j];
    }
    for (int j = 0; j < op->n_inputs; j++)
        if ((op->required_inputs >> j & 1) && !call.has_in[j]) return -EINVAL;

    json_t *params = NULL;
    if (job->params_json && !(params = json_loads(job->params_json, JSON_DECODE_ANY, NULL)))
        return -EINVAL;
    op_error_t err;
    memset(&err, 0, sizeof err);
    int r = op_call_validate(params, UINT64_MAX, &call, &err);
    json_decref(params);
    if (r < 0) {
        log_warn("job %s: op '%s' refuses its stored call: %s%s%s", job->id, op->name, err.field,
                 err.field[0] ? ": " : "", err.message);
        return r;
    }
    job->call = call;
    return 0;
}

int job_resolve_op(job_t *job)
{
    if (job->call.op) return 0;
    const char *op_name = job->op_name;
    const op_def_t *op = op_find(op_name);
    if (op && revalidate(job, op) == 0) return 0;

    int n_inputs = 0;
    const char *input_names[OP_MAX_TENSORS];
    char gap_names[OP_MAX_TENSORS][16];
    for (int j = 0; j < OP_MAX_TENSORS; j++)
        if (job->call.has_in[j]) n_inputs = j + 1;
    for (int j = 0; j < n_inputs; j++) {
        /* A slot with no stored tensor has no name on record: give it a positional one. */
        snprintf(gap_names[j], sizeof gap_names[j], "input%d", j);
        input_names[j] = job->call.has_in[j] ? job->in[j].name : gap_names[j];
    }
    const op_def_t *stand_in = stand_in_get(op_name, n_inputs, input_names);
    if (!stand_in) return -ENOMEM;

    op_call_t call;
    memset(&call, 0, sizeof call);
    call.op = stand_in;
    memcpy(call.in, job->call.in, sizeof call.in);
    memcpy(call.has_in, job->call.has_in, sizeof call.has_in);
    for (int j = 0; j < OP_MAX_TENSORS; j++) {
        if (!job->out[j].name[0]) continue;
        if (!(call.out_names[j] = intern(job->out[j].name))) return -ENOMEM;
        call.out[j] = job->out[j].desc;
        call.n_out = j + 1;
    }
    job->call = call;
    return 0;
}
