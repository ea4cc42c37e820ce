/* Segment files: the bytes of many small tensors appended to one blob file, each named by its
 * row as file + offset. Through SQLite such bytes would be written several times over (as
 * overflow pages, WAL frames with checksums, and checkpoints); appended here they are written
 * once, and the commit that names them syncs the file once (store_segment_sync), before the
 * WAL frames that name them are written. A round that appends its tensors first has the sync
 * made by a thread of its own meanwhile (store_segment_sync_begin), and its commit waits for
 * that instead.
 *
 * One segment is active at a time, appended to by the loop thread only (the store_t owner); a
 * full one is retired and a new one created. Other threads write whole segments of their own
 * at once (store_segment_write): the many small tensors of an array submission, or of a batch's
 * outputs, which the loop then only names. A segment starts with a short header, so that no
 * tensor sits at offset 0, which locators keep for whole-file blobs. Bytes of rows that were
 * never committed stay in the file as garbage; a file goes once no row names it (store_gc, the
 * check at the end of the transaction that retired it, and the orphan sweep at open).
 *
 * Appends are gathered in memory and reach the file as whole, aligned blocks (only a sync
 * writes the partial block at the end, and the next write starts again at its beginning): a
 * small tensor written at its own unaligned offset would make ext4 zero the new blocks it
 * touches first, on the loop thread.
 *
 * A failed sync cannot be trusted to be retried: Linux reports a writeback error once, and the
 * next fdatasync may succeed without the lost pages. So a failure sticks to the transaction
 * (every later sync in it fails) and the segment is abandoned when the transaction ends. A
 * failed write does the same. */
#define _GNU_SOURCE /* IOV_MAX */
#include "store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "daemon/util/log.h"

#define SEGMENT_HEADER "gpujobd segment 1\n"
#define SEGMENT_HEADER_BYTES 64
#define SEGMENT_MAX_BYTES (UINT64_C(256) << 20)
#define SEGMENT_BLOCK 4096
/* The write buffer; larger appends go to the file directly. */
#define SEGMENT_BUF_BYTES (UINT64_C(1) << 20)

static void header(unsigned char buf[SEGMENT_HEADER_BYTES])
{
    memset(buf, 0, SEGMENT_HEADER_BYTES);
    memcpy(buf, SEGMENT_HEADER, sizeof SEGMENT_HEADER - 1);
}

/* The thread that fdatasync()s the active segment while the loop writes the rows that name
 * it: a group commit of many small tensors then waits for a sync that ran beside its inserts
 * instead of making it after them. */
typedef struct segment_syncer {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* a sync asked, made, or the thread told to quit */
    pthread_t thread;
    int fd;    /* while busy: the file to sync */
    bool busy; /* a sync is asked or in progress */
    bool quit;
    int rc; /* of the last sync */
} segment_syncer_t;

static void *syncer_main(void *arg)
{
    segment_syncer_t *y = arg;
    prctl(PR_SET_NAME, "gj-segsync");
    pthread_mutex_lock(&y->lock);
    for (;;) {
        while (!y->busy && !y->quit)
            pthread_cond_wait(&y->cond, &y->lock);
        if (!y->busy) break;
        int fd = y->fd;
        pthread_mutex_unlock(&y->lock);
        int rc = fdatasync(fd) < 0 ? -errno : 0;
        pthread_mutex_lock(&y->lock);
        y->rc = rc;
        y->busy = false;
        pthread_cond_broadcast(&y->cond);
    }
    pthread_mutex_unlock(&y->lock);
    return NULL;
}

static segment_syncer_t *syncer_start(void)
{
    segment_syncer_t *y = calloc(1, sizeof *y);
    if (!y) return NULL;
    pthread_mutex_init(&y->lock, NULL);
    pthread_cond_init(&y->cond, NULL);
    if (pthread_create(&y->thread, NULL, syncer_main, y) != 0) {
        pthread_cond_destroy(&y->cond);
        pthread_mutex_destroy(&y->lock);
        free(y);
        return NULL;
    }
    return y;
}

static void syncer_stop(segment_syncer_t *y)
{
    if (!y) return;
    pthread_mutex_lock(&y->lock);
    y->quit = true;
    pthread_cond_broadcast(&y->cond);
    pthread_mutex_unlock(&y->lock);
    pthread_join(y->thread, NULL);
    pthread_cond_destroy(&y->cond);
    pthread_mutex_destroy(&y->lock);
    free(y);
}

