/* The scheduler (daemon/sched/scheduler.h) against a real store and a fake executor that the test
 * drives by hand: the share of each user: fair share by weight and across a restart, the
 * running limit per user, why a queued job waits and at which position, and the per-user
 * gauges of /metrics. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/util/config.h"
#include "daemon/util/id.h"
#include "daemon/sched/scheduler.h"
#include "daemon/store/store.h"
#include "support/run_suite.h"
#include "support/sched_test.h"

START_TEST(test_fair_share_serves_a_small_user_before_a_big_backlog_drains)
{
    sched_test_cfg.max_batch = 1; /* one job per batch makes the order of service visible */
    sched_test_fake->slots = 0;
    job_t *jobs[50];
    for (int i = 0; i < 50; i++)
        jobs[i] = sched_test_add_job("big", 1000, 0);
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 50);
    sched_test_fake->slots = 1;
    job_t *small = sched_test_add_job("small", 1000, 0);
    sched_test_submit(&box, &small, 1);
    char small_id[ID_SIZE];
    strcpy(small_id, box.ids[0]);

    /* Run batches one at a time; the small user's job must come within the first few. */
    int position = -1;
    for (int i = 0; i < 10 && position < 0; i++) {
        fake_exec_wait_batches(sched_test_fake, i + 1);
        ck_assert_int_eq(sched_test_fake->n_got, i + 1);
        if (strcmp(sched_test_fake->got[i]->jobs[0]->id, small_id) == 0) position = i;
        fake_exec_complete(sched_test_fake, i);
    }
    ck_assert_int_ge(position, 0);
    ck_assert_int_le(position, 2);
}
END_TEST

/* Restarts the scheduler on its store, whose fair-share state is first set to users[0..n),
 * with a half-life of 100 s; the fake executor takes nothing until the test says. */
static void restart_with_fair_share(const store_fair_share_t *users, size_t n)
{
    sched_stop(sched_test_sched);
    sched_free(sched_test_sched);
    ck_assert_int_eq(store_fair_share_save(sched_test_store, users, n), 0);
    sched_test_cfg.fair_share_half_life_s = 100;
    ck_assert_int_eq(sched_new(&sched_test_cfg, sched_test_store, &sched_test_sched), 0);
    sched_test_fake->n_got = sched_test_fake->n_done = 0;
    sched_test_fake->slots = 0;
    sched_set_executor(sched_test_sched, &sched_test_fake->base);
    ck_assert_int_eq(sched_start(sched_test_sched), 0);
}

