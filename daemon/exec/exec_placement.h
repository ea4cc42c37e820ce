/* Which device a batch goes to: a pure rule over what the backend knows of its devices, so
 * that it is tested without one. Private to daemon/exec/ (and its unit test). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* What the rule knows of a device, and of the batch on it. */
typedef struct placement_device {
    int device;     /* its ordinal */
    bool serves;    /* it takes work now (set up, its context not lost) */
    int free_slots; /* batches it can still accept */
    int load;       /* batches it holds: accepted and not yet started, or running */
    /* Its memory pool: its bound (0: none), the room left now (the bound less what running
     * and accepted batches and resident buffers hold), and what the batch would take there
     * (its inputs resident on this device take none). */
    uint64_t cap, room, need;
} placement_device_t;

/* What the rule knows of a batch; all its jobs share both (the scheduler's batch key includes
 * the pin, and resident inputs decide the preference). */
typedef struct placement_batch {
    int pin;       /* the device its jobs are pinned to, or -1 */
    int preferred; /* the device its resident inputs live on, or -1 */
} placement_batch_t;

/* The index in devs of the device batch b goes to; -EAGAIN when none can take it now (no free
 * slot, or no room in its pool: placement_waits_for_memory tells which); -E2BIG when its need
 * passes the bound of every device it may run on, so that it never fits.
 * A pinned batch goes only to its device. A batch with resident inputs goes only to their
 * device while that device serves; when it does not, anywhere. Among the devices left, the one
 * with a free slot and room for the batch and the least load wins; the first of equals. A
 * device that does not serve is never chosen. */
int placement_pick(const placement_device_t *devs, int n, const placement_batch_t *b);
/* After placement_pick answered -EAGAIN: whether a device the batch may run on has a free
 * slot but no room for it, so that it waits for memory rather than for a slot. */
bool placement_waits_for_memory(const placement_device_t *devs, int n, const placement_batch_t *b);
