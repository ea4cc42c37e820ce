/* Tensors on the wire: inline JSON `data` lists, base64 text, NumPy .npy files and raw bytes.
 *
 * Everything here is pure: no HTTP, no store. Functions return 0 or a negative errno (-EINVAL
 * for malformed input, -E2BIG when a tensor exceeds the byte limit, -EOVERFLOW when its size
 * does not fit in 64 bits, -ENOTSUP for a dtype a format cannot express, -ENOMEM) and on
 * failure fill *err with the field path and a message meant for the user. */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/op.h"

/* Parses `dtype` (a name) and `shape` (a list of at most TENSOR_MAX_DIMS non-negative
 * integers) into a descriptor checked against max_bytes. prefix names the tensor in errors
 * ("inputs.x"): the error field is "<prefix>.dtype" or "<prefix>.shape". */
int codec_desc_from_json(const json_t *dtype, const json_t *shape, const char *prefix,
                         uint64_t max_bytes, tensor_desc_t *ret, op_error_t *err);

/* Parses a shape written as comma-separated sizes ("2,3"; "" is a scalar), from a query
 * string: sets ret->ndim and ret->shape, leaving ret->dtype as it was. */
int codec_shape_parse_csv(const char *text, tensor_desc_t *ret, op_error_t *err);

/* Converts inline data into a new malloc'd block of the descriptor's bytes. `data` is either a
 * flat list of numel numbers or lists nested exactly like the shape (a scalar may also be a
 * bare number). Integer dtypes take only integers within their range; float dtypes take
 * numbers (and the strings "nan", "inf", "-inf") that are finite in the dtype unless given
 * as infinite. field is the path of `data` itself ("inputs.x.data"). */
int codec_data_from_json(const json_t *data, const tensor_desc_t *d, const char *field,
                         void **ret_data, op_error_t *err);
/* The same from the JSON text of data, which must be valid JSON (json_scan() checks the data
 * it cuts out of a body): read straight into the typed block, one number at a time. */
int codec_data_from_text(const char *text, size_t len, const tensor_desc_t *d, const char *field,
                         void **ret_data, op_error_t *err);
/* The tensor's elements as the text of a flat JSON list: 0 and a new malloc'd NUL-terminated
 * text and its length, or -ENOMEM. Integers are exact; floats are the shortest text that reads
 * back to the same value of their dtype (an f32 0.2 is "0.2"), and the non-finite ones, which
 * JSON lacks, the strings "nan", "inf" and "-inf". */
int codec_data_to_text(const tensor_desc_t *d, const void *data, char **ret_text, size_t *ret_len);
/* The same list as a raw node (json_write.h) for an answer: a new reference, NULL on
 * allocation failure. No json_t is made per element; json_write() writes the text as it is. */
json_t *codec_data_to_json(const tensor_desc_t *d, const void *data);

/* Standard base64 with padding. decode: a new malloc'd block and its length; -EINVAL naming
 * the offending character position in err. */
int codec_b64_decode(const char *text, size_t len, void **ret_data, size_t *ret_len,
                     op_error_t *err);

/* Parses a .npy file (versions 1.0, 2.0, 3.0; little-endian f4, f2, f8, i1, i4, u4, i8; C
 * order only) held in memory. On success the descriptor, checked against max_bytes, and the
 * offset of the data, whose length is exactly the descriptor's bytes. */
int codec_npy_parse(const void *file, size_t len, uint64_t max_bytes, tensor_desc_t *ret_desc,
                    size_t *ret_data_offset, op_error_t *err);
/* The same in two steps, for a file whose data is elsewhere (streamed to disk): the header,
 * from the first len bytes (at least up to the data), then the data's length. */
int codec_npy_parse_header(const void *file, size_t len, uint64_t max_bytes,
                           tensor_desc_t *ret_desc, size_t *ret_data_offset, op_error_t *err);
int codec_npy_check_data_bytes(const tensor_desc_t *d, uint64_t have, op_error_t *err);
/* Where the data of a .npy file starts, from its first len bytes: 0; -EAGAIN when len is too
 * short to tell; -EINVAL when they are not the start of a .npy file. */
int codec_npy_data_offset(const void *file, size_t len, size_t *ret_offset);
/* Writes a .npy v1.0 file (a new malloc'd block) of a tensor. -ENOTSUP for bf16. */
int codec_npy_write(const tensor_desc_t *d, const void *data, void **ret_file, size_t *ret_len);