START_TEST(test_fair_share_usage_survives_a_restart_decayed_over_the_downtime)
{
    /* Saved one half-life ago: restored at half; saved forty ago: as good as new, dropped. */
    int64_t now = now_us();
    store_fair_share_t users[] = {{"heavy", 8e6, now - 100 * 1000000LL},
                                  {"forgotten", 8e6, now - 4000 * 1000000LL}};
    restart_with_fair_share(users, 2);
    sched_stop(sched_test_sched); /* saves what it restored, decayed to now */
    store_fair_share_t *saved = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_fair_share_load(sched_test_store, &saved, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(saved[0].owner, "heavy");
    /* At most half, less only by the few moments the restart itself took. */
    ck_assert_double_le(saved[0].usage_us, 4e6);
    ck_assert_double_gt(saved[0].usage_us, 3.9e6);
    ck_assert_int_ge(saved[0].at_us, now);
    free(saved);
}
END_TEST

START_TEST(test_a_user_heavy_before_a_restart_is_served_after_a_light_one)
{
    sched_test_cfg.max_batch = 1;
    store_fair_share_t users[] = {{"heavy", 8e6, now_us()}};
    restart_with_fair_share(users, 1);
    /* heavy's jobs come first; with no usage remembered, they would also go out first. */
    job_t *jobs[3] = {sched_test_add_job("heavy", 1000, 0), sched_test_add_job("heavy", 1000, 0),
                      sched_test_add_job("heavy", 1000, 0)};
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 3);
    sched_test_fake->slots = 1; /* the next commit dispatches, with both users' jobs queued */
    job_t *light = sched_test_add_job("light", 1000, 0);
    sched_test_submit(&box, &light, 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    ck_assert_int_ge(sched_test_fake->n_got, 1);
    ck_assert_str_eq(sched_test_fake->got[0]->jobs[0]->owner, "light");
}
END_TEST

/* Two backlogged users of weights 3 and 1 ([user.alice] weight = 3) share one slot: over a
 * window of 80 jobs, alice gets three times bob's device time, to within one job's charge.
 * Fair share charges each job the wall time its batch held the slot, which a loaded machine
 * stretches at random; so the test holds the scheduler to what it charged, not to a count of
 * jobs: picking the user with the least usage per unit of weight each time keeps
 * |alice's usage / 3 - bob's usage| at most the largest single charge (per unit of weight),
 * whatever the charges were. The usage is the scheduler's own, as it saves it at its stop (a
 * year's half-life: undecayed over the test); each job's charge is at most its row's run time
 * (its start is recorded before the batch is handed over, its end at the charge). */
START_TEST(test_fair_share_gives_a_user_of_weight_3_three_times_the_share)
{
    char err[256];
    ck_assert_int_eq(config_set(&sched_test_cfg, "user.alice", "weight", "3", err, sizeof err), 0);
    sched_test_policy_apply();
    sched_test_cfg.fair_share_half_life_s = 31536000;
    sched_test_cfg.max_batch = 1;
    sched_test_fake->slots = 0;
    enum { EACH = 100, WINDOW = 80 };
    job_t *a[EACH], *b[EACH];
    for (int i = 0; i < EACH; i++) {
        a[i] = sched_test_add_job("alice", 16, 0);
        b[i] = sched_test_add_job("bob", 16, 0);
    }
    sched_test_box_t box;
    sched_test_submit(&box, a, EACH);
    sched_test_fake->slots = 1; /* bob's submission wakes the dispatch with both queues full */
    sched_test_submit(&box, b, EACH);
    int done[2] = {0, 0}; /* alice, bob */
    static char ids[WINDOW][ID_SIZE];
    bool by_alice[WINDOW];
    for (int i = 0; i < WINDOW; i++) {
        fake_exec_wait_batches(sched_test_fake, i + 1);
        ck_assert_int_eq(sched_test_fake->n_got, i + 1);
        usleep(5000);
        const job_t *job = sched_test_fake->got[i]->jobs[0];
        snprintf(ids[i], sizeof ids[i], "%s", job->id);
        by_alice[i] = strcmp(job->owner, "alice") == 0;
        done[by_alice[i] ? 0 : 1]++;
        if (i == WINDOW - 1) sched_test_fake->slots = 0; /* the window's last job starts no other */
        fake_exec_complete(sched_test_fake, i);
    }
    sched_stop(sched_test_sched); /* charges the window's last job, and saves every user's usage */

    double usage[2] = {0, 0}, most = 0; /* alice's / 3, bob's; the largest charge, likewise */
    store_fair_share_t *saved = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_fair_share_load(sched_test_store, &saved, &n), 0);
    for (size_t i = 0; i < n; i++)
        usage[strcmp(saved[i].owner, "alice") == 0 ? 0 : 1] = saved[i].usage_us;
    free(saved);
    usage[0] /= 3;
    store_reader_t *rd;
    ck_assert_int_eq(store_reader_open(sched_test_store, &rd), 0);
    for (int i = 0; i < WINDOW; i++) {
        job_t *job = NULL;
        ck_assert_int_eq(store_job_get(rd, ids[i], &job), 0);
        ck_assert_int_eq(job->state, JOB_SUCCEEDED);
        double charge = (double)(job->finished_us - job->started_us) / (by_alice[i] ? 3 : 1);
        if (charge > most) most = charge;
        job_free(job);
    }
    store_reader_close(rd);
    fprintf(stderr,
            "weight 3 vs 1: alice %d jobs, %.0f us / 3; bob %d jobs, %.0f us; "
            "largest charge %.0f us\n",
            done[0], usage[0], done[1], usage[1], most);
    ck_assert_msg(usage[0] > 0 && usage[1] > 0, "alice's usage %.0f us / 3, bob's %.0f us",
                  usage[0], usage[1]);
    double gap = usage[0] > usage[1] ? usage[0] - usage[1] : usage[1] - usage[0];
    ck_assert_msg(gap <= most + 1,
                  "alice's usage / 3 %.0f us and bob's %.0f us differ by more than the largest "
                  "charge, %.0f us",
                  usage[0], usage[1], most);
}
END_TEST

/* What a queued job says of its wait, as the loop answers for it (sched_wait, no timeout). */
typedef struct waiting_box {
    sched_test_box_t box;
    char reason[16], limit[112];
    long position;
    job_state_t state;
} waiting_box_t;

static void on_waiting_reply(void *token, const sched_result_t *res)
{
    waiting_box_t *w = token;
    if (res->n_jobs == 1) {
        snprintf(w->reason, sizeof w->reason, "%s", res->jobs[0]->waiting_reason);
        snprintf(w->limit, sizeof w->limit, "%s", res->jobs[0]->waiting_limit);
        w->position = res->jobs[0]->waiting_position;
        w->state = res->jobs[0]->state;
    }
    sched_test_on_reply(&w->box, res);
}

