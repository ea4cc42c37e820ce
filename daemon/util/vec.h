/* Growth of a malloc'd array that a caller keeps as (pointer, count, capacity). */
#pragma once

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* Makes room in the array *a (*cap elements of elem_size bytes) for need elements, doubling its
 * capacity from first. 0, or -ENOMEM (also when the size would overflow) with the array as it
 * was. */
static inline int vec_grow(void **a, size_t *cap, size_t need, size_t elem_size, size_t first)
{
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : (first ? first : 1);
    while (n < need) {
        if (n > SIZE_MAX / 2) return -ENOMEM;
        n *= 2;
    }
    if (elem_size && n > SIZE_MAX / elem_size) return -ENOMEM;
    void *grown = realloc(*a, n * elem_size);
    if (!grown) return -ENOMEM;
    *a = grown;
    *cap = n;
    return 0;
}
