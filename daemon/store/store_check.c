/* The checks that keep a damaged state directory from losing data. A database file emptied
 * or deleted while blob files remain would be taken for a new store (and every blob file swept
 * as an orphan): refused at open, at error level, with what was found and what to do, and
 * nothing is changed. A WAL is read as SQLite's recovery reads it: a torn tail is normal after a
 * power loss; commits SQLite would drop silently are kept aside in quarantine/ (wal_check).
 *
 * After an unclean stop the integrity of the database files is checked in two parts, so that a
 * long queue does not wait for a pass over the whole database before the daemon is ready. A
 * crash alone leaves SQLite's files consistent (the WAL's recovery sees to that): the check
 * guards against damage by the disk or by hand. Before ready, the schema is checked
 * (store_check_schema), and every page the start and recovery read is checked by SQLite as it
 * reads it: SQLITE_CORRUPT there refuses the start, and what the failed statement began is
 * rolled back (store_sql_error). After ready, PRAGMA quick_check reads the rest on a read-only
 * connection of its own, on a thread at a low priority; a finding is logged at error level
 * and marks the store damaged (store_damaged): every write is refused from then on, and
 * /healthz, /readyz and /metrics say so, until the database is restored. */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/util/log.h"
#include "store_internal.h"

#define WAL_HEADER 32
#define WAL_FRAME_HEADER 24

bool store_blobs_present(const char *blobs_dir)
{
    DIR *dir = opendir(blobs_dir);
    if (!dir) return false;
    bool any = false;
    struct dirent *de;
    while (!any && (de = readdir(dir))) {
        if (de->d_name[0] == '.') continue;
        char fan[PATH_MAX + 300];
        snprintf(fan, sizeof fan, "%s/%s", blobs_dir, de->d_name);
        DIR *sub = opendir(fan);
        if (!sub) continue;
        struct dirent *f;
        while (!any && (f = readdir(sub)))
            any = f->d_name[0] != '.';
        closedir(sub);
    }
    closedir(dir);
    return any;
}

