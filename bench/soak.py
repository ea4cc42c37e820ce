#!/usr/bin/env python3
"""A soak of gpujobd: a mixed load at a fixed fraction of the measured throughput for a long
time, checking every answer, the daemon's memory and its latency.

It starts the real daemon (build/daemon/gpujobd, or $GPUJOBD_BIN, or --bin) on a free port
with a temporary state directory and the CPU backend, or attaches to a running one (--url,
with --pid to sample its memory). Then:

1. Measure: --measure-s seconds of closed-loop scenarios (below) from --measure-clients
   threads, each starting its next scenario when the last one ended; the scenarios per second
   that gives is the measured throughput.
2. Soak: --duration seconds of an open-loop arrival of the same scenarios at --fraction of the
   measured throughput (a fixed schedule, not "when the last ended"), served by --clients
   threads. A scenario is one of: a job submitted with ?wait=; a job submitted, then waited
   with GET /v1/jobs/{id}/wait; a list of jobs submitted, then each waited; a job submitted
   with ?wait= whose output is then downloaded (JSON, raw or .npy); a debug_sleep job
   cancelled while queued or running; a read of the job list and /v1/usage. Jobs are saxpy,
   add, sum, dot, sort, gemm and quantize on small random JSON inputs; every finished job's
   outputs are checked against values computed here.
3. Every second: the daemon's resident memory (VmRSS in /proc/PID/status). Every --window-s
   seconds: the p50 and p99 of the scenarios' latencies (a scenario's start to its last
   answer) and of the single requests' latencies (long-polls excluded); and each route's
   p50 and p99 in the first window after warm-up and in the last, so that a route whose cost
   grows with the store shows. Arrivals still queued when the time is up are dropped.

Criteria (the exit status is 1 when one fails, 2 when the soak could not run at all):
- errors: zero. An error is any answer whose status is not the one api/openapi.yaml documents
  for that request (a 409 is accepted only for a cancel that lost the race with the job's end,
  which the job's state then confirms), a JSON body that does not parse, a job that ends other
  than succeeded (or cancelled, for a cancel), an output that differs from the python
  computation, a connection that fails, an error-level line in the daemon's log, and the
  daemon's exit status other than 0 on SIGTERM (when this script started it).
- memory: RSS at the end of the run (the median of the samples of the last --window-s
  seconds) at most --rss-growth (default 5%) above RSS after warm-up (the median of the
  samples of the --window-s seconds after the first --warmup fraction of the run, default
  20%). The report splits each sample into anonymous memory, mapped files and shared memory.
- latency stable: the windows after warm-up are split in an early and a late half; the median
  of the late half's scenario p99s is at most --p99-ratio (default 2) times the median of the
  early half's, plus --slack-ms (default 20 ms, below which a 2-core machine's scheduling
  noise dominates); the same for p50. This catches a queue or a cost that grows with time, not
  a slow machine: the absolute figures are only reported. With --latency report, the two
  latency criteria are reported and not asserted: for a test on a machine that other work
  shares (CI's short form), where the windows' latencies measure the neighbours as much as
  the daemon, and where performance is not what a test asserts.

Output: a Markdown report on stdout and, with --json PATH, the same as JSON. Python 3
standard library only.
"""

import argparse
import collections
import http.client
import json
import os
import queue
import random
import re
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

OPS = ("saxpy", "add", "sum", "dot", "sort", "gemm", "quantize")
# Scenario name -> weight in the mix.
MIX = {
    "submit_wait": 30,      # POST /v1/jobs?wait=
    "submit_then_wait": 20, # POST, then GET /v1/jobs/{id}/wait
    "list_then_wait": 15,   # POST [..], then GET .../wait for each
    "download": 15,         # POST ?wait=, then GET .../outputs/{name}
    "cancel": 12,           # debug_sleep, DELETE while queued or running
    "read": 8,              # GET /v1/jobs?limit=, GET /v1/usage
}
WAIT_S = 30  # every wait is bounded; a job still not final after it is an error


