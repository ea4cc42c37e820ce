/* End-to-end: a damaged state directory never loses data. A database file emptied, deleted
 * or failing its integrity check (checked after a crash, not after a clean end) while blob
 * files remain makes the real gpujobd refuse to start with an error that says why. A WAL is
 * read as SQLite reads it: a tail torn by a power loss is normal, commits SQLite drops past
 * garbage in its middle are said at error level and the WAL is copied aside. Every blob file
 * stays where it was. */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* Every tensor in a blob file of its own. */
#define BLOB_CONFIG "[store]\ninline_blob_bytes = 0\n"

static int blob_count;
/* The paths of the files blob_files counted, the first MAX_BLOB_PATHS of them. */
#define MAX_BLOB_PATHS 1024
static char blob_paths[MAX_BLOB_PATHS][256];

static int count_blob(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    if (flag != FTW_F) return 0;
    if (blob_count < MAX_BLOB_PATHS)
        snprintf(blob_paths[blob_count], sizeof blob_paths[0], "%s", path);
    blob_count++;
    return 0;
}

/* Files under the daemon's state/blobs. */
static int blob_files(e2e_daemon_t *d)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/state/blobs", e2e_daemon_dir(d));
    blob_count = 0;
    nftw(path, count_blob, 16, FTW_PHYS);
    return blob_count;
}

static void state_path(e2e_daemon_t *d, const char *name, char path[PATH_MAX])
{
    snprintf(path, PATH_MAX, "%s/state/%s", e2e_daemon_dir(d), name);
}

/* A daemon with n finished jobs whose tensors are blob files. */
static e2e_daemon_t *daemon_with_jobs(int n)
{
    e2e_daemon_t *d = e2e_daemon_start_ok(BLOB_CONFIG);
    for (int i = 0; i < n; i++) {
        json_t *job = json_pack("{s:s, s:{s:{s:s, s:[i], s:[i,i]}, s:{s:s, s:[i], s:[i,i]}}}", "op",
                                "add", "inputs", "x", "dtype", "i32", "shape", 2, "data", i, i + 1,
                                "y", "dtype", "i32", "shape", 2, "data", 1, 1);
        char *id = e2e_submit_ok(d, job);
        json_decref(e2e_wait_final_ok(d, id, 30));
        free(id);
        json_decref(job);
    }
    ck_assert_int_gt(blob_files(d), 0);
    return d;
}

/* Starts gpujobd on d's state directory, which must refuse it: a non-zero exit within 30 s,
 * and an error line containing text in its log. */
static void assert_start_refused(e2e_daemon_t *d, const char *text)
{
    static const char *const extra[] = {"--set", "store.inline_blob_bytes=0", NULL};
    char log_path[PATH_MAX];
    int status = e2e_daemon_run_to_exit_ok(d, extra, "refused.log", 30, log_path, sizeof log_path);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0,
                  "gpujobd ended with status 0x%x on a damaged state directory", status);
    ck_assert_msg(e2e_file_has_line(log_path, text, "error"), "no error line with '%s' in %s", text,
                  log_path);
}

static void stop_ok(e2e_daemon_t *d)
{
    int status = 0;
    ck_assert_int_eq(e2e_daemon_stop(d, 30000, &status), 0);
}

START_TEST(test_an_empty_database_with_blob_files_is_refused)
{
    e2e_daemon_t *d = daemon_with_jobs(5);
    stop_ok(d);
    int blobs = blob_files(d);
    char db[PATH_MAX];
    state_path(d, "gpujobd.db", db);
    ck_assert_int_eq(truncate(db, 0), 0);
    assert_start_refused(d, "is empty (0 bytes)");
    ck_assert_int_eq(blob_files(d), blobs);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_a_missing_database_with_blob_files_is_refused)
{
    e2e_daemon_t *d = daemon_with_jobs(5);
    stop_ok(d);
    int blobs = blob_files(d);
    const char *names[] = {"gpujobd.db", "gpujobd.db-wal", "gpujobd.db-shm"};
    for (int i = 0; i < 3; i++) {
        char path[PATH_MAX];
        state_path(d, names[i], path);
        unlink(path);
    }
    assert_start_refused(d, "is missing");
    ck_assert_int_eq(blob_files(d), blobs);
    e2e_daemon_free(d);
}
END_TEST

