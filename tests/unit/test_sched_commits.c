/* The scheduler (daemon/sched/scheduler.h) against a real store and a fake executor that the test
 * drives by hand: what it commits and when: answers before or after the sync, jobs started in
 * their round stored running, failed commits and syncs taken back, waited jobs' rows, and the
 * queue kept in the store across a restart. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon/sched/sched_internal.h" /* QUEUED_IN_MEMORY */
#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"
#include "support/run_suite.h"
#include "support/sched_test.h"

START_TEST(test_queued_jobs_survive_a_stop_and_run_after_restart)
{
    sched_test_fake->slots = 0;
    job_t *jobs[5];
    for (int i = 0; i < 5; i++)
        jobs[i] = sched_test_add_job("alice", 10, 0);
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 5);
    sched_stop(sched_test_sched);
    sched_free(sched_test_sched);

    ck_assert_int_eq(sched_new(&sched_test_cfg, sched_test_store, &sched_test_sched), 0);
    sched_test_fake->n_got = sched_test_fake->n_done = 0;
    sched_test_fake->slots = 4;
    sched_set_executor(sched_test_sched, &sched_test_fake->base);
    ck_assert_int_eq(sched_start(sched_test_sched), 0);
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_int_ge(sched_test_fake->n_got, 1);
    int total = 0;
    for (int i = 0; i < sched_test_fake->n_got; i++)
        total += sched_test_fake->got[i]->n;
    ck_assert_int_eq(total, 5);
}
END_TEST

/* Past QUEUED_IN_MEMORY queued jobs the loop keeps only their entries and reads each job back
 * from the store when it is answered for, cancelled, failed by its deadline or started: each
 * of those works on a job kept in the store alone, and every job runs, in its queue's order,
 * whole (its op resolved, its inputs described). */
START_TEST(test_a_long_queue_keeps_its_jobs_in_the_store_until_they_start)
{
    enum { N = QUEUED_IN_MEMORY + 200 };
    sched_test_fake->slots = 0;
    sched_test_box_t box;
    sched_test_submit_many(&box, "alice", N, 10);
    job_t *late[3];
    sched_test_box_t late_box[3];
    for (int i = 0; i < 3; i++) {
        late[i] = sched_test_add_job("alice", 10, 0);
        if (i == 0) late[i]->deadline_us = now_us() + 50 * 1000;
        sched_test_submit(&late_box[i], &late[i], 1);
    }
    /* A deadline passes on a stowed job. */
    ck_assert_int_eq(sched_test_ended_state("alice", late_box[0].ids[0]), JOB_FAILED);
    /* A stowed job is cancelled. */
    sched_test_box_t c;
    sched_test_box_init(&c);
    sched_cancel(sched_test_sched, "alice", late_box[1].ids[0], sched_test_on_reply, &c);
    sched_test_box_wait(&c);
    ck_assert_int_eq(c.err, 0);
    ck_assert_int_eq(c.states[0], JOB_CANCELLED);
    ck_assert_str_eq(c.cancel, "dequeued");
    /* A stowed job is answered for as it stands, with why it waits. */
    sched_test_box_t w;
    sched_test_box_init(&w);
    sched_wait(sched_test_sched, "alice", late_box[2].ids[0], 0, sched_test_on_reply, &w);
    sched_test_box_wait(&w);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_eq(w.states[0], JOB_QUEUED);
    ck_assert_str_eq(w.reasons[0], "devices_busy");
    ck_assert_int_eq(w.positions[0], N);

    sched_test_fake->slots = 4096;
    job_t *wake = sched_test_add_job("alice", 10, 0);
    sched_test_box_t wake_box;
    sched_test_submit(&wake_box, &wake, 1);
    /* Batches are completed as they come: the user's running limit holds back the rest. */
    int seen = 0;
    for (int b = 0; seen < N + 2; b++) {
        fake_exec_wait_batches(sched_test_fake, b + 1);
        ck_assert_int_gt(sched_test_fake->n_got, b);
        const exec_batch_t *batch = sched_test_fake->got[b];
        for (int k = 0; k < batch->n; k++, seen++) {
            const job_t *job = batch->jobs[k];
            ck_assert_ptr_eq(job->call.op, op_find("add"));
            ck_assert_int_eq(job->in[0].desc.shape[0], 10);
            ck_assert(job->in[0].data || job->in[0].blob);
            ck_assert_str_ne(job->id, late_box[0].ids[0]);
            ck_assert_str_ne(job->id, late_box[1].ids[0]);
            if (seen < 64) ck_assert_str_eq(job->id, box.ids[seen]);
        }
        fake_exec_complete(sched_test_fake, b);
    }
    ck_assert_int_eq(seen, N + 2);
}
END_TEST

