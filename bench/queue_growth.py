#!/usr/bin/env python3
"""What a long queue costs the daemon: memory, submissions, reads and a restart, against the
number of queued jobs.

Starts gpujobd on the CPU backend with one worker ([scheduler] cpu_threads = 1) and the debug
ops, over TCP with [auth] mode = token and one token per user (made by `gpujobd token create`
before the start). Each user first submits a debug_sleep job of a minute at a high priority,
so that whichever user fair share serves first, the one worker runs a sleep and nothing else
leaves the queue. Then the users, in turn, submit arrays of one-element `add` jobs until the
queue holds --max jobs. At each checkpoint (--at) it prints the daemon's RSS, the time of the
array that reached it, the median time of a GET of one queued job and of a list of 100 queued
jobs, then kills the daemon with SIGKILL, starts it again on the same state directory and
measures the time from the start to a 200 from /readyz (and the RSS once ready).

Usage: bench/queue_growth.py --gpujobd build/daemon/gpujobd [--users 10] [--array 10000]
           [--at 0,100000,250000,500000,1000000] [--max 1000000] [--keep DIR]
Prints a Markdown table on stdout; progress on stderr.
"""
import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Daemon:
    def __init__(self, binary, state_dir, config):
        self.binary, self.state_dir, self.config = binary, state_dir, config
        self.proc = None
        self.port = None

    def start(self):
        """Starts the daemon; returns seconds from the start to a 200 from /readyz."""
        logf = open(os.path.join(self.state_dir, "..", "daemon.log"), "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [self.binary, "--config", self.config, "--listen", "127.0.0.1:0", "--state-dir",
             self.state_dir, "--backend", "cpu", "--log-level", "info"],
            stdout=logf, stderr=subprocess.STDOUT)
        logpath = os.path.join(self.state_dir, "..", "daemon.log")
        self.port = None
        while self.port is None:
            if self.proc.poll() is not None:
                raise SystemExit(f"gpujobd exited: see {logpath}")
            with open(logpath, "rb") as f:
                ports = re.findall(rb"http://127\.0\.0\.1:(\d+)", f.read())
            # The log is appended across starts: this start's port is the last one named.
            if ports and len(ports) > getattr(self, "_seen_ports", 0):
                self.port = int(ports[-1])
                self._seen_ports = len(ports)
            else:
                time.sleep(0.005)
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/readyz")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.005)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()


class Client:
    def __init__(self, daemon, token):
        self.daemon, self.token = daemon, token
        self.conn = None

    def request(self, method, path, body=None):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=600)
        headers = {"Authorization": "Bearer " + self.token}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=body, headers=headers)
            r = self.conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            self.conn = None
            raise
        if r.status >= 300:
            raise SystemExit(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data)

    def reset(self):
        self.conn = None


def timed(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpujobd", default="build/daemon/gpujobd")
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--array", type=int, default=10000)
    ap.add_argument("--at", default="0,100000,250000,500000,1000000")
    ap.add_argument("--max", type=int, default=None)
    ap.add_argument("--keep", default=None, help="work directory to use and keep")
    a = ap.parse_args()
    points = [int(x) for x in a.at.split(",")]
    top = a.max if a.max is not None else max(points)
    work = a.keep or tempfile.mkdtemp(prefix="gpujobd-queue-")
    state = os.path.join(work, "state")
    os.makedirs(state, exist_ok=True)
    config = os.path.join(work, "gpujobd.conf")
    per_user = -(-top // a.users) + 2 * a.array
    with open(config, "w") as f:
        f.write(f"""[auth]
mode = token
[debug]
test_ops = true
[scheduler]
cpu_threads = 1
[limits]
max_queued_per_user = {per_user}
max_jobs_per_request = {a.array}
""")
    tokens = []
    for u in range(a.users):
        out = subprocess.run([a.gpujobd, "token", "create", "--config", config, "--state-dir",
                              state, "--user", f"user{u}", "--name", "bench"],
                             check=True, capture_output=True, text=True).stdout
        tokens.append(out.strip().splitlines()[-1])
    d = Daemon(a.gpujobd, state, config)
    d.start()
    clients = [Client(d, t) for t in tokens]
    one = {"dtype": "f32", "shape": [1], "data": [1.0]}
    sleep = {"op": "debug_sleep", "params": {"ms": 60000}, "priority": 10,
             "inputs": {"x": {"dtype": "f32", "shape": [1], "data": [0.0]}}}
    for c in clients:
        c.request("POST", "/v1/jobs", json.dumps(sleep))
    body = json.dumps([{"op": "add", "inputs": {"x": one, "y": one}}] * a.array)
    queued, last_array_s, last_id, u = 0, float("nan"), None, 0
    rows = []
    for point in points:
        while queued < point:
            c = clients[u % a.users]
            t0 = time.perf_counter()
            ans = c.request("POST", "/v1/jobs", body)
            last_array_s = time.perf_counter() - t0
            last_id, u = ans["jobs"][-1]["id"] if "jobs" in ans else ans[-1]["id"], u + 1
            queued += a.array
            if queued % 100000 == 0:
                log(f"{queued} queued, last array {last_array_s:.3f} s, "
                    f"rss {rss_mib(d.proc.pid):.0f} MiB")
        c = clients[(u - 1) % a.users]
        if last_id is None:  # an empty queue: an array of its own, then its jobs are read
            t0 = time.perf_counter()
            ans = c.request("POST", "/v1/jobs", body)
            last_array_s = time.perf_counter() - t0
            last_id = ans["jobs"][-1]["id"] if "jobs" in ans else ans[-1]["id"]
            queued += a.array
            u += 1
        rss = rss_mib(d.proc.pid)
        get_s = timed(lambda: c.request("GET", f"/v1/jobs/{last_id}"), 21)
        list_s = timed(lambda: c.request("GET", "/v1/jobs?state=queued&limit=100"), 7)
        d.kill9()
        for cl in clients:
            cl.reset()
        ready_s = d.start()
        rss_after = rss_mib(d.proc.pid)
        row = (queued, rss, last_array_s, get_s, list_s, ready_s, rss_after)
        log("queued %d: rss %.0f MiB, array %.3f s, get %.2f ms, list %.2f ms, ready %.2f s, "
            "rss after restart %.0f MiB" % (row[0], row[1], row[2], row[3] * 1e3, row[4] * 1e3,
                                            row[5], row[6]))
        rows.append(row)
    d.stop()
    print("| queued jobs | RSS (MiB) | array of %d (s) | GET one (ms) | list of 100 (ms) | "
          "ready after kill -9 (s) | RSS after restart (MiB) |" % a.array)
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| %d | %.0f | %.3f | %.2f | %.2f | %.2f | %.0f |"
              % (r[0], r[1], r[2], r[3] * 1e3, r[4] * 1e3, r[5], r[6]))
    if len(rows) >= 2 and rows[-1][0] > rows[0][0]:
        per_job = (rows[-1][1] - rows[0][1]) * 1024 * 1024 / (rows[-1][0] - rows[0][0])
        print(f"\nRSS per queued job, first to last checkpoint: {per_job:.0f} bytes")


if __name__ == "__main__":
    main()
