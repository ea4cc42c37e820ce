/* The durable store (daemon/store/store.h) on a fresh state directory per test. */
#define _GNU_SOURCE
#include <check.h>
#include <inttypes.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/store/store.h"
#include "daemon/store/store_internal.h" /* STORE_SCHEMA_VERSION */

/* An op this build's table does not have, so that the tests depend on no kernel family: the
 * store must keep its name and tensors, and job_resolve_op give it a stand-in that refuses to
 * run. */
static const char *const test_inputs[] = {"x", "y", "w"};
static const char *const test_params[] = {"a", NULL};
static const op_def_t test_op = {
    .name = "test_store_op",
    .summary = "test op",
    .n_inputs = 3,
    .input_names = test_inputs,
    .required_inputs = 1,
    .param_names = test_params,
};
static const op_def_t other_op = {
    .name = "test_other_op",
    .summary = "another test op",
    .n_inputs = 3,
    .input_names = test_inputs,
    .required_inputs = 1,
    .param_names = test_params,
};

#define INLINE_LIMIT 256

typedef struct fixture {
    char dir[64];
    config_t cfg;
    store_t *st;
    store_reader_t *rd;
} fixture_t;

/* A fresh state directory whose store, of `shards` shards, keeps tensors of up to
 * inline_blob_bytes out of files of their own. */
static void fixture_setup_shards(fixture_t *f, uint64_t inline_blob_bytes, int shards)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/test_store.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
    memset(&f->cfg, 0, sizeof f->cfg);
    f->cfg.shards = shards;
    snprintf(f->cfg.state_dir, sizeof f->cfg.state_dir, "%s", f->dir);
    f->cfg.inline_blob_bytes = inline_blob_bytes;
    f->cfg.sync_full = true;
    ck_assert_int_eq(store_open(&f->cfg, &f->st), 0);
    ck_assert_int_eq(store_reader_open(&f->cfg, &f->rd), 0);
}

static void fixture_setup_inline(fixture_t *f, uint64_t inline_blob_bytes)
{
    fixture_setup_shards(f, inline_blob_bytes, 1);
}

static void fixture_setup(fixture_t *f)
{
    fixture_setup_inline(f, INLINE_LIMIT);
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    return remove(path);
}

static void fixture_teardown(fixture_t *f)
{
    store_reader_close(f->rd);
    store_close(f->st);
    nftw(f->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void fill_bytes(void *data, uint64_t n, unsigned seed)
{
    unsigned char *p = data;
    for (uint64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (unsigned char)(seed >> 16);
    }
}

static void tensor_set(job_tensor_t *t, const char *name, int64_t n_f32, unsigned seed)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->desc.dtype = DTYPE_F32;
    t->desc.ndim = 1;
    t->desc.shape[0] = n_f32;
    t->nbytes = (uint64_t)n_f32 * 4;
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    fill_bytes(t->data, t->nbytes, seed);
}

static job_t *make_job(const op_def_t *op, const char *owner, int64_t created_us)
{
    job_t *job = job_new();
    ck_assert_ptr_nonnull(job);
    snprintf(job->owner, sizeof job->owner, "%s", owner);
    job->call.op = op;
    job->params_json = strdup("{\"a\":2.5}");
    job->priority = 3;
    job->deadline_us = 123456789;
    job->created_us = created_us;
    job->call.has_in[0] = true;
    tensor_set(&job->in[0], "x", 8, (unsigned)created_us);
    job->call.in[0] = job->in[0].desc;
    return job;
}

/* Inserts a small job and returns its id. */
static void insert_small(fixture_t *f, const op_def_t *op, const char *owner, int64_t created_us,
                         char ret_id[ID_SIZE])
{
    job_t *job = make_job(op, owner, created_us);
    ck_assert_int_eq(store_job_insert(f->st, job), 0);
    memcpy(ret_id, job->id, ID_SIZE);
    job_free(job);
}

/* A job read back, its op resolved as its callers resolve it (job_resolve_op). */
static job_t *get_job(fixture_t *f, const char *id)
{
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(f->rd, id, &job), 0);
    ck_assert_int_eq(job_resolve_op(job), 0);
    return job;
}

/* Reads a tensor's bytes back through the reader and compares them with expected. */
static void assert_blob_bytes(fixture_t *f, const char *blob, const void *expected, uint64_t n)
{
    void *data = NULL;
    ck_assert_ptr_nonnull(blob);
    ck_assert_int_eq(store_blob_read(f->rd, blob, n, &data), 0);
    ck_assert_mem_eq(data, expected, n);
    free(data);
}

static int file_count;
static int count_file(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    if (type == FTW_F) file_count++;
    return 0;
}

static int count_blob_files(fixture_t *f)
{
    char path[128];
    snprintf(path, sizeof path, "%s/blobs", f->dir);
    file_count = 0;
    nftw(path, count_file, 16, FTW_PHYS);
    return file_count;
}

/* Whether the file of a file locator ("file:ab/<name>", with or without "@offset") exists. */
static bool blob_file_exists(fixture_t *f, const char *blob)
{
    char path[256];
    ck_assert_int_eq(strncmp(blob, "file:", 5), 0);
    snprintf(path, sizeof path, "%s/blobs/%.35s", f->dir, blob + 5);
    return access(path, F_OK) == 0;
}

/* Moves a stored job to state `to` through the store, as the scheduler would. */
static int set_state(fixture_t *f, const char *id, job_state_t to)
{
    job_t *job = get_job(f, id);
    job->state = to;
    if (to == JOB_RUNNING) job->attempts++;
    if (to == JOB_SUCCEEDED) {
        job->call.n_out = 1;
        job->call.out_names[0] = "out";
        tensor_set(&job->out[0], "out", 4, 99);
    }
    int r = store_job_update(f->st, job);
    job_free(job);
    return r;
}

/* Closes the store and opens it again, as a restart does. */
static void reopen(fixture_t *f)
{
    store_reader_close(f->rd);
    store_close(f->st);
    ck_assert_int_eq(store_open(&f->cfg, &f->st), 0);
    ck_assert_int_eq(store_reader_open(&f->cfg, &f->rd), 0);
}

/* Pages through a query until the end; returns how many jobs and checks ids ascend. */
static size_t list_all(fixture_t *f, store_list_query_t q, char ids[][ID_SIZE], size_t cap)
{
    size_t total = 0;
    char cursor[ID_SIZE] = "";
    for (;;) {
        job_t **jobs;
        size_t n;
        q.after = cursor[0] ? cursor : NULL;
        ck_assert_int_eq(store_jobs_list(f->rd, &q, &jobs, &n), 0);
        ck_assert_uint_le(n, (size_t)q.limit);
        for (size_t i = 0; i < n; i++) {
            if (total > 0) ck_assert_int_lt(strcmp(ids[total - 1], jobs[i]->id), 0);
            ck_assert_uint_lt(total, cap);
            memcpy(ids[total++], jobs[i]->id, ID_SIZE);
            job_free(jobs[i]);
        }
        free(jobs);
        if (n == 0) break;
        memcpy(cursor, ids[total - 1], ID_SIZE);
    }
    return total;
}

/* Listing by state finds exactly one job, id. */
static void assert_listed_by_state(fixture_t *f, job_state_t state, const char *id)
{
    char got[2][ID_SIZE];
    store_list_query_t q = {.state = (int)state, .limit = 10};
    ck_assert_uint_eq(list_all(f, q, got, 2), 1);
    ck_assert_str_eq(got[0], id);
}

START_TEST(test_insert_get_round_trips_inline_file_and_buffer_tensors)
{
    fixture_t f;
    fixture_setup(&f);
    buffer_t *buf = buffer_new();
    snprintf(buf->owner, sizeof buf->owner, "alice");
    buf->desc = (tensor_desc_t){.dtype = DTYPE_F32, .ndim = 1, .shape = {8}};
    buf->nbytes = 32;
    buf->data = calloc(1, 32);
    ck_assert_int_eq(store_buffer_insert(f.st, buf), 0);

    job_t *job = make_job(&test_op, "alice", now_us());
    job->call.has_in[1] = true;
    tensor_set(&job->in[1], "y", 1000, 7); /* 4000 bytes: past the inline limit */
    job->call.in[1] = job->in[1].desc;
    job->call.has_in[2] = true;
    snprintf(job->in[2].name, sizeof job->in[2].name, "w");
    snprintf(job->in[2].buffer_id, ID_SIZE, "%s", buf->id);
    job->in[2].desc = buf->desc;
    job->in[2].nbytes = buf->nbytes;
    snprintf(job->idempotency_key, sizeof job->idempotency_key, "key-1");
    ck_assert_int_eq(store_job_insert(f.st, job), 0);

    ck_assert(id_valid('j', job->id));
    ck_assert_int_eq(strncmp(job->in[0].blob, "row:jobs/", 9), 0);
    ck_assert_int_eq(strncmp(job->in[1].blob, "file:", 5), 0);
    ck_assert(blob_file_exists(&f, job->in[1].blob));
    ck_assert_ptr_null(job->in[2].blob);

    job_t *got = get_job(&f, job->id);
    ck_assert_str_eq(got->id, job->id);
    ck_assert_str_eq(got->owner, "alice");
    ck_assert_ptr_nonnull(got->call.op);
    ck_assert_str_eq(got->call.op->name, "test_store_op");
    ck_assert_str_eq(got->params_json, "{\"a\":2.5}");
    ck_assert_int_eq(got->priority, 3);
    ck_assert_int_eq(got->device, -1);
    ck_assert_int_eq(got->deadline_us, 123456789);
    ck_assert_int_eq(got->state, JOB_QUEUED);
    ck_assert_int_eq(got->created_us, job->created_us);
    ck_assert_str_eq(got->idempotency_key, "key-1");
    for (int j = 0; j < 3; j++) {
        ck_assert(got->call.has_in[j]);
        ck_assert_str_eq(got->in[j].name, test_inputs[j]);
        ck_assert(tensor_desc_equal(&got->in[j].desc, &job->in[j].desc));
        ck_assert(tensor_desc_equal(&got->call.in[j], &job->in[j].desc));
        ck_assert_uint_eq(got->in[j].nbytes, job->in[j].nbytes);
        ck_assert_ptr_null(got->in[j].data);
    }
    ck_assert_str_eq(got->in[0].blob, job->in[0].blob);
    ck_assert_str_eq(got->in[1].blob, job->in[1].blob);
    assert_blob_bytes(&f, got->in[0].blob, job->in[0].data, job->in[0].nbytes);
    assert_blob_bytes(&f, got->in[1].blob, job->in[1].data, job->in[1].nbytes);
    ck_assert_str_eq(got->in[2].buffer_id, buf->id);
    ck_assert_ptr_null(got->in[2].blob);

    job_free(got);
    job_free(job);
    buffer_free(buf);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_blob_write_files_only_large_data_and_insert_uses_the_callers_blob)
{
    fixture_t f;
    fixture_setup(&f);
    char small[INLINE_LIMIT], *blob = (char *)"untouched";
    fill_bytes(small, sizeof small, 1);
    ck_assert_int_eq(store_blob_write(f.st, small, sizeof small, &blob), 0);
    ck_assert_ptr_null(blob);
    ck_assert_int_eq(count_blob_files(&f), 0);

    job_t *job = make_job(&test_op, "alice", now_us());
    job->call.has_in[1] = true;
    tensor_set(&job->in[1], "y", 2048, 5);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_blob_write(f.st, job->in[1].data, job->in[1].nbytes, &blob), 0);
    ck_assert_ptr_nonnull(blob);
    ck_assert(blob_file_exists(&f, blob));
    job->in[1].blob = strdup(blob);
    free(job->in[1].data); /* as the scheduler does for a large input: the file holds it now */
    job->in[1].data = NULL;
    ck_assert_ptr_null(job->in[1].data);
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    ck_assert_str_eq(job->in[1].blob, blob);
    ck_assert_int_eq(count_blob_files(&f), 1); /* the insert wrote no second copy */

    job_t *got = get_job(&f, job->id);
    ck_assert_str_eq(got->in[1].blob, blob);
    void *expected = malloc(job->in[1].nbytes);
    fill_bytes(expected, job->in[1].nbytes, 5);
    assert_blob_bytes(&f, got->in[1].blob, expected, job->in[1].nbytes);
    free(expected);
    free(blob);
    job_free(got);
    job_free(job);
    fixture_teardown(&f);
}
END_TEST

/* The scheduler inserts a job that started in the transaction taking it in as running: one row
 * write. A running job without its start is refused, and leaves no row. */
START_TEST(test_insert_of_a_job_started_in_its_own_transaction_stores_it_running)
{
    fixture_t f;
    fixture_setup(&f);
    job_t *job = make_job(&test_op, "alice", now_us());
    job->state = JOB_RUNNING;
    job->attempts = 1;
    job->started_us = job->created_us + 5;
    job->batch_size = 7;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    job_t *got = get_job(&f, job->id);
    ck_assert_int_eq(got->state, JOB_RUNNING);
    ck_assert_int_eq(got->attempts, 1);
    ck_assert_int_eq(got->started_us, job->started_us);
    ck_assert_int_eq(got->batch_size, 7);
    job_free(got);

    job_t *unstarted = make_job(&test_op, "alice", now_us());
    id_new('j', unstarted->id);
    unstarted->state = JOB_RUNNING;
    ck_assert_int_eq(store_job_insert(f.st, unstarted), -EINVAL);
    job_t *none = NULL;
    ck_assert_int_eq(store_job_get(f.rd, unstarted->id, &none), -ENOENT);
    unstarted->state = JOB_SUCCEEDED;
    unstarted->started_us = now_us();
    ck_assert_int_eq(store_job_insert(f.st, unstarted), -EINVAL);
    job_free(unstarted);
    job_free(job);
    fixture_teardown(&f);
}
END_TEST

/* A job handed back to the queue (a device fault) is live again: whatever finish time the
 * caller's copy holds, the row gets none, so the live index lists it and retention leaves it. */
START_TEST(test_a_job_back_in_the_queue_has_no_finish_time)
{
    fixture_t f;
    fixture_setup(&f);
    char id[ID_SIZE];
    insert_small(&f, &test_op, "alice", now_us(), id);
    ck_assert_int_eq(set_state(&f, id, JOB_RUNNING), 0);
    job_t *job = get_job(&f, id);
    job->state = JOB_QUEUED;
    job->finished_us = 12345;
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);

    job = get_job(&f, id);
    ck_assert_int_eq(job->state, JOB_QUEUED);
    ck_assert_int_eq(job->finished_us, 0);
    job_free(job);
    assert_listed_by_state(&f, JOB_QUEUED, id);
    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, now_us() + 1000000, &deleted), 0);
    ck_assert_int_eq(deleted, 0);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_update_applies_legal_transitions_and_persists_outputs)
{
    fixture_t f;
    fixture_setup(&f);
    char id[ID_SIZE];
    insert_small(&f, &test_op, "alice", now_us(), id);

    job_t *job = get_job(&f, id);
    job->state = JOB_RUNNING;
    job->attempts = 1;
    job->started_us = 1000;
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);

    job = get_job(&f, id);
    ck_assert_int_eq(job->state, JOB_RUNNING);
    ck_assert_int_eq(job->attempts, 1);
    ck_assert_int_eq(job->started_us, 1000);
    job->state = JOB_SUCCEEDED;
    job->finished_us = 5000;
    job->run_device = 1;
    job->gpu_ns = 777;
    job->batch_size = 4;
    job->call.n_out = 2;
    job->call.out_names[0] = "out";
    job->call.out_names[1] = "big";
    tensor_set(&job->out[0], "out", 4, 11);
    tensor_set(&job->out[1], "big", 4096, 12); /* written to a file by the update itself */
    ck_assert_int_eq(store_job_update(f.st, job), 0);

    job_t *got = get_job(&f, id);
    ck_assert_int_eq(got->state, JOB_SUCCEEDED);
    ck_assert_int_eq(got->finished_us, 5000);
    ck_assert_int_eq(got->run_device, 1);
    ck_assert_int_eq(got->gpu_ns, 777);
    ck_assert_int_eq(got->batch_size, 4);
    ck_assert_int_eq(got->call.n_out, 2);
    ck_assert_str_eq(got->call.out_names[0], "out");
    ck_assert_str_eq(got->call.out_names[1], "big");
    ck_assert_str_eq(got->out[0].name, "out");
    ck_assert_str_eq(got->out[1].name, "big");
    ck_assert(tensor_desc_equal(&got->out[1].desc, &job->out[1].desc));
    ck_assert_int_eq(strncmp(got->out[0].blob, "row:jobs/", 9), 0);
    ck_assert_int_eq(strncmp(got->out[1].blob, "file:", 5), 0);
    assert_blob_bytes(&f, got->out[0].blob, job->out[0].data, job->out[0].nbytes);
    assert_blob_bytes(&f, got->out[1].blob, job->out[1].data, job->out[1].nbytes);
    job_free(got);
    job_free(job);

    /* The other legal paths: running -> queued -> failed, and queued -> cancelled. */
    insert_small(&f, &test_op, "alice", now_us(), id);
    ck_assert_int_eq(set_state(&f, id, JOB_RUNNING), 0);
    ck_assert_int_eq(set_state(&f, id, JOB_QUEUED), 0);
    job = get_job(&f, id);
    job->state = JOB_FAILED;
    job_set_error(job, "deadline_exceeded", "the deadline passed while queued");
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);
    got = get_job(&f, id);
    ck_assert_int_eq(got->state, JOB_FAILED);
    ck_assert_str_eq(got->error_code, "deadline_exceeded");
    ck_assert_str_eq(got->error_message, "the deadline passed while queued");
    ck_assert_int_gt(got->finished_us, 0); /* unset by the caller: the time of the change */
    job_free(got);

    insert_small(&f, &test_op, "alice", now_us(), id);
    ck_assert_int_eq(set_state(&f, id, JOB_CANCELLED), 0);
    fixture_teardown(&f);
}
END_TEST