/* Waits for the sync store_segment_sync_begin asked for, if any: when it succeeded and
 * nothing was appended since, the segment is clean. */
static int sync_collect(store_segment_t *seg)
{
    if (!seg->sync_pending) return 0;
    segment_syncer_t *y = seg->syncer;
    pthread_mutex_lock(&y->lock);
    while (y->busy)
        pthread_cond_wait(&y->cond, &y->lock);
    int rc = y->rc;
    pthread_mutex_unlock(&y->lock);
    seg->sync_pending = false;
    if (rc < 0) {
        seg->failed = true;
        return log_error_errno(rc, "store: syncing segment '%s': %s", seg->file, strerror(-rc));
    }
    if (seg->size == seg->sync_size) seg->dirty = false;
    return 0;
}

void store_segment_init(store_segment_t *seg)
{
    unsigned char *buf = seg->buf;
    segment_syncer_t *syncer = seg->syncer;
    memset(seg, 0, sizeof *seg);
    seg->fd = -1;
    seg->buf = buf;
    seg->syncer = syncer;
}

/* Writes the buffered bytes; all of them, or (partial) all but the last, unfinished block,
 * which then moves to the buffer's start. */
static int flush(store_segment_t *seg, bool partial)
{
    uint64_t len = seg->size - seg->buf_off;
    uint64_t keep = partial ? len % SEGMENT_BLOCK : 0;
    if (len - keep > 0) {
        int r = store_write_all(seg->fd, seg->buf, len - keep, seg->buf_off);
        if (r < 0) {
            seg->failed = true;
            return log_error_errno(r, "store: writing segment '%s': %s", seg->file, strerror(-r));
        }
    }
    if (!partial) keep = len % SEGMENT_BLOCK; /* written, and kept to start the next write */
    memmove(seg->buf, seg->buf + len - keep, keep);
    seg->buf_off = seg->size - keep;
    return 0;
}

/* Closes the active segment. Whether a row still names it is known once the transaction that
 * retires it has ended (its rows may yet be rolled back): the store looks then. Should there be
 * no room to note it, the sweep at the next open removes it if no row does. */
static void retire(store_segment_t *seg, blob_files_t *retired)
{
    if (seg->fd < 0) return;
    sync_collect(seg); /* the syncer is done with the file */
    close(seg->fd);
    store_files_add(retired, seg->file);
    seg->fd = -1;
    seg->file[0] = '\0';
    seg->size = 0;
    seg->dirty = seg->failed = false;
}

int store_segment_append(store_segment_t *seg, const char *blobs_dir, blob_files_t *retired,
                         const void *data, uint64_t nbytes, blob_file_t ret_file,
                         uint64_t *ret_offset)
{
    if (seg->failed) return -EIO;
    if (seg->fd >= 0 && seg->size + nbytes > SEGMENT_MAX_BYTES) {
        /* Its bytes appended so far must be on disk before a commit names them. */
        int r = store_segment_sync(seg);
        if (r < 0) return r;
        retire(seg, retired);
    }
    if (!seg->buf && !(seg->buf = malloc(SEGMENT_BUF_BYTES))) return -ENOMEM;
    if (seg->fd < 0) {
        char path[PATH_MAX + 64];
        int r = store_blob_file_create(blobs_dir, seg->file, path, &seg->fd);
        if (r < 0) {
            store_segment_init(seg);
            return log_error_errno(r, "store: cannot start a segment file: %s", strerror(-r));
        }
        header(seg->buf);
        seg->buf_off = 0;
        seg->size = SEGMENT_HEADER_BYTES;
        store_blob_bytes_moved(SEGMENT_HEADER_BYTES);
    }
    if (seg->size + nbytes - seg->buf_off > SEGMENT_BUF_BYTES) {
        int r = flush(seg, true);
        if (r < 0) return r;
    }
    if (seg->size + nbytes - seg->buf_off > SEGMENT_BUF_BYTES) {
        /* Too large for the buffer: to the file itself, behind what the buffer holds. */
        int r = flush(seg, false);
        if (r == 0) r = store_write_all(seg->fd, data, nbytes, seg->size);
        if (r < 0) {
            seg->failed = true;
            return log_error_errno(r, "store: appending to segment '%s': %s", seg->file,
                                   strerror(-r));
        }
        /* The buffer starts again at the last block, all of it from data (nbytes is more
         * than a block here). */
        uint64_t end = seg->size + nbytes, tail = end % SEGMENT_BLOCK;
        memcpy(seg->buf, (const unsigned char *)data + nbytes - tail, tail);
        seg->buf_off = end - tail;
    } else {
        memcpy(seg->buf + (seg->size - seg->buf_off), data, nbytes);
    }
    memcpy(ret_file, seg->file, sizeof seg->file);
    *ret_offset = seg->size;
    seg->size += nbytes;
    seg->dirty = true;
    store_blob_bytes_moved((int64_t)nbytes);
    return 0;
}

