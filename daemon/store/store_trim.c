/* The bound on the store's bytes ([store] max_bytes): measuring what the store holds, and
 * giving bytes back past the bound, the oldest finished jobs' outputs first, in passes bounded
 * in jobs and time so that the loop thread is never held long.
 *
 * The database files are measured (SQLite decides itself how many pages a row takes): three
 * pragmas per shard. blobs/ is counted: every blob file written or removed moves a count
 * (store_blob_bytes_moved), so that a check costs no walk of the directory; the directory is
 * walked at the first measure and every BLOBS_WALK_US after, which corrects what the count
 * cannot see (files written by hand, a segment's buffered bytes that never reached it). */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/util/log.h"
#include "store_internal.h"

/* Jobs per write: a short transaction on the loop thread, as retention's. */
#define TRIM_BATCH 64
/* How often blobs/ is walked to correct its count. */
#define BLOBS_WALK_US (600 * (int64_t)1000000)

/* An integer pragma of conn (page_count, freelist_count, page_size). */
static int pragma_int(store_conn_t *conn, const char *sql, int64_t *ret)
{
    sqlite3_stmt *stmt;
    if (sqlite3_prepare_v2(conn->db, sql, -1, &stmt, NULL) != SQLITE_OK)
        return store_sql_error(conn, sql);
    int r = sqlite3_step(stmt) == SQLITE_ROW ? 0 : store_sql_error(conn, sql);
    if (r == 0) *ret = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    return r;
}

/* The bytes of a shard's database file in use: its pages but the free ones, which SQLite
 * reuses before it grows the file. */
static int shard_db_bytes(shard_t *sh, uint64_t *ret)
{
    int64_t pages = 0, free_pages = 0, page_size = 0;
    int r = pragma_int(&sh->conn, "PRAGMA page_count", &pages);
    if (r == 0) r = pragma_int(&sh->conn, "PRAGMA freelist_count", &free_pages);
    if (r == 0) r = pragma_int(&sh->conn, "PRAGMA page_size", &page_size);
    if (r < 0) return r;
    *ret = pages > free_pages ? (uint64_t)(pages - free_pages) * (uint64_t)page_size : 0;
    return 0;
}

/* Adds the sizes of the regular files of dir, and of its subdirectories' when depth allows,
 * to *sum. A file removed meanwhile is skipped. */
static int dir_bytes(int fd, int depth, uint64_t *sum)
{
    DIR *d = fdopendir(fd);
    if (!d) {
        int r = -errno;
        close(fd);
        return r;
    }
    struct dirent *e;
    int r = 0;
    while (r == 0 && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0) continue;
        if (S_ISREG(sb.st_mode)) *sum += (uint64_t)sb.st_size;
        if (!S_ISDIR(sb.st_mode) || depth == 0) continue;
        int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (sub >= 0) r = dir_bytes(sub, depth - 1, sum);
    }
    closedir(d);
    return r;
}

/* The bytes of the shards' database files in use. */
static int db_bytes(store_t *st, uint64_t *ret)
{
    uint64_t sum = 0;
    for (int k = 0; k < st->n_shards; k++) {
        uint64_t db = 0;
        int r = shard_db_bytes(&st->shards[k], &db);
        if (r < 0) return r;
        sum += db;
    }
    *ret = sum;
    return 0;
}

