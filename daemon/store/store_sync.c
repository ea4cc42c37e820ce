/* The WAL sync thread: fdatasyncs the shards' WAL files behind the relaxed commits and answers
 * the items that wait for them (store.h says why). */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/util/log.h"
#include "store_internal.h"

/* A shard's WAL file. */
typedef struct wal {
    char path[PATH_MAX];
    int fd; /* open while the file exists; sync thread only */
} wal_t;

struct store_sync {
    wal_t wals[STORE_MAX_SHARDS];
    int n_wals;
    store_checkpointer_t *cp;
    atomic_int err; /* the first failed sync's; written by the sync thread only */
    pthread_t thread;
    pthread_mutex_t lock; /* guards what follows */
    pthread_cond_t cond;
    store_sync_item_t *head, *tail; /* waiting for the next sync */
    bool checkpoint_due;
    bool stopping;
};

/* The directory entry of a file just opened: so that a power loss keeps the file's name. */
static int sync_parent_dir(const char *path)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    return store_fsync_dir(dirname(dir));
}

static int sync_wal(wal_t *w)
{
    struct stat sb;
    /* SQLite deletes the WAL only when its last connection closes; a new one is opened anew. */
    if (w->fd >= 0 && (fstat(w->fd, &sb) < 0 || sb.st_nlink == 0)) {
        close(w->fd);
        w->fd = -1;
    }
    if (w->fd < 0) {
        w->fd = open(w->path, O_RDONLY | O_CLOEXEC);
        /* SQLite keeps the WAL while a connection is open: a missing one was removed behind
         * its back, and what it held cannot be synced through a name any more. */
        if (w->fd < 0) return -errno;
        int r = sync_parent_dir(w->path);
        if (r < 0) return r;
    }
    return fdatasync(w->fd) < 0 ? -errno : 0;
}

static void *sync_thread(void *arg)
{
    store_sync_t *sy = arg;
    prctl(PR_SET_NAME, "gj-sync");
    pthread_mutex_lock(&sy->lock);
    for (;;) {
        while (!sy->head && !sy->checkpoint_due && !sy->stopping)
            pthread_cond_wait(&sy->cond, &sy->lock);
        store_sync_item_t *item = sy->head;
        if (!item && !sy->checkpoint_due) break;
        sy->head = sy->tail = NULL;
        sy->checkpoint_due = false;
        pthread_mutex_unlock(&sy->lock);
        unsigned wals = 0;
        for (store_sync_item_t *i = item; i; i = i->next)
            wals |= i->scope ? i->scope : ~0u;
        int r = atomic_load(&sy->err);
        for (int k = 0; r == 0 && k < sy->n_wals; k++)
            if ((wals & (1u << k)) && (r = sync_wal(&sy->wals[k])) < 0) {
                atomic_store(&sy->err, r);
                log_error("store: syncing '%s' failed: %s; accepted jobs are answered with an "
                          "error from now on",
                          sy->wals[k].path, strerror(-r));
            }
        while (item) {
            store_sync_item_t *next = item->next;
            item->done(item, r);
            item = next;
        }
        int c = sy->cp && r == 0 ? store_checkpointer_run(sy->cp) : 0;
        if (c < 0) log_warn("store: WAL checkpoint failed: %s", strerror(-c));
        pthread_mutex_lock(&sy->lock);
    }
    pthread_mutex_unlock(&sy->lock);
    return NULL;
}

int store_sync_start(const char *const *wal_paths, int n_wals, store_checkpointer_t *cp,
                     store_sync_t **ret)
{
    if (n_wals < 1 || n_wals > STORE_MAX_SHARDS) return -EINVAL;
    store_sync_t *sy = calloc(1, sizeof *sy);
    if (!sy) return -ENOMEM;
    for (int k = 0; k < n_wals; k++) {
        wal_t *w = &sy->wals[k];
        w->fd = -1;
        if (snprintf(w->path, sizeof w->path, "%s", wal_paths[k]) >= (int)sizeof w->path) {
            free(sy);
            return -ENAMETOOLONG;
        }
    }
    sy->n_wals = n_wals;
    sy->cp = cp;
    pthread_mutex_init(&sy->lock, NULL);
    pthread_cond_init(&sy->cond, NULL);
    int r = pthread_create(&sy->thread, NULL, sync_thread, sy);
    if (r != 0) {
        pthread_mutex_destroy(&sy->lock);
        pthread_cond_destroy(&sy->cond);
        free(sy);
        return -r;
    }
    *ret = sy;
    return 0;
}

void store_sync_request(store_sync_t *sy, store_sync_item_t *item)
{
    item->next = NULL;
    pthread_mutex_lock(&sy->lock);
    if (sy->tail)
        sy->tail->next = item;
    else
        sy->head = item;
    sy->tail = item;
    pthread_cond_signal(&sy->cond);
    pthread_mutex_unlock(&sy->lock);
}

void store_sync_checkpoint_soon(store_sync_t *sy)
{
    pthread_mutex_lock(&sy->lock);
    sy->checkpoint_due = true;
    pthread_cond_signal(&sy->cond);
    pthread_mutex_unlock(&sy->lock);
}

int store_sync_error(store_sync_t *sy)
{
    return atomic_load(&sy->err);
}

void store_sync_free(store_sync_t *sy)
{
    if (!sy) return;
    pthread_mutex_lock(&sy->lock);
    sy->stopping = true;
    pthread_cond_signal(&sy->cond);
    pthread_mutex_unlock(&sy->lock);
    pthread_join(sy->thread, NULL);
    for (int k = 0; k < sy->n_wals; k++)
        if (sy->wals[k].fd >= 0) close(sy->wals[k].fd);
    pthread_mutex_destroy(&sy->lock);
    pthread_cond_destroy(&sy->cond);
    free(sy);
}