class SoakError(Exception):
    """One error: what was sent and what came back."""


# ---------------------------------------------------------------------------- jobs


def rnd_values(rng, n):
    """Small values exact in f32 (multiples of 1/8), so sums are exact too for small n."""
    return [rng.randint(-64, 64) / 8.0 for _ in range(n)]


def make_job(rng, op):
    """A job body and the function that checks its outputs (a dict name -> flat list)."""
    n = rng.randint(1, 32)
    if op in ("saxpy", "add", "dot"):
        x, y = rnd_values(rng, n), rnd_values(rng, n)
        inputs = {"x": tensor([n], x), "y": tensor([n], y)}
        if op == "saxpy":
            a = rng.randint(-8, 8) / 4.0
            return ({"op": op, "params": {"a": a}, "inputs": inputs},
                    expect_out([a * xi + yi for xi, yi in zip(x, y)]))
        if op == "add":
            return {"op": op, "inputs": inputs}, expect_out([xi + yi for xi, yi in zip(x, y)])
        return {"op": op, "inputs": inputs}, expect_out([sum(xi * yi for xi, yi in zip(x, y))])
    if op == "sum":
        x = rnd_values(rng, n)
        return {"op": op, "inputs": {"x": tensor([n], x)}}, expect_out([sum(x)])
    if op == "sort":
        x = rnd_values(rng, n)
        desc = rng.random() < 0.5
        return ({"op": op, "params": {"descending": desc}, "inputs": {"keys": tensor([n], x)}},
                expect_named("keys", sorted(x, reverse=desc)))
    if op == "gemm":
        m, k, nn = rng.randint(1, 8), rng.randint(1, 8), rng.randint(1, 8)
        a, b = rnd_values(rng, m * k), rnd_values(rng, k * nn)
        c = [sum(a[i * k + t] * b[t * nn + j] for t in range(k)) for i in range(m)
             for j in range(nn)]
        return ({"op": op, "inputs": {"a": tensor([m, k], a), "b": tensor([k, nn], b)}},
                expect_out(c))
    if op == "quantize":
        x = rnd_values(rng, n)
        return {"op": op, "inputs": {"x": tensor([n], x)}}, expect_quantized(x)
    raise ValueError(op)


def tensor(shape, data):
    return {"dtype": "f32", "shape": shape, "data": data}


def close(got, want):
    return len(got) == len(want) and all(
        abs(g - w) <= 1e-3 + 1e-4 * abs(w) for g, w in zip(got, want))


def expect_named(name, want):
    def check(outputs):
        got = outputs.get(name)
        if got is None or not close(got, want):
            raise SoakError(f"output {name}: {got!r}, expected {want!r}")
    return check


def expect_out(want):
    return expect_named("out", want)


def expect_quantized(x):
    """Symmetric int8: |q| <= 127 and q * scale within half a step (plus rounding) of x."""
    def check(outputs):
        q, scale = outputs.get("q"), outputs.get("scale")
        if q is None or scale is None or len(scale) != 1 or len(q) != len(x):
            raise SoakError(f"quantize outputs q={q!r} scale={scale!r} for x={x!r}")
        s = scale[0]
        for qi, xi in zip(q, x):
            if abs(qi) > 127 or abs(qi * s - xi) > s * 0.5 + 1e-5 + 1e-4 * abs(xi):
                raise SoakError(f"quantize q={q!r} scale={s!r} does not represent x={x!r}")
    return check


def flat(data):
    if isinstance(data, list):
        out = []
        for d in data:
            out.extend(flat(d))
        return out
    return [data]


def outputs_of(job):
    """name -> flat list of values, for the outputs given inline."""
    got = {}
    for name, out in (job.get("outputs") or {}).items():
        if isinstance(out, dict) and "data" in out:
            got[name] = [float(v) for v in flat(out["data"])]
    return got