START_TEST(test_a_durable_submission_starts_running_before_it_is_answered)
{
    sched_test_fake->slots = 4;
    job_t *jobs[3] = {sched_test_add_job("alice", 10, 0), sched_test_add_job("alice", 10, 0),
                      sched_test_add_job("bob", 10, 0)};
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 3);
    /* The commit's sync runs on its own thread; the jobs went out before it was done. Without
     * sync_full the answer comes first, and the dispatch after it. */
    ck_assert_int_ge(box.batches_started, 1);
    ck_assert_int_eq(box.n, 3);
    for (size_t i = 0; i < box.n; i++) {
        ck_assert_int_eq(box.states[i], JOB_QUEUED); /* as accepted, whatever came since */
        ck_assert_int_eq(sched_test_stored_state(box.ids[i]), JOB_RUNNING);
    }
}
END_TEST

START_TEST(test_a_failed_sync_fails_its_answer_and_refuses_what_follows)
{
    sched_test_fake->slots = 4;
    /* SQLite goes on with its open descriptor; the syncer cannot reach the file any more. */
    char wal[PATH_MAX];
    snprintf(wal, sizeof wal, "%s/gpujobd.db-wal", sched_test_dir);
    ck_assert_int_eq(unlink(wal), 0);
    job_t *job = sched_test_add_job("alice", 10, 0);
    sched_test_box_t first;
    sched_test_submit_any(&first, &job, 1);
    ck_assert_int_eq(first.err, -EIO);
    ck_assert_int_eq(sched_test_fake->n_got, 1); /* committed: it runs all the same */

    job = sched_test_add_job("alice", 10, 0);
    sched_test_box_t second;
    sched_test_submit_any(&second, &job, 1);
    ck_assert_int_eq(second.err, -EIO);
    ck_assert_int_eq(sched_test_fake->n_got, 1); /* refused before its commit */
    sched_stats_t stats;
    sched_get_stats(sched_test_sched, &stats);
    ck_assert(stats.store_failed);
}
END_TEST

START_TEST(test_without_sync_full_a_submission_starts_before_its_commit_is_answered)
{
    sched_test_fake->slots = 4;
    job_t *job = sched_test_add_job("alice", 10, 0);
    sched_test_box_t box;
    sched_test_submit(&box, &job, 1);
    /* The job went out inside the commit's transaction, its start recorded with it. */
    ck_assert_int_eq(box.batches_started, 1);
    ck_assert_int_eq(box.states[0], JOB_QUEUED);
    ck_assert_int_eq(sched_test_stored_state(box.ids[0]), JOB_RUNNING);
}
END_TEST

/* Jobs without a key are inserted after the cut, already running; a keyed one is inserted
 * before it (its key may name a stored job) and its start recorded after. Either way the row
 * says running once, with the start's attempt; a replay of the key goes nowhere. */