static uint32_t get32(const unsigned char *p, bool big_endian)
{
    return big_endian ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
                      : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* SQLite's WAL checksum of n bytes (a multiple of 8), continuing from s. */
static void wal_checksum(const unsigned char *p, size_t n, bool big_endian, uint32_t s[2])
{
    for (size_t i = 0; i < n; i += 8) {
        s[0] += get32(p + i, big_endian) + s[1];
        s[1] += get32(p + i + 4, big_endian) + s[0];
    }
}

/* What a scan of a WAL found against what SQLite's recovery keeps of it. */
typedef struct wal_scan {
    int lost;           /* whole commit frames past the first frame that fails */
    off_t dropped_from; /* where the frames SQLite ignores begin; the file's size when none */
} wal_scan_t;

/* Scans the frames of a WAL with a valid header. SQLite's recovery keeps the frames up to the
 * last commit frame before the first frame whose salts or checksum fail, and ignores the rest:
 * a tail torn by a power loss, or damage. Whole commit frames past that point (their checksum
 * follows from the frame before them) are counted in ret->lost: they are what a power loss
 * cannot tell apart from damage to frames that were synced. */
static int wal_scan(int fd, const unsigned char *hdr, uint32_t page_size, off_t size,
                    wal_scan_t *ret)
{
    bool big_endian = get32(hdr, true) & 1;
    size_t frame_size = WAL_FRAME_HEADER + page_size;
    unsigned char *frame = malloc(frame_size);
    if (!frame) return -ENOMEM;
    bool broken = false;
    wal_scan_t scan = {.dropped_from = WAL_HEADER};
    uint32_t prev[2] = {get32(hdr + 24, true), get32(hdr + 28, true)};
    for (off_t at = WAL_HEADER;; at += (off_t)frame_size) {
        if (pread(fd, frame, frame_size, at) != (ssize_t)frame_size) break;
        bool same_generation = memcmp(frame + 8, hdr + 16, 8) == 0;
        uint32_t s[2] = {prev[0], prev[1]};
        wal_checksum(frame, 8, big_endian, s);
        wal_checksum(frame + WAL_FRAME_HEADER, page_size, big_endian, s);
        bool whole =
            same_generation && s[0] == get32(frame + 16, true) && s[1] == get32(frame + 20, true);
        bool commit = get32(frame + 4, true) != 0;
        if (!whole) broken = true;
        if (whole && commit && !broken) scan.dropped_from = at + (off_t)frame_size;
        if (whole && commit && broken) scan.lost++;
        prev[0] = same_generation ? get32(frame + 16, true) : 0;
        prev[1] = same_generation ? get32(frame + 20, true) : 0;
    }
    free(frame);
    if (scan.dropped_from > size) scan.dropped_from = size;
    *ret = scan;
    return 0;
}

/* Whether the 32-byte WAL header is one SQLite reads: magic, version, page size, checksum.
 * *ret_page_size: the page size it names. */
static bool wal_header_valid(const unsigned char *hdr, uint32_t *ret_page_size)
{
    uint32_t magic = get32(hdr, true), page_size = get32(hdr + 8, true), s[2] = {0, 0};
    if ((magic & ~1u) != 0x377f0682u || get32(hdr + 4, true) != 3007000) return false;
    if (page_size < 512 || page_size > 65536 || (page_size & (page_size - 1))) return false;
    wal_checksum(hdr, 24, magic & 1, s);
    *ret_page_size = page_size;
    return s[0] == get32(hdr + 24, true) && s[1] == get32(hdr + 28, true);
}

/* Copies the file at path into STATE_DIR/quarantine/ (the directory of path), as
 * NAME.UNIXTIME.PID, synced; the copy's path into ret. */
static int quarantine_copy(const char *path, char ret[PATH_MAX + 128])
{
    char dir[PATH_MAX + 32], copy[PATH_MAX + 128];
    const char *slash = strrchr(path, '/');
    int len = slash ? (int)(slash - path) : 1;
    snprintf(dir, sizeof dir, "%.*s/quarantine", len, slash ? path : ".");
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) return -errno;
    snprintf(copy, sizeof copy, "%s/%s.%lld.%d", dir, slash ? slash + 1 : path,
             (long long)time(NULL), (int)getpid());
    int in = open(path, O_RDONLY | O_CLOEXEC), r = 0;
    if (in < 0) return -errno;
    int out = open(copy, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0) r = -errno;
    char buf[65536];
    ssize_t n;
    while (r == 0 && (n = read(in, buf, sizeof buf)) != 0)
        r = n < 0 || write(out, buf, (size_t)n) != n ? -EIO : 0;
    if (r == 0 && fsync(out) < 0) r = -errno;
    close(in);
    if (out >= 0) close(out);
    if (r == 0) memcpy(ret, copy, sizeof copy);
    return r;
}

/* Says at error level that SQLite will open path without what, and keeps a copy of the WAL in
 * quarantine/ first, so that nothing is lost without a trace. The store still opens: SQLite
 * reads a WAL this way after a power loss too, and a refusal would lock every user out. */
static int wal_quarantine(const char *path, const char *what)
{
    char copy[PATH_MAX + 128];
    int r = quarantine_copy(path, copy);
    if (r < 0)
        return log_error_errno(r,
                               "store: '%s' %s, and a copy could not be kept (%s). Refusing to "
                               "start, nothing was changed",
                               path, what, strerror(-r));
    log_error("store: '%s' %s: SQLite goes on without them. A copy of the WAL is kept in '%s' "
              "for recovery by hand if those commits were acknowledged",
              path, what, copy);
    return 0;
}

/* Checks a WAL against what SQLite's recovery will keep of it (https://www.sqlite.org/
 * fileformat2.html#walformat). Frames past the last valid commit frame are a write cut short,
 * the normal state after a power loss: said at info level. What SQLite would drop silently
 * though it may have been durable, whole commits past a failing frame or a WAL whose header
 * fails while frames follow it, is copied into quarantine/ and said at error level. */