static void ask_waiting(waiting_box_t *w, const char *id)
{
    memset(w, 0, sizeof *w);
    sched_test_box_init(&w->box);
    sched_wait(sched_test_sched, NULL, id, 0, on_waiting_reply, w);
    sched_test_box_wait(&w->box);
    ck_assert_int_eq(w->box.err, 0);
}

/* User A queues 5,000 jobs, then B submits 10: B's last job says it waits for fair share at a
 * position that shrinks as jobs run, and B's jobs all run before A's queue drains. */
START_TEST(test_a_small_user_waits_for_fair_share_at_a_shrinking_position)
{
    enum { BIG = 5000, SMALL = 10 };
    sched_test_cfg.max_batch = 1;
    sched_test_fake->slots = 0;
    sched_test_box_t box;
    sched_test_submit_many(&box, "a", BIG, 16);
    sched_test_fake->slots = 1;
    job_t *small[SMALL];
    for (int i = 0; i < SMALL; i++)
        small[i] = sched_test_add_job("b", 16, 0);
    sched_test_submit(&box, small, SMALL);
    char last[ID_SIZE];
    snprintf(last, sizeof last, "%s", box.ids[SMALL - 1]);

    waiting_box_t w;
    ask_waiting(&w, last);
    ck_assert_int_eq(w.state, JOB_QUEUED);
    ck_assert_str_eq(w.reason, "fair_share");
    ck_assert_int_ge(w.position, SMALL - 1); /* its own 9, and some of a's between */
    ck_assert_int_le(w.position, 2 * SMALL + 1);
    long before = w.position;
    int ran = 0, b_done = 0;
    for (; b_done < SMALL && ran < 6 * SMALL; ran++) {
        fake_exec_wait_batches(sched_test_fake, ran + 1);
        ck_assert_int_eq(sched_test_fake->n_got, ran + 1);
        b_done += strcmp(sched_test_fake->got[ran]->jobs[0]->owner, "b") == 0;
        /* Fair share charges a batch's wall time: each job holds the slot 5 ms, so that the
         * test's own latency on a loaded machine is a small part of every charge. */
        usleep(5000);
        fake_exec_complete(sched_test_fake, ran);
        if (b_done == SMALL) break;
        ask_waiting(&w, last);
        if (w.state != JOB_QUEUED) continue;
        ck_assert_msg(w.position <= before, "position grew from %ld to %ld", before, w.position);
        before = w.position;
    }
    ck_assert_int_eq(b_done, SMALL);
    /* Alternating would take 2 × SMALL; a's 5,000 are nowhere near drained. */
    ck_assert_int_lt(ran + 1, 4 * SMALL);
    ck_assert_int_lt(before, SMALL); /* and the position came down on the way */
}
END_TEST

/* A user at its running limit: its queued job names the limit that holds it. */
START_TEST(test_a_job_held_by_its_users_running_limit_names_the_limit)
{
    char err[256];
    ck_assert_int_eq(config_set(&sched_test_cfg, "user.alice", "max_running", "1", err, sizeof err),
                     0);
    sched_test_policy_apply();
    sched_test_cfg.max_batch = 1;
    sched_test_fake->slots = 4;
    job_t *jobs[2] = {sched_test_add_job("alice", 16, 0), sched_test_add_job("alice", 16, 0)};
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 2);
    fake_exec_wait_batches(sched_test_fake, 1);
    waiting_box_t w;
    ask_waiting(&w, box.ids[1]);
    ck_assert_int_eq(w.state, JOB_QUEUED);
    ck_assert_str_eq(w.reason, "user_limit");
    ck_assert_str_eq(w.limit, "user.alice.max_running");
    ck_assert_int_eq(w.position, 0);
}
END_TEST

/* A submission's answer says why each of its jobs that did not start waits, and where. */
START_TEST(test_a_submissions_answer_says_why_its_queued_jobs_wait)
{
    sched_test_cfg.max_batch = 1;
    sched_test_fake->slots = 0;
    job_t *jobs[3] = {sched_test_add_job("alice", 16, 0), sched_test_add_job("alice", 16, 0),
                      sched_test_add_job("alice", 16, 0)};
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 3);
    ck_assert_int_eq(box.n, 3);
    for (long i = 0; i < 3; i++) {
        ck_assert_int_eq(box.states[i], JOB_QUEUED);
        ck_assert_str_eq(box.reasons[i], "devices_busy");
        ck_assert_int_eq(box.positions[i], i);
    }
}
END_TEST

