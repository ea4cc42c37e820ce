/* Private to api/: what makes a request's line and header fields strict (RFC 9112 3 and 5,
 * RFC 9110 5.1, 5.5 and 5.6.2), for the HTTP adapter (http_server.c), which answers 400 to a
 * request that fails before routing it.
 *
 * libmicrohttpd hands over the method, the target and each field as NUL-terminated strings, so
 * a NUL the client sent inside one of them cuts the string there: "GET /v1/info\0junk" reads as
 * "/v1/info". The head walk finds such bytes from where the strings lie. libmicrohttpd 0.9
 * parses a request's head in place in its read buffer: the method at the start, then the
 * target and the version, then each field's name and value, in the order received, with each
 * line's CR LF (or bare LF), the space after the method and before the version, and each
 * field's colon overwritten by NULs, and the whole head MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE
 * bytes long. Bytes between those strings that are neither those NULs nor the spaces before a
 * value were hidden by a NUL. One ambiguity remains: a NUL just before a bare LF reads as the
 * CR of a CR LF, and is taken for one (the value it ends is read whole either way). A field
 * folded onto the next line (obs-fold) moves out of the buffer and fails the walk too, which
 * RFC 9112 5.2 allows a server to refuse. libmicrohttpd 1.0 parses differently and refuses
 * NULs itself: the adapter walks the head with 0.9 only. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* Whether s[0..n) is a token (RFC 9110 5.6.2): one or more tchars, as methods and field names
 * must be. */
bool http_is_token(const char *s, size_t n);
/* Whether s[0..n) holds a control byte other than HTAB: a field value may not (RFC 9110 5.5). */
bool http_value_has_control(const char *s, size_t n);
/* Whether the raw request target (NUL-terminated, as received) holds a control byte or a
 * space, as such or %-escaped (libmicrohttpd decodes "%00" into the path, which then ends
 * there). */
bool http_target_is_bad(const char *target);

/* A walk over a request's head as libmicrohttpd 0.9 leaves it: begin, each field of the
 * MHD_HEADER_KIND in order, end. */
typedef struct http_head_walk {
    const char *start, *end; /* the head: [method, method + its size) */
    const char *next;        /* where the bytes not yet accounted for begin */
    bool hidden;             /* a byte no string shows was found */
} http_head_walk_t;

/* Starts the walk at the request line: the method (the head's start), the target as the
 * access handler gets it and its length as the URI log callback saw it before decoding, and
 * the version. */
void http_head_walk_begin(http_head_walk_t *w, const char *method, size_t head_size,
                          const char *url, size_t target_len, const char *version);
/* Accounts for the next field. */
void http_head_walk_field(http_head_walk_t *w, const char *name, size_t name_len, const char *value,
                          size_t value_len);
/* Ends the walk: true when a byte was hidden somewhere in the head. */
bool http_head_walk_end(http_head_walk_t *w);
