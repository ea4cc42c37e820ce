/* libgpujob's waits against the real daemon: a job, or a list of jobs, submitted and waited
 * for in one request (gpujob_submit_wait, gpujob_submit_many_wait) with outputs inline as JSON
 * numbers or in the answer's one binary section, a wait that runs out, a bad job that refuses
 * its list, a queued job cancelled, and progress callbacks that stop a wait.
 *
 * One daemon serves the suite (support/client_test.h), with one CPU worker, so that a long job
 * holds the queue. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/client_test.h"

static int stop_after_two(const gpujob_job_t *job, double elapsed_s, void *userdata)
{
    ck_assert_int_eq(gpujob_job_state(job), GPUJOB_QUEUED);
    ck_assert(elapsed_s >= 0);
    return ++*(int *)userdata >= 2;
}

/* gpujob_submit_wait: a short job comes back ended, its output inline, from the one request;
 * a job longer than the wait comes back as it stands. */
START_TEST(test_submit_wait_returns_the_job_once_it_ended)
{
    gpujob_client_t *c = client_test_tcp();
    float x[3] = {1, 2, 3}, y[3] = {10, 20, 30};
    gpujob_spec_t *spec = client_test_saxpy(2, x, y, 3);
    gpujob_job_t *job = NULL;
    ck_assert_msg(gpujob_submit_wait(c, spec, 60, &job) == 0, "%s", gpujob_errmsg(c));
    ck_assert_int_eq(gpujob_job_state(job), GPUJOB_SUCCEEDED);
    gpujob_tensor_t out;
    ck_assert_int_eq(gpujob_job_output(job, "out", &out), 0);
    for (int i = 0; i < 3; i++)
        ck_assert(((float *)out.data)[i] == 2 * x[i] + y[i]);
    gpujob_tensor_clear(&out);
    gpujob_job_free(job);

    gpujob_buffer_t slow_buffers[2];
    gpujob_spec_t *slow = client_test_long_spec(c, 128, slow_buffers);
    ck_assert_msg(gpujob_submit_wait(c, slow, 0.05, &job) == 0, "%s", gpujob_errmsg(c));
    ck_assert(gpujob_job_state(job) == GPUJOB_QUEUED || gpujob_job_state(job) == GPUJOB_RUNNING);
    gpujob_job_t *done = client_test_wait_ok(c, gpujob_job_id(job));
    ck_assert_int_eq(gpujob_job_state(done), GPUJOB_SUCCEEDED);
    ck_assert_int_eq(gpujob_submit_wait(c, spec, NAN, &job), -EINVAL);

    gpujob_job_free(done);
    gpujob_job_free(job);
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[0].id), 0);
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[1].id), 0);
    gpujob_spec_free(slow);
    gpujob_spec_free(spec);
    gpujob_client_free(c);
}
END_TEST

START_TEST(test_cancel_queued_job_and_wait_timeout)
{
    gpujob_client_t *c = client_test_tcp();
    /* The CPU executor takes two batches per worker thread (one running, one waiting in its own
     * queue, reported as running): with three long jobs ahead, the fourth stays queued for at
     * least one long job's time after the first ends. */
    gpujob_buffer_t slow_buffers[2];
    gpujob_spec_t *slow = client_test_long_spec(c, 128, slow_buffers);
    gpujob_job_t *blockers[3] = {client_test_submit_ok(c, slow), client_test_submit_ok(c, slow),
                                 client_test_submit_ok(c, slow)};
    float x[2] = {1, 2};
    gpujob_spec_t *spec = client_test_saxpy(1, x, x, 2);
    gpujob_job_t *queued = client_test_submit_ok(c, spec);

    /* The one worker is busy: the wait gives up after its timeout, writing nothing. */
    gpujob_job_t *none = NULL;
    double t0 = e2e_now();
    ck_assert_int_eq(gpujob_wait(c, gpujob_job_id(queued), 0.3, &none), -ETIMEDOUT);
    double took = e2e_now() - t0;
    ck_assert_msg(took >= 0.29 && took < 5, "wait took %.2f s", took);
    ck_assert_ptr_null(none);
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), gpujob_job_id(queued)));

    /* Progress callbacks see the job while it waits, and can stop the wait. */
    int calls = 0;
    ck_assert_int_eq(
        gpujob_wait_progress(c, gpujob_job_id(queued), 30, 0.05, stop_after_two, &calls, &none),
        -ECANCELED);
    ck_assert_int_eq(calls, 2);

    gpujob_job_t *cancelled = NULL;
    ck_assert_int_eq(gpujob_cancel(c, gpujob_job_id(queued), &cancelled), 0);
    ck_assert_int_eq(gpujob_job_state(cancelled), GPUJOB_CANCELLED);
    gpujob_job_t *final = client_test_wait_ok(c, gpujob_job_id(queued));
    ck_assert_int_eq(gpujob_job_state(final), GPUJOB_CANCELLED);
    ck_assert_ptr_null(gpujob_job_started_at(final)); /* it never ran */
    ck_assert_int_eq(gpujob_cancel(c, gpujob_job_id(queued), NULL), -EBUSY);

    for (int i = 0; i < 3; i++) {
        gpujob_job_t *b_done = NULL;
        ck_assert_int_eq(gpujob_wait(c, gpujob_job_id(blockers[i]), 120, &b_done), 0);
        ck_assert_int_eq(gpujob_job_state(b_done), GPUJOB_SUCCEEDED);
        gpujob_job_free(b_done);
        gpujob_job_free(blockers[i]);
    }
    gpujob_job_free(final);
    gpujob_job_free(cancelled);
    gpujob_job_free(queued);
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[0].id), 0);
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[1].id), 0);
    gpujob_spec_free(spec);
    gpujob_spec_free(slow);
    gpujob_client_free(c);
}
END_TEST

