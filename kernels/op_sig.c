/* An op's signature (op_sig_t) as JSON: what `gpujobd --print-ops` prints, one op a line, and
 * scripts/openapi_sync.py turns into api/openapi.yaml's per-op job schemas. */
#include "op.h"

#include <math.h>
#include <string.h>

static const char *const sig_param_types[] = {
    [OP_PARAM_BOOL] = "boolean", [OP_PARAM_NUMBER] = "number",
    [OP_PARAM_INT] = "integer",  [OP_PARAM_INT_PAIR] = "integer_or_pair",
    [OP_PARAM_NAMES] = "names",
};

/* A new JSON list of the names of the dtypes in mask. */
static json_t *sig_dtypes_json(uint32_t mask)
{
    json_t *list = json_array();
    for (int dt = 0; list && dt < DTYPE_COUNT; dt++)
        if (mask & OP_DTYPE_BIT(dt)) json_array_append_new(list, json_string(dtype_name(dt)));
    return list;
}

static json_t *sig_input_json(const op_def_t *op, int j)
{
    const op_input_sig_t *in = &op->sig->inputs[j];
    return json_pack("{s:s, s:b, s:o, s:i, s:i}", "name", op->input_names[j], "required",
                     (op->required_inputs >> j) & 1, "dtypes", sig_dtypes_json(in->dtypes),
                     "min_rank", in->min_rank, "max_rank", in->max_rank);
}

static json_t *sig_param_json(const op_param_sig_t *p)
{
    json_t *o = json_pack("{s:s, s:s, s:b, s:s}", "name", p->name, "type", sig_param_types[p->kind],
                          "required", p->dflt == NULL, "doc", p->doc ? p->doc : "");
    if (!o) return NULL;
    bool ints = p->kind == OP_PARAM_INT || p->kind == OP_PARAM_INT_PAIR;
    if (isfinite(p->lo))
        json_object_set_new(o, "minimum",
                            ints ? json_integer((json_int_t)p->lo) : json_real(p->lo));
    if (isfinite(p->hi))
        json_object_set_new(o, "maximum",
                            ints ? json_integer((json_int_t)p->hi) : json_real(p->hi));
    if (p->dflt) json_object_set_new(o, "default", json_loads(p->dflt, JSON_DECODE_ANY, NULL));
    if (p->choices) {
        json_t *names = json_array();
        for (const char *const *c = p->choices; names && *c; c++)
            json_array_append_new(names, json_string(*c));
        json_object_set_new(o, "choices", names);
    }
    return o;
}

json_t *op_sig_json(const op_def_t *op)
{
    json_t *inputs = json_array(), *params = json_array();
    json_t *o = json_pack("{s:s, s:s, s:s, s:o, s:o}", "name", op->name, "summary",
                          op->summary ? op->summary : "", "rules",
                          op->sig && op->sig->rules ? op->sig->rules : "", "inputs", inputs,
                          "params", params);
    if (!o || !op->sig) {
        json_decref(o);
        return NULL;
    }
    for (int j = 0; j < op->n_inputs; j++)
        json_array_append_new(inputs, sig_input_json(op, j));
    /* A signature whose params do not follow param_names would describe another op: no JSON
     * rather than a wrong one. */
    for (int i = 0; op->param_names && op->param_names[i]; i++) {
        if (strcmp(op->sig->params[i].name, op->param_names[i]) != 0) {
            json_decref(o);
            return NULL;
        }
        json_array_append_new(params, sig_param_json(&op->sig->params[i]));
    }
    return o;
}
