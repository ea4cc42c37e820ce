/* The scheduler (daemon/sched/scheduler.h) against a real store and a fake executor that the test
 * drives by hand: which jobs go out together and when: batch keys, the batch cap, one user's
 * priorities, a device pinned and full, batches turned down or given back by a device reset,
 * and the watchdog's bound on a stuck batch. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/util/config.h"
#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"
#include "support/run_suite.h"
#include "support/sched_test.h"

START_TEST(test_watchdog_bound_grows_with_the_batch_cost_and_never_falls_below_the_minimum)
{
    config_t c;
    config_defaults(&c);
    c.watchdog_min_ms = 500;
    c.watchdog_cost_factor = 10;
    job_t *small = sched_test_add_job("alice", 10, 0);
    /* 1e9 bytes at 1 GB/s and 1e11 flops at 100 GFLOP/s: 2 s, ten times over. */
    job_t *big = sched_test_add_job("alice", 10, 0);
    big->call.cost.bytes = 1e9;
    big->call.cost.flops = 1e11;
    job_t *jobs[] = {small, big, big};
    ck_assert_int_eq(sched_watchdog_bound_ms(&c, jobs, 1), 500);
    ck_assert_int_eq(sched_watchdog_bound_ms(&c, jobs + 1, 1), 20000);
    ck_assert_int_eq(sched_watchdog_bound_ms(&c, jobs + 1, 2), 40000);
    big->call.cost.flops = 1e300; /* a cost no run could reach is capped, not overflowed */
    ck_assert_int_gt(sched_watchdog_bound_ms(&c, jobs + 1, 2), 40000);
    c.watchdog_min_ms = 0;
    ck_assert_int_eq(sched_watchdog_bound_ms(&c, jobs + 1, 1), 0);
    job_free(small);
    job_free(big);
}
END_TEST

START_TEST(test_watchdog_fails_a_stuck_batch_and_ignores_its_late_result)
{
    sched_test_fake->slots = 1;
    job_t *job = sched_test_add_job("alice", 10, 0);
    sched_test_box_t box;
    sched_test_submit(&box, &job, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    /* The fake never completes it: the watchdog gives up on it, the job fails with the bound
     * named, and the executor is asked to recover. */
    sched_test_box_t w;
    sched_test_box_init(&w);
    sched_wait(sched_test_sched, "alice", box.ids[0], 10000, sched_test_on_reply, &w);
    sched_test_box_wait(&w);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_eq(w.states[0], JOB_FAILED);
    ck_assert_int_eq(sched_test_stored_state(box.ids[0]), JOB_FAILED);
    exec_batch_t *stuck = fake_exec_wait_abandoned(sched_test_fake);
    ck_assert_ptr_eq(stuck, sched_test_fake->got[0]);
    ck_assert_int_eq(sched_test_fake->n_abandoned, 1);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, box.ids[0], &stored), 0);
    ck_assert_str_eq(stored->error_code, "watchdog_timeout");
    ck_assert_ptr_nonnull(strstr(stored->error_message, "100 ms"));
    job_free(stored);
    sched_stats_t stats;
    sched_get_stats(sched_test_sched, &stats);
    ck_assert_int_eq(stats.watchdog_expired_total, 1);
    ck_assert_int_eq(stats.stuck_batches, 1);

    /* The stuck batch comes back at last, as if it had succeeded: its result is dropped. */
    fake_exec_complete(sched_test_fake, 0);
    for (int i = 0; i < 1000 && stats.stuck_batches > 0; i++) {
        usleep(10 * 1000);
        sched_get_stats(sched_test_sched, &stats);
    }
    ck_assert_int_eq(stats.stuck_batches, 0);
    ck_assert_int_eq(stats.watchdog_expired_total, 1);
    ck_assert_int_eq(sched_test_stored_state(box.ids[0]), JOB_FAILED);
    ck_assert_int_eq(store_job_get(rd, box.ids[0], &stored), 0);
    ck_assert_str_eq(stored->error_code, "watchdog_timeout");
    job_free(stored);
    store_reader_close(rd);
}
END_TEST

START_TEST(test_jobs_with_equal_batch_keys_go_out_as_one_batch)
{
    sched_test_fake->slots = 0; /* hold everything queued while the jobs arrive */
    job_t *jobs[10];
    for (int i = 0; i < 10; i++)
        jobs[i] = sched_test_add_job("alice", 100 + i, 0);
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 10);
    ck_assert_int_eq(box.n, 10);

    char first_ids[10][ID_SIZE];
    for (int i = 0; i < 10; i++)
        strcpy(first_ids[i], box.ids[i]);

    /* Opening one slot: the next dispatch (a new submission wakes it, unless a timer of the loop
     * got there first) takes all ten, same key, in one batch, with the new job if it is queued
     * by then. */
    sched_test_fake->slots = 1;
    job_t *more = sched_test_add_job("alice", 7, 0);
    sched_test_submit(&box, &more, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_int_eq(sched_test_fake->n_got, 1);
    ck_assert_int_ge(sched_test_fake->got[0]->n, 10);
    for (int i = 0; i < 10; i++) {
        bool found = false;
        for (int k = 0; k < sched_test_fake->got[0]->n; k++)
            found |= strcmp(sched_test_fake->got[0]->jobs[k]->id, first_ids[i]) == 0;
        ck_assert_msg(found, "job %d of the ten is not in the batch", i);
    }
    fake_exec_complete(sched_test_fake, 0);

    ck_assert_int_eq(sched_test_ended_state("alice", first_ids[0]), JOB_SUCCEEDED);
    ck_assert_int_eq(sched_test_stored_state(first_ids[0]), JOB_SUCCEEDED);
}
END_TEST

