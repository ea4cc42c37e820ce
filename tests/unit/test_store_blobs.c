/* The durable store's tensor bytes (daemon/store/store.h): inline or in files, small tensors
 * packed into shared segments that go with their last job, large ones read whole and by range,
 * the byte count kept without walking the directory, and files no row names swept at open. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/store.h"
#include "daemon/store/store_internal.h" /* STORE_SEGMENT_MIN_BYTES, STORE_TXN_ROW_BYTES */
#include "support/run_suite.h"
#include "support/store_test.h"

START_TEST(test_blob_write_files_only_large_data_and_insert_uses_the_callers_blob)
{
    store_test_t f;
    store_test_setup(&f);
    char small[STORE_TEST_INLINE_LIMIT], *blob = (char *)"untouched";
    store_test_fill_bytes(small, sizeof small, 1);
    ck_assert_int_eq(store_blob_write(f.st, small, sizeof small, &blob), 0);
    ck_assert_ptr_null(blob);
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);

    job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
    job->call.has_in[1] = true;
    store_test_tensor_set(&job->in[1], "y", 2048, 5);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_blob_write(f.st, job->in[1].data, job->in[1].nbytes, &blob), 0);
    ck_assert_ptr_nonnull(blob);
    ck_assert(store_test_blob_file_exists(&f, blob));
    job->in[1].blob = strdup(blob);
    free(job->in[1].data); /* as the scheduler does for a large input: the file holds it now */
    job->in[1].data = NULL;
    ck_assert_ptr_null(job->in[1].data);
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    ck_assert_str_eq(job->in[1].blob, blob);
    ck_assert_int_eq(store_test_count_blob_files(&f), 1); /* the insert wrote no second copy */

    job_t *got = store_test_get_job(&f, job->id);
    ck_assert_str_eq(got->in[1].blob, blob);
    void *expected = malloc(job->in[1].nbytes);
    store_test_fill_bytes(expected, job->in[1].nbytes, 5);
    store_test_assert_blob_bytes(&f, got->in[1].blob, expected, job->in[1].nbytes);
    free(expected);
    free(blob);
    job_free(got);
    job_free(job);
    store_test_teardown(&f);
}
END_TEST

/* store_bytes counts blob files as the store writes and removes them, without walking blobs/
 * at each call: a file put there by hand is not seen until the next walk. */
START_TEST(test_store_bytes_counts_blob_files_without_walking_the_directory)
{
    store_test_t f;
    store_test_setup(&f);
    uint64_t before = 0, after = 0;
    ck_assert_int_eq(store_bytes(f.st, &before), 0);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/blobs/by-hand", f.dir);
    FILE *hand = fopen(path, "w");
    ck_assert_ptr_nonnull(hand);
    static char junk[100000];
    ck_assert_uint_eq(fwrite(junk, 1, sizeof junk, hand), sizeof junk);
    fclose(hand);
    char big[4096];
    store_test_fill_bytes(big, sizeof big, 3);
    char *blob = NULL;
    ck_assert_int_eq(store_blob_write(f.st, big, sizeof big, &blob), 0);
    ck_assert_int_eq(store_bytes(f.st, &after), 0);
    ck_assert_uint_ge(after, before + sizeof big);
    ck_assert_uint_lt(after, before + sizeof junk);
    free(blob);
    store_test_teardown(&f);
}
END_TEST

/* A job with one 4000-byte input (a segment's size class), finished at finished_us. */
static void insert_finished_with_segment_input(store_test_t *f, int64_t finished_us, unsigned seed,
                                               char ret_id[ID_SIZE], char **ret_blob)
{
    job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
    job->call.has_in[1] = true;
    store_test_tensor_set(&job->in[1], "y", 1000, seed);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_job_insert(f->st, job), 0);
    memcpy(ret_id, job->id, ID_SIZE);
    *ret_blob = strdup(job->in[1].blob);
    store_test_assert_blob_bytes(f, *ret_blob, job->in[1].data, job->in[1].nbytes);
    job->state = JOB_CANCELLED;
    job->finished_us = finished_us;
    ck_assert_int_eq(store_job_update(f->st, job), 0);
    job_free(job);
}

/* Segment appends are gathered in a buffer and written as whole blocks: tensors of every size
 * (many small ones that fill the buffer, ones larger than it, which go to the file directly)
 * read back exactly, from the reader and after a restart; rolled-back ones leave the others
 * intact. */
