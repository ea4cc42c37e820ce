/* The durable store's retention (daemon/store/store.h): trimming past the size bound (outputs
 * of the oldest finished jobs first, then whole jobs, in bounded passes) and the expiry of
 * finished jobs with their files. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/store.h"
#include "support/run_suite.h"
#include "support/store_test.h"

/* A succeeded job finished at finished_us with one output of 4096 f32 in a file of its own. */
static void insert_succeeded(store_test_t *f, int64_t finished_us, char ret_id[ID_SIZE])
{
    store_test_insert_small(f, &store_test_op, "alice", now_us(), ret_id);
    ck_assert_int_eq(store_test_set_state(f, ret_id, JOB_RUNNING), 0);
    job_t *job = store_test_get_job(f, ret_id);
    job->state = JOB_SUCCEEDED;
    job->finished_us = finished_us;
    job->call.n_out = 1;
    job->call.out_names[0] = "out";
    store_test_tensor_set(&job->out[0], "out", 4096, (unsigned)finished_us);
    ck_assert_int_eq(store_job_update(f->st, job), 0);
    job_free(job);
}

static bool output_expired(store_test_t *f, const char *id)
{
    job_t *job = store_test_get_job(f, id);
    bool expired = store_blob_expired(job->out[0].blob);
    if (expired) {
        void *bytes = NULL;
        ck_assert_int_eq(store_blob_read(f->rd, job->out[0].blob, job->out[0].nbytes, &bytes),
                         -ENODATA);
        ck_assert_int_eq(job->out[0].nbytes, 4096 * 4);
    }
    job_free(job);
    return expired;
}

/* Trims to bound until the store says it is through, into *ret: the counts of every pass
 * summed, the bytes of the last. A pass stops after STORE_TRIM_PASS_US of work, which a loaded
 * machine can reach before it has done what one pass does on an idle one; what the trim does
 * in all, and in which order, is the same. */
static void trim_through(store_test_t *f, uint64_t bound, store_trim_stats_t *ret)
{
    store_trim_stats_t sum = {0}, t;
    int passes = 0;
    do {
        ck_assert_int_eq(store_trim(f->st, bound, STORE_TRIM_PASS_JOBS, &t), 0);
        sum.expired_bytes += t.expired_bytes;
        sum.expired_jobs += t.expired_jobs;
        sum.deleted_jobs += t.deleted_jobs;
        ck_assert_int_lt(++passes, 1000);
    } while (t.more);
    sum.bytes = t.bytes;
    *ret = sum;
}

/* Past its bound the store expires the outputs of the oldest finished jobs first (in finish
 * order, not insertion order), only as many as it must; then deletes the oldest finished jobs
 * whole; never a running job. */
START_TEST(test_trim_expires_oldest_outputs_first_then_deletes_oldest_jobs)
{
    store_test_t f;
    store_test_setup(&f);
    char a[ID_SIZE], b[ID_SIZE], c[ID_SIZE], running[ID_SIZE];
    insert_succeeded(&f, 3000, c); /* inserted first, finished last */
    insert_succeeded(&f, 1000, a);
    insert_succeeded(&f, 2000, b);
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), running);
    ck_assert_int_eq(store_test_set_state(&f, running, JOB_RUNNING), 0);
    uint64_t before = 0;
    ck_assert_int_eq(store_bytes(f.st, &before), 0);
    ck_assert_uint_ge(before, 3 * 4096 * 4);

    store_trim_stats_t t;
    trim_through(&f, 0, &t); /* no bound: nothing goes */
    ck_assert_int_eq(t.expired_jobs + t.deleted_jobs, 0);
    trim_through(&f, before, &t); /* at the bound: nothing goes */
    ck_assert_int_eq(t.expired_jobs + t.deleted_jobs, 0);

    /* Just past this bound, the store trims to 15/16 of it: less than one output's worth
     * under what it holds, as long as it holds less than 16 outputs' worth. */
    ck_assert_uint_lt(before, 16 * 4096 * 4);
    uint64_t bound = before - 1;
    trim_through(&f, bound, &t);
    ck_assert_int_eq(t.expired_jobs, 1);
    ck_assert_int_eq(t.deleted_jobs, 0);
    ck_assert_uint_eq(t.expired_bytes, 4096 * 4);
    ck_assert(output_expired(&f, a));
    ck_assert(!output_expired(&f, b));
    ck_assert(!output_expired(&f, c));
    ck_assert_uint_lt(t.bytes, before);

    /* A bound nothing finished can meet: every output, then every finished job, goes. */
    trim_through(&f, 1, &t);
    ck_assert_int_eq(t.expired_jobs, 2);
    ck_assert_int_eq(t.deleted_jobs, 3);
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(f.rd, a, &job), -ENOENT);
    ck_assert_int_eq(store_job_get(f.rd, c, &job), -ENOENT);
    job = store_test_get_job(&f, running);
    ck_assert_int_eq(job->state, JOB_RUNNING);
    job_free(job);
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);
    store_test_teardown(&f);
}
END_TEST

/* A backlog larger than a pass is trimmed across several passes, each going through no more
 * jobs than its budget, each but the last saying there is more, the oldest outputs first. */
