/* The store suites' shared fixture (store_test.h). */
#define _GNU_SOURCE /* mkdtemp, nftw */
#include <ftw.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/store_test.h"

const char *const store_test_inputs[] = {"x", "y", "w"};

const char *const store_test_params[] = {"a", NULL};

const op_def_t store_test_op = {
    .name = "test_store_op",
    .summary = "test op",
    .n_inputs = 3,
    .input_names = store_test_inputs,
    .required_inputs = 1,
    .param_names = store_test_params,
};

void store_test_setup_shards(store_test_t *f, uint64_t inline_blob_bytes, int shards)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/test_store.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
    memset(&f->cfg, 0, sizeof f->cfg);
    f->cfg.shards = shards;
    snprintf(f->cfg.state_dir, sizeof f->cfg.state_dir, "%s", f->dir);
    f->cfg.inline_blob_bytes = inline_blob_bytes;
    f->cfg.sync_full = true;
    ck_assert_int_eq(store_open(&f->cfg, &f->st), 0);
    ck_assert_int_eq(store_reader_open(f->st, &f->rd), 0);
}

void store_test_setup_inline(store_test_t *f, uint64_t inline_blob_bytes)
{
    store_test_setup_shards(f, inline_blob_bytes, 1);
}

void store_test_setup(store_test_t *f)
{
    store_test_setup_inline(f, STORE_TEST_INLINE_LIMIT);
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    return remove(path);
}

void store_test_remove_tree(const char *dir)
{
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void store_test_teardown(store_test_t *f)
{
    store_reader_close(f->rd);
    store_close(f->st);
    store_test_remove_tree(f->dir);
}

void store_test_fill_bytes(void *data, uint64_t n, unsigned seed)
{
    unsigned char *p = data;
    for (uint64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (unsigned char)(seed >> 16);
    }
}

void store_test_tensor_set(job_tensor_t *t, const char *name, int64_t n_f32, unsigned seed)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->desc.dtype = DTYPE_F32;
    t->desc.ndim = 1;
    t->desc.shape[0] = n_f32;
    t->nbytes = (uint64_t)n_f32 * 4;
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    store_test_fill_bytes(t->data, t->nbytes, seed);
}

job_t *store_test_make_job(const op_def_t *op, const char *owner, int64_t created_us)
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
    store_test_tensor_set(&job->in[0], "x", 8, (unsigned)created_us);
    job->call.in[0] = job->in[0].desc;
    return job;
}

void store_test_insert_small(store_test_t *f, const op_def_t *op, const char *owner,
                             int64_t created_us, char ret_id[ID_SIZE])
{
    job_t *job = store_test_make_job(op, owner, created_us);
    ck_assert_int_eq(store_job_insert(f->st, job), 0);
    memcpy(ret_id, job->id, ID_SIZE);
    job_free(job);
}

job_t *store_test_get_job(store_test_t *f, const char *id)
{
    job_t *job = NULL;
    ck_assert_int_eq(store_job_get(f->rd, id, &job), 0);
    ck_assert_int_eq(job_resolve_op(job), 0);
    return job;
}

void store_test_assert_blob_bytes(store_test_t *f, const char *blob, const void *expected,
                                  uint64_t n)
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

int store_test_count_blob_files(store_test_t *f)
{
    char path[128];
    snprintf(path, sizeof path, "%s/blobs", f->dir);
    file_count = 0;
    nftw(path, count_file, 16, FTW_PHYS);
    return file_count;
}

bool store_test_blob_file_exists(store_test_t *f, const char *blob)
{
    char path[256];
    ck_assert_int_eq(strncmp(blob, "file:", 5), 0);
    snprintf(path, sizeof path, "%s/blobs/%.35s", f->dir, blob + 5);
    return access(path, F_OK) == 0;
}

int store_test_set_state(store_test_t *f, const char *id, job_state_t to)
{
    job_t *job = store_test_get_job(f, id);
    job->state = to;
    if (to == JOB_RUNNING) job->attempts++;
    if (to == JOB_SUCCEEDED) {
        job->call.n_out = 1;
        job->call.out_names[0] = "out";
        store_test_tensor_set(&job->out[0], "out", 4, 99);
    }
    int r = store_job_update(f->st, job);
    job_free(job);
    return r;
}

void store_test_reopen(store_test_t *f)
{
    store_reader_close(f->rd);
    store_close(f->st);
    ck_assert_int_eq(store_open(&f->cfg, &f->st), 0);
    ck_assert_int_eq(store_reader_open(f->st, &f->rd), 0);
}

size_t store_test_list_all(store_test_t *f, store_list_query_t q, char ids[][ID_SIZE], size_t cap)
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

void store_test_assert_listed_by_state(store_test_t *f, job_state_t state, const char *id)
{
    char got[2][ID_SIZE];
    store_list_query_t q = {.state = (int)state, .limit = 10};
    ck_assert_uint_eq(store_test_list_all(f, q, got, 2), 1);
    ck_assert_str_eq(got[0], id);
}

void store_test_exec_at(const char *path, const char *sql)
{
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

void store_test_db_exec(store_test_t *f, const char *sql)
{
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.db", f->dir);
    store_test_exec_at(path, sql);
}

int64_t store_test_db_int(store_test_t *f, const char *sql)
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

void store_test_recover_jobs(store_test_t *f, int max_attempts, void (*cb)(job_t *job, void *ud),
                             void *ud)
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
