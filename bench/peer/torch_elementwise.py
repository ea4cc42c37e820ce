#!/usr/bin/env python3
"""PyTorch peer of bench/kernels/bench_elementwise.c: the same cases on 1 GiB of x, timed with
CUDA events (warm-up, then the median of 30 runs), printed as CSV rows case,ms,bytes,flops.
f32, bf16 and f64 (the arithmetic and the reductions) as bench_elementwise.c runs them.

Each row carries the byte and flop counts of our op's cost for the same work, so bytes/ms is
comparable across the two tables. Elementwise results go to preallocated outputs (out=) so
that PyTorch is timed on its kernels, not its allocator. quantize is the plain expression a
user would write, scale included; dequantize is q.float() * s. The row
ceiling/copy/1GiB/torch_copy is PyTorch's own device copy, a second view of the ceiling."""
import torch
import peer_timing
from peer_timing import header, row

GIB = 1 << 30
WARMUP = 3
ITERS = 30


def median_ms(fn, warmup=WARMUP, iters=ITERS):
    return peer_timing.median_ms(fn, warmup=warmup, iters=iters)


def rand(n, dtype, lo=-1.0, hi=1.0):
    return (torch.rand(n, device="cuda", dtype=torch.float32) * (hi - lo) + lo).to(dtype)


def main():
    header()
    torch.manual_seed(1234)
    src = torch.empty(GIB, device="cuda", dtype=torch.uint8).random_()
    dst = torch.empty_like(src)
    row("ceiling/copy/1GiB/torch_copy", median_ms(lambda: dst.copy_(src)), 2 * GIB, 0)
    del src, dst

    n = GIB // 4
    x, y, out = rand(n, torch.float32), rand(n, torch.float32), torch.empty(n, device="cuda")
    row("add/f32/1GiB", median_ms(lambda: torch.add(x, y, out=out)), 3 * GIB, n)
    row("mul/f32/1GiB", median_ms(lambda: torch.mul(x, y, out=out)), 3 * GIB, n)
    row("saxpy/f32/1GiB", median_ms(lambda: torch.add(y, x, alpha=2.5, out=out)), 3 * GIB, 2 * n)
    row("sum/f32/1GiB", median_ms(lambda: torch.sum(x)), GIB + 4, n)
    row("dot/f32/1GiB", median_ms(lambda: torch.dot(x, y)), 2 * GIB + 4, 2 * n)
    del y, out

    # quantize per tensor, scale computed: the max pass and the quantize pass, as ours counts.
    x = rand(n, torch.float32, -3.0, 3.0)

    def quantize():
        s = x.abs().max() / 127
        return torch.clamp(torch.round(x / s), -127, 127).to(torch.int8)

    row("quantize/f32/1GiB", median_ms(quantize), 2 * GIB + n + 4, 3 * n)
    del x
    torch.cuda.empty_cache()

    nb = GIB // 2
    xb, yb = rand(nb, torch.bfloat16), rand(nb, torch.bfloat16)
    outb = torch.empty(nb, device="cuda", dtype=torch.bfloat16)
    row("add/bf16/1GiB", median_ms(lambda: torch.add(xb, yb, out=outb)), 3 * GIB, nb)
    del xb, yb, outb
    torch.cuda.empty_cache()

    q = torch.randint(-127, 128, (GIB,), device="cuda", dtype=torch.int8)
    s = torch.tensor(0.05, device="cuda")
    row("dequantize/i8/1GiB", median_ms(lambda: q.float() * s), 5 * GIB + 4, GIB)
    del q, s
    torch.cuda.empty_cache()

    n8 = GIB // 8
    xd, yd = rand(n8, torch.float64), rand(n8, torch.float64)
    outd = torch.empty(n8, device="cuda", dtype=torch.float64)
    row("add/f64/1GiB", median_ms(lambda: torch.add(xd, yd, out=outd)), 3 * GIB, n8)
    row("mul/f64/1GiB", median_ms(lambda: torch.mul(xd, yd, out=outd)), 3 * GIB, n8)
    row("saxpy/f64/1GiB", median_ms(lambda: torch.add(yd, xd, alpha=2.5, out=outd)), 3 * GIB,
        2 * n8)
    row("sum/f64/1GiB", median_ms(lambda: torch.sum(xd)), GIB + 8, n8)
    row("dot/f64/1GiB", median_ms(lambda: torch.dot(xd, yd)), 2 * GIB + 8, 2 * n8)


if __name__ == "__main__":
    main()