START_TEST(test_trim_of_a_large_backlog_goes_in_bounded_passes)
{
    store_test_t f;
    store_test_setup(&f);
    enum { JOBS = 100, PASS = 16 };
    char ids[JOBS][ID_SIZE];
    for (int i = 0; i < JOBS; i++)
        insert_succeeded(&f, 1000 + i, ids[i]);
    store_trim_stats_t t;
    int passes = 0;
    int64_t expired = 0, deleted = 0;
    do {
        ck_assert_int_eq(store_trim(f.st, 1, PASS, &t), 0);
        ck_assert_int_le(t.expired_jobs + t.deleted_jobs, PASS);
        ck_assert_int_gt(t.expired_jobs + t.deleted_jobs, 0);
        if (passes == 0) ck_assert(output_expired(&f, ids[0]) && !output_expired(&f, ids[PASS]));
        expired += t.expired_jobs;
        deleted += t.deleted_jobs;
        passes++;
        ck_assert_int_lt(passes, 100);
    } while (t.more);
    /* Every output, then every job: 2 * JOBS jobs gone through, PASS a pass. */
    ck_assert_int_eq(expired, JOBS);
    ck_assert_int_eq(deleted, JOBS);
    ck_assert_int_ge(passes, 2 * JOBS / PASS);
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);
    ck_assert_int_eq(store_trim(f.st, 1, PASS, &t), 0);
    ck_assert(!t.more);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_gc_removes_expired_finished_jobs_and_their_files_but_not_others)
{
    store_test_t f;
    store_test_setup(&f);
    char old_done[ID_SIZE], old_failed[ID_SIZE], recent_done[ID_SIZE], queued[ID_SIZE],
        running[ID_SIZE];
    /* An old succeeded job with a file input and a file output. */
    job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
    job->call.has_in[1] = true;
    store_test_tensor_set(&job->in[1], "y", 4096, 1);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    memcpy(old_done, job->id, ID_SIZE);
    char *in_file = strdup(job->in[1].blob);
    job_free(job);
    ck_assert_int_eq(store_test_set_state(&f, old_done, JOB_RUNNING), 0);
    job = store_test_get_job(&f, old_done);
    job->state = JOB_SUCCEEDED;
    job->finished_us = 1000;
    job->call.n_out = 1;
    job->call.out_names[0] = "out";
    store_test_tensor_set(&job->out[0], "out", 4096, 2);
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);
    job = store_test_get_job(&f, old_done);
    char *out_file = strdup(job->out[0].blob);
    job_free(job);
    ck_assert(store_test_blob_file_exists(&f, in_file));
    ck_assert(store_test_blob_file_exists(&f, out_file));

    store_test_insert_small(&f, &store_test_op, "alice", now_us(), old_failed);
    job = store_test_get_job(&f, old_failed);
    job->state = JOB_FAILED;
    job->finished_us = 2000;
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), recent_done);
    ck_assert_int_eq(store_test_set_state(&f, recent_done, JOB_CANCELLED), 0); /* finished now */
    store_test_insert_small(&f, &store_test_op, "alice", 10, queued);
    store_test_insert_small(&f, &store_test_op, "alice", 10, running);
    ck_assert_int_eq(store_test_set_state(&f, running, JOB_RUNNING), 0);

    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, now_us() - 60 * 1000000LL, &deleted), 0);
    ck_assert_int_eq(deleted, 2);
    job_t *none = NULL;
    ck_assert_int_eq(store_job_get(f.rd, old_done, &none), -ENOENT);
    ck_assert_int_eq(store_job_get(f.rd, old_failed, &none), -ENOENT);
    ck_assert(!store_test_blob_file_exists(&f, in_file));
    ck_assert(!store_test_blob_file_exists(&f, out_file));
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);
    job_free(store_test_get_job(&f, recent_done));
    job_free(store_test_get_job(&f, queued));
    job_free(store_test_get_job(&f, running));

    /* Inside a transaction the files go only when it commits. */
    job = store_test_make_job(&store_test_op, "alice", now_us());
    job->call.has_in[1] = true;
    store_test_tensor_set(&job->in[1], "y", 4096, 9);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    job->state = JOB_CANCELLED;
    job->finished_us = 1000;
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_gc(f.st, 5000, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(store_test_blob_file_exists(&f, job->in[1].blob));
    ck_assert_int_eq(store_commit(f.st), 0);
    ck_assert(!store_test_blob_file_exists(&f, job->in[1].blob));
    job_free(job);
    free(in_file);
    free(out_file);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_gc_deletes_more_expired_jobs_than_one_batch_holds)
{
    store_test_t f;
    store_test_setup(&f);
    enum { N = 600 }; /* more than the store's internal batch of 256 */
    ck_assert_int_eq(store_begin(f.st), 0);
    for (int i = 0; i < N; i++) {
        job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
        ck_assert_int_eq(store_job_insert(f.st, job), 0);
        job->state = JOB_CANCELLED;
        job->finished_us = 1000 + i;
        ck_assert_int_eq(store_job_update(f.st, job), 0);
        job_free(job);
    }
    ck_assert_int_eq(store_commit(f.st), 0);
    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, 1000 + N - 1, &deleted), 0); /* all but the newest */
    ck_assert_int_eq(deleted, N - 1);
    store_list_query_t q = {.state = -1, .limit = 10};
    job_t **jobs;
    size_t n;
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(jobs[0]->finished_us, 1000 + N - 1);
    job_free(jobs[0]);
    free(jobs);
    store_test_teardown(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_retention");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gc_removes_expired_finished_jobs_and_their_files_but_not_others);
    tcase_add_test(tc, test_trim_expires_oldest_outputs_first_then_deletes_oldest_jobs);
    tcase_add_test(tc, test_trim_of_a_large_backlog_goes_in_bounded_passes);
    tcase_add_test(tc, test_gc_deletes_more_expired_jobs_than_one_batch_holds);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