START_TEST(test_segment_bytes_read_back_across_buffer_flushes_and_large_appends)
{
    store_test_t f;
    store_test_setup_inline(&f, 8 << 20);

    /* f32 counts: small and odd (unaligned ends), a block, near the 1 MiB buffer, past it. */
    static const int64_t sizes[] = {150,    1000,   1023,   4096 / 4, 3001,
                                    250000, 262143, 300000, 777,      1 << 20,
                                    5,      2001,   600000, 129,      (1 << 19) + 3};
    enum { N = sizeof sizes / sizeof sizes[0], ROUNDS = 6 };
    char ids[ROUNDS * N][ID_SIZE];
    bool kept[ROUNDS * N];
    unsigned seed = 1;
    for (int round = 0; round < ROUNDS; round++) {
        bool rollback = round == 2;
        ck_assert_int_eq(store_begin(f.st), 0);
        for (int i = 0; i < N; i++) {
            job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
            job->call.has_in[1] = true;
            store_test_tensor_set(&job->in[1], "y", sizes[(i + round) % N], seed++);
            job->call.in[1] = job->in[1].desc;
            ck_assert_int_eq(store_job_insert(f.st, job), 0);
            memcpy(ids[round * N + i], job->id, ID_SIZE);
            kept[round * N + i] = !rollback;
            job_free(job);
        }
        ck_assert_int_eq(rollback ? store_rollback(f.st) : store_commit(f.st), 0);
    }

    for (int pass = 0; pass < 2; pass++) {
        seed = 1;
        uint64_t row_bytes = 0;
        for (int k = 0; k < ROUNDS * N; k++) {
            int round = k / N, i = k % N;
            job_tensor_t want;
            store_test_tensor_set(&want, "y", sizes[(i + round) % N], seed++);
            /* Small tensors stay in rows up to STORE_TXN_ROW_BYTES per transaction; the rest go
             * to the segment. */
            if (i == 0) row_bytes = 0;
            bool in_row = want.nbytes < STORE_SEGMENT_MIN_BYTES;
            if (!in_row && row_bytes + want.nbytes <= STORE_TXN_ROW_BYTES) {
                in_row = true;
                row_bytes += want.nbytes;
            }
            if (kept[k]) {
                job_t *got = store_test_get_job(&f, ids[k]);
                ck_assert_msg(in_row == !strchr(got->in[1].blob, '@'),
                              "tensor %d of its transaction (%" PRIu64 " bytes): %s", i,
                              want.nbytes, got->in[1].blob);
                store_test_assert_blob_bytes(&f, got->in[1].blob, want.data, want.nbytes);
                job_free(got);
            }
            free(want.data);
        }
        /* Once more after a restart: everything was on disk. */
        store_test_reopen(&f);
    }
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_small_tensors_share_a_segment_that_goes_with_its_last_job)
{
    store_test_t f;
    store_test_setup_inline(&f, 65536);

    /* Three jobs' inputs land in one segment, each at its own offset past the header, and read
     * back; a job read from the store names the same place. */
    char ids[3][ID_SIZE], *blobs[3];
    for (int i = 0; i < 3; i++)
        insert_finished_with_segment_input(&f, 1000 * (i + 1), 70 + i, ids[i], &blobs[i]);
    for (int i = 0; i < 3; i++) {
        const char *at = strchr(blobs[i], '@');
        ck_assert_msg(at && atoll(at + 1) >= 64, "not in a segment: %s", blobs[i]);
        ck_assert_int_eq(strncmp(blobs[i], blobs[0], at - blobs[i]), 0);
        ck_assert(i == 0 || strcmp(blobs[i], blobs[i - 1]) != 0);
        job_t *got = store_test_get_job(&f, ids[i]);
        ck_assert_str_eq(got->in[1].blob, blobs[i]);
        job_free(got);
    }
    ck_assert_int_eq(store_test_count_blob_files(&f), 1);

    /* After a restart the segment is no longer active: it stays while a job names it. */
    store_test_reopen(&f);
    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, 1500, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(store_test_blob_file_exists(&f, blobs[0]));
    job_t *got = store_test_get_job(&f, ids[2]);
    void *data = NULL;
    ck_assert_int_eq(store_blob_read(f.rd, got->in[1].blob, got->in[1].nbytes, &data), 0);
    free(data);
    job_free(got);
    ck_assert_int_eq(store_gc(f.st, 3500, &deleted), 0);
    ck_assert_int_eq(deleted, 2);
    ck_assert(!store_test_blob_file_exists(&f, blobs[0]));

    /* The active segment is never collected, even once no job names it; the sweep at the next
     * open takes it, as nothing can be writing it then. */
    char id[ID_SIZE], *blob;
    insert_finished_with_segment_input(&f, 1000, 80, id, &blob);
    ck_assert_int_eq(store_gc(f.st, 1500, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(store_test_blob_file_exists(&f, blob));
    store_test_reopen(&f);
    ck_assert(!store_test_blob_file_exists(&f, blob));
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);

    free(blob);
    for (int i = 0; i < 3; i++)
        free(blobs[i]);
    store_test_teardown(&f);
}
END_TEST

/* n jobs, each with a 4 KiB input y and, when with_output, a 4 KiB output, succeeded. */
static void make_small_tensor_jobs(job_t **jobs, int n, bool with_output)
{
    for (int i = 0; i < n; i++) {
        jobs[i] = store_test_make_job(&store_test_op, "alice", 1000 + i);
        jobs[i]->call.has_in[1] = true;
        store_test_tensor_set(&jobs[i]->in[1], "y", 1024, 100u + (unsigned)i);
        jobs[i]->call.in[1] = jobs[i]->in[1].desc;
        if (!with_output) continue;
        jobs[i]->call.n_out = 1;
        store_test_tensor_set(&jobs[i]->out[0], "out", 1024, 200u + (unsigned)i);
    }
}

/* The file part of a locator "file:<file>@<offset>", for comparing two. */
static size_t locator_file_len(const char *blob)
{
    const char *at = blob ? strchr(blob, '@') : NULL;
    ck_assert_msg(at && atoll(at + 1) >= 64, "not in a shared file: %s", blob ? blob : "NULL");
    return (size_t)(at - blob);
}

/* Inserts n jobs made by make_small_tensor_jobs as running in the open transaction and commits
 * it, then ends each in a transaction of its own: job `failed` failed, the others succeeded. */
static void commit_running_then_end(store_test_t *f, job_t **jobs, int n, int failed)
{
    for (int i = 0; i < n; i++) {
        jobs[i]->state = JOB_RUNNING;
        jobs[i]->started_us = 1000 + i;
        ck_assert_int_eq(store_job_insert(f->st, jobs[i]), 0);
    }
    ck_assert_int_eq(store_commit(f->st), 0);
    for (int i = 0; i < n; i++) {
        jobs[i]->state = i == failed ? JOB_FAILED : JOB_SUCCEEDED;
        jobs[i]->finished_us = 1000 + i;
        ck_assert_int_eq(store_job_update(f->st, jobs[i]), 0);
    }
}

/* Each stored job names its input y where the job says, and reads back its bytes and, but for
 * job `failed`, its output's. */
static void assert_small_tensors_read_back(store_test_t *f, job_t **jobs, int n, int failed)
{
    for (int i = 0; i < n; i++) {
        job_t *got = store_test_get_job(f, jobs[i]->id);
        ck_assert_str_eq(got->in[1].blob, jobs[i]->in[1].blob);
        store_test_assert_blob_bytes(f, got->in[1].blob, jobs[i]->in[1].data,
                                     jobs[i]->in[1].nbytes);
        if (i != failed)
            store_test_assert_blob_bytes(f, got->out[0].blob, jobs[i]->out[0].data, 4096);
        job_free(got);
    }
}

START_TEST(test_pack_writes_many_jobs_small_tensors_to_one_file_that_goes_with_its_last_job)
{
    store_test_t f;
    store_test_setup_inline(&f, 65536);
    enum { N = 20 };
    job_t *jobs[N];
    make_small_tensor_jobs(jobs, N, true);

    /* 64 KiB of tensors weigh little on a group commit: they are left to it. */
    ck_assert_int_eq(store_blob_pack(f.st, jobs, 16, false), 0);
    for (int i = 0; i < 16; i++)
        ck_assert_ptr_null(jobs[i]->in[1].blob);
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);

    /* 80 KiB go to one file, each tensor at its own offset; inputs too small for a segment
     * (x, 32 bytes) stay for the row. */
    ck_assert_int_eq(store_blob_pack(f.st, jobs, N, false), 0);
    ck_assert_int_eq(store_test_count_blob_files(&f), 1);
    size_t len = locator_file_len(jobs[0]->in[1].blob);
    for (int i = 0; i < N; i++) {
        ck_assert_ptr_null(jobs[i]->in[0].blob);
        ck_assert_uint_eq(locator_file_len(jobs[i]->in[1].blob), len);
        ck_assert_int_eq(strncmp(jobs[i]->in[1].blob, jobs[0]->in[1].blob, len), 0);
        ck_assert(i == 0 || strcmp(jobs[i]->in[1].blob, jobs[i - 1]->in[1].blob) != 0);
    }

    /* A batch's outputs likewise, but a failed job's, which no row keeps. */
    snprintf(jobs[3]->error_code, sizeof jobs[3]->error_code, "%s", "kernel_failed");
    ck_assert_int_eq(store_blob_pack(f.st, jobs, N, true), 0);
    ck_assert_int_eq(store_test_count_blob_files(&f), 2);
    ck_assert_ptr_null(jobs[3]->out[0].blob);
    len = locator_file_len(jobs[0]->out[0].blob);
    for (int i = 0; i < N; i++)
        if (i != 3) ck_assert_int_eq(strncmp(jobs[i]->out[0].blob, jobs[0]->out[0].blob, len), 0);

    /* The rows name the tensors where they are, and read back equal, after a restart too. */
    ck_assert_int_eq(store_begin(f.st), 0);
    commit_running_then_end(&f, jobs, N, 3);
    store_test_reopen(&f);
    ck_assert_int_eq(store_test_count_blob_files(&f), 2);
    assert_small_tensors_read_back(&f, jobs, N, 3);

    /* The files go with the last job naming them. */
    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, 1010, &deleted), 0);
    ck_assert_int_eq(deleted, 10);
    ck_assert(store_test_blob_file_exists(&f, jobs[0]->in[1].blob));
    ck_assert(store_test_blob_file_exists(&f, jobs[0]->out[0].blob));
    ck_assert_int_eq(store_gc(f.st, 1020, &deleted), 0);
    ck_assert_int_eq(deleted, 10);
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);

    for (int i = 0; i < N; i++)
        job_free(jobs[i]);
    store_test_teardown(&f);
}
END_TEST

