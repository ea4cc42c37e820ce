/* Private to api/: the TCP listener's certificate and key (server.tls_cert, server.tls_key),
 * read from their PEM files and checked before libmicrohttpd is given them, so that a file that
 * cannot be read, does not parse, or a key that does not match the certificate stops the start
 * with a line naming the file. The key's bytes never reach a log line. */
#pragma once

#include <stddef.h>

typedef struct http_tls_files {
    char *cert; /* NUL-terminated PEM text */
    char *key;  /* NUL-terminated PEM text; wiped by http_tls_files_clear */
    size_t key_len;
} http_tls_files_t;

/* Reads and checks the two files, and whether this libmicrohttpd serves TLS at all. 0, or a
 * negative errno (logged, naming the file) with ret untouched. */
int http_tls_files_load(const char *cert_path, const char *key_path, http_tls_files_t *ret);
/* Wipes the key's bytes and frees both texts; safe to call twice. libmicrohttpd hands them to
 * GnuTLS, which copies them, while MHD_start_daemon runs, and does not read them again. */
void http_tls_files_clear(http_tls_files_t *f);
