#!/usr/bin/env python3
"""The host-to-device ceiling that a buffer upload is held against: PyTorch copying --bytes
from pinned host memory to cuda:0, timed with CUDA events (warm-ups, then the median of
--runs), in GB/s (1e9 bytes). Pageable memory's rate is given too, for scale.

    pcie_ceiling.py [--bytes 1073741824] [--runs 10] [--json FILE]

Without PyTorch or a CUDA device it records {"skipped": why} and exits 0, so that the rest
of bench/e2e/run.sh goes on."""
import argparse
import sys

from common import write_json

WARMUP = 2


def median_h2d_ms(torch, src, runs):
    dst = torch.empty_like(src, device="cuda:0")
    times = []
    for i in range(WARMUP + runs):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        stop.record()
        stop.synchronize()
        if i >= WARMUP:
            times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def measure(nbytes, runs):
    try:
        import torch
    except ImportError as e:
        return {"skipped": f"no PyTorch ({e})"}
    if not torch.cuda.is_available():
        return {"skipped": "PyTorch sees no CUDA device"}
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(1)
    pageable = torch.ones(nbytes, dtype=torch.uint8)
    pinned_ms = median_h2d_ms(torch, pinned, runs)
    pageable_ms = median_h2d_ms(torch, pageable, runs)
    return {
        "bytes": nbytes,
        "device": torch.cuda.get_device_name(0),
        "pinned_h2d_gbps": nbytes / pinned_ms / 1e6,
        "pageable_h2d_gbps": nbytes / pageable_ms / 1e6,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    r = measure(args.bytes, args.runs)
    write_json(args.json, r)
    print("pcie ceiling: " + (f"skipped: {r['skipped']}" if "skipped" in r else
                              f"pinned H2D {r['pinned_h2d_gbps']:.1f} GB/s"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
