/* What the end-to-end suites of jobs (tests/e2e/test_e2e_jobs.c, test_e2e_ops.c,
 * test_e2e_tensors.c) share beside the harness (daemon_harness.h): job bodies with inline
 * tensors, an output's values read back, the ops the daemon lists, and the daemon's blob files.
 *
 * Every helper asserts with Check, so it may be called only from inside a START_TEST body. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "support/daemon_harness.h"

/* Whether the daemon's dtype is a floating-point one (f16, f32, f64, bf16). */
bool e2e_jobs_is_float_dtype(const char *dtype);

/* {"dtype", "shape", "data": [...]} with n values (integers for integer dtypes). */
json_t *e2e_jobs_tensor_inline(const char *dtype, const int64_t *shape, int ndim, const double *v,
                               long n);

/* A saxpy job (out = a * x + y) on f32 x and y of the given shape, n values each, inline. */
json_t *e2e_jobs_saxpy(double a, const int64_t *shape, int ndim, const double *x, const double *y,
                       long n);

/* n random values representable in dtype (f32 values rounded to float). */
void e2e_jobs_random_values(const char *dtype, double *v, long n, double lo, double hi,
                            uint32_t *seed);

/* The out tensor of a finished job: asserts succeeded, dtype and element count, and returns
 * the values flattened into out (cap values). */
void e2e_jobs_output(const json_t *job, const char *name, const char *dtype, long n, double *out);

/* Whether GET /v1/info lists the op called name (this build may lack a kernel family). */
bool e2e_jobs_info_has_op(e2e_daemon_t *d, const char *name);

/* Files under the daemon's blobs/ directory; e2e_jobs_blob_bytes is set to their total size. */
int e2e_jobs_count_blob_files(e2e_daemon_t *d);
extern off_t e2e_jobs_blob_bytes;
