/* libgpujob's results against the real daemon: a job's outputs read inline (as JSON numbers
 * for every dtype, or from the answer's binary section), downloaded raw, into a caller's
 * buffer and as .npy, over TCP and over the Unix socket, all compared with what the test
 * computed or downloaded another way; and buffers uploaded, used by jobs, kept from an output
 * and deleted.
 *
 * One daemon serves the suite (support/client_test.h). */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/client_test.h"

/* ---- Outputs ----------------------------------------------------------------------------- */

static void check_saxpy_over(const char *address)
{
    gpujob_client_t *c = client_test_at(address);
    const int64_t n = 1000;
    const double a = 1.75;
    float *x = client_test_random_floats((size_t)n, 7, -10, 10),
          *y = client_test_random_floats((size_t)n, 8, -10, 10);
    gpujob_spec_t *spec = client_test_saxpy(a, x, y, n);
    gpujob_job_t *job = client_test_submit_ok(c, spec);
    ck_assert_str_eq(gpujob_job_op(job), "saxpy");
    ck_assert(gpujob_job_state(job) == GPUJOB_QUEUED || gpujob_job_state(job) == GPUJOB_RUNNING ||
              gpujob_job_state(job) == GPUJOB_SUCCEEDED);
    ck_assert_ptr_nonnull(gpujob_job_created_at(job));
    gpujob_job_t *done = client_test_wait_ok(c, gpujob_job_id(job));
    ck_assert_str_eq(gpujob_job_id(done), gpujob_job_id(job));
    ck_assert_int_eq(gpujob_job_state(done), GPUJOB_SUCCEEDED);
    ck_assert_ptr_null(gpujob_job_error_code(done));
    ck_assert_ptr_nonnull(gpujob_job_finished_at(done));
    ck_assert(gpujob_job_run_ms(done) >= 0 && gpujob_job_queue_ms(done) >= 0);
    ck_assert_int_ge(gpujob_job_attempts(done), 1);
    ck_assert_uint_eq(gpujob_job_output_count(done), 1);
    ck_assert_str_eq(gpujob_job_output_name(done, 0), "out");

    /* Inline (4000 bytes is under the inline limit): the values a*x+y. */
    gpujob_tensor_t inl, raw;
    ck_assert_int_eq(gpujob_job_output(done, "out", &inl), 0);
    ck_assert_int_eq(gpujob_job_output(done, "nope", &raw), -ENOENT);
    ck_assert_int_eq(inl.dtype, GPUJOB_F32);
    ck_assert_int_eq(inl.ndim, 1);
    ck_assert_int_eq(inl.shape[0], n);
    ck_assert_ptr_nonnull(inl.data);
    for (int64_t i = 0; i < n; i++) {
        float want = (float)a * x[i] + y[i], got = ((float *)inl.data)[i];
        ck_assert_msg(fabsf(got - want) <= 1e-5f * (fabsf(want) + 1), "out[%ld] %g, want %g",
                      (long)i, got, want);
    }
    /* Raw download, a caller buffer, and a .npy file all carry the same bytes. */
    ck_assert_int_eq(gpujob_output_tensor(c, gpujob_job_id(done), "out", &raw), 0);
    ck_assert_int_eq(raw.dtype, GPUJOB_F32);
    ck_assert_int_eq(raw.shape[0], n);
    ck_assert_uint_eq(raw.nbytes, inl.nbytes);
    ck_assert_mem_eq(raw.data, inl.data, inl.nbytes);
    size_t len = 0;
    char *buf = malloc(inl.nbytes + 16);
    ck_assert_int_eq(gpujob_output_read(c, gpujob_job_id(done), "out", GPUJOB_FORMAT_RAW, buf,
                                        inl.nbytes + 16, &len),
                     0);
    ck_assert_uint_eq(len, inl.nbytes);
    ck_assert_mem_eq(buf, inl.data, inl.nbytes);
    len = 12345;
    ck_assert_int_eq(gpujob_output_read(c, gpujob_job_id(done), "out", GPUJOB_FORMAT_RAW, buf,
                                        inl.nbytes - 1, &len),
                     -ENOBUFS);
    ck_assert_uint_eq(len, 12345);
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), "buffer"));
    free(buf);
    void *npy = NULL;
    ck_assert_int_eq(
        gpujob_output_fetch(c, gpujob_job_id(done), "out", GPUJOB_FORMAT_NPY, &npy, &len), 0);
    gpujob_tensor_t from_npy;
    char err[256];
    ck_assert_int_eq(gpujob_npy_parse(npy, len, &from_npy, err, sizeof err), 0);
    ck_assert_mem_eq(from_npy.data, inl.data, inl.nbytes);
    gpujob_free(npy);
    gpujob_tensor_clear(&from_npy);
    gpujob_tensor_clear(&raw);
    gpujob_tensor_clear(&inl);

    /* The job as GET reports it is the job wait returned. */
    gpujob_job_t *again = NULL;
    ck_assert_int_eq(gpujob_get(c, gpujob_job_id(done), &again), 0);
    ck_assert_int_eq(gpujob_job_state(again), GPUJOB_SUCCEEDED);
    ck_assert_str_eq(gpujob_job_finished_at(again), gpujob_job_finished_at(done));
    gpujob_job_free(again);
    gpujob_job_free(done);
    gpujob_job_free(job);
    gpujob_spec_free(spec);
    free(x);
    free(y);
    gpujob_client_free(c);
}