# ------------------------------------------------------------------------------ http


class Client:
    """One keep-alive connection; every request is timed and its status checked."""

    def __init__(self, host, port, stats):
        self.host, self.port, self.stats = host, port, stats
        self.conn = None

    def request(self, method, path, body=None, expect=(200,), long_poll=False, raw=False):
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=WAIT_S + 30)
            t0 = time.monotonic()
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                payload = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError) as e:
                # The server may close an idle keep-alive connection between two requests;
                # one retry on a fresh connection tells that apart from a real failure. A
                # retried POST could submit twice, which the soak would not notice; only a
                # request that sent nothing is retried.
                self.close()
                if attempt == 0 and isinstance(e, http.client.RemoteDisconnected) and \
                        method == "GET":
                    continue
                raise SoakError(f"{method} {path}: connection failed: {e!r}")
            except OSError as e:
                self.close()
                raise SoakError(f"{method} {path}: connection failed: {e!r}")
            elapsed = time.monotonic() - t0
            break
        self.stats.request(elapsed, long_poll, method + " " + route_of(path))
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        if resp.status not in expect:
            raise SoakError(f"{method} {path}: status {resp.status}, expected {expect}: "
                            f"{payload[:300]!r}")
        if raw:
            return resp, payload
        try:
            return resp.status, json.loads(payload)
        except ValueError:
            raise SoakError(f"{method} {path}: body is not JSON: {payload[:300]!r}")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def route_of(path):
    """The route of a request path: ids become {id}, the query is dropped, ?wait= kept."""
    base, _, query = path.partition("?")
    base = re.sub(r"/v1/jobs/[^/]+", "/v1/jobs/{id}", base)
    base = re.sub(r"/outputs/[^/]+", "/outputs/{name}", base)
    return base + ("?wait=" if query.startswith("wait=") else "")


# ------------------------------------------------------------------------- scenarios