START_TEST(test_keyed_and_plain_jobs_started_in_their_round_are_stored_running)
{
    sched_test_fake->slots = 4;
    job_t *jobs[2] = {sched_test_add_job("alice", 10, 0), sched_test_add_job("alice", 10, 0)};
    strcpy(jobs[0]->idempotency_key, "key-1");
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 2);
    ck_assert_int_ge(box.batches_started, 1);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    for (int i = 0; i < 2; i++) {
        job_t *stored = NULL;
        ck_assert_int_eq(store_job_get(rd, box.ids[i], &stored), 0);
        ck_assert_int_eq(stored->state, JOB_RUNNING);
        ck_assert_int_eq(stored->attempts, 1);
        ck_assert_int_ge(stored->started_us, stored->created_us);
        ck_assert_int_ge(stored->batch_size, 1);
        job_free(stored);
    }
    store_reader_close(rd);

    pthread_mutex_lock(&sched_test_fake->lock);
    int went_out = sched_test_fake->n_got;
    pthread_mutex_unlock(&sched_test_fake->lock);
    job_t *again = sched_test_add_job("alice", 10, 0);
    strcpy(again->idempotency_key, "key-1");
    sched_test_box_t replay;
    sched_test_submit(&replay, &again, 1);
    ck_assert(replay.replayed);
    ck_assert_str_eq(replay.ids[0], box.ids[0]);
    pthread_mutex_lock(&sched_test_fake->lock);
    ck_assert_int_eq(sched_test_fake->n_got, went_out);
    pthread_mutex_unlock(&sched_test_fake->lock);
}
END_TEST

static size_t stored_jobs(void)
{
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    store_list_query_t q = {.state = -1, .limit = 1000};
    job_t **jobs = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_jobs_list(rd, &q, &jobs, &n), 0);
    for (size_t i = 0; i < n; i++)
        job_free(jobs[i]);
    free(jobs);
    store_reader_close(rd);
    return n;
}

START_TEST(test_a_failed_commit_takes_back_the_jobs_it_started)
{
    sched_test_fake->slots = 0;
    job_t *older = sched_test_lone_job("alice", 10);
    sched_test_box_t first;
    sched_test_submit(&first, &older, 1);

    /* The next commit cannot append to the WAL, after its jobs have gone out. */
    struct rlimit saved;
    off_t wal_size = sched_test_wal_limit("gpujobd.db-wal", &saved);
    sched_test_fake->slots = 2;
    /* Inputs past store.inline_blob_bytes go to files of their own (which the limit lets
     * through), and a job that went out reads them still. */
    enum { LARGE = 20000 };
    ck_assert_int_gt(wal_size, LARGE * 4);
    ck_assert_int_gt(LARGE * 4, sched_test_cfg.inline_blob_bytes);
    ck_assert_int_eq(sched_test_blob_files(), 0);
    job_t *jobs[2] = {sched_test_lone_job("alice", LARGE), sched_test_lone_job("bob", LARGE)};
    sched_test_box_t failed;
    sched_test_submit_any(&failed, jobs, 2);
    sched_test_wal_limit_lift(&saved);
    ck_assert_int_eq(failed.err, -EIO);

    /* Out went alice's older job and bob's new one; alice's new one left the queue. */
    ck_assert_int_eq(failed.batches_started, 2);
    ck_assert_str_eq(sched_test_fake->got[0]->jobs[0]->id, first.ids[0]);
    sched_stats_t stats;
    sched_get_stats(sched_test_sched, &stats);
    ck_assert_int_eq(stats.queued, 0);
    ck_assert_int_eq(stats.running, 2);
    ck_assert_int_eq(stats.submitted_total, 1);
    ck_assert_int_eq(sched_test_blob_files(), 2); /* bob's, until his launch returns */

    /* Both end: the older job as any other, bob's with its result thrown away. */
    fake_exec_complete(sched_test_fake, 0);
    fake_exec_complete(sched_test_fake, 1);
    ck_assert_int_eq(sched_test_ended_state("alice", first.ids[0]), JOB_SUCCEEDED);
    for (int i = 0; i < 100 && stats.running > 0; i++) {
        usleep(10 * 1000);
        sched_get_stats(sched_test_sched, &stats);
    }
    ck_assert_int_eq(stats.running, 0);
    ck_assert_int_eq(stats.succeeded_total, 1);
    ck_assert_int_eq(sched_test_stored_state(first.ids[0]), JOB_SUCCEEDED);
    ck_assert_uint_eq(stored_jobs(), 1);
    ck_assert_int_eq(sched_test_blob_files(), 0);

    /* Nothing of the failed submission is left to go out. */
    job_t *next = sched_test_lone_job("carol", 10);
    sched_test_box_t last;
    sched_test_submit(&last, &next, 1);
    fake_exec_wait_batches(sched_test_fake, 3);
    usleep(20 * 1000);
    ck_assert_int_eq(sched_test_fake->n_got, 3);
    ck_assert_str_eq(sched_test_fake->got[2]->jobs[0]->id, last.ids[0]);
}
END_TEST

