#!/usr/bin/env python3
"""PyTorch peer of bench/kernels/bench_gemm.c: the same cases, timed with CUDA events (warm-up,
then the median of 20 or more runs), printed as CSV rows case,ms,bytes,flops.

8192^3: torch.matmul on row-major [m, k] x [k, n] in bf16, f16, f32 with TF32 allowed (tf32)
and disallowed (f32), f64 (cuBLAS's DGEMM, on the FP64 tensor cores), and torch._int_mm for
i8 -> i32. _int_mm reaches the int8 tensor cores
only with b k-contiguous (a column-major view, `b.t().contiguous().t()`, made outside the
timing): that is its row for gemm/i8 and for our trans_b case (b given as [n, k]); the row
`/torch_row_major_b` is _int_mm on the plain row-major b. 4096 GEMMs of 64^3: torch.bmm on
[4096, 64, 64] for both the batched and the strided case (one call in PyTorch either way), and
a Python loop of 4096 torch.matmul calls for the loop case; in bf16, f32 and f64."""
import torch
from peer_timing import header, row, median_ms


def operands(dtype, batch, m, n, k):
    lead = (batch,) if batch > 1 else ()
    if dtype == torch.int8:
        a = torch.randint(-128, 128, lead + (m, k), device="cuda", dtype=torch.int8)
        b = torch.randint(-128, 128, lead + (k, n), device="cuda", dtype=torch.int8)
    else:
        a = torch.rand(lead + (m, k), device="cuda", dtype=dtype) * 2 - 1
        b = torch.rand(lead + (k, n), device="cuda", dtype=dtype) * 2 - 1
    return a, b


def cost(dtype, batch, m, n, k):
    esize = torch.tensor([], dtype=dtype).element_size()
    out_size = 4 if dtype == torch.int8 else esize
    return batch * ((m * k + k * n) * esize + m * n * out_size), 2 * batch * m * n * k


def big_cases():
    n = 8192
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("f16", torch.float16, False),
                              ("tf32", torch.float32, True), ("f32", torch.float32, False),
                              ("f64", torch.float64, False), ("i8", torch.int8, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a, b = operands(dtype, 1, n, n, n)
        case = f"gemm/{name}/{n}x{n}x{n}"
        if dtype == torch.int8:
            b_cols = b.t().contiguous().t()
            ms = median_ms(lambda: torch._int_mm(a, b_cols))
            row(case, ms, *cost(dtype, 1, n, n, n))
            row(case + "/trans_b", ms, *cost(dtype, 1, n, n, n))
            row(case + "/torch_row_major_b", median_ms(lambda: torch._int_mm(a, b)),
                *cost(dtype, 1, n, n, n))
            del b_cols
        else:
            row(case, median_ms(lambda: torch.matmul(a, b)), *cost(dtype, 1, n, n, n))
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False


def small_cases():
    batch, s = 4096, 64
    for name, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32), ("f64", torch.float64)):
        a, b = operands(dtype, batch, s, s, s)
        nbytes, flops = cost(dtype, batch, s, s, s)
        prefix = f"gemm/{name}/{s}x{s}x{s}x{batch}"
        ms = median_ms(lambda: torch.bmm(a, b), iters=50)
        row(prefix + "/batched", ms, nbytes, flops)
        row(prefix + "/strided", ms, nbytes, flops)
        a_list, b_list = list(a.unbind(0)), list(b.unbind(0))

        def loop():
            for x, y in zip(a_list, b_list):
                torch.matmul(x, y)

        row(prefix + "/loop", median_ms(loop, warmup=2, iters=20), nbytes, flops)


def main():
    header()
    with torch.no_grad():
        big_cases()
        small_cases()


if __name__ == "__main__":
    main()
