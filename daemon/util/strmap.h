/* A string-keyed hash map of pointers (chained, growing), for the scheduler's indexes: job id →
 * entry, owner → user, batch key → queue. Not thread-safe. Keys are copied. */
#pragma once

#include <stddef.h>

typedef struct strmap strmap_t;

int strmap_new(strmap_t **ret);
/* Frees the map (not the values). Accepts NULL. */
void strmap_free(strmap_t *m);
void *strmap_get(const strmap_t *m, const char *key);
/* Inserts or replaces. 0 or -ENOMEM. */
int strmap_put(strmap_t *m, const char *key, void *value);
/* Removes key; returns its value, or NULL. */
void *strmap_remove(strmap_t *m, const char *key);
/* Calls fn for every entry, in no order; fn must not change the map. */
void strmap_foreach(const strmap_t *m, void (*fn)(const char *key, void *value, void *ud),
                    void *ud);
