/* A job's tensors inside its own row: the inputs' records in one BLOB column and the outputs'
 * in another, so that a job is one row, written once when taken in and once when it ends (a
 * row per tensor would make three or four inserts per tiny job, on the loop thread). The bytes
 * of the small tensors kept in the database go to job_bytes, one row for a job's inputs and one
 * for its outputs, written once: in the job's row, every update of it (its start, its end)
 * would write them again, and every read of it would read them.
 *
 * A record, integers little-endian:
 *
 *   u8 slot, u8 where (STORE_IN_ROW, STORE_IN_FILE, STORE_IN_BUFFER, STORE_EXPIRED),
 *   u8 length + name, u8 length + dtype name, u8 ndim + ndim x u64 dims, u64 nbytes,
 *   then by where: u64 offset in the job's bytes | u8 length + file + u64 offset |
 *   u8 length + buffer id | nothing.
 *
 * The decoder checks every length against what is left, so that a damaged row is an error and
 * never a read past its end. */
#include "store_internal.h"

#include <errno.h>
#include <string.h>

static int reserve(store_bytes_t *b, size_t more)
{
    return vec_grow((void **)&b->p, &b->cap, b->len + more, 1, 256);
}

static void put(store_bytes_t *b, const void *src, size_t n)
{
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_u8(store_bytes_t *b, unsigned v)
{
    b->p[b->len++] = (unsigned char)v;
}

static void put_u64(store_bytes_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        put_u8(b, (unsigned)(v >> (8 * i)) & 0xff);
}

static void put_str(store_bytes_t *b, const char *s, size_t len)
{
    put_u8(b, (unsigned)len);
    put(b, s, len);
}

int store_tensors_append(store_bytes_t *b, store_bytes_t *data, store_tensor_rec_t *rec)
{
    const char *dtype = dtype_name(rec->desc.dtype);
    size_t name_len = strnlen(rec->name, sizeof rec->name - 1);
    size_t dtype_len = strlen(dtype);
    size_t file_len = strnlen(rec->file, sizeof rec->file - 1);
    size_t id_len = strnlen(rec->buffer_id, sizeof rec->buffer_id - 1);
    if (rec->slot < 0 || rec->slot >= OP_MAX_TENSORS || rec->desc.ndim < 0 ||
        rec->desc.ndim > TENSOR_MAX_DIMS || dtype_len > 255 ||
        (rec->where == STORE_IN_ROW && rec->nbytes > 0 && !rec->data))
        return -EINVAL;
    size_t need = 2 + 1 + name_len + 1 + dtype_len + 1 + 8 * (size_t)rec->desc.ndim + 8;
    if (rec->where == STORE_IN_ROW) need += 8;
    if (rec->where == STORE_IN_FILE) need += 1 + file_len + 8;
    if (rec->where == STORE_IN_BUFFER) need += 1 + id_len;
    if (reserve(b, need) < 0 ||
        (rec->where == STORE_IN_ROW && reserve(data, (size_t)rec->nbytes) < 0))
        return -ENOMEM;
    put_u8(b, (unsigned)rec->slot);
    put_u8(b, rec->where);
    put_str(b, rec->name, name_len);
    put_str(b, dtype, dtype_len);
    put_u8(b, (unsigned)rec->desc.ndim);
    for (int d = 0; d < rec->desc.ndim; d++)
        put_u64(b, (uint64_t)rec->desc.shape[d]);
    put_u64(b, rec->nbytes);
    if (rec->where == STORE_IN_ROW) {
        rec->at = data->len;
        put(data, rec->data, (size_t)rec->nbytes);
        put_u64(b, rec->at);
    }
    if (rec->where == STORE_IN_FILE) {
        put_str(b, rec->file, file_len);
        put_u64(b, rec->offset);
    }
    if (rec->where == STORE_IN_BUFFER) put_str(b, rec->buffer_id, id_len);
    return 0;
}

/* A cursor over one column's bytes; ok turns false at the first read past the end. */
typedef struct reader {
    const unsigned char *p;
    size_t len, pos;
    bool ok;
} reader_t;

static const unsigned char *take(reader_t *r, size_t n)
{
    if (!r->ok || n > r->len - r->pos) {
        r->ok = false;
        return NULL;
    }
    const unsigned char *at = r->p + r->pos;
    r->pos += n;
    return at;
}

static unsigned get_u8(reader_t *r)
{
    const unsigned char *at = take(r, 1);
    return at ? at[0] : 0;
}

static uint64_t get_u64(reader_t *r)
{
    const unsigned char *at = take(r, 8);
    uint64_t v = 0;
    for (int i = 0; at && i < 8; i++)
        v |= (uint64_t)at[i] << (8 * i);
    return v;
}

/* A length-prefixed string into dst (size bytes); too long for dst is malformed. */
static void get_str(reader_t *r, char *dst, size_t size)
{
    size_t len = get_u8(r);
    const unsigned char *at = take(r, len);
    if (!at || len >= size) {
        r->ok = false;
        return;
    }
    memcpy(dst, at, len);
    dst[len] = '\0';
}

int store_tensors_next(const void *bytes, size_t len, size_t *pos, store_tensor_rec_t *ret)
{
    if (*pos >= len) return 0;
    reader_t r = {bytes, len, *pos, true};
    store_tensor_rec_t rec = {.slot = (int)get_u8(&r), .where = (store_where_t)get_u8(&r)};
    char dtype[16];
    get_str(&r, rec.name, sizeof rec.name);
    get_str(&r, dtype, sizeof dtype);
    rec.desc.ndim = (int)get_u8(&r);
    if (rec.desc.ndim > TENSOR_MAX_DIMS) r.ok = false;
    for (int d = 0; r.ok && d < rec.desc.ndim; d++)
        rec.desc.shape[d] = (int64_t)get_u64(&r);
    rec.nbytes = get_u64(&r);
    if (rec.where == STORE_IN_ROW) {
        rec.at = get_u64(&r);
    } else if (rec.where == STORE_IN_FILE) {
        get_str(&r, rec.file, sizeof rec.file);
        rec.offset = get_u64(&r);
    } else if (rec.where == STORE_IN_BUFFER) {
        get_str(&r, rec.buffer_id, sizeof rec.buffer_id);
    } else if (rec.where != STORE_EXPIRED) {
        r.ok = false;
    }
    if (!r.ok || rec.slot >= OP_MAX_TENSORS || dtype_parse(dtype, &rec.desc.dtype) < 0 ||
        tensor_desc_check(&rec.desc, UINT64_MAX) < 0 || tensor_desc_bytes(&rec.desc) != rec.nbytes)
        return -EIO;
    *pos = r.pos;
    *ret = rec;
    return 1;
}
