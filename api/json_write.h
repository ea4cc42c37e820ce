/* The JSON writer of the answers: compact JSON, byte for byte as json_dumps(JSON_COMPACT)
 * writes it (keys in the object's order, the same escapes), except that reals come out
 * shortest-round-trip (float_print.h: 0.1, not 0.10000000000000001), and raw nodes come out
 * as the JSON text they hold, which lets tensor data go from its typed buffer to text without
 * a json_t per element. */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* The room an integer's text needs at most, its terminating NUL included. */
#define JSON_INTEGER_MAX 24

/* A raw node: a json_t that json_write() writes as text[0..len), verbatim (a new reference;
 * NULL on allocation failure). The text is copied; it must be valid JSON, which is not
 * checked. The writer knows a raw node by the address of a marker inside it, which only this
 * function can make, so no document a client sends can pass for one. jansson's own functions
 * see an array of null and a string. */
json_t *json_raw_new(const char *text, size_t len);
/* The text of a raw node (borrowed, NUL-terminated) and its length, or NULL when node is not
 * a raw node. */
const char *json_raw_text(const json_t *node, size_t *ret_len);

/* Writes root (an object or an array, or any value) as compact JSON: 0 and a new malloc'd,
 * NUL-terminated text and its length, or -ENOMEM. Strings are written as they are held,
 * which jansson's constructors guarantee to be UTF-8. */
int json_write(const json_t *root, char **ret_text, size_t *ret_len);

/* Writes v in decimal into buf (JSON_INTEGER_MAX bytes), NUL-terminated: its length. */
size_t json_format_integer(int64_t v, char *buf);
