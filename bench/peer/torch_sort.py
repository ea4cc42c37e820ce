#!/usr/bin/env python3
"""PyTorch peer of bench/kernels/bench_sort.c: the same cases, timed with CUDA events (warm-up,
then the median of 20 runs), printed as CSV rows case,ms,bytes,flops.

torch.sort always returns indices (int64) beside the sorted keys; the key-value case is
torch.sort of the keys followed by gathering the values with those indices, which is how
PyTorch code sorts pairs. u32 keys are torch.uint32 where this PyTorch sorts them, otherwise
int32 (the same bytes and radix passes; a note goes to stderr). For f64 keys one torch.sort is
the peer of both our keys-only sort and our argsort (keys and i64 indices, what torch.sort
returns)."""
import sys

import torch
from peer_timing import header, row, median_ms


def u32_keys(n):
    keys = torch.randint(-2**31, 2**31, (n,), device="cuda", dtype=torch.int32)
    try:
        as_u32 = keys.view(torch.uint32)
        torch.sort(as_u32[:16])
        return as_u32
    except (RuntimeError, TypeError, AttributeError) as e:
        print(f"torch_sort: uint32 sort unavailable ({e}); timing int32 keys", file=sys.stderr)
        return keys


def main():
    header()
    n = 1 << 28
    with torch.no_grad():
        keys = u32_keys(n)
        row("sort/u32/2^28", median_ms(lambda: torch.sort(keys)), 2 * 4 * n)
        values = u32_keys(n)

        def pairs():
            sorted_keys, idx = torch.sort(keys)
            return sorted_keys, values[idx]

        row("sort/u32-u32/2^28", median_ms(pairs), 4 * 4 * n)
        del keys, values
        fkeys = torch.rand(n, device="cuda", dtype=torch.float32) * 2 - 1
        row("sort/f32/2^28", median_ms(lambda: torch.sort(fkeys)), 2 * 4 * n)
        del fkeys
        rows = torch.rand(1000, 4096, device="cuda", dtype=torch.float32) * 2 - 1
        row("sort/f32/1000x4096", median_ms(lambda: torch.sort(rows, dim=-1)), 2 * 4 * rows.numel())
        del rows
        dkeys = torch.rand(n, device="cuda", dtype=torch.float64) * 2 - 1
        ms = median_ms(lambda: torch.sort(dkeys))
        row("sort/f64/2^28", ms, 2 * 8 * n)
        row("sort/f64/2^28/argsort", ms, 3 * 8 * n)
        del dkeys
        torch.cuda.empty_cache()
        drows = torch.rand(1000, 4096, device="cuda", dtype=torch.float64) * 2 - 1
        row("sort/f64/1000x4096", median_ms(lambda: torch.sort(drows, dim=-1)),
            2 * 8 * drows.numel())


if __name__ == "__main__":
    main()
