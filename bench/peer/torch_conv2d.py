#!/usr/bin/env python3
"""PyTorch peer of bench/kernels/bench_conv2d.c: the same cases, timed with CUDA events
(warm-up, then the median of 50 runs), printed as CSV rows case,ms,bytes,flops.

The fused cases are eval-mode conv2d -> batch_norm -> relu, timed together (cuDNN underneath,
cudnn.benchmark on, NCHW tensors as given). Reference rows: torch_conv_only (the bare conv2d),
and for f32 torch_strict_fp32 (TF32 disabled: PyTorch's default lets cuDNN use TF32 for f32
convolutions, which would not meet our f32 accuracy bound of 1e-5)."""
import torch
import peer_timing
from peer_timing import header, row
import torch.nn.functional as F

torch.backends.cudnn.benchmark = True


def median_ms(fn, warmup=10, iters=50):
    return peer_timing.median_ms(fn, warmup=warmup, iters=iters)


def conv_case(prefix, dtype, n, c, hw, k, r, groups, pad):
    dev = "cuda"
    x = torch.rand(n, c, hw, hw, device=dev, dtype=dtype) * 2 - 1
    w = torch.rand(k, c // groups, r, r, device=dev, dtype=dtype) * 2 - 1
    bias = torch.rand(k, device=dev, dtype=dtype) * 2 - 1
    bn = [torch.rand(k, device=dev, dtype=dtype) * 2 - 1 for _ in range(3)]
    var = torch.rand(k, device=dev, dtype=dtype) + 0.5
    esize = x.element_size()
    p = (hw + 2 * pad - r) + 1
    out_numel = n * k * p * p
    macs = out_numel * (c // groups) * r * r
    nbytes = (x.numel() + w.numel() + out_numel) * esize + 5 * k * 4
    flops = 2 * macs + 4 * out_numel

    def fused():
        y = F.conv2d(x, w, bias, stride=1, padding=pad, groups=groups)
        y = F.batch_norm(y, bn[2], var, bn[0], bn[1], training=False, eps=1e-5)
        return F.relu(y)

    def conv_only():
        return F.conv2d(x, w, None, stride=1, padding=pad, groups=groups)

    with torch.no_grad():
        row(prefix + "/bias_bn_relu", median_ms(fused), nbytes, flops)
        row(prefix + "/torch_conv_only", median_ms(conv_only), nbytes - 5 * k * 4, 2 * macs)
        if dtype == torch.float32:
            tf32 = torch.backends.cudnn.allow_tf32
            torch.backends.cudnn.allow_tf32 = False
            row(prefix + "/torch_strict_fp32", median_ms(fused), nbytes, flops)
            torch.backends.cudnn.allow_tf32 = tf32


def main():
    header()
    conv_case("conv2d/bf16/resnet50_3x3_n64_c256_14x14", torch.bfloat16, 64, 256, 14, 256, 3, 1, 1)
    conv_case("conv2d/f32/resnet50_3x3_n64_c256_14x14", torch.float32, 64, 256, 14, 256, 3, 1, 1)
    conv_case("conv2d/bf16/depthwise_3x3_n64_c512_14x14", torch.bfloat16, 64, 512, 14, 512, 3, 512, 1)


if __name__ == "__main__":
    main()
