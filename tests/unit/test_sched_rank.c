/* The count of a user's queued entries before one (sched_rank.c) against a count by brute
 * force, over random arrivals at mixed priorities, departures from anywhere in the queue,
 * re-queues of departed entries with their old arrival, and a level emptied enough to be
 * compacted. */
#include <check.h>
#include <stdlib.h>

#include "daemon/sched/sched_internal.h"

#define MAX_ENTRIES 6000

static entry_t entries[MAX_ENTRIES];
static bool queued[MAX_ENTRIES];
static size_t n_entries;

/* Every queued entry's rank_ahead against the entries queued before it by entry_before. */
static void assert_ranks(const user_t *u)
{
    for (size_t i = 0; i < n_entries; i++) {
        if (!queued[i]) continue;
        long expect = 0;
        for (size_t j = 0; j < n_entries; j++)
            expect += queued[j] && entry_before(&entries[j], &entries[i]);
        ck_assert_msg(rank_ahead(u, &entries[i]) == expect,
                      "entry %zu (priority %d, seq %llu): %ld ahead, expected %ld", i,
                      entries[i].priority, (unsigned long long)entries[i].seq,
                      rank_ahead(u, &entries[i]), expect);
    }
}

static void add(user_t *u, size_t i)
{
    ck_assert_int_eq(rank_add(u, &entries[i]), 0);
    queued[i] = true;
}

static void remove_at(user_t *u, size_t i)
{
    rank_remove(u, &entries[i]);
    queued[i] = false;
}

/* A new entry at priority: the highest seq yet. */
static size_t arrive(user_t *u, int priority)
{
    size_t i = n_entries++;
    entries[i] = (entry_t){.seq = i + 1, .priority = priority};
    add(u, i);
    return i;
}

START_TEST(test_the_count_ahead_matches_a_count_by_brute_force)
{
    static const int priorities[] = {0, 0, 0, 5, -3, 9};
    user_t u = {0};
    n_entries = 0;
    srand(7);
    for (int step = 0; step < 1500; step++) {
        int op = rand() % 10;
        size_t pick = n_entries ? (size_t)rand() % n_entries : 0;
        if (op < 5 || n_entries == 0)
            arrive(&u, priorities[rand() % 6]);
        else if (op < 8 && queued[pick])
            remove_at(&u, pick);
        else if (!queued[pick])
            add(&u, pick); /* a re-queue: back with its old seq */
        if (step % 50 == 0) assert_ranks(&u);
    }
    assert_ranks(&u);
    rank_free(&u);
}
END_TEST

START_TEST(test_a_level_left_mostly_empty_is_compacted_and_still_counts)
{
    user_t u = {0};
    n_entries = 0;
    for (int i = 0; i < 3000; i++)
        arrive(&u, 1);
    arrive(&u, 2);
    for (size_t i = 0; i < 2900; i++)
        remove_at(&u, i);
    ck_assert_uint_lt(u.levels[1].n, 3000); /* levels: priority 2, then 1 */
    ck_assert_uint_eq(u.levels[1].live, 100);
    assert_ranks(&u);
    add(&u, 5); /* a re-queue into the compacted level */
    arrive(&u, 1);
    assert_ranks(&u);
    for (size_t i = 0; i < n_entries; i++)
        if (queued[i]) remove_at(&u, i);
    ck_assert_uint_eq(u.n_levels, 0);
    rank_free(&u);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sched_rank");
    TCase *tc = tcase_create("rank");
    tcase_add_test(tc, test_the_count_ahead_matches_a_count_by_brute_force);
    tcase_add_test(tc, test_a_level_left_mostly_empty_is_compacted_and_still_counts);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
