/* The tensor data of a POST /v1/jobs document, found without building a tree of it.
 *
 * A job document is mostly numbers: parsed by jansson as a whole it costs a json_t per number,
 * about twenty times the text. json_scan() walks the text once and cuts out the value of every
 * inputs.<name>.data and inputs.<name>.b64 (of the job, or of each job of a list), checking it
 * as JSON. It leaves a small copy of the rest, the skeleton, for jansson, in which each cut
 * value is replaced by the index of its span, a JSON integer. Every value at those positions
 * is cut, whatever it is, so an integer found there in the skeleton is always the scanner's own
 * index into this document's spans: a client cannot write one. The codec then reads each span's
 * text straight into the tensor's typed buffer once the tensor's dtype and shape are known.
 *
 * The lexers below are shared with that codec (tensor_codec.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/tensor.h"

/* The most nested lists and objects jansson accepts in a document. */
#define JSON_SCAN_MAX_DEPTH 2048

typedef enum json_span_kind {
    JSON_SPAN_VALUE, /* the text of one JSON value, checked: a data list, a number, ... */
    JSON_SPAN_B64,   /* the characters of a string with no escapes, quotes left out */
} json_span_kind_t;

typedef struct json_span {
    size_t off, len; /* in the scanned text */
    json_span_kind_t kind;
    /* Where its index is in the skeleton, and where the cut text ends (quotes included):
     * to tell positions in the text from positions in the skeleton. */
    size_t skel_off, skel_len, cut_end;
    /* A flat list of numbers whose tensor named its dtype, f32 or f64, before its data: read
     * by the scanner into a typed block as it checked the text, n_values of values_dtype.
     * Owned by the scan until json_scan_take_values(); NULL for any other value. */
    void *values;
    size_t n_values;
    dtype_t values_dtype;
} json_span_t;

typedef struct json_scan {
    const char *text; /* the scanned text, borrowed: the spans' offsets are into it */
    char *skeleton;   /* NUL-terminated; owned */
    size_t skeleton_len;
    json_span_t *spans; /* owned */
    size_t n_spans, spans_cap;
    size_t n_jobs; /* the length of a top-level list; 1 for anything else */
    bool is_list;
} json_scan_t;

/* A document that is not JSON: where (a byte offset into the text) and why. */
typedef struct json_scan_error {
    size_t offset;
    char text[160];
} json_scan_error_t;

/* Scans text[0..len). When the document is a list of more than max_jobs elements, only n_jobs
 * is meaningful (the skeleton is then empty), so that the caller can refuse it without having
 * copied or parsed it. A data list read into a typed block (json_span_t.values) takes at most
 * max_values_bytes; a longer one is only checked. 0; -EINVAL with *err when the document's
 * structure or a cut value is not JSON (the rest of the skeleton is jansson's to check);
 * -ENOMEM. */
int json_scan(const char *text, size_t len, size_t max_jobs, uint64_t max_values_bytes,
              json_scan_t *ret, json_scan_error_t *err);
/* The typed block of span i (json_span_t.values), which the caller then owns and frees, or
 * NULL when it has none. */
void *json_scan_take_values(json_scan_t *s, size_t i);
/* Frees what a successful json_scan() allocated. */
void json_scan_done(json_scan_t *s);

/* The offset in the scanned text of offset skel_offset in the skeleton. */
size_t json_scan_text_offset(const json_scan_t *s, size_t skel_offset);
/* Line and column (from 1, in bytes) of offset in text, as jansson reports positions. */
void json_scan_position(const char *text, size_t offset, int *ret_line, int *ret_column);

/* The first byte at or after p that is not JSON whitespace (or end). */
const char *json_lex_ws(const char *p, const char *end);
/* The end of the JSON number at p, or NULL when p does not start one. *ret_is_int: it has
 * neither a fraction nor an exponent. */
const char *json_lex_number(const char *p, const char *end, bool *ret_is_int);
/* The end of the string whose opening quote is at p (just past its closing quote), or NULL
 * when it is not closed. *ret_plain: it holds no escape and only printable ASCII, so its bytes
 * are its value. */
const char *json_lex_string(const char *p, const char *end, bool *ret_plain);
/* The end of the value at p, without checking it: strings and nesting only. It stops at the
 * first ',', ']' or '}' outside the value; NULL when a string or a list is not closed. */
const char *json_lex_skip(const char *p, const char *end);
