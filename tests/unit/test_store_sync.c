/* The WAL sync thread (daemon/store/store_internal.h, store_sync_*) on a real store's WAL file. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/store/store.h"
#include "daemon/store/store_internal.h" /* the WAL sync thread and the checkpointer */

/* Items that record how they were done. */
typedef struct probe {
    store_sync_item_t item;
    int order; /* 1 + how many items were done before it; 0 until done */
    int err;
} probe_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int n_done;

static void on_done(store_sync_item_t *item, int err)
{
    probe_t *p = (probe_t *)(void *)item;
    pthread_mutex_lock(&lock);
    p->order = ++n_done;
    p->err = err;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

/* Queues p, waiting for the syncs of the WAL files wals names (0: all). */
static void request_wals(store_sync_t *cs, probe_t *p, unsigned wals)
{
    memset(p, 0, sizeof *p);
    p->item.done = on_done;
    p->item.scope = wals;
    store_sync_request(cs, &p->item);
}

static void request(store_sync_t *cs, probe_t *p)
{
    request_wals(cs, p, 0);
}

/* Waits (at most 5 s) until p is done; returns its error. */
static int wait_done(probe_t *p)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&lock);
    while (!p->order)
        ck_assert_int_eq(pthread_cond_timedwait(&cond, &lock, &until), 0);
    pthread_mutex_unlock(&lock);
    return p->err;
}

static char dir[] = "/tmp/gj-csync-XXXXXX";

static void setup(void)
{
    strcpy(dir, "/tmp/gj-csync-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    n_done = 0;
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

/* A syncer of the store's WAL files. */
static store_sync_t *start_syncer(store_t *st, store_checkpointer_t *cp)
{
    const char *wals[STORE_MAX_SHARDS];
    int n = store_wal_paths(st, wals);
    ck_assert_int_gt(n, 0);
    store_sync_t *cs;
    ck_assert_int_eq(store_sync_start(wals, n, cp, &cs), 0);
    return cs;
}

/* A syncer of one file that is no store's. */
static store_sync_t *start_syncer_of(const char *path)
{
    store_sync_t *cs;
    ck_assert_int_eq(store_sync_start(&path, 1, NULL, &cs), 0);
    return cs;
}

START_TEST(test_the_store_names_its_wal_only_with_sync_full)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    const char *wals[STORE_MAX_SHARDS];
    ck_assert_int_eq(store_wal_paths(st, wals), 1);
    char expected[PATH_MAX];
    snprintf(expected, sizeof expected, "%s/gpujobd.db-wal", dir);
    ck_assert_str_eq(wals[0], expected);
    struct stat sb;
    ck_assert_int_eq(stat(wals[0], &sb), 0);
    ck_assert_int_gt(sb.st_size, 0); /* the relaxed commit is in it */
    store_close(st);
    st = open_store(false, &cfg);
    ck_assert_int_eq(store_wal_paths(st, wals), 0);
    store_close(st);
}
END_TEST

START_TEST(test_every_item_is_done_once_in_the_order_it_came)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    store_sync_t *cs = start_syncer(st, NULL);
    enum { N = 50 };
    probe_t probes[N];
    for (int i = 0; i < N; i++)
        request(cs, &probes[i]);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(wait_done(&probes[i]), 0);
        ck_assert_int_eq(probes[i].order, i + 1);
    }
    store_sync_free(cs);
    ck_assert_int_eq(n_done, N); /* none twice */
    store_close(st);
}
END_TEST

START_TEST(test_a_failed_sync_fails_its_items_and_every_later_one)
{
    /* fdatasync on a procfs file fails with EINVAL: a stand-in for a disk that fails. */
    store_sync_t *cs = start_syncer_of("/proc/self/stat");
    probe_t first, second;
    request(cs, &first);
    ck_assert_int_eq(wait_done(&first), -EINVAL);
    request(cs, &second);
    ck_assert_int_eq(wait_done(&second), -EINVAL);
    store_sync_free(cs);
}
END_TEST

