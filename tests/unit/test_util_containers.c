/* The containers of daemon/util/: the indexed heap (order, removal from anywhere, growth), the
 * intrusive queue (order, removal from the middle, moving a whole list) and vec_grow (growth,
 * and its refusal of sizes that overflow). */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/util/heap.h"
#include "daemon/util/queue.h"
#include "daemon/util/vec.h"

/* ------------------------------------------------------------------------------ heap */

typedef struct item {
    int key;
    size_t pos;
    queue_t node;
} item_t;

static bool item_before(const void *x, const void *y)
{
    return ((const item_t *)x)->key < ((const item_t *)y)->key;
}

/* Pushes n items with keys in a scrambled order (n must not divide by 7). */
static item_t *heap_fill(heap_t *h, int n)
{
    item_t *items = calloc((size_t)n, sizeof *items);
    ck_assert_ptr_nonnull(items);
    for (int i = 0; i < n; i++) {
        items[i].key = (i * 7) % n;
        items[i].pos = HEAP_ABSENT;
        ck_assert_int_eq(heap_push(h, &items[i]), 0);
        ck_assert(heap_contains(h, &items[i]));
    }
    return items;
}

/* Pops everything, checking that keys come out in order and that every position field is
 * cleared; returns how many came out. */
static int heap_drain_in_order(heap_t *h)
{
    int n = 0, last = -1;
    for (item_t *it; (it = heap_min(h)); n++) {
        ck_assert_int_gt(it->key, last);
        last = it->key;
        heap_remove(h, it);
        ck_assert(!heap_contains(h, it));
    }
    return n;
}

START_TEST(test_heap_pops_in_order_and_grows)
{
    heap_t h = heap_init(item_before, offsetof(item_t, pos));
    ck_assert_ptr_null(heap_min(&h));
    item_t *items = heap_fill(&h, 1000); /* far past the first capacity: the array grows */
    ck_assert_uint_eq(h.len, 1000);
    ck_assert_uint_ge(h.cap, 1000);
    ck_assert_int_eq(((item_t *)heap_min(&h))->key, 0);
    ck_assert_int_eq(heap_drain_in_order(&h), 1000);
    heap_clear(&h);
    free(items);
}
END_TEST

START_TEST(test_heap_removes_from_the_middle)
{
    heap_t h = heap_init(item_before, offsetof(item_t, pos));
    enum { N = 101 };
    item_t *items = heap_fill(&h, N);
    /* Remove every item whose key is odd, wherever it sits in the tree. */
    for (int i = 0; i < N; i++)
        if (items[i].key % 2) heap_remove(&h, &items[i]);
    heap_remove(&h, &items[1]); /* already out: nothing happens */
    for (int i = 0; i < N; i++)
        ck_assert(heap_contains(&h, &items[i]) == (items[i].key % 2 == 0));
    for (size_t i = 0; i < h.len; i++)
        ck_assert_uint_eq(((item_t *)heap_at(&h, i))->pos, i);
    ck_assert_int_eq(heap_drain_in_order(&h), (N + 1) / 2);
    heap_clear(&h);
    free(items);
}
END_TEST

/* ----------------------------------------------------------------------------- queue */

/* The keys of the list h, in order, into keys; returns how many. */
static int queue_keys(const queue_t *h, int *keys)
{
    int n = 0;
    for (queue_t *q = queue_head(h); q; q = queue_next(h, q))
        keys[n++] = queue_data(q, item_t, node)->key;
    return n;
}

START_TEST(test_queue_keeps_order_and_removes_from_the_middle)
{
    item_t items[5];
    queue_t h;
    queue_init(&h);
    ck_assert(queue_empty(&h));
    ck_assert_ptr_null(queue_head(&h));
    for (int i = 0; i < 5; i++) {
        items[i].key = i;
        queue_insert_tail(&h, &items[i].node);
    }
    queue_remove(&items[2].node);
    ck_assert(queue_empty(&items[2].node)); /* a removed node is a list of its own */
    queue_remove(&items[4].node);
    int keys[5];
    ck_assert_int_eq(queue_keys(&h, keys), 3);
    ck_assert_int_eq(keys[0], 0);
    ck_assert_int_eq(keys[1], 1);
    ck_assert_int_eq(keys[2], 3);
    ck_assert_ptr_eq(queue_pop(&h), &items[0].node);
    ck_assert_ptr_eq(queue_pop(&h), &items[1].node);
    ck_assert_ptr_eq(queue_pop(&h), &items[3].node);
    ck_assert_ptr_null(queue_pop(&h));
}
END_TEST

START_TEST(test_queue_move_appends_a_whole_list)
{
    item_t items[4];
    queue_t a, b;
    queue_init(&a);
    queue_init(&b);
    queue_move(&a, &b); /* an empty list moves nothing */
    ck_assert(queue_empty(&b));
    for (int i = 0; i < 4; i++) {
        items[i].key = i;
        queue_insert_tail(i < 2 ? &b : &a, &items[i].node);
    }
    queue_move(&a, &b);
    ck_assert(queue_empty(&a));
    int keys[4];
    ck_assert_int_eq(queue_keys(&b, keys), 4);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(keys[i], i);
}
END_TEST

/* ------------------------------------------------------------------------------- vec */

START_TEST(test_vec_grow_doubles_and_keeps_contents)
{
    int *a = NULL;
    size_t cap = 0;
    ck_assert_int_eq(vec_grow((void **)&a, &cap, 1, sizeof *a, 4), 0);
    ck_assert_uint_eq(cap, 4);
    for (int i = 0; i < 4; i++)
        a[i] = i;
    ck_assert_int_eq(vec_grow((void **)&a, &cap, 3, sizeof *a, 4), 0); /* room already */
    ck_assert_uint_eq(cap, 4);
    ck_assert_int_eq(vec_grow((void **)&a, &cap, 9, sizeof *a, 4), 0);
    ck_assert_uint_eq(cap, 16);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(a[i], i);
    free(a);
}
END_TEST

START_TEST(test_vec_grow_refuses_sizes_that_overflow)
{
    int *a = NULL;
    size_t cap = 0;
    ck_assert_int_eq(vec_grow((void **)&a, &cap, 4, sizeof *a, 4), 0);
    int *before = a;
    /* The count doubles past SIZE_MAX: refused, the array as it was. */
    ck_assert_int_eq(vec_grow((void **)&a, &cap, SIZE_MAX, sizeof *a, 4), -ENOMEM);
    ck_assert_ptr_eq(a, before);
    ck_assert_uint_eq(cap, 4);
    /* The count fits, its size in bytes does not. */
    ck_assert_int_eq(vec_grow((void **)&a, &cap, SIZE_MAX / 2, sizeof *a, 4), -ENOMEM);
    ck_assert_ptr_eq(a, before);
    ck_assert_uint_eq(cap, 4);
    free(a);
}
END_TEST

static Suite *containers_suite(void)
{
    Suite *s = suite_create("util_containers");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_heap_pops_in_order_and_grows);
    tcase_add_test(tc, test_heap_removes_from_the_middle);
    tcase_add_test(tc, test_queue_keeps_order_and_removes_from_the_middle);
    tcase_add_test(tc, test_queue_move_appends_a_whole_list);
    tcase_add_test(tc, test_vec_grow_doubles_and_keeps_contents);
    tcase_add_test(tc, test_vec_grow_refuses_sizes_that_overflow);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(containers_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