/* Writes garbage over len bytes of the file at path from offset at. */
static void garbage_over(const char *path, off_t at, off_t len)
{
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    char garbage[4096];
    memset(garbage, 0x5a, sizeof garbage);
    for (off_t end = at + len; at < end; at += (off_t)sizeof garbage) {
        size_t n = end - at < (off_t)sizeof garbage ? (size_t)(end - at) : sizeof garbage;
        ck_assert_int_eq(pwrite(fd, garbage, n, at), (ssize_t)n);
    }
    close(fd);
}

/* Garbage over every page but the first (the header and the schema's root) of d's stopped
 * database file, which must be larger than two pages. */
static void damage_database(e2e_daemon_t *d)
{
    char db[PATH_MAX];
    state_path(d, "gpujobd.db", db);
    struct stat sb;
    ck_assert_int_eq(stat(db, &sb), 0);
    ck_assert_int_gt(sb.st_size, 8192);
    garbage_over(db, 4096, sb.st_size - 4096);
}

START_TEST(test_a_database_failing_its_integrity_check_after_a_crash_is_refused)
{
    e2e_daemon_t *d = daemon_with_jobs(20);
    stop_ok(d); /* a clean stop checkpoints the WAL into the database file */
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    e2e_daemon_kill(d); /* a crash: the next start must check */
    int blobs = blob_files(d);
    damage_database(d);
    assert_start_refused(d, "integrity check");
    ck_assert_int_eq(blob_files(d), blobs);
    e2e_daemon_free(d);
}
END_TEST

#define CHECKED "checking its integrity (PRAGMA quick_check)"
#define NOT_CHECKED "closed the store cleanly: no integrity check"

START_TEST(test_the_integrity_check_runs_only_after_an_unclean_end)
{
    e2e_daemon_t *d = daemon_with_jobs(3);
    /* A new store: no previous run, nothing said. */
    ck_assert_int_eq(e2e_daemon_log_count(d, CHECKED), 0);
    ck_assert_int_eq(e2e_daemon_log_count(d, NOT_CHECKED), 0);
    stop_ok(d);
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    ck_assert_int_eq(e2e_daemon_log_count(d, NOT_CHECKED), 1);
    /* A restart in place closes the store as a stop does. */
    kill(e2e_daemon_pid(d), SIGUSR1);
    double until = e2e_now() + 30;
    while (e2e_daemon_log_count(d, NOT_CHECKED) < 2 && e2e_now() < until)
        usleep(20 * 1000);
    ck_assert_int_eq(e2e_daemon_log_count(d, NOT_CHECKED), 2);
    json_decref(e2e_json_until(d, "GET", "/v1/jobs?limit=1", 200, e2e_now() + 30));
    e2e_daemon_kill(d);
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    ck_assert_int_eq(e2e_daemon_log_count(d, CHECKED), 1);
    ck_assert_int_eq(e2e_daemon_log_count(d, NOT_CHECKED), 2);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=succeeded"), 3);
    e2e_daemon_free(d);
}
END_TEST

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* The WAL of d's stopped daemon: its header, frame size, and the number of frames of its
 * current generation (its salts), and the commits among them. */
typedef struct wal_file {
    int fd;
    unsigned char hdr[32];
    size_t frame;
    int frames, commits;
    unsigned char last_sum[8]; /* the checksum of the last frame of the generation */
} wal_file_t;

static void wal_open(e2e_daemon_t *d, wal_file_t *w)
{
    char wal[PATH_MAX];
    state_path(d, "gpujobd.db-wal", wal);
    w->fd = open(wal, O_RDWR);
    ck_assert_int_ge(w->fd, 0);
    ck_assert_int_eq(pread(w->fd, w->hdr, sizeof w->hdr, 0), (ssize_t)sizeof w->hdr);
    w->frame = 24 + be32(w->hdr + 8);
    w->frames = w->commits = 0;
    unsigned char fh[24];
    while (pread(w->fd, fh, sizeof fh, 32 + (off_t)(w->frames * w->frame)) == (ssize_t)sizeof fh &&
           memcmp(fh + 8, w->hdr + 16, 8) == 0) {
        w->commits += be32(fh + 4) != 0;
        memcpy(w->last_sum, fh + 16, 8);
        w->frames++;
    }
    ck_assert_msg(w->commits >= 10, "the WAL holds %d commits, too few", w->commits);
}

