/* The blob reader over the store: each worker's open() is a store reader of its own, as the
 * store asks of every thread but its writer's. */
#include "daemon/store/store.h"
#include "executor.h"

static int exec_store_open(void *ctx, void **ret_rd)
{
    store_reader_t *rd = NULL;
    int r = store_reader_open(ctx, &rd);
    if (r < 0) return r;
    *ret_rd = rd;
    return 0;
}

static void exec_store_close(void *rd)
{
    store_reader_close(rd);
}

static int exec_store_read(void *rd, const char *blob, uint64_t nbytes, void **ret_data)
{
    return store_blob_read(rd, blob, nbytes, ret_data);
}

static int exec_store_read_at(void *rd, const char *blob, uint64_t nbytes, uint64_t offset,
                              void *dst, size_t n)
{
    return store_blob_read_at(rd, blob, nbytes, offset, dst, n);
}

static int exec_store_buffer_get(void *rd, const char *id, buffer_t **ret)
{
    return store_buffer_get(rd, id, ret);
}

exec_blob_reader_t exec_store_blob_reader(store_t *st)
{
    return (exec_blob_reader_t){
        .ctx = st,
        .open = exec_store_open,
        .close = exec_store_close,
        .read = exec_store_read,
        .read_at = exec_store_read_at,
        .buffer_get = exec_store_buffer_get,
    };
}
