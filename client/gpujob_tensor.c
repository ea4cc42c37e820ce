/* Tensors on the client side: dtypes, sizes with overflow checks, NumPy .npy files, base64,
 * and the 16-bit float conversions used to decode inline JSON data. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpujob_internal.h"

static const struct {
    const char *name;
    size_t size;
    const char *npy_descr; /* NULL: no .npy form */
} dtypes[GPUJOB_DTYPE_COUNT] = {
    [GPUJOB_F32] = {"f32", 4, "<f4"},  [GPUJOB_F16] = {"f16", 2, "<f2"},
    [GPUJOB_BF16] = {"bf16", 2, NULL}, [GPUJOB_F64] = {"f64", 8, "<f8"},
    [GPUJOB_I8] = {"i8", 1, "|i1"},    [GPUJOB_I32] = {"i32", 4, "<i4"},
    [GPUJOB_U32] = {"u32", 4, "<u4"},  [GPUJOB_I64] = {"i64", 8, "<i8"},
};

static bool dtype_valid(gpujob_dtype_t dt)
{
    return (unsigned)dt < GPUJOB_DTYPE_COUNT;
}

size_t gpujob_dtype_size(gpujob_dtype_t dt)
{
    return dtype_valid(dt) ? dtypes[dt].size : 0;
}

const char *gpujob_dtype_name(gpujob_dtype_t dt)
{
    return dtype_valid(dt) ? dtypes[dt].name : "?";
}

int gpujob_dtype_parse(const char *name, gpujob_dtype_t *ret)
{
    for (int i = 0; name && i < GPUJOB_DTYPE_COUNT; i++)
        if (strcmp(name, dtypes[i].name) == 0) {
            *ret = (gpujob_dtype_t)i;
            return 0;
        }
    return -EINVAL;
}

int gjc_tensor_bytes(gpujob_dtype_t dt, int ndim, const int64_t *shape, size_t *ret_bytes)
{
    if (!dtype_valid(dt) || ndim < 0 || ndim > GPUJOB_MAX_DIMS || (ndim > 0 && !shape))
        return -EINVAL;
    size_t bytes = dtypes[dt].size;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -EINVAL;
        if (__builtin_mul_overflow(bytes, (uint64_t)shape[i], &bytes)) return -EOVERFLOW;
    }
    *ret_bytes = bytes;
    return 0;
}

int gpujob_tensor_init(gpujob_tensor_t *t, gpujob_dtype_t dtype, int ndim, const int64_t *shape,
                       void *data)
{
    size_t bytes = 0;
    int r = gjc_tensor_bytes(dtype, ndim, shape, &bytes);
    if (r < 0) return r;
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->data = data;
    t->nbytes = bytes;
    return 0;
}

int64_t gpujob_tensor_numel(const gpujob_tensor_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

void gpujob_tensor_clear(gpujob_tensor_t *t)
{
    if (!t) return;
    free(t->data);
    memset(t, 0, sizeof *t);
}

/* ---- .npy ------------------------------------------------------------------------------- */

static int npy_error(char *errbuf, size_t size, int r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int npy_error(char *errbuf, size_t size, int r, const char *fmt, ...)
{
    if (errbuf && size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, size, fmt, ap);
        va_end(ap);
    }
    return r;
}

/* Finds 'key': in the header dict and returns a pointer just past the colon and blanks. */
static const char *npy_dict_value(const char *hdr, const char *key)
{
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s'", key);
    const char *p = strstr(hdr, quoted);
    if (!p) return NULL;
    p += strlen(quoted);
    while (*p == ' ')
        p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

static int npy_parse_shape(const char *p, int *ret_ndim, int64_t *shape, char *errbuf, size_t size)
{
    if (*p != '(') return npy_error(errbuf, size, -EINVAL, "npy: shape is not a tuple");
    p++;
    int ndim = 0;
    for (;;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == ')') break;
        if (*p < '0' || *p > '9') return npy_error(errbuf, size, -EINVAL, "npy: bad shape");
        if (ndim == GPUJOB_MAX_DIMS)
            return npy_error(errbuf, size, -EINVAL, "npy: more than %d dimensions",
                             GPUJOB_MAX_DIMS);
        char *end = NULL;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno == ERANGE) return npy_error(errbuf, size, -EINVAL, "npy: dimension too large");
        shape[ndim++] = v;
        p = end;
        while (*p == ' ')
            p++;
        if (*p != ',' && *p != ')') return npy_error(errbuf, size, -EINVAL, "npy: bad shape");
    }
    *ret_ndim = ndim;
    return 0;
}