class Scenarios:
    def __init__(self, rng, cancel_ms):
        self.rng = rng
        self.cancel_ms = cancel_ms

    def pick(self):
        names = list(MIX)
        return self.rng.choices(names, weights=[MIX[n] for n in names])[0]

    def run(self, name, c):
        getattr(self, name)(c)

    def job(self):
        return make_job(self.rng, self.rng.choice(OPS))

    def finished(self, job, check, what):
        if job.get("state") != "succeeded":
            raise SoakError(f"{what}: job {job.get('id')} is {job.get('state')}, expected "
                            f"succeeded: {json.dumps(job.get('error'))}")
        check(outputs_of(job))

    def wait(self, c, job_id):
        _, job = c.request("GET", f"/v1/jobs/{job_id}/wait?timeout={WAIT_S}", long_poll=True)
        return job

    def submit_wait(self, c):
        body, check = self.job()
        _, job = c.request("POST", f"/v1/jobs?wait={WAIT_S}", body, expect=(201,),
                           long_poll=True)
        self.finished(job, check, "POST ?wait=")

    def submit_then_wait(self, c):
        body, check = self.job()
        _, job = c.request("POST", "/v1/jobs", body, expect=(201,))
        if job.get("state") not in ("queued", "running", "succeeded"):
            raise SoakError(f"POST: new job in state {job.get('state')}")
        self.finished(self.wait(c, job["id"]), check, "GET .../wait")

    def list_then_wait(self, c):
        jobs = [self.job() for _ in range(self.rng.randint(2, 8))]
        _, answer = c.request("POST", "/v1/jobs", [b for b, _ in jobs], expect=(201,))
        if not isinstance(answer, list) or len(answer) != len(jobs):
            raise SoakError(f"POST a list of {len(jobs)}: answer {str(answer)[:300]}")
        for (_, check), job in zip(jobs, answer):
            self.finished(self.wait(c, job["id"]), check, "a list's job")

    def download(self, c):
        body, check = self.job()
        _, job = c.request("POST", f"/v1/jobs?wait={WAIT_S}", body, expect=(201,),
                           long_poll=True)
        if job.get("state") != "succeeded":
            raise SoakError(f"POST ?wait= (download): job is {job.get('state')}")
        name = self.rng.choice(sorted(job.get("outputs") or {"none": 0}))
        fmt = self.rng.choice(("json", "raw", "npy"))
        path = f"/v1/jobs/{job['id']}/outputs/{name}?format={fmt}"
        if fmt == "json":
            _, out = c.request("GET", path)
            values = [float(v) for v in flat(out.get("data"))]
            dtype = out.get("dtype")
        else:
            resp, payload = c.request("GET", path, raw=True)
            if fmt == "raw":
                dtype = resp.getheader("X-Dtype")
            else:
                if not payload.startswith(b"\x93NUMPY"):
                    raise SoakError(f"GET {path}: not a .npy file: {payload[:16]!r}")
                hlen = struct.unpack_from("<H", payload, 8)[0]
                header = payload[10:10 + hlen].decode("latin-1")
                dtype = {"'<f4'": "f32", "'|i1'": "i8", "'<i8'": "i64"}.get(
                    (re.search(r"'descr': *('[^']*')", header) or [None, None])[1])
                payload = payload[10 + hlen:]
            fmt_char = {"f32": "f", "i8": "b", "i64": "q"}.get(dtype)
            if fmt_char is None:
                raise SoakError(f"GET {path}: unexpected dtype {dtype!r}")
            n = len(payload) // struct.calcsize(fmt_char)
            values = [float(v) for v in struct.unpack(f"<{n}{fmt_char}", payload)]
        inline = outputs_of(job)
        inline[name] = values
        check(inline)

    def cancel(self, c):
        """A debug_sleep job cancelled after a random delay: while queued (behind the load)
        or while running. 200 leaves it cancelled; 409 means it ended first (it must then be
        succeeded)."""
        ms = self.rng.randint(self.cancel_ms // 2, self.cancel_ms)
        body = {"op": "debug_sleep", "params": {"ms": ms},
                "inputs": {"x": tensor([2], [1.0, 2.0])}}
        _, job = c.request("POST", "/v1/jobs", body, expect=(201,))
        time.sleep(self.rng.uniform(0, ms / 1000.0))
        status, answer = c.request("DELETE", f"/v1/jobs/{job['id']}", expect=(200, 409))
        final = self.wait(c, job["id"])
        if status == 200:
            if answer.get("state") != "cancelled" or final.get("state") != "cancelled":
                raise SoakError(f"DELETE answered 200 with state {answer.get('state')}; the "
                                f"job then is {final.get('state')}")
            c.stats.count("cancelled_running" if answer.get("started_at") else
                          "cancelled_queued")
        else:
            if final.get("state") != "succeeded":
                raise SoakError(f"DELETE answered 409 but the job is {final.get('state')}")
            c.stats.count("cancel_lost_race")

    def read(self, c):
        _, page = c.request("GET", f"/v1/jobs?limit={self.rng.randint(1, 20)}")
        if not isinstance(page.get("jobs"), list) or "next" not in page:
            raise SoakError(f"GET /v1/jobs: {str(page)[:300]}")
        c.request("GET", "/v1/usage")


# ----------------------------------------------------------------------------- stats


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


class Stats:
    """Latencies by window, counts, errors; one lock for all."""

    def __init__(self, window_s):
        self.lock = threading.Lock()
        self.window_s = window_s
        self.t0 = time.monotonic()
        self.scen = collections.defaultdict(list)  # window -> scenario latencies (s)
        self.req = collections.defaultdict(list)   # window -> request latencies (s)
        self.by_kind = collections.defaultdict(list)  # (route, window) -> latencies (s)
        self.counts = collections.Counter()
        self.errors = []
        self.requests = 0

    def window(self):
        return int((time.monotonic() - self.t0) / self.window_s)

    def request(self, elapsed, long_poll, kind):
        with self.lock:
            self.requests += 1
            w = self.window()
            self.by_kind[(kind, w)].append(elapsed)
            if not long_poll:
                self.req[w].append(elapsed)

    def scenario(self, name, elapsed):
        with self.lock:
            self.scen[self.window()].append(elapsed)
            self.counts["scenario:" + name] += 1

    def count(self, what):
        with self.lock:
            self.counts[what] += 1

    def error(self, what):
        with self.lock:
            self.errors.append(what)


def run_one(scenarios, c, stats, name):
    t0 = time.monotonic()
    try:
        scenarios.run(name, c)
    except SoakError as e:
        stats.error(f"{name}: {e}")
        return
    except Exception as e:  # a malformed answer the checks did not foresee
        stats.error(f"{name}: {type(e).__name__}: {e}")
        return
    stats.scenario(name, time.monotonic() - t0)


# ------------------------------------------------------------------------------ phases


def measure(host, port, args):
    """Closed loop: each thread starts its next scenario when its last one ended."""
    stats = Stats(args.measure_s + 1)
    stop = time.monotonic() + args.measure_s
    done = [0] * args.measure_clients

    def worker(i):
        c = Client(host, port, stats)
        sc = Scenarios(random.Random(args.seed * 1000 + i), args.cancel_ms)
        while time.monotonic() < stop:
            run_one(sc, c, stats, sc.pick())
            done[i] += 1
        c.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.measure_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - t0), stats