/* Posts a waited submission of job (taken), answered in box (sched_test_box_wait) with
 * token box and reply, its answer inlining outputs up to inline_max bytes. */
static void submit_waited_post_inline(sched_test_box_t *box, job_t *job, int wait_ms,
                                      uint64_t inline_max, sched_reply_fn reply)
{
    job_t **arr = calloc(1, sizeof *arr);
    arr[0] = job;
    sched_test_box_init(box);
    sched_submit_waited(sched_test_sched, arr, 1, wait_ms, inline_max, reply, box);
}

/* Posts a waited submission of job (taken), answered in box, its outputs inlined as the
 * configuration says. */
static void submit_waited_post(sched_test_box_t *box, job_t *job, int wait_ms)
{
    submit_waited_post_inline(box, job, wait_ms, sched_test_cfg.max_inline_output_bytes,
                              sched_test_on_reply);
}

/* A wait of 0 ms on owner's job id: once answered, the loop has ended every wake before the
 * one that took it. The state the loop answered with. */
static job_state_t loop_round_trip(const char *owner, const char *id)
{
    return sched_test_waited_state(owner, id, 0);
}

/* A waited job goes out before its row is written, in the same wake of the loop: once that
 * wake is over, the store holds it, running, for whoever reads it while it runs. Its answer
 * carries its success, handed over while its end was being committed (with the gate that
 * holds it back until then); once that wake is over, the store says succeeded too, with the
 * output. */
START_TEST(test_a_waited_jobs_row_exists_while_it_runs_and_holds_its_end_after_the_answer)
{
    sched_test_fake->slots = 1;
    sched_test_box_t box;
    submit_waited_post(&box, sched_test_lone_job("alice", 10), 5000);
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_int_eq(sched_test_fake->n_got, 1);
    char id[ID_SIZE];
    snprintf(id, sizeof id, "%s", sched_test_fake->got[0]->jobs[0]->id);
    ck_assert_int_eq(loop_round_trip("alice", id), JOB_RUNNING);
    ck_assert_int_eq(sched_test_stored_state(id), JOB_RUNNING);
    pthread_mutex_lock(&box.lock);
    ck_assert(!box.done);
    pthread_mutex_unlock(&box.lock);

    fake_exec_complete(sched_test_fake, 0);
    sched_test_box_wait(&box);
    ck_assert_int_eq(box.err, 0);
    ck_assert_str_eq(box.ids[0], id);
    ck_assert_int_eq(box.states[0], JOB_SUCCEEDED);
    ck_assert(box.gated);
    ck_assert_int_eq(loop_round_trip("alice", id), JOB_SUCCEEDED);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(rd, id, &job), 0);
    ck_assert_int_eq(job->state, JOB_SUCCEEDED);
    ck_assert_uint_eq(job->out[0].nbytes, 10 * sizeof(float));
    void *bytes = NULL;
    ck_assert_int_eq(store_blob_read(rd, job->out[0].blob, job->out[0].nbytes, &bytes), 0);
    free(bytes);
    job_free(job);
    store_reader_close(rd);
    sched_stats_t stats;
    sched_get_stats(sched_test_sched, &stats);
    ck_assert_int_eq(stats.succeeded_total, 1); /* counted once, at its early answer */
}
END_TEST