START_TEST(test_max_batch_caps_batch_size)
{
    sched_test_cfg.max_batch = 4;
    sched_test_fake->slots = 0;
    job_t *jobs[10];
    for (int i = 0; i < 10; i++)
        jobs[i] = sched_test_add_job("alice", 10, 0);
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 10);
    sched_test_fake->slots = 8;
    /* Bob's job wakes the dispatcher, unless a batch timer got there first; either way all
     * eleven jobs go out, in at least three batches and none over four. */
    job_t *more = sched_test_add_job("bob", 3, 0);
    sched_test_submit(&box, &more, 1);
    ck_assert_int_eq(fake_exec_wait_jobs(sched_test_fake, 11), 11);
    ck_assert_int_ge(sched_test_fake->n_got, 3);
    for (int i = 0; i < sched_test_fake->n_got; i++)
        ck_assert_int_le(sched_test_fake->got[i]->n, 4);
}
END_TEST

START_TEST(test_batches_given_back_by_a_device_reset_run_again_while_attempts_remain)
{
    sched_test_cfg.max_batch = 1;
    sched_test_cfg.max_attempts = 2;
    sched_test_fake->slots = 2;
    job_t *a = sched_test_add_job("alice", 10, 0), *b = sched_test_add_job("alice", 11, 0);
    sched_test_box_t box_a, box_b;
    sched_test_submit(&box_a, &a, 1);
    sched_test_submit(&box_b, &b, 1);
    fake_exec_wait_batches(sched_test_fake, 2);
    bool a_first = sched_test_fake->got[0]->jobs[0] == a;
    ck_assert_int_eq(a->attempts, 1);
    ck_assert_int_eq(b->attempts, 1);

    /* The device resets: a was running on it, b had not reached it. Both run again; only a's
     * attempt counts. */
    fake_exec_give_back(sched_test_fake, a_first ? 0 : 1, EXEC_RETRY_INTERRUPTED);
    fake_exec_give_back(sched_test_fake, a_first ? 1 : 0, EXEC_RETRY_UNSTARTED);
    fake_exec_wait_batches(sched_test_fake, 4);
    ck_assert_int_eq(sched_test_fake->n_got, 4);
    int again_a = sched_test_fake->got[2]->jobs[0] == a ? 2 : 3;
    ck_assert_ptr_eq(sched_test_fake->got[again_a]->jobs[0], a);
    ck_assert_ptr_eq(sched_test_fake->got[5 - again_a]->jobs[0], b);
    ck_assert_int_eq(a->attempts, 2);
    ck_assert_int_eq(b->attempts, 1);
    ck_assert_str_eq(a->error_code, "");
    ck_assert_int_eq(sched_test_stored_state(box_a.ids[0]), JOB_RUNNING);

    /* Interrupted again, a is out of attempts: it fails with the reset's error. b succeeds. */
    fake_exec_give_back(sched_test_fake, again_a, EXEC_RETRY_INTERRUPTED);
    fake_exec_complete(sched_test_fake, 5 - again_a);
    ck_assert_int_eq(sched_test_ended_state("alice", box_a.ids[0]), JOB_FAILED);
    ck_assert_int_eq(sched_test_ended_state("alice", box_b.ids[0]), JOB_SUCCEEDED);
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(rd, box_a.ids[0], &stored), 0);
    ck_assert_str_eq(stored->error_code, "device_reset");
    ck_assert_int_eq(stored->attempts, 2);
    job_free(stored);
    store_reader_close(rd);
}
END_TEST