/* A list explained in one message says of each queued job what a wait for that job alone
 * says, in whatever order the list has them; a job the loop does not hold is left as read. */
START_TEST(test_jobs_explained_together_agree_with_each_explained_alone)
{
    enum { A = 20, B = 5, N = A + B + 1 };
    sched_test_cfg.max_batch = 1;
    sched_test_fake->slots = 0;
    job_t *a[A], *b[B];
    for (int i = 0; i < A; i++)
        a[i] = sched_test_add_job("alice", 16, i % 3);
    for (int i = 0; i < B; i++)
        b[i] = sched_test_add_job("bob", 16, 0);
    sched_test_box_t box_a, box_b;
    sched_test_submit(&box_a, a, A);
    sched_test_submit(&box_b, b, B);
    job_t *copies[N];
    for (int i = 0; i < N; i++) {
        copies[i] = job_new();
        copies[i]->state = JOB_QUEUED;
        const char *id = i < A ? box_a.ids[A - 1 - i] : i < A + B ? box_b.ids[i - A] : NULL;
        if (id)
            snprintf(copies[i]->id, sizeof copies[i]->id, "%s", id);
        else
            id_new('j', copies[i]->id); /* not the loop's */
    }
    sched_test_box_t box;
    sched_test_box_init(&box);
    sched_explain_jobs(sched_test_sched, copies, N, sched_test_on_reply, &box);
    sched_test_box_wait(&box);
    ck_assert_int_eq(box.err, 0);
    ck_assert_int_eq(box.n, N);
    for (int i = 0; i < N - 1; i++) {
        waiting_box_t w;
        ask_waiting(&w, copies[i]->id);
        ck_assert_str_eq(copies[i]->waiting_reason, w.reason);
        ck_assert_int_eq(copies[i]->waiting_position, w.position);
    }
    ck_assert_str_eq(copies[N - 1]->waiting_reason, "");
    for (int i = 0; i < N; i++)
        job_free(copies[i]);
}
END_TEST

START_TEST(test_batches_keep_each_user_within_the_running_limit)
{
    sched_test_cfg.max_running_per_user = 2;
    sched_test_policy_apply();
    sched_test_cfg.max_batch = 16;
    sched_test_fake->slots = 0;
    job_t *jobs[8];
    for (int i = 0; i < 8; i++)
        jobs[i] = sched_test_add_job(i < 5 ? "alice" : "bob", 10, 0);
    sched_test_box_t box;
    sched_test_submit(&box, jobs, 5);
    sched_test_submit(&box, jobs + 5, 3);
    sched_test_fake->slots = 8;
    job_t *wake = sched_test_add_job("carol", 10, 0);
    sched_test_submit(&box, &wake, 1);

    /* Five jobs go out, however the batches are cut: two of alice's five, two of bob's three,
     * carol's one; the others wait for a running job of theirs to end. */
    ck_assert_int_eq(fake_exec_wait_jobs(sched_test_fake, 5), 5);
    usleep(50000);
    int alice = 0, bob = 0, carol = 0;
    pthread_mutex_lock(&sched_test_fake->lock);
    for (int i = 0; i < sched_test_fake->n_got; i++)
        for (int k = 0; k < sched_test_fake->got[i]->n; k++) {
            const char *owner = sched_test_fake->got[i]->jobs[k]->owner;
            alice += strcmp(owner, "alice") == 0;
            bob += strcmp(owner, "bob") == 0;
            carol += strcmp(owner, "carol") == 0;
        }
    pthread_mutex_unlock(&sched_test_fake->lock);
    ck_assert_int_eq(alice, 2);
    ck_assert_int_eq(bob, 2);
    ck_assert_int_eq(carol, 1);
}
END_TEST

/* The user's other jobs go around a job waiting for its device only while one running slot
 * stays free for it: at max_running_per_user 2, one of them runs, and the waiting job comes
 * next once its device has room. */
