#include "strmap.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct node {
    struct node *next;
    void *value;
    uint64_t hash;
    char key[];
} node_t;

struct strmap {
    node_t **buckets;
    size_t n_buckets; /* a power of two */
    size_t size;
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

int strmap_new(strmap_t **ret)
{
    strmap_t *m = calloc(1, sizeof *m);
    if (!m) return -ENOMEM;
    m->n_buckets = 64;
    m->buckets = calloc(m->n_buckets, sizeof *m->buckets);
    if (!m->buckets) {
        free(m);
        return -ENOMEM;
    }
    *ret = m;
    return 0;
}

void strmap_free(strmap_t *m)
{
    if (!m) return;
    for (size_t b = 0; b < m->n_buckets; b++)
        for (node_t *n = m->buckets[b], *next; n; n = next) {
            next = n->next;
            free(n);
        }
    free(m->buckets);
    free(m);
}

static node_t **find_slot(const strmap_t *m, const char *key, uint64_t h)
{
    node_t **p = &m->buckets[h & (m->n_buckets - 1)];
    while (*p && ((*p)->hash != h || strcmp((*p)->key, key) != 0))
        p = &(*p)->next;
    return p;
}

void *strmap_get(const strmap_t *m, const char *key)
{
    node_t *n = *find_slot(m, key, hash_str(key));
    return n ? n->value : NULL;
}

static void grow(strmap_t *m)
{
    size_t nb = m->n_buckets * 2;
    node_t **buckets = calloc(nb, sizeof *buckets);
    if (!buckets) return; /* keep working with longer chains */
    for (size_t b = 0; b < m->n_buckets; b++)
        for (node_t *n = m->buckets[b], *next; n; n = next) {
            next = n->next;
            n->next = buckets[n->hash & (nb - 1)];
            buckets[n->hash & (nb - 1)] = n;
        }
    free(m->buckets);
    m->buckets = buckets;
    m->n_buckets = nb;
}

int strmap_put(strmap_t *m, const char *key, void *value)
{
    uint64_t h = hash_str(key);
    node_t **p = find_slot(m, key, h);
    if (*p) {
        (*p)->value = value;
        return 0;
    }
    size_t len = strlen(key);
    node_t *n = malloc(sizeof *n + len + 1);
    if (!n) return -ENOMEM;
    memcpy(n->key, key, len + 1);
    n->hash = h;
    n->value = value;
    n->next = NULL;
    *p = n;
    if (++m->size > m->n_buckets) grow(m);
    return 0;
}

void *strmap_remove(strmap_t *m, const char *key)
{
    node_t **p = find_slot(m, key, hash_str(key));
    node_t *n = *p;
    if (!n) return NULL;
    void *v = n->value;
    *p = n->next;
    free(n);
    m->size--;
    return v;
}

void strmap_foreach(const strmap_t *m, void (*fn)(const char *key, void *value, void *ud), void *ud)
{
    for (size_t b = 0; b < m->n_buckets; b++)
        for (node_t *n = m->buckets[b]; n; n = n->next)
            fn(n->key, n->value, ud);
}
