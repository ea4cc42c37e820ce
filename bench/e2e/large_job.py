#!/usr/bin/env python3
"""A large job through gpujobd (standard library only): what the daemon adds to the kernel,
and how fast a large buffer uploads.

    large_job.py URL [--bytes 1073741824] [--jobs 20] [--json FILE]

Uploads two f32 buffers of --bytes each as resident (POST /v1/buffers, raw bytes), timing
each upload from the first byte sent to the 201. Then runs --jobs `dot` jobs on the two, one
after another (after two warm-ups), each timed at the client from its POST to the /wait
answer that says it is done. The daemon's overhead for a job is that end-to-end time minus
its gpu_ms (the daemon's CUDA-event time of the launch); its output is one f32, so nothing
large moves after the upload. For scale, the same connection's floor is reported too: two
GET /healthz round trips, the HTTP cost of a submit and a wait that do nothing. The daemon
must take bodies of --bytes (--set limits.max_body_bytes=2GiB for 1 GiB)."""
import argparse
import json
import sys
import time

from common import Client, percentile, time_us, write_json

WARMUP = 2


def upload(client, data):
    """Uploads data as a resident f32 buffer; returns its id and the seconds it took."""
    t = time.perf_counter()
    buf = client.request("POST", f"/v1/buffers?dtype=f32&shape={len(data) // 4}&resident=true",
                         data, "application/octet-stream")
    return buf, time.perf_counter() - t


def timed_job(client, job_text):
    """One job's end-to-end microseconds at the client and its final JSON."""
    t = time.perf_counter()
    job = client.wait(client.submit(job_text)["id"])
    return (time.perf_counter() - t) * 1e6, job


def run(url, nbytes, jobs):
    client = Client(url)
    data = b"\x00\x00\x80\x3f" * (nbytes // 4)  # 1.0f, little-endian
    bufs, upload_s = [], []
    for _ in range(2):
        buf, s = upload(client, data)
        bufs.append(buf)
        upload_s.append(s)
    del data
    job_text = json.dumps({"op": "dot", "inputs": {"x": {"buffer": bufs[0]["id"]},
                                                   "y": {"buffer": bufs[1]["id"]}}})
    for _ in range(WARMUP):
        timed_job(client, job_text)
    e2e_us, gpu_us, server_us, value = [], [], [], None
    for _ in range(jobs):
        us, job = timed_job(client, job_text)
        if job["state"] != "succeeded":
            raise RuntimeError(f"dot job {job['id']} {job['state']}: {job['error']}")
        e2e_us.append(us)
        gpu_us.append((job["gpu_ms"] or 0) * 1e3)
        server_us.append(time_us(job["finished_at"]) - time_us(job["created_at"]))
        value = job["outputs"]["out"].get("data")
    floor_us = []
    for _ in range(jobs):
        t = time.perf_counter()
        client.request("GET", "/healthz")
        client.request("GET", "/healthz")
        floor_us.append((time.perf_counter() - t) * 1e6)
    for buf in bufs:
        client.request("DELETE", f"/v1/buffers/{buf['id']}")
    return {
        "bytes": nbytes,
        "resident_device": bufs[0].get("device"),
        "upload_s": upload_s,
        "upload_gbps": [nbytes / s / 1e9 for s in upload_s],
        "jobs": jobs,
        "e2e_us_p50": percentile(e2e_us, 0.5),
        "gpu_us_p50": percentile(gpu_us, 0.5),
        "overhead_us_p50": percentile([e - g for e, g in zip(e2e_us, gpu_us)], 0.5),
        "server_overhead_us_p50": percentile([s - g for s, g in zip(server_us, gpu_us)], 0.5),
        "http_floor_us_p50": percentile(floor_us, 0.5),
        "dot_value": value,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    r = run(args.url, args.bytes, args.jobs)
    write_json(args.json, r)
    print(f"large job: upload {max(r['upload_gbps']):.2f} GB/s, overhead p50 "
          f"{r['overhead_us_p50']:.0f} us over {r['gpu_us_p50']:.0f} us of kernel",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