START_TEST(test_saxpy_round_trip_over_tcp)
{
    check_saxpy_over(e2e_daemon_url(client_test_daemon));
}
END_TEST

START_TEST(test_saxpy_round_trip_over_unix_socket)
{
    check_saxpy_over(client_test_socket_url);
}
END_TEST

/* Inline outputs, as JSON numbers decoded by the client per dtype (f16 and bf16 through its
 * own conversions) or as bytes in the answer's binary section: either way they must equal the
 * raw bytes the daemon sends for the same output. */
START_TEST(test_inline_outputs_decode_to_the_raw_bytes_for_every_dtype)
{
    static const gpujob_dtype_t dts[] = {GPUJOB_F32, GPUJOB_F16, GPUJOB_BF16, GPUJOB_F64,
                                         GPUJOB_I32};
    gpujob_client_t *c = client_test_tcp();
    uint32_t seed = 99;
    const size_t n_dts = sizeof dts / sizeof dts[0];
    for (size_t k = 0; k < 2 * n_dts; k++) {
        bool binary = k >= n_dts;
        gpujob_client_set_binary_outputs(c, binary);
        int64_t shape[2] = {7, 9};
        gpujob_tensor_t tx, ty;
        gpujob_tensor_init(&tx, dts[k % n_dts], 2, shape, NULL);
        gpujob_tensor_init(&ty, dts[k % n_dts], 2, shape, NULL);
        tx.data = malloc(tx.nbytes);
        ty.data = malloc(ty.nbytes);
        for (int64_t i = 0; i < 63; i++) {
            double u = e2e_rand_uniform(&seed, -100, 100), v = e2e_rand_uniform(&seed, -3, 3);
            switch (dts[k % n_dts]) {
            case GPUJOB_F32:
                ((float *)tx.data)[i] = (float)u, ((float *)ty.data)[i] = (float)v;
                break;
            case GPUJOB_F64:
                ((double *)tx.data)[i] = u, ((double *)ty.data)[i] = v;
                break;
            case GPUJOB_I32:
                ((int32_t *)tx.data)[i] = (int32_t)u, ((int32_t *)ty.data)[i] = (int32_t)v;
                break;
            default:
                /* Random finite 16-bit floats: any exponent but the all-ones one. */
                ((uint16_t *)tx.data)[i] =
                    (uint16_t)(e2e_rand(&seed) & (dts[k % n_dts] == GPUJOB_F16 ? 0xbbff : 0xbf7f));
                ((uint16_t *)ty.data)[i] =
                    (uint16_t)(e2e_rand(&seed) & (dts[k % n_dts] == GPUJOB_F16 ? 0xbbff : 0xbf7f));
            }
        }
        gpujob_spec_t *spec = NULL;
        ck_assert_int_eq(gpujob_spec_new("add", &spec), 0);
        ck_assert_int_eq(gpujob_spec_input(spec, "x", &tx), 0);
        ck_assert_int_eq(gpujob_spec_input(spec, "y", &ty), 0);
        gpujob_job_t *job = client_test_submit_ok(c, spec),
                     *done = client_test_wait_ok(c, gpujob_job_id(job));
        ck_assert_msg(gpujob_job_state(done) == GPUJOB_SUCCEEDED, "%s: %s",
                      gpujob_dtype_name(dts[k % n_dts]), gpujob_job_json(done));
        /* The answer carried the output the way the client asked for it. */
        ck_assert_ptr_nonnull(
            strstr(gpujob_job_json(done), binary ? "\"binary_offset\":0" : "\"data\":["));
        gpujob_tensor_t inl, raw;
        ck_assert_int_eq(gpujob_job_output(done, "out", &inl), 0);
        ck_assert_int_eq(gpujob_output_tensor(c, gpujob_job_id(done), "out", &raw), 0);
        ck_assert_int_eq(inl.dtype, dts[k % n_dts]);
        ck_assert_int_eq(raw.dtype, dts[k % n_dts]);
        ck_assert_int_eq(raw.ndim, 2);
        ck_assert_int_eq(raw.shape[1], 9);
        ck_assert_ptr_nonnull(inl.data);
        ck_assert_msg(memcmp(inl.data, raw.data, raw.nbytes) == 0, "%s: inline != raw",
                      gpujob_dtype_name(dts[k % n_dts]));
        gpujob_tensor_clear(&inl);
        gpujob_tensor_clear(&raw);
        gpujob_job_free(done);
        gpujob_job_free(job);
        gpujob_spec_free(spec);
        free(tx.data);
        free(ty.data);
    }
    gpujob_client_free(c);
}
END_TEST

