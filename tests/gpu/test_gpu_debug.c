/* GPU test of the test-only op debug_sleep: out equals x bit for bit (aligned and odd sizes,
 * empty tensors), and the device time between CUDA events around run_cuda is at least
 * params.ms. debug_fault has no test here: its fault kills the context, which the daemon-level
 * recovery test covers. Exits 77 (skipped) without a GPU. */
#include <check.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/debug.h"
#include "support/gpu_support.h"
#include "support/op_test.h"
#include "support/run_suite.h"

static op_cuda_ctx_t *ctx;

typedef struct sleep_case {
    int ms;
    tensor_desc_t x;
} sleep_case_t;

START_TEST(test_debug_sleep_copies_x_and_spins_at_least_ms)
{
    op_table_enable_test_ops(true);
    const sleep_case_t cases[] = {
        {0, td(DTYPE_F32, 1000)},  {200, td(DTYPE_F32, 2, 3)},    {50, td(DTYPE_I8, 4097)},
        {20, td(DTYPE_F16, 0, 7)}, {0, td(DTYPE_F64, 300, 1000)},
    };
    cudaEvent_t start, stop;
    ck_assert_int_eq(cudaEventCreate(&start), cudaSuccess);
    ck_assert_int_eq(cudaEventCreate(&stop), cudaSuccess);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const sleep_case_t *c = &cases[k];
        char params[64];
        snprintf(params, sizeof params, "{\"ms\": %d}", c->ms);
        op_call_t call;
        op_test_validate_ok("debug_sleep", params, (const tensor_desc_t *[]){&c->x}, 1, &call);
        size_t bytes = tensor_desc_bytes(&c->x);
        unsigned char *x = malloc(bytes + 1), *out = malloc(bytes + 1);
        for (size_t i = 0; i < bytes; i++)
            x[i] = (unsigned char)(i * 131 + k);
        void *dx = gpu_alloc_poisoned(bytes), *dout = gpu_alloc_poisoned(bytes);
        gpu_upload(dx, x, bytes);

        const op_call_t *calls[1] = {&call};
        const void *const ins0[1] = {dx};
        void *const outs0[1] = {dout};
        const void *const *ins[1] = {ins0};
        void *const *outs[1] = {outs0};
        op_error_t err = {0};
        ck_assert_int_eq(cudaEventRecord(start, ctx->stream), cudaSuccess);
        int r = call.op->run_cuda(ctx, 1, calls, ins, outs, &err);
        ck_assert_msg(r == 0, "run_cuda gave %d: %s", r, err.message);
        ck_assert_int_eq(cudaEventRecord(stop, ctx->stream), cudaSuccess);
        gpu_sync(ctx);
        float elapsed = 0;
        ck_assert_int_eq(cudaEventElapsedTime(&elapsed, start, stop), cudaSuccess);
        printf("debug_sleep ms=%d on %zu bytes: %.3f ms of device time\n", c->ms, bytes, elapsed);
        ck_assert_msg(elapsed >= (float)c->ms, "case %zu: %.3f ms of device time, want >= %d", k,
                      elapsed, c->ms);
        ck_assert_msg(elapsed < (float)c->ms + 500, "case %zu: %.3f ms for a %d ms sleep", k,
                      elapsed, c->ms);

        gpu_download(out, dout, bytes);
        ck_assert_msg(bytes == 0 || memcmp(out, x, bytes) == 0, "case %zu: out differs from x", k);
        gpu_free(dx);
        gpu_free(dout);
        free(x);
        free(out);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
}
END_TEST

int main(void)
{
    /* Check's forked children cannot use a CUDA context made by their parent, so the tests run
     * in this process, on one context. */
    ctx = gpu_ctx_new();
    Suite *s = suite_create("gpu_debug");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_debug_sleep_copies_x_and_spins_at_least_ms);
    suite_add_tcase(s, tc);
    int status = run_suite_nofork(s);
    gpu_ctx_free(ctx);
    return status;
}
