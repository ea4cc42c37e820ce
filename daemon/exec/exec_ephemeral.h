/* The host-memory copies of ephemeral buffers, for a backend that keeps them there (the CPU
 * backend): each copy is the memory its upload streamed into (exec_cpu.c), taken without a
 * copy, lent to the jobs that read it and freed once it is deleted and no job reads it.
 * Thread-safe. Private to daemon/exec/. */
#pragma once

#include <pthread.h>
#include <stddef.h>

#include "daemon/job/job.h"

typedef struct ephemeral_copy ephemeral_copy_t;

typedef struct ephemeral_table {
    pthread_mutex_t lock;
    ephemeral_copy_t **copies;
    size_t n, cap;
} ephemeral_table_t;

void ephemeral_table_init(ephemeral_table_t *t);
/* Frees every copy, read or not: the backend's workers are gone. */
void ephemeral_table_destroy(ephemeral_table_t *t);
/* Takes data (freed on failure) as the copy of buffer id. 0, or -ENOMEM. */
int ephemeral_table_add(ephemeral_table_t *t, const char *id, void *data);
/* The bytes of buffer id, lent until ephemeral_table_release(); NULL when there is no copy
 * (never was, or deleted). */
const void *ephemeral_table_acquire(ephemeral_table_t *t, const char *id);
void ephemeral_table_release(ephemeral_table_t *t, const char *id);
/* Marks buffer id's copy deleted: freed now, or by the last release. */
void ephemeral_table_delete(ephemeral_table_t *t, const char *id);