/* Brings a new job to state s along legal transitions. */
static void job_in_state(fixture_t *f, job_state_t s, char ret_id[ID_SIZE])
{
    insert_small(f, &test_op, "alice", now_us(), ret_id);
    if (s == JOB_QUEUED) return;
    if (s == JOB_CANCELLED) {
        ck_assert_int_eq(set_state(f, ret_id, JOB_CANCELLED), 0);
        return;
    }
    ck_assert_int_eq(set_state(f, ret_id, JOB_RUNNING), 0);
    if (s != JOB_RUNNING) ck_assert_int_eq(set_state(f, ret_id, s), 0);
}

START_TEST(test_update_refuses_every_illegal_transition_and_leaves_the_row_unchanged)
{
    fixture_t f;
    fixture_setup(&f);
    /* The legal transitions, written out independently of the store's table. */
    bool legal[JOB_STATE_COUNT][JOB_STATE_COUNT] = {{false}};
    legal[JOB_QUEUED][JOB_RUNNING] = legal[JOB_QUEUED][JOB_CANCELLED] = true;
    legal[JOB_QUEUED][JOB_FAILED] = true;
    legal[JOB_RUNNING][JOB_SUCCEEDED] = legal[JOB_RUNNING][JOB_FAILED] = true;
    legal[JOB_RUNNING][JOB_CANCELLED] = legal[JOB_RUNNING][JOB_QUEUED] = true;

    for (int from = 0; from < JOB_STATE_COUNT; from++) {
        for (int to = 0; to < JOB_STATE_COUNT; to++) {
            char id[ID_SIZE];
            job_in_state(&f, (job_state_t)from, id);
            job_t *before = get_job(&f, id);
            int r = set_state(&f, id, (job_state_t)to);
            job_t *after = get_job(&f, id);
            if (legal[from][to]) {
                ck_assert_msg(r == 0, "%s -> %s: %d", job_state_name(from), job_state_name(to), r);
                ck_assert_int_eq(after->state, to);
            } else {
                ck_assert_msg(r == -EBUSY, "%s -> %s: %d", job_state_name(from), job_state_name(to),
                              r);
                ck_assert_int_eq(after->state, before->state);
                ck_assert_int_eq(after->attempts, before->attempts);
                ck_assert_int_eq(after->started_us, before->started_us);
                ck_assert_int_eq(after->finished_us, before->finished_us);
                ck_assert_int_eq(after->call.n_out, before->call.n_out);
                ck_assert_int_eq(after->out[0].blob == NULL, before->out[0].blob == NULL);
                ck_assert_str_eq(after->error_code, before->error_code);
            }
            job_free(before);
            job_free(after);
        }
    }

    job_t *ghost = make_job(&test_op, "alice", now_us());
    id_new('j', ghost->id);
    ghost->state = JOB_RUNNING;
    ck_assert_int_eq(store_job_update(f.st, ghost), -ENOENT);
    job_free(ghost);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_idempotency_conflict_returns_eexist_leaves_nothing_and_finds_the_first)
{
    fixture_t f;
    fixture_setup(&f);
    job_t *first = make_job(&test_op, "alice", now_us());
    snprintf(first->idempotency_key, sizeof first->idempotency_key, "retry-me");
    ck_assert_int_eq(store_job_insert(f.st, first), 0);

    job_t *again = make_job(&test_op, "alice", now_us());
    snprintf(again->idempotency_key, sizeof again->idempotency_key, "retry-me");
    again->call.has_in[1] = true;
    tensor_set(&again->in[1], "y", 4096, 3); /* a file the failed insert must remove */
    again->call.in[1] = again->in[1].desc;
    ck_assert_int_eq(store_job_insert(f.st, again), -EEXIST);
    ck_assert_int_eq(count_blob_files(&f), 0);
    ck_assert_ptr_null(again->in[1].blob);

    char found[ID_SIZE] = "";
    ck_assert_int_eq(store_job_find_idempotent(f.rd, "alice", "retry-me", found), 0);
    ck_assert_str_eq(found, first->id);
    ck_assert_int_eq(store_job_find_idempotent(f.rd, "bob", "retry-me", found), -ENOENT);
    ck_assert_int_eq(store_job_find_idempotent(f.rd, "alice", "other", found), -ENOENT);

    store_list_query_t q = {.owner = "alice", .state = -1, .limit = 10};
    job_t **jobs;
    size_t n;
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), 0);
    ck_assert_uint_eq(n, 1);
    job_free(jobs[0]);
    free(jobs);

    /* The key is per owner, and jobs without a key never conflict. */
    job_t *bobs = make_job(&test_op, "bob", now_us());
    snprintf(bobs->idempotency_key, sizeof bobs->idempotency_key, "retry-me");
    ck_assert_int_eq(store_job_insert(f.st, bobs), 0);
    char id[ID_SIZE];
    insert_small(&f, &test_op, "alice", now_us(), id);
    insert_small(&f, &test_op, "alice", now_us(), id);
    job_free(bobs);
    job_free(again);
    job_free(first);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_failed_insert_in_a_transaction_undoes_only_its_own_rows)
{
    fixture_t f;
    fixture_setup(&f);
    job_t *a = make_job(&test_op, "alice", now_us());
    snprintf(a->idempotency_key, sizeof a->idempotency_key, "k");
    job_t *b = make_job(&test_op, "alice", now_us());
    snprintf(b->idempotency_key, sizeof b->idempotency_key, "k");
    b->call.has_in[1] = true;
    tensor_set(&b->in[1], "y", 8, 1);
    b->call.in[1] = b->in[1].desc;

    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, a), 0);
    ck_assert_int_eq(store_job_insert(f.st, b), -EEXIST);
    ck_assert_int_eq(store_commit(f.st), 0);

    job_t *got = get_job(&f, a->id);
    job_free(got);
    sqlite3 *db;
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", f.dir);
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *stmt;
    ck_assert_int_eq(
        sqlite3_prepare_v2(db, "SELECT count(*), count(inputs) FROM jobs", -1, &stmt, NULL),
        SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
    ck_assert_int_eq(sqlite3_column_int(stmt, 0), 1); /* a, with its tensor; not b */
    ck_assert_int_eq(sqlite3_column_int(stmt, 1), 1);
    sqlite3_finalize(stmt);
    sqlite3_close(db);

    /* A rolled-back transaction leaves nothing. */
    job_t *c = make_job(&test_op, "alice", now_us());
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, c), 0);
    ck_assert_int_eq(store_rollback(f.st), 0);
    job_t *none = NULL;
    ck_assert_int_eq(store_job_get(f.rd, c->id, &none), -ENOENT);
    job_free(c);
    job_free(b);
    job_free(a);
    fixture_teardown(&f);
}
END_TEST

/* Runs sql on the database file at path through a connection of its own. */
static void exec_at(const char *path, const char *sql)
{
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

/* Runs sql on the test's database (shard 0's file). */
static void db_exec(fixture_t *f, const char *sql)
{
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", f->dir);
    exec_at(path, sql);
}

/* The one integer that sql (a query of one row) gives on the test's database. */
static int64_t db_int(fixture_t *f, const char *sql)
{
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", f->dir);
    sqlite3 *db;
    sqlite3_stmt *stmt;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &stmt, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return v;
}

/* Inside a transaction a write of one statement has no savepoint of its own: a refused insert
 * or update still leaves no row, no file and no file count behind, and the transaction's
 * other writes commit. */
START_TEST(test_failed_writes_in_a_transaction_leave_no_rows_files_or_counts)
{
    fixture_t f;
    fixture_setup_inline(&f, 16); /* every tensor in a file: no job_bytes rows */
    job_t *a = make_job(&test_op, "alice", now_us());
    snprintf(a->idempotency_key, sizeof a->idempotency_key, "k");
    job_t *b = make_job(&test_op, "alice", now_us());
    snprintf(b->idempotency_key, sizeof b->idempotency_key, "k");
    job_t *c = make_job(&test_op, "alice", now_us());
    for (int i = 0; i < 2; i++) {
        job_t *job = i ? c : b;
        /* Written already, as sched_submit does: the row only names the file, and counts it. */
        job_tensor_t *x = &job->in[0];
        ck_assert_int_eq(store_blob_write(f.st, x->data, x->nbytes, &x->blob), 0);
    }

    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, a), 0);
    ck_assert_int_eq(store_job_insert(f.st, b), -EEXIST);
    a->state = JOB_SUCCEEDED; /* a is queued: refused */
    ck_assert_int_eq(store_job_update(f.st, a), -EBUSY);
    ck_assert_int_eq(store_job_insert(f.st, c), 0);
    ck_assert_int_eq(store_commit(f.st), 0);

    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM jobs"), 2);
    job_t *got = get_job(&f, a->id);
    ck_assert_int_eq(got->state, JOB_QUEUED);
    job_free(got);
    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM blob_refs"), 2); /* a's file, c's */
    ck_assert_int_eq(db_int(&f, "SELECT sum(refs) FROM blob_refs"), 2);
    store_blob_discard(f.st, b->in[0].blob); /* what its refused submitter does */
    ck_assert_int_eq(count_blob_files(&f), 2);
    job_free(c);
    job_free(b);
    job_free(a);
    fixture_teardown(&f);
}
END_TEST

/* Makes SQLite refuse a job row that names tensors in files (inputs at insert, outputs at an
 * update), as a disk or constraint failure would once those files are written. */
static void inject_row_failure(fixture_t *f)
{
    db_exec(f, "CREATE TRIGGER fail_insert BEFORE INSERT ON jobs WHEN NEW.inputs IS NOT NULL "
               "BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
               "CREATE TRIGGER fail_update BEFORE UPDATE ON jobs WHEN NEW.outputs IS NOT NULL "
               "BEGIN SELECT RAISE(ABORT, 'injected failure'); END");
}

START_TEST(test_failed_write_removes_the_files_it_wrote_and_its_rows)
{
    fixture_t f;
    fixture_setup(&f);
    char queued[ID_SIZE];
    insert_small(&f, &test_op, "alice", now_us(), queued);
    ck_assert_int_eq(set_state(&f, queued, JOB_RUNNING), 0);
    inject_row_failure(&f);

    /* Slots 1 and 2 go to files before the row fails. */
    job_t *job = make_job(&test_op, "alice", now_us());
    for (int j = 1; j < 3; j++) {
        job->call.has_in[j] = true;
        tensor_set(&job->in[j], test_inputs[j], 4096, (unsigned)j);
        job->call.in[j] = job->in[j].desc;
    }
    ck_assert_int_eq(store_job_insert(f.st, job), -EIO);
    ck_assert_int_eq(count_blob_files(&f), 0);
    for (int j = 0; j < 3; j++)
        ck_assert_ptr_null(job->in[j].blob);
    store_list_query_t q = {.state = -1, .limit = 10};
    job_t **jobs;
    size_t n;
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), 0);
    ck_assert_uint_eq(n, 1); /* only the job inserted before */
    job_free(jobs[0]);
    free(jobs);

    /* The same for outputs: the job stays running, with no outputs and no files. */
    job_t *running = get_job(&f, queued);
    running->state = JOB_SUCCEEDED;
    running->call.n_out = 3;
    for (int j = 0; j < 3; j++) {
        running->call.out_names[j] = test_inputs[j];
        tensor_set(&running->out[j], test_inputs[j], 4096, (unsigned)j);
    }
    ck_assert_int_eq(store_job_update(f.st, running), -EIO);
    ck_assert_int_eq(count_blob_files(&f), 0);
    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM blob_refs"), 0); /* no file counted */
    job_t *after = get_job(&f, queued);
    ck_assert_int_eq(after->state, JOB_RUNNING);
    ck_assert_ptr_null(after->out[0].blob);
    ck_assert_ptr_null(after->out[1].blob);
    job_free(after);
    job_free(running);
    job_free(job);
    fixture_teardown(&f);
}
END_TEST

typedef struct recovered {
    job_t *jobs[16];
    int n;
} recovered_t;

static void collect(job_t *job, void *ud)
{
    recovered_t *rec = ud;
    ck_assert_int_lt(rec->n, 16);
    rec->jobs[rec->n++] = job;
}

typedef struct recovered_ids {
    char ids[16][ID_SIZE];
    int n;
} recovered_ids_t;

static void collect_id(const store_queued_t *q, void *ud)
{
    recovered_ids_t *l = ud;
    ck_assert_int_lt(l->n, 16);
    memcpy(l->ids[l->n++], q->id, ID_SIZE);
}

/* A restart's recovery (store_recover_queued), then each queued job read whole through f's
 * reader with its op resolved, oldest first, handed to cb, which takes it. */
static void recover_jobs(fixture_t *f, int max_attempts, void (*cb)(job_t *job, void *ud), void *ud)
{
    recovered_ids_t l = {.n = 0};
    ck_assert_int_eq(store_recover_queued(f->st, max_attempts, job_resolve_op, collect_id, &l), 0);
    for (int i = 0; i < l.n; i++) {
        job_t *job = NULL;
        ck_assert_int_eq(store_job_get(f->rd, l.ids[i], &job), 0);
        ck_assert_int_eq(job_resolve_op(job), 0);
        cb(job, ud);
    }
}

/* A job the crash guard names fails whether its row says running or still queued (a batch is
 * launched before the commit that records its start); a final job keeps its end. */
