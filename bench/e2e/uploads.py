#!/usr/bin/env python3
"""Large uploads beside the ceilings that bound them, measured in the same run (standard library
and curl only):

    uploads.py URL --sink BIN --state-dir DIR --json FILE [--bytes N] [--runs 2]

  disk       dd bs=1M conv=fsync of --bytes into a file in --state-dir's filesystem (the
             daemon's state dir): the disk's synced write rate, the ceiling of a durable upload;
  loopback   curl -T of the same bytes to bench_http_sink (BIN), a C server that reads the body
             and drops it: the loopback HTTP ceiling for this client;
  durable    POST /v1/buffers (raw f32), whose 201 means the bytes are on disk;
  resident   the same with ?resident=true (on disk, then loaded into device memory);
  ephemeral  ?resident=true&durable=false: into device memory only, never to disk.
Every upload is the same curl command (Expect: off; without curl, the same request from Python
with sendfile), the source file in /dev/shm when it has room, else beside the state dir, read
from the page cache; each row runs --runs times and keeps
every rate, the best counting. A row the daemon refuses (for example 400 for durable=false
where it does not know the parameter) is written as skipped with the daemon's answer. Writes
FILE (JSON) for report.py, with STEP_skipped (why) for a step that could not run; the exit
status is 0 either way."""
import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from common import http_sink

ROWS = (("durable", ""), ("resident", "&resident=true"),
        ("ephemeral", "&resident=true&durable=false"))


def source_file(nbytes, state_dir):
    """A file of nbytes zeros where reading it costs least: /dev/shm when it has twice the room."""
    where = "/dev/shm" if shutil.disk_usage("/dev/shm").free > 2 * nbytes else state_dir
    path = os.path.join(where, f"gpujobd-upload-{os.getpid()}.bin")
    chunk = bytes(1 << 20)
    with open(path, "wb") as f:
        for _ in range(nbytes >> 20):
            f.write(chunk)
        f.write(bytes(nbytes & ((1 << 20) - 1)))
    return path


def disk_rate(nbytes, state_dir):
    """GB/s of dd writing nbytes and fsyncing them in state_dir's filesystem."""
    path = os.path.join(state_dir, "dd-ceiling.bin")
    t0 = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={nbytes >> 20}",
                    "conv=fsync"], check=True, capture_output=True, timeout=600)
    seconds = time.monotonic() - t0
    os.unlink(path)
    return (nbytes >> 20 << 20) / seconds / 1e9


def curl_upload(url, src):
    """(HTTP status, seconds, answer text) of one curl -T of src to url; without curl, the same
    request from Python, its body sent with sendfile (no copy through the client)."""
    if not shutil.which("curl"):
        return socket_upload(url, src)
    p = subprocess.run(["curl", "-s", "-X", "POST", "-T", src, "-H", "Expect:",
                        "-H", "Content-Type: application/octet-stream",
                        "-w", "\n%{http_code} %{time_total}", url],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"curl exit {p.returncode}: {p.stderr.strip()}")
    text, _, tail = p.stdout.rpartition("\n")
    status, seconds = tail.split()
    return int(status), float(seconds), text


def socket_upload(url, src):
    u = urllib.parse.urlsplit(url)
    target = u.path + ("?" + u.query if u.query else "")
    size = os.path.getsize(src)
    t0 = time.monotonic()
    with socket.create_connection((u.hostname, u.port), timeout=600) as sock, \
            open(src, "rb") as f:
        sock.sendall((f"POST {target} HTTP/1.1\r\nHost: {u.netloc}\r\n"
                      f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n"
                      f"Connection: close\r\n\r\n").encode())
        sock.sendfile(f)
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        text = resp.read().decode(errors="replace")
    return resp.status, time.monotonic() - t0, text


def delete_buffer(url, answer):
    try:
        buf = json.loads(answer)["id"]
        urllib.request.urlopen(urllib.request.Request(f"{url}/v1/buffers/{buf}",
                                                      method="DELETE"), timeout=60).read()
    except (OSError, ValueError, KeyError):
        pass  # the daemon stops at the end of the part, and its state dir goes with it


def sink_rates(sink_bin, src, nbytes, runs):
    with http_sink(sink_bin) as (sink, _):
        rates = []
        for _ in range(runs):
            status, seconds, text = curl_upload(sink + "/sink", src)
            if status != 200:
                raise RuntimeError(f"bench_http_sink answered {status}: {text[:200]}")
            rates.append(nbytes / seconds / 1e9)
        return rates


def status_mib(pid, field):
    """A field of /proc/PID/status ("VmHWM": the peak RSS, "VmRSS") in MiB; None without one."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except (OSError, TypeError, ValueError):
        pass
    return None


def upload_rows(url, src, nbytes, runs, pid=None):
    rows = {}
    for name, query in ROWS:
        rates, row = [], {"query": query.lstrip("&")}
        for _ in range(runs):
            status, seconds, text = curl_upload(
                f"{url}/v1/buffers?dtype=f32&shape={nbytes // 4}{query}", src)
            if status != 201:
                row["skipped"] = f"HTTP {status}: {text.strip()[:300]}"
                break
            answer = json.loads(text)
            if name == "ephemeral" and answer.get("durable") is not False:
                row["note"] = "the answer does not say durable: false"
            if name != "durable" and answer.get("resident") is not True:
                row["note"] = "the answer does not say resident: true"
            rates.append(nbytes / seconds / 1e9)
            delete_buffer(url, text)
        row["gbps"] = rates
        if pid:
            row["peak_rss_mib"] = status_mib(pid, "VmHWM")
        rows[name] = row
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--sink", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--pid", type=int, help="the daemon's, for its peak RSS after each row")
    args = parser.parse_args()
    result = {"bytes": args.bytes, "runs": args.runs}
    if args.pid:
        result["rss_start_mib"] = status_mib(args.pid, "VmRSS")
    src = source_file(args.bytes, args.state_dir)
    result["source_dir"] = os.path.dirname(src)
    result["client"] = "curl -T" if shutil.which("curl") else "Python with sendfile"
    steps = (("disk_gbps", lambda: [disk_rate(args.bytes, args.state_dir)
                                    for _ in range(args.runs)]),
             ("loopback_gbps", lambda: sink_rates(args.sink, src, args.bytes, args.runs)),
             ("rows", lambda: upload_rows(args.url.rstrip("/"), src, args.bytes, args.runs,
                                            args.pid)))
    try:
        for key, step in steps:
            try:
                result[key] = step()
            except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
                result[key + "_skipped"] = f"{type(e).__name__}: {e}"
            print(f"uploads: {key}: {result.get(key, result.get(key + '_skipped'))}",
                  file=sys.stderr)
    finally:
        os.unlink(src)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
