/* A job's input bytes that are not in memory, read the same way by both backends: an uploaded
 * buffer's, checked to be the size of the tensor that names it, or a stored blob's. Private to
 * daemon/exec/. */
#pragma once

#include <stddef.h>

#include "executor.h"

/* The buffer that input t names, checked to hold exactly t's bytes; a new buffer_t in *ret.
 * For a backend that may keep a buffer's bytes elsewhere (the CUDA backend's device copies).
 * 0, or a negative errno with why (a sentence naming the input) written. */
int exec_input_buffer_get(const exec_blob_reader_t *blobs, void *rd, const job_tensor_t *t,
                          buffer_t **ret, char *why, size_t why_size);

/* Moves buf's bytes, read from its blob where they are not in memory, into t->data; buf stays
 * the caller's. 0, or a negative errno with why written. */
int exec_input_take_buffer(const exec_blob_reader_t *blobs, void *rd, job_tensor_t *t,
                           buffer_t *buf, char *why, size_t why_size);

/* Reads the bytes of input t, which are not in memory, into t->data: its buffer's or its
 * blob's. 0, or a negative errno with why written. */
int exec_input_load(const exec_blob_reader_t *blobs, void *rd, job_tensor_t *t, char *why,
                    size_t why_size);
