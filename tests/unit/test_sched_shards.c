/* The scheduler (daemon/sched/scheduler.h) against a real store of several shards and a fake
 * executor that the test drives by hand: how a round's jobs spread over the shards, a commit
 * that fails in one shard, and an end the store refuses. */
#include <check.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"
#include "daemon/store/store_internal.h" /* the shards jobs are placed in */
#include "support/run_suite.h"
#include "support/sched_test.h"

/* When the store refuses a success's row (here a trigger, as a constraint or a full disk would
 * in the end's own statement), the job ends failed with the reason, its output file goes, and
 * the failure is what the store keeps, while the round's other writes stand: a job that starts
 * in it is stored running. On one shard the refusal is the end's write's own; on two, the end
 * is one of the round's deferred writes and the refusal comes back through store_flush. */
START_TEST(test_a_success_the_store_refuses_ends_failed_without_its_outputs)
{
    sched_test_fake->slots = 1;
    enum { ELEMS = 20000 }; /* 80 KB tensors: files of their own */
    job_t *job = sched_test_add_job("alice", ELEMS, 0);
    sched_test_box_t a, b;
    sched_test_submit(&a, &job, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_int_eq(sched_test_blob_files(), 2); /* the inputs */
    job_t *next =
        sched_test_lone_job("bob", 4); /* waits for a's slot: starts in the round that ends a */
    sched_test_submit(&b, &next, 1);

    const char *sql = "CREATE TRIGGER refuse_success BEFORE UPDATE ON jobs "
                      "WHEN NEW.state = 'succeeded' "
                      "BEGIN SELECT RAISE(ABORT, 'injected refusal'); END";
    char path[PATH_MAX];
    int k = store_id_shard(a.ids[0], store_shards(sched_test_store));
    if (k == 0)
        snprintf(path, sizeof path, "%s/gpujobd.db", sched_test_dir);
    else
        snprintf(path, sizeof path, "%s/gpujobd-%d.db", sched_test_dir, k);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    fake_exec_complete(sched_test_fake, 0);
    ck_assert_int_eq(sched_test_ended_state("alice", a.ids[0]), JOB_FAILED);
    ck_assert_int_eq(sched_test_blob_files(), 2); /* the output's file went */
    fake_exec_wait_batches(sched_test_fake, 2);
    ck_assert_int_eq(sched_test_stored_state(b.ids[0]), JOB_RUNNING);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, a.ids[0], &stored), 0);
    ck_assert_int_eq(job_resolve_op(stored), 0);
    ck_assert_int_eq(stored->state, JOB_FAILED);
    ck_assert_str_eq(stored->error_code, "store_failed");
    ck_assert_int_eq(stored->call.n_out, 1);
    ck_assert_ptr_null(stored->out[0].blob);
    job_free(stored);
    store_reader_close(rd);
}
END_TEST

/* The shards of the ids in a box's answer, as a mask. */
static unsigned answer_shards(const sched_test_box_t *b)
{
    unsigned mask = 0;
    for (size_t i = 0; i < b->n; i++)
        mask |= 1u << store_id_shard(b->ids[i], 4);
    return mask;
}

/* On a store of four shards (the fixture's, whose group commit waits 200 ms for company): the
 * submissions of a round of few jobs go to one shard, those of a round of many to different
 * ones, and every job is found where its id says. */