int store_segment_sync(store_segment_t *seg)
{
    if (seg->failed) return -EIO;
    int r = sync_collect(seg);
    if (r < 0) return r;
    if (!seg->dirty) return 0;
    r = flush(seg, false);
    if (r < 0) return r;
    if (fdatasync(seg->fd) < 0) {
        seg->failed = true;
        return log_error_errno(-errno, "store: syncing segment '%s': %s", seg->file,
                               strerror(errno));
    }
    seg->dirty = false;
    return 0;
}

int store_segment_sync_begin(store_segment_t *seg)
{
    if (seg->failed) return -EIO;
    if (!seg->dirty || seg->sync_pending) return 0;
    if (!seg->syncer && !(seg->syncer = syncer_start())) return 0;
    int r = flush(seg, false);
    if (r < 0) return r;
    segment_syncer_t *y = seg->syncer;
    pthread_mutex_lock(&y->lock);
    y->fd = seg->fd;
    y->busy = true;
    pthread_cond_broadcast(&y->cond);
    pthread_mutex_unlock(&y->lock);
    seg->sync_pending = true;
    seg->sync_size = seg->size;
    return 0;
}

void store_segment_txn_end(store_segment_t *seg, blob_files_t *retired)
{
    if (seg->failed) {
        log_warn("store: segment '%s' abandoned after a failed sync", seg->file);
        retire(seg, retired);
    }
}

bool store_segment_is_active(const store_segment_t *seg, const char *file)
{
    return seg->fd >= 0 && strcmp(seg->file, file) == 0;
}

void store_segment_close(store_segment_t *seg, blob_files_t *retired)
{
    store_segment_txn_end(seg, retired);
    sync_collect(seg);
    if (seg->fd >= 0) close(seg->fd);
    free(seg->buf);
    seg->buf = NULL;
    syncer_stop(seg->syncer);
    seg->syncer = NULL;
    store_segment_init(seg);
}

/* pwritev() of all n pieces, however many the kernel takes per call. */
static int pwritev_all(int fd, struct iovec *iov, size_t n, uint64_t offset)
{
    while (n > 0) {
        ssize_t w = pwritev(fd, iov, n < IOV_MAX ? (int)n : IOV_MAX, (off_t)offset);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        offset += (uint64_t)w;
        for (; n > 0 && (size_t)w >= iov->iov_len; iov++, n--)
            w -= (ssize_t)iov->iov_len;
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

int store_segment_write(const char *blobs_dir, const void *const *data, const uint64_t *nbytes,
                        size_t n, blob_file_t ret_file, uint64_t *ret_offsets)
{
    unsigned char head[SEGMENT_HEADER_BYTES];
    struct iovec *iov = malloc((n + 1) * sizeof *iov);
    if (!iov) return -ENOMEM;
    header(head);
    iov[0] = (struct iovec){head, sizeof head};
    uint64_t at = sizeof head;
    for (size_t i = 0; i < n; i++) {
        iov[i + 1] = (struct iovec){(void *)data[i], nbytes[i]};
        ret_offsets[i] = at;
        at += nbytes[i];
    }
    char path[PATH_MAX + 64];
    int fd;
    int r = store_blob_file_create(blobs_dir, ret_file, path, &fd);
    if (r == 0) {
        r = pwritev_all(fd, iov, n + 1, 0);
        if (r == 0 && fdatasync(fd) < 0) r = -errno;
        if (close(fd) < 0 && r == 0) r = -errno;
        if (r < 0) {
            unlink(path);
            log_error("store: writing segment '%s': %s", path, strerror(-r));
        } else {
            store_blob_bytes_moved((int64_t)at);
        }
    }
    free(iov);
    return r;
}
