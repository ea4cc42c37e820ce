/* libgpujob's waits against the real daemon: a job submitted and waited for in one request
 * (gpujob_submit_wait), a wait that runs out, a queued job cancelled, and progress callbacks
 * that stop a wait.
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

int main(void)
{
    Suite *s = suite_create("client_waited");
    TCase *tc = tcase_create("library");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_submit_wait_returns_the_job_once_it_ended);
    tcase_add_test(tc, test_cancel_queued_job_and_wait_timeout);
    suite_add_tcase(s, tc);
    return client_test_main(s);
}