START_TEST(test_a_missing_wal_fails_the_sync)
{
    /* SQLite keeps its WAL while a connection is open: one that is gone was removed behind its
     * back, and its frames cannot be synced through the name. */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/none.db-wal", dir);
    store_sync_t *cs = start_syncer_of(path);
    ck_assert_int_eq(store_sync_error(cs), 0);
    probe_t p;
    request(cs, &p);
    ck_assert_int_eq(wait_done(&p), -ENOENT);
    ck_assert_int_eq(store_sync_error(cs), -ENOENT);
    store_sync_free(cs);
}
END_TEST

/* An item waits for the syncs of the files it names only: one that fails to sync fails the
 * items that need it. */
START_TEST(test_an_item_waits_for_the_wal_files_it_names)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    const char *wals[STORE_MAX_SHARDS];
    ck_assert_int_eq(store_wal_paths(st, wals), 1);
    wals[1] = "/proc/self/stat"; /* fdatasync fails there with EINVAL */
    store_sync_t *cs;
    ck_assert_int_eq(store_sync_start(wals, 2, NULL, &cs), 0);
    probe_t good, bad;
    request_wals(cs, &good, 1u << 0);
    ck_assert_int_eq(wait_done(&good), 0);
    request_wals(cs, &bad, 1u << 1);
    ck_assert_int_eq(wait_done(&bad), -EINVAL);
    store_sync_free(cs);
    store_close(st);
}
END_TEST

START_TEST(test_free_finishes_the_items_queued)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    store_sync_t *cs = start_syncer(st, NULL);
    probe_t probes[3];
    for (int i = 0; i < 3; i++)
        request(cs, &probes[i]);
    store_sync_free(cs);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(probes[i].order, i + 1);
        ck_assert_int_eq(probes[i].err, 0);
    }
    store_close(st);
}
END_TEST

static off_t file_size(const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    return sb.st_size;
}

enum { COMMITS = 200, COMMIT_BYTES = 32 << 10 }; /* about 1,600 WAL pages in all */

/* A relaxed commit of one buffer of COMMIT_BYTES, kept in its row. */
static void commit_a_buffer(store_t *st)
{
    ck_assert_int_eq(store_begin_relaxed(st), 0);
    buffer_t *buf = buffer_new();
    id_new('b', buf->id);
    snprintf(buf->owner, sizeof buf->owner, "alice");
    buf->desc = (tensor_desc_t){DTYPE_F32, 1, {COMMIT_BYTES / 4}};
    buf->nbytes = COMMIT_BYTES;
    buf->data = calloc(1, COMMIT_BYTES);
    buf->device = -1;
    ck_assert_int_eq(store_buffer_insert(st, buf), 0);
    ck_assert_int_eq(store_commit(st), 0);
    buffer_free(buf);
}

/* The checkpointer's due callback: asks the syncer (once there is one), and counts. */
static store_sync_t *due_syncer;
static atomic_int due_calls;
static void on_due(void *arg)
{
    (void)arg;
    atomic_fetch_add(&due_calls, 1);
    if (due_syncer) store_sync_checkpoint_soon(due_syncer);
}

static store_checkpointer_t *open_checkpointer(store_t *st, const config_t *cfg)
{
    due_syncer = NULL;
    atomic_store(&due_calls, 0);
    store_checkpointer_t *cp;
    ck_assert_int_eq(store_checkpointer_open(st, on_due, NULL, &cp), 0);
    return cp;
}

START_TEST(test_with_a_checkpointer_the_writer_leaves_the_wal_to_it)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    store_checkpointer_t *cp = open_checkpointer(st, &cfg);
    off_t db_before = file_size("gpujobd.db");
    for (int i = 0; i < COMMITS; i++)
        commit_a_buffer(st);
    /* Past SQLite's 1,000 pages the writer would have copied them back itself; it called
     * for the checkpointer instead. */
    ck_assert_int_eq(file_size("gpujobd.db"), db_before);
    ck_assert_int_gt(atomic_load(&due_calls), 0);
    ck_assert_int_eq(store_checkpointer_run(cp), 0);
    ck_assert_int_ge(file_size("gpujobd.db"), db_before + (off_t)COMMITS * COMMIT_BYTES);
    /* All of it copied back, the WAL starts over at the next commit instead of growing. */
    off_t wal = file_size("gpujobd.db-wal");
    commit_a_buffer(st);
    ck_assert_int_eq(file_size("gpujobd.db-wal"), wal);
    store_checkpointer_close(cp);
    store_close(st);
}
END_TEST