START_TEST(test_recover_crashed_fails_a_named_job_that_is_not_final)
{
    fixture_t f;
    fixture_setup(&f);
    char queued[ID_SIZE], running[ID_SIZE], done[ID_SIZE];
    insert_small(&f, &test_op, "alice", 1000, queued);
    insert_small(&f, &test_op, "alice", 2000, running);
    ck_assert_int_eq(set_state(&f, running, JOB_RUNNING), 0);
    insert_small(&f, &test_op, "alice", 3000, done);
    ck_assert_int_eq(set_state(&f, done, JOB_RUNNING), 0);
    ck_assert_int_eq(set_state(&f, done, JOB_SUCCEEDED), 0);
    reopen(&f);
    const char *ids[] = {queued, running, done};
    const bool expect_failed[] = {true, true, false};
    for (int i = 0; i < 3; i++) {
        bool failed = !expect_failed[i];
        ck_assert_int_eq(
            store_recover_crashed(f.st, ids[i], "worker_crashed", "it crashed", &failed), 0);
        ck_assert_int_eq(failed, expect_failed[i]);
        job_t *job = get_job(&f, ids[i]);
        ck_assert_int_eq(job->state, expect_failed[i] ? JOB_FAILED : JOB_SUCCEEDED);
        if (expect_failed[i]) ck_assert_str_eq(job->error_code, "worker_crashed");
        job_free(job);
    }
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_recover_requeues_running_fails_past_max_attempts_and_returns_queued_oldest_first)
{
    fixture_t f;
    fixture_setup(&f);
    const int max_attempts = 3;
    char queued_new[ID_SIZE], queued_old[ID_SIZE], running_retry[ID_SIZE], running_spent[ID_SIZE],
        done[ID_SIZE];
    insert_small(&f, &test_op, "alice", 3000, queued_new);
    insert_small(&f, &test_op, "alice", 1000, queued_old);

    /* A running job that may run again, with a buffer-referenced input. */
    job_t *job = make_job(&test_op, "alice", 2000);
    job->call.has_in[2] = true;
    snprintf(job->in[2].name, sizeof job->in[2].name, "w");
    snprintf(job->in[2].buffer_id, ID_SIZE, "b0123456789abcdef01234567");
    job->in[2].desc = job->in[0].desc;
    job->in[2].nbytes = job->in[0].nbytes;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    memcpy(running_retry, job->id, ID_SIZE);
    job_free(job);
    ck_assert_int_eq(set_state(&f, running_retry, JOB_RUNNING), 0); /* attempts 1 */

    insert_small(&f, &test_op, "alice", 500, running_spent);
    for (int i = 0; i < max_attempts; i++) { /* attempts reach max_attempts */
        ck_assert_int_eq(set_state(&f, running_spent, JOB_RUNNING), 0);
        if (i + 1 < max_attempts) ck_assert_int_eq(set_state(&f, running_spent, JOB_QUEUED), 0);
    }
    insert_small(&f, &test_op, "alice", 100, done);
    ck_assert_int_eq(set_state(&f, done, JOB_RUNNING), 0);
    ck_assert_int_eq(set_state(&f, done, JOB_SUCCEEDED), 0);

    /* A restart: the store is closed (the process died) and opened again. */
    reopen(&f);
    recovered_t rec = {.n = 0};
    recover_jobs(&f, max_attempts, collect, &rec);

    ck_assert_int_eq(rec.n, 3);
    ck_assert_str_eq(rec.jobs[0]->id, queued_old);
    ck_assert_str_eq(rec.jobs[1]->id, running_retry);
    ck_assert_str_eq(rec.jobs[2]->id, queued_new);
    for (int i = 0; i < rec.n; i++) {
        ck_assert_int_eq(rec.jobs[i]->state, JOB_QUEUED);
        ck_assert_str_eq(rec.jobs[i]->call.op->name, "test_store_op");
        ck_assert_int_eq(strncmp(rec.jobs[i]->in[0].blob, "row:jobs/", 9), 0);
        ck_assert_ptr_null(rec.jobs[i]->in[0].data);
    }
    ck_assert_int_eq(rec.jobs[1]->attempts, 1); /* runs started; the next start counts */
    ck_assert(rec.jobs[1]->call.has_in[2]);
    ck_assert_str_eq(rec.jobs[1]->in[2].buffer_id, "b0123456789abcdef01234567");
    ck_assert_ptr_null(rec.jobs[1]->in[2].blob);
    char expected[32];
    fill_bytes(expected, sizeof expected, 2000); /* make_job's bytes for created_us 2000 */
    assert_blob_bytes(&f, rec.jobs[1]->in[0].blob, expected, sizeof expected);

    job_t *spent = get_job(&f, running_spent);
    ck_assert_int_eq(spent->state, JOB_FAILED);
    ck_assert_str_eq(spent->error_code, "daemon_restarted");
    ck_assert_ptr_nonnull(strstr(spent->error_message, "3 attempt"));
    ck_assert_int_gt(spent->finished_us, 0);
    job_t *finished = get_job(&f, done);
    ck_assert_int_eq(finished->state, JOB_SUCCEEDED);
    job_free(spent);
    job_free(finished);
    for (int i = 0; i < rec.n; i++)
        job_free(rec.jobs[i]);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_list_filters_by_owner_state_and_op_and_pages_with_a_cursor)
{
    fixture_t f;
    fixture_setup(&f);
    enum { N = 25 };
    char ids[N][ID_SIZE];
    int alice = 0, alice_running = 0, other_op_jobs = 0;
    for (int i = 0; i < N; i++) {
        bool is_alice = i % 3 != 0;
        bool is_other = i % 4 == 0;
        insert_small(&f, is_other ? &other_op : &test_op, is_alice ? "alice" : "bob", now_us(),
                     ids[i]);
        if (is_alice && i % 2 == 0) {
            ck_assert_int_eq(set_state(&f, ids[i], JOB_RUNNING), 0);
            alice_running++;
        }
        alice += is_alice;
        other_op_jobs += is_other;
    }
    char got[N][ID_SIZE];
    store_list_query_t q = {.owner = "alice", .state = -1, .limit = 4};
    ck_assert_uint_eq(list_all(&f, q, got, N), (size_t)alice);
    size_t k = 0;
    for (int i = 0; i < N; i++)
        if (i % 3 != 0) ck_assert_str_eq(got[k++], ids[i]);

    q = (store_list_query_t){.owner = "alice", .state = JOB_RUNNING, .limit = 2};
    ck_assert_uint_eq(list_all(&f, q, got, N), (size_t)alice_running);
    q = (store_list_query_t){.owner = NULL, .state = -1, .op = "test_other_op", .limit = 3};
    ck_assert_uint_eq(list_all(&f, q, got, N), (size_t)other_op_jobs);
    q = (store_list_query_t){.owner = NULL, .state = -1, .limit = 1000};
    ck_assert_uint_eq(list_all(&f, q, got, N), N);
    q = (store_list_query_t){.owner = "nobody", .state = -1, .limit = 10};
    ck_assert_uint_eq(list_all(&f, q, got, N), 0);

    /* By state across owners, and by state and owner. */
    q = (store_list_query_t){.owner = NULL, .state = JOB_QUEUED, .limit = 3};
    ck_assert_uint_eq(list_all(&f, q, got, N), (size_t)(N - alice_running));
    q = (store_list_query_t){.owner = NULL, .state = JOB_RUNNING, .limit = 3};
    ck_assert_uint_eq(list_all(&f, q, got, N), (size_t)alice_running);
    ck_assert_int_eq(set_state(&f, ids[0], JOB_CANCELLED), 0); /* bob's, queued */
    q = (store_list_query_t){.owner = "bob", .state = JOB_CANCELLED, .limit = 3};
    ck_assert_uint_eq(list_all(&f, q, got, N), 1);
    ck_assert_str_eq(got[0], ids[0]);
    q = (store_list_query_t){.owner = "bob", .state = JOB_QUEUED, .limit = 3};
    ck_assert_uint_eq(list_all(&f, q, got, N), (size_t)(N - alice - 1));

    job_t **jobs;
    size_t n;
    q = (store_list_query_t){.state = -1, .limit = 0};
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), -EINVAL);
    q = (store_list_query_t){.state = -1, .limit = 1001};
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), -EINVAL);
    q = (store_list_query_t){.state = JOB_STATE_COUNT, .limit = 10};
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), -EINVAL);
    fixture_teardown(&f);
}
END_TEST

/* A succeeded job finished at finished_us with one output of 4096 f32 in a file of its own. */
static void insert_succeeded(fixture_t *f, int64_t finished_us, char ret_id[ID_SIZE])
{
    insert_small(f, &test_op, "alice", now_us(), ret_id);
    ck_assert_int_eq(set_state(f, ret_id, JOB_RUNNING), 0);
    job_t *job = get_job(f, ret_id);
    job->state = JOB_SUCCEEDED;
    job->finished_us = finished_us;
    job->call.n_out = 1;
    job->call.out_names[0] = "out";
    tensor_set(&job->out[0], "out", 4096, (unsigned)finished_us);
    ck_assert_int_eq(store_job_update(f->st, job), 0);
    job_free(job);
}

static bool output_expired(fixture_t *f, const char *id)
{
    job_t *job = get_job(f, id);
    bool expired = store_blob_expired(job->out[0].blob);
    if (expired) {
        void *bytes = NULL;
        ck_assert_int_eq(store_blob_read(f->rd, job->out[0].blob, job->out[0].nbytes, &bytes),
                         -ENODATA);
        ck_assert_int_eq(job->out[0].nbytes, 4096 * 4);
    }
    job_free(job);
    return expired;
}

/* Trims to bound until the store says it is through, into *ret: the counts of every pass
 * summed, the bytes of the last. A pass stops after STORE_TRIM_PASS_US of work, which a loaded
 * machine can reach before it has done what one pass does on an idle one; what the trim does
 * in all, and in which order, is the same. */
static void trim_through(fixture_t *f, uint64_t bound, store_trim_stats_t *ret)
{
    store_trim_stats_t sum = {0}, t;
    int passes = 0;
    do {
        ck_assert_int_eq(store_trim(f->st, bound, STORE_TRIM_PASS_JOBS, &t), 0);
        sum.expired_bytes += t.expired_bytes;
        sum.expired_jobs += t.expired_jobs;
        sum.deleted_jobs += t.deleted_jobs;
        ck_assert_int_lt(++passes, 1000);
    } while (t.more);
    sum.bytes = t.bytes;
    *ret = sum;
}

/* Past its bound the store expires the outputs of the oldest finished jobs first (in finish
 * order, not insertion order), only as many as it must; then deletes the oldest finished jobs
 * whole; never a running job. */
START_TEST(test_trim_expires_oldest_outputs_first_then_deletes_oldest_jobs)
{
    fixture_t f;
    fixture_setup(&f);
    char a[ID_SIZE], b[ID_SIZE], c[ID_SIZE], running[ID_SIZE];
    insert_succeeded(&f, 3000, c); /* inserted first, finished last */
    insert_succeeded(&f, 1000, a);
    insert_succeeded(&f, 2000, b);
    insert_small(&f, &test_op, "alice", now_us(), running);
    ck_assert_int_eq(set_state(&f, running, JOB_RUNNING), 0);
    uint64_t before = 0;
    ck_assert_int_eq(store_bytes(f.st, &before), 0);
    ck_assert_uint_ge(before, 3 * 4096 * 4);

    store_trim_stats_t t;
    trim_through(&f, 0, &t); /* no bound: nothing goes */
    ck_assert_int_eq(t.expired_jobs + t.deleted_jobs, 0);
    trim_through(&f, before, &t); /* at the bound: nothing goes */
    ck_assert_int_eq(t.expired_jobs + t.deleted_jobs, 0);

    /* Just past this bound, the store trims to 15/16 of it: less than one output's worth
     * under what it holds, as long as it holds less than 16 outputs' worth. */
    ck_assert_uint_lt(before, 16 * 4096 * 4);
    uint64_t bound = before - 1;
    trim_through(&f, bound, &t);
    ck_assert_int_eq(t.expired_jobs, 1);
    ck_assert_int_eq(t.deleted_jobs, 0);
    ck_assert_uint_eq(t.expired_bytes, 4096 * 4);
    ck_assert(output_expired(&f, a));
    ck_assert(!output_expired(&f, b));
    ck_assert(!output_expired(&f, c));
    ck_assert_uint_lt(t.bytes, before);

    /* A bound nothing finished can meet: every output, then every finished job, goes. */
    trim_through(&f, 1, &t);
    ck_assert_int_eq(t.expired_jobs, 2);
    ck_assert_int_eq(t.deleted_jobs, 3);
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(f.rd, a, &job), -ENOENT);
    ck_assert_int_eq(store_job_get(f.rd, c, &job), -ENOENT);
    job = get_job(&f, running);
    ck_assert_int_eq(job->state, JOB_RUNNING);
    job_free(job);
    ck_assert_int_eq(count_blob_files(&f), 0);
    fixture_teardown(&f);
}
END_TEST

/* A backlog larger than a pass is trimmed across several passes, each going through no more
 * jobs than its budget, each but the last saying there is more, the oldest outputs first. */
START_TEST(test_trim_of_a_large_backlog_goes_in_bounded_passes)
{
    fixture_t f;
    fixture_setup(&f);
    enum { JOBS = 100, PASS = 16 };
    char ids[JOBS][ID_SIZE];
    for (int i = 0; i < JOBS; i++)
        insert_succeeded(&f, 1000 + i, ids[i]);
    store_trim_stats_t t;
    int passes = 0;
    int64_t expired = 0, deleted = 0;
    do {
        ck_assert_int_eq(store_trim(f.st, 1, PASS, &t), 0);
        ck_assert_int_le(t.expired_jobs + t.deleted_jobs, PASS);
        ck_assert_int_gt(t.expired_jobs + t.deleted_jobs, 0);
        if (passes == 0) ck_assert(output_expired(&f, ids[0]) && !output_expired(&f, ids[PASS]));
        expired += t.expired_jobs;
        deleted += t.deleted_jobs;
        passes++;
        ck_assert_int_lt(passes, 100);
    } while (t.more);
    /* Every output, then every job: 2 * JOBS jobs gone through, PASS a pass. */
    ck_assert_int_eq(expired, JOBS);
    ck_assert_int_eq(deleted, JOBS);
    ck_assert_int_ge(passes, 2 * JOBS / PASS);
    ck_assert_int_eq(count_blob_files(&f), 0);
    ck_assert_int_eq(store_trim(f.st, 1, PASS, &t), 0);
    ck_assert(!t.more);
    fixture_teardown(&f);
}
END_TEST

/* store_bytes counts blob files as the store writes and removes them, without walking blobs/
 * at each call: a file put there by hand is not seen until the next walk. */
START_TEST(test_store_bytes_counts_blob_files_without_walking_the_directory)
{
    fixture_t f;
    fixture_setup(&f);
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
    fill_bytes(big, sizeof big, 3);
    char *blob = NULL;
    ck_assert_int_eq(store_blob_write(f.st, big, sizeof big, &blob), 0);
    ck_assert_int_eq(store_bytes(f.st, &after), 0);
    ck_assert_uint_ge(after, before + sizeof big);
    ck_assert_uint_lt(after, before + sizeof junk);
    free(blob);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_gc_removes_expired_finished_jobs_and_their_files_but_not_others)
{
    fixture_t f;
    fixture_setup(&f);
    char old_done[ID_SIZE], old_failed[ID_SIZE], recent_done[ID_SIZE], queued[ID_SIZE],
        running[ID_SIZE];
    /* An old succeeded job with a file input and a file output. */
    job_t *job = make_job(&test_op, "alice", now_us());
    job->call.has_in[1] = true;
    tensor_set(&job->in[1], "y", 4096, 1);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    memcpy(old_done, job->id, ID_SIZE);
    char *in_file = strdup(job->in[1].blob);
    job_free(job);
    ck_assert_int_eq(set_state(&f, old_done, JOB_RUNNING), 0);
    job = get_job(&f, old_done);
    job->state = JOB_SUCCEEDED;
    job->finished_us = 1000;
    job->call.n_out = 1;
    job->call.out_names[0] = "out";
    tensor_set(&job->out[0], "out", 4096, 2);
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);
    job = get_job(&f, old_done);
    char *out_file = strdup(job->out[0].blob);
    job_free(job);
    ck_assert(blob_file_exists(&f, in_file));
    ck_assert(blob_file_exists(&f, out_file));

    insert_small(&f, &test_op, "alice", now_us(), old_failed);
    job = get_job(&f, old_failed);
    job->state = JOB_FAILED;
    job->finished_us = 2000;
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);
    insert_small(&f, &test_op, "alice", now_us(), recent_done);
    ck_assert_int_eq(set_state(&f, recent_done, JOB_CANCELLED), 0); /* finished now */
    insert_small(&f, &test_op, "alice", 10, queued);
    insert_small(&f, &test_op, "alice", 10, running);
    ck_assert_int_eq(set_state(&f, running, JOB_RUNNING), 0);

    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, now_us() - 60 * 1000000LL, &deleted), 0);
    ck_assert_int_eq(deleted, 2);
    job_t *none = NULL;
    ck_assert_int_eq(store_job_get(f.rd, old_done, &none), -ENOENT);
    ck_assert_int_eq(store_job_get(f.rd, old_failed, &none), -ENOENT);
    ck_assert(!blob_file_exists(&f, in_file));
    ck_assert(!blob_file_exists(&f, out_file));
    ck_assert_int_eq(count_blob_files(&f), 0);
    job_free(get_job(&f, recent_done));
    job_free(get_job(&f, queued));
    job_free(get_job(&f, running));

    /* Inside a transaction the files go only when it commits. */
    job = make_job(&test_op, "alice", now_us());
    job->call.has_in[1] = true;
    tensor_set(&job->in[1], "y", 4096, 9);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    job->state = JOB_CANCELLED;
    job->finished_us = 1000;
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_gc(f.st, 5000, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(blob_file_exists(&f, job->in[1].blob));
    ck_assert_int_eq(store_commit(f.st), 0);
    ck_assert(!blob_file_exists(&f, job->in[1].blob));
    job_free(job);
    free(in_file);
    free(out_file);
    fixture_teardown(&f);
}
END_TEST

