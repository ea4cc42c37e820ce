/* The store's shards: opening and closing the write connections of every database file
 * (STATE_DIR/gpujobd.db, gpujobd-1.db ...), and the thread per shard that runs the writes
 * deferred by store_defer_writes, and the commits that follow them, side by side. */
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/util/id.h"
#include "daemon/util/log.h"
#include "store_internal.h"

/* The shards' threads (below). */
static int start_shard_threads(store_t *st);
static void stop_shard_threads(store_t *st);

static int mkdir_if_missing(const char *path)
{
    if (mkdir(path, 0750) == 0 || errno == EEXIST) return 0;
    return log_error_errno(-errno, "store: cannot create '%s': %s", path, strerror(errno));
}

static int configure_writer(store_conn_t *conn)
{
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(conn->db, "PRAGMA journal_mode = WAL", -1, &stmt, NULL) != SQLITE_OK)
        return store_sql_error(conn, "setting journal_mode");
    int r = 0;
    if (sqlite3_step(stmt) != SQLITE_ROW)
        r = store_sql_error(conn, "setting journal_mode");
    else if (strcmp((const char *)sqlite3_column_text(stmt, 0), "wal") != 0)
        r = log_error_errno(-EIO, "store: '%s' cannot use WAL mode (journal_mode is '%s')",
                            conn->db_path, sqlite3_column_text(stmt, 0));
    sqlite3_finalize(stmt);
    /* NORMAL: a commit writes its WAL frames without an fsync. With sync_full the durable
     * ones raise it to FULL around their commit (store_raise_sync); relaxed ones, the job path's,
     * are made durable by the WAL sync thread (store_sync.c), or not at all. */
    if (r == 0) r = store_exec(conn, "PRAGMA synchronous = NORMAL");
    /* Each write runs in a savepoint, whose journal of the pages it changes would otherwise
     * go through a temporary file, most of the bytes written for tiny jobs. */
    if (r == 0) r = store_exec(conn, "PRAGMA temp_store = MEMORY");
    return r;
}

static int shard_open(store_t *st, int k, const config_t *cfg, bool check, int *ret_version_before)
{
    shard_t *sh = &st->shards[k];
    sh->st = st;
    sh->index = k;
    store_segment_init(&sh->segment);
    pthread_mutex_init(&sh->checkpoint_lock, NULL);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX;
    /* Shard 0 says how many shards there are; the others exist from the store's creation on:
     * one missing held jobs, and is not made anew. */
    if (k == 0 || st->n_shards == 0) flags |= SQLITE_OPEN_CREATE;
    char path[PATH_MAX];
    int r = store_db_path(cfg->state_dir, k, path);
    bool dropped = false;
    if (r == 0) r = store_check_before_open(path, st->blobs_dir, k > 0, &dropped);
    if (r < 0) return r;
    st->wal_dropped |= dropped;
    r = store_conn_open(&sh->conn, cfg->state_dir, k, flags);
    if (r == -ENOENT)
        return log_error_errno(-ENOENT,
                               "store: shard file '%s' is missing: the jobs stored in it cannot "
                               "be read; restore it from a backup",
                               sh->conn.db_path);
    if (r == 0 && check) r = store_check_schema(&sh->conn);
    if (r == 0) r = configure_writer(&sh->conn);
    if (r == 0) r = store_user_version(&sh->conn, ret_version_before);
    if (r == 0) r = store_migrate(&sh->conn);
    return r;
}

/* The shard count of the store (n_shards, from the setting in shard 0; a store from before
 * shards has one), its other shards opened, and the count recorded once they all are. A
 * shard other than 0 records its index, so that files swapped by hand are refused. */
