/* The checks at open that keep a damaged state directory from losing data: a store that
 * cannot be read as it was written is refused, at error level, with what was found and what
 * to do, and nothing in it is changed or deleted. Without them a database file emptied or
 * deleted while blob files remain would be taken for a new store (and every blob file swept as
 * an orphan), and a WAL with garbage in its middle would silently lose every commit after it:
 * SQLite's recovery stops at the first frame whose checksum fails. */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/util/log.h"
#include "store_internal.h"

#define WAL_HEADER 32
#define WAL_FRAME_HEADER 24

/* Whether blobs_dir holds any file in its fan-out directories. */
static bool blobs_present(const char *blobs_dir)
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

/* Counts, in *ret_lost, the commit frames of the WAL's current generation (its salts) that
 * lie past the first frame whose checksum fails and that are whole themselves (their checksum
 * follows from the frame before them): commits SQLite's recovery would drop. */
static int wal_scan(int fd, const unsigned char *hdr, uint32_t page_size, int *ret_lost)
{
    bool big_endian = get32(hdr, true) & 1;
    uint32_t chain[2] = {get32(hdr + 24, true), get32(hdr + 28, true)};
    size_t frame_size = WAL_FRAME_HEADER + page_size;
    unsigned char *frame = malloc(frame_size);
    if (!frame) return -ENOMEM;
    bool broken = false;
    int lost = 0;
    uint32_t prev[2] = {chain[0], chain[1]};
    for (off_t at = WAL_HEADER;; at += (off_t)frame_size) {
        if (pread(fd, frame, frame_size, at) != (ssize_t)frame_size) break;
        if (memcmp(frame + 8, hdr + 16, 8) != 0) {
            /* Another generation's frame: what SQLite left from before the WAL restarted. */
            broken = true;
            prev[0] = prev[1] = 0;
            continue;
        }
        uint32_t s[2] = {prev[0], prev[1]};
        wal_checksum(frame, 8, big_endian, s);
        wal_checksum(frame + WAL_FRAME_HEADER, page_size, big_endian, s);
        bool whole = s[0] == get32(frame + 16, true) && s[1] == get32(frame + 20, true);
        if (!whole)
            broken = true;
        else if (broken && get32(frame + 4, true) != 0)
            lost++;
        prev[0] = get32(frame + 16, true);
        prev[1] = get32(frame + 20, true);
    }
    free(frame);
    *ret_lost = lost;
    return 0;
}

/* Refuses a WAL file whose middle is damaged: commits past the damage would be lost. */
static int wal_check(const char *db_path)
{
    char path[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s-wal", db_path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT
                   ? 0
                   : log_error_errno(-errno, "store: cannot read '%s': %s", path, strerror(errno));
    unsigned char hdr[WAL_HEADER];
    int lost = 0, r = 0;
    if (pread(fd, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr &&
        (get32(hdr, true) & ~1u) == 0x377f0682u) {
        uint32_t page_size = get32(hdr + 8, true), s[2] = {0, 0};
        wal_checksum(hdr, 24, get32(hdr, true) & 1, s);
        bool header_ok = s[0] == get32(hdr + 24, true) && s[1] == get32(hdr + 28, true);
        if (header_ok && page_size >= 512 && page_size <= 65536 && !(page_size & (page_size - 1)))
            r = wal_scan(fd, hdr, page_size, &lost);
    }
    close(fd);
    if (r == 0 && lost > 0)
        r = log_error_errno(-EUCLEAN,
                            "store: '%s' is damaged: %d committed transaction(s) lie past a frame "
                            "whose checksum fails, and would be lost. Refusing to start, nothing "
                            "was changed: restore the state directory from a backup, or keep a "
                            "copy of it and run sqlite3 '%s' 'PRAGMA wal_checkpoint' to go on with "
                            "what can be read",
                            path, lost, db_path);
    return r;
}

int store_check_before_open(const char *db_path, const char *blobs_dir, bool missing_ok)
{
    struct stat sb;
    bool missing = stat(db_path, &sb) < 0;
    if (missing && errno != ENOENT)
        return log_error_errno(-errno, "store: cannot read '%s': %s", db_path, strerror(errno));
    if (((missing && !missing_ok) || (!missing && sb.st_size == 0)) && blobs_present(blobs_dir))
        return log_error_errno(-EUCLEAN,
                               "store: '%s' is %s while '%s' holds blob files: the jobs that "
                               "named them are gone. Refusing to start, nothing was changed: "
                               "restore the database from a backup, or move the blobs "
                               "directory aside to start afresh",
                               db_path, missing ? "missing" : "empty (0 bytes)", blobs_dir);
    return missing ? 0 : wal_check(db_path);
}

int store_check_quick(store_conn_t *conn)
{
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(conn->db, "PRAGMA quick_check(1)", -1, &stmt, NULL) != SQLITE_OK)
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

int store_newest_row_us(store_conn_t *conn, int64_t *ret)
{
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(conn->db,
                           "SELECT max(coalesce((SELECT max(max(created_us, started_us, "
                           "finished_us)) FROM jobs), 0), coalesce((SELECT max(created_us) FROM "
                           "buffers), 0))",
                           -1, &stmt, NULL) != SQLITE_OK)
        return store_sql_error(conn, "finding the newest row");
    int r = sqlite3_step(stmt) == SQLITE_ROW ? 0 : store_sql_error(conn, "finding the newest row");
    if (r == 0) *ret = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    return r;
}