/* A job with one 4000-byte input (a segment's size class), finished at finished_us. */
static void insert_finished_with_segment_input(fixture_t *f, int64_t finished_us, unsigned seed,
                                               char ret_id[ID_SIZE], char **ret_blob)
{
    job_t *job = make_job(&test_op, "alice", now_us());
    job->call.has_in[1] = true;
    tensor_set(&job->in[1], "y", 1000, seed);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_job_insert(f->st, job), 0);
    memcpy(ret_id, job->id, ID_SIZE);
    *ret_blob = strdup(job->in[1].blob);
    assert_blob_bytes(f, *ret_blob, job->in[1].data, job->in[1].nbytes);
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
    fixture_t f;
    fixture_setup_inline(&f, 8 << 20);

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
            job_t *job = make_job(&test_op, "alice", now_us());
            job->call.has_in[1] = true;
            tensor_set(&job->in[1], "y", sizes[(i + round) % N], seed++);
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
            tensor_set(&want, "y", sizes[(i + round) % N], seed++);
            /* Small tensors stay in rows up to STORE_TXN_ROW_BYTES per transaction; the rest go
             * to the segment. */
            if (i == 0) row_bytes = 0;
            bool in_row = want.nbytes < STORE_SEGMENT_MIN_BYTES;
            if (!in_row && row_bytes + want.nbytes <= STORE_TXN_ROW_BYTES) {
                in_row = true;
                row_bytes += want.nbytes;
            }
            if (kept[k]) {
                job_t *got = get_job(&f, ids[k]);
                ck_assert_msg(in_row == !strchr(got->in[1].blob, '@'),
                              "tensor %d of its transaction (%" PRIu64 " bytes): %s", i,
                              want.nbytes, got->in[1].blob);
                assert_blob_bytes(&f, got->in[1].blob, want.data, want.nbytes);
                job_free(got);
            }
            free(want.data);
        }
        /* Once more after a restart: everything was on disk. */
        reopen(&f);
    }
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_small_tensors_share_a_segment_that_goes_with_its_last_job)
{
    fixture_t f;
    fixture_setup_inline(&f, 65536);

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
        job_t *got = get_job(&f, ids[i]);
        ck_assert_str_eq(got->in[1].blob, blobs[i]);
        job_free(got);
    }
    ck_assert_int_eq(count_blob_files(&f), 1);

    /* After a restart the segment is no longer active: it stays while a job names it. */
    reopen(&f);
    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, 1500, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(blob_file_exists(&f, blobs[0]));
    job_t *got = get_job(&f, ids[2]);
    void *data = NULL;
    ck_assert_int_eq(store_blob_read(f.rd, got->in[1].blob, got->in[1].nbytes, &data), 0);
    free(data);
    job_free(got);
    ck_assert_int_eq(store_gc(f.st, 3500, &deleted), 0);
    ck_assert_int_eq(deleted, 2);
    ck_assert(!blob_file_exists(&f, blobs[0]));

    /* The active segment is never collected, even once no job names it; the sweep at an open
     * takes it once a row committed after its last write exists. Before that, it may belong to
     * a commit the WAL lost, and stays. */
    char id[ID_SIZE], *blob;
    insert_finished_with_segment_input(&f, 1000, 80, id, &blob);
    ck_assert_int_eq(store_gc(f.st, 1500, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(blob_file_exists(&f, blob));
    reopen(&f);
    ck_assert(blob_file_exists(&f, blob));
    char later[ID_SIZE];
    insert_small(&f, &test_op, "alice", now_us() + 3000000, later); /* past the sweep's margin */
    reopen(&f);
    ck_assert(!blob_file_exists(&f, blob));
    ck_assert_int_eq(count_blob_files(&f), 0);

    free(blob);
    for (int i = 0; i < 3; i++)
        free(blobs[i]);
    fixture_teardown(&f);
}
END_TEST

/* n jobs, each with a 4 KiB input y and, when with_output, a 4 KiB output, succeeded. */
static void make_small_tensor_jobs(job_t **jobs, int n, bool with_output)
{
    for (int i = 0; i < n; i++) {
        jobs[i] = make_job(&test_op, "alice", 1000 + i);
        jobs[i]->call.has_in[1] = true;
        tensor_set(&jobs[i]->in[1], "y", 1024, 100u + (unsigned)i);
        jobs[i]->call.in[1] = jobs[i]->in[1].desc;
        if (!with_output) continue;
        jobs[i]->call.n_out = 1;
        tensor_set(&jobs[i]->out[0], "out", 1024, 200u + (unsigned)i);
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
static void commit_running_then_end(fixture_t *f, job_t **jobs, int n, int failed)
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
static void assert_small_tensors_read_back(fixture_t *f, job_t **jobs, int n, int failed)
{
    for (int i = 0; i < n; i++) {
        job_t *got = get_job(f, jobs[i]->id);
        ck_assert_str_eq(got->in[1].blob, jobs[i]->in[1].blob);
        assert_blob_bytes(f, got->in[1].blob, jobs[i]->in[1].data, jobs[i]->in[1].nbytes);
        if (i != failed) assert_blob_bytes(f, got->out[0].blob, jobs[i]->out[0].data, 4096);
        job_free(got);
    }
}

START_TEST(test_pack_writes_many_jobs_small_tensors_to_one_file_that_goes_with_its_last_job)
{
    fixture_t f;
    fixture_setup_inline(&f, 65536);
    enum { N = 20 };
    job_t *jobs[N];
    make_small_tensor_jobs(jobs, N, true);

    /* 64 KiB of tensors weigh little on a group commit: they are left to it. */
    ck_assert_int_eq(store_blob_pack(f.st, jobs, 16, false), 0);
    for (int i = 0; i < 16; i++)
        ck_assert_ptr_null(jobs[i]->in[1].blob);
    ck_assert_int_eq(count_blob_files(&f), 0);

    /* 80 KiB go to one file, each tensor at its own offset; inputs too small for a segment
     * (x, 32 bytes) stay for the row. */
    ck_assert_int_eq(store_blob_pack(f.st, jobs, N, false), 0);
    ck_assert_int_eq(count_blob_files(&f), 1);
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
    ck_assert_int_eq(count_blob_files(&f), 2);
    ck_assert_ptr_null(jobs[3]->out[0].blob);
    len = locator_file_len(jobs[0]->out[0].blob);
    for (int i = 0; i < N; i++)
        if (i != 3) ck_assert_int_eq(strncmp(jobs[i]->out[0].blob, jobs[0]->out[0].blob, len), 0);

    /* The rows name the tensors where they are, and read back equal, after a restart too. */
    ck_assert_int_eq(store_begin(f.st), 0);
    commit_running_then_end(&f, jobs, N, 3);
    reopen(&f);
    ck_assert_int_eq(count_blob_files(&f), 2);
    assert_small_tensors_read_back(&f, jobs, N, 3);

    /* The files go with the last job naming them. */
    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, 1010, &deleted), 0);
    ck_assert_int_eq(deleted, 10);
    ck_assert(blob_file_exists(&f, jobs[0]->in[1].blob));
    ck_assert(blob_file_exists(&f, jobs[0]->out[0].blob));
    ck_assert_int_eq(store_gc(f.st, 1020, &deleted), 0);
    ck_assert_int_eq(deleted, 10);
    ck_assert_int_eq(count_blob_files(&f), 0);

    for (int i = 0; i < N; i++)
        job_free(jobs[i]);
    fixture_teardown(&f);
}
END_TEST

/* Placed ahead of their rows (store_jobs_place_small), a round's small tensors go to the active
 * segment together when its rows cannot take them all, and the segment is synced meanwhile by
 * another thread; bytes appended after that sync began are synced by the commit. They read
 * back equal after a restart. */
START_TEST(test_small_tensors_placed_ahead_share_the_segment_and_read_back_after_a_restart)
{
    fixture_t f;
    fixture_setup_inline(&f, 65536);
    enum { N = 20 };
    job_t *jobs[N];
    make_small_tensor_jobs(jobs, N, true);

    /* Outside a transaction it refuses; 64 KiB of inputs are left to the rows. */
    ck_assert_int_eq(store_jobs_place_small(f.st, jobs, N, false), -EINVAL);
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_jobs_place_small(f.st, jobs, 16, false), 0);
    for (int i = 0; i < 16; i++)
        ck_assert_ptr_null(jobs[i]->in[1].blob);
    ck_assert_int_eq(count_blob_files(&f), 0);

    /* 80 KiB go to the segment, each tensor at its own offset (x, 32 bytes, stays for the row),
     * then the outputs, appended while the first sync runs, but a failed job's. */
    ck_assert_int_eq(store_jobs_place_small(f.st, jobs, N, false), 0);
    snprintf(jobs[3]->error_code, sizeof jobs[3]->error_code, "%s", "kernel_failed");
    ck_assert_int_eq(store_jobs_place_small(f.st, jobs, N, true), 0);
    ck_assert_int_eq(count_blob_files(&f), 1);
    size_t len = locator_file_len(jobs[0]->in[1].blob);
    for (int i = 0; i < N; i++) {
        ck_assert_ptr_null(jobs[i]->in[0].blob);
        ck_assert_int_eq(strncmp(jobs[i]->in[1].blob, jobs[0]->in[1].blob, len), 0);
        ck_assert(i == 0 || strcmp(jobs[i]->in[1].blob, jobs[i - 1]->in[1].blob) != 0);
        if (i != 3) ck_assert_int_eq(strncmp(jobs[i]->out[0].blob, jobs[0]->in[1].blob, len), 0);
    }
    ck_assert_ptr_null(jobs[3]->out[0].blob);
    commit_running_then_end(&f, jobs, N, 3);
    ck_assert_int_eq(db_int(&f, "SELECT refs FROM blob_refs"), 2 * N - 1);
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

    reopen(&f);
    assert_small_tensors_read_back(&f, jobs, N, 3);
    for (int i = 0; i < N; i++) {
        job_free(jobs[i]);
        job_free(more[i]);
    }
    fixture_teardown(&f);
}
END_TEST

/* A file store_blob_pack wrote goes once its tensors are discarded and no row names it: at the
 * end of the transaction (rolled back or not), or at once outside one. */
START_TEST(test_discarded_packed_tensors_take_their_file_once_no_row_names_it)
{
    fixture_t f;
    fixture_setup_inline(&f, 65536);
    enum { N = 20 };
    job_t *jobs[N];

    /* One job's row commits: the file stays for it. */
    make_small_tensor_jobs(jobs, N, false);
    ck_assert_int_eq(store_blob_pack(f.st, jobs, N, false), 0);
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, jobs[0]), 0);
    for (int i = 1; i < N; i++)
        store_blob_discard(f.st, jobs[i]->in[1].blob);
    ck_assert(blob_file_exists(&f, jobs[0]->in[1].blob));
    ck_assert_int_eq(store_commit(f.st), 0);
    ck_assert(blob_file_exists(&f, jobs[0]->in[1].blob));
    for (int i = 0; i < N; i++)
        job_free(jobs[i]);
    ck_assert_int_eq(count_blob_files(&f), 1);

    /* Rolled back: the file goes with the transaction. */
    make_small_tensor_jobs(jobs, N, false);
    ck_assert_int_eq(store_blob_pack(f.st, jobs, N, false), 0);
    ck_assert_int_eq(count_blob_files(&f), 2);
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_job_insert(f.st, jobs[0]), 0);
    for (int i = 0; i < N; i++)
        store_blob_discard(f.st, jobs[i]->in[1].blob);
    ck_assert_int_eq(store_rollback(f.st), 0);
    ck_assert(!blob_file_exists(&f, jobs[0]->in[1].blob));
    for (int i = 0; i < N; i++)
        job_free(jobs[i]);

    /* Outside a transaction, at once. */
    make_small_tensor_jobs(jobs, N, false);
    ck_assert_int_eq(store_blob_pack(f.st, jobs, N, false), 0);
    ck_assert_int_eq(count_blob_files(&f), 2);
    store_blob_discard(f.st, jobs[5]->in[1].blob);
    ck_assert_int_eq(count_blob_files(&f), 1);
    for (int i = 0; i < N; i++)
        job_free(jobs[i]);
    fixture_teardown(&f);
}
END_TEST

/* Inserts n jobs, each with a 4 KiB input, in one transaction that commits or rolls back. */
static void insert_in_one_transaction(fixture_t *f, int n, bool commit)
{
    ck_assert_int_eq(store_begin(f->st), 0);
    for (int i = 0; i < n; i++) {
        job_t *job = make_job(&test_op, "alice", 1000 + i);
        job->call.has_in[1] = true;
        tensor_set(&job->in[1], "y", 1024, (unsigned)i);
        job->call.in[1] = job->in[1].desc;
        ck_assert_int_eq(store_job_insert(f->st, job), 0);
        job_free(job);
    }
    ck_assert_int_eq(commit ? store_commit(f->st) : store_rollback(f->st), 0);
}

START_TEST(test_a_transaction_counts_the_tensors_naming_each_file_once_it_commits)
{
    fixture_t f;
    fixture_setup_inline(&f, 65536);

    /* 20 inputs of 4 KiB: the first 64 KiB stay in their rows, the other 4 share a segment,
     * counted in one row. A rolled-back transaction counts nothing. */
    insert_in_one_transaction(&f, 20, false);
    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM blob_refs"), 0);
    insert_in_one_transaction(&f, 20, true);
    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM blob_refs"), 1);
    ck_assert_int_eq(db_int(&f, "SELECT refs FROM blob_refs"), 4);
    insert_in_one_transaction(&f, 20, false);
    ck_assert_int_eq(db_int(&f, "SELECT refs FROM blob_refs"), 4);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_gc_deletes_more_expired_jobs_than_one_batch_holds)
{
    fixture_t f;
    fixture_setup(&f);
    enum { N = 600 }; /* more than the store's internal batch of 256 */
    ck_assert_int_eq(store_begin(f.st), 0);
    for (int i = 0; i < N; i++) {
        job_t *job = make_job(&test_op, "alice", now_us());
        ck_assert_int_eq(store_job_insert(f.st, job), 0);
        job->state = JOB_CANCELLED;
        job->finished_us = 1000 + i;
        ck_assert_int_eq(store_job_update(f.st, job), 0);
        job_free(job);
    }
    ck_assert_int_eq(store_commit(f.st), 0);
    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, 1000 + N - 1, &deleted), 0); /* all but the newest */
    ck_assert_int_eq(deleted, N - 1);
    store_list_query_t q = {.state = -1, .limit = 10};
    job_t **jobs;
    size_t n;
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(jobs[0]->finished_us, 1000 + N - 1);
    job_free(jobs[0]);
    free(jobs);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_buffers_insert_get_delete_check_the_owner)
{
    fixture_t f;
    fixture_setup(&f);
    buffer_t *small = buffer_new(), *large = buffer_new();
    buffer_t *bufs[2] = {small, large};
    int64_t elems[2] = {16, 10000};
    for (int i = 0; i < 2; i++) {
        snprintf(bufs[i]->owner, OWNER_SIZE, "alice");
        bufs[i]->desc = (tensor_desc_t){.dtype = DTYPE_I32, .ndim = 2, .shape = {2, elems[i] / 2}};
        bufs[i]->nbytes = (uint64_t)elems[i] * 4;
        bufs[i]->data = malloc(bufs[i]->nbytes);
        bufs[i]->resident = i == 1;
        bufs[i]->device = i == 1 ? 3 : -1;
        fill_bytes(bufs[i]->data, bufs[i]->nbytes, 40 + i);
        ck_assert_int_eq(store_buffer_insert(f.st, bufs[i]), 0);
        ck_assert(id_valid('b', bufs[i]->id));
    }
    ck_assert_int_eq(strncmp(small->blob, "row:buffers/", 12), 0);
    ck_assert_int_eq(strncmp(large->blob, "file:", 5), 0);

    for (int i = 0; i < 2; i++) {
        buffer_t *got = NULL;
        ck_assert_int_eq(store_buffer_get(f.rd, bufs[i]->id, &got), 0);
        ck_assert_str_eq(got->owner, "alice");
        ck_assert(tensor_desc_equal(&got->desc, &bufs[i]->desc));
        ck_assert_uint_eq(got->nbytes, bufs[i]->nbytes);
        ck_assert_int_eq(got->resident, bufs[i]->resident);
        ck_assert_int_eq(got->device, bufs[i]->device);
        ck_assert_int_eq(got->created_us, bufs[i]->created_us);
        ck_assert_str_eq(got->blob, bufs[i]->blob);
        ck_assert_ptr_null(got->data);
        assert_blob_bytes(&f, got->blob, bufs[i]->data, bufs[i]->nbytes);
        buffer_free(got);
    }

    /* Only the resident buffer counts against the resident quota; both against the stored. */
    uint64_t resident = 0, stored = 0;
    ck_assert_int_eq(store_buffer_bytes(f.st, "alice", &stored, &resident), 0);
    ck_assert_uint_eq(resident, large->nbytes);
    ck_assert_uint_eq(stored, large->nbytes + small->nbytes);
    store_usage_t usage;
    ck_assert_int_eq(store_usage_get(f.rd, "alice", &usage), 0);
    ck_assert_int_eq(usage.resident_bytes, (int64_t)large->nbytes);
    ck_assert_int_eq(usage.buffer_bytes, (int64_t)(large->nbytes + small->nbytes));

    ck_assert_int_eq(store_buffer_delete(f.st, "bob", large->id), -ENOENT);
    buffer_t *still = NULL;
    ck_assert_int_eq(store_buffer_get(f.rd, large->id, &still), 0);
    buffer_free(still);
    ck_assert(blob_file_exists(&f, large->blob));
    ck_assert_int_eq(store_buffer_delete(f.st, "alice", large->id), 0);
    ck_assert_int_eq(store_buffer_get(f.rd, large->id, &still), -ENOENT);
    ck_assert(!blob_file_exists(&f, large->blob));
    ck_assert_int_eq(store_buffer_bytes(f.st, "alice", &stored, &resident), 0);
    ck_assert_uint_eq(resident, 0);
    ck_assert_uint_eq(stored, small->nbytes);
    ck_assert_int_eq(store_buffer_delete(f.st, "alice", large->id), -ENOENT);
    ck_assert_int_eq(store_buffer_delete(f.st, NULL, small->id), 0);
    ck_assert_int_eq(store_buffer_get(f.rd, small->id, &still), -ENOENT);
    void *data = NULL;
    ck_assert_int_eq(store_blob_read(f.rd, small->blob, small->nbytes, &data), -ENOENT);

    buffer_t *bad = buffer_new();
    snprintf(bad->owner, OWNER_SIZE, "alice");
    bad->desc = (tensor_desc_t){.dtype = DTYPE_F32, .ndim = 1, .shape = {4}};
    bad->nbytes = 15;
    bad->data = malloc(16);
    ck_assert_int_eq(store_buffer_insert(f.st, bad), -EINVAL);
    buffer_free(bad);
    buffer_free(small);
    buffer_free(large);
    fixture_teardown(&f);
}
END_TEST

