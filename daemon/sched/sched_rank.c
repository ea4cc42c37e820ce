/* How many of a user's queued entries come before one (sched_explain's position), in
 * O(log n) rather than a pass over the user's queue. A user's queue is served by priority,
 * then by arrival (seq): each priority of the user's queue is a level, an array of slots in
 * seq order with a Fenwick tree over which slots still hold an entry. A new entry has the
 * highest seq yet and takes a new slot at its level's end; an entry leaves its slot empty.
 * The rare entry that comes back with an older seq (a re-queue), and a level grown mostly
 * empty, rebuild their level in one pass. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sched_internal.h"

/* A level holds this many empty slots past twice its entries before it is compacted. */
#define RANK_SLACK 1024

static size_t lowbit(size_t i)
{
    return i & (~i + 1);
}

/* The count of entries in slots [0, n). */
static long level_prefix(const rank_level_t *l, size_t n)
{
    long sum = 0;
    for (size_t i = n; i > 0; i -= lowbit(i))
        sum += l->bit[i - 1];
    return sum;
}

/* Adds d at slot (0-based) of l's tree. */
static void level_update(rank_level_t *l, size_t slot, int d)
{
    for (size_t i = slot + 1; i <= l->n; i += lowbit(i))
        l->bit[i - 1] += d;
}

/* Makes room for n slots. */
static int level_reserve(rank_level_t *l, size_t n)
{
    if (n <= l->cap) return 0;
    size_t cap = l->cap ? l->cap : 64;
    while (cap < n)
        cap *= 2;
    entry_t **slots = realloc(l->slots, cap * sizeof *slots);
    if (!slots) return -ENOMEM;
    l->slots = slots;
    int32_t *bit = realloc(l->bit, cap * sizeof *bit);
    if (!bit) return -ENOMEM;
    l->bit = bit;
    l->cap = cap;
    return 0;
}

/* Lays out l's entries again, with extra (when not NULL) in its place by seq, in slots
 * without holes, and builds the tree over them in one pass. */
static int level_rebuild(rank_level_t *l, entry_t *extra)
{
    int r = level_reserve(l, l->live + 1);
    if (r < 0) return r;
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->slots[i]) l->slots[n++] = l->slots[i];
    if (extra) {
        size_t at = n;
        while (at > 0 && l->slots[at - 1]->seq > extra->seq)
            at--;
        memmove(&l->slots[at + 1], &l->slots[at], (n - at) * sizeof *l->slots);
        l->slots[at] = extra;
        n++;
    }
    l->n = n;
    for (size_t i = 0; i < n; i++) {
        l->slots[i]->rank_slot = (uint32_t)i;
        l->bit[i] = 1;
    }
    for (size_t i = 1; i <= n; i++) {
        size_t up = i + lowbit(i);
        if (up <= n) l->bit[up - 1] += l->bit[i - 1];
    }
    l->live = n;
    l->max_seq = n ? l->slots[n - 1]->seq : 0;
    return 0;
}

/* u's level of priority, made when make is set; NULL when none (or out of memory). */
static rank_level_t *level_of(user_t *u, int priority, bool make)
{
    size_t i = 0;
    while (i < u->n_levels && u->levels[i].priority > priority)
        i++;
    if (i < u->n_levels && u->levels[i].priority == priority) return &u->levels[i];
    if (!make) return NULL;
    rank_level_t *levels = realloc(u->levels, (u->n_levels + 1) * sizeof *levels);
    if (!levels) return NULL;
    u->levels = levels;
    memmove(&levels[i + 1], &levels[i], (u->n_levels - i) * sizeof *levels);
    levels[i] = (rank_level_t){.priority = priority};
    u->n_levels++;
    return &levels[i];
}

int rank_add(user_t *u, entry_t *e)
{
    rank_level_t *l = level_of(u, e->priority, true);
    if (!l) return -ENOMEM;
    if (l->n > 0 && e->seq <= l->max_seq) return level_rebuild(l, e);
    int r = level_reserve(l, l->n + 1);
    if (r < 0) return r;
    /* Slot i's node sums the slots (i - lowbit(i), i]: those before it are summed already. */
    size_t i = l->n + 1;
    l->slots[i - 1] = e;
    l->bit[i - 1] = (int32_t)(1 + level_prefix(l, i - 1) - level_prefix(l, i - lowbit(i)));
    l->n = i;
    l->live++;
    l->max_seq = e->seq;
    e->rank_slot = (uint32_t)(i - 1);
    return 0;
}

void rank_remove(user_t *u, entry_t *e)
{
    rank_level_t *l = level_of(u, e->priority, false);
    if (!l || e->rank_slot >= l->n || l->slots[e->rank_slot] != e) return;
    l->slots[e->rank_slot] = NULL;
    level_update(l, e->rank_slot, -1);
    if (--l->live == 0) {
        free(l->slots);
        free(l->bit);
        size_t i = (size_t)(l - u->levels);
        memmove(l, l + 1, (u->n_levels - i - 1) * sizeof *l);
        u->n_levels--;
    } else if (l->n > 2 * l->live + RANK_SLACK) {
        level_rebuild(l, NULL); /* cannot fail: no more room is needed */
    }
}

long rank_ahead(const user_t *u, const entry_t *e)
{
    long n = 0;
    for (size_t i = 0; i < u->n_levels; i++) {
        const rank_level_t *l = &u->levels[i];
        if (l->priority > e->priority) n += (long)l->live;
        if (l->priority == e->priority && e->rank_slot < l->n && l->slots[e->rank_slot] == e)
            n += level_prefix(l, e->rank_slot);
    }
    return n;
}

void rank_free(user_t *u)
{
    for (size_t i = 0; i < u->n_levels; i++) {
        free(u->levels[i].slots);
        free(u->levels[i].bit);
    }
    free(u->levels);
    u->levels = NULL;
    u->n_levels = 0;
}