START_TEST(test_jobs_going_around_a_waiting_one_leave_it_a_running_slot)
{
    sched_test_cfg.max_running_per_user = 2;
    sched_test_policy_apply();
    sched_test_cfg.max_batch = 1;
    sched_test_fake->slots = 4;
    sched_test_fake->device0_free = 0;
    job_t *pinned = sched_test_add_job("alice", 10, 0);
    pinned->device = 0;
    job_t *later[2] = {sched_test_add_job("alice", 11, -5), sched_test_add_job("alice", 12, -5)};
    sched_test_box_t box, box_later[2];
    sched_test_submit(&box, &pinned, 1);
    for (int i = 0; i < 2; i++)
        sched_test_submit(&box_later[i], &later[i], 1);
    fake_exec_wait_batches(sched_test_fake, 1);
    usleep(100000);
    ck_assert_int_eq(sched_test_fake->n_got, 1);
    ck_assert_str_eq(sched_test_fake->got[0]->jobs[0]->id, box_later[0].ids[0]);

    pthread_mutex_lock(&sched_test_fake->lock);
    sched_test_fake->device0_free = 1;
    pthread_mutex_unlock(&sched_test_fake->lock);
    fake_exec_complete(sched_test_fake, 0);
    fake_exec_wait_batches(sched_test_fake, 2);
    ck_assert_str_eq(sched_test_fake->got[1]->jobs[0]->id, box.ids[0]);
}
END_TEST

/* The per-user gauges of /metrics: users with jobs, most queued first, then by name, at most
 * SCHED_USER_GAUGES_MAX of them, while users_with_jobs counts them all, the one whose job
 * runs included. */
START_TEST(test_user_gauges_keep_the_users_with_most_queued_up_to_the_cap)
{
    sched_test_cfg.max_batch = 1;
    sched_test_fake->slots = 1;
    sched_test_box_t box;
    sched_test_submit_many(&box, "runner", 1, 10);
    ck_assert_int_eq(fake_exec_wait_jobs(sched_test_fake, 1), 1);
    sched_test_submit_many(&box, "heavy", 5, 10);
    sched_test_submit_many(&box, "middle", 3, 10);
    for (int i = 0; i < SCHED_USER_GAUGES_MAX; i++) {
        char owner[16];
        snprintf(owner, sizeof owner, "u%03d", i);
        sched_test_submit_many(&box, owner, 1, 10);
    }
    const long users = SCHED_USER_GAUGES_MAX + 3;
    sched_user_gauge_t rows[SCHED_USER_GAUGES_MAX + 1];
    long seen = 0;
    int n = 0;
    /* The loop publishes every SCHED_USER_GAUGES_MS: wait for a reading with every user. */
    for (int i = 0; i < 500 && seen != users; i++) {
        usleep(10 * 1000);
        n = sched_get_user_gauges(sched_test_sched, rows, SCHED_USER_GAUGES_MAX + 1, &seen);
    }
    ck_assert_int_eq(seen, users);
    ck_assert_int_eq(n, SCHED_USER_GAUGES_MAX);
    ck_assert_str_eq(rows[0].user, "heavy");
    ck_assert_int_eq(rows[0].queued, 5);
    ck_assert_int_eq(rows[0].running, 0);
    ck_assert_str_eq(rows[1].user, "middle");
    ck_assert_int_eq(rows[1].queued, 3);
    ck_assert_str_eq(rows[2].user, "u000");
    ck_assert_str_eq(rows[SCHED_USER_GAUGES_MAX - 1].user, "u097");
    ck_assert_int_eq(rows[SCHED_USER_GAUGES_MAX - 1].queued, 1);
    for (int i = 0; i < n; i++)
        ck_assert_str_ne(rows[i].user, "runner"); /* running only: past the cap */
    /* A caller's smaller array gets the first rows. */
    ck_assert_int_eq(sched_get_user_gauges(sched_test_sched, rows, 2, &seen), 2);
    ck_assert_str_eq(rows[1].user, "middle");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sched_fair");
    TCase *tc = sched_test_tcase("sched", sched_test_start);
    tcase_add_test(tc, test_fair_share_serves_a_small_user_before_a_big_backlog_drains);
    tcase_add_test(tc, test_fair_share_usage_survives_a_restart_decayed_over_the_downtime);
    tcase_add_test(tc, test_a_user_heavy_before_a_restart_is_served_after_a_light_one);
    tcase_add_test(tc, test_fair_share_gives_a_user_of_weight_3_three_times_the_share);
    tcase_add_test(tc, test_a_small_user_waits_for_fair_share_at_a_shrinking_position);
    tcase_add_test(tc, test_a_job_held_by_its_users_running_limit_names_the_limit);
    tcase_add_test(tc, test_batches_keep_each_user_within_the_running_limit);
    tcase_add_test(tc, test_jobs_going_around_a_waiting_one_leave_it_a_running_slot);
    tcase_add_test(tc, test_a_submissions_answer_says_why_its_queued_jobs_wait);
    tcase_add_test(tc, test_jobs_explained_together_agree_with_each_explained_alone);
    tcase_add_test(tc, test_user_gauges_keep_the_users_with_most_queued_up_to_the_cap);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