/* A relaxed transaction (a job's start or end) commits like any other, but files whose rows it
 * deleted wait for the next durable commit: a power loss could bring those rows back. */
START_TEST(test_a_relaxed_commit_keeps_deleted_files_until_a_durable_one)
{
    fixture_t f;
    fixture_setup(&f);
    buffer_t *buf = buffer_new();
    snprintf(buf->owner, OWNER_SIZE, "alice");
    buf->desc = (tensor_desc_t){.dtype = DTYPE_I32, .ndim = 1, .shape = {100000}};
    buf->nbytes = 400000;
    buf->data = malloc(buf->nbytes);
    fill_bytes(buf->data, buf->nbytes, 7);
    ck_assert_int_eq(store_buffer_insert(f.st, buf), 0);
    ck_assert_int_eq(strncmp(buf->blob, "file:", 5), 0);

    /* Rolled back: row and file stay. */
    buffer_t *got = NULL;
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    ck_assert_int_eq(store_buffer_delete(f.st, "alice", buf->id), 0);
    ck_assert_int_eq(store_rollback(f.st), 0);
    ck_assert_int_eq(store_buffer_get(f.rd, buf->id, &got), 0);
    buffer_free(got);
    ck_assert(blob_file_exists(&f, buf->blob));

    /* Committed relaxed: the row is gone for readers, the file stays. */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    ck_assert_int_eq(store_buffer_delete(f.st, "alice", buf->id), 0);
    ck_assert_int_eq(store_commit(f.st), 0);
    ck_assert_int_eq(store_buffer_get(f.rd, buf->id, &got), -ENOENT);
    ck_assert(blob_file_exists(&f, buf->blob));

    /* A later transaction rolled back keeps it too; the next durable commit removes it. */
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_rollback(f.st), 0);
    ck_assert(blob_file_exists(&f, buf->blob));
    ck_assert_int_eq(store_begin(f.st), 0);
    ck_assert_int_eq(store_commit(f.st), 0);
    ck_assert(!blob_file_exists(&f, buf->blob));
    buffer_free(buf);
    fixture_teardown(&f);
}
END_TEST

static int db_user_version(const char *path)
{
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *stmt;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &stmt, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
    int v = sqlite3_column_int(stmt, 0);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return v;
}

START_TEST(test_open_migrates_an_empty_file_to_the_current_schema)
{
    char dir[] = "/tmp/test_store.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", dir);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0640);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(db_user_version(path), 0);

    config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.shards = 1;
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s", dir);
    cfg.inline_blob_bytes = INLINE_LIMIT;
    store_t *st = NULL;
    ck_assert_int_eq(store_open(&cfg, &st), 0);
    store_close(st);
    ck_assert_int_eq(db_user_version(path), STORE_SCHEMA_VERSION);

    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    const char *tables[] = {"jobs", "blob_refs", "buffers"};
    for (int i = 0; i < 3; i++) {
        sqlite3_stmt *stmt;
        ck_assert_int_eq(sqlite3_prepare_v2(db,
                                            "SELECT count(*) FROM sqlite_schema WHERE "
                                            "type = 'table' AND name = ?1",
                                            -1, &stmt, NULL),
                         SQLITE_OK);
        sqlite3_bind_text(stmt, 1, tables[i], -1, SQLITE_STATIC);
        ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
        ck_assert_int_eq(sqlite3_column_int(stmt, 0), 1);
        sqlite3_finalize(stmt);
    }
    sqlite3_stmt *stmt;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(stmt), SQLITE_ROW);
    ck_assert_str_eq((const char *)sqlite3_column_text(stmt, 0), "wal");
    sqlite3_finalize(stmt);
    sqlite3_close(db);

    /* Opening again finds the schema current and changes nothing. */
    ck_assert_int_eq(store_open(&cfg, &st), 0);
    store_close(st);
    ck_assert_int_eq(db_user_version(path), STORE_SCHEMA_VERSION);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
END_TEST

/* Schema version 1 as it shipped (store_schema.c keeps it as the first migration), with rows
 * of a finished job whose tensors are in a row, in a file of their own and in a buffer. */
static const char schema_v1_with_rows[] =
    "CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, op TEXT NOT NULL, params TEXT,"
    "  priority INTEGER NOT NULL, device INTEGER NOT NULL, deadline_us INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN "
    "    ('queued', 'running', 'succeeded', 'failed', 'cancelled')),"
    "  attempts INTEGER NOT NULL DEFAULT 0, created_us INTEGER NOT NULL,"
    "  started_us INTEGER NOT NULL DEFAULT 0, finished_us INTEGER NOT NULL DEFAULT 0,"
    "  run_device INTEGER NOT NULL DEFAULT -1, gpu_ns INTEGER NOT NULL DEFAULT 0,"
    "  batch_size INTEGER NOT NULL DEFAULT 0, error_code TEXT NOT NULL DEFAULT '',"
    "  error_message TEXT NOT NULL DEFAULT '', idempotency_key TEXT) WITHOUT ROWID;"
    "CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner, idempotency_key)"
    "  WHERE idempotency_key IS NOT NULL;"
    "CREATE INDEX jobs_owner_id ON jobs (owner, id);"
    "CREATE INDEX jobs_state ON jobs (state, created_us, id);"
    "CREATE INDEX jobs_finished ON jobs (finished_us)"
    "  WHERE state IN ('succeeded', 'failed', 'cancelled');"
    "CREATE TABLE tensors (job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    "  role TEXT NOT NULL CHECK (role IN ('in', 'out')), slot INTEGER NOT NULL,"
    "  name TEXT NOT NULL, dtype TEXT NOT NULL, shape TEXT NOT NULL, nbytes INTEGER NOT NULL,"
    "  buffer_id TEXT, data BLOB, file TEXT, PRIMARY KEY (job_id, role, slot));"
    "CREATE INDEX tensors_file ON tensors (file) WHERE file IS NOT NULL;"
    "CREATE TABLE buffers (id TEXT PRIMARY KEY, owner TEXT NOT NULL, dtype TEXT NOT NULL,"
    "  shape TEXT NOT NULL, nbytes INTEGER NOT NULL, resident INTEGER NOT NULL,"
    "  created_us INTEGER NOT NULL, data BLOB, file TEXT);"
    "CREATE INDEX buffers_owner ON buffers (owner);"
    "CREATE INDEX buffers_file ON buffers (file) WHERE file IS NOT NULL;"
    "INSERT INTO jobs (id, owner, op, params, priority, device, deadline_us, state, attempts,"
    "  created_us, started_us, finished_us) VALUES ('j1', 'alice', 'test_store_op', '{}', 0, -1,"
    "  0, 'succeeded', 1, 1000, 2000, 3000);"
    "INSERT INTO tensors VALUES ('j1', 'in', 0, 'x', 'f32', '[2]', 8, NULL, x'0000803f00000040',"
    "  NULL);"
    "INSERT INTO tensors VALUES ('j1', 'in', 1, 'y', 'f32', '[1]', 4, NULL, NULL,"
    "  'ab/ab000000000000000000000000000001');"
    "INSERT INTO tensors VALUES ('j1', 'in', 2, 'w', 'f32', '[4]', 16, 'b1', NULL, NULL);"
    "INSERT INTO tensors VALUES ('j1', 'out', 0, 'out', 'f32', '[1]', 4, NULL, x'00004040', NULL);"
    "INSERT INTO buffers VALUES ('b1', 'alice', 'f32', '[4]', 16, 1, 500, zeroblob(16), NULL);"
    "PRAGMA user_version = 1";

START_TEST(test_open_migrates_version_1_rows_to_the_current_schema)
{
    fixture_t f;
    snprintf(f.dir, sizeof f.dir, "/tmp/test_store.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f.dir));
    memset(&f.cfg, 0, sizeof f.cfg);
    f.cfg.shards = 1;
    snprintf(f.cfg.state_dir, sizeof f.cfg.state_dir, "%s", f.dir);
    f.cfg.inline_blob_bytes = INLINE_LIMIT;
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", f.dir);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, schema_v1_with_rows, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    snprintf(path, sizeof path, "%s/blobs", f.dir);
    ck_assert_int_eq(mkdir(path, 0750), 0);
    snprintf(path, sizeof path, "%s/blobs/ab", f.dir);
    ck_assert_int_eq(mkdir(path, 0750), 0);
    const float y = 7.0f;
    snprintf(path, sizeof path, "%s/blobs/ab/ab000000000000000000000000000001", f.dir);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0640);
    ck_assert_int_eq(write(fd, &y, sizeof y), (ssize_t)sizeof y);
    close(fd);

    ck_assert_int_eq(store_open(&f.cfg, &f.st), 0);
    ck_assert_int_eq(store_reader_open(&f.cfg, &f.rd), 0);
    snprintf(path, sizeof path, "%s/gpujobd.db", f.dir);
    ck_assert_int_eq(db_user_version(path), STORE_SCHEMA_VERSION);
    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM sqlite_schema WHERE name = 'tensors'"), 0);
    ck_assert_int_eq(
        db_int(&f, "SELECT refs FROM blob_refs WHERE file = 'ab/ab000000000000000000000000000001'"),
        1);
    buffer_t *got = NULL;
    ck_assert_int_eq(store_buffer_get(f.rd, "b1", &got), 0);
    ck_assert(got->resident);
    ck_assert_int_eq(got->device, -1);
    buffer_free(got);

    /* Every tensor kept its descriptor and where its bytes are; the file survived the sweep at
     * open, as a row names it. */
    job_t *job = get_job(&f, "j1");
    ck_assert_int_eq(job->state, JOB_SUCCEEDED);
    ck_assert(job->call.has_in[0] && job->call.has_in[1] && job->call.has_in[2]);
    const float x[2] = {1.0f, 2.0f}, out = 3.0f;
    ck_assert_str_eq(job->in[0].name, "x");
    ck_assert_int_eq(job->in[0].desc.shape[0], 2);
    assert_blob_bytes(&f, job->in[0].blob, x, sizeof x);
    ck_assert(blob_file_exists(&f, job->in[1].blob));
    assert_blob_bytes(&f, job->in[1].blob, &y, sizeof y);
    ck_assert_str_eq(job->in[2].buffer_id, "b1");
    ck_assert_ptr_null(job->in[2].blob);
    ck_assert_str_eq(job->out[0].name, "out");
    assert_blob_bytes(&f, job->out[0].blob, &out, sizeof out);

    /* Deleting the job takes its file, its count and its bytes (inputs', outputs') with it. */
    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM job_bytes WHERE job_id = 'j1'"), 2);
    int deleted = 0;
    ck_assert_int_eq(store_gc(f.st, now_us(), &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(!blob_file_exists(&f, job->in[1].blob));
    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM blob_refs"), 0);
    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM job_bytes"), 0);
    job_free(job);
    fixture_teardown(&f);
}
END_TEST

/* The usage rollup of (owner, day, op) is written with each job's end and sums what the jobs
 * recorded: with one shard and with four (each job's end writes its shard's rollup; reads sum
 * them). A refused change adds nothing. Then retention and the store's bound delete every job,
 * and the rollup stays as it was. */
static void assert_rollup(fixture_t *f, const char *owner, int64_t jobs, int64_t succeeded,
                          int64_t run_us, int64_t gpu_ns, int64_t bytes_out)
{
    store_usage_query_t q = {
        .owner = owner, .since_day = 0, .until_day = INT64_MAX / 2, .max_rows = 100};
    store_usage_row_t *rows = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_usage_rollup(f->rd, &q, &rows, &n), 0);
    store_usage_row_t sum = {.jobs = 0};
    for (size_t i = 0; i < n; i++) {
        if (owner) ck_assert_str_eq(rows[i].owner, owner);
        ck_assert_str_eq(rows[i].op, test_op.name);
        sum.jobs += rows[i].jobs;
        sum.succeeded += rows[i].succeeded;
        sum.run_us += rows[i].run_us;
        sum.gpu_ns += rows[i].gpu_ns;
        sum.bytes_out += rows[i].bytes_out;
    }
    /* One row per owner: the jobs ended within the same day, whichever shard they are in. */
    ck_assert_uint_eq(n, owner ? 1 : 2);
    ck_assert_int_eq(sum.jobs, jobs);
    ck_assert_int_eq(sum.succeeded, succeeded);
    ck_assert_int_eq(sum.run_us, run_us);
    ck_assert_int_eq(sum.gpu_ns, gpu_ns);
    ck_assert_int_eq(sum.bytes_out, bytes_out);
    free(rows);
}

START_TEST(test_usage_rollup_follows_job_ends_and_outlives_retention)
{
    static const int shard_counts[] = {1, 4};
    fixture_t f;
    fixture_setup_shards(&f, 1 << 20, shard_counts[_i]);
    /* Noon of one day: every end below falls on it. */
    int64_t day = now_us() / (86400 * INT64_C(1000000));
    int64_t noon = day * 86400 * INT64_C(1000000) + 43200 * INT64_C(1000000);
    int64_t run_us[2] = {0}, gpu_ns[2] = {0}, jobs[2] = {0}, ok[2] = {0}, out_bytes[2] = {0};
    const char *owners[2] = {"alice", "bob"};
    for (int i = 0; i < 24; i++) {
        int o = i % 3 == 0; /* a third bob's */
        char id[ID_SIZE];
        insert_small(&f, &test_op, owners[o], noon - 5000, id);
        ck_assert_int_eq(set_state(&f, id, JOB_RUNNING), 0);
        job_t *job = get_job(&f, id);
        ck_assert_int_eq(job_resolve_op(job), 0);
        job->started_us = noon + i;
        job->finished_us = noon + i + 100 * (i + 1);
        job->gpu_ns = 7000 * (i + 1);
        job->state = i % 4 == 3 ? JOB_FAILED : JOB_SUCCEEDED;
        if (job->state == JOB_SUCCEEDED) {
            job->call.n_out = 1;
            job->call.out_names[0] = "out";
            tensor_set(&job->out[0], "out", 4, 1);
            out_bytes[o] += 16;
            ok[o]++;
        }
        ck_assert_int_eq(store_job_update(f.st, job), 0);
        /* A refused change leaves the rollup alone. */
        job->state = JOB_CANCELLED;
        ck_assert_int_eq(store_job_update(f.st, job), -EBUSY);
        jobs[o]++;
        run_us[o] += 100 * (i + 1);
        gpu_ns[o] += 7000 * (i + 1);
        job_free(job);
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int o = 0; o < 2; o++)
            assert_rollup(&f, owners[o], jobs[o], ok[o], run_us[o], gpu_ns[o], out_bytes[o]);
        assert_rollup(&f, NULL, jobs[0] + jobs[1], ok[0] + ok[1], run_us[0] + run_us[1],
                      gpu_ns[0] + gpu_ns[1], out_bytes[0] + out_bytes[1]);
        store_usage_t u;
        ck_assert_int_eq(store_usage_get(f.rd, "alice", &u), 0);
        ck_assert_int_eq(u.jobs_by_state[JOB_SUCCEEDED], ok[0]);
        ck_assert_int_eq(u.gpu_ns, gpu_ns[0]);
        if (pass == 1) break;
        /* The store's bound expires outputs and deletes jobs; retention deletes the rest. */
        store_trim_stats_t ts;
        ck_assert_int_eq(store_trim(f.st, 1, INT64_MAX, &ts), 0);
        ck_assert_int_gt(ts.deleted_jobs + ts.expired_jobs, 0);
        int deleted = 0;
        ck_assert_int_eq(store_gc(f.st, INT64_MAX, &deleted), 0);
        ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM jobs"), 0);
        reopen(&f);
    }
    /* A range that leaves the day out has no rows. */
    store_usage_query_t q = {
        .owner = NULL, .since_day = day + 1, .until_day = day + 9, .max_rows = 100};
    store_usage_row_t *rows = NULL;
    size_t n = 5;
    ck_assert_int_eq(store_usage_rollup(f.rd, &q, &rows, &n), 0);
    ck_assert_uint_eq(n, 0);
    free(rows);
    /* Past max_rows: -E2BIG, nothing handed back. */
    q = (store_usage_query_t){.since_day = day, .until_day = day, .max_rows = 1};
    ck_assert_int_eq(store_usage_rollup(f.rd, &q, &rows, &n), -E2BIG);
    fixture_teardown(&f);
}
END_TEST