/* A 32-bit word in the byte order of the WAL's checksums (big-endian when its magic is odd). */
static uint32_t sum32(const unsigned char *p, bool big_endian)
{
    return big_endian ? be32(p)
                      : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* SQLite's WAL checksum of n bytes, continuing from s. */
static void wal_sum(const unsigned char *p, size_t n, bool big_endian, uint32_t s[2])
{
    for (size_t i = 0; i < n; i += 8) {
        s[0] += sum32(p + i, big_endian) + s[1];
        s[1] += sum32(p + i + 4, big_endian) + s[0];
    }
}

/* Garbage over the root page of index name of d's stopped database file: a page that neither
 * the start nor recovery reads, which only the whole integrity check finds. */
static void damage_index(e2e_daemon_t *d, const char *name)
{
    char db[PATH_MAX];
    state_path(d, "gpujobd.db", db);
    sqlite3 *h;
    sqlite3_stmt *stmt;
    ck_assert_int_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(h,
                                        "SELECT rootpage, (SELECT page_size FROM pragma_page_size)"
                                        " FROM sqlite_schema WHERE name = ?1",
                                        -1, &stmt, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(stmt, 1, name, -1, SQLITE_STATIC);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
    off_t page = sqlite3_column_int64(stmt, 0), size = sqlite3_column_int64(stmt, 1);
    sqlite3_finalize(stmt);
    ck_assert_int_eq(sqlite3_close(h), SQLITE_OK);
    ck_assert_int_gt(page, 1);
    garbage_over(db, (page - 1) * size, size);
}

/* A damage that recovery does not read lets the daemon start; the integrity check that runs
 * once it serves finds it: an error line, /healthz, /readyz and /metrics say so, a new job is
 * refused, and what is stored can still be read. */
START_TEST(test_a_damage_found_after_ready_refuses_writes)
{
    e2e_daemon_t *d = daemon_with_jobs(5);
    stop_ok(d); /* a clean stop checkpoints the WAL into the database file */
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    e2e_daemon_kill(d); /* a crash: the next start must check */
    damage_index(d, "buffers_owner");
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    /* Healthy at first, until the check, on a thread of its own, comes to the page. */
    e2e_response_t resp = {0};
    for (double until = e2e_now() + 30; e2e_now() < until; usleep(20 * 1000)) {
        e2e_response_clear(&resp);
        ck_assert_int_eq(e2e_http_request(d, "GET", "/healthz", NULL, NULL, 0, &resp), 0);
        if (resp.status != 200) break;
    }
    ck_assert_int_eq(resp.status, 503);
    json_t *health = json_incref(resp.json);
    e2e_response_clear(&resp);
    ck_assert_str_eq(json_string_value(json_object_get(health, "status")), "store_damaged");
    ck_assert_ptr_nonnull(
        strstr(json_string_value(json_object_get(health, "reason")), "gpujobd.db"));
    json_decref(health);
    ck_assert_int_eq(e2e_daemon_log_count(d, "fails its integrity check"), 1);
    json_t *ready = e2e_json_ok(d, "GET", "/readyz", NULL, 503);
    ck_assert_str_eq(json_string_value(json_object_get(ready, "status")), "store_damaged");
    json_decref(ready);
    e2e_response_t metrics = {0};
    ck_assert_int_eq(e2e_http_request(d, "GET", "/metrics", NULL, NULL, 0, &metrics), 0);
    ck_assert_ptr_nonnull(strstr(metrics.body, "\ngpujobd_store_damaged 1\n"));
    e2e_response_clear(&metrics);
    e2e_response_t sub = {0};
    static const char job[] = "{\"op\": \"add\", \"inputs\": {\"x\": {\"dtype\": \"i32\", "
                              "\"shape\": [1], \"data\": [1]}, \"y\": {\"dtype\": \"i32\", "
                              "\"shape\": [1], \"data\": [2]}}}";
    static const char *const json_type[] = {"Content-Type: application/json", NULL};
    ck_assert_int_eq(e2e_http_request(d, "POST", "/v1/jobs", json_type, job, strlen(job), &sub), 0);
    ck_assert_int_ge(sub.status, 500);
    e2e_response_clear(&sub);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=succeeded"), 5);
    e2e_daemon_free(d);
}
END_TEST

START_TEST(test_garbage_in_the_middle_of_the_wal_is_kept_aside)
{
    e2e_daemon_t *d = daemon_with_jobs(40);
    /* A kill leaves the WAL as it was: nothing checkpointed it (far below 1000 pages). */
    e2e_daemon_kill(d);
    int blobs = blob_files(d);
    static char kept[MAX_BLOB_PATHS][256];
    memcpy(kept, blob_paths, sizeof kept);
    wal_file_t w;
    wal_open(d, &w);
    /* Garbage over the page of a frame in the middle. */
    unsigned char garbage[256];
    memset(garbage, 0xa5, sizeof garbage);
    off_t at = 32 + (off_t)((w.frames / 2) * w.frame) + 24 + 100;
    ck_assert_int_eq(pwrite(w.fd, garbage, sizeof garbage, at), (ssize_t)sizeof garbage);
    close(w.fd);
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    ck_assert_int_eq(e2e_daemon_log_count(d, "past a frame whose checksum fails"), 1);
    ck_assert_int_eq(e2e_daemon_log_count(d, "A copy of the WAL is kept in"), 1);
    char quarantine[PATH_MAX];
    state_path(d, "quarantine", quarantine);
    DIR *dir = opendir(quarantine);
    ck_assert_ptr_nonnull(dir);
    int copies = 0;
    struct dirent *e;
    while ((e = readdir(dir)))
        copies += strncmp(e->d_name, "gpujobd.db-wal.", 15) == 0;
    closedir(dir);
    ck_assert_int_eq(copies, 1);
    /* Files of the dropped commits are not orphans: every one is still there. Jobs whose end
     * was among the dropped commits run again, and may add files of their own. */
    ck_assert_int_le(blobs, MAX_BLOB_PATHS);
    for (int i = 0; i < blobs; i++)
        ck_assert_msg(access(kept[i], F_OK) == 0, "'%s' was removed", kept[i]);
    e2e_daemon_free(d);
}
END_TEST

/* A power loss during an unsynced write leaves the WAL with a tail SQLite ignores: here a
 * frame whose header was written but whose page was not, then a whole commit frame written
 * before it (disks write back out of order), then half a frame. Every job committed before
 * that tail is kept, and the daemon starts. */
START_TEST(test_a_torn_wal_tail_keeps_every_committed_job)
{
    e2e_daemon_t *d = daemon_with_jobs(12);
    e2e_daemon_kill(d);
    int blobs = blob_files(d);
    wal_file_t w;
    wal_open(d, &w);
    bool big_endian = be32(w.hdr) & 1;
    unsigned char *tail = calloc(3, w.frame);
    ck_assert_ptr_nonnull(tail);
    unsigned char *torn = tail, *commit = tail + w.frame;
    put_be32(torn, 2);
    memcpy(torn + 8, w.hdr + 16, 8);
    uint32_t s[2] = {be32(w.last_sum), be32(w.last_sum + 4)};
    memset(torn + 24, 0x11, w.frame - 24);
    wal_sum(torn, 8, big_endian, s);
    wal_sum(torn + 24, w.frame - 24, big_endian, s);
    put_be32(torn + 16, s[0]), put_be32(torn + 20, s[1]);
    memset(torn + 24 + (w.frame - 24) / 2, 0, (w.frame - 24) / 2); /* the page cut short */
    put_be32(commit, 3);
    put_be32(commit + 4, 1000); /* a commit: the database's size in pages after it */
    memcpy(commit + 8, w.hdr + 16, 8);
    memset(commit + 24, 0x22, w.frame - 24);
    wal_sum(commit, 8, big_endian, s);
    wal_sum(commit + 24, w.frame - 24, big_endian, s);
    put_be32(commit + 16, s[0]), put_be32(commit + 20, s[1]);
    memset(tail + 2 * w.frame, 0x33, w.frame / 2);
    off_t end = 32 + (off_t)(w.frames * w.frame);
    size_t len = 2 * w.frame + w.frame / 2;
    ck_assert_int_eq(pwrite(w.fd, tail, len, end), (ssize_t)len);
    ck_assert_int_eq(ftruncate(w.fd, end + (off_t)len), 0);
    close(w.fd);
    free(tail);
    ck_assert_int_eq(e2e_daemon_restart(d), 0);
    ck_assert_int_eq(e2e_count_jobs_ok(d, "state=succeeded"), 12);
    ck_assert_int_eq(e2e_count_jobs_ok(d, ""), 12);
    ck_assert_int_eq(blob_files(d), blobs);
    e2e_daemon_free(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e_corruption");
    TCase *tc = tcase_create("corruption");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_an_empty_database_with_blob_files_is_refused);
    tcase_add_test(tc, test_a_missing_database_with_blob_files_is_refused);
    tcase_add_test(tc, test_a_database_failing_its_integrity_check_after_a_crash_is_refused);
    tcase_add_test(tc, test_the_integrity_check_runs_only_after_an_unclean_end);
    tcase_add_test(tc, test_a_damage_found_after_ready_refuses_writes);
    tcase_add_test(tc, test_garbage_in_the_middle_of_the_wal_is_kept_aside);
    tcase_add_test(tc, test_a_torn_wal_tail_keeps_every_committed_job);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