START_TEST(test_a_round_of_few_jobs_goes_to_one_shard_and_a_round_of_many_is_spread)
{
    enum { FEW = 3, MANY = 4, BIG = 40 };
    sched_test_box_t few[FEW], many[MANY];
    for (int i = 0; i < FEW; i++) {
        job_t **jobs = calloc(2, sizeof *jobs);
        jobs[0] = sched_test_add_job("alice", 4, 0);
        jobs[1] = sched_test_add_job("alice", 4, 0);
        sched_test_box_init(&few[i]);
        sched_submit(sched_test_sched, jobs, 2, sched_test_on_reply, &few[i]);
    }
    unsigned mask = 0;
    for (int i = 0; i < FEW; i++) {
        sched_test_box_wait(&few[i]);
        ck_assert_int_eq(few[i].err, 0);
        mask |= answer_shards(&few[i]);
    }
    ck_assert_int_eq(__builtin_popcount(mask), 1);

    for (int i = 0; i < MANY; i++) {
        job_t **jobs = calloc(BIG, sizeof *jobs);
        for (int j = 0; j < BIG; j++)
            jobs[j] = sched_test_add_job("bob", 4, 0);
        sched_test_box_init(&many[i]);
        sched_submit(sched_test_sched, jobs, BIG, sched_test_on_reply, &many[i]);
    }
    mask = 0;
    for (int i = 0; i < MANY; i++) {
        sched_test_box_wait(&many[i]);
        ck_assert_int_eq(many[i].err, 0);
        ck_assert_uint_eq(many[i].n, BIG);
        unsigned one = answer_shards(&many[i]);
        ck_assert_int_eq(__builtin_popcount(one), 1); /* a submission stays in one shard */
        mask |= one;
    }
    ck_assert_uint_eq(mask, 0xf);
    for (int i = 0; i < MANY; i++) /* found through the shard its id names */
        ck_assert_int_ne(sched_test_stored_state(many[i].ids[BIG - 1]), JOB_FAILED);
}
END_TEST

static off_t state_file_size(const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", sched_test_dir, name);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    return sb.st_size;
}

/* Fills shard 1's WAL past shard 0's (rounds of few jobs take turns: the first went to shard 0,
 * this one goes to 1), so that a limit at its size stops shard 1's next commit and not shard
 * 0's. first is one of its jobs; box gets the answer. */
static void grow_shard_one(sched_test_box_t *box, job_t *first)
{
    job_t *many[61];
    many[0] = first;
    for (int i = 1; i < 61; i++)
        many[i] = sched_test_lone_job("filler", 100);
    sched_test_submit(box, many, 61);
    ck_assert_int_eq(store_id_shard(box->ids[0], 2), 1);
    ck_assert_int_gt(state_file_size("gpujobd-1.db-wal"),
                     state_file_size("gpujobd.db-wal") + 16384);
}

/* Two shards (the fixture's, with a 1 s group commit and inputs of over 1 KiB in files of
 * their own). A group commit that fails in shard 1 keeps what shard 0 committed: its
 * submission is answered as accepted and queued, with its input file, and only shard 1's
 * fails. */
START_TEST(test_a_commit_that_fails_in_one_shard_keeps_what_another_committed)
{
    sched_test_fake->slots = 0;
    sched_test_box_t r0, r1;
    job_t *tiny = sched_test_lone_job("alice", 4);
    sched_test_submit(&r0, &tiny, 1);
    ck_assert_int_eq(store_id_shard(r0.ids[0], 2), 0);
    grow_shard_one(&r1, sched_test_lone_job("filler", 100));

    /* One round: a keyed job (shard 0) with an 8 KiB input, and an array of 64 that goes to the
     * shard with fewer of the round's jobs, 1. */
    job_t **keyed = calloc(1, sizeof *keyed);
    keyed[0] = sched_test_lone_job("bob", 2048);
    snprintf(keyed[0]->idempotency_key, sizeof keyed[0]->idempotency_key, "k1");
    job_t **array = calloc(64, sizeof *array);
    for (int i = 0; i < 64; i++)
        array[i] = sched_test_lone_job("carol", 4);
    sched_test_box_t a, b;
    sched_test_box_init(&a);
    sched_test_box_init(&b);
    struct rlimit saved;
    sched_test_wal_limit("gpujobd-1.db-wal", &saved);
    sched_submit(sched_test_sched, keyed, 1, sched_test_on_reply, &a);
    sched_submit(sched_test_sched, array, 64, sched_test_on_reply, &b);
    sched_test_box_wait(&a);
    sched_test_box_wait(&b);
    sched_test_wal_limit_lift(&saved);
    ck_assert_int_eq(a.err, 0);
    ck_assert_int_eq(store_id_shard(a.ids[0], 2), 0);
    ck_assert_int_eq(b.err, -EIO);
    ck_assert_int_eq(sched_test_stored_state(a.ids[0]), JOB_QUEUED);

    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(rd, a.ids[0], &job), 0);
    void *data = NULL;
    ck_assert_int_eq(store_blob_read(rd, job->in[0].blob, job->in[0].nbytes, &data), 0);
    free(data);
    job_free(job);
    store_list_query_t q = {.owner = "carol", .state = -1, .limit = 100};
    job_t **rows = NULL;
    size_t n = 9;
    ck_assert_int_eq(store_jobs_list(rd, &q, &rows, &n), 0);
    ck_assert_uint_eq(n, 0);
    free(rows);
    store_reader_close(rd);
}
END_TEST

