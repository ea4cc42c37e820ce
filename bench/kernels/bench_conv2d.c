/* conv2d cases: the ResNet-50 3x3 layer (N=64, C=K=256, 14x14, pad 1) with the fused
 * bias + batchnorm + relu epilogue, in bf16 and f32, and a depthwise layer for the direct
 * kernel. bench/peer/torch_conv2d.py times the same work in PyTorch. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <string.h>

#include "bench.h"
#include "kernels/conv2d.h"

/* Fills `call` for x [n, c, h, w] and w [k, c / groups, r, r] with every epilogue vector [k]
 * in f32 when fused is set. */
static void conv_bench_call(op_call_t *call, dtype_t dt, int n, int c, int hw, int k, int r,
                            int groups, bool fused)
{
    memset(call, 0, sizeof *call);
    call->op = &op_conv2d;
    call->in[CONV2D_IN_X] = (tensor_desc_t){dt, 4, {n, c, hw, hw}};
    call->in[CONV2D_IN_W] = (tensor_desc_t){dt, 4, {k, c / groups, r, r}};
    call->has_in[CONV2D_IN_X] = call->has_in[CONV2D_IN_W] = true;
    for (int j = CONV2D_IN_BIAS; fused && j < CONV2D_N_INPUTS; j++) {
        call->in[j] = (tensor_desc_t){DTYPE_F32, 1, {k}};
        call->has_in[j] = true;
    }
}

void bench_conv2d(const op_cuda_ctx_t *ctx)
{
    static const struct {
        const char *name;
        dtype_t dt;
        bool fused;
    } resnet[] = {
        {"conv2d/bf16/resnet50_3x3_n64_c256_14x14/bias_bn_relu", DTYPE_BF16, true},
        {"conv2d/bf16/resnet50_3x3_n64_c256_14x14/conv_only", DTYPE_BF16, false},
        {"conv2d/f32/resnet50_3x3_n64_c256_14x14/bias_bn_relu", DTYPE_F32, true},
        {"conv2d/f32/resnet50_3x3_n64_c256_14x14/conv_only", DTYPE_F32, false},
    };
    op_call_t call;
    for (size_t i = 0; i < sizeof resnet / sizeof resnet[0]; i++) {
        conv_bench_call(&call, resnet[i].dt, 64, 256, 14, 256, 3, 1, resnet[i].fused);
        bench_op(ctx, resnet[i].name, &call,
                 resnet[i].fused ? "{\"padding\": 1, \"epilogue\": [\"bias\", \"batchnorm\", "
                                   "\"relu\"]}"
                                 : "{\"padding\": 1}",
                 1, 50);
    }
    conv_bench_call(&call, DTYPE_BF16, 64, 512, 14, 512, 3, 512, true);
    bench_op(ctx, "conv2d/bf16/depthwise_3x3_n64_c512_14x14/bias_bn_relu", &call,
             "{\"padding\": 1, \"groups\": 512, \"epilogue\": [\"bias\", \"batchnorm\", "
             "\"relu\"]}",
             1, 50);
    /* The batched form: 8 calls of a small layer in one run_cuda. */
    conv_bench_call(&call, DTYPE_BF16, 8, 128, 28, 128, 3, 1, true);
    bench_op(ctx, "conv2d/bf16/batch8_3x3_n8_c128_28x28/bias_bn_relu", &call,
             "{\"padding\": 1, \"epilogue\": [\"bias\", \"batchnorm\", \"relu\"]}", 8, 50);
}
