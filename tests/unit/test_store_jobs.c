/* The durable store's job and buffer rows (daemon/store/store.h) on a fresh state directory per
 * test: insert and read back, legal and illegal transitions, idempotency keys, listing, ops this
 * build lacks or knows, bad input, buffers and their owners, a reader beside the writer. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/store.h"
#include "support/run_suite.h"
#include "support/store_test.h"

static const op_def_t other_op = {
    .name = "test_other_op",
    .summary = "another test op",
    .n_inputs = 3,
    .input_names = store_test_inputs,
    .required_inputs = 1,
    .param_names = store_test_params,
};

START_TEST(test_insert_get_round_trips_inline_file_and_buffer_tensors)
{
    store_test_t f;
    store_test_setup(&f);
    buffer_t *buf = buffer_new();
    snprintf(buf->owner, sizeof buf->owner, "alice");
    buf->desc = (tensor_desc_t){.dtype = DTYPE_F32, .ndim = 1, .shape = {8}};
    buf->nbytes = 32;
    buf->data = calloc(1, 32);
    ck_assert_int_eq(store_buffer_insert(f.st, buf), 0);

    job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
    job->call.has_in[1] = true;
    store_test_tensor_set(&job->in[1], "y", 1000, 7); /* 4000 bytes: past the inline limit */
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
    ck_assert(store_test_blob_file_exists(&f, job->in[1].blob));
    ck_assert_ptr_null(job->in[2].blob);

    job_t *got = store_test_get_job(&f, job->id);
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
        ck_assert_str_eq(got->in[j].name, store_test_inputs[j]);
        ck_assert(tensor_desc_equal(&got->in[j].desc, &job->in[j].desc));
        ck_assert(tensor_desc_equal(&got->call.in[j], &job->in[j].desc));
        ck_assert_uint_eq(got->in[j].nbytes, job->in[j].nbytes);
        ck_assert_ptr_null(got->in[j].data);
    }
    ck_assert_str_eq(got->in[0].blob, job->in[0].blob);
    ck_assert_str_eq(got->in[1].blob, job->in[1].blob);
    store_test_assert_blob_bytes(&f, got->in[0].blob, job->in[0].data, job->in[0].nbytes);
    store_test_assert_blob_bytes(&f, got->in[1].blob, job->in[1].data, job->in[1].nbytes);
    ck_assert_str_eq(got->in[2].buffer_id, buf->id);
    ck_assert_ptr_null(got->in[2].blob);

    job_free(got);
    job_free(job);
    buffer_free(buf);
    store_test_teardown(&f);
}
END_TEST

/* The scheduler inserts a job that started in the transaction taking it in as running: one row
 * write. A running job without its start is refused, and leaves no row. */
START_TEST(test_insert_of_a_job_started_in_its_own_transaction_stores_it_running)
{
    store_test_t f;
    store_test_setup(&f);
    job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
    job->state = JOB_RUNNING;
    job->attempts = 1;
    job->started_us = job->created_us + 5;
    job->batch_size = 7;
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    job_t *got = store_test_get_job(&f, job->id);
    ck_assert_int_eq(got->state, JOB_RUNNING);
    ck_assert_int_eq(got->attempts, 1);
    ck_assert_int_eq(got->started_us, job->started_us);
    ck_assert_int_eq(got->batch_size, 7);
    job_free(got);

    job_t *unstarted = store_test_make_job(&store_test_op, "alice", now_us());
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
    store_test_teardown(&f);
}
END_TEST

/* A job handed back to the queue (a device fault) is live again: whatever finish time the
 * caller's copy holds, the row gets none, so the live index lists it and retention leaves it. */