/* ---- Buffers ----------------------------------------------------------------------------- */

START_TEST(test_buffers_upload_describe_use_and_delete)
{
    gpujob_client_t *c = client_test_tcp();
    int64_t shape[2] = {4, 5};
    float *x = client_test_random_floats(20, 3, -4, 4),
          *y = client_test_random_floats(20, 4, -4, 4);
    gpujob_tensor_t tx, ty;
    gpujob_tensor_init(&tx, GPUJOB_F32, 2, shape, x);
    gpujob_tensor_init(&ty, GPUJOB_F32, 2, shape, y);

    /* From memory, raw. */
    gpujob_buffer_t bx, got;
    ck_assert_int_eq(gpujob_buffer_put(c, &tx, true, &bx), 0);
    ck_assert_str_ne(bx.id, "");
    ck_assert_int_eq(bx.dtype, GPUJOB_F32);
    ck_assert_int_eq(bx.ndim, 2);
    ck_assert_int_eq(bx.shape[0], 4);
    ck_assert_int_eq(bx.shape[1], 5);
    ck_assert_uint_eq(bx.bytes, 80);
    ck_assert(bx.resident);
    ck_assert_int_eq(gpujob_buffer_get(c, bx.id, &got), 0);
    ck_assert_str_eq(got.id, bx.id);
    ck_assert_uint_eq(got.bytes, 80);
    ck_assert(got.resident);

    /* From a .npy file in memory and on disk. */
    void *npy = NULL;
    size_t len = 0;
    ck_assert_int_eq(gpujob_npy_format(&ty, &npy, &len), 0);
    gpujob_buffer_t by, bfile;
    ck_assert_int_eq(gpujob_buffer_put_npy(c, npy, len, false, &by), 0);
    ck_assert(!by.resident);
    ck_assert_int_eq(by.shape[1], 5);
    char path[128];
    snprintf(path, sizeof path, "%s/y.npy", client_test_socket_dir);
    ck_assert_int_eq(gpujob_npy_save(path, &ty), 0);
    ck_assert_int_eq(gpujob_buffer_put_file(c, path, false, &bfile), 0);
    ck_assert_str_ne(bfile.id, by.id);
    ck_assert_uint_eq(bfile.bytes, 80);
    ck_assert_int_eq(gpujob_buffer_put_file(c, "/nonexistent/file.npy", false, &bfile), -ENOENT);
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), "/nonexistent/file.npy"));
    /* A file the daemon must refuse: header lies about the data. */
    ((char *)npy)[len - 1] = 0;
    ck_assert_int_eq(gpujob_buffer_put_npy(c, npy, len - 4, false, &bfile), -EINVAL);
    ck_assert_int_eq(gpujob_http_status(c), 400);
    free(npy);

    /* A job on the two buffers computes x + y. */
    gpujob_spec_t *spec = NULL;
    ck_assert_int_eq(gpujob_spec_new("add", &spec), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(spec, "x", bx.id), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(spec, "y", bfile.id), 0);
    gpujob_job_t *job = client_test_submit_ok(c, spec),
                 *done = client_test_wait_ok(c, gpujob_job_id(job));
    ck_assert_msg(gpujob_job_state(done) == GPUJOB_SUCCEEDED, "%s", gpujob_job_json(done));
    gpujob_tensor_t out;
    ck_assert_int_eq(gpujob_job_output(done, "out", &out), 0);
    for (int i = 0; i < 20; i++)
        ck_assert_float_eq(((float *)out.data)[i], x[i] + y[i]);
    gpujob_tensor_clear(&out);

    /* Its output kept as a buffer feeds the next job: (x + y) + y. */
    gpujob_buffer_t kept;
    ck_assert_int_eq(gpujob_buffer_keep(c, gpujob_job_id(done), "out", false, &kept), 0);
    ck_assert_int_eq(kept.dtype, GPUJOB_F32);
    ck_assert_int_eq(kept.ndim, 2);
    ck_assert_int_eq(kept.shape[0], 4);
    ck_assert_int_eq(kept.shape[1], 5);
    ck_assert_uint_eq(kept.bytes, 80);
    ck_assert(!kept.resident);
    gpujob_spec_t *next = NULL;
    ck_assert_int_eq(gpujob_spec_new("add", &next), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(next, "x", kept.id), 0);
    ck_assert_int_eq(gpujob_spec_input_buffer(next, "y", bfile.id), 0);
    gpujob_job_t *next_job = client_test_submit_ok(c, next),
                 *next_done = client_test_wait_ok(c, gpujob_job_id(next_job));
    ck_assert_int_eq(gpujob_job_output(next_done, "out", &out), 0);
    for (int i = 0; i < 20; i++)
        ck_assert_float_eq(((float *)out.data)[i], (x[i] + y[i]) + y[i]);
    gpujob_tensor_clear(&out);
    ck_assert_int_eq(gpujob_buffer_keep(c, gpujob_job_id(done), "nope", false, &got), -ENOENT);
    ck_assert_str_eq(gpujob_error_field(c), "query.output");
    ck_assert_int_eq(gpujob_buffer_keep(c, "", "out", false, &got), -EINVAL);
    ck_assert_int_eq(gpujob_buffer_delete(c, kept.id), 0);
    gpujob_job_free(next_job);
    gpujob_job_free(next_done);
    gpujob_spec_free(next);

    /* Delete, then it is gone for reads, deletes and jobs. */
    ck_assert_int_eq(gpujob_buffer_delete(c, bx.id), 0);
    ck_assert_int_eq(gpujob_buffer_get(c, bx.id, &got), -ENOENT);
    ck_assert_int_eq(gpujob_buffer_delete(c, bx.id), -ENOENT);
    gpujob_job_t *none = NULL;
    ck_assert_int_eq(gpujob_submit(c, spec, &none), -ENOENT);
    ck_assert_str_eq(gpujob_error_field(c), "inputs.x.buffer");
    ck_assert_int_eq(gpujob_buffer_delete(c, by.id), 0);
    ck_assert_int_eq(gpujob_buffer_delete(c, bfile.id), 0);
    ck_assert_int_eq(gpujob_buffer_get(c, "", &got), -EINVAL);

    gpujob_job_free(job);
    gpujob_job_free(done);
    gpujob_spec_free(spec);
    unlink(path);
    free(x);
    free(y);
    gpujob_client_free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_outputs");
    TCase *tc = tcase_create("library");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_saxpy_round_trip_over_tcp);
    tcase_add_test(tc, test_saxpy_round_trip_over_unix_socket);
    tcase_add_test(tc, test_inline_outputs_decode_to_the_raw_bytes_for_every_dtype);
    tcase_add_test(tc, test_buffers_upload_describe_use_and_delete);
    suite_add_tcase(s, tc);
    return client_test_main(s);
}
