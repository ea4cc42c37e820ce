/* Which blob files rows name. blob_refs counts the job tensors naming each file; a write
 * collects its changes to the counts (ref_deltas_t), its transaction writes them once per file
 * at commit. A file goes once no row of any shard names it, and only once the commit that took
 * its last row is done: files whose rows were deleted (gc, buffer deletion) at the next durable
 * commit, shared files (segments) at the end of the transaction that may have taken their last
 * row. Files left behind by a crash or by a rolled-back transaction are swept at the next
 * open (store_blob_sweep_orphans). */
#include "store.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "daemon/util/log.h"
#include "store_internal.h"

int store_refs_reserve(ref_deltas_t *d, size_t more)
{
    return vec_grow((void **)&d->a, &d->cap, d->n + more, sizeof *d->a, 16);
}

/* Adds what the open write changed to what its transaction will write; room was reserved. */
void store_refs_merge(ref_deltas_t *into, const ref_deltas_t *from)
{
    for (size_t i = 0; i < from->n; i++) {
        size_t j = into->n;
        while (j-- > 0 && strcmp(into->a[j].file, from->a[i].file) != 0)
            ;
        if (j == SIZE_MAX) {
            into->a[into->n] = from->a[i];
            into->n++;
        } else {
            into->a[j].n += from->a[i].n;
        }
    }
}

/* Notes n more job tensors naming file in the open write's count changes. */
int store_refs_note(ref_deltas_t *d, const char *file, int64_t n)
{
    for (size_t i = d->n; i-- > 0;)
        if (strcmp(d->a[i].file, file) == 0) {
            d->a[i].n += n;
            return 0;
        }
    if (store_refs_reserve(d, 1) < 0) return -ENOMEM;
    memcpy(d->a[d->n].file, file, sizeof(blob_file_t));
    d->a[d->n++].n = n;
    return 0;
}

/* Writes the changes into blob_refs (a count that drops to zero takes its row along). */
int store_refs_write(shard_t *sh, ref_deltas_t *d)
{
    int r = 0;
    for (size_t i = 0; i < d->n && r == 0; i++) {
        if (d->a[i].n == 0) continue;
        store_stmt_id_t id = STMT_REFS_ADD;
        for (int step = 0; step < 2 && r == 0; step++) {
            sqlite3_stmt *stmt = store_stmt(&sh->conn, id);
            if (!stmt) return -EIO;
            store_bind_text(stmt, 1, d->a[i].file, false);
            if (id == STMT_REFS_ADD) sqlite3_bind_int64(stmt, 2, d->a[i].n);
            if (sqlite3_step(stmt) != SQLITE_DONE)
                r = store_sql_error(&sh->conn, "counting a file");
            sqlite3_reset(stmt);
            if (d->a[i].n > 0) break;
            id = STMT_REFS_DROP;
        }
    }
    if (r == 0) d->n = 0;
    return r;
}

/* The open transaction's change to the count of file, not written yet. */
static int64_t refs_pending(const shard_t *sh, const char *file)
{
    for (size_t i = 0; i < sh->txn_refs.n; i++)
        if (strcmp(sh->txn_refs.a[i].file, file) == 0) return sh->txn_refs.a[i].n;
    return 0;
}

/* Whether a row of any shard names file, counting the changes of each shard's open write and
 * transaction not written yet, or file is a shard's active segment. A file that cannot be
 * checked counts as named: it stays for the sweep at the next open. */
bool store_file_in_use(store_t *st, const char *file)
{
    for (int k = 0; k < st->n_shards; k++) {
        shard_t *sh = &st->shards[k];
        bool used = true;
        if (store_segment_is_active(&sh->segment, file) ||
            store_blob_file_referenced(&sh->conn, file, refs_pending(sh, file), &used) < 0 || used)
            return true;
    }
    return false;
}

/* After a commit or rollback (of the store's transaction, or of a write outside one): retires
 * segments whose sync failed, and removes the shared files that may have lost their last row,
 * or never had one, when no row names them. */
void store_files_settle(store_t *st)
{
    for (int k = 0; k < st->n_shards; k++)
        store_segment_txn_end(&st->shards[k].segment, &st->shards[k].maybe_unused);
    for (int k = 0; k < st->n_shards; k++) {
        blob_files_t *l = &st->shards[k].maybe_unused;
        for (size_t i = 0; i < l->n; i++)
            if (!store_file_in_use(st, l->a[i])) store_blob_file_remove(st->blobs_dir, l->a[i]);
        l->n = 0;
    }
}

void store_unlink_pending(shard_t *sh)
{
    for (size_t i = 0; i < sh->unlink.n; i++)
        store_blob_file_remove(sh->conn.blobs_dir, sh->unlink.a[i]);
    sh->unlink.n = sh->n_unlink_committed = 0;
}

/* Removes files whose rows are gone: now when that deletion is committed, else at the caller's
 * transaction's commit, or the next durable one after a relaxed transaction. */
int store_unlink_after_commit(shard_t *sh, const blob_file_t *files, size_t n)
{
    if (!sh->in_txn) {
        for (size_t i = 0; i < n; i++)
            store_blob_file_remove(sh->conn.blobs_dir, files[i]);
        return 0;
    }
    /* Out of memory: the files stay, and the sweep at the next open removes them. */
    if (vec_grow((void **)&sh->unlink.a, &sh->unlink.cap, sh->unlink.n + n, sizeof *sh->unlink.a,
                 64) < 0)
        return -ENOMEM;
    memcpy(sh->unlink.a + sh->unlink.n, files, n * sizeof *files);
    sh->unlink.n += n;
    return 0;
}
