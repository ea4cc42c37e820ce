/* The TCP listener's certificate and key, read and checked (http_tls.h). GnuTLS, which
 * libmicrohttpd serves TLS with, parses them here too, so that an error names the file. */
#include "http_tls.h"

#include <errno.h>
#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/util/log.h"

/* A PEM file is small; anything larger is not one. */
#define TLS_FILE_MAX (1 << 20)

/* Reads the whole file at path into a new NUL-terminated buffer. 0 or a negative errno. */
static int tls_read_file(const char *path, char **ret, size_t *ret_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    int r = fstat(fd, &st) < 0          ? -errno
            : !S_ISREG(st.st_mode)      ? -EINVAL
            : st.st_size > TLS_FILE_MAX ? -EFBIG
                                        : 0;
    if (r < 0) {
        close(fd);
        return r;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    r = got == (size_t)st.st_size ? 0 : -EIO;
    close(fd);
    buf[got] = '\0';
    if (r < 0) {
        explicit_bzero(buf, got);
        free(buf);
        return r;
    }
    *ret = buf;
    *ret_len = got;
    return 0;
}

/* Whether GnuTLS takes the pair as a server's credentials: each file parses, and the key is the
 * certificate's. Logs the reason, naming the file, when not. */
static int tls_check_pair(const char *cert_path, const char *key_path, http_tls_files_t *f)
{
    gnutls_datum_t cert = {(unsigned char *)f->cert, (unsigned)strlen(f->cert)};
    gnutls_datum_t key = {(unsigned char *)f->key, (unsigned)f->key_len};
    gnutls_x509_crt_t *crts = NULL;
    unsigned n_crts = 0;
    int g = gnutls_x509_crt_list_import2(&crts, &n_crts, &cert, GNUTLS_X509_FMT_PEM, 0);
    if (g < 0)
        return log_error_errno(-EINVAL, "server.tls_cert '%s' holds no PEM certificate: %s",
                               cert_path, gnutls_strerror(g));
    for (unsigned i = 0; i < n_crts; i++)
        gnutls_x509_crt_deinit(crts[i]);
    gnutls_free(crts);
    gnutls_x509_privkey_t pk;
    if (gnutls_x509_privkey_init(&pk) < 0) return -ENOMEM;
    g = gnutls_x509_privkey_import(pk, &key, GNUTLS_X509_FMT_PEM);
    gnutls_x509_privkey_deinit(pk);
    if (g < 0)
        return log_error_errno(-EINVAL, "server.tls_key '%s' holds no unencrypted PEM key: %s",
                               key_path, gnutls_strerror(g));
    gnutls_certificate_credentials_t cred;
    if (gnutls_certificate_allocate_credentials(&cred) < 0) return -ENOMEM;
    g = gnutls_certificate_set_x509_key_mem(cred, &cert, &key, GNUTLS_X509_FMT_PEM);
    gnutls_certificate_free_credentials(cred);
    if (g < 0)
        return log_error_errno(-EINVAL,
                               "server.tls_key '%s' does not go with server.tls_cert '%s': %s",
                               key_path, cert_path, gnutls_strerror(g));
    return 0;
}

int http_tls_files_load(const char *cert_path, const char *key_path, http_tls_files_t *ret)
{
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return log_error_errno(-EOPNOTSUPP,
                               "server.tls_cert is set, but this libmicrohttpd was built "
                               "without TLS support");
    http_tls_files_t f = {0};
    size_t cert_len;
    int r = tls_read_file(cert_path, &f.cert, &cert_len);
    if (r < 0)
        return log_error_errno(r, "Failed to read server.tls_cert '%s': %s", cert_path,
                               strerror(-r));
    r = tls_read_file(key_path, &f.key, &f.key_len);
    if (r < 0) {
        http_tls_files_clear(&f);
        return log_error_errno(r, "Failed to read server.tls_key '%s': %s", key_path, strerror(-r));
    }
    r = tls_check_pair(cert_path, key_path, &f);
    if (r < 0) {
        http_tls_files_clear(&f);
        return r;
    }
    *ret = f;
    return 0;
}

void http_tls_files_clear(http_tls_files_t *f)
{
    if (f->key) explicit_bzero(f->key, f->key_len);
    free(f->key);
    free(f->cert);
    *f = (http_tls_files_t){0};
}