/* Placed ahead of their rows (store_jobs_place_small), a round's small tensors go to the active
 * segment together when its rows cannot take them all, and the segment is synced meanwhile by
 * another thread; bytes appended after that sync began are synced by the commit. They read
 * back equal after a restart. */
START_TEST(test_small_tensors_placed_ahead_share_the_segment_and_read_back_after_a_restart)
{
    store_test_t f;
    store_test_setup_inline(&f, 65536);
    enum { N = 20 };
    job_t *jobs[N];
    make_small_tensor_jobs(jobs, N, true);

    /* Outside a transaction it refuses; 64 KiB of inputs are left to the rows. */
    ck_assert_int_eq(store_jobs_place_small(f.st, jobs, N, false), -EINVAL);
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_jobs_place_small(f.st, jobs, 16, false), 0);
    for (int i = 0; i < 16; i++)
        ck_assert_ptr_null(jobs[i]->in[1].blob);
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);

    /* 80 KiB go to the segment, each tensor at its own offset (x, 32 bytes, stays for the row),
     * then the outputs, appended while the first sync runs, but a failed job's. */
    ck_assert_int_eq(store_jobs_place_small(f.st, jobs, N, false), 0);
    snprintf(jobs[3]->error_code, sizeof jobs[3]->error_code, "%s", "kernel_failed");
    ck_assert_int_eq(store_jobs_place_small(f.st, jobs, N, true), 0);
    ck_assert_int_eq(store_test_count_blob_files(&f), 1);
    size_t len = locator_file_len(jobs[0]->in[1].blob);
    for (int i = 0; i < N; i++) {
        ck_assert_ptr_null(jobs[i]->in[0].blob);
        ck_assert_int_eq(strncmp(jobs[i]->in[1].blob, jobs[0]->in[1].blob, len), 0);
        ck_assert(i == 0 || strcmp(jobs[i]->in[1].blob, jobs[i - 1]->in[1].blob) != 0);
        if (i != 3) ck_assert_int_eq(strncmp(jobs[i]->out[0].blob, jobs[0]->in[1].blob, len), 0);
    }
    ck_assert_ptr_null(jobs[3]->out[0].blob);
    commit_running_then_end(&f, jobs, N, 3);
    ck_assert_int_eq(store_test_db_int(&f, "SELECT refs FROM blob_refs"), 2 * N - 1);
    assert_small_tensors_read_back(&f, jobs, N, 3);

    /* A round rolled back with its sync under way leaves bytes no row names, and takes back
     * the locators it gave: a retry of those writes places the tensors again. */
    job_t *more[N];
    make_small_tensor_jobs(more, N, false);
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_jobs_place_small(f.st, more, N, false), 0);
    ck_assert_ptr_nonnull(more[0]->in[1].blob);
    ck_assert_int_eq(store_rollback(f.st), 0);
    for (int i = 0; i < N; i++)
        ck_assert_ptr_null(more[i]->in[1].blob);

    store_test_reopen(&f);
    assert_small_tensors_read_back(&f, jobs, N, 3);
    for (int i = 0; i < N; i++) {
        job_free(jobs[i]);
        job_free(more[i]);
    }
    store_test_teardown(&f);
}
END_TEST