/* A running job of owner's, read back to be ended at finished_us. */
static job_t *running_job(fixture_t *f, const char *owner, int64_t started_us)
{
    char id[ID_SIZE];
    insert_small(f, &test_op, owner, started_us - 5000, id);
    ck_assert_int_eq(set_state(f, id, JOB_RUNNING), 0);
    job_t *job = get_job(f, id);
    ck_assert_int_eq(job_resolve_op(job), 0);
    job->started_us = started_us;
    return job;
}

/* Ends recorded inside a transaction add to the rollup when it commits, summed per owner, day
 * and op, and not at all when it is rolled back (their rows say running again), then or at the
 * next commit; a change the
 * transaction refuses adds nothing. With one shard and with four, whose commits each write
 * their own jobs' sums. */
START_TEST(test_usage_rollup_sums_a_transactions_ends_and_drops_a_rolled_back_ones)
{
    static const int shard_counts[] = {1, 4};
    fixture_t f;
    fixture_setup_shards(&f, 1 << 20, shard_counts[_i]);
    int64_t day = now_us() / (86400 * INT64_C(1000000));
    int64_t noon = day * 86400 * INT64_C(1000000) + 43200 * INT64_C(1000000);
    const char *owners[2] = {"alice", "bob"};
    int64_t jobs[2] = {0}, run_us[2] = {0}, gpu_ns[2] = {0};
    /* The commit after the rollback would show sums the rollback left behind. */
    for (int round = 0; round < 3; round++) {
        bool commit = round != 1;
        job_t *ended[12];
        for (int i = 0; i < 12; i++)
            ended[i] = running_job(&f, owners[i % 3 == 0], noon + i);
        ck_assert_int_eq(store_begin_relaxed(f.st), 0);
        for (int i = 0; i < 12; i++) {
            int o = i % 3 == 0;
            job_t *job = ended[i];
            job->finished_us = noon + i + 10 * (i + 1);
            job->gpu_ns = 300 * (i + 1);
            job->state = JOB_FAILED;
            ck_assert_int_eq(store_job_update(f.st, job), 0);
            job->state = JOB_CANCELLED;
            ck_assert_int_eq(store_job_update(f.st, job), -EBUSY);
            if (!commit) continue;
            jobs[o]++;
            run_us[o] += 10 * (i + 1);
            gpu_ns[o] += 300 * (i + 1);
        }
        if (commit)
            ck_assert_int_eq(store_commit(f.st), 0);
        else
            ck_assert_int_eq(store_rollback(f.st), 0);
        for (int i = 0; i < 12; i++) {
            job_t *back = get_job(&f, ended[i]->id);
            ck_assert_int_eq(back->state, commit ? JOB_FAILED : JOB_RUNNING);
            job_free(back);
            job_free(ended[i]);
        }
        for (int o = 0; o < 2; o++)
            assert_rollup(&f, owners[o], jobs[o], 0, run_us[o], gpu_ns[o], 0);
    }
    fixture_teardown(&f);
}
END_TEST

/* The fair-share state saved is the state loaded, across a reopen, and a save replaces it. */
START_TEST(test_fair_share_state_survives_reopen)
{
    fixture_t f;
    fixture_setup(&f);
    store_fair_share_t in[2] = {{"alice", 1.5e6, 1000}, {"bob", 250.25, 2000}};
    ck_assert_int_eq(store_fair_share_save(f.st, in, 2), 0);
    reopen(&f);
    store_fair_share_t *out = NULL;
    size_t n = 0;
    ck_assert_int_eq(store_fair_share_load(f.st, &out, &n), 0);
    ck_assert_uint_eq(n, 2);
    for (size_t i = 0; i < n; i++) {
        int k = strcmp(out[i].owner, "bob") == 0;
        ck_assert_str_eq(out[i].owner, in[k].owner);
        ck_assert(out[i].usage_us == in[k].usage_us);
        ck_assert_int_eq(out[i].at_us, in[k].at_us);
    }
    free(out);
    ck_assert_int_eq(store_fair_share_save(f.st, in + 1, 1), 0);
    ck_assert_int_eq(store_fair_share_load(f.st, &out, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(out[0].owner, "bob");
    free(out);
    fixture_teardown(&f);
}
END_TEST

/* Schema version 6 indexes jobs by finish time, which only ended jobs have. A version-5
 * database, with an ended job a past version left without one and a running one with one,
 * comes out of the migration with the new indexes, the finish times made right, and its jobs
 * found by recovery, by state and by retention as before. */
START_TEST(test_open_migrates_version_5_state_indexes_to_finish_time_ones)
{
    fixture_t f;
    fixture_setup(&f);
    char queued[ID_SIZE], running[ID_SIZE], ended[ID_SIZE];
    insert_small(&f, &test_op, "alice", 1000, queued);
    insert_small(&f, &test_op, "alice", 2000, running);
    ck_assert_int_eq(set_state(&f, running, JOB_RUNNING), 0);
    insert_small(&f, &test_op, "alice", 3000, ended);
    ck_assert_int_eq(set_state(&f, ended, JOB_RUNNING), 0);
    ck_assert_int_eq(set_state(&f, ended, JOB_SUCCEEDED), 0);
    store_reader_close(f.rd);
    store_close(f.st);
    char sql[1536];
    snprintf(sql, sizeof sql,
             "DROP INDEX jobs_live; DROP INDEX jobs_ended; DROP INDEX jobs_finished;"
             "DROP INDEX jobs_idempotency; ALTER TABLE jobs DROP COLUMN idempotency_index;"
             "CREATE UNIQUE INDEX jobs_idempotency ON jobs (owner, idempotency_key)"
             "  WHERE idempotency_key IS NOT NULL;"
             "CREATE INDEX jobs_state ON jobs (state, created_us, id);"
             "CREATE INDEX jobs_finished ON jobs (finished_us) WHERE " STORE_FINAL_STATES ";"
             "UPDATE jobs SET finished_us = 0, started_us = 3500 WHERE id = '%s';"
             "UPDATE jobs SET finished_us = 777 WHERE id = '%s';"
             "DROP TABLE settings; ALTER TABLE jobs DROP COLUMN batch_ns;"
             "DROP TABLE usage_daily; DROP TABLE fair_share;"
             "ALTER TABLE buffers DROP COLUMN durable;"
             "DROP INDEX jobs_queued; DROP INDEX jobs_running;"
             "ALTER TABLE jobs DROP COLUMN batch_key; ALTER TABLE jobs DROP COLUMN cost_bytes;"
             "ALTER TABLE jobs DROP COLUMN cost_flops;"
             "PRAGMA user_version = 5",
             ended, running);
    db_exec(&f, sql);

    ck_assert_int_eq(store_open(&f.cfg, &f.st), 0);
    ck_assert_int_eq(store_reader_open(&f.cfg, &f.rd), 0);
    ck_assert_int_eq(db_int(&f, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
    ck_assert_int_eq(db_int(&f, "SELECT count(*) FROM sqlite_schema WHERE name = 'jobs_state'"), 0);
    ck_assert_int_eq(
        db_int(&f, "SELECT count(*) FROM sqlite_schema WHERE "
                   "(name = 'jobs_live' AND sql LIKE '%(owner, id) WHERE finished_us = 0') "
                   "OR (name = 'jobs_ended' AND sql LIKE '%(state, id) WHERE finished_us > 0') "
                   "OR (name = 'jobs_finished' AND sql LIKE '%WHERE finished_us > 0')"),
        3);
    job_t *got = get_job(&f, ended);
    ck_assert_int_eq(got->finished_us, 3500); /* its start: the latest time it has */
    job_free(got);
    got = get_job(&f, running);
    ck_assert_int_eq(got->finished_us, 0);
    job_free(got);
    assert_listed_by_state(&f, JOB_QUEUED, queued);
    assert_listed_by_state(&f, JOB_RUNNING, running);
    assert_listed_by_state(&f, JOB_SUCCEEDED, ended);

    recovered_t rec = {.n = 0};
    recover_jobs(&f, 3, collect, &rec);
    ck_assert_int_eq(rec.n, 2);
    ck_assert_str_eq(rec.jobs[0]->id, queued);
    ck_assert_str_eq(rec.jobs[1]->id, running);
    for (int i = 0; i < rec.n; i++)
        job_free(rec.jobs[i]);

    int deleted = 0;
    ck_assert_int_eq(store_gc(f.st, 4000, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert_int_eq(store_job_get(f.rd, ended, &got), -ENOENT);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_open_refuses_a_database_from_a_newer_version)
{
    char dir[] = "/tmp/test_store.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", dir);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.shards = 1;
    snprintf(cfg.state_dir, sizeof cfg.state_dir, "%s", dir);
    store_t *st = NULL;
    ck_assert_int_eq(store_open(&cfg, &st), -EPROTO);
    ck_assert_ptr_null(st);
    store_reader_t *rd = NULL;
    ck_assert_int_eq(store_reader_open(&cfg, &rd), -EPROTO);
    ck_assert_int_eq(db_user_version(path), 99);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
END_TEST

START_TEST(test_committed_job_survives_kill_9_and_uncommitted_one_does_not)
{
    fixture_t f;
    fixture_setup(&f);
    store_reader_close(f.rd);
    store_close(f.st);
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        store_t *st;
        char ids[2][ID_SIZE];
        if (store_open(&f.cfg, &st) < 0) _exit(1);
        job_t *committed = make_job(&test_op, "alice", now_us());
        committed->call.has_in[1] = true;
        tensor_set(&committed->in[1], "y", 4096, 8);
        committed->call.in[1] = committed->in[1].desc;
        if (store_begin(st) < 0 || store_job_insert(st, committed) < 0 || store_commit(st) < 0)
            _exit(2);
        job_t *pending = make_job(&test_op, "alice", now_us());
        if (store_begin(st) < 0 || store_job_insert(st, pending) < 0) _exit(3);
        memcpy(ids[0], committed->id, ID_SIZE);
        memcpy(ids[1], pending->id, ID_SIZE);
        if (write(pipefd[1], ids, sizeof ids) != sizeof ids) _exit(4);
        _exit(0); /* no close, no commit: as a kill -9 leaves it */
    }
    close(pipefd[1]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    char ids[2][ID_SIZE];
    ck_assert_int_eq(read(pipefd[0], ids, sizeof ids), sizeof ids);
    close(pipefd[0]);

    ck_assert_int_eq(store_open(&f.cfg, &f.st), 0);
    ck_assert_int_eq(store_reader_open(&f.cfg, &f.rd), 0);
    job_t *got = get_job(&f, ids[0]);
    ck_assert_int_eq(got->state, JOB_QUEUED);
    void *expected = malloc(4096 * 4);
    fill_bytes(expected, 4096 * 4, 8);
    assert_blob_bytes(&f, got->in[1].blob, expected, 4096 * 4);
    free(expected);
    job_free(got);
    job_t *none = NULL;
    ck_assert_int_eq(store_job_get(f.rd, ids[1], &none), -ENOENT);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_reader_sees_committed_data_while_the_writer_holds_a_transaction)
{
    fixture_t f;
    fixture_setup(&f);
    char committed[ID_SIZE];
    insert_small(&f, &test_op, "alice", now_us(), committed);
    ck_assert_int_eq(store_begin(f.st), 0);
    char pending[ID_SIZE];
    insert_small(&f, &test_op, "alice", now_us(), pending);
    ck_assert_int_eq(set_state(&f, committed, JOB_RUNNING), 0);

    /* A second reader, opened while the writer's transaction is open. */
    store_reader_t *rd2 = NULL;
    ck_assert_int_eq(store_reader_open(&f.cfg, &rd2), 0);
    store_reader_t *readers[2] = {f.rd, rd2};
    for (int i = 0; i < 2; i++) {
        job_t *job = NULL;
        ck_assert_int_eq(store_job_get(readers[i], committed, &job), 0);
        ck_assert_int_eq(job->state, JOB_QUEUED); /* the running update is not committed */
        job_free(job);
        ck_assert_int_eq(store_job_get(readers[i], pending, &job), -ENOENT);
        job_t **jobs;
        size_t n;
        store_list_query_t q = {.state = -1, .limit = 10};
        ck_assert_int_eq(store_jobs_list(readers[i], &q, &jobs, &n), 0);
        ck_assert_uint_eq(n, 1);
        job_free(jobs[0]);
        free(jobs);
    }
    ck_assert_int_eq(store_commit(f.st), 0);
    job_t *job = get_job(&f, pending);
    job_free(job);
    job = get_job(&f, committed);
    ck_assert_int_eq(job->state, JOB_RUNNING);
    job_free(job);
    store_reader_close(rd2);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_open_sweeps_blob_files_no_committed_row_names)
{
    fixture_t f;
    fixture_setup(&f);
    char big[4096];
    fill_bytes(big, sizeof big, 2);
    char *orphan = NULL;
    ck_assert_int_eq(store_blob_write(f.st, big, sizeof big, &orphan), 0);
    /* Created well after the orphan was written: past the sweep's margin for coarse mtimes. */
    job_t *job = make_job(&test_op, "alice", now_us() + 3000000);
    job->call.has_in[1] = true;
    tensor_set(&job->in[1], "y", 4096, 1);
    job->call.in[1] = job->in[1].desc;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    ck_assert_int_eq(count_blob_files(&f), 2);

    reopen(&f);
    ck_assert(!blob_file_exists(&f, orphan));
    ck_assert(blob_file_exists(&f, job->in[1].blob));
    ck_assert_int_eq(count_blob_files(&f), 1);
    free(orphan);
    job_free(job);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_job_of_an_op_this_build_lacks_keeps_its_name_and_refuses_to_run)
{
    fixture_t f;
    fixture_setup(&f);
    ck_assert_ptr_null(op_find("test_store_op"));
    char id[ID_SIZE];
    insert_small(&f, &test_op, "alice", now_us(), id);
    /* The store hands the job back as stored: its op by name, no call made. */
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(f.rd, id, &stored), 0);
    ck_assert_ptr_null(stored->call.op);
    ck_assert_str_eq(stored->op_name, "test_store_op");
    ck_assert_str_eq(job_op_name(stored), "test_store_op");
    job_free(stored);
    job_t *job = get_job(&f, id);
    const op_def_t *op = job->call.op;
    ck_assert_str_eq(op->name, "test_store_op");
    ck_assert_int_eq(op->n_inputs, 1);
    ck_assert_str_eq(op->input_names[0], "x");
    op_error_t err;
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(op->validate(NULL, &job->call, &err), -ENOTSUP);
    ck_assert_ptr_nonnull(strstr(err.message, "test_store_op"));
    ck_assert_int_eq(op->run_cpu(&job->call, NULL, NULL, &err), -ENOTSUP);
    job_t *again = get_job(&f, id);
    ck_assert_ptr_eq(again->call.op, op); /* one stand-in per op, not one per read */
    job_free(again);
    job_free(job);
    fixture_teardown(&f);
}
END_TEST

/* A saxpy job as the API would hand it over: validated by the op. */
static job_t *make_saxpy_job(const op_def_t *saxpy, const char *params_json)
{
    job_t *job = job_new();
    snprintf(job->owner, sizeof job->owner, "alice");
    job->call.op = saxpy;
    job->params_json = strdup(params_json);
    for (int j = 0; j < 2; j++) {
        job->call.has_in[j] = true;
        tensor_set(&job->in[j], saxpy->input_names[j], 4, (unsigned)j);
        job->call.in[j] = job->in[j].desc;
    }
    json_t *params = json_loads("{\"a\": 2}", 0, NULL);
    op_error_t err;
    ck_assert_int_eq(saxpy->validate(params, &job->call, &err), 0);
    json_decref(params);
    return job;
}

START_TEST(test_job_of_a_known_op_reads_back_as_the_same_validated_call)
{
    const op_def_t *saxpy = op_find("saxpy");
    ck_assert_msg(saxpy != NULL, "op saxpy is not linked into test_store (see tests/store.cmake)");
    fixture_t f;
    fixture_setup(&f);
    job_t *job = make_saxpy_job(saxpy, "{\"a\": 2}");
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    job_t *got = get_job(&f, job->id);
    ck_assert_ptr_eq(got->call.op, saxpy);
    ck_assert_int_eq(got->call.n_out, job->call.n_out);
    for (int j = 0; j < job->call.n_out; j++) {
        ck_assert_str_eq(got->call.out_names[j], job->call.out_names[j]);
        ck_assert(tensor_desc_equal(&got->call.out[j], &job->call.out[j]));
    }
    ck_assert_str_eq(got->call.batch_key, job->call.batch_key);
    ck_assert_double_eq(got->call.cost.flops, job->call.cost.flops);
    job_free(got);

    /* Stored params the op refuses (saxpy needs "a"): a stand-in of the same name. */
    job_t *refused = make_saxpy_job(saxpy, "{}");
    ck_assert_int_eq(store_job_insert(f.st, refused), 0);
    got = get_job(&f, refused->id);
    ck_assert_ptr_ne(got->call.op, saxpy);
    ck_assert_str_eq(got->call.op->name, "saxpy");
    op_error_t err;
    ck_assert_int_eq(got->call.op->validate(NULL, &got->call, &err), -ENOTSUP);
    job_free(got);
    job_free(refused);
    job_free(job);
    fixture_teardown(&f);
}
END_TEST

/* Reads of 4 MiB and more go in parts side by side (store_blob.c): whatever the size, every
 * byte comes back, whole or a range at a time. */
START_TEST(test_large_blobs_read_back_whole_and_by_range)
{
    fixture_t f;
    fixture_setup(&f);
    static const uint64_t sizes[] = {(4u << 20) - 1, 4u << 20, (4u << 20) + 4, (8u << 20) + 7,
                                     (8u << 20) + 4096 * 8 + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t n = sizes[i];
        unsigned char *bytes = malloc(n), *part = malloc(n);
        fill_bytes(bytes, n, (unsigned)i + 1);
        char *blob = NULL;
        ck_assert_int_eq(store_blob_write(f.st, bytes, n, &blob), 0);
        assert_blob_bytes(&f, blob, bytes, n);
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
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_bad_input_is_refused_with_einval_and_stores_nothing)
{
    fixture_t f;
    fixture_setup(&f);
    job_t *job = make_job(&test_op, "alice", now_us());
    job->in[0].nbytes += 1;
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL);
    job->in[0].nbytes -= 1;
    job->call.op = NULL;
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL);
    job->call.op = &test_op;
    job->state = JOB_RUNNING;
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL);
    job->state = JOB_QUEUED;
    job->owner[0] = '\0';
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL);
    snprintf(job->owner, sizeof job->owner, "alice");
    snprintf(job->id, sizeof job->id, "j'; DROP TABLE jobs; --");
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL);
    job->id[0] = '\0';
    free(job->in[0].data);
    job->in[0].data = NULL;
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL); /* no bytes anywhere */
    job->in[0].blob = strdup("file:../../etc/passwd");
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL);
    job->in[0].desc.ndim = 9;
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL);

    store_list_query_t q = {.state = -1, .limit = 10};
    job_t **jobs;
    size_t n;
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), 0);
    ck_assert_uint_eq(n, 0);
    free(jobs);

    void *data;
    const char *bad_locators[] = {"",
                                  "row:",
                                  "row:jobs/j1/sideways/0",
                                  "row:jobs/j1/in/9",
                                  "file:ab/zz",
                                  "file:ab/../../../../etc/passwd",
                                  "http://x"};
    for (size_t i = 0; i < sizeof bad_locators / sizeof bad_locators[0]; i++)
        ck_assert_int_eq(store_blob_read(f.rd, bad_locators[i], 1, &data), -EINVAL);
    ck_assert_int_eq(store_blob_read(f.rd, NULL, 1, &data), -EINVAL);
    job_t *none;
    ck_assert_int_eq(store_job_get(f.rd, "j000000000000000000000000", &none), -ENOENT);
    store_usage_t usage;
    ck_assert_int_eq(store_usage_get(f.rd, "", &usage), -EINVAL);
    job_free(job);
    fixture_teardown(&f);
}
END_TEST