START_TEST(test_a_job_back_in_the_queue_has_no_finish_time)
{
    store_test_t f;
    store_test_setup(&f);
    char id[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
    ck_assert_int_eq(store_test_set_state(&f, id, JOB_RUNNING), 0);
    job_t *job = store_test_get_job(&f, id);
    job->state = JOB_QUEUED;
    job->finished_us = 12345;
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);

    job = store_test_get_job(&f, id);
    ck_assert_int_eq(job->state, JOB_QUEUED);
    ck_assert_int_eq(job->finished_us, 0);
    job_free(job);
    store_test_assert_listed_by_state(&f, JOB_QUEUED, id);
    int deleted = -1;
    ck_assert_int_eq(store_gc(f.st, now_us() + 1000000, &deleted), 0);
    ck_assert_int_eq(deleted, 0);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_update_applies_legal_transitions_and_persists_outputs)
{
    store_test_t f;
    store_test_setup(&f);
    char id[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);

    job_t *job = store_test_get_job(&f, id);
    job->state = JOB_RUNNING;
    job->attempts = 1;
    job->started_us = 1000;
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);

    job = store_test_get_job(&f, id);
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
    store_test_tensor_set(&job->out[0], "out", 4, 11);
    store_test_tensor_set(&job->out[1], "big", 4096,
                          12); /* written to a file by the update itself */
    ck_assert_int_eq(store_job_update(f.st, job), 0);

    job_t *got = store_test_get_job(&f, id);
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
    store_test_assert_blob_bytes(&f, got->out[0].blob, job->out[0].data, job->out[0].nbytes);
    store_test_assert_blob_bytes(&f, got->out[1].blob, job->out[1].data, job->out[1].nbytes);
    job_free(got);
    job_free(job);

    /* The other legal paths: running -> queued -> failed, and queued -> cancelled. */
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
    ck_assert_int_eq(store_test_set_state(&f, id, JOB_RUNNING), 0);
    ck_assert_int_eq(store_test_set_state(&f, id, JOB_QUEUED), 0);
    job = store_test_get_job(&f, id);
    job->state = JOB_FAILED;
    job_set_error(job, "deadline_exceeded", "the deadline passed while queued");
    ck_assert_int_eq(store_job_update(f.st, job), 0);
    job_free(job);
    got = store_test_get_job(&f, id);
    ck_assert_int_eq(got->state, JOB_FAILED);
    ck_assert_str_eq(got->error_code, "deadline_exceeded");
    ck_assert_str_eq(got->error_message, "the deadline passed while queued");
    ck_assert_int_gt(got->finished_us, 0); /* unset by the caller: the time of the change */
    job_free(got);

    store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
    ck_assert_int_eq(store_test_set_state(&f, id, JOB_CANCELLED), 0);
    store_test_teardown(&f);
}
END_TEST

/* Brings a new job to state s along legal transitions. */
static void job_in_state(store_test_t *f, job_state_t s, char ret_id[ID_SIZE])
{
    store_test_insert_small(f, &store_test_op, "alice", now_us(), ret_id);
    if (s == JOB_QUEUED) return;
    if (s == JOB_CANCELLED) {
        ck_assert_int_eq(store_test_set_state(f, ret_id, JOB_CANCELLED), 0);
        return;
    }
    ck_assert_int_eq(store_test_set_state(f, ret_id, JOB_RUNNING), 0);
    if (s != JOB_RUNNING) ck_assert_int_eq(store_test_set_state(f, ret_id, s), 0);
}

