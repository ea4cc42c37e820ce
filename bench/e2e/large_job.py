#!/usr/bin/env python3
"""A large job through gpujobd (standard library only): what the daemon adds to the kernel,
and how fast a large buffer uploads.

    large_job.py URL [--bytes 1073741824] [--jobs 20] [--disk-dir DIR] [--json FILE]

Uploads two f32 buffers of --bytes each as resident (POST /v1/buffers, raw bytes), timing
each upload from the first byte sent to the 201. As the 201 waits for the bytes to be on disk,
the ceiling there is the disk: with --disk-dir (a directory on the daemon's state filesystem)
the same bytes are also written to a file there and fdatasync'd, timed the same way. The
daemon loads resident buffers into device memory once they are stored (or at their first job
at the latest): its own count of the bytes it loaded and the time that took (/v1/info, CUDA
backend), read after the first job, give its load rate. Then runs --jobs `dot` jobs on the two
each way, one after another (after two warm-ups), the two ways taking turns: a POST and then a
GET .../wait, each job timed at the client from its POST to the answer that says it is done;
and one POST /v1/jobs?wait=, which answers once the job is done. The daemon's overhead for a
job is that end-to-end time minus its gpu_ms (the daemon's CUDA-event time of the launch); its
output is one f32, so nothing large moves after the upload. For scale, the same connection's
floor is reported too: GET /healthz round trips (two, and one), the HTTP cost of requests
that do nothing. The daemon must take bodies of --bytes (--set limits.max_body_bytes=2GiB for
1 GiB)."""
import argparse
import json
import os
import sys
import tempfile
import time

from common import Client, percentile, time_us, write_json

WARMUP = 2


def upload(client, data):
    """Uploads data as a resident f32 buffer; returns its id and the seconds it took."""
    t = time.perf_counter()
    buf = client.request("POST", f"/v1/buffers?dtype=f32&shape={len(data) // 4}&resident=true",
                         data, "application/octet-stream")
    return buf, time.perf_counter() - t


def disk_write(directory, data):
    """Seconds to write data to a new file in directory and fdatasync it (then removed)."""
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        t = time.perf_counter()
        view = memoryview(data)
        while view:
            view = view[os.write(f.fileno(), view):]
        os.fdatasync(f.fileno())
        return time.perf_counter() - t


def device_loads(client):
    """Bytes the daemon loaded into device memory for resident buffers and the seconds it took,
    over its devices; None on a backend without devices."""
    devices = client.request("GET", "/v1/info")["backend"].get("devices")
    if not devices:
        return None
    return (sum(d.get("resident_loaded_bytes", 0) for d in devices),
            sum(d.get("resident_load_seconds", 0) for d in devices))


def timed_job(client, job_text, waited=False):
    """One job's end-to-end microseconds at the client and its final JSON: submitted and then
    waited for, or (waited) in one POST ...?wait=."""
    t = time.perf_counter()
    job = client.submit_wait(job_text) if waited else client.wait(client.submit(job_text)["id"])
    return (time.perf_counter() - t) * 1e6, job


def healthz_floor_us(client, round_trips):
    """Microseconds of round_trips GET /healthz requests."""
    t = time.perf_counter()
    for _ in range(round_trips):
        client.request("GET", "/healthz")
    return (time.perf_counter() - t) * 1e6


def overhead_p50(e2e_us, gpu_us):
    """The median of end-to-end minus kernel time over jobs."""
    return percentile([e - g for e, g in zip(e2e_us, gpu_us)], 0.5)


def run(url, nbytes, jobs, disk_dir):
    client = Client(url)
    loads_before = device_loads(client)
    data = b"\x00\x00\x80\x3f" * (nbytes // 4)  # 1.0f, little-endian
    bufs, upload_s = [], []
    for _ in range(2):
        buf, s = upload(client, data)
        bufs.append(buf)
        upload_s.append(s)
    disk_s = disk_write(disk_dir, data) if disk_dir else None
    del data
    job_text = json.dumps({"op": "dot", "inputs": {"x": {"buffer": bufs[0]["id"]},
                                                   "y": {"buffer": bufs[1]["id"]}}})
    first_job_us = timed_job(client, job_text)[0]
    loads_after = device_loads(client)
    load_bytes, load_s = (loads_after[0] - loads_before[0], loads_after[1] - loads_before[1]) \
        if loads_before else (0, 0)
    for _ in range(WARMUP - 1):
        timed_job(client, job_text)
        timed_job(client, job_text, waited=True)
    # Per way (False: submit then wait; True: one waited POST): end-to-end, gpu and server us.
    e2e_us, gpu_us, server_us = {False: [], True: []}, {False: [], True: []}, []
    value = None
    for _ in range(jobs):
        for waited in (False, True):
            us, job = timed_job(client, job_text, waited)
            if job["state"] != "succeeded":
                raise RuntimeError(f"dot job {job['id']} {job['state']}: {job['error']}")
            e2e_us[waited].append(us)
            gpu_us[waited].append((job["gpu_ms"] or 0) * 1e3)
            server_us.append(time_us(job["finished_at"]) - time_us(job["created_at"])
                             - gpu_us[waited][-1])
            value = job["outputs"]["out"].get("data")
    floor_us = [healthz_floor_us(client, 2) for _ in range(jobs)]
    waited_floor_us = [healthz_floor_us(client, 1) for _ in range(jobs)]
    for buf in bufs:
        client.request("DELETE", f"/v1/buffers/{buf['id']}")
    return {
        "bytes": nbytes,
        "resident_device": bufs[0].get("device"),
        "upload_s": upload_s,
        "upload_gbps": [nbytes / s / 1e9 for s in upload_s],
        "disk_write_gbps": nbytes / disk_s / 1e9 if disk_s else None,
        "first_job_us": first_job_us,
        "device_load_bytes": load_bytes,
        "device_load_gbps": load_bytes / load_s / 1e9 if load_s else None,
        "jobs": jobs,
        "e2e_us_p50": percentile(e2e_us[False], 0.5),
        "gpu_us_p50": percentile(gpu_us[False] + gpu_us[True], 0.5),
        "overhead_us_p50": overhead_p50(e2e_us[False], gpu_us[False]),
        "waited_e2e_us_p50": percentile(e2e_us[True], 0.5),
        "waited_overhead_us_p50": overhead_p50(e2e_us[True], gpu_us[True]),
        "server_overhead_us_p50": percentile(server_us, 0.5),
        "http_floor_us_p50": percentile(floor_us, 0.5),
        "waited_http_floor_us_p50": percentile(waited_floor_us, 0.5),
        "dot_value": value,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--disk-dir")
    parser.add_argument("--json")
    args = parser.parse_args()
    r = run(args.url, args.bytes, args.jobs, args.disk_dir)
    write_json(args.json, r)
    print(f"large job: upload {max(r['upload_gbps']):.2f} GB/s, overhead p50 "
          f"{r['overhead_us_p50']:.0f} us (submit, wait) / {r['waited_overhead_us_p50']:.0f} us "
          f"(POST ?wait=) over {r['gpu_us_p50']:.0f} us of kernel",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