START_TEST(test_a_job_pinned_to_a_full_device_waits_and_holds_back_nothing)
{
    sched_test_fake->slots = 4;
    sched_test_fake->device0_free = 0;
    job_t *pinned = sched_test_add_job("alice", 10, 0);
    pinned->device = 0;
    sched_test_box_t box;
    sched_test_submit(&box, &pinned, 1);
    usleep(100000);
    ck_assert_int_eq(sched_test_fake->n_got, 0);
    ck_assert_int_eq(sched_test_stored_state(box.ids[0]), JOB_QUEUED);

    /* Other work goes on meanwhile: alice's own later, lower-priority job (her pinned one
     * holds back none of her others), and bob's. */
    job_t *mine = sched_test_add_job("alice", 12, -5);
    sched_test_box_t box_mine;
    sched_test_submit(&box_mine, &mine, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_str_eq(sched_test_fake->got[0]->jobs[0]->id, box_mine.ids[0]);
    job_t *other = sched_test_add_job("bob", 11, 0);
    sched_test_box_t box2;
    sched_test_submit(&box2, &other, 1);
    fake_exec_wait_batches(sched_test_fake, 2);
    ck_assert_str_eq(sched_test_fake->got[1]->jobs[0]->id, box2.ids[0]);
    ck_assert_int_eq(sched_test_stored_state(box.ids[0]), JOB_QUEUED);

    /* Once device 0 has room, the next dispatch takes the pinned job. */
    pthread_mutex_lock(&sched_test_fake->lock);
    sched_test_fake->device0_free = 1;
    pthread_mutex_unlock(&sched_test_fake->lock);
    fake_exec_complete(sched_test_fake, 0);
    fake_exec_wait_batches(sched_test_fake, 3);
    ck_assert_int_eq(sched_test_fake->n_got, 3);
    ck_assert_str_eq(sched_test_fake->got[2]->jobs[0]->id, box.ids[0]);
}
END_TEST

START_TEST(test_priority_orders_one_users_queue)
{
    sched_test_cfg.max_batch = 1;
    sched_test_fake->slots = 0;
    job_t *low = sched_test_add_job("alice", 10, -5);
    job_t *high = sched_test_add_job("alice", 11, 50);
    sched_test_box_t box_low, box_high;
    sched_test_submit(&box_low, &low, 1);
    sched_test_submit(&box_high, &high, 1);
    sched_test_fake->slots = 1;
    job_t *wake = sched_test_add_job("alice", 12, 0);
    sched_test_box_t box;
    sched_test_submit(&box, &wake, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_str_eq(sched_test_fake->got[0]->jobs[0]->id, box_high.ids[0]);
}
END_TEST

START_TEST(test_a_batch_the_executor_turns_down_goes_back_to_its_queue)
{
    sched_test_fake->slots = 1;
    sched_test_fake->turn_down = 1; /* as a device worker does when the pinned device is full */
    job_t *job = sched_test_add_job("alice", 10, 0);
    job->device = 0;
    sched_test_box_t box;
    sched_test_submit(&box, &job, 1);
    /* Turned down: queued again, in the store too, not failed. */
    for (int i = 0; i < 100 && sched_test_fake->turn_down > 0; i++)
        usleep(10 * 1000);
    ck_assert_int_eq(sched_test_fake->turn_down, 0);
    ck_assert_int_eq(sched_test_fake->n_got, 0);
    usleep(20 * 1000);
    ck_assert_int_eq(sched_test_stored_state(box.ids[0]), JOB_QUEUED);

    /* The next dispatch (a new submission wakes it) hands it over, as its first attempt. */
    job_t *other = sched_test_add_job("alice", 11, 0);
    other->device = 0;
    sched_test_box_t b2;
    sched_test_submit(&b2, &other, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_int_eq(sched_test_fake->n_got, 1);
    bool found = false;
    for (int k = 0; k < sched_test_fake->got[0]->n; k++)
        if (strcmp(sched_test_fake->got[0]->jobs[k]->id, box.ids[0]) == 0) {
            found = true;
            ck_assert_int_eq(sched_test_fake->got[0]->jobs[k]->attempts, 1);
        }
    ck_assert(found);
    fake_exec_complete(sched_test_fake, 0);
    ck_assert_int_eq(sched_test_ended_state("alice", box.ids[0]), JOB_SUCCEEDED);
}
END_TEST

/* A watchdog that gives up on a batch after 100 ms (jobs of the tests cost next to nothing). */
static void start_sched_watchdog(void)
{
    sched_test_setup(false);
    sched_test_cfg.watchdog_min_ms = 100;
    ck_assert_int_eq(sched_start(sched_test_sched), 0);
}

int main(void)
{
    Suite *s = suite_create("sched_batches");
    TCase *tc = sched_test_tcase("sched", sched_test_start);
    tcase_add_test(tc, test_jobs_with_equal_batch_keys_go_out_as_one_batch);
    tcase_add_test(tc, test_max_batch_caps_batch_size);
    tcase_add_test(tc, test_batches_given_back_by_a_device_reset_run_again_while_attempts_remain);
    tcase_add_test(tc, test_a_job_pinned_to_a_full_device_waits_and_holds_back_nothing);
    tcase_add_test(tc, test_priority_orders_one_users_queue);
    tcase_add_test(tc, test_a_batch_the_executor_turns_down_goes_back_to_its_queue);
    suite_add_tcase(s, tc);
    TCase *durable = sched_test_tcase("durable", sched_test_start_durable);
    tcase_add_test(durable, test_jobs_with_equal_batch_keys_go_out_as_one_batch);
    tcase_add_test(durable, test_a_batch_the_executor_turns_down_goes_back_to_its_queue);
    suite_add_tcase(s, durable);
    TCase *watchdog = sched_test_tcase("watchdog", start_sched_watchdog);
    tcase_add_test(watchdog,
                   test_watchdog_bound_grows_with_the_batch_cost_and_never_falls_below_the_minimum);
    tcase_add_test(watchdog, test_watchdog_fails_a_stuck_batch_and_ignores_its_late_result);
    suite_add_tcase(s, watchdog);
    return run_suite(s);
}
