/* The commit syncer (daemon/commit_sync.h) on a real store's WAL file. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/commit_sync.h"
#include "daemon/store.h"

typedef struct notified {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int calls;
} notified_t;

static void on_notify(void *ud)
{
    notified_t *n = ud;
    pthread_mutex_lock(&n->lock);
    n->calls++;
    pthread_cond_broadcast(&n->cond);
    pthread_mutex_unlock(&n->lock);
}

/* Waits (at most 5 s) until ticket is done; returns the sync error. */
static int wait_done(commit_sync_t *cs, notified_t *n, uint64_t ticket)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    int err = 0;
    pthread_mutex_lock(&n->lock);
    while (commit_sync_done(cs, &err) < ticket)
        ck_assert_int_eq(pthread_cond_timedwait(&n->cond, &n->lock, &until), 0);
    pthread_mutex_unlock(&n->lock);
    return err;
}

static char dir[] = "/tmp/gj-csync-XXXXXX";
static notified_t note;

static void setup(void)
{
    strcpy(dir, "/tmp/gj-csync-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    memset(&note, 0, sizeof note);
    pthread_mutex_init(&note.lock, NULL);
    pthread_cond_init(&note.cond, NULL);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* A store in dir, with a relaxed commit in its WAL. */
static store_t *open_store(bool sync_full, config_t *cfg)
{
    config_defaults(cfg);
    snprintf(cfg->state_dir, sizeof cfg->state_dir, "%s", dir);
    cfg->sync_full = sync_full;
    store_t *st;
    ck_assert_int_eq(store_open(cfg, &st), 0);
    ck_assert_int_eq(store_begin_relaxed(st), 0);
    buffer_t *buf = buffer_new();
    id_new('b', buf->id);
    snprintf(buf->owner, sizeof buf->owner, "alice");
    buf->desc = (tensor_desc_t){DTYPE_F32, 1, {4}};
    buf->nbytes = 16;
    buf->data = calloc(1, 16);
    buf->device = -1;
    ck_assert_int_eq(store_buffer_insert(st, buf), 0);
    ck_assert_int_eq(store_commit(st), 0);
    buffer_free(buf);
    return st;
}

START_TEST(test_the_store_names_its_wal_only_with_sync_full)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    const char *wal = store_wal_path(st);
    ck_assert_ptr_nonnull(wal);
    char expected[PATH_MAX];
    snprintf(expected, sizeof expected, "%s/gpujobd.db-wal", dir);
    ck_assert_str_eq(wal, expected);
    struct stat sb;
    ck_assert_int_eq(stat(wal, &sb), 0);
    ck_assert_int_gt(sb.st_size, 0); /* the relaxed commit is in it */
    store_close(st);
    st = open_store(false, &cfg);
    ck_assert_ptr_null(store_wal_path(st));
    store_close(st);
}
END_TEST

START_TEST(test_every_ticket_is_synced_and_each_sync_notifies)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    commit_sync_t *cs;
    ck_assert_int_eq(commit_sync_start(store_wal_path(st), on_notify, &note, &cs), 0);
    uint64_t last = 0;
    for (int i = 0; i < 50; i++) {
        uint64_t t = commit_sync_request(cs);
        ck_assert_uint_eq(t, last + 1); /* tickets count the requests */
        last = t;
    }
    ck_assert_int_eq(wait_done(cs, &note, last), 0);
    /* Requests made while a sync ran share the next one: at most one call per request. */
    pthread_mutex_lock(&note.lock);
    ck_assert_int_ge(note.calls, 1);
    ck_assert_int_le(note.calls, 50);
    pthread_mutex_unlock(&note.lock);
    int err;
    ck_assert_uint_eq(commit_sync_done(cs, &err), last);
    commit_sync_free(cs);
    store_close(st);
}
END_TEST

START_TEST(test_a_failed_sync_fails_its_ticket_and_every_later_one)
{
    /* fdatasync on a procfs file fails with EINVAL: a stand-in for a disk that fails. */
    commit_sync_t *cs;
    ck_assert_int_eq(commit_sync_start("/proc/self/stat", on_notify, &note, &cs), 0);
    ck_assert_int_eq(wait_done(cs, &note, commit_sync_request(cs)), -EINVAL);
    ck_assert_int_eq(wait_done(cs, &note, commit_sync_request(cs)), -EINVAL);
    commit_sync_free(cs);
}
END_TEST

START_TEST(test_a_missing_wal_counts_as_synced)
{
    /* SQLite removes the WAL only after checkpointing it into the synced database file. */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/none.db-wal", dir);
    commit_sync_t *cs;
    ck_assert_int_eq(commit_sync_start(path, on_notify, &note, &cs), 0);
    ck_assert_int_eq(wait_done(cs, &note, commit_sync_request(cs)), 0);
    commit_sync_free(cs);
}
END_TEST

START_TEST(test_stop_finishes_the_syncs_asked_for)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    commit_sync_t *cs;
    ck_assert_int_eq(commit_sync_start(store_wal_path(st), on_notify, &note, &cs), 0);
    uint64_t t = 0;
    for (int i = 0; i < 3; i++)
        t = commit_sync_request(cs);
    commit_sync_stop(cs);
    int err = -1;
    ck_assert_uint_eq(commit_sync_done(cs, &err), t);
    ck_assert_int_eq(err, 0);
    commit_sync_free(cs);
    store_close(st);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("commit_sync");
    TCase *tc = tcase_create("commit_sync");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_the_store_names_its_wal_only_with_sync_full);
    tcase_add_test(tc, test_every_ticket_is_synced_and_each_sync_notifies);
    tcase_add_test(tc, test_a_failed_sync_fails_its_ticket_and_every_later_one);
    tcase_add_test(tc, test_a_missing_wal_counts_as_synced);
    tcase_add_test(tc, test_stop_finishes_the_syncs_asked_for);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
