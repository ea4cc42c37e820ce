/* An indexed binary min-heap of pointers, as libuv keeps its timers in src/heap-inl.h, but in an
 * array: the element that comes first (by the heap's `before`) is at index 0, the children of
 * index i at 2i+1 and 2i+2. Each element records its own index in a size_t at pos_offset
 * (HEAP_ABSENT while it is in no heap), so that any element leaves in O(log n), not only the
 * first. An element may be in several heaps at once, with a position field for each. The heap
 * owns its array, not the elements. Not thread-safe. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "vec.h"

#define HEAP_ABSENT SIZE_MAX

/* True when x must come out before y. */
typedef bool (*heap_before_fn)(const void *x, const void *y);

typedef struct heap {
    void **a;
    size_t len, cap;
    heap_before_fn before;
    size_t pos_offset;
} heap_t;

/* An empty heap whose elements keep their index at pos_offset (offsetof(type, field)). */
static inline heap_t heap_init(heap_before_fn before, size_t pos_offset)
{
    return (heap_t){.before = before, .pos_offset = pos_offset};
}

/* Frees the array (not the elements); the heap is empty and usable again. */
static inline void heap_clear(heap_t *h)
{
    free(h->a);
    h->a = NULL;
    h->len = h->cap = 0;
}

/* The first element (borrowed), or NULL when the heap is empty. */
static inline void *heap_min(const heap_t *h)
{
    return h->len ? h->a[0] : NULL;
}

/* The element at index i < h->len, for walks of the tree from its root. */
static inline void *heap_at(const heap_t *h, size_t i)
{
    return h->a[i];
}

static inline size_t *heap_pos_(const heap_t *h, void *e)
{
    return (size_t *)(void *)((char *)e + h->pos_offset);
}

/* Whether e is in the heap (its position field says so). */
static inline bool heap_contains(const heap_t *h, void *e)
{
    return *heap_pos_(h, e) != HEAP_ABSENT;
}

static inline void heap_place_(heap_t *h, size_t i, void *e)
{
    h->a[i] = e;
    *heap_pos_(h, e) = i;
}

/* Moves the element at index i up or down until the order holds around it again. */
static inline void heap_sift_(heap_t *h, size_t i)
{
    void *e = h->a[i];
    while (i > 0 && h->before(e, h->a[(i - 1) / 2])) {
        heap_place_(h, i, h->a[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        void *b = e;
        if (l < h->len && h->before(h->a[l], b)) best = l, b = h->a[l];
        if (r < h->len && h->before(h->a[r], b)) best = r, b = h->a[r];
        if (best == i) break;
        heap_place_(h, i, b);
        i = best;
    }
    heap_place_(h, i, e);
}

/* Adds e, which must not be in the heap. 0, or -ENOMEM with the heap as it was. */
static inline int heap_push(heap_t *h, void *e)
{
    int r = vec_grow((void **)&h->a, &h->cap, h->len + 1, sizeof *h->a, 16);
    if (r < 0) return r;
    heap_place_(h, h->len++, e);
    heap_sift_(h, h->len - 1);
    return 0;
}

/* Takes e out of the heap; nothing when it is not in it. */
static inline void heap_remove(heap_t *h, void *e)
{
    size_t i = *heap_pos_(h, e);
    if (i == HEAP_ABSENT) return;
    void *last = h->a[--h->len];
    if (i != h->len) {
        heap_place_(h, i, last);
        heap_sift_(h, i);
    }
    *heap_pos_(h, e) = HEAP_ABSENT;
}