int gpujob_npy_parse(const void *file, size_t len, gpujob_tensor_t *ret, char *errbuf,
                     size_t errbuf_size)
{
    const unsigned char *b = file;
    if (!b || len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return npy_error(errbuf, errbuf_size, -EINVAL, "not a .npy file (bad magic)");
    size_t hlen = 0, hoff = 0;
    if (b[6] == 1 && b[7] == 0) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        hoff = 10;
    } else if ((b[6] == 2 || b[6] == 3) && b[7] == 0 && len >= 12) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        hoff = 12;
    } else {
        return npy_error(errbuf, errbuf_size, -EINVAL, "npy: unsupported version %u.%u", b[6],
                         b[7]);
    }
    if (hlen > len - hoff) return npy_error(errbuf, errbuf_size, -EINVAL, "npy: truncated header");
    char *hdr = strndup((const char *)b + hoff, hlen);
    if (!hdr) return -ENOMEM;

    int r = 0;
    gpujob_dtype_t dt = GPUJOB_DTYPE_COUNT;
    const char *descr = npy_dict_value(hdr, "descr");
    const char *fortran = npy_dict_value(hdr, "fortran_order");
    const char *shape_text = npy_dict_value(hdr, "shape");
    int64_t shape[GPUJOB_MAX_DIMS];
    int ndim = 0;
    if (!descr || !fortran || !shape_text || hdr[0] != '{') {
        r = npy_error(errbuf, errbuf_size, -EINVAL,
                      "npy: header lacks descr, fortran_order or shape");
    } else if (strncmp(fortran, "False", 5) != 0) {
        r = npy_error(errbuf, errbuf_size, -ENOTSUP, "npy: Fortran-order arrays are not supported");
    } else {
        for (int i = 0; i < GPUJOB_DTYPE_COUNT && dt == GPUJOB_DTYPE_COUNT; i++) {
            const char *d = dtypes[i].npy_descr;
            if (!d) continue;
            char quoted[8];
            snprintf(quoted, sizeof quoted, "'%s'", d);
            if (strncmp(descr, quoted, strlen(quoted)) == 0) dt = (gpujob_dtype_t)i;
            /* NumPy also writes one-byte types with '<' in some versions. */
            if (i == GPUJOB_I8 && strncmp(descr, "'<i1'", 5) == 0) dt = GPUJOB_I8;
        }
        if (dt == GPUJOB_DTYPE_COUNT) {
            const char *end = strchr(descr + 1, '\'');
            int n = end ? (int)(end - descr + 1) : 8;
            r = npy_error(errbuf, errbuf_size, -ENOTSUP,
                          "npy: dtype %.*s is not supported (little-endian f4, f2, f8, i1, i4, "
                          "u4, i8 are)",
                          n, descr);
        } else {
            r = npy_parse_shape(shape_text, &ndim, shape, errbuf, errbuf_size);
        }
    }
    free(hdr);
    if (r < 0) return r;
    size_t bytes = 0;
    r = gjc_tensor_bytes(dt, ndim, shape, &bytes);
    if (r < 0) return npy_error(errbuf, errbuf_size, r, "npy: shape too large");
    size_t data_off = hoff + hlen;
    if (len - data_off != bytes)
        return npy_error(errbuf, errbuf_size, -EINVAL,
                         "npy: %zu data bytes where the header describes %zu", len - data_off,
                         bytes);
    void *data = malloc(bytes ? bytes : 1);
    if (!data) return -ENOMEM;
    memcpy(data, b + data_off, bytes);
    gpujob_tensor_init(ret, dt, ndim, shape, data);
    return 0;
}

static int read_file(const char *path, void **ret_data, size_t *ret_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int r = -errno;
        close(fd);
        return r;
    }
    size_t len = (size_t)st.st_size;
    char *data = malloc(len ? len : 1);
    if (!data) {
        close(fd);
        return -ENOMEM;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, data + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int r = n < 0 ? -errno : -EIO;
            free(data);
            close(fd);
            return r;
        }
        got += (size_t)n;
    }
    close(fd);
    *ret_data = data;
    *ret_len = len;
    return 0;
}

int gpujob_npy_load(const char *path, gpujob_tensor_t *ret, char *errbuf, size_t errbuf_size)
{
    void *file = NULL;
    size_t len = 0;
    int r = read_file(path, &file, &len);
    if (r < 0) return npy_error(errbuf, errbuf_size, r, "%s: %s", path, strerror(-r));
    char msg[256] = "";
    r = gpujob_npy_parse(file, len, ret, msg, sizeof msg);
    free(file);
    if (r < 0) return npy_error(errbuf, errbuf_size, r, "%s: %s", path, msg);
    return 0;
}

