/* Durability (store.h): with [store] sync_full, the WAL sync thread makes relaxed commits
 * durable and finishes the waits handed to it, and runs the checkpointer that copies the WALs
 * back beside it; without a checkpointer the loop's upkeep checkpoints on the writer's
 * connection. */
#include "store.h"

#include <errno.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

/* Writer's thread, after a commit that left a WAL long: the sync thread copies it back. */
static void on_checkpoint_due(void *arg)
{
    store_t *st = arg;
    if (st->syncer) store_sync_checkpoint_soon(st->syncer);
}

int store_durability_start(store_t *st)
{
    const char *wals[STORE_MAX_SHARDS];
    int n_wals = store_wal_paths(st, wals);
    if (n_wals == 0 || st->syncer) return 0;
    int r = store_checkpointer_open(st, on_checkpoint_due, st, &st->checkpointer);
    if (r < 0)
        log_warn("WAL checkpoints stay on the loop: opening a connection for them failed: %s",
                 strerror(-r));
    r = store_sync_start(wals, n_wals, st->checkpointer, &st->syncer);
    if (r < 0) {
        store_checkpointer_close(st->checkpointer);
        st->checkpointer = NULL;
        return log_error_errno(r, "starting the WAL sync thread failed: %s", strerror(-r));
    }
    return 0;
}

void store_durability_stop(store_t *st)
{
    store_sync_free(st->syncer);
    st->syncer = NULL;
    store_checkpointer_close(st->checkpointer);
    st->checkpointer = NULL;
}

bool store_durable_later(const store_t *st)
{
    return st->syncer != NULL;
}

void store_when_durable(store_t *st, store_durable_wait_t *w)
{
    store_sync_request(st->syncer, w);
}

int store_durable_error(store_t *st)
{
    return st->syncer ? store_sync_error(st->syncer) : 0;
}

int store_upkeep(store_t *st)
{
    if (st->checkpointer) return 0; /* the sync thread checkpoints */
    return store_checkpoint(st);
}

uint64_t store_upkeep_interval_ms(const store_t *st)
{
    return st->upkeep_ms;
}
