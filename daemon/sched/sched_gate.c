/* The gate of answers handed over before their jobs' ends are committed (sched_gate_t in
 * scheduler.h): a reference count, and a flag the loop sets once the commit is over. */
#include <pthread.h>
#include <stdlib.h>

#include "sched_internal.h"

struct sched_gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int refs;
    bool open;
};

sched_gate_t *sched_gate_new(void)
{
    sched_gate_t *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    g->refs = 1;
    return g;
}

sched_gate_t *sched_gate_hold(sched_gate_t *gate)
{
    pthread_mutex_lock(&gate->lock);
    gate->refs++;
    pthread_mutex_unlock(&gate->lock);
    return gate;
}

/* Drops a reference with the lock held, which it releases; the last one frees the gate. */
static void gate_unref_locked(sched_gate_t *gate)
{
    bool last = --gate->refs == 0;
    pthread_mutex_unlock(&gate->lock);
    if (!last) return;
    pthread_cond_destroy(&gate->cond);
    pthread_mutex_destroy(&gate->lock);
    free(gate);
}

void sched_gate_drop(sched_gate_t *gate)
{
    if (!gate) return;
    pthread_mutex_lock(&gate->lock);
    gate_unref_locked(gate);
}

void sched_gate_pass(sched_gate_t *gate)
{
    if (!gate) return;
    pthread_mutex_lock(&gate->lock);
    while (!gate->open)
        pthread_cond_wait(&gate->cond, &gate->lock);
    gate_unref_locked(gate);
}

void sched_gate_open(sched_gate_t *gate)
{
    if (!gate) return;
    pthread_mutex_lock(&gate->lock);
    gate->open = true;
    pthread_cond_broadcast(&gate->cond);
    gate_unref_locked(gate);
}
