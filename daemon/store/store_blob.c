/* Blob files and locators. A file blob lives at blobs/<first two hex digits>/<32 hex digits>,
 * a random name, so that no two writers (any thread) ever pick the same file and no directory
 * grows past a 256th of the files. A file is complete and fsync'd, and its directory entry too,
 * before its locator is handed out: a row naming it may then be committed. */
#define _GNU_SOURCE /* sync_file_range */
#include "store.h"
#include "store_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/util/log.h"

static bool is_hex_name(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return s[len] == '\0' || s[len] == '/';
}

bool store_id_ok(const char *id)
{
    size_t len = strnlen(id, ID_SIZE);
    if (len == 0 || len >= ID_SIZE) return false;
    for (size_t i = 0; i < len; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'z') ||
              (id[i] >= 'A' && id[i] <= 'Z') || id[i] == '_' || id[i] == '-'))
            return false;
    return true;
}

static bool is_file_name(const char *file)
{
    return strlen(file) == 3 + STORE_BLOB_NAME_LEN && is_hex_name(file, 2) && file[2] == '/' &&
           is_hex_name(file + 3, STORE_BLOB_NAME_LEN) && memcmp(file, file + 3, 2) == 0;
}

void store_copy_str(char *dst, size_t size, const char *src)
{
    size_t len = strnlen(src, size - 1);
    memcpy(dst, src, len);
    dst[len] = '\0';
}

int store_locator_parse(const char *blob, store_locator_t *ret)
{
    store_locator_t loc = {0};
    if (!blob) return -EINVAL;
    if (strncmp(blob, "file:", 5) == 0) {
        char file[4 + STORE_BLOB_NAME_LEN];
        store_copy_str(file, sizeof file, blob + 5);
        const char *at = blob + 5 + 3 + STORE_BLOB_NAME_LEN;
        if (!is_file_name(file) || (*at != '\0' && *at != '@')) return -EINVAL;
        if (*at == '@') {
            char *end;
            errno = 0;
            unsigned long long offset = strtoull(at + 1, &end, 10);
            if (at[1] < '0' || at[1] > '9' || *end != '\0' || errno) return -EINVAL;
            loc.offset = offset;
        }
        loc.kind = STORE_LOCATOR_FILE;
        memcpy(loc.file, file, sizeof file);
    } else if (strncmp(blob, "row:buffers/", 12) == 0) {
        const char *id = blob + 12;
        if (!store_id_ok(id)) return -EINVAL;
        loc.kind = STORE_LOCATOR_BUFFER;
        store_copy_str(loc.id, sizeof loc.id, id);
    } else if (strncmp(blob, "row:jobs/", 9) == 0) {
        const char *id = blob + 9;
        const char *slash = strchr(id, '/');
        if (!slash || slash - id >= ID_SIZE) return -EINVAL;
        memcpy(loc.id, id, (size_t)(slash - id)); /* loc is zeroed: the id ends there */
        if (!store_id_ok(loc.id)) return -EINVAL;
        const char *role = slash + 1;
        if (strncmp(role, "in/", 3) == 0)
            loc.output = false;
        else if (strncmp(role, "out/", 4) == 0)
            loc.output = true;
        else
            return -EINVAL;
        const char *slot = role + (loc.output ? 4 : 3);
        if (slot[0] < '0' || slot[0] > '9' || slot[1] != '\0' || slot[0] - '0' >= OP_MAX_TENSORS)
            return -EINVAL;
        loc.kind = STORE_LOCATOR_TENSOR;
        loc.slot = slot[0] - '0';
    } else {
        return -EINVAL;
    }
    *ret = loc;
    return 0;
}

char *store_locator_file(const char *file, uint64_t offset)
{
    char buf[STORE_LOCATOR_SIZE];
    if (offset)
        snprintf(buf, sizeof buf, "file:%s@%" PRIu64, file, offset);
    else
        snprintf(buf, sizeof buf, "file:%s", file);
    return strdup(buf);
}

