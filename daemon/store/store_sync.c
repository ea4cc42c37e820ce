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
    int fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int r = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return r;
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
    store_sync_t *cs = arg;
    prctl(PR_SET_NAME, "gj-sync");
    pthread_mutex_lock(&cs->lock);
    for (;;) {
        while (!cs->head && !cs->checkpoint_due && !cs->stopping)
            pthread_cond_wait(&cs->cond, &cs->lock);
        store_sync_item_t *item = cs->head;
        if (!item && !cs->checkpoint_due) break;
        cs->head = cs->tail = NULL;
        cs->checkpoint_due = false;
        pthread_mutex_unlock(&cs->lock);
        unsigned wals = 0;
        for (store_sync_item_t *i = item; i; i = i->next)
            wals |= i->wals ? i->wals : ~0u;
        int r = atomic_load(&cs->err);
        for (int k = 0; r == 0 && k < cs->n_wals; k++)
            if ((wals & (1u << k)) && (r = sync_wal(&cs->wals[k])) < 0) {
                atomic_store(&cs->err, r);
                log_error("store: syncing '%s' failed: %s; accepted jobs are answered with an "
                          "error from now on",
                          cs->wals[k].path, strerror(-r));
            }
        while (item) {
            store_sync_item_t *next = item->next;
            item->done(item, r);
            item = next;
        }
        int c = cs->cp && r == 0 ? store_checkpointer_run(cs->cp) : 0;
        if (c < 0) log_warn("store: WAL checkpoint failed: %s", strerror(-c));
        pthread_mutex_lock(&cs->lock);
    }
    pthread_mutex_unlock(&cs->lock);
    return NULL;
}

int store_sync_start(const char *const *wal_paths, int n_wals, store_checkpointer_t *cp,
                     store_sync_t **ret)
{
    if (n_wals < 1 || n_wals > STORE_MAX_SHARDS) return -EINVAL;
    store_sync_t *cs = calloc(1, sizeof *cs);
    if (!cs) return -ENOMEM;
    for (int k = 0; k < n_wals; k++) {
        wal_t *w = &cs->wals[k];
        w->fd = -1;
        if (snprintf(w->path, sizeof w->path, "%s", wal_paths[k]) >= (int)sizeof w->path) {
            free(cs);
            return -ENAMETOOLONG;
        }
    }
    cs->n_wals = n_wals;
    cs->cp = cp;
    pthread_mutex_init(&cs->lock, NULL);
    pthread_cond_init(&cs->cond, NULL);
    int r = pthread_create(&cs->thread, NULL, sync_thread, cs);
    if (r != 0) {
        pthread_mutex_destroy(&cs->lock);
        pthread_cond_destroy(&cs->cond);
        free(cs);
        return -r;
    }
    *ret = cs;
    return 0;
}

void store_sync_request(store_sync_t *cs, store_sync_item_t *item)
{
    item->next = NULL;
    pthread_mutex_lock(&cs->lock);
    if (cs->tail)
        cs->tail->next = item;
    else
        cs->head = item;
    cs->tail = item;
    pthread_cond_signal(&cs->cond);
    pthread_mutex_unlock(&cs->lock);
}

void store_sync_checkpoint_soon(store_sync_t *cs)
{
    pthread_mutex_lock(&cs->lock);
    cs->checkpoint_due = true;
    pthread_cond_signal(&cs->cond);
    pthread_mutex_unlock(&cs->lock);
}

int store_sync_error(store_sync_t *cs)
{
    return atomic_load(&cs->err);
}

void store_sync_free(store_sync_t *cs)
{
    if (!cs) return;
    pthread_mutex_lock(&cs->lock);
    cs->stopping = true;
    pthread_cond_signal(&cs->cond);
    pthread_mutex_unlock(&cs->lock);
    pthread_join(cs->thread, NULL);
    for (int k = 0; k < cs->n_wals; k++)
        if (cs->wals[k].fd >= 0) close(cs->wals[k].fd);
    pthread_mutex_destroy(&cs->lock);
    pthread_cond_destroy(&cs->cond);
    free(cs);
}
