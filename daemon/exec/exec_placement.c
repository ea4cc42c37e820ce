/* The placement rule; see exec_placement.h. */
#include "exec_placement.h"

#include <errno.h>

/* The device the batch is held to (pinned, or where its resident inputs live while that device
 * serves), or -1 for any. */
static int held_to(const placement_device_t *devs, int n, const placement_batch_t *b)
{
    if (b->pin >= 0) return b->pin;
    /* Resident inputs hold their jobs to their device while it serves; only a device that does
     * not (lost, failed, or not served after a restart) lets them run elsewhere. */
    for (int d = 0; b->preferred >= 0 && d < n; d++)
        if (devs[d].device == b->preferred && devs[d].serves) return b->preferred;
    return -1;
}

static bool eligible(const placement_device_t *dev, int pin)
{
    return dev->serves && (pin < 0 || dev->device == pin);
}

static bool has_room(const placement_device_t *dev)
{
    return dev->cap == 0 || dev->need <= dev->room;
}

int placement_pick(const placement_device_t *devs, int n, const placement_batch_t *b)
{
    int pin = held_to(devs, n, b);
    int best = -1;
    bool any = false, could_fit = false;
    for (int d = 0; d < n; d++) {
        if (!eligible(&devs[d], pin)) continue;
        any = true;
        could_fit |= devs[d].cap == 0 || devs[d].need <= devs[d].cap;
        if (devs[d].free_slots <= 0 || !has_room(&devs[d])) continue;
        if (best < 0 || devs[d].load < devs[best].load) best = d;
    }
    if (best >= 0) return best;
    return any && !could_fit ? -E2BIG : -EAGAIN;
}

bool placement_waits_for_memory(const placement_device_t *devs, int n, const placement_batch_t *b)
{
    int pin = held_to(devs, n, b);
    for (int d = 0; d < n; d++)
        if (eligible(&devs[d], pin) && devs[d].free_slots > 0 && !has_room(&devs[d])) return true;
    return false;
}
