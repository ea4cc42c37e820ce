/* Typed access to an op's JSON params, with errors that name the field. */
#include "op.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The field path of a param, "params.<key>", in a caller's buffer. */
static const char *param_field(char buf[64], const char *key)
{
    snprintf(buf, 64, "params.%s", key);
    return buf;
}

static const json_t *param_get(const json_t *params, const char *key)
{
    const json_t *v = params ? json_object_get(params, key) : NULL;
    return json_is_null(v) ? NULL : v;
}

int op_params_check_keys(const op_def_t *op, const json_t *params, op_error_t *err)
{
    if (!params || json_is_null(params)) return 0;
    if (!json_is_object(params))
        return op_error(err, -EINVAL, "params", "params must be an object");
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)params, key, value)
    {
        bool known = false;
        for (const char *const *p = op->param_names; p && *p && !known; p++)
            known = strcmp(*p, key) == 0;
        if (!known)
            return op_error(err, -EINVAL, param_field((char[64]){0}, key),
                            "unknown param '%s' for op '%s'", key, op->name);
    }
    return 0;
}

int op_param_bool(const json_t *params, const char *key, bool dflt, bool *ret, op_error_t *err)
{
    const json_t *v = param_get(params, key);
    if (!v) {
        *ret = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return op_error(err, -EINVAL, param_field((char[64]){0}, key),
                        "params.%s must be true or false", key);
    *ret = json_is_true(v);
    return 0;
}

int op_param_double(const json_t *params, const char *key, double dflt, double *ret,
                    op_error_t *err)
{
    const json_t *v = param_get(params, key);
    if (!v) {
        *ret = dflt;
        return 0;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return op_error(err, -EINVAL, param_field((char[64]){0}, key),
                        "params.%s must be a finite number", key);
    *ret = json_number_value(v);
    return 0;
}

static int int_in_range(const json_t *v, const char *key, int64_t lo, int64_t hi, int64_t *ret,
                        op_error_t *err)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return op_error(err, -EINVAL, param_field((char[64]){0}, key),
                        "params.%s must be an integer in [%lld, %lld]", key, (long long)lo,
                        (long long)hi);
    *ret = json_integer_value(v);
    return 0;
}

int op_param_int(const json_t *params, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                 int64_t *ret, op_error_t *err)
{
    const json_t *v = param_get(params, key);
    if (!v) {
        *ret = dflt;
        return 0;
    }
    return int_in_range(v, key, lo, hi, ret, err);
}

int op_param_pair(const json_t *params, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                  int64_t ret[2], op_error_t *err)
{
    const json_t *v = param_get(params, key);
    int64_t pair[2] = {dflt, dflt};
    if (v && json_is_array(v)) {
        if (json_array_size(v) != 2)
            return op_error(err, -EINVAL, param_field((char[64]){0}, key),
                            "params.%s must be an integer or [h, w]", key);
        for (int i = 0; i < 2; i++) {
            int r = int_in_range(json_array_get(v, i), key, lo, hi, &pair[i], err);
            if (r < 0) return r;
        }
    } else if (v) {
        int r = int_in_range(v, key, lo, hi, &pair[0], err);
        if (r < 0) return r;
        pair[1] = pair[0];
    }
    ret[0] = pair[0];
    ret[1] = pair[1];
    return 0;
}