/* A round of ends that commits in shard 0 and fails in shard 1: the end shard 0 committed is
 * the one its waiter hears, not recorded again; the end shard 1 refused takes the file of its
 * job's output along (the jobs' 1,600-byte tensors are files of their own). */
START_TEST(test_an_end_committed_in_one_shard_is_answered_as_stored)
{
    sched_test_fake->slots = 0;
    sched_test_box_t r0, r1, r2;
    job_t *a = sched_test_add_job("alice", 400, 0);
    sched_test_submit(&r0, &a, 1);
    ck_assert_int_eq(store_id_shard(r0.ids[0], 2), 0);
    grow_shard_one(&r1, sched_test_add_job("alice", 400, 0)); /* the same batch key as a */
    sched_test_fake->slots = 1;
    job_t *z = sched_test_lone_job("zed", 4);
    sched_test_submit(&r2, &z, 1); /* the next dispatch sends a and its twin in shard 1 together */
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_int_eq(sched_test_fake->got[0]->n, 2);
    ck_assert_int_eq(sched_test_blob_files(), 4); /* the two jobs' inputs */

    sched_test_box_t wa;
    sched_test_box_init(&wa);
    sched_wait(sched_test_sched, "alice", r0.ids[0], 5000, sched_test_on_reply, &wa);
    struct rlimit saved;
    sched_test_wal_limit("gpujobd-1.db-wal", &saved);
    fake_exec_complete(sched_test_fake, 0);
    sched_test_box_wait(&wa);
    sched_test_wal_limit_lift(&saved);
    ck_assert_int_eq(wa.err, 0);
    ck_assert_int_eq(wa.states[0], JOB_SUCCEEDED);
    ck_assert_int_eq(sched_test_stored_state(r0.ids[0]), JOB_SUCCEEDED);
    ck_assert_int_eq(sched_test_blob_files(), 5); /* and a's output */
}
END_TEST

static void start_sched_two_shards(void)
{
    sched_test_next_shards = 2;
    sched_test_next_inline_bytes = 1024;
    sched_test_setup(false);
    sched_test_next_shards = 1;
    sched_test_next_inline_bytes = 0;
    sched_test_cfg.commit_delay_us = 1000 * 1000; /* so that a test's submissions share a round */
    ck_assert_int_eq(sched_start(sched_test_sched), 0);
}

static void start_sched_sharded(void)
{
    sched_test_next_shards = 4;
    sched_test_setup(true);
    sched_test_next_shards = 1;
    sched_test_cfg.commit_delay_us = 200 * 1000;
    ck_assert_int_eq(sched_start(sched_test_sched), 0);
}

int main(void)
{
    Suite *s = suite_create("sched_shards");
    TCase *tc = sched_test_tcase("sched", sched_test_start);
    tcase_add_test(tc, test_a_success_the_store_refuses_ends_failed_without_its_outputs);
    suite_add_tcase(s, tc);
    TCase *sharded = sched_test_tcase("sharded", start_sched_sharded);
    tcase_add_test(sharded,
                   test_a_round_of_few_jobs_goes_to_one_shard_and_a_round_of_many_is_spread);
    suite_add_tcase(s, sharded);
    TCase *two = sched_test_tcase("two shards", start_sched_two_shards);
    tcase_add_test(two, test_a_commit_that_fails_in_one_shard_keeps_what_another_committed);
    tcase_add_test(two, test_an_end_committed_in_one_shard_is_answered_as_stored);
    tcase_add_test(two, test_a_success_the_store_refuses_ends_failed_without_its_outputs);
    suite_add_tcase(s, two);
    return run_suite(s);
}