static int wal_check(const char *db_path, bool *ret_dropped)
{
    char path[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s-wal", db_path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        *ret_dropped = false;
        return 0;
    }
    if (fd < 0)
        return log_error_errno(-errno, "store: cannot read '%s': %s", path, strerror(errno));
    unsigned char hdr[WAL_HEADER];
    struct stat sb;
    uint32_t page_size = 0;
    wal_scan_t scan = {0};
    int r = fstat(fd, &sb) < 0 ? -errno : 0;
    bool has_frames = r == 0 && sb.st_size > WAL_HEADER + WAL_FRAME_HEADER;
    bool valid = r == 0 && pread(fd, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr &&
                 wal_header_valid(hdr, &page_size);
    if (valid) r = wal_scan(fd, hdr, page_size, sb.st_size, &scan);
    close(fd);
    if (r < 0) return log_error_errno(r, "store: cannot read '%s': %s", path, strerror(-r));
    bool dropped = (!valid && has_frames) || (valid && scan.lost > 0);
    if (!valid && has_frames) {
        r = wal_quarantine(path, "has a damaged header while frames follow it, so every "
                                 "commit in it is dropped");
    } else if (dropped) {
        char what[160];
        snprintf(what, sizeof what,
                 "holds %d whole commit(s) past a frame whose checksum fails, which are dropped",
                 scan.lost);
        r = wal_quarantine(path, what);
    } else if (valid && scan.dropped_from < sb.st_size) {
        log_info("store: '%s' ends in %lld byte(s) past its last whole commit, a write cut "
                 "short: SQLite ignores them",
                 path, (long long)(sb.st_size - scan.dropped_from));
    }
    if (r == 0) *ret_dropped = dropped;
    return r;
}

int store_check_before_open(const char *db_path, const char *blobs_dir, bool missing_ok,
                            bool *ret_dropped)
{
    struct stat sb;
    bool missing = stat(db_path, &sb) < 0;
    if (missing && errno != ENOENT)
        return log_error_errno(-errno, "store: cannot read '%s': %s", db_path, strerror(errno));
    if (((missing && !missing_ok) || (!missing && sb.st_size == 0)) &&
        store_blobs_present(blobs_dir))
        return log_error_errno(-EUCLEAN,
                               "store: '%s' is %s while '%s' holds blob files: the jobs that "
                               "named them are gone. Refusing to start, nothing was changed: "
                               "restore the database from a backup, or move the blobs "
                               "directory aside to start afresh",
                               db_path, missing ? "missing" : "empty (0 bytes)", blobs_dir);
    if (!missing) return wal_check(db_path, ret_dropped);
    *ret_dropped = false;
    return 0;
}

static void clean_marker_path(const char *state_dir, char path[PATH_MAX + 32])
{
    snprintf(path, PATH_MAX + 32, "%s/" STORE_CLEAN_NAME, state_dir);
}

int store_clean_marker_take(const char *state_dir, bool *ret_clean)
{
    char path[PATH_MAX + 32];
    clean_marker_path(state_dir, path);
    if (unlink(path) < 0) {
        if (errno != ENOENT)
            return log_error_errno(-errno, "store: cannot remove '%s': %s", path, strerror(errno));
        *ret_clean = false;
        return 0;
    }
    int r = store_fsync_dir(state_dir);
    if (r < 0) return log_error_errno(r, "store: cannot sync '%s': %s", state_dir, strerror(-r));
    *ret_clean = true;
    return 0;
}

void store_clean_marker_write(const char *state_dir)
{
    char path[PATH_MAX + 32];
    clean_marker_path(state_dir, path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int r = fd < 0 || fsync(fd) < 0 ? -errno : 0;
    if (fd >= 0) close(fd);
    if (r == 0) r = store_fsync_dir(state_dir);
    if (r < 0)
        log_warn("store: cannot write '%s' (%s): the next start checks the store's integrity", path,
                 strerror(-r));
}

int store_check_schema(store_conn_t *conn)
{
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(conn->db, "PRAGMA quick_check(sqlite_schema)", -1, &stmt, NULL) !=
        SQLITE_OK)
        return log_error_errno(-EUCLEAN,
                               "store: '%s' cannot be read (%s). Refusing to start, nothing was "
                               "changed: restore it from a backup",
                               conn->db_path, sqlite3_errmsg(conn->db));
    int rc = sqlite3_step(stmt);
    const char *verdict = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(stmt, 0) : NULL;
    int r = 0;
    if (!verdict || strcmp(verdict, "ok") != 0)
        r = log_error_errno(-EUCLEAN,
                            "store: '%s' fails its integrity check (%s). Refusing to start, "
                            "nothing was changed: restore it from a backup",
                            conn->db_path, verdict ? verdict : sqlite3_errmsg(conn->db));
    sqlite3_finalize(stmt);
    return r;
}

/* ---------------------------------------------- the whole check, after ready */

void store_note_damage(store_t *st, const char *db_path, const char *found)
{
    /* The line is written before the flag is seen, so that whoever finds the store damaged
     * (/healthz) finds the reason in the log too. */
    pthread_mutex_lock(&st->check_lock);
    if (!atomic_load(&st->damaged)) {
        snprintf(st->damage, sizeof st->damage, "'%s': %s", db_path, found);
        log_error("store: '%s' fails its integrity check (%s). The daemon refuses every write "
                  "from now on, so that SQLite spreads no damage and nothing stored is lost; "
                  "what is stored can still be read. Stop the daemon and restore the database "
                  "from a backup",
                  db_path, found);
        atomic_store(&st->damaged, true);
    }
    pthread_mutex_unlock(&st->check_lock);
}

bool store_damaged(store_t *st, char *reason, size_t size)
{
    if (!atomic_load(&st->damaged)) return false;
    if (size) {
        pthread_mutex_lock(&st->check_lock);
        snprintf(reason, size, "%s", st->damage);
        pthread_mutex_unlock(&st->check_lock);
    }
    return true;
}

/* Runs PRAGMA quick_check(1) over shard k's file on a read-only connection of its own, which
 * store_check_stop interrupts. 1 when it passed, 0 when it was stopped or could not run
 * (logged), or the store's damage noted. */
static int check_shard(store_t *st, int k)
{
    store_conn_t conn;
    if (store_conn_open(&conn, st->state_dir, k, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX) < 0)
        return 0;
    sqlite3_stmt *stmt = NULL;
    int rc = sqlite3_prepare_v2(conn.db, "PRAGMA quick_check(1)", -1, &stmt, NULL);
    pthread_mutex_lock(&st->check_lock);
    bool stop = st->check_stop;
    if (!stop) st->check_db = conn.db;
    pthread_mutex_unlock(&st->check_lock);
    if (!stop && rc == SQLITE_OK) rc = sqlite3_step(stmt);
    pthread_mutex_lock(&st->check_lock);
    st->check_db = NULL;
    stop = st->check_stop;
    pthread_mutex_unlock(&st->check_lock);
    const char *verdict = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(stmt, 0) : NULL;
    int code = sqlite3_extended_errcode(conn.db) & 0xff, passed = 0;
    if (verdict && strcmp(verdict, "ok") == 0)
        passed = 1;
    else if (verdict || code == SQLITE_CORRUPT || code == SQLITE_NOTADB)
        store_note_damage(st, conn.db_path, verdict ? verdict : sqlite3_errmsg(conn.db));
    else if (!stop)
        log_warn("store: the integrity check of '%s' could not run (%s): it runs again after "
                 "the next unclean stop",
                 conn.db_path, sqlite3_errmsg(conn.db));
    sqlite3_finalize(stmt);
    store_conn_close(&conn);
    return passed;
}

static void *check_main(void *arg)
{
    store_t *st = arg;
    prctl(PR_SET_NAME, "store-check");
    /* Behind the loop and the workers: the check may take minutes on a large store. Linux
     * keeps a nice value per thread, and 0 names the calling thread. */
    if (setpriority(PRIO_PROCESS, 0, STORE_CHECK_NICE) < 0)
        log_debug("store: cannot lower the integrity check's priority: %s", strerror(errno));
    int64_t t0 = now_us();
    int passed = 0;
    for (int k = 0; k < st->n_shards && !atomic_load(&st->damaged); k++)
        passed += check_shard(st, k);
    if (passed == st->n_shards) {
        atomic_store(&st->check_passed, true);
        log_info("store: the integrity check (PRAGMA quick_check) passed, in %.1f s",
                 (double)(now_us() - t0) / 1e6);
    }
    return NULL;
}

int store_check_start(store_t *st)
{
    if (!st->check_due || st->check_started) return 0;
    int r = -pthread_create(&st->check_thread, NULL, check_main, st);
    if (r < 0)
        return log_error_errno(r, "store: cannot start the integrity check: %s", strerror(-r));
    st->check_started = true;
    return 0;
}

void store_check_stop(store_t *st)
{
    if (!st->check_started) return;
    pthread_mutex_lock(&st->check_lock);
    st->check_stop = true;
    if (st->check_db) sqlite3_interrupt(st->check_db);
    pthread_mutex_unlock(&st->check_lock);
    pthread_join(st->check_thread, NULL);
    st->check_started = false;
}