char *store_locator_tensor(const char *job_id, bool output, int slot)
{
    char buf[STORE_LOCATOR_SIZE];
    snprintf(buf, sizeof buf, "row:jobs/%s/%s/%d", job_id, output ? "out" : "in", slot);
    return strdup(buf);
}

char *store_locator_buffer(const char *buffer_id)
{
    char buf[STORE_LOCATOR_SIZE];
    snprintf(buf, sizeof buf, "row:buffers/%s", buffer_id);
    return strdup(buf);
}

int store_fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int r = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return r;
}

/* Creates blobs_dir/<fan> if needed; a new entry makes the parent's fsync necessary so that the
 * directory itself survives a crash. */
static int fan_dir_ensure(const char *blobs_dir, const char *fan_path)
{
    if (mkdir(fan_path, 0750) == 0) return store_fsync_dir(blobs_dir);
    return errno == EEXIST ? 0 : -errno;
}

int store_write_all(int fd, const void *data, uint64_t nbytes, uint64_t offset)
{
    const char *p = data;
    while (nbytes > 0) {
        size_t chunk = nbytes > (1u << 30) ? (1u << 30) : (size_t)nbytes;
        ssize_t n = pwrite(fd, p, chunk, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += n;
        offset += (uint64_t)n;
        nbytes -= (uint64_t)n;
    }
    return 0;
}

static _Atomic int64_t blob_bytes_net;

void store_blob_bytes_moved(int64_t delta)
{
    atomic_fetch_add(&blob_bytes_net, delta);
}

int64_t store_blob_bytes_net(void)
{
    return atomic_load(&blob_bytes_net);
}

int store_blob_file_create(const char *blobs_dir, char ret_file[4 + STORE_BLOB_NAME_LEN],
                           char ret_path[PATH_MAX + 64], int *ret_fd)
{
    unsigned char rnd[STORE_BLOB_NAME_LEN / 2];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return log_error_errno(-EIO, "store: getrandom failed: %s", strerror(errno));
    char file[4 + STORE_BLOB_NAME_LEN];
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(file + 3 + 2 * i, 3, "%02x", rnd[i]);
    memcpy(file, file + 3, 2);
    file[2] = '/';

    char fan_path[PATH_MAX + 8], path[PATH_MAX + 64];
    snprintf(fan_path, sizeof fan_path, "%s/%.2s", blobs_dir, file);
    if (snprintf(path, sizeof path, "%s/%s", blobs_dir, file) >= (int)sizeof path)
        return log_error_errno(-ENAMETOOLONG, "store: blob path under '%s' too long", blobs_dir);

    int r = fan_dir_ensure(blobs_dir, fan_path);
    if (r < 0) return log_error_errno(r, "store: cannot create '%s': %s", fan_path, strerror(-r));
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    if (fd < 0)
        return log_error_errno(-errno, "store: cannot create '%s': %s", path, strerror(errno));
    /* The entry must survive a crash once a row names the file. */
    r = store_fsync_dir(fan_path);
    if (r < 0) {
        close(fd);
        unlink(path);
        return log_error_errno(r, "store: cannot sync '%s': %s", fan_path, strerror(-r));
    }
    memcpy(ret_file, file, sizeof file);
    memcpy(ret_path, path, sizeof path);
    *ret_fd = fd;
    return 0;
}

int store_blob_file_write(const char *blobs_dir, const void *data, uint64_t nbytes,
                          char ret_file[4 + STORE_BLOB_NAME_LEN])
{
    char file[4 + STORE_BLOB_NAME_LEN], path[PATH_MAX + 64];
    int fd;
    int r = store_blob_file_create(blobs_dir, file, path, &fd);
    if (r < 0) return r;
    r = store_write_all(fd, data, nbytes, 0);
    if (r == 0 && fsync(fd) < 0) r = -errno;
    if (close(fd) < 0 && r == 0) r = -errno;
    if (r < 0) {
        unlink(path);
        return log_error_errno(r, "store: writing blob '%s': %s", path, strerror(-r));
    }
    store_blob_bytes_moved((int64_t)nbytes);
    memcpy(ret_file, file, sizeof file);
    return 0;
}

/* Opens the blob file that holds nbytes at offset (exactly them, for a file of its own), into
 * *ret_fd; path is filled for messages. */
static int blob_file_open(const char *blobs_dir, const char *file, uint64_t offset, uint64_t nbytes,
                          char path[PATH_MAX + 64], int *ret_fd)
{
    snprintf(path, PATH_MAX + 64, "%s/%s", blobs_dir, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int r = -errno;
        return log_error_errno(r == -ENOENT ? -ENOENT : r, "store: cannot open blob '%s': %s", path,
                               strerror(-r));
    }
    /* A whole-file blob holds exactly its tensor; a segment (offset > 0) at least its part. */
    struct stat sb;
    if (fstat(fd, &sb) < 0 ||
        (offset ? (uint64_t)sb.st_size < offset + nbytes : (uint64_t)sb.st_size != nbytes)) {
        close(fd);
        return log_error_errno(
            -EIO, "store: blob '%s' holds %lld bytes, expected %" PRIu64 " at offset %" PRIu64,
            path, (long long)sb.st_size, nbytes, offset);
    }
    *ret_fd = fd;
    return 0;
}

/* pread()s exactly n bytes at offset into dst. */
static int pread_all(int fd, const char *path, char *dst, uint64_t n, uint64_t offset)
{
    uint64_t done = 0;
    while (done < n) {
        size_t chunk = n - done > (1u << 30) ? (1u << 30) : (size_t)(n - done);
        ssize_t k = pread(fd, dst + done, chunk, (off_t)(offset + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return log_error_errno(k < 0 ? -errno : -EIO, "store: reading blob '%s': %s", path,
                                   k < 0 ? strerror(errno) : "end of file");
        done += (uint64_t)k;
    }
    return 0;
}

/* Reads of at least this much are split among threads: one thread copies out of the page
 * cache far slower than a pinned copy to the GPU runs, and such reads feed those copies. */
#define PARALLEL_READ_MIN ((uint64_t)4 << 20)
#define PARALLEL_READERS 8

typedef struct read_part {
    int fd;
    const char *path;
    char *dst;
    uint64_t n, offset;
    int r;
} read_part_t;

static void *read_part(void *arg)
{
    read_part_t *p = arg;
    p->r = pread_all(p->fd, p->path, p->dst, p->n, p->offset);
    return NULL;
}

/* pread_all(), in page-aligned parts side by side for a large read; then closes fd. */
static int read_and_close(int fd, const char *path, char *dst, uint64_t n, uint64_t offset)
{
    int parts_n = n < PARALLEL_READ_MIN ? 1 : PARALLEL_READERS;
    /* Parts of whole pages, rounded up so that they cover all n bytes. */
    uint64_t per = ((n + (uint64_t)parts_n - 1) / (uint64_t)parts_n + 4095) & ~(uint64_t)4095;
    read_part_t parts[PARALLEL_READERS];
    pthread_t threads[PARALLEL_READERS];
    bool started[PARALLEL_READERS] = {false};
    for (int k = 0; k < parts_n; k++) {
        uint64_t from = (uint64_t)k * per < n ? (uint64_t)k * per : n;
        uint64_t len = n - from < per ? n - from : per;
        parts[k] = (read_part_t){fd, path, dst + from, len, offset + from, 0};
        if (k > 0 && len) started[k] = pthread_create(&threads[k], NULL, read_part, &parts[k]) == 0;
    }
    int r = 0;
    for (int k = 0; k < parts_n; k++) {
        if (started[k])
            pthread_join(threads[k], NULL);
        else
            read_part(&parts[k]); /* the first part, or one whose thread did not start */
        if (parts[k].r < 0 && r == 0) r = parts[k].r;
    }
    close(fd);
    return r;
}

int store_blob_file_read(const char *blobs_dir, const char *file, uint64_t offset, uint64_t nbytes,
                         void **ret_data)
{
    char path[PATH_MAX + 64];
    int fd;
    int r = blob_file_open(blobs_dir, file, offset, nbytes, path, &fd);
    if (r < 0) return r;
    char *data = malloc(nbytes ? nbytes : 1);
    if (!data) {
        close(fd);
        return -ENOMEM;
    }
    r = read_and_close(fd, path, data, nbytes, offset);
    if (r < 0) {
        free(data);
        return r;
    }
    *ret_data = data;
    return 0;
}

int store_blob_file_read_at(const char *blobs_dir, const char *file, uint64_t offset,
                            uint64_t nbytes, uint64_t at, void *dst, size_t n)
{
    char path[PATH_MAX + 64];
    int fd;
    int r = blob_file_open(blobs_dir, file, offset, nbytes, path, &fd);
    return r < 0 ? r : read_and_close(fd, path, dst, n, offset + at);
}

void store_blob_file_remove(const char *blobs_dir, const char *file)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", blobs_dir, file);
    struct stat sb;
    bool known = stat(path, &sb) == 0;
    if (unlink(path) < 0) {
        if (errno != ENOENT) log_warn("store: cannot remove blob '%s': %s", path, strerror(errno));
        return;
    }
    if (known) store_blob_bytes_moved(-(int64_t)sb.st_size);
}

/* ------------------------------------------------------------------ upload streams */

/* How far the disk may fall behind the bytes written before the stream asks it to catch up. */
#define STREAM_WRITEBACK_BYTES ((uint64_t)16 << 20)
/* Bytes gathered before they are written: HTTP hands them over 16-32 KiB at a time. */
#define STREAM_BUFFER_BYTES ((size_t)1 << 20)

struct store_blob_stream {
    int fd;
    uint64_t len;          /* bytes appended */
    uint64_t written;      /* of them in the file; the rest are in buf */
    uint64_t written_back; /* bytes whose writeback has been started */
    char *buf;             /* STREAM_BUFFER_BYTES */
    char file[4 + STORE_BLOB_NAME_LEN];
    char path[PATH_MAX + 64];
};

int store_blob_stream_open(const config_t *cfg, store_blob_stream_t **ret)
{
    char blobs_dir[PATH_MAX];
    if (snprintf(blobs_dir, sizeof blobs_dir, "%s/blobs", cfg->state_dir) >= (int)sizeof blobs_dir)
        return -ENAMETOOLONG;
    store_blob_stream_t *bs = calloc(1, sizeof *bs);
    char *buf = malloc(STREAM_BUFFER_BYTES);
    int r = bs && buf ? store_blob_file_create(blobs_dir, bs->file, bs->path, &bs->fd) : -ENOMEM;
    if (r < 0) {
        free(buf);
        free(bs);
        return r;
    }
    bs->buf = buf;
    *ret = bs;
    return 0;
}

/* Writes what the buffer holds; then starts the writeback of what has piled up, without
 * waiting for it: the disk writes while the rest arrives, instead of all of it in the sync at
 * the end. */
static int stream_flush(store_blob_stream_t *bs)
{
    int r = store_write_all(bs->fd, bs->buf, bs->len - bs->written, bs->written);
    if (r < 0) return r;
    bs->written = bs->len;
    if (bs->written - bs->written_back >= STREAM_WRITEBACK_BYTES) {
        sync_file_range(bs->fd, (off_t)bs->written_back, (off_t)(bs->written - bs->written_back),
                        SYNC_FILE_RANGE_WRITE);
        bs->written_back = bs->written;
    }
    return 0;
}

int store_blob_stream_write(store_blob_stream_t *bs, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        size_t room = STREAM_BUFFER_BYTES - (size_t)(bs->len - bs->written);
        size_t k = n < room ? n : room;
        memcpy(bs->buf + (bs->len - bs->written), p, k);
        bs->len += k;
        p += k;
        n -= k;
        if (bs->len - bs->written == STREAM_BUFFER_BYTES) {
            int r = stream_flush(bs);
            if (r < 0) return r;
        }
    }
    return 0;
}

int store_blob_stream_finish(store_blob_stream_t *bs, char **ret_blob)
{
    int r = stream_flush(bs);
    if (r == 0 && fdatasync(bs->fd) < 0) r = -errno;
    if (close(bs->fd) < 0 && r == 0) r = -errno;
    bs->fd = -1;
    char *blob = r == 0 ? store_locator_file(bs->file, 0) : NULL;
    if (r == 0 && !blob) r = -ENOMEM;
    if (r < 0) {
        log_error("store: syncing upload '%s': %s", bs->path, strerror(-r));
        store_blob_stream_abort(bs);
        return r;
    }
    store_blob_bytes_moved((int64_t)bs->len);
    free(bs->buf);
    free(bs);
    *ret_blob = blob;
    return 0;
}

void store_blob_stream_abort(store_blob_stream_t *bs)
{
    if (!bs) return;
    if (bs->fd >= 0) close(bs->fd);
    if (unlink(bs->path) < 0 && errno != ENOENT)
        log_warn("store: cannot remove upload '%s': %s", bs->path, strerror(errno));
    free(bs->buf);
    free(bs);
}

int store_blob_file_referenced(store_conn_t *conn, const char *file, int64_t pending, bool *ret)
{
    sqlite3_stmt *stmt = store_stmt(conn, STMT_FILE_REFERENCED);
    if (!stmt) return -EIO;
    store_bind_text(stmt, 1, file, false);
    if (sqlite3_step(stmt) != SQLITE_ROW) return store_sql_error(conn, "checking a blob file");
    *ret = sqlite3_column_int64(stmt, 0) + pending > 0 || sqlite3_column_int(stmt, 1) != 0;
    sqlite3_reset(stmt);
    return 0;
}

static int sweep_fan_dir(store_conn_t *const *conns, int n, const char *fan, int *removed)
{
    char fan_path[PATH_MAX + 8];
    snprintf(fan_path, sizeof fan_path, "%s/%s", conns[0]->blobs_dir, fan);
    DIR *dir = opendir(fan_path);
    if (!dir) return errno == ENOENT ? 0 : -errno;
    int r = 0;
    struct dirent *de;
    while (r == 0 && (de = readdir(dir))) {
        char file[4 + STORE_BLOB_NAME_LEN + 8];
        if (snprintf(file, sizeof file, "%s/%s", fan, de->d_name) >= (int)sizeof file ||
            !is_file_name(file))
            continue; /* not ours (or "." and ".."): leave it alone */
        bool used = false;
        for (int k = 0; k < n && r == 0 && !used; k++)
            r = store_blob_file_referenced(conns[k], file, 0, &used);
        if (r == 0 && !used) {
            store_blob_file_remove(conns[0]->blobs_dir, file);
            (*removed)++;
        }
    }
    closedir(dir);
    return r;
}

int store_blob_sweep_orphans(store_conn_t *const *conns, int n, int *ret_removed)
{
    DIR *dir = opendir(conns[0]->blobs_dir);
    if (!dir)
        return log_error_errno(-errno, "store: cannot open '%s': %s", conns[0]->blobs_dir,
                               strerror(errno));
    int removed = 0, r = 0;
    struct dirent *de;
    while (r == 0 && (de = readdir(dir)))
        if (strlen(de->d_name) == 2 && is_hex_name(de->d_name, 2))
            r = sweep_fan_dir(conns, n, de->d_name, &removed);
    closedir(dir);
    if (r < 0) return r;
    *ret_removed = removed;
    return 0;
}