START_TEST(test_the_syncer_runs_the_checkpointer_after_its_rounds)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    store_checkpointer_t *cp = open_checkpointer(st, &cfg); /* due calls reach no syncer */
    store_sync_t *cs = start_syncer(st, cp);
    off_t db_before = file_size("gpujobd.db");
    static probe_t probes[COMMITS];
    for (int i = 0; i < COMMITS; i++) {
        commit_a_buffer(st);
        request(cs, &probes[i]);
    }
    for (int i = 0; i < COMMITS; i++)
        ck_assert_int_eq(wait_done(&probes[i]), 0);
    store_sync_free(cs); /* after its last round */
    /* The first 1,000 pages at least went back to the database file. */
    ck_assert_int_ge(file_size("gpujobd.db"), db_before + 1000 * 4096 - 64 * 4096);
    store_checkpointer_close(cp);
    store_close(st);
}
END_TEST

START_TEST(test_commits_that_answer_no_one_get_checkpointed_too)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    store_checkpointer_t *cp = open_checkpointer(st, &cfg);
    store_sync_t *cs = start_syncer(st, cp);
    due_syncer = cs;
    off_t db_before = file_size("gpujobd.db");
    for (int i = 0; i < COMMITS; i++) /* no item asks for a sync */
        commit_a_buffer(st);
    double waited = 0;
    while (file_size("gpujobd.db") < db_before + 1000 * 4096 - 64 * 4096 && waited < 5) {
        usleep(10000);
        waited += 0.01;
    }
    ck_assert_int_ge(file_size("gpujobd.db"), db_before + 1000 * 4096 - 64 * 4096);
    store_sync_free(cs);
    due_syncer = NULL;
    store_checkpointer_close(cp);
    store_close(st);
}
END_TEST

/* A steady stream of commits beside the checkpointer: its PASSIVE checkpoints never reach the
 * WAL's end, and unless the writer finished one the WAL would grow with every commit (16,000
 * pages of them here). */
static atomic_bool writing;
static atomic_int checkpoint_errors; /* counted here, asserted on the test's own thread */
static void *checkpoint_loop(void *arg)
{
    while (atomic_load(&writing))
        if (store_checkpointer_run(arg) < 0) atomic_fetch_add(&checkpoint_errors, 1);
    return NULL;
}

START_TEST(test_the_wal_stays_bounded_under_a_steady_stream_of_commits)
{
    config_t cfg;
    store_t *st = open_store(true, &cfg);
    store_checkpointer_t *cp = open_checkpointer(st, &cfg);
    atomic_store(&writing, true);
    atomic_store(&checkpoint_errors, 0);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, checkpoint_loop, cp), 0);
    for (int i = 0; i < 10 * COMMITS; i++)
        commit_a_buffer(st);
    atomic_store(&writing, false);
    pthread_join(t, NULL);
    ck_assert_int_eq(atomic_load(&checkpoint_errors), 0);
    /* 4,000 pages before the writer steps in, and commits more while the checkpointer
     * finishes its pass, but never past 8,000: there the writer waits for the pass (a loaded
     * machine gets there). A WAL that nothing bounds reaches 16,000. */
    ck_assert_int_lt(file_size("gpujobd.db-wal"), (off_t)8200 * 4120);
    store_checkpointer_close(cp);
    store_close(st);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_sync");
    TCase *tc = tcase_create("store_sync");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_the_store_names_its_wal_only_with_sync_full);
    tcase_add_test(tc, test_every_item_is_done_once_in_the_order_it_came);
    tcase_add_test(tc, test_a_failed_sync_fails_its_items_and_every_later_one);
    tcase_add_test(tc, test_a_missing_wal_fails_the_sync);
    tcase_add_test(tc, test_free_finishes_the_items_queued);
    tcase_add_test(tc, test_an_item_waits_for_the_wal_files_it_names);
    tcase_add_test(tc, test_with_a_checkpointer_the_writer_leaves_the_wal_to_it);
    tcase_add_test(tc, test_the_syncer_runs_the_checkpointer_after_its_rounds);
    tcase_add_test(tc, test_commits_that_answer_no_one_get_checkpointed_too);
    tcase_add_test(tc, test_the_wal_stays_bounded_under_a_steady_stream_of_commits);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