START_TEST(test_usage_counts_states_and_sums_times_and_buffers_per_owner)
{
    fixture_t f;
    fixture_setup(&f);
    char id[ID_SIZE];
    insert_small(&f, &test_op, "alice", now_us(), id); /* queued */
    insert_small(&f, &test_op, "alice", now_us(), id);
    ck_assert_int_eq(set_state(&f, id, JOB_RUNNING), 0);
    int64_t run_us = 0, gpu_ns = 0;
    for (int i = 0; i < 3; i++) {
        insert_small(&f, &test_op, "alice", now_us(), id);
        job_t *job = get_job(&f, id);
        job->state = JOB_RUNNING;
        job->started_us = 1000000 * (i + 1);
        ck_assert_int_eq(store_job_update(f.st, job), 0);
        job->state = i == 2 ? JOB_FAILED : JOB_SUCCEEDED;
        job->finished_us = job->started_us + 1000 * (i + 1);
        job->gpu_ns = 500 * (i + 1);
        if (i < 2) {
            job->call.n_out = 1;
            job->call.out_names[0] = "out";
            tensor_set(&job->out[0], "out", 1, 1);
        }
        ck_assert_int_eq(store_job_update(f.st, job), 0);
        run_us += 1000 * (i + 1);
        gpu_ns += 500 * (i + 1);
        job_free(job);
    }
    insert_small(&f, &test_op, "bob", now_us(), id);
    ck_assert_int_eq(set_state(&f, id, JOB_CANCELLED), 0);
    buffer_t *buf = buffer_new();
    snprintf(buf->owner, OWNER_SIZE, "alice");
    buf->desc = (tensor_desc_t){.dtype = DTYPE_I8, .ndim = 1, .shape = {1000}};
    buf->nbytes = 1000;
    buf->data = calloc(1, 1000);
    ck_assert_int_eq(store_buffer_insert(f.st, buf), 0);

    store_usage_t u;
    ck_assert_int_eq(store_usage_get(f.rd, "alice", &u), 0);
    ck_assert_str_eq(u.owner, "alice");
    ck_assert_int_eq(u.jobs_by_state[JOB_QUEUED], 1);
    ck_assert_int_eq(u.jobs_by_state[JOB_RUNNING], 1);
    ck_assert_int_eq(u.jobs_by_state[JOB_SUCCEEDED], 2);
    ck_assert_int_eq(u.jobs_by_state[JOB_FAILED], 1);
    ck_assert_int_eq(u.jobs_by_state[JOB_CANCELLED], 0);
    ck_assert_int_eq(u.run_us, run_us);
    ck_assert_int_eq(u.gpu_ns, gpu_ns);
    ck_assert_int_eq(u.buffers, 1);
    ck_assert_int_eq(u.buffer_bytes, 1000);
    ck_assert_int_eq(store_usage_get(f.rd, "bob", &u), 0);
    ck_assert_int_eq(u.jobs_by_state[JOB_CANCELLED], 1);
    ck_assert_int_eq(u.jobs_by_state[JOB_QUEUED], 0);
    ck_assert_int_eq(u.buffers, 0);
    buffer_free(buf);
    fixture_teardown(&f);
}
END_TEST

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

START_TEST(test_checkpoint_truncates_the_wal_and_does_not_wait_for_a_reader)
{
    fixture_t f;
    fixture_setup(&f);
    char id[ID_SIZE];
    for (int i = 0; i < 50; i++)
        insert_small(&f, &test_op, "alice", now_us(), id);
    char wal[128];
    snprintf(wal, sizeof wal, "%s/gpujobd.db-wal", f.dir);
    struct stat sb;
    ck_assert_int_eq(stat(wal, &sb), 0);
    ck_assert_int_gt(sb.st_size, 0);
    ck_assert_int_eq(store_checkpoint(f.st), 0);
    ck_assert_int_eq(stat(wal, &sb), 0);
    ck_assert_int_eq(sb.st_size, 0);

    /* A reader in the middle of a read transaction: TRUNCATE would have to wait for it. */
    for (int i = 0; i < 50; i++)
        insert_small(&f, &test_op, "alice", now_us(), id);
    sqlite3 *db;
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", f.dir);
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "BEGIN; SELECT count(*) FROM jobs;", NULL, NULL, NULL),
                     SQLITE_OK);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(store_checkpoint(f.st), 0);
    ck_assert_double_lt(seconds_since(&t0), 1.0);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(db);
    fixture_teardown(&f);
}
END_TEST

/* --- shards --- */

/* A new job whose id names shard k of n. */
static job_t *make_job_in(const op_def_t *op, int64_t created_us, int k, int n)
{
    job_t *job = make_job(op, "alice", created_us);
    id_new('j', job->id);
    store_id_assign_shard(job->id, n, k);
    ck_assert_int_eq(store_id_shard(job->id, n), k);
    return job;
}

/* The ids of the jobs in shard k's file, how many in *n. */
static void shard_ids(fixture_t *f, int k, char ids[][ID_SIZE], int cap, int *n)
{
    char path[128];
    if (k == 0)
        snprintf(path, sizeof path, "%s/gpujobd.db", f->dir);
    else
        snprintf(path, sizeof path, "%s/gpujobd-%d.db", f->dir, k);
    sqlite3 *db;
    sqlite3_stmt *stmt;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT id FROM jobs ORDER BY id", -1, &stmt, NULL),
                     SQLITE_OK);
    *n = 0;
    while (sqlite3_step(stmt) == SQLITE_ROW) {
        ck_assert_int_lt(*n, cap);
        snprintf(ids[(*n)++], ID_SIZE, "%s", (const char *)sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
}

static char recovered[16][ID_SIZE];
static int n_recovered;
static void collect_recovered(job_t *job, void *ud)
{
    (void)ud;
    ck_assert_int_lt(n_recovered, 16);
    snprintf(recovered[n_recovered++], ID_SIZE, "%s", job->id);
    job_free(job);
}

typedef struct queued_rows {
    store_queued_t rows[16];
    char keys[16][OP_BATCH_KEY_LEN];
    int n;
} queued_rows_t;

static void collect_queued(const store_queued_t *q, void *ud)
{
    queued_rows_t *l = ud;
    ck_assert_int_lt(l->n, 16);
    l->rows[l->n] = *q;
    snprintf(l->keys[l->n], sizeof l->keys[l->n], "%s", q->batch_key);
    l->rows[l->n].batch_key = l->keys[l->n];
    l->n++;
}

/* Recovery for the scheduler lists queued jobs from their columns alone, oldest first across
 * shards, with the batch key and cost the insert stored; a row from before those columns
 * (NULL) is read whole and resolved instead; running jobs are re-queued. */
START_TEST(test_recover_queued_lists_compact_rows_oldest_first_across_shards)
{
    fixture_t f;
    fixture_setup_shards(&f, INLINE_LIMIT, 4);
    enum { N = 6 };
    char ids[N][ID_SIZE];
    for (int i = 0; i < N; i++) {
        job_t *job = make_job_in(&test_op, 1000 + (N - i) * 10, i % 4, 4);
        snprintf(job->call.batch_key, sizeof job->call.batch_key, "key%d", i % 2);
        job->call.cost = (op_cost_t){.bytes = 100.0 * i, .flops = 7.0 * i};
        job->device = i == 1 ? 0 : -1;
        ck_assert_int_eq(store_job_insert(f.st, job), 0);
        memcpy(ids[i], job->id, ID_SIZE);
        job_free(job);
    }
    ck_assert_int_eq(set_state(&f, ids[2], JOB_RUNNING), 0); /* re-queued by recovery */
    ck_assert_int_eq(set_state(&f, ids[3], JOB_RUNNING), 0);
    ck_assert_int_eq(set_state(&f, ids[3], JOB_SUCCEEDED), 0); /* not listed */
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE jobs SET batch_key = NULL WHERE id = '%s'", ids[4]);
    db_exec(&f, sql); /* job 4 is in shard 4 % 4 = 0, shard 0's file */
    reopen(&f);

    queued_rows_t l = {.n = 0};
    ck_assert_int_eq(store_recover_queued(f.st, 3, job_resolve_op, collect_queued, &l), 0);
    ck_assert_int_eq(l.n, N - 1);
    int expect[] = {5, 4, 2, 1, 0}; /* created 1010, 1020, 1040, 1050, 1060 */
    for (int k = 0; k < l.n; k++) {
        int i = expect[k];
        ck_assert_str_eq(l.rows[k].id, ids[i]);
        ck_assert_str_eq(l.rows[k].owner, "alice");
        ck_assert_int_eq(l.rows[k].priority, 3);
        ck_assert_int_eq(l.rows[k].device, i == 1 ? 0 : -1);
        ck_assert_int_eq(l.rows[k].created_us, 1000 + (N - i) * 10);
        ck_assert_int_eq(l.rows[k].deadline_us, 123456789);
        if (i == 4) { /* resolved: test_op is not in the table, so its stand-in never batches */
            ck_assert_str_eq(l.rows[k].batch_key, "");
            continue;
        }
        char key[8];
        snprintf(key, sizeof key, "key%d", i % 2);
        ck_assert_str_eq(l.rows[k].batch_key, key);
        ck_assert_double_eq(l.rows[k].cost.bytes, 100.0 * i);
        ck_assert_double_eq(l.rows[k].cost.flops, 7.0 * i);
    }
    job_t *job = get_job(&f, ids[2]);
    ck_assert_int_eq(job->state, JOB_QUEUED);
    job_free(job);
    fixture_teardown(&f);
}
END_TEST

/* Four shards: each job's row is in the file its id names, one transaction spans the shards it
 * writes, and every read (by id, listing, usage, recovery, retention) sees all of them. */
START_TEST(test_a_sharded_store_keeps_each_job_where_its_id_says_and_reads_them_all)
{
    fixture_t f;
    fixture_setup_shards(&f, INLINE_LIMIT, 4);
    ck_assert_int_eq(store_shards(f.st), 4);
    enum { N = 8 };
    char ids[N][ID_SIZE];
    /* Created in the order 7, 6, ..., 0: recovery hands them back oldest first, across
     * shards. */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    for (int i = 0; i < N; i++) {
        job_t *job = make_job_in(&test_op, 1000 + (N - i) * 10, i % 4, 4);
        ck_assert_int_eq(store_job_insert(f.st, job), 0);
        memcpy(ids[i], job->id, ID_SIZE);
        job_free(job);
    }
    ck_assert_int_eq(store_commit(f.st), 0);
    for (int k = 0; k < 4; k++) {
        char in[N][ID_SIZE];
        int n = 0;
        shard_ids(&f, k, in, N, &n);
        ck_assert_int_eq(n, 2);
        for (int j = 0; j < n; j++)
            ck_assert_int_eq(store_id_shard(in[j], 4), k);
    }
    for (int i = 0; i < N; i++) {
        job_t *job = get_job(&f, ids[i]);
        ck_assert_str_eq(job->id, ids[i]);
        job_free(job);
    }
    char listed[N + 1][ID_SIZE];
    store_list_query_t all = {.state = -1, .limit = 3};
    ck_assert_uint_eq(list_all(&f, all, listed, N + 1), N); /* in id order, by pages */

    /* Jobs of three shards end; one of them started in the transaction that ends it. */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(set_state(&f, ids[i], JOB_RUNNING), 0);
        ck_assert_int_eq(set_state(&f, ids[i], JOB_SUCCEEDED), 0);
    }
    store_list_query_t done = {.state = JOB_SUCCEEDED, .limit = 2};
    ck_assert_uint_eq(list_all(&f, done, listed, N + 1), 3);
    store_usage_t u;
    ck_assert_int_eq(store_usage_get(f.rd, "alice", &u), 0);
    ck_assert_int_eq(u.jobs_by_state[JOB_SUCCEEDED], 3);
    ck_assert_int_eq(u.jobs_by_state[JOB_QUEUED], N - 3);

    /* A rolled-back transaction leaves no row in any shard it wrote. */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    char gone[2][ID_SIZE];
    for (int i = 0; i < 2; i++) {
        job_t *job = make_job_in(&test_op, 5000, i + 1, 4);
        ck_assert_int_eq(store_job_insert(f.st, job), 0);
        memcpy(gone[i], job->id, ID_SIZE);
        job_free(job);
    }
    ck_assert_int_eq(store_rollback(f.st), 0);
    job_t *none = NULL;
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(store_job_get(f.rd, gone[i], &none), -ENOENT);

    /* A restart: a running job of shard 3 is queued again, and the queued jobs come back
     * oldest first, whichever shard holds them. */
    ck_assert_int_eq(set_state(&f, ids[3], JOB_RUNNING), 0);
    reopen(&f);
    n_recovered = 0;
    recover_jobs(&f, 3, collect_recovered, NULL);
    ck_assert_int_eq(n_recovered, N - 3);
    for (int i = 0; i < n_recovered; i++)
        ck_assert_str_eq(recovered[i], ids[N - 1 - i]);

    /* Retention reaches every shard. */
    int deleted = 0;
    ck_assert_int_eq(store_gc(f.st, now_us() + 1000000, &deleted), 0);
    ck_assert_int_eq(deleted, 3);
    ck_assert_uint_eq(list_all(&f, all, listed, N + 1), N - 3);
    fixture_teardown(&f);
}
END_TEST