/* A file store_blob_pack wrote goes once its tensors are discarded and no row names it: at the
 * end of the transaction (rolled back or not), or at once outside one. */
START_TEST(test_discarded_packed_tensors_take_their_file_once_no_row_names_it)
{
    store_test_t f;
    store_test_setup_inline(&f, 65536);
    enum { N = 20 };
    job_t *jobs[N];

    /* One job's row commits: the file stays for it. */
    make_small_tensor_jobs(jobs, N, false);
    ck_assert_int_eq(store_blob_pack(f.st, jobs, N, false), 0);
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, jobs[0]), 0);
    for (int i = 1; i < N; i++)
        store_blob_discard(f.st, jobs[i]->in[1].blob);
    ck_assert(store_test_blob_file_exists(&f, jobs[0]->in[1].blob));
    ck_assert_int_eq(store_commit(f.st), 0);
    ck_assert(store_test_blob_file_exists(&f, jobs[0]->in[1].blob));
    for (int i = 0; i < N; i++)
        job_free(jobs[i]);
    ck_assert_int_eq(store_test_count_blob_files(&f), 1);

    /* Rolled back: the file goes with the transaction. */
    make_small_tensor_jobs(jobs, N, false);
    ck_assert_int_eq(store_blob_pack(f.st, jobs, N, false), 0);
    ck_assert_int_eq(store_test_count_blob_files(&f), 2);
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, jobs[0]), 0);
    for (int i = 0; i < N; i++)
        store_blob_discard(f.st, jobs[i]->in[1].blob);
    ck_assert_int_eq(store_rollback(f.st), 0);
    ck_assert(!store_test_blob_file_exists(&f, jobs[0]->in[1].blob));
    for (int i = 0; i < N; i++)
        job_free(jobs[i]);

    /* Outside a transaction, at once. */
    make_small_tensor_jobs(jobs, N, false);
    ck_assert_int_eq(store_blob_pack(f.st, jobs, N, false), 0);
    ck_assert_int_eq(store_test_count_blob_files(&f), 2);
    store_blob_discard(f.st, jobs[5]->in[1].blob);
    ck_assert_int_eq(store_test_count_blob_files(&f), 1);
    for (int i = 0; i < N; i++)
        job_free(jobs[i]);
    store_test_teardown(&f);
}
END_TEST

