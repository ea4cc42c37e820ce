/* Segment files: the bytes of many small tensors appended to one blob file, each named by its
 * row as file + offset. Writing them through SQLite cost a tiny job most of its time on the
 * loop thread (measured with bench/sched_throughput: 4 KiB tensors were written 5-6 times over,
 * as overflow pages, WAL frames with checksums and checkpoints); appended here they are
 * written once, and the commit that names them syncs the file once (store_segment_sync).
 *
 * One segment is active at a time, appended to by the loop thread only (the store_t owner); a
 * full one is retired and a new one created. A segment starts with a short header, so that no
 * tensor sits at offset 0, which locators keep for whole-file blobs. Bytes of rows that were
 * never committed stay in the file as garbage; a file goes once no row names it (store_gc, the
 * check at the end of the transaction that retired it, and the orphan sweep at open).
 *
 * A failed sync cannot be trusted to be retried: Linux reports a writeback error once, and the
 * next fdatasync may succeed without the lost pages. So a failure sticks to the transaction
 * (every later sync in it fails) and the segment is abandoned when the transaction ends. */
#include "store_internal.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

#define SEGMENT_HEADER "gpujobd segment 1\n"
#define SEGMENT_HEADER_BYTES 64
#define SEGMENT_MAX_BYTES (UINT64_C(256) << 20)

void store_segment_init(store_segment_t *seg)
{
    memset(seg, 0, sizeof *seg);
    seg->fd = -1;
}

/* Removes file when no row names it. */
static void remove_if_unused(store_conn_t *conn, const char *file)
{
    bool used = true;
    if (store_blob_file_referenced(conn, file, &used) == 0 && !used)
        store_blob_file_remove(conn->blobs_dir, file);
}

/* Closes the active segment. Whether a row still names it is known once the transaction that
 * retires it has ended (its rows may yet be rolled back): store_segment_txn_end looks. */
static void retire(store_segment_t *seg, store_conn_t *conn)
{
    if (seg->fd < 0) return;
    close(seg->fd);
    if (seg->n_retired == STORE_SEGMENT_RETIRED_MAX) {
        /* Rotations within one transaction: the oldest is looked at now. */
        remove_if_unused(conn, seg->retired[0]);
        memmove(seg->retired[0], seg->retired[1], sizeof seg->retired - sizeof seg->retired[0]);
        seg->n_retired--;
    }
    memcpy(seg->retired[seg->n_retired++], seg->file, sizeof seg->file);
    seg->fd = -1;
    seg->file[0] = '\0';
    seg->size = 0;
    seg->dirty = seg->failed = false;
}

int store_segment_append(store_segment_t *seg, store_conn_t *conn, const void *data,
                         uint64_t nbytes, char ret_file[4 + STORE_BLOB_NAME_LEN],
                         uint64_t *ret_offset)
{
    if (seg->failed) return -EIO;
    if (seg->fd >= 0 && seg->size + nbytes > SEGMENT_MAX_BYTES) {
        /* Its bytes appended so far must be on disk before a commit names them. */
        int r = store_segment_sync(seg);
        if (r < 0) return r;
        retire(seg, conn);
    }
    if (seg->fd < 0) {
        char path[PATH_MAX + 64];
        char header[SEGMENT_HEADER_BYTES] = SEGMENT_HEADER;
        int r = store_blob_file_create(conn->blobs_dir, seg->file, path, &seg->fd);
        if (r == 0) r = store_write_all(seg->fd, header, sizeof header, 0);
        if (r < 0) {
            if (seg->fd >= 0) {
                close(seg->fd);
                unlink(path);
            }
            store_segment_init(seg);
            return log_error_errno(r, "store: cannot start a segment file: %s", strerror(-r));
        }
        seg->size = sizeof header;
    }
    /* A failed append does not move the end: the next one overwrites what it left. */
    int r = store_write_all(seg->fd, data, nbytes, seg->size);
    if (r < 0)
        return log_error_errno(r, "store: appending to segment '%s': %s", seg->file, strerror(-r));
    memcpy(ret_file, seg->file, sizeof seg->file);
    *ret_offset = seg->size;
    seg->size += nbytes;
    seg->dirty = true;
    return 0;
}

int store_segment_sync(store_segment_t *seg)
{
    if (seg->failed) return -EIO;
    if (!seg->dirty) return 0;
    if (fdatasync(seg->fd) < 0) {
        seg->failed = true;
        return log_error_errno(-errno, "store: syncing segment '%s': %s", seg->file,
                               strerror(errno));
    }
    seg->dirty = false;
    return 0;
}

void store_segment_txn_end(store_segment_t *seg, store_conn_t *conn)
{
    if (seg->failed) {
        log_warn("store: segment '%s' abandoned after a failed sync", seg->file);
        retire(seg, conn);
    }
    for (int i = 0; i < seg->n_retired; i++)
        remove_if_unused(conn, seg->retired[i]);
    seg->n_retired = 0;
}

bool store_segment_is_active(const store_segment_t *seg, const char *file)
{
    return seg->fd >= 0 && strcmp(seg->file, file) == 0;
}

void store_segment_close(store_segment_t *seg, store_conn_t *conn)
{
    store_segment_txn_end(seg, conn);
    if (seg->fd >= 0) close(seg->fd);
    store_segment_init(seg);
}