/* ---- Waited lists ------------------------------------------------------------------------ */

enum { LIST_N = 5, LIST_LEN = 300 };

/* The inputs of job k of a waited list: x_k[i] = k * 1000 + i and y[i] = -i, with a = k + 1,
 * so that each job's output differs from every other's. */
typedef struct saxpy_list {
    float x[LIST_N][LIST_LEN], y[LIST_LEN];
    gpujob_spec_t *specs[LIST_N];
} saxpy_list_t;

static void saxpy_list_init(saxpy_list_t *l)
{
    for (int i = 0; i < LIST_LEN; i++) {
        l->y[i] = (float)-i;
        for (int k = 0; k < LIST_N; k++)
            l->x[k][i] = (float)(k * 1000 + i);
    }
    for (int k = 0; k < LIST_N; k++)
        l->specs[k] = client_test_saxpy(k + 1, l->x[k], l->y, LIST_LEN);
}

static void saxpy_list_clear(saxpy_list_t *l)
{
    for (int k = 0; k < LIST_N; k++)
        gpujob_spec_free(l->specs[k]);
}

/* A list waited for in one request comes back in order, every job succeeded with its own
 * output inline: as JSON numbers, and as bytes of the answer's one binary section, where each
 * job's binary_offset counts from the section's start. The jobs share the section: freeing some
 * leaves the others' outputs readable. */
START_TEST(test_submit_many_wait_returns_every_job_ended_with_its_outputs)
{
    gpujob_client_t *c = client_test_tcp();
    saxpy_list_t l;
    saxpy_list_init(&l);
    long before = client_test_count_jobs(c, NULL);
    for (int binary = 0; binary < 2; binary++) {
        gpujob_client_set_binary_outputs(c, binary);
        gpujob_job_t *jobs[LIST_N] = {NULL};
        /* A wait past any the daemon grants is cut to its bound, not refused. */
        double wait_s = binary ? 1e300 : 60;
        int r = gpujob_submit_many_wait(c, (const gpujob_spec_t *const *)l.specs, LIST_N, NULL,
                                        wait_s, jobs);
        ck_assert_msg(r == 0, "%s", gpujob_errmsg(c));
        ck_assert_int_eq(gpujob_http_status(c), 201);
        for (int k = 0; k < LIST_N; k++) {
            ck_assert_msg(
                strstr(gpujob_job_json(jobs[k]), binary ? "\"binary_offset\":" : "\"data\":["),
                "%s", gpujob_job_json(jobs[k]));
            ck_assert(k == 0 || strcmp(gpujob_job_id(jobs[k]), gpujob_job_id(jobs[k - 1])) != 0);
        }
        /* The first and the middle job go first: the rest still read the shared section. */
        client_test_assert_saxpy_out(jobs[0], 1, l.x[0], l.y, LIST_LEN);
        client_test_assert_saxpy_out(jobs[LIST_N / 2], LIST_N / 2 + 1, l.x[LIST_N / 2], l.y,
                                     LIST_LEN);
        gpujob_job_free(jobs[0]);
        gpujob_job_free(jobs[LIST_N / 2]);
        jobs[0] = jobs[LIST_N / 2] = NULL;
        for (int k = LIST_N - 1; k > 0; k--) {
            if (jobs[k]) client_test_assert_saxpy_out(jobs[k], k + 1, l.x[k], l.y, LIST_LEN);
            gpujob_job_free(jobs[k]);
        }
    }
    ck_assert_int_eq(client_test_count_jobs(c, NULL), before + 2 * LIST_N);
    saxpy_list_clear(&l);
    gpujob_client_free(c);
}
END_TEST

