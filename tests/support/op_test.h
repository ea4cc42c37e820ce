/* Helpers shared by the CPU test suites of the op catalog (tests/test_kernels_*.c): building
 * descriptors, validating a call with params given as JSON text, expecting a validation error
 * on a named field, and running a call on the CPU with its outputs poisoned first.
 *
 * Every helper asserts with Check, so it may be called only from inside a START_TEST body; a
 * failed assertion names the op, its params and its inputs. */
#pragma once

#include <check.h>
#include <stdint.h>

#include "kernels/op.h"

/* A descriptor of dtype dt whose shape is the listed dims (none: a scalar), the rest zero:
 * td(DTYPE_F32) is a scalar, td(DTYPE_F32, 2, 3) a [2, 3] matrix. A macro rather than a variadic
 * function so that each dim is converted to int64_t by the array initializer (va_arg would read
 * an int argument as int64_t, which is undefined) and so that ndim is the count of dims. The
 * leading 0 of OP_TEST_DIMS keeps the array non-empty for a scalar; td() skips it. */
#define OP_TEST_DIMS(...) ((const int64_t[]){0, __VA_ARGS__})
#define td(dt, ...)                                                                                \
    op_test_desc((dt), (int)(sizeof OP_TEST_DIMS(__VA_ARGS__) / sizeof(int64_t)) - 1,              \
                 OP_TEST_DIMS(__VA_ARGS__) + 1)

/* A descriptor of dtype dt with ndim dims read from shape (NULL allowed when ndim is 0). */
tensor_desc_t op_test_desc(dtype_t dt, int ndim, const int64_t *shape);

/* Validates a call of the op named op_name (which must be in the table) on inputs[0..n_inputs),
 * slots in the order of the op's input_names, NULL for an absent optional input; params_json is
 * the params as JSON text (which must parse) or NULL for none. Returns validate's result; call
 * and err are cleared first and then filled as op->validate() fills them, err on failure. */
int op_test_validate(const char *op_name, const char *params_json,
                     const tensor_desc_t *const inputs[], int n_inputs, op_call_t *call,
                     op_error_t *err);

/* op_test_validate() that must succeed; the failure message carries the error's field. */
void op_test_validate_ok(const char *op_name, const char *params_json,
                         const tensor_desc_t *const inputs[], int n_inputs, op_call_t *ret_call);

/* Asserts that validation fails with code (a negative errno) on the field named field, with a
 * message for the user. */
void op_test_expect_error(const char *op_name, const char *params_json,
                          const tensor_desc_t *const inputs[], int n_inputs, int code,
                          const char *field);

/* Runs a validated call on the CPU and asserts it succeeds. in[j] is the host data of input j
 * (NULL for an absent one); out[j] has room for call->out[j]. Each output is filled with 0xa5
 * bytes first, so an element run_cpu forgot to write shows as garbage. */
void op_test_run_call(const op_call_t *call, const void *const in[], void *const out[]);

/* op_test_validate_ok() then op_test_run_call(): validates and runs the op on the CPU. */
void op_test_run(const char *op_name, const char *params_json, const tensor_desc_t *const inputs[],
                 const void *const data[], int n_inputs, void *const out[]);

/* Runs every test of suite s (which it frees) and returns the exit status of the test program:
 * EXIT_SUCCESS when none failed. */
int op_test_run_suite(Suite *s);