START_TEST(test_update_refuses_every_illegal_transition_and_leaves_the_row_unchanged)
{
    store_test_t f;
    store_test_setup(&f);
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
            job_t *before = store_test_get_job(&f, id);
            int r = store_test_set_state(&f, id, (job_state_t)to);
            job_t *after = store_test_get_job(&f, id);
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

    job_t *ghost = store_test_make_job(&store_test_op, "alice", now_us());
    id_new('j', ghost->id);
    ghost->state = JOB_RUNNING;
    ck_assert_int_eq(store_job_update(f.st, ghost), -ENOENT);
    job_free(ghost);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_idempotency_conflict_returns_eexist_leaves_nothing_and_finds_the_first)
{
    store_test_t f;
    store_test_setup(&f);
    job_t *first = store_test_make_job(&store_test_op, "alice", now_us());
    snprintf(first->idempotency_key, sizeof first->idempotency_key, "retry-me");
    ck_assert_int_eq(store_job_insert(f.st, first), 0);

    job_t *again = store_test_make_job(&store_test_op, "alice", now_us());
    snprintf(again->idempotency_key, sizeof again->idempotency_key, "retry-me");
    again->call.has_in[1] = true;
    store_test_tensor_set(&again->in[1], "y", 4096, 3); /* a file the failed insert must remove */
    again->call.in[1] = again->in[1].desc;
    ck_assert_int_eq(store_job_insert(f.st, again), -EEXIST);
    ck_assert_int_eq(store_test_count_blob_files(&f), 0);
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
    job_t *bobs = store_test_make_job(&store_test_op, "bob", now_us());
    snprintf(bobs->idempotency_key, sizeof bobs->idempotency_key, "retry-me");
    ck_assert_int_eq(store_job_insert(f.st, bobs), 0);
    char id[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
    job_free(bobs);
    job_free(again);
    job_free(first);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_list_filters_by_owner_state_and_op_and_pages_with_a_cursor)
{
    store_test_t f;
    store_test_setup(&f);
    enum { N = 25 };
    char ids[N][ID_SIZE];
    int alice = 0, alice_running = 0, other_op_jobs = 0;
    for (int i = 0; i < N; i++) {
        bool is_alice = i % 3 != 0;
        bool is_other = i % 4 == 0;
        store_test_insert_small(&f, is_other ? &other_op : &store_test_op,
                                is_alice ? "alice" : "bob", now_us(), ids[i]);
        if (is_alice && i % 2 == 0) {
            ck_assert_int_eq(store_test_set_state(&f, ids[i], JOB_RUNNING), 0);
            alice_running++;
        }
        alice += is_alice;
        other_op_jobs += is_other;
    }
    char got[N][ID_SIZE];
    store_list_query_t q = {.owner = "alice", .state = -1, .limit = 4};
    ck_assert_uint_eq(store_test_list_all(&f, q, got, N), (size_t)alice);
    size_t k = 0;
    for (int i = 0; i < N; i++)
        if (i % 3 != 0) ck_assert_str_eq(got[k++], ids[i]);

    q = (store_list_query_t){.owner = "alice", .state = JOB_RUNNING, .limit = 2};
    ck_assert_uint_eq(store_test_list_all(&f, q, got, N), (size_t)alice_running);
    q = (store_list_query_t){.owner = NULL, .state = -1, .op = "test_other_op", .limit = 3};
    ck_assert_uint_eq(store_test_list_all(&f, q, got, N), (size_t)other_op_jobs);
    q = (store_list_query_t){.owner = NULL, .state = -1, .limit = 1000};
    ck_assert_uint_eq(store_test_list_all(&f, q, got, N), N);
    q = (store_list_query_t){.owner = "nobody", .state = -1, .limit = 10};
    ck_assert_uint_eq(store_test_list_all(&f, q, got, N), 0);

    /* By state across owners, and by state and owner. */
    q = (store_list_query_t){.owner = NULL, .state = JOB_QUEUED, .limit = 3};
    ck_assert_uint_eq(store_test_list_all(&f, q, got, N), (size_t)(N - alice_running));
    q = (store_list_query_t){.owner = NULL, .state = JOB_RUNNING, .limit = 3};
    ck_assert_uint_eq(store_test_list_all(&f, q, got, N), (size_t)alice_running);
    ck_assert_int_eq(store_test_set_state(&f, ids[0], JOB_CANCELLED), 0); /* bob's, queued */
    q = (store_list_query_t){.owner = "bob", .state = JOB_CANCELLED, .limit = 3};
    ck_assert_uint_eq(store_test_list_all(&f, q, got, N), 1);
    ck_assert_str_eq(got[0], ids[0]);
    q = (store_list_query_t){.owner = "bob", .state = JOB_QUEUED, .limit = 3};
    ck_assert_uint_eq(store_test_list_all(&f, q, got, N), (size_t)(N - alice - 1));

    job_t **jobs;
    size_t n;
    q = (store_list_query_t){.state = -1, .limit = 0};
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), -EINVAL);
    q = (store_list_query_t){.state = -1, .limit = 1001};
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), -EINVAL);
    q = (store_list_query_t){.state = JOB_STATE_COUNT, .limit = 10};
    ck_assert_int_eq(store_jobs_list(f.rd, &q, &jobs, &n), -EINVAL);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_buffers_insert_get_delete_check_the_owner)
{
    store_test_t f;
    store_test_setup(&f);
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
        store_test_fill_bytes(bufs[i]->data, bufs[i]->nbytes, 40 + i);
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
        store_test_assert_blob_bytes(&f, got->blob, bufs[i]->data, bufs[i]->nbytes);
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
    ck_assert(store_test_blob_file_exists(&f, large->blob));
    ck_assert_int_eq(store_buffer_delete(f.st, "alice", large->id), 0);
    ck_assert_int_eq(store_buffer_get(f.rd, large->id, &still), -ENOENT);
    ck_assert(!store_test_blob_file_exists(&f, large->blob));
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
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_reader_sees_committed_data_while_the_writer_holds_a_transaction)
{
    store_test_t f;
    store_test_setup(&f);
    char committed[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), committed);
    ck_assert_int_eq(store_begin(f.st), 0);
    char pending[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), pending);
    ck_assert_int_eq(store_test_set_state(&f, committed, JOB_RUNNING), 0);

    /* A second reader, opened while the writer's transaction is open. */
    store_reader_t *rd2 = NULL;
    ck_assert_int_eq(store_reader_open(f.st, &rd2), 0);
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
    job_t *job = store_test_get_job(&f, pending);
    job_free(job);
    job = store_test_get_job(&f, committed);
    ck_assert_int_eq(job->state, JOB_RUNNING);
    job_free(job);
    store_reader_close(rd2);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_job_of_an_op_this_build_lacks_keeps_its_name_and_refuses_to_run)
{
    store_test_t f;
    store_test_setup(&f);
    ck_assert_ptr_null(op_find("test_store_op"));
    char id[ID_SIZE];
    store_test_insert_small(&f, &store_test_op, "alice", now_us(), id);
    /* The store hands the job back as stored: its op by name, no call made. */
    job_t *stored = NULL;
    ck_assert_int_eq(store_job_get(f.rd, id, &stored), 0);
    ck_assert_ptr_null(stored->call.op);
    ck_assert_str_eq(stored->op_name, "test_store_op");
    ck_assert_str_eq(job_op_name(stored), "test_store_op");
    job_free(stored);
    job_t *job = store_test_get_job(&f, id);
    const op_def_t *op = job->call.op;
    ck_assert_str_eq(op->name, "test_store_op");
    ck_assert_int_eq(op->n_inputs, 1);
    ck_assert_str_eq(op->input_names[0], "x");
    op_error_t err;
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(op->validate(NULL, &job->call, &err), -ENOTSUP);
    ck_assert_ptr_nonnull(strstr(err.message, "test_store_op"));
    ck_assert_int_eq(op->run_cpu(&job->call, NULL, NULL, &err), -ENOTSUP);
    job_t *again = store_test_get_job(&f, id);
    ck_assert_ptr_eq(again->call.op, op); /* one stand-in per op, not one per read */
    job_free(again);
    job_free(job);
    store_test_teardown(&f);
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
        store_test_tensor_set(&job->in[j], saxpy->input_names[j], 4, (unsigned)j);
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
    store_test_t f;
    store_test_setup(&f);
    job_t *job = make_saxpy_job(saxpy, "{\"a\": 2}");
    ck_assert_int_eq(store_job_insert(f.st, job), 0);
    job_t *got = store_test_get_job(&f, job->id);
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
    got = store_test_get_job(&f, refused->id);
    ck_assert_ptr_ne(got->call.op, saxpy);
    ck_assert_str_eq(got->call.op->name, "saxpy");
    op_error_t err;
    ck_assert_int_eq(got->call.op->validate(NULL, &got->call, &err), -ENOTSUP);
    job_free(got);
    job_free(refused);
    job_free(job);
    store_test_teardown(&f);
}
END_TEST