def soak(host, port, pid, args, rate):
    stats = Stats(args.window_s)
    tickets = queue.Queue()
    rss = []  # (seconds since start, VmRSS KiB)
    rss_parts = []  # read_rss_kb() of each sample
    end = stats.t0 + args.duration
    lag = {"behind": 0, "max_queue": 0}

    def worker(i):
        c = Client(host, port, stats)
        sc = Scenarios(random.Random(args.seed * 7919 + i), args.cancel_ms)
        while True:
            name = tickets.get()
            if name is None:
                break
            if time.monotonic() >= end:
                stats.count("arrivals_dropped_at_end")
                continue
            run_one(sc, c, stats, name)
        c.close()

    def sampler():
        while time.monotonic() < end:
            kb = read_rss_kb(pid)
            if kb is not None:
                rss.append((time.monotonic() - stats.t0, kb["VmRSS"]))
                rss_parts.append(kb)
            time.sleep(1.0)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    sam = threading.Thread(target=sampler)
    if pid:
        sam.start()
    picker = Scenarios(random.Random(args.seed), args.cancel_ms)
    next_at = stats.t0
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if next_at > now:
            time.sleep(min(next_at - now, end - now))
            continue
        # Open loop: the arrivals follow a Poisson schedule whatever the answers do. When
        # every worker is busy the tickets queue up here, and the queue is reported.
        tickets.put(picker.pick())
        q = tickets.qsize()
        lag["max_queue"] = max(lag["max_queue"], q)
        if q > args.clients:
            lag["behind"] += 1
        next_at += picker.rng.expovariate(rate)
    for _ in threads:
        tickets.put(None)
    for t in threads:
        t.join()
    if pid:
        sam.join()
    lag["rss_parts"] = rss_parts
    return stats, rss, lag, time.monotonic() - stats.t0


def read_rss_kb(pid):
    """VmRSS and its parts (anonymous memory, mapped files, shared memory such as SQLite's
    WAL index), in KiB, or None when the process is gone."""
    got = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    got[key] = int(line.split()[1])
    except OSError:
        return None
    return got if "VmRSS" in got else None


# ------------------------------------------------------------------------------ daemon


