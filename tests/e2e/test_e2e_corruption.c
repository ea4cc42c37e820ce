/* End-to-end: a damaged state directory never loses data. A database file emptied, deleted
 * or failing its integrity check while blob files remain, and garbage in the middle of the
 * WAL, each make the real gpujobd refuse to start with an error that says why, and leave
 * every blob file where it was. */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
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

static int count_blob(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)path, (void)sb, (void)ftw;
    blob_count += flag == FTW_F;
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
    char state[PATH_MAX], log_path[PATH_MAX];
    snprintf(state, sizeof state, "%s/state", e2e_daemon_dir(d));
    snprintf(log_path, sizeof log_path, "%s/refused.log", e2e_daemon_dir(d));
    const char *bin = getenv("GPUJOBD_BIN");
    ck_assert_ptr_nonnull(bin);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) _exit(127);
        dup2(fd, STDERR_FILENO);
        dup2(fd, STDOUT_FILENO);
        execl(bin, bin, "--listen", "127.0.0.1:0", "--state-dir", state, "--backend", "cpu",
              "--set", "store.inline_blob_bytes=0", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    double until = e2e_now() + 30;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (e2e_now() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            ck_abort_msg("gpujobd started on a damaged state directory (log: %s)", log_path);
        }
        usleep(20 * 1000);
    }
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0,
                  "gpujobd ended with status 0x%x on a damaged state directory", status);
    FILE *f = fopen(log_path, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, text) && strstr(line, "error");
    fclose(f);
    ck_assert_msg(found, "no error line with '%s' in %s", text, log_path);
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

START_TEST(test_a_database_failing_its_integrity_check_is_refused)
{
    e2e_daemon_t *d = daemon_with_jobs(20);
    stop_ok(d);
    int blobs = blob_files(d);
    char db[PATH_MAX];
    state_path(d, "gpujobd.db", db);
    struct stat sb;
    ck_assert_int_eq(stat(db, &sb), 0);
    ck_assert_int_gt(sb.st_size, 8192);
    /* Garbage over every page but the first (the header and the schema's root). */
    int fd = open(db, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    char garbage[4096];
    memset(garbage, 0x5a, sizeof garbage);
    for (off_t at = 4096; at < sb.st_size; at += (off_t)sizeof garbage)
        ck_assert_int_eq(pwrite(fd, garbage, sizeof garbage, at), (ssize_t)sizeof garbage);
    close(fd);
    assert_start_refused(d, "integrity check");
    ck_assert_int_eq(blob_files(d), blobs);
    e2e_daemon_free(d);
}
END_TEST

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

START_TEST(test_garbage_in_the_middle_of_the_wal_is_refused)
{
    e2e_daemon_t *d = daemon_with_jobs(40);
    /* A kill leaves the WAL as it was: nothing checkpointed it (far below 1000 pages). */
    e2e_daemon_kill(d);
    int blobs = blob_files(d);
    char wal[PATH_MAX];
    state_path(d, "gpujobd.db-wal", wal);
    int fd = open(wal, O_RDWR);
    ck_assert_int_ge(fd, 0);
    unsigned char hdr[32], fh[24];
    ck_assert_int_eq(pread(fd, hdr, sizeof hdr, 0), (ssize_t)sizeof hdr);
    size_t frame = 24 + be32(hdr + 8);
    /* The frames of the WAL's current generation (its salts), and the commits among them. */
    int frames = 0, commits = 0;
    while (pread(fd, fh, sizeof fh, 32 + (off_t)(frames * frame)) == (ssize_t)sizeof fh &&
           memcmp(fh + 8, hdr + 16, 8) == 0) {
        commits += be32(fh + 4) != 0;
        frames++;
    }
    ck_assert_msg(commits >= 10, "the WAL holds %d commits, too few to damage its middle", commits);
    /* Garbage over the page of a frame in the middle. */
    unsigned char garbage[256];
    memset(garbage, 0xa5, sizeof garbage);
    off_t at = 32 + (off_t)((frames / 2) * frame) + 24 + 100;
    ck_assert_int_eq(pwrite(fd, garbage, sizeof garbage, at), (ssize_t)sizeof garbage);
    close(fd);
    assert_start_refused(d, "committed transaction(s) lie past a frame");
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
    tcase_add_test(tc, test_a_database_failing_its_integrity_check_is_refused);
    tcase_add_test(tc, test_garbage_in_the_middle_of_the_wal_is_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
