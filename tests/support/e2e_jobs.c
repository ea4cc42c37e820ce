/* The end-to-end job suites' shared helpers (e2e_jobs.h). */
/* POSIX and XSI (nftw). */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700
#include <check.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/e2e_jobs.h"

bool e2e_jobs_is_float_dtype(const char *dtype)
{
    return dtype[0] == 'f' || dtype[0] == 'b';
}

json_t *e2e_jobs_tensor_inline(const char *dtype, const int64_t *shape, int ndim, const double *v,
                               long n)
{
    json_t *dims = json_array(), *data = json_array();
    for (int i = 0; i < ndim; i++)
        json_array_append_new(dims, json_integer(shape[i]));
    for (long i = 0; i < n; i++)
        json_array_append_new(data, e2e_jobs_is_float_dtype(dtype)
                                        ? json_real(v[i])
                                        : json_integer((json_int_t)v[i]));
    return json_pack("{s:s, s:o, s:o}", "dtype", dtype, "shape", dims, "data", data);
}

json_t *e2e_jobs_saxpy(double a, const int64_t *shape, int ndim, const double *x, const double *y,
                       long n)
{
    return json_pack("{s:s, s:{s:f}, s:{s:o, s:o}}", "op", "saxpy", "params", "a", a, "inputs", "x",
                     e2e_jobs_tensor_inline("f32", shape, ndim, x, n), "y",
                     e2e_jobs_tensor_inline("f32", shape, ndim, y, n));
}

void e2e_jobs_random_values(const char *dtype, double *v, long n, double lo, double hi,
                            uint32_t *seed)
{
    for (long i = 0; i < n; i++) {
        double x = e2e_rand_uniform(seed, lo, hi);
        v[i] = e2e_jobs_is_float_dtype(dtype) ? (double)(float)x : floor(x);
    }
}

void e2e_jobs_output(const json_t *job, const char *name, const char *dtype, long n, double *out)
{
    ck_assert_msg(strcmp(e2e_job_state(job), "succeeded") == 0, "job %s: %s (error %s)",
                  json_string_value(json_object_get(job, "id")), e2e_job_state(job),
                  json_dumps(json_object_get(job, "error"), JSON_COMPACT));
    json_t *t = json_object_get(json_object_get(job, "outputs"), name);
    ck_assert_msg(t != NULL, "no output %s", name);
    ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), dtype);
    long got = e2e_json_flatten(json_object_get(t, "data"), out, n);
    ck_assert_msg(got == n, "output %s has %ld values, expected %ld", name, got, n);
    /* An f32 is printed as the shortest text that reads back to it as an f32: read so. */
    if (strcmp(dtype, "f32") == 0)
        for (long i = 0; i < n; i++)
            out[i] = (float)out[i];
}

bool e2e_jobs_info_has_op(e2e_daemon_t *d, const char *name)
{
    json_t *info = e2e_json_ok(d, "GET", "/v1/info", NULL, 200);
    json_t *ops = json_object_get(info, "ops");
    bool found = json_object_get(ops, name) != NULL;
    size_t i;
    json_t *op;
    json_array_foreach(ops, i, op) if (json_is_string(json_object_get(op, "name")) &&
                                       strcmp(json_string_value(json_object_get(op, "name")),
                                              name) == 0) found = true;
    json_decref(info);
    return found;
}

static int blob_files;
off_t e2e_jobs_blob_bytes;

static int count_blob_file(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    blob_files += type == FTW_F;
    if (type == FTW_F) e2e_jobs_blob_bytes += sb->st_size;
    return 0;
}

int e2e_jobs_count_blob_files(e2e_daemon_t *d)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/state/blobs", e2e_daemon_dir(d));
    blob_files = 0;
    e2e_jobs_blob_bytes = 0;
    nftw(path, count_blob_file, 16, FTW_PHYS);
    return blob_files;
}