class Daemon:
    """The real gpujobd on a free port, its log kept; error-level lines are counted."""

    def __init__(self, binary, backend, workdir, extra_sets):
        state = os.path.join(workdir, "state")
        os.mkdir(state)
        conf = os.path.join(workdir, "gpujobd.conf")
        open(conf, "w").close()
        argv = [binary, "--config", conf, "--listen", "127.0.0.1:0", "--state-dir", state,
                "--backend", backend, "--log-level", "info", "--set", "debug.test_ops=true"]
        for s in extra_sets:
            argv += ["--set", s]
        self.log, self.port = [], None
        self.ready = threading.Event()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self.read_log, daemon=True).start()
        if not self.ready.wait(60) or self.port is None:
            self.kill()
            raise RuntimeError("gpujobd did not report listening:\n" + "\n".join(self.log[-40:]))

    def read_log(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.append(line)
            m = re.search(r"listening on http://(\S+):(\d+)", line)
            if m and self.port is None:
                self.port = int(m.group(2))
                self.ready.set()
        self.ready.set()

    def error_lines(self):
        return [l for l in self.log if re.search(r"\b(error|crit|fatal|ERROR|CRIT|FATAL)\b", l)
                and not re.search(r"\b(info|warn|debug)\b", l[:40])]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------------------------ report


def rss_median(samples, start, stop):
    vals = [kb for t, kb in samples if start <= t < stop]
    return statistics.median(vals) if vals else None


def window_rows(stats, duration, warmup_s):
    rows = []
    n = int(duration / stats.window_s + 0.999)
    for w in range(n):
        sl, rl = stats.scen.get(w, []), stats.req.get(w, [])
        rows.append({
            "window": w, "start_s": w * stats.window_s,
            "warmup": w * stats.window_s < warmup_s,
            "scenarios": len(sl),
            "scenario_p50_ms": ms(pct(sl, 50)), "scenario_p99_ms": ms(pct(sl, 99)),
            "request_p50_ms": ms(pct(rl, 50)), "request_p99_ms": ms(pct(rl, 99)),
        })
    # A last window much shorter than the others has too few samples for a p99.
    if len(rows) > 1 and rows[-1]["scenarios"] < rows[0]["scenarios"] // 2:
        rows.pop()
    return rows


def route_table(stats, rows):
    """Each route's p50/p99 in the first window after warm-up and in the last window: a route
    whose cost grows with the store shows here."""
    after = [r["window"] for r in rows if not r["warmup"]]
    if not after:
        return {}
    first, last = after[0], after[-1]
    out = {}
    for kind in sorted({k for k, _ in stats.by_kind}):
        a, b = stats.by_kind.get((kind, first), []), stats.by_kind.get((kind, last), [])
        out[kind] = {"first_p50_ms": ms(pct(a, 50)), "first_p99_ms": ms(pct(a, 99)),
                     "last_p50_ms": ms(pct(b, 50)), "last_p99_ms": ms(pct(b, 99)),
                     "count": sum(len(v) for (k, _), v in stats.by_kind.items() if k == kind)}
    return out


def ms(seconds):
    return None if seconds is None else round(seconds * 1000.0, 2)


def stability(rows, key, ratio, slack_ms):
    vals = [r[key] for r in rows if not r["warmup"] and r[key] is not None]
    if len(vals) < 2:
        return {"ok": False, "why": f"{len(vals)} windows after warm-up: need 2 or more"}
    half = len(vals) // 2
    early, late = statistics.median(vals[:half]), statistics.median(vals[-half:])
    bound = ratio * early + slack_ms
    return {"ok": late <= bound, "early_ms": round(early, 2), "late_ms": round(late, 2),
            "bound_ms": round(bound, 2)}


def report(args, measured, rate, stats, rss, lag, elapsed, extra_errors, exit_rc):
    warmup_s = args.warmup * args.duration
    rows = window_rows(stats, args.duration, warmup_s)
    # A window of samples on each side, so one sample's allocator noise does not decide.
    rss_warm = rss_median(rss, warmup_s, warmup_s + stats.window_s)
    rss_end = rss_median(rss, elapsed - stats.window_s, elapsed + 1)
    growth = (rss_end - rss_warm) / rss_warm if rss_warm and rss_end else None
    errors = stats.errors + extra_errors
    scen_total = sum(v for k, v in stats.counts.items() if k.startswith("scenario:"))
    s99 = stability(rows, "scenario_p99_ms", args.p99_ratio, args.slack_ms)
    s50 = stability(rows, "scenario_p50_ms", args.p99_ratio, args.slack_ms)
    criteria = {
        "errors": {"ok": not errors, "count": len(errors)},
        "rss_growth": {"ok": growth is not None and growth < args.rss_growth,
                       "after_warmup_kib": rss_warm, "end_kib": rss_end,
                       "growth": None if growth is None else round(growth, 4),
                       "max": args.rss_growth},
        "p99_stable": s99, "p50_stable": s50,
    }
    reported = {}
    if args.latency == "report":
        reported = {k: criteria.pop(k) for k in ("p99_stable", "p50_stable")}
    if not args.pid_known:
        criteria["rss_growth"] = {"ok": True, "skipped": "no daemon pid to sample"}
    summary = {
        "duration_s": round(elapsed, 1), "measured_scenarios_per_s": round(measured, 1),
        "target_scenarios_per_s": round(rate, 1), "achieved_scenarios_per_s":
            round(scen_total / elapsed, 1) if elapsed else None,
        "requests": stats.requests, "requests_per_s": round(stats.requests / elapsed, 1),
        "scenarios": {k.split(":", 1)[1]: v for k, v in sorted(stats.counts.items())
                      if k.startswith("scenario:")},
        "cancels": {k: v for k, v in stats.counts.items() if not k.startswith("scenario:")},
        "errors": errors[:50], "arrival_queue_max": lag["max_queue"],
        "arrivals_behind": lag["behind"], "daemon_exit": exit_rc,
        "routes": route_table(stats, rows),
        "rss_kib": [kb for _, kb in rss], "rss_parts_kib": lag.get("rss_parts", []),
        "windows": rows, "criteria": criteria, "reported": reported,
        "ok": all(c["ok"] for c in criteria.values()),
    }
    md = []
    md.append(f"soak: {summary['duration_s']} s at {args.fraction:.0%} of "
              f"{summary['measured_scenarios_per_s']} scenarios/s measured "
              f"(target {summary['target_scenarios_per_s']}/s, achieved "
              f"{summary['achieved_scenarios_per_s']}/s); {stats.requests} requests "
              f"({summary['requests_per_s']}/s), {len(errors)} errors")
    md.append("")
    md.append("| window | s | scenarios | scenario p50 ms | scenario p99 ms | "
              "request p50 ms | request p99 ms |")
    md.append("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        md.append(f"| {r['window']}{' (warm-up)' if r['warmup'] else ''} | {r['start_s']:g} | "
                  f"{r['scenarios']} | {r['scenario_p50_ms']} | {r['scenario_p99_ms']} | "
                  f"{r['request_p50_ms']} | {r['request_p99_ms']} |")
    md.append("")
    md.append("| criterion | result | figures |")
    md.append("|---|---|---|")
    for name, c in criteria.items():
        figs = ", ".join(f"{k} {v}" for k, v in c.items() if k != "ok")
        md.append(f"| {name} | {'pass' if c['ok'] else 'FAIL'} | {figs} |")
    for name, c in reported.items():
        figs = ", ".join(f"{k} {v}" for k, v in c.items() if k != "ok")
        md.append(f"| {name} | reported ({'within' if c['ok'] else 'over'} its bound) | {figs} |")
    md.append("")
    md.append("scenarios: " + ", ".join(f"{k} {v}" for k, v in summary["scenarios"].items()) +
              "; cancels: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["cancels"].items())))
    md.append("")
    md.append("| route | requests | p50 ms first / last window | p99 ms first / last window |")
    md.append("|---|---:|---:|---:|")
    for kind, r in summary["routes"].items():
        md.append(f"| {kind} | {r['count']} | {r['first_p50_ms']} / {r['last_p50_ms']} | "
                  f"{r['first_p99_ms']} / {r['last_p99_ms']} |")
    md.append("")
    md.append(f"arrival queue at most {lag['max_queue']} (behind schedule {lag['behind']} times)")
    for e in errors[:20]:
        md.append(f"error: {e}")
    print("\n".join(md), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return summary["ok"]


# -------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600, help="soak seconds (default 600)")
    ap.add_argument("--fraction", type=float, default=0.8, help="of the measured throughput")
    ap.add_argument("--measure-s", type=float, default=5)
    ap.add_argument("--measure-clients", type=int, default=8)
    ap.add_argument("--clients", type=int, default=24, help="soak threads (open loop)")
    ap.add_argument("--window-s", type=float, help="latency window (default 10, or "
                    "duration/6 when shorter)")
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of the run")
    ap.add_argument("--rss-growth", type=float, default=0.05)
    ap.add_argument("--p99-ratio", type=float, default=2.0)
    ap.add_argument("--slack-ms", type=float, default=20.0)
    ap.add_argument("--latency", choices=("assert", "report"), default="assert",
                    help="whether latency stability is a criterion (default) or only reported")
    ap.add_argument("--cancel-ms", type=int, default=60, help="debug_sleep length to cancel")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--url", help="attach to this daemon instead of starting one "
                    "(it needs [debug] test_ops for the cancels)")
    ap.add_argument("--pid", type=int, help="with --url: the daemon's pid, for its RSS")
    ap.add_argument("--bin", default=os.environ.get("GPUJOBD_BIN", "build/daemon/gpujobd"))
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--set", action="append", default=[], help="extra gpujobd --set KEY=VALUE")
    args = ap.parse_args()
    if args.window_s is None:
        args.window_s = min(10.0, args.duration / 6)

    daemon = None
    workdir = None
    if args.url:
        u = urllib.parse.urlsplit(args.url)
        host, port, pid = u.hostname, u.port or 80, args.pid
    else:
        if not os.access(args.bin, os.X_OK):
            print(f"soak: no gpujobd at {args.bin} (set GPUJOBD_BIN or --bin)", file=sys.stderr)
            return 2
        workdir = tempfile.TemporaryDirectory(prefix="gpujobd-soak-")
        daemon = Daemon(args.bin, args.backend, workdir.name, args.set)
        host, port, pid = "127.0.0.1", daemon.port, daemon.proc.pid
    args.pid_known = bool(pid)
    try:
        measured, mstats = measure(host, port, args)
        if mstats.errors:
            print("soak: errors while measuring the throughput:", file=sys.stderr)
            for e in mstats.errors[:20]:
                print("  " + e, file=sys.stderr)
        rate = max(1.0, args.fraction * measured)
        print(f"measured {measured:.1f} scenarios/s with {args.measure_clients} closed-loop "
              f"clients; soaking at {rate:.1f}/s for {args.duration:g} s", flush=True)
        stats, rss, lag, elapsed = soak(host, port, pid, args, rate)
        stats.errors = mstats.errors + stats.errors
        stats.requests += mstats.requests
        extra, exit_rc = [], None
        if daemon:
            exit_rc = daemon.stop()
            if exit_rc != 0:
                extra.append(f"gpujobd exited {exit_rc} on SIGTERM")
            extra += [f"daemon log: {l}" for l in daemon.error_lines()]
        ok = report(args, measured, rate, stats, rss, lag, elapsed, extra, exit_rc)
    finally:
        if daemon:
            daemon.kill()
        if workdir:
            workdir.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
