/* The .npy parser (api/tensor_codec.h) on arbitrary files, whole and in two steps as streamed
 * uploads use it. The two ways must agree; an accepted file's data must be exactly the rest
 * of it, its descriptor must pass the 128-bit size check, and writing the tensor back as .npy
 * must parse to the same descriptor. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/tensor_codec.h"
#include "fuzz_check.h"

static void check_rewrite(const tensor_desc_t *d, const uint8_t *data)
{
    void *file;
    size_t len;
    if (codec_npy_write(d, data, &file, &len) != 0) return; /* bf16 has no .npy dtype */
    tensor_desc_t back;
    size_t offset;
    op_error_t err;
    if (codec_npy_parse(file, len, UINT64_MAX, &back, &offset, &err) != 0) __builtin_trap();
    if (!tensor_desc_equal(&back, d) || memcmp((char *)file + offset, data, len - offset) != 0)
        __builtin_trap();
    free(file);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t max_bytes = 1 << 20;
    tensor_desc_t d, head;
    size_t offset, head_offset, start;
    op_error_t err;
    int r = codec_npy_parse(data, size, max_bytes, &d, &offset, &err);
    int rh = codec_npy_parse_header(data, size, max_bytes, &head, &head_offset, &err);
    int ro = codec_npy_data_offset(data, size, &start);
    if (r == 0) {
        fuzz_check_desc(&d);
        if (offset > size || size - offset != tensor_desc_bytes(&d)) __builtin_trap();
        /* The whole-file parse is the header parse plus the data length check. */
        if (rh != 0 || head_offset != offset || !tensor_desc_equal(&head, &d)) __builtin_trap();
        if (ro != 0 || start != offset) __builtin_trap();
        if (codec_npy_check_data_bytes(&head, size - offset, &err) != 0) __builtin_trap();
        check_rewrite(&d, data + offset);
    }
    if (rh == 0) {
        fuzz_check_desc(&head);
        if (head_offset > size || ro != 0 || start != head_offset) __builtin_trap();
    }
    if (r != 0 && r != -EINVAL && r != -E2BIG && r != -EOVERFLOW && r != -ENOTSUP && r != -ENOMEM)
        __builtin_trap();
    return 0;
}
