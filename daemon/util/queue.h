/* An intrusive doubly-linked circular list, as libuv's src/queue.h: the element embeds a
 * queue_t node, and the list is a queue_t head that is its own neighbour when empty. Any node
 * leaves in O(1), wherever it is; the list owns nothing. Not thread-safe. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct queue {
    struct queue *next, *prev;
} queue_t;

/* The element of type `type` whose member `field` is the node q. */
#define queue_data(q, type, field) ((type *)(void *)((char *)(q)-offsetof(type, field)))

/* Walks the list h, q naming each node in turn; the body must not remove q. */
#define queue_foreach(q, h) for ((q) = (h)->next; (q) != (h); (q) = (q)->next)

/* Makes q an empty list (or a node in none). */
static inline void queue_init(queue_t *q)
{
    q->next = q->prev = q;
}

static inline bool queue_empty(const queue_t *h)
{
    return h->next == h;
}

/* The first node of the list h, or NULL when it is empty. */
static inline queue_t *queue_head(const queue_t *h)
{
    return queue_empty(h) ? NULL : h->next;
}

/* The node after q in the list h, or NULL when q is the last. */
static inline queue_t *queue_next(const queue_t *h, const queue_t *q)
{
    return q->next == h ? NULL : q->next;
}

/* Appends the node q, which is in no list, to the list h. */
static inline void queue_insert_tail(queue_t *h, queue_t *q)
{
    q->next = h;
    q->prev = h->prev;
    h->prev->next = q;
    h->prev = q;
}

/* Unlinks the node q from its list; q is then a list of its own (empty). */
static inline void queue_remove(queue_t *q)
{
    q->prev->next = q->next;
    q->next->prev = q->prev;
    queue_init(q);
}

/* Moves every node of the list from to the end of the list to; from is left empty. */
static inline void queue_move(queue_t *from, queue_t *to)
{
    if (queue_empty(from)) return;
    from->next->prev = to->prev;
    to->prev->next = from->next;
    from->prev->next = to;
    to->prev = from->prev;
    queue_init(from);
}

/* Takes the first node out of the list h; NULL when it is empty. */
static inline queue_t *queue_pop(queue_t *h)
{
    queue_t *q = queue_head(h);
    if (q) queue_remove(q);
    return q;
}