/* An answer to a wait for one job, with the state the store held for that job when it came:
 * read through a reader of its own, -1 when it could not be read. */
typedef struct stored_at_answer {
    sched_test_box_t box;
    int stored;
} stored_at_answer_t;

static void on_reply_read_store(void *token, const sched_result_t *res)
{
    stored_at_answer_t *a = token;
    a->stored = -1;
    store_reader_t *rd;
    if (res->n_jobs == 1 && store_reader_open(sched_test_store, &rd) == 0) {
        job_t *job = NULL;
        if (store_job_get(rd, res->jobs[0]->id, &job) == 0) a->stored = (int)job->state;
        job_free(job);
        store_reader_close(rd);
    }
    sched_test_on_reply(&a->box, res);
}

/* A wait for a job (GET /v1/jobs/{id}/wait) beside a waited submission of the same job is
 * answered once the job's end is committed: the early answer, handed over while the end is
 * being committed, is the submission's alone (its reply holds the gate; a wait's does not).
 * Whoever the wait answers finds the end in the store. */
START_TEST(test_a_jobs_wait_beside_a_waited_submission_is_answered_once_its_end_is_stored)
{
    sched_test_fake->slots = 1;
    sched_test_box_t box;
    submit_waited_post(&box, sched_test_lone_job("alice", 10), 5000);
    fake_exec_wait_batches(sched_test_fake, 1);
    char id[ID_SIZE];
    snprintf(id, sizeof id, "%s", sched_test_fake->got[0]->jobs[0]->id);
    stored_at_answer_t waited;
    sched_test_box_init(&waited.box);
    sched_wait(sched_test_sched, "alice", id, 5000, on_reply_read_store, &waited);
    ck_assert_int_eq(loop_round_trip("alice", id), JOB_RUNNING); /* the wait is in */

    fake_exec_complete(sched_test_fake, 0);
    sched_test_box_wait(&box);
    ck_assert_int_eq(box.states[0], JOB_SUCCEEDED);
    ck_assert(box.gated);
    sched_test_box_wait(&waited.box);
    ck_assert_int_eq(waited.box.err, 0);
    ck_assert_int_eq(waited.box.states[0], JOB_SUCCEEDED);
    ck_assert_int_eq(waited.stored, JOB_SUCCEEDED);
    ck_assert(!waited.box.gated);
    sched_stats_t stats;
    sched_get_stats(sched_test_sched, &stats);
    ck_assert_int_eq(stats.succeeded_total, 1);
}
END_TEST

/* A waited job whose output its answer does not inline (past the limit its request gave,
 * whatever the configuration at start says: a reload may have changed it) is answered once its
 * end is committed, not while it is being committed: its client will not hold the result, and
 * whoever it asks for it finds the end in the store. */
START_TEST(test_a_waited_job_whose_output_its_answer_leaves_out_is_answered_after_its_commit)
{
    sched_test_fake->slots = 1;
    const uint64_t out_bytes = 10 * sizeof(float);
    ck_assert_uint_ge(sched_test_cfg.max_inline_output_bytes, out_bytes);
    stored_at_answer_t waited;
    submit_waited_post_inline(&waited.box, sched_test_lone_job("alice", 10), 5000, out_bytes - 1,
                              on_reply_read_store);
    fake_exec_wait_batches(sched_test_fake, 1);
    fake_exec_complete(sched_test_fake, 0);
    sched_test_box_wait(&waited.box);
    ck_assert_int_eq(waited.box.err, 0);
    ck_assert_int_eq(waited.box.states[0], JOB_SUCCEEDED);
    ck_assert(!waited.box.gated);
    ck_assert_int_eq(waited.stored, JOB_SUCCEEDED);

    /* With room for the output, the same job is answered early, through the gate. */
    sched_test_box_t box;
    submit_waited_post_inline(&box, sched_test_lone_job("alice", 10), 5000, out_bytes,
                              sched_test_on_reply);
    fake_exec_wait_batches(sched_test_fake, 2);
    fake_exec_complete(sched_test_fake, 1);
    sched_test_box_wait(&box);
    ck_assert_int_eq(box.states[0], JOB_SUCCEEDED);
    ck_assert(box.gated);
}
END_TEST