int gpujob_npy_format(const gpujob_tensor_t *t, void **ret_file, size_t *ret_len)
{
    size_t bytes = 0;
    int r = gjc_tensor_bytes(t->dtype, t->ndim, t->shape, &bytes);
    if (r < 0) return r;
    if (!dtypes[t->dtype].npy_descr) return -ENOTSUP;
    if (bytes != t->nbytes || (bytes && !t->data)) return -EINVAL;
    char shape[GPUJOB_MAX_DIMS * 24 + 8] = "(";
    for (int i = 0; i < t->ndim; i++) {
        size_t used = strlen(shape);
        snprintf(shape + used, sizeof shape - used, "%lld,%s", (long long)t->shape[i],
                 i + 1 < t->ndim ? " " : "");
    }
    /* NumPy writes (3,) for one dimension and (2, 3) for more. */
    size_t used = strlen(shape);
    if (t->ndim > 1 && shape[used - 1] == ',') shape[--used] = '\0';
    snprintf(shape + used, sizeof shape - used, ")");
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     dtypes[t->dtype].npy_descr, shape);
    /* Pad with spaces so the data starts on a 64-byte boundary; the header ends in '\n'. */
    size_t total = 10 + (size_t)n + 1;
    size_t padded = (total + 63) / 64 * 64;
    size_t hlen = padded - 10;
    char *file = malloc(padded + bytes);
    if (!file) return -ENOMEM;
    memcpy(file, "\x93NUMPY\x01\x00", 8);
    file[8] = (char)(hlen & 0xff);
    file[9] = (char)(hlen >> 8);
    memcpy(file + 10, dict, (size_t)n);
    memset(file + 10 + n, ' ', hlen - (size_t)n - 1);
    file[padded - 1] = '\n';
    if (bytes) memcpy(file + padded, t->data, bytes);
    *ret_file = file;
    *ret_len = padded + bytes;
    return 0;
}

int gjc_write_file(const char *path, const void *data, size_t len)
{
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0) return -ENOMEM;
    int r = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) r = -errno;
    for (size_t done = 0; r >= 0 && done < len;) {
        ssize_t n = write(fd, (const char *)data + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            r = -errno;
        else
            done += (size_t)n;
    }
    if (fd >= 0 && close(fd) < 0 && r >= 0) r = -errno;
    if (r >= 0 && rename(tmp, path) < 0) r = -errno;
    if (r < 0 && fd >= 0) unlink(tmp);
    free(tmp);
    return r;
}

int gpujob_npy_save(const char *path, const gpujob_tensor_t *t)
{
    void *file = NULL;
    size_t len = 0;
    int r = gpujob_npy_format(t, &file, &len);
    if (r < 0) return r;
    r = gjc_write_file(path, file, len);
    free(file);
    return r;
}

/* ---- base64 and 16-bit floats ------------------------------------------------------------ */

char *gjc_base64(const void *data, size_t len)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *in = data;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    size_t i = 0;
    for (; i + 2 < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = alphabet[(v >> 6) & 63];
        *o++ = alphabet[v & 63];
    }
    if (i < len) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0);
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = i + 1 < len ? alphabet[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

uint16_t gjc_f32_to_bf16(float f)
{
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);                                          /* nearest even */
    return (uint16_t)(u >> 16);
}

uint16_t gjc_f32_to_f16(float f)
{
    uint32_t u = float_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t abs = u & 0x7fffffff;
    if (abs > 0x7f800000) return sign | 0x7e00;  /* NaN */
    if (abs >= 0x477ff000) return sign | 0x7c00; /* rounds to infinity (or is infinite) */
    if (abs < 0x33000001) return sign;           /* rounds to zero */
    int exp = (int)(abs >> 23) - 127;
    if (exp >= -14) {
        /* Normal: a rounding carry out of the mantissa correctly bumps the exponent. */
        uint32_t h = ((uint32_t)(exp + 15) << 10) | ((abs >> 13) & 0x3ff);
        uint32_t rest = abs & 0x1fff;
        if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
        return sign | (uint16_t)h;
    }
    /* Subnormal: the value in units of 2^-24 is mant * 2^(exp + 1). */
    uint32_t mant = (abs & 0x7fffff) | 0x800000;
    int shift = -1 - exp;
    uint32_t h = mant >> shift, rest = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (h & 1))) h++;
    return sign | (uint16_t)h;
}
