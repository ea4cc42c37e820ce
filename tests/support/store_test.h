/* What the store's test suites (tests/unit/test_store_*.c) share: a fresh state directory with
 * its store and reader per test, jobs of a test op with tensors of seeded bytes, and reads of
 * what the store wrote, through the store and straight from its database file.
 *
 * Every helper asserts with Check, so it may be called only from inside a START_TEST body. */
#pragma once

#include <check.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/store/store.h"

/* An op this build's table does not have, so that the tests depend on no kernel family: the
 * store must keep its name and tensors, and job_resolve_op give it a stand-in that refuses to
 * run. Its inputs are named store_test_inputs (x, y, w: x required), its one param "a". */
extern const op_def_t store_test_op;
extern const char *const store_test_inputs[];
extern const char *const store_test_params[];

/* The inline_blob_bytes of store_test_setup(): tensors of up to this many bytes stay out of
 * files of their own. */
#define STORE_TEST_INLINE_LIMIT 256

/* A test's state directory, its store and a reader beside it. */
typedef struct store_test {
    char dir[64];
    config_t cfg;
    store_t *st;
    store_reader_t *rd;
} store_test_t;

/* A fresh state directory whose store, of `shards` shards, keeps tensors of up to
 * inline_blob_bytes out of files of their own. */
void store_test_setup_shards(store_test_t *f, uint64_t inline_blob_bytes, int shards);

/* The same on one shard, and on one shard with STORE_TEST_INLINE_LIMIT. */
void store_test_setup_inline(store_test_t *f, uint64_t inline_blob_bytes);
void store_test_setup(store_test_t *f);

/* Closes the store and the reader and removes the state directory. */
void store_test_teardown(store_test_t *f);

/* Removes the directory dir and everything under it. */
void store_test_remove_tree(const char *dir);

/* Fills data with n bytes that depend only on seed. */
void store_test_fill_bytes(void *data, uint64_t n, unsigned seed);

/* Makes t a 1-D f32 tensor called name of n_f32 elements, its bytes (malloc'd) from seed. */
void store_test_tensor_set(job_tensor_t *t, const char *name, int64_t n_f32, unsigned seed);

/* A new queued job of op for owner, created at created_us, with params {"a":2.5}, priority 3,
 * a deadline, and input x of 8 f32 seeded by created_us; the caller frees it. */
job_t *store_test_make_job(const op_def_t *op, const char *owner, int64_t created_us);

/* Inserts a small job and returns its id. */
void store_test_insert_small(store_test_t *f, const op_def_t *op, const char *owner,
                             int64_t created_us, char ret_id[ID_SIZE]);

/* A job read back, its op resolved as its callers resolve it (job_resolve_op). */
job_t *store_test_get_job(store_test_t *f, const char *id);

/* Reads a tensor's bytes back through the reader and compares them with expected. */
void store_test_assert_blob_bytes(store_test_t *f, const char *blob, const void *expected,
                                  uint64_t n);

/* How many files there are under the state directory's blobs/. */
int store_test_count_blob_files(store_test_t *f);

/* Whether the file of a file locator ("file:ab/<name>", with or without "@offset") exists. */
bool store_test_blob_file_exists(store_test_t *f, const char *blob);

/* Moves a stored job to state `to` through the store, as the scheduler would. */
int store_test_set_state(store_test_t *f, const char *id, job_state_t to);

/* Closes the store and opens it again, as a restart does. */
void store_test_reopen(store_test_t *f);

/* Pages through a query until the end, the ids into ids[0..cap); returns how many jobs and
 * checks that the ids ascend. */
size_t store_test_list_all(store_test_t *f, store_list_query_t q, char ids[][ID_SIZE], size_t cap);

/* Listing by state finds exactly one job, id. */
void store_test_assert_listed_by_state(store_test_t *f, job_state_t state, const char *id);

/* Runs sql on the database file at path through a connection of its own. */
void store_test_exec_at(const char *path, const char *sql);

/* Runs sql on the test's database (shard 0's file). */
void store_test_db_exec(store_test_t *f, const char *sql);

/* The one integer that sql (a query of one row) gives on the test's database. */
int64_t store_test_db_int(store_test_t *f, const char *sql);

/* A restart's recovery (store_recover_queued), then each queued job read whole through f's
 * reader with its op resolved, oldest first, handed to cb, which takes it. */
void store_test_recover_jobs(store_test_t *f, int max_attempts, void (*cb)(job_t *job, void *ud),
                             void *ud);