/* Inserts n jobs, each with a 4 KiB input, in one transaction that commits or rolls back. */
static void insert_in_one_transaction(store_test_t *f, int n, bool commit)
{
    ck_assert_int_eq(store_begin(f->st), 0);
    for (int i = 0; i < n; i++) {
        job_t *job = store_test_make_job(&store_test_op, "alice", 1000 + i);
        job->call.has_in[1] = true;
        store_test_tensor_set(&job->in[1], "y", 1024, (unsigned)i);
        job->call.in[1] = job->in[1].desc;
        ck_assert_int_eq(store_job_insert(f->st, job), 0);
        job_free(job);
    }
    ck_assert_int_eq(commit ? store_commit(f->st) : store_rollback(f->st), 0);
}

START_TEST(test_a_transaction_counts_the_tensors_naming_each_file_once_it_commits)
{
    store_test_t f;
    store_test_setup_inline(&f, 65536);

    /* 20 inputs of 4 KiB: the first 64 KiB stay in their rows, the other 4 share a segment,
     * counted in one row. A rolled-back transaction counts nothing. */
    insert_in_one_transaction(&f, 20, false);
    ck_assert_int_eq(store_test_db_int(&f, "SELECT count(*) FROM blob_refs"), 0);
    insert_in_one_transaction(&f, 20, true);
    ck_assert_int_eq(store_test_db_int(&f, "SELECT count(*) FROM blob_refs"), 1);
    ck_assert_int_eq(store_test_db_int(&f, "SELECT refs FROM blob_refs"), 4);
    insert_in_one_transaction(&f, 20, false);
    ck_assert_int_eq(store_test_db_int(&f, "SELECT refs FROM blob_refs"), 4);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_open_sweeps_blob_files_no_committed_row_names)
{
    store_test_t f;
    store_test_setup(&f);
    char big[4096];
    store_test_fill_bytes(big, sizeof big, 2);
    /* The job is committed first, so the orphan is the newest file: nothing written after
     * the newest row is kept either. */
    job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
    job->call.has_in[1] = true;
    store_test_tensor_set(&job->in[1], "y", 4096, 1);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    char *orphan = NULL;
    ck_assert_int_eq(store_blob_write(f.st, big, sizeof big, &orphan), 0);
    ck_assert_int_eq(store_test_count_blob_files(&f), 2);

    store_test_reopen(&f);
    ck_assert(!store_test_blob_file_exists(&f, orphan));
    ck_assert(store_test_blob_file_exists(&f, job->in[1].blob));
    ck_assert_int_eq(store_test_count_blob_files(&f), 1);
    free(orphan);
    job_free(job);
    store_test_teardown(&f);
}
END_TEST