static int open_shards(store_t *st, const config_t *cfg, bool check, int version_before)
{
    int recorded = 0;
    int r = store_setting_get(&st->shards[0].conn, "shards", &recorded);
    if (r < 0) return r;
    int n = recorded ? recorded : version_before == 0 ? cfg->shards : 1;
    if (n < 1 || n > STORE_MAX_SHARDS || (n & (n - 1)))
        return log_error_errno(-EPROTO, "store: '%s' records %d shards, not a power of two to %d",
                               st->shards[0].conn.db_path, n, STORE_MAX_SHARDS);
    if (n != cfg->shards)
        log_warn("store: the store in '%s' has %d shard(s): [store] shards = %d applies to a new "
                 "state directory only",
                 cfg->state_dir, n, cfg->shards);
    st->n_shards = recorded ? n : 0; /* 0 while they are created: shard_open may create them */
    for (int k = 1; k < n && r == 0; k++) {
        int version = 0, index = 0;
        r = shard_open(st, k, cfg, check, &version);
        if (r == 0 && version == 0) r = store_setting_set(&st->shards[k].conn, "shard", k);
        if (r == 0) r = store_setting_get(&st->shards[k].conn, "shard", &index);
        if (r == 0 && index != k)
            r = log_error_errno(-EPROTO, "store: '%s' holds shard %d, not %d",
                                st->shards[k].conn.db_path, index, k);
        if (r < 0) {
            st->n_shards = k + 1; /* so that store_close closes what was opened */
            return r;
        }
    }
    st->n_shards = n;
    if (!recorded) r = store_setting_set(&st->shards[0].conn, "shards", n);
    return r;
}

int store_open(const config_t *cfg, store_t **ret)
{
    int r = mkdir_if_missing(cfg->state_dir);
    if (r < 0) return r;
    store_t *st = calloc(1, sizeof *st);
    if (!st) return -ENOMEM;
    st->inline_blob_bytes = cfg->inline_blob_bytes;
    st->sync_full = cfg->sync_full;
    if (snprintf(st->blobs_dir, sizeof st->blobs_dir, "%s/blobs", cfg->state_dir) >=
            (int)sizeof st->blobs_dir ||
        snprintf(st->reserve_path, sizeof st->reserve_path, "%s/" STORE_RESERVE_NAME,
                 cfg->state_dir) >= (int)sizeof st->reserve_path) {
        free(st);
        return log_error_errno(-ENAMETOOLONG, "store: state_dir '%s' is too long", cfg->state_dir);
    }
    snprintf(st->state_dir, sizeof st->state_dir, "%s", cfg->state_dir);
    st->upkeep_ms = (uint64_t)cfg->checkpoint_interval_s * 1000;
    pthread_mutex_init(&st->check_lock, NULL);
    st->n_shards = 1;
    int version_before = 0, removed = 0;
    bool clean = false;
    r = mkdir_if_missing(st->blobs_dir);
    if (r == 0) r = store_clean_marker_take(st->state_dir, &clean);
    char first_db[PATH_MAX + sizeof STORE_DB_NAME];
    snprintf(first_db, sizeof first_db, "%s/" STORE_DB_NAME, st->state_dir);
    bool existed = r == 0 && access(first_db, F_OK) == 0;
    if (existed) /* a new store has no previous run to speak of */
        log_info(clean ? "store: the previous run closed the store cleanly: no integrity check"
                       : "store: the previous run did not close the store cleanly: checking "
                         "its integrity (PRAGMA quick_check): its schema now, and every page "
                         "recovery reads as it reads it, the whole of it in the background "
                         "once the daemon serves");
    if (r == 0) r = shard_open(st, 0, cfg, !clean, &version_before);
    if (r == 0) r = open_shards(st, cfg, !clean, version_before);
    store_conn_t *conns[STORE_MAX_SHARDS];
    for (int k = 0; k < st->n_shards; k++)
        conns[k] = &st->shards[k].conn;
    /* Commits a damaged WAL lost may be recovered by hand from its copy in quarantine/: the
     * files they named stay until then. */
    if (r == 0 && st->wal_dropped)
        log_warn("store: blob files that no committed row names are kept, as commits were "
                 "dropped from a damaged WAL; they go at the first start without such a loss");
    else if (r == 0 && store_blobs_present(st->blobs_dir))
        r = store_blob_sweep_orphans(conns, st->n_shards, &removed);
    if (r == 0 && st->n_shards > 1) r = start_shard_threads(st);
    if (r == 0) store_space_open(st);
    st->check_due = existed && !clean;
    if (r < 0) {
        store_close(st);
        return r;
    }
    if (removed > 0)
        log_info("store: removed %d blob file(s) that no committed row named", removed);
    if (st->n_shards > 1) log_info("store: %d shards", st->n_shards);
    st->opened = true;
    *ret = st;
    return 0;
}

