/* Base64 (api/tensor_codec.h): arbitrary text through the decoder, and arbitrary bytes
 * through the tests' reference encoder and back. What decodes must re-encode to text that decodes
 * to the same bytes, and every encoding must decode to what was encoded. */
#include <stdlib.h>
#include <string.h>

#include "api/tensor_codec.h"
#include "support/b64_ref.h"

static void roundtrip(const void *bytes, size_t len)
{
    char *text = b64_ref_encode(bytes, len);
    if (!text) __builtin_trap();
    void *back;
    size_t back_len;
    op_error_t err;
    if (codec_b64_decode(text, strlen(text), &back, &back_len, &err) != 0) __builtin_trap();
    if (back_len != len || (len && memcmp(back, bytes, len) != 0)) __builtin_trap();
    free(back);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void *decoded;
    size_t len;
    op_error_t err;
    if (codec_b64_decode((const char *)data, size, &decoded, &len, &err) == 0) {
        roundtrip(decoded, len);
        free(decoded);
    }
    roundtrip(data, size);
    return 0;
}
