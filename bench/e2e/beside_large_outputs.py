#!/usr/bin/env python3
"""Tiny jobs beside jobs with large outputs (standard library only).

    beside_large_outputs.py URL [--mib 256] [--seconds 6] [--json FILE]

Uploads two resident f32 buffers of --mib MiB each. One client then runs saxpy jobs on them
back to back (POST ?wait=), each writing a --mib MiB output to the daemon's disk, while another
client runs tiny saxpy jobs the same way, one at a time, for --seconds. Prints how many jobs of
each kind ended and the tiny jobs' p50 / p99 / max latency: what a user with small jobs sees
while another user's outputs are being stored on the same GPU."""
import argparse
import json
import sys
import threading
import time

from common import Client, percentile, tiny_job, write_json


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--json")
    args = parser.parse_args()
    client = Client(args.url)
    elements = args.mib << 18
    zeros = bytes(4 * elements)
    ids = [client.request("POST", f"/v1/buffers?dtype=f32&shape={elements}&resident=true", zeros,
                          "application/octet-stream")["id"] for _ in range(2)]
    large = json.dumps({"op": "saxpy", "params": {"a": 2.0},
                        "inputs": {"x": {"buffer": ids[0]}, "y": {"buffer": ids[1]}}})
    client.submit_wait(large)  # the buffers are in device memory from here on

    stop = time.monotonic() + args.seconds
    large_done = []

    def run_large():
        other = Client(args.url)
        while time.monotonic() < stop:
            other.submit_wait(large)
            large_done.append(1)

    thread = threading.Thread(target=run_large)
    thread.start()
    tiny = tiny_job()
    latency_ms = []
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        client.submit_wait(tiny)
        latency_ms.append((time.perf_counter() - t0) * 1e3)
    thread.join()
    for buffer_id in ids:
        client.request("DELETE", f"/v1/buffers/{buffer_id}")
    r = {
        "large_mib": args.mib,
        "large_jobs": len(large_done),
        "tiny_jobs": len(latency_ms),
        "tiny_ms_p50": percentile(latency_ms, 0.5),
        "tiny_ms_p99": percentile(latency_ms, 0.99),
        "tiny_ms_max": max(latency_ms),
    }
    write_json(args.json, r)
    print(f"beside {r['large_jobs']} jobs with {args.mib} MiB outputs: {r['tiny_jobs']} tiny jobs, "
          f"p50 {r['tiny_ms_p50']:.2f} ms, p99 {r['tiny_ms_p99']:.2f} ms, "
          f"max {r['tiny_ms_max']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