/* A waited job whose group commit fails after it went out is answered with the error, not
 * its result; its result is thrown away when its launch returns and it leaves no row. */
START_TEST(test_a_waited_job_whose_commit_fails_after_it_went_out_leaves_nothing)
{
    sched_test_fake->slots = 2;
    job_t *older = sched_test_lone_job("alice", 10);
    sched_test_box_t first;
    sched_test_submit(&first, &older, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    fake_exec_complete(sched_test_fake, 0);
    ck_assert_int_eq(sched_test_ended_state("alice", first.ids[0]), JOB_SUCCEEDED);

    struct rlimit saved;
    sched_test_wal_limit("gpujobd.db-wal", &saved);
    sched_test_box_t box;
    submit_waited_post(&box, sched_test_lone_job("bob", 10), 5000);
    sched_test_box_wait(&box);
    sched_test_wal_limit_lift(&saved);
    ck_assert_int_eq(box.err, -EIO);
    fake_exec_wait_batches(sched_test_fake, 2);
    ck_assert_int_eq(sched_test_fake->n_got, 2);
    fake_exec_complete(sched_test_fake, 1);
    sched_stats_t stats;
    sched_get_stats(sched_test_sched, &stats);
    for (int i = 0; i < 100 && stats.running > 0; i++) {
        usleep(10 * 1000);
        sched_get_stats(sched_test_sched, &stats);
    }
    ck_assert_int_eq(stats.running, 0);
    ck_assert_int_eq(stats.succeeded_total, 1);
    ck_assert_uint_eq(stored_jobs(), 1);
}
END_TEST

/* The job of box b ends succeeded, and its row says so, with the one start it had. */
static void assert_ended_once(const sched_test_box_t *b)
{
    ck_assert_int_eq(sched_test_ended_state("bob", b->ids[0]), JOB_SUCCEEDED);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, b->ids[0], &stored), 0);
    ck_assert_int_eq(stored->state, JOB_SUCCEEDED);
    ck_assert_int_eq(stored->attempts, 1);
    ck_assert_int_ge(stored->started_us, stored->created_us);
    job_free(stored);
    store_reader_close(rd);
}

/* A completion's ends and the starts it lets out are one transaction, and the new batch goes
 * out before its commit: when that commit fails, the job still runs, and its end records the
 * start that was lost. */
