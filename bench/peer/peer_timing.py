"""Timing shared by the PyTorch peers of bench/kernels: CUDA events around each run (warm-up
first), the median in milliseconds, and rows printed as CSV `case,ms,bytes,flops`, the format
bench_kernels prints and bench/kernels/report.py joins."""
import torch


def median_ms(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def header():
    print("case,ms,bytes,flops", flush=True)


def row(name, ms, nbytes, flops=0):
    print(f"{name},{ms:.6f},{nbytes:.0f},{flops:.0f}", flush=True)