void store_close(store_t *st)
{
    if (!st) return;
    store_durability_stop(st);
    store_check_stop(st);
    stop_shard_threads(st);
    bool clean = st->opened;
    if (st->in_txn) {
        log_warn("store: closing with a transaction open: rolling it back");
        store_rollback(st);
        clean = false;
    }
    for (int k = 0; k < st->n_shards; k++)
        store_segment_close(&st->shards[k].segment, &st->shards[k].maybe_unused);
    store_files_settle(st);
    for (int k = 0; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        if (store_conn_close(&sh->conn) < 0) clean = false;
        pthread_mutex_destroy(&sh->checkpoint_lock);
        free(sh->write_refs.a);
        free(sh->txn_refs.a);
        free(sh->txn_usage.a);
        free(sh->cols.p);
        free(sh->data.p);
        free(sh->unlink.a);
        free(sh->maybe_unused.a);
        free(sh->placed);
        free(sh->deferred.a);
    }
    /* A store whose check did not pass (found damage, was stopped, or never ran: the store was
     * opened without recovery, by a command) is checked again at the next start. */
    if (clean && (!st->check_due || atomic_load(&st->check_passed)))
        store_clean_marker_write(st->state_dir);
    pthread_mutex_destroy(&st->check_lock);
    free(st);
}

int store_shards(const store_t *st)
{
    return st->n_shards;
}

shard_t *store_shard_of(store_t *st, const char *id)
{
    return &st->shards[store_id_shard(id, st->n_shards)];
}

void store_defer_writes(store_t *st)
{
    st->deferring = st->n_shards > 1 && st->in_txn;
}

int store_defer(shard_t *sh, job_t *job, deferred_kind_t kind)
{
    int r = vec_grow((void **)&sh->deferred.a, &sh->deferred.cap, sh->deferred.n + 1,
                     sizeof *sh->deferred.a, 64);
    if (r < 0) return r;
    sh->deferred.a[sh->deferred.n++] = (deferred_t){.job = job, .kind = kind, .state = job->state};
    return 0;
}

/* Runs a shard's deferred writes in order. The state a job is written with is the one it had
 * when its write was asked for. */
static void run_deferred(shard_t *sh)
{
    for (size_t i = 0; i < sh->deferred.n; i++) {
        deferred_t *d = &sh->deferred.a[i];
        job_state_t now = d->job->state;
        d->job->state = d->state;
        if (d->kind == DEFER_INSERT) {
            char id[ID_SIZE]; /* the insert writes it back into the job */
            memcpy(id, d->job->id, ID_SIZE);
            d->result = store_shard_job_insert(sh, d->job, id);
        } else {
            d->result = store_shard_job_update(sh, d->job);
        }
        d->job->state = now;
    }
}

static void run_task(shard_t *sh)
{
    if (sh->task == TASK_WRITES)
        run_deferred(sh);
    else
        sh->commit_result = store_shard_commit(sh);
}