/* A list with a job longer than the wait comes back as it stands, without error (201): the
 * long job and the one queued behind it on the one worker not final, no outputs yet. Both end
 * afterwards, the second with its output. */
START_TEST(test_submit_many_wait_that_runs_out_returns_the_jobs_not_final)
{
    gpujob_client_t *c = client_test_tcp();
    gpujob_buffer_t slow_buffers[2];
    float x[3] = {1, 2, 3}, y[3] = {10, 20, 30};
    const gpujob_spec_t *specs[2] = {client_test_long_spec(c, 128, slow_buffers),
                                     client_test_saxpy(2, x, y, 3)};
    gpujob_job_t *jobs[2] = {NULL};
    ck_assert_msg(gpujob_submit_many_wait(c, specs, 2, NULL, 0.05, jobs) == 0, "%s",
                  gpujob_errmsg(c));
    ck_assert_int_eq(gpujob_http_status(c), 201);
    gpujob_tensor_t out;
    for (int k = 0; k < 2; k++) {
        ck_assert_msg(!gpujob_state_is_final(gpujob_job_state(jobs[k])), "job %d: %s", k,
                      gpujob_job_json(jobs[k]));
        ck_assert_int_eq(gpujob_job_output(jobs[k], "out", &out), -ENOENT);
    }
    gpujob_job_t *done = client_test_wait_ok(c, gpujob_job_id(jobs[1]));
    client_test_assert_saxpy_out(done, 2, x, y, 3);
    gpujob_job_free(done);
    done = client_test_wait_ok(c, gpujob_job_id(jobs[0]));
    ck_assert_int_eq(gpujob_job_state(done), GPUJOB_SUCCEEDED);
    gpujob_job_free(done);
    ck_assert_int_eq(gpujob_submit_many_wait(c, specs, 2, NULL, NAN, jobs), -EINVAL);
    for (int k = 0; k < 2; k++) {
        gpujob_job_free(jobs[k]);
        gpujob_spec_free((gpujob_spec_t *)specs[k]);
    }
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[0].id), 0);
    ck_assert_int_eq(gpujob_buffer_delete(c, slow_buffers[1].id), 0);
    gpujob_client_free(c);
}
END_TEST

/* One bad job (an input saxpy does not have) refuses the whole waited list, naming it; no job
 * is created and ret_jobs is left alone. */
START_TEST(test_submit_many_wait_refuses_a_list_with_a_bad_job)
{
    gpujob_client_t *c = client_test_tcp();
    saxpy_list_t l;
    saxpy_list_init(&l);
    gpujob_tensor_t extra;
    int64_t n = 3;
    gpujob_tensor_init(&extra, GPUJOB_F32, 1, &n, l.y);
    ck_assert_int_eq(gpujob_spec_input(l.specs[3], "bogus", &extra), 0);
    long before = client_test_count_jobs(c, NULL);
    gpujob_job_t *none[LIST_N] = {NULL};
    ck_assert_int_eq(
        gpujob_submit_many_wait(c, (const gpujob_spec_t *const *)l.specs, LIST_N, NULL, 30, none),
        -EINVAL);
    for (int k = 0; k < LIST_N; k++)
        ck_assert_ptr_null(none[k]);
    ck_assert_int_eq(gpujob_http_status(c), 400);
    ck_assert_str_eq(gpujob_error_code(c), "invalid_argument");
    ck_assert_str_eq(gpujob_error_field(c), "[3].inputs.bogus");
    ck_assert_ptr_nonnull(strstr(gpujob_errmsg(c), "[3].inputs.bogus"));
    ck_assert_int_eq(client_test_count_jobs(c, NULL), before);
    saxpy_list_clear(&l);
    gpujob_client_free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("client_waited");
    TCase *tc = tcase_create("library");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_submit_wait_returns_the_job_once_it_ended);
    tcase_add_test(tc, test_cancel_queued_job_and_wait_timeout);
    tcase_add_test(tc, test_submit_many_wait_returns_every_job_ended_with_its_outputs);
    tcase_add_test(tc, test_submit_many_wait_that_runs_out_returns_the_jobs_not_final);
    tcase_add_test(tc, test_submit_many_wait_refuses_a_list_with_a_bad_job);
    suite_add_tcase(s, tc);
    return client_test_main(s);
}
