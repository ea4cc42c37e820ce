/* Room on the state directory's disk: a reserve file that keeps deletes possible on a full disk,
 * and whether the disk counts as full (for /readyz). */
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "daemon/util/log.h"
#include "daemon/util/id.h"

/* Free bytes on the state directory's disk for an unprivileged writer; UINT64_MAX when statvfs
 * fails (nothing is then known to be full). */
static uint64_t free_bytes(const store_t *st)
{
    struct statvfs vfs;
    if (statvfs(st->state_dir, &vfs) < 0) return UINT64_MAX;
    return (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
}

/* Creates the reserve file, of STORE_RESERVE_BYTES allocated blocks. 0, or a negative errno
 * (no file is left behind then). */
static int reserve_create(store_t *st)
{
    int fd = open(st->reserve_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    int r = -posix_fallocate(fd, 0, STORE_RESERVE_BYTES);
    if (r == 0 && fdatasync(fd) < 0) r = -errno;
    close(fd);
    if (r < 0) unlink(st->reserve_path);
    atomic_store(&st->reserve_present, r == 0);
    return r;
}

void store_space_open(store_t *st)
{
    int r = reserve_create(st);
    if (r < 0)
        log_warn("store: cannot create the reserve file '%s' (%s): deletes may fail while the "
                 "disk is full",
                 st->reserve_path, strerror(-r));
}

bool store_space_release(store_t *st)
{
    if (!atomic_exchange(&st->reserve_present, false)) return false;
    if (unlink(st->reserve_path) < 0) return false;
    log_warn("store: the disk is full: released the reserve file '%s' so that a delete can "
             "commit",
             st->reserve_path);
    st->reserve_retry_us = now_us() + STORE_RESERVE_RETRY_US;
    return true;
}

void store_space_note(shard_t *sh, int r)
{
    store_t *st = sh->st;
    if (r == -ENOSPC) {
        atomic_store(&st->nospc_free, free_bytes(st));
        atomic_store(&st->nospc, true);
        return;
    }
    if (r < 0) return;
    atomic_store(&st->nospc, false);
    /* The reserve comes back once there is room for it and some more; shard 0 is written by
     * the loop's thread only, so that two commits never race to create it. */
    if (sh->index != 0 || atomic_load(&st->reserve_present) || now_us() < st->reserve_retry_us)
        return;
    st->reserve_retry_us = now_us() + STORE_RESERVE_RETRY_US;
    if (free_bytes(st) >= 2 * (uint64_t)STORE_RESERVE_BYTES && reserve_create(st) == 0)
        log_info("store: recreated the reserve file '%s'", st->reserve_path);
}

bool store_disk_full(store_t *st, char *reason, size_t size)
{
    uint64_t now_free = free_bytes(st);
    if (now_free < STORE_RESERVE_BYTES) {
        snprintf(reason, size, "the state directory's disk has %llu bytes free, under %d",
                 (unsigned long long)now_free, STORE_RESERVE_BYTES);
        return true;
    }
    /* A commit failed for want of room: full until one succeeds or space was freed since. */
    if (atomic_load(&st->nospc) && now_free < atomic_load(&st->nospc_free) + STORE_RESERVE_BYTES) {
        snprintf(reason, size,
                 "the store's last commit failed: no space left on the state "
                 "directory's disk");
        return true;
    }
    return false;
}