static void *shard_thread(void *arg)
{
    shard_t *sh = arg;
    store_t *st = sh->st;
    char name[16];
    snprintf(name, sizeof name, "gj-shard%d", sh->index);
    prctl(PR_SET_NAME, name);
    pthread_mutex_lock(&st->lock);
    for (;;) {
        while (!sh->go && !st->stopping)
            pthread_cond_wait(&sh->wake, &st->lock);
        if (!sh->go) break;
        pthread_mutex_unlock(&st->lock);
        run_task(sh);
        pthread_mutex_lock(&st->lock);
        sh->go = false;
        if (--st->running == 0) pthread_cond_signal(&st->all_done);
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

/* Starts a thread per shard but 0, whose writes the flushing thread runs itself. */
static int start_shard_threads(store_t *st)
{
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->all_done, NULL);
    st->threads_ready = true;
    for (int k = 1; k < st->n_shards; k++)
        pthread_cond_init(&st->shards[k].wake, NULL);
    for (int k = 1; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        int r = pthread_create(&sh->thread, NULL, shard_thread, sh);
        if (r != 0)
            return log_error_errno(-r, "store: cannot start a shard's thread: %s", strerror(r));
        sh->has_thread = true;
    }
    return 0;
}

static void stop_shard_threads(store_t *st)
{
    if (!st->threads_ready) return;
    pthread_mutex_lock(&st->lock);
    st->stopping = true;
    for (int k = 1; k < st->n_shards; k++)
        if (st->shards[k].has_thread) pthread_cond_signal(&st->shards[k].wake);
    pthread_mutex_unlock(&st->lock);
    for (int k = 1; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        if (sh->has_thread) pthread_join(sh->thread, NULL);
        pthread_cond_destroy(&sh->wake);
    }
    pthread_cond_destroy(&st->all_done);
    pthread_mutex_destroy(&st->lock);
}

/* Runs the task of each shard whose wants[k] is set: side by side when parallel (shard 0's on
 * the caller's thread, the others' on their own), else one after the other here. */
void store_run_on_shards(store_t *st, shard_task_t task, const bool *wants, bool parallel)
{
    for (int k = 0; k < st->n_shards; k++)
        st->shards[k].task = task;
    if (!parallel || !st->threads_ready) {
        for (int k = 0; k < st->n_shards; k++)
            if (wants[k]) run_task(&st->shards[k]);
        return;
    }
    pthread_mutex_lock(&st->lock);
    for (int k = 1; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        if (!wants[k]) continue;
        sh->go = true;
        st->running++;
        pthread_cond_signal(&sh->wake);
    }
    pthread_mutex_unlock(&st->lock);
    if (wants[0]) run_task(&st->shards[0]);
    pthread_mutex_lock(&st->lock);
    while (st->running > 0)
        pthread_cond_wait(&st->all_done, &st->lock);
    pthread_mutex_unlock(&st->lock);
}

int store_flush(store_t *st, int (*failed)(job_t *job, job_state_t written, int err, void *ud),
                void *ud)
{
    st->deferring = false;
    size_t total = 0;
    bool wants[STORE_MAX_SHARDS];
    for (int k = 0; k < st->n_shards; k++) {
        total += st->shards[k].deferred.n;
        wants[k] = st->shards[k].deferred.n > 0;
    }
    if (total == 0) return 0;
    if (total >= STORE_PARALLEL_MIN_WRITES) st->parallel_txn = true;
    store_run_on_shards(st, TASK_WRITES, wants, total >= STORE_PARALLEL_MIN_WRITES);
    int r = 0;
    for (int k = 0; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        for (size_t i = 0; i < sh->deferred.n; i++) {
            deferred_t *d = &sh->deferred.a[i];
            int e = d->result < 0 && failed ? failed(d->job, d->state, d->result, ud) : d->result;
            if (r == 0 && e < 0) r = e;
        }
        sh->deferred.n = 0;
    }
    return r;
}

void store_job_id_new(const store_t *st, char ret_id[ID_SIZE])
{
    id_new('j', ret_id);
    store_id_assign_shard(ret_id, st->n_shards, 0);
}

void store_jobs_place(store_t *st, const store_job_group_t *groups, size_t n)
{
    int shards = st->n_shards;
    if (shards == 1) return;
    size_t load[STORE_MAX_SHARDS] = {0}, total = 0;
    for (size_t g = 0; g < n; g++) {
        if (groups[g].n == 0) continue;
        if (groups[g].jobs[0]->idempotency_key[0]) load[0] += groups[g].n;
        total += groups[g].n;
    }
    bool spread = total >= STORE_PARALLEL_MIN_WRITES;
    int one = (int)(st->next_shard++ & (unsigned)(shards - 1));
    for (size_t g = 0; g < n; g++) {
        if (groups[g].n == 0 || groups[g].jobs[0]->idempotency_key[0]) continue;
        int k = one;
        for (int j = 0; spread && j < shards; j++)
            if (load[j] < load[k]) k = j;
        load[k] += groups[g].n;
        for (size_t i = 0; i < groups[g].n; i++)
            store_id_assign_shard(groups[g].jobs[i]->id, shards, k);
    }
}

void store_commit_result(const store_t *st, store_commit_result_t *ret)
{
    *ret = (store_commit_result_t){.kept = st->committed, .parts = st->n_shards};
}

/* Whether shard k's part is kept; narrows w to the sync of that shard's WAL. */
static bool shard_kept(const store_commit_result_t *c, int k, store_durable_wait_t *w)
{
    if (w) w->scope = 1u << k;
    return c->parts > 0 && (c->kept & (1u << k));
}

bool store_job_committed(const store_commit_result_t *c, const char *id, store_durable_wait_t *w)
{
    return shard_kept(c, c->parts > 0 ? store_id_shard(id, c->parts) : 0, w);
}

bool store_buffers_committed(const store_commit_result_t *c, store_durable_wait_t *w)
{
    return shard_kept(c, 0, w); /* buffers live in shard 0 */
}
