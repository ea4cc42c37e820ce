/* Host-memory copies of ephemeral buffers; see exec_ephemeral.h. */
#include "exec_ephemeral.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/util/vec.h"

struct ephemeral_copy {
    char id[ID_SIZE];
    void *data; /* owned */
    int refs;   /* jobs reading it now */
    bool deleted;
};

void ephemeral_table_init(ephemeral_table_t *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
}

void ephemeral_table_destroy(ephemeral_table_t *t)
{
    for (size_t k = 0; k < t->n; k++) {
        free(t->copies[k]->data);
        free(t->copies[k]);
    }
    free(t->copies);
    pthread_mutex_destroy(&t->lock);
}

int ephemeral_table_add(ephemeral_table_t *t, const char *id, void *data)
{
    ephemeral_copy_t *c = calloc(1, sizeof *c);
    if (!c) {
        free(data);
        return -ENOMEM;
    }
    memcpy(c->id, id, ID_SIZE);
    c->data = data;
    pthread_mutex_lock(&t->lock);
    int r = vec_grow((void **)&t->copies, &t->cap, t->n + 1, sizeof *t->copies, 8);
    if (r == 0) t->copies[t->n++] = c;
    pthread_mutex_unlock(&t->lock);
    if (r < 0) {
        free(data);
        free(c);
    }
    return r;
}

/* The copy of buffer id, deleted or not; NULL when none. Caller holds the lock. */
static size_t find_locked(const ephemeral_table_t *t, const char *id)
{
    for (size_t k = 0; k < t->n; k++)
        if (strncmp(t->copies[k]->id, id, ID_SIZE) == 0) return k;
    return t->n;
}

/* Frees copy k when it is deleted and unread. Caller holds the lock. */
static void reap_locked(ephemeral_table_t *t, size_t k)
{
    ephemeral_copy_t *c = t->copies[k];
    if (!c->deleted || c->refs > 0) return;
    t->copies[k] = t->copies[--t->n];
    free(c->data);
    free(c);
}

const void *ephemeral_table_acquire(ephemeral_table_t *t, const char *id)
{
    const void *data = NULL;
    pthread_mutex_lock(&t->lock);
    size_t k = find_locked(t, id);
    if (k < t->n && !t->copies[k]->deleted) {
        t->copies[k]->refs++;
        data = t->copies[k]->data;
    }
    pthread_mutex_unlock(&t->lock);
    return data;
}

void ephemeral_table_release(ephemeral_table_t *t, const char *id)
{
    pthread_mutex_lock(&t->lock);
    size_t k = find_locked(t, id);
    if (k < t->n) {
        t->copies[k]->refs--;
        reap_locked(t, k);
    }
    pthread_mutex_unlock(&t->lock);
}

void ephemeral_table_delete(ephemeral_table_t *t, const char *id)
{
    pthread_mutex_lock(&t->lock);
    size_t k = find_locked(t, id);
    if (k < t->n) {
        t->copies[k]->deleted = true;
        reap_locked(t, k);
    }
    pthread_mutex_unlock(&t->lock);
}