static int64_t monotonic_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Walks blobs/<fan>/<file> (two levels) and takes its bytes as the count's new base. */
static int blobs_walk(store_t *st)
{
    int64_t net = store_blob_bytes_net(), now = monotonic_us();
    uint64_t sum = 0;
    int fd = open(st->blobs_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int r = fd < 0 ? -errno : dir_bytes(fd, 1, &sum);
    if (r < 0) return log_error_errno(r, "store: cannot measure '%s': %m", st->blobs_dir);
    st->blobs_walked = sum;
    st->blobs_net_at_walk = net;
    st->blobs_walk_us = now > 0 ? now : 1;
    return 0;
}

int store_bytes(store_t *st, uint64_t *ret)
{
    uint64_t sum = 0;
    int r = db_bytes(st, &sum);
    if (r == 0 && (st->blobs_walk_us == 0 || monotonic_us() - st->blobs_walk_us > BLOBS_WALK_US))
        r = blobs_walk(st);
    if (r < 0) return r;
    int64_t blobs = (int64_t)st->blobs_walked + store_blob_bytes_net() - st->blobs_net_at_walk;
    *ret = sum + (blobs > 0 ? (uint64_t)blobs : 0);
    return 0;
}

/* One row of STMT_TRIM_NEXT. */
typedef struct trim_row {
    char id[ID_SIZE];
    int64_t finished_us;
    store_bytes_t outputs; /* the outputs column, copied */
} trim_row_t;

/* Reads up to max finished jobs of sh after (after_us, after_id), oldest first, into rows
 * (with their outputs column when want_outputs). *ret_n: how many. */
static int next_rows(shard_t *sh, int64_t after_us, const char *after_id, int max,
                     bool want_outputs, trim_row_t *rows, int *ret_n)
{
    sqlite3_stmt *stmt = store_stmt(&sh->conn, STMT_TRIM_NEXT);
    if (!stmt) return -EIO;
    sqlite3_bind_int64(stmt, 1, after_us);
    store_bind_text(stmt, 2, after_id, false);
    sqlite3_bind_int(stmt, 3, max);
    int n = 0, rc, r = 0;
    while (r == 0 && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        trim_row_t *row = &rows[n++];
        store_column_copy(stmt, 0, row->id, sizeof row->id);
        row->finished_us = sqlite3_column_int64(stmt, 1);
        size_t len = (size_t)sqlite3_column_bytes(stmt, 2);
        if (!want_outputs || len == 0) continue;
        if (vec_grow((void **)&row->outputs.p, &row->outputs.cap, len, 1, 256) < 0) {
            r = -ENOMEM;
            break;
        }
        memcpy(row->outputs.p, sqlite3_column_blob(stmt, 2), len);
        row->outputs.len = len;
    }
    if (r == 0 && rc != SQLITE_DONE) r = store_sql_error(&sh->conn, "listing finished jobs");
    sqlite3_reset(stmt);
    if (r == 0) *ret_n = n;
    return r;
}

/* The outputs column of a job whose outputs expire: each record kept, its bytes gone. */
static int expired_column(const trim_row_t *row, store_bytes_t *ret)
{
    size_t pos = 0;
    store_tensor_rec_t rec;
    int k;
    ret->len = 0;
    while ((k = store_tensors_next(row->outputs.p, row->outputs.len, &pos, &rec)) > 0) {
        if (rec.where == STORE_IN_ROW || rec.where == STORE_IN_FILE) rec.where = STORE_EXPIRED;
        int r = store_tensors_append(ret, NULL, &rec);
        if (r < 0) return r;
    }
    return k < 0 ? -EIO : 0;
}

/* Expires the outputs of one job in the open write: its record rewritten, its bytes' row and
 * its files' references dropped. *ret_bytes: the bytes dropped (0 when it had none kept). */
static int expire_one(shard_t *sh, const trim_row_t *row, blob_files_t *files, uint64_t *ret_bytes)
{
    uint64_t kept = 0;
    int r = store_drop_tensors(sh, row->id, row->outputs.p, row->outputs.len, files, &kept);
    if (r < 0 || kept == 0) {
        if (r == 0) *ret_bytes = 0;
        return r;
    }
    if ((r = expired_column(row, &sh->cols)) < 0) return r;
    static const store_stmt_id_t writes[] = {STMT_TRIM_EXPIRE, STMT_TRIM_DELETE_OUTPUT_BYTES};
    for (int w = 0; r == 0 && w < 2; w++) {
        sqlite3_stmt *stmt = store_stmt(&sh->conn, writes[w]);
        if (!stmt) return -EIO;
        store_bind_text(stmt, 1, row->id, false);
        if (writes[w] == STMT_TRIM_EXPIRE) store_bind_bytes(stmt, 2, &sh->cols);
        r = sqlite3_step(stmt) == SQLITE_DONE ? 0 : store_sql_error(&sh->conn, "expiring outputs");
        sqlite3_reset(stmt);
    }
    if (r == 0) *ret_bytes = kept;
    return r;
}

/* The phases of a trim, in order. */
typedef enum trim_phase { TRIM_EXPIRE, TRIM_DELETE } trim_phase_t;

/* Where a phase's next pass starts in sh: expiry goes on after the jobs it expired, deletion
 * takes the oldest finished jobs there are. */
static void phase_start(const shard_t *sh, trim_phase_t phase, int64_t *ret_us, const char **ret_id)
{
    *ret_us = phase == TRIM_EXPIRE ? sh->trim_us : 0;
    *ret_id = phase == TRIM_EXPIRE ? sh->trim_id : "";
}

/* The work of one write: the rows it read, the files they dropped. */
typedef struct trim_batch {
    trim_row_t rows[TRIM_BATCH];
    int n;
    blob_files_t files;
    uint64_t bytes;
    int64_t jobs; /* TRIM_EXPIRE: jobs whose outputs went */
} trim_batch_t;

/* Drops up to max jobs of one batch in the open write, oldest first, until want bytes went (at
 * least one job); b->n ends as the number dropped. */
static int batch_run(shard_t *sh, trim_phase_t phase, uint64_t want, int max, trim_batch_t *b)
{
    int64_t after_us;
    const char *after_id;
    phase_start(sh, phase, &after_us, &after_id);
    int n = 0, i, r = next_rows(sh, after_us, after_id, max, phase == TRIM_EXPIRE, b->rows, &n);
    for (i = 0; r == 0 && i < n && (i == 0 || b->bytes < want); i++) {
        uint64_t bytes = 0;
        sh->cols.len = 0;
        if (phase == TRIM_EXPIRE)
            r = expire_one(sh, &b->rows[i], &b->files, &bytes);
        else
            r = store_delete_jobs(sh, &b->rows[i].id, 1, &b->files, &bytes);
        b->bytes += bytes;
        b->jobs += phase == TRIM_EXPIRE && bytes > 0;
    }
    b->n = i;
    return r;
}

/* One write of a phase in sh: up to max (at most TRIM_BATCH) jobs, and no more than want bytes'
 * worth, committed, their files removed, the expiry's next start moved past them. *ret_n: how
 * many jobs it went through (0: none left). */
static int batch_commit(shard_t *sh, trim_phase_t phase, uint64_t want, int max,
                        store_trim_stats_t *stats, int *ret_n)
{
    trim_batch_t *b = calloc(1, sizeof *b);
    if (!b) return -ENOMEM;
    store_write_reset(sh);
    int r = store_write_begin(sh, false);
    if (r == 0) r = store_write_end(sh, batch_run(sh, phase, want, max, b));
    if (r == 0) {
        store_remove_unused(sh, &b->files);
        if (phase == TRIM_EXPIRE && b->n > 0) {
            sh->trim_us = b->rows[b->n - 1].finished_us;
            memcpy(sh->trim_id, b->rows[b->n - 1].id, ID_SIZE);
        }
        stats->expired_bytes += b->bytes;
        stats->expired_jobs += b->jobs;
        stats->deleted_jobs += phase == TRIM_DELETE ? b->n : 0;
        *ret_n = b->n;
    }
    for (int i = 0; i < TRIM_BATCH; i++)
        free(b->rows[i].outputs.p);
    free(b->files.a);
    free(b);
    return r;
}

/* The shard whose next job of the phase finished first, so that the oldest go first across
 * shards; NULL when no shard has one. */
static int oldest_shard(store_t *st, trim_phase_t phase, shard_t **ret)
{
    shard_t *best = NULL;
    int64_t best_us = 0;
    for (int k = 0; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        int64_t after_us;
        const char *after_id;
        trim_row_t row = {0};
        int n = 0;
        phase_start(sh, phase, &after_us, &after_id);
        int r = next_rows(sh, after_us, after_id, 1, false, &row, &n);
        if (r < 0) return r;
        if (n == 1 && (!best || row.finished_us < best_us)) {
            best = sh;
            best_us = row.finished_us;
        }
    }
    *ret = best;
    return 0;
}

/* What one pass of store_trim may still do: jobs, and until when (monotonic). The time counts
 * only once the pass has gone through a job: a pass that measures the store for longer than
 * its time (a slow disk, a loaded machine) still trims a batch, so that passes always make
 * progress. */
typedef struct trim_budget {
    int64_t jobs;
    int64_t until_us;
    bool worked;
} trim_budget_t;

static bool budget_spent(const trim_budget_t *b)
{
    return b->jobs <= 0 || (b->worked && monotonic_us() >= b->until_us);
}

/* Runs a phase until it has dropped want bytes by its estimate, has nothing left to drop, or
 * has spent the pass's budget. The estimate is the database pages freed (measured: cheap) plus
 * the tensor bytes the rows named (which counts those kept in rows twice): it errs towards too
 * much, which the caller's measure after the phase corrects, rather than deleting more than
 * needed. *ret_more: whether the phase has more. */
static int phase_run(store_t *st, trim_phase_t phase, uint64_t want, trim_budget_t *budget,
                     store_trim_stats_t *stats, bool *ret_more)
{
    uint64_t start = stats->expired_bytes, db_start = 0, db_now;
    int r = db_bytes(st, &db_start);
    db_now = db_start;
    while (r == 0) {
        shard_t *sh = NULL;
        int n = 0;
        if (budget_spent(budget)) {
            *ret_more = true;
            return 0;
        }
        int max = budget->jobs < TRIM_BATCH ? (int)budget->jobs : TRIM_BATCH;
        r = oldest_shard(st, phase, &sh);
        if (r == 0 && sh) r = store_touch(sh);
        uint64_t dropped =
            stats->expired_bytes - start + (db_start > db_now ? db_start - db_now : 0);
        if (r == 0 && sh) r = batch_commit(sh, phase, want - dropped, max, stats, &n);
        budget->jobs -= n;
        budget->worked |= n > 0;
        if (r == 0) r = db_bytes(st, &db_now);
        if (r < 0) break;
        if (!sh || n == 0) {
            *ret_more = false;
            return 0;
        }
        uint64_t freed = db_start > db_now ? db_start - db_now : 0;
        if (freed + (stats->expired_bytes - start) >= want) {
            *ret_more = true;
            return 0;
        }
    }
    return r;
}

int store_trim(store_t *st, uint64_t max_bytes, int64_t max_jobs, store_trim_stats_t *ret)
{
    if (st->in_txn) return log_error_errno(-EBUSY, "store: store_trim inside a transaction");
    store_trim_stats_t stats = {0};
    trim_budget_t budget = {max_jobs, monotonic_us() + STORE_TRIM_PASS_US, false};
    int r = store_bytes(st, &stats.bytes);
    uint64_t target = max_bytes - max_bytes / 16;
    trim_phase_t phase = TRIM_EXPIRE;
    /* What a phase counts as dropped is what the rows said; the measure after it is what the
     * disk says (a segment file stays while another job's tensor is in it), and decides. */
    bool over = r == 0 && max_bytes > 0 && stats.bytes > max_bytes;
    while (r == 0 && over && stats.bytes > target) {
        bool more = false;
        r = phase_run(st, phase, stats.bytes - target, &budget, &stats, &more);
        if (r == 0) r = store_bytes(st, &stats.bytes);
        if (r == 0 && budget_spent(&budget)) {
            stats.more = stats.bytes > target;
            break;
        }
        if (r == 0 && !more && phase++ == TRIM_DELETE) break;
    }
    if (r < 0) return r;
    if ((stats.expired_jobs || stats.deleted_jobs) && !stats.more)
        log_info("store: over its bound of %llu bytes: expired the outputs of %lld finished "
                 "job(s) and deleted %lld, %llu tensor bytes; %llu bytes kept",
                 (unsigned long long)max_bytes, (long long)stats.expired_jobs,
                 (long long)stats.deleted_jobs, (unsigned long long)stats.expired_bytes,
                 (unsigned long long)stats.bytes);
    *ret = stats;
    return 0;
}