START_TEST(test_bad_input_is_refused_with_einval_and_stores_nothing)
{
    store_test_t f;
    store_test_setup(&f);
    job_t *job = store_test_make_job(&store_test_op, "alice", now_us());
    job->in[0].nbytes += 1;
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL);
    job->in[0].nbytes -= 1;
    job->call.op = NULL;
    ck_assert_int_eq(store_job_insert(f.st, job), -EINVAL);
    job->call.op = &store_test_op;
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
    store_test_teardown(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_jobs");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_insert_get_round_trips_inline_file_and_buffer_tensors);
    tcase_add_test(tc, test_insert_of_a_job_started_in_its_own_transaction_stores_it_running);
    tcase_add_test(tc, test_update_applies_legal_transitions_and_persists_outputs);
    tcase_add_test(tc, test_a_job_back_in_the_queue_has_no_finish_time);
    tcase_add_test(tc, test_update_refuses_every_illegal_transition_and_leaves_the_row_unchanged);
    tcase_add_test(tc, test_idempotency_conflict_returns_eexist_leaves_nothing_and_finds_the_first);
    tcase_add_test(tc, test_list_filters_by_owner_state_and_op_and_pages_with_a_cursor);
    tcase_add_test(tc, test_buffers_insert_get_delete_check_the_owner);
    tcase_add_test(tc, test_reader_sees_committed_data_while_the_writer_holds_a_transaction);
    tcase_add_test(tc, test_job_of_an_op_this_build_lacks_keeps_its_name_and_refuses_to_run);
    tcase_add_test(tc, test_job_of_a_known_op_reads_back_as_the_same_validated_call);
    tcase_add_test(tc, test_bad_input_is_refused_with_einval_and_stores_nothing);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
