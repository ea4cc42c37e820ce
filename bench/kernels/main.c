/* bench/kernels: usage: bench_kernels [FAMILY...] (default: all). Prints CSV rows. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "support/gpu_support.h"

/* Weak while op families land one by one: a family not linked is skipped. */
#pragma weak bench_elementwise
#pragma weak bench_sort
#pragma weak bench_gemm
#pragma weak bench_conv2d

static const struct {
    const char *name;
    void (*run)(const op_cuda_ctx_t *ctx);
} families[] = {
    {"elementwise", bench_elementwise},
    {"sort", bench_sort},
    {"gemm", bench_gemm},
    {"conv2d", bench_conv2d},
};

int main(int argc, char **argv)
{
    op_cuda_ctx_t *ctx = gpu_ctx_new();
    printf("case,ms,bytes,flops\n");
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        int wanted = argc < 2;
        for (int a = 1; a < argc; a++)
            wanted |= strcmp(argv[a], families[f].name) == 0;
        if (wanted && families[f].run)
            families[f].run(ctx);
    }
    gpu_ctx_free(ctx);
    return 0;
}
