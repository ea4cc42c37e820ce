/* The placement rule; see exec_placement.h. */
#include "exec_placement.h"

int placement_pick(const placement_device_t *devs, int n, const placement_batch_t *b)
{
    int pin = b->pin;
    /* Resident inputs hold their jobs to their device while it serves; only a device that does
     * not (lost, failed, or not served after a restart) lets them run elsewhere. */
    if (pin < 0 && b->preferred >= 0)
        for (int d = 0; d < n; d++)
            if (devs[d].device == b->preferred && devs[d].serves) pin = b->preferred;
    int best = -1;
    for (int d = 0; d < n; d++) {
        if (!devs[d].serves || devs[d].free_slots <= 0 || (pin >= 0 && devs[d].device != pin))
            continue;
        if (best < 0 || devs[d].load < devs[best].load) best = d;
    }
    return best;
}