/* Reads of 4 MiB and more go in parts side by side (store_blob.c): whatever the size, every
 * byte comes back, whole or a range at a time. */
START_TEST(test_large_blobs_read_back_whole_and_by_range)
{
    store_test_t f;
    store_test_setup(&f);
    static const uint64_t sizes[] = {(4u << 20) - 1, 4u << 20, (4u << 20) + 4, (8u << 20) + 7,
                                     (8u << 20) + 4096 * 8 + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t n = sizes[i];
        unsigned char *bytes = malloc(n), *part = malloc(n);
        store_test_fill_bytes(bytes, n, (unsigned)i + 1);
        char *blob = NULL;
        ck_assert_int_eq(store_blob_write(f.st, bytes, n, &blob), 0);
        store_test_assert_blob_bytes(&f, blob, bytes, n);
        /* In three ranges, the middle one past 4 MiB when n allows. */
        uint64_t cut1 = n / 7, cut2 = n - 5;
        memset(part, 0, n);
        ck_assert_int_eq(store_blob_read_at(f.rd, blob, n, 0, part, cut1), 0);
        ck_assert_int_eq(store_blob_read_at(f.rd, blob, n, cut1, part + cut1, cut2 - cut1), 0);
        ck_assert_int_eq(store_blob_read_at(f.rd, blob, n, cut2, part + cut2, n - cut2), 0);
        ck_assert_msg(memcmp(part, bytes, n) == 0, "%" PRIu64 " bytes by range", n);
        ck_assert_int_eq(store_blob_read_at(f.rd, blob, n, n - 2, part, 3), -EINVAL);
        free(blob);
        free(part);
        free(bytes);
    }
    store_test_teardown(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_blobs");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_blob_write_files_only_large_data_and_insert_uses_the_callers_blob);
    tcase_add_test(tc, test_store_bytes_counts_blob_files_without_walking_the_directory);
    tcase_add_test(tc, test_small_tensors_share_a_segment_that_goes_with_its_last_job);
    tcase_add_test(
        tc, test_pack_writes_many_jobs_small_tensors_to_one_file_that_goes_with_its_last_job);
    tcase_add_test(tc,
                   test_small_tensors_placed_ahead_share_the_segment_and_read_back_after_a_restart);
    tcase_add_test(tc, test_discarded_packed_tensors_take_their_file_once_no_row_names_it);
    tcase_add_test(tc, test_a_transaction_counts_the_tensors_naming_each_file_once_it_commits);
    tcase_add_test(tc, test_segment_bytes_read_back_across_buffer_flushes_and_large_appends);
    tcase_add_test(tc, test_open_sweeps_blob_files_no_committed_row_names);
    tcase_add_test(tc, test_large_blobs_read_back_whole_and_by_range);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