START_TEST(test_a_start_lost_with_a_completions_commit_is_recorded_at_its_end)
{
    sched_test_fake->slots = 1;
    job_t *first = sched_test_lone_job("alice", 10), *second = sched_test_lone_job("bob", 10);
    sched_test_box_t a, b;
    sched_test_submit(&a, &first, 1);
    sched_test_submit(&b, &second, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_int_eq(sched_test_stored_state(b.ids[0]), JOB_QUEUED);

    /* No commit can succeed until the limit is lifted. */
    struct rlimit saved;
    sched_test_wal_limit("gpujobd.db-wal", &saved);
    fake_exec_complete(sched_test_fake, 0);
    sched_test_ended_state("alice", a.ids[0]); /* answered once the completion has been handled */
    sched_test_wal_limit_lift(&saved);

    pthread_mutex_lock(&sched_test_fake->lock);
    ck_assert_int_eq(sched_test_fake->n_got, 2);
    ck_assert_str_eq(sched_test_fake->got[1]->jobs[0]->id, b.ids[0]);
    pthread_mutex_unlock(&sched_test_fake->lock);
    ck_assert_int_eq(sched_test_stored_state(b.ids[0]), JOB_QUEUED);
    fake_exec_complete(sched_test_fake, 1);
    assert_ended_once(&b);
}
END_TEST

/* When a completion's transaction fails before its cut (here its outputs cannot be written to
 * the segment), the jobs waiting for the freed slot go out in a transaction of their own, not
 * failed for want of a recorded start. */
START_TEST(test_queued_jobs_go_out_after_a_completion_whose_outputs_cannot_be_placed)
{
    sched_test_fake->slots = 1;
    /* 16 jobs of one batch with 64 KiB outputs each: 1 MiB, which the size limit below keeps
     * out of every file. */
    enum { N = 16, ELEMS = 16384 };
    job_t *jobs[N];
    for (int i = 0; i < N; i++)
        jobs[i] = sched_test_add_job("alice", ELEMS, 0);
    job_t *second = sched_test_lone_job("bob", 10);
    sched_test_box_t a, b;
    sched_test_submit(&a, jobs, N);
    sched_test_submit(&b, &second, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    pthread_mutex_lock(&sched_test_fake->lock);
    ck_assert_int_eq(sched_test_fake->got[0]->n, N);
    pthread_mutex_unlock(&sched_test_fake->lock);

    struct rlimit saved;
    ck_assert_int_lt(sched_test_wal_limit("gpujobd.db-wal", &saved), N * ELEMS * 4);
    fake_exec_complete(sched_test_fake, 0);
    sched_test_ended_state("alice", a.ids[0]); /* answered once the completion has been handled */
    fake_exec_wait_batches(sched_test_fake, 2);
    sched_test_wal_limit_lift(&saved);

    pthread_mutex_lock(&sched_test_fake->lock);
    ck_assert_int_eq(sched_test_fake->n_got, 2);
    ck_assert_str_eq(sched_test_fake->got[1]->jobs[0]->id, b.ids[0]);
    pthread_mutex_unlock(&sched_test_fake->lock);
    fake_exec_complete(sched_test_fake, 1);
    assert_ended_once(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sched_commits");
    TCase *tc = sched_test_tcase("sched", sched_test_start);
    tcase_add_test(tc, test_queued_jobs_survive_a_stop_and_run_after_restart);
    tcase_add_test(tc, test_a_long_queue_keeps_its_jobs_in_the_store_until_they_start);
    tcase_add_test(tc, test_without_sync_full_a_submission_starts_before_its_commit_is_answered);
    tcase_add_test(tc, test_keyed_and_plain_jobs_started_in_their_round_are_stored_running);
    tcase_add_test(tc, test_a_failed_commit_takes_back_the_jobs_it_started);
    tcase_add_test(tc,
                   test_a_jobs_wait_beside_a_waited_submission_is_answered_once_its_end_is_stored);
    tcase_add_test(tc, test_a_start_lost_with_a_completions_commit_is_recorded_at_its_end);
    tcase_add_test(
        tc, test_a_waited_job_whose_output_its_answer_leaves_out_is_answered_after_its_commit);
    tcase_add_test(tc, test_queued_jobs_go_out_after_a_completion_whose_outputs_cannot_be_placed);
    suite_add_tcase(s, tc);
    TCase *durable = sched_test_tcase("durable", sched_test_start_durable);
    tcase_add_test(durable, test_a_durable_submission_starts_running_before_it_is_answered);
    tcase_add_test(durable, test_a_failed_sync_fails_its_answer_and_refuses_what_follows);
    tcase_add_test(durable, test_queued_jobs_survive_a_stop_and_run_after_restart);
    tcase_add_test(durable,
                   test_a_waited_jobs_row_exists_while_it_runs_and_holds_its_end_after_the_answer);
    tcase_add_test(durable, test_a_waited_job_whose_commit_fails_after_it_went_out_leaves_nothing);
    tcase_add_test(
        durable, test_a_waited_job_whose_output_its_answer_leaves_out_is_answered_after_its_commit);
    suite_add_tcase(s, durable);
    return run_suite(s);
}