/* A file of outputs that jobs of two shards name (a batch's, written whole) stays while
 * either names it, through retention and the sweep at open. */
START_TEST(test_a_file_two_shards_name_goes_only_when_neither_does)
{
    fixture_t f;
    fixture_setup_shards(&f, 65536, 4);
    job_t *jobs[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = make_job_in(&test_op, 1000, i + 1, 4);
        ck_assert_int_eq(store_job_insert(f.st, jobs[i]), 0);
        jobs[i]->state = JOB_RUNNING;
        jobs[i]->attempts = 1;
        ck_assert_int_eq(store_job_update(f.st, jobs[i]), 0);
        jobs[i]->call.n_out = 1;
        jobs[i]->call.out_names[0] = "out";
        tensor_set(&jobs[i]->out[0], "out", 10000, 40 + i); /* 40,000 bytes each */
    }
    ck_assert_int_eq(store_blob_pack(f.st, jobs, 2, true), 0);
    ck_assert_ptr_nonnull(jobs[0]->out[0].blob);
    char *file = strdup(jobs[0]->out[0].blob);
    ck_assert_int_eq(strncmp(file, jobs[1]->out[0].blob, 40), 0); /* the same file */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    for (int i = 0; i < 2; i++) {
        jobs[i]->state = JOB_SUCCEEDED;
        jobs[i]->finished_us = i == 0 ? 2000 : now_us();
        ck_assert_int_eq(store_job_update(f.st, jobs[i]), 0);
    }
    ck_assert_int_eq(store_commit(f.st), 0);

    int deleted = 0;
    ck_assert_int_eq(store_gc(f.st, 3000, &deleted), 0); /* the first job only */
    ck_assert_int_eq(deleted, 1);
    ck_assert(blob_file_exists(&f, file));
    reopen(&f);
    ck_assert(blob_file_exists(&f, file));
    job_t *kept = get_job(&f, jobs[1]->id);
    float expected[10000];
    fill_bytes(expected, sizeof expected, 41);
    assert_blob_bytes(&f, kept->out[0].blob, expected, sizeof expected);
    job_free(kept);
    ck_assert_int_eq(store_gc(f.st, now_us() + 1000000, &deleted), 0);
    ck_assert_int_eq(deleted, 1);
    ck_assert(!blob_file_exists(&f, file));
    free(file);
    for (int i = 0; i < 2; i++)
        job_free(jobs[i]);
    fixture_teardown(&f);
}
END_TEST

static int n_failed_writes;
static job_state_t failed_written;
static int failed_err;
static int note_failed_write(job_t *job, job_state_t written, int err, void *ud)
{
    (void)job;
    (void)ud;
    n_failed_writes++;
    failed_written = written;
    failed_err = err;
    return 0;
}

/* Deferred writes run when flushed, on the shards side by side: each job's row in its shard,
 * each write with the state its job had when it was asked for, and a write that fails reported
 * on its own. */
START_TEST(test_deferred_writes_run_by_the_shards_when_flushed)
{
    fixture_t f;
    fixture_setup_shards(&f, INLINE_LIMIT, 4);
    enum { N = 100 };
    job_t *jobs[N];
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    store_defer_writes(f.st);
    for (int i = 0; i < N; i++) {
        jobs[i] = make_job_in(&test_op, 1000 + i, i % 4, 4);
        ck_assert_int_eq(store_job_insert(f.st, jobs[i]), 0);
        jobs[i]->state = JOB_RUNNING;
        jobs[i]->attempts = 1;
        ck_assert_int_eq(store_job_update(f.st, jobs[i]), 0);
        jobs[i]->state = JOB_SUCCEEDED; /* after the ask: not what is written */
    }
    job_t *unknown = make_job_in(&test_op, 1000, 2, 4);
    unknown->state = JOB_CANCELLED;
    ck_assert_int_eq(store_job_update(f.st, unknown), 0);
    job_t *none = NULL;
    ck_assert_int_eq(store_job_get(f.rd, jobs[0]->id, &none), -ENOENT); /* not yet written */
    n_failed_writes = 0;
    ck_assert_int_eq(store_flush(f.st, note_failed_write, NULL), 0);
    ck_assert_int_eq(n_failed_writes, 1);
    ck_assert_int_eq(failed_written, JOB_CANCELLED);
    ck_assert_int_eq(failed_err, -ENOENT);
    ck_assert_int_eq(jobs[0]->state, JOB_SUCCEEDED); /* the caller's state, given back */
    ck_assert_int_eq(store_commit(f.st), 0);
    char listed[N + 1][ID_SIZE];
    store_list_query_t running = {.state = JOB_RUNNING, .limit = 40};
    ck_assert_uint_eq(list_all(&f, running, listed, N + 1), N);
    for (int k = 0; k < 4; k++) {
        char in[N][ID_SIZE];
        int n = 0;
        shard_ids(&f, k, in, N, &n);
        ck_assert_int_eq(n, N / 4);
    }

    /* Without a callback the first failure is the flush's; the commit then fails too. */
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    store_defer_writes(f.st);
    ck_assert_int_eq(store_job_update(f.st, unknown), 0);
    ck_assert_int_eq(store_commit(f.st), -ENOENT);
    ck_assert_int_eq(store_rollback(f.st), 0);
    job_free(unknown);
    for (int i = 0; i < N; i++)
        job_free(jobs[i]);
    fixture_teardown(&f);
}
END_TEST

static void shard_path(const fixture_t *f, int k, char *path, size_t size)
{
    snprintf(path, size, "%s/gpujobd-%d.db", f->dir, k);
}

/* The shard count is the store's from its creation on; a shard file that is missing or in
 * another's place stops the open. */
START_TEST(test_a_store_keeps_its_shard_count_and_refuses_a_missing_or_swapped_shard)
{
    fixture_t f;
    fixture_setup_shards(&f, INLINE_LIMIT, 4);
    job_t *job = make_job_in(&test_op, 1000, 3, 4);
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    f.cfg.shards = 1; /* a count configured later changes nothing */
    reopen(&f);
    ck_assert_int_eq(store_shards(f.st), 4);
    job_free(get_job(&f, job->id));
    job_free(job);
    store_reader_close(f.rd);
    store_close(f.st);

    char one[128], two[128], moved[128];
    shard_path(&f, 1, one, sizeof one);
    shard_path(&f, 2, two, sizeof two);
    snprintf(moved, sizeof moved, "%s/moved.db", f.dir);
    ck_assert_int_eq(rename(two, moved), 0);
    store_t *st = NULL;
    ck_assert_int_eq(store_open(&f.cfg, &st), -ENOENT);
    ck_assert_int_eq(access(two, F_OK), -1); /* not made anew */
    ck_assert_int_eq(rename(one, two), 0);
    ck_assert_int_eq(rename(moved, one), 0);
    ck_assert_int_eq(store_open(&f.cfg, &st), -EPROTO);
    ck_assert_ptr_null(st);
    f.st = NULL;
    f.rd = NULL;
    fixture_teardown(&f);

    /* A store of one shard stays one. */
    fixture_setup(&f);
    f.cfg.shards = 4;
    reopen(&f);
    ck_assert_int_eq(store_shards(f.st), 1);
    shard_path(&f, 1, one, sizeof one);
    ck_assert_int_eq(access(one, F_OK), -1);
    fixture_teardown(&f);
}
END_TEST

/* Inserts a job whose id names shard k of 2, created at created_us; returns what the insert
 * returned, the id in ret_id. */
static int insert_in_shard(fixture_t *f, int k, int64_t created_us, char ret_id[ID_SIZE])
{
    job_t *job = make_job_in(&test_op, created_us, k, 2);
    int r = store_job_insert(f->st, job);
    memcpy(ret_id, job->id, ID_SIZE);
    job_free(job);
    return r;
}

static void assert_stored(fixture_t *f, const char *id, bool stored)
{
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(f->rd, id, &job), stored ? 0 : -ENOENT);
    job_free(job);
}

/* A write that makes SQLite roll back a shard's whole transaction (RAISE(ROLLBACK) here; an
 * I/O error or a full disk in a statement does the same) takes that shard's earlier writes
 * with it, and the shard refuses the rest of the transaction: writes after it would otherwise
 * each commit on their own. The other shard commits its part; the next transaction writes the
 * shard again. Both with writes made at once and with deferred ones run by the shards'
 * threads. */
START_TEST(test_a_shard_that_sqlite_rolled_back_refuses_the_rest_of_its_transaction)
{
    enum { POISON = 666 };
    fixture_t f;
    fixture_setup_shards(&f, INLINE_LIMIT, 2);
    char path[128], sql[256];
    shard_path(&f, 1, path, sizeof path);
    snprintf(sql, sizeof sql,
             "CREATE TRIGGER roll_back BEFORE INSERT ON jobs WHEN NEW.created_us = %d "
             "BEGIN SELECT RAISE(ROLLBACK, 'injected rollback'); END",
             POISON);
    exec_at(path, sql);

    char kept0[ID_SIZE], lost1[ID_SIZE], poison[ID_SIZE], refused1[ID_SIZE], kept0b[ID_SIZE];
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    ck_assert_int_eq(insert_in_shard(&f, 0, 1000, kept0), 0);
    ck_assert_int_eq(insert_in_shard(&f, 1, 1000, lost1), 0);
    ck_assert_int_lt(insert_in_shard(&f, 1, POISON, poison), 0);
    ck_assert_int_eq(insert_in_shard(&f, 1, 1000, refused1), -EIO);
    ck_assert_int_eq(insert_in_shard(&f, 0, 1000, kept0b), 0);
    ck_assert_int_eq(store_commit(f.st), -EIO);
    ck_assert_uint_eq(store_committed_shards(f.st), 1u << 0);
    ck_assert_int_eq(store_rollback(f.st), 0);
    assert_stored(&f, kept0, true);
    assert_stored(&f, kept0b, true);
    assert_stored(&f, lost1, false);
    assert_stored(&f, poison, false);
    assert_stored(&f, refused1, false);

    char again[ID_SIZE];
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    ck_assert_int_eq(insert_in_shard(&f, 1, 1000, again), 0);
    ck_assert_int_eq(store_commit(f.st), 0);
    assert_stored(&f, again, true);

    /* Deferred: enough writes for the shards' threads. Every write of shard 1 from the poison
     * on is reported failed; shard 0's all stand. */
    enum { N = 80, POISON_AT = 41 }; /* an odd index: shard 1 */
    job_t *jobs[N];
    ck_assert_int_eq(store_begin_relaxed(f.st), 0);
    store_defer_writes(f.st);
    for (int i = 0; i < N; i++) {
        jobs[i] = make_job_in(&test_op, i == POISON_AT ? POISON : 2000 + i, i % 2, 2);
        ck_assert_int_eq(store_job_insert(f.st, jobs[i]), 0);
    }
    n_failed_writes = 0;
    ck_assert_int_eq(store_flush(f.st, note_failed_write, NULL), 0);
    ck_assert_int_eq(n_failed_writes, (N - POISON_AT + 1) / 2);
    ck_assert_int_eq(failed_err, -EIO);
    ck_assert_int_eq(store_commit(f.st), -EIO);
    ck_assert_uint_eq(store_committed_shards(f.st), 1u << 0);
    ck_assert_int_eq(store_rollback(f.st), 0);
    for (int i = 0; i < N; i++) {
        assert_stored(&f, jobs[i]->id, i % 2 == 0);
        job_free(jobs[i]);
    }
    fixture_teardown(&f);
}
END_TEST

static Suite *store_suite(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_insert_get_round_trips_inline_file_and_buffer_tensors);
    tcase_add_test(tc, test_blob_write_files_only_large_data_and_insert_uses_the_callers_blob);
    tcase_add_test(tc, test_insert_of_a_job_started_in_its_own_transaction_stores_it_running);
    tcase_add_test(tc, test_update_applies_legal_transitions_and_persists_outputs);
    tcase_add_test(tc, test_a_job_back_in_the_queue_has_no_finish_time);
    tcase_add_test(tc, test_update_refuses_every_illegal_transition_and_leaves_the_row_unchanged);
    tcase_add_test(tc, test_idempotency_conflict_returns_eexist_leaves_nothing_and_finds_the_first);
    tcase_add_test(tc, test_failed_insert_in_a_transaction_undoes_only_its_own_rows);
    tcase_add_test(tc, test_failed_writes_in_a_transaction_leave_no_rows_files_or_counts);
    tcase_add_test(tc, test_failed_write_removes_the_files_it_wrote_and_its_rows);
    tcase_add_test(
        tc, test_recover_requeues_running_fails_past_max_attempts_and_returns_queued_oldest_first);
    tcase_add_test(tc, test_recover_crashed_fails_a_named_job_that_is_not_final);
    tcase_add_test(tc, test_list_filters_by_owner_state_and_op_and_pages_with_a_cursor);
    tcase_add_test(tc, test_gc_removes_expired_finished_jobs_and_their_files_but_not_others);
    tcase_add_test(tc, test_trim_expires_oldest_outputs_first_then_deletes_oldest_jobs);
    tcase_add_test(tc, test_trim_of_a_large_backlog_goes_in_bounded_passes);
    tcase_add_test(tc, test_store_bytes_counts_blob_files_without_walking_the_directory);
    tcase_add_test(tc, test_small_tensors_share_a_segment_that_goes_with_its_last_job);
    tcase_add_test(
        tc, test_pack_writes_many_jobs_small_tensors_to_one_file_that_goes_with_its_last_job);
    tcase_add_test(tc,
                   test_small_tensors_placed_ahead_share_the_segment_and_read_back_after_a_restart);
    tcase_add_test(tc, test_discarded_packed_tensors_take_their_file_once_no_row_names_it);
    tcase_add_test(tc, test_a_transaction_counts_the_tensors_naming_each_file_once_it_commits);
    tcase_add_test(tc, test_segment_bytes_read_back_across_buffer_flushes_and_large_appends);
    tcase_add_test(tc, test_gc_deletes_more_expired_jobs_than_one_batch_holds);
    tcase_add_test(tc, test_buffers_insert_get_delete_check_the_owner);
    tcase_add_test(tc, test_a_relaxed_commit_keeps_deleted_files_until_a_durable_one);
    tcase_add_test(tc, test_open_migrates_an_empty_file_to_the_current_schema);
    tcase_add_test(tc, test_open_migrates_version_1_rows_to_the_current_schema);
    tcase_add_test(tc, test_open_migrates_version_5_state_indexes_to_finish_time_ones);
    tcase_add_test(tc, test_recover_queued_lists_compact_rows_oldest_first_across_shards);
    tcase_add_test(tc, test_open_refuses_a_database_from_a_newer_version);
    tcase_add_test(tc, test_committed_job_survives_kill_9_and_uncommitted_one_does_not);
    tcase_add_test(tc, test_reader_sees_committed_data_while_the_writer_holds_a_transaction);
    tcase_add_test(tc, test_open_sweeps_blob_files_no_committed_row_names);
    tcase_add_test(tc, test_job_of_an_op_this_build_lacks_keeps_its_name_and_refuses_to_run);
    tcase_add_test(tc, test_job_of_a_known_op_reads_back_as_the_same_validated_call);
    tcase_add_test(tc, test_bad_input_is_refused_with_einval_and_stores_nothing);
    tcase_add_loop_test(tc, test_usage_rollup_follows_job_ends_and_outlives_retention, 0, 2);
    tcase_add_loop_test(tc, test_usage_rollup_sums_a_transactions_ends_and_drops_a_rolled_back_ones,
                        0, 2);
    tcase_add_test(tc, test_fair_share_state_survives_reopen);
    tcase_add_test(tc, test_large_blobs_read_back_whole_and_by_range);
    tcase_add_test(tc, test_usage_counts_states_and_sums_times_and_buffers_per_owner);
    tcase_add_test(tc, test_checkpoint_truncates_the_wal_and_does_not_wait_for_a_reader);
    tcase_add_test(tc, test_a_sharded_store_keeps_each_job_where_its_id_says_and_reads_them_all);
    tcase_add_test(tc, test_a_file_two_shards_name_goes_only_when_neither_does);
    tcase_add_test(tc, test_deferred_writes_run_by_the_shards_when_flushed);
    tcase_add_test(tc, test_a_store_keeps_its_shard_count_and_refuses_a_missing_or_swapped_shard);
    tcase_add_test(tc, test_a_shard_that_sqlite_rolled_back_refuses_the_rest_of_its_transaction);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(store_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
