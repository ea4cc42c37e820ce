#!/usr/bin/env python3
"""The paths people use, against one server (gpujobd or a peer): saxpy on 1,024 f32 with its
numbers in JSON ("data"), the same body to every server, sent by wrk with a fixed body; and,
for gpujobd, the same jobs with a binary section, sent by bench_loadgen. Standard library only.

    paths.py URL --server NAME --pid PID --json FILE [--rows json,submit,binary]
             [--duration S] [--clients 1,16,64,256] [--wrk WRK] [--loadgen BIN] [--dir DIR]

Rows (each --duration seconds, after one check that the server answers the body right and a
1-s warm-up):
  json    POST /v1/jobs?wait=30 (submit and wait in one request) at each of --clients: jobs/s,
          client-side p50 and p99;
  submit  POST /v1/jobs at 64 clients, answered once the job is queued (gpujobd only);
  binary  POST /v1/jobs?wait=30 with the inputs in the body's binary section and the output
          back as bytes (bench_loadgen --modes waited --encoding binary --outputs binary), at 1
          and 64 clients (gpujobd only).
Each row also counts the CPU time of PID and its descendants (/proc/PID/stat utime + stime)
over the row, per job. Writes FILE (JSON) for report.py; a server that cannot be checked is
written as skipped with the reason, and the exit status is 0 either way."""
import argparse
import http.client
import json
import os
import random
import struct
import subprocess
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import read_loadgen  # noqa: E402

ELEMENTS = 1024
A = 2.0
WAIT_PATH = "/v1/jobs?wait=30"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

# wrk's script: the method, body and headers of every request, and on exit one JSON line with
# the counts and the latency percentiles in microseconds.
WRK_LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open("%s", "rb"))
wrk.body = f:read("*a")
f:close()
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('\\nWRKJSON {"requests": %%d, "duration_us": %%d, "status": %%d, ' ..
    '"connect": %%d, "read": %%d, "write": %%d, "timeout": %%d, "p50_us": %%d, ' ..
    '"p99_us": %%d, "mean_us": %%.1f}\\n', summary.requests, summary.duration, e.status,
    e.connect, e.read, e.write, e.timeout, latency:percentile(50), latency:percentile(99),
    latency.mean))
end
"""


def f32_text(v):
    """The shortest decimal that reads back as the same f32 (what NumPy prints)."""
    f = struct.unpack("<f", struct.pack("<f", v))[0]
    for digits in range(1, 10):
        s = f"{f:.{digits}g}"
        if struct.unpack("<f", struct.pack("<f", float(s)))[0] == f:
            return s
    return repr(f)


def body_and_expected():
    """The saxpy job's JSON text (inputs as JSON numbers, seeded, uniform in [-1, 1)) and the
    f32 result it should produce."""
    rng = random.Random(25)
    x = [f32_text(rng.uniform(-1, 1)) for _ in range(ELEMENTS)]
    y = [f32_text(rng.uniform(-1, 1)) for _ in range(ELEMENTS)]

    def tensor(v):
        return '{"dtype": "f32", "shape": [%d], "data": [%s]}' % (ELEMENTS, ", ".join(v))

    body = '{"op": "saxpy", "params": {"a": %s}, "inputs": {"x": %s, "y": %s}}' % (
        A, tensor(x), tensor(y))
    expected = [A * float(a) + float(b) for a, b in zip(x, y)]
    return body, expected


def check(url, body, expected):
    """None when one waited POST of body answers 2xx with outputs.out.data equal to expected
    (to f32 rounding), else why not."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.request("POST", WAIT_PATH, body.encode(), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read()
    except OSError as e:
        return f"POST {WAIT_PATH}: {e}"
    finally:
        conn.close()
    if resp.status // 100 != 2:
        return f"POST {WAIT_PATH}: HTTP {resp.status}: {text[:200].decode(errors='replace')}"
    try:
        job = json.loads(text)
        out = job["outputs"]["out"]["data"]
    except (ValueError, KeyError, TypeError):
        return f"the answer has no outputs.out.data: {text[:200].decode(errors='replace')}"
    if job.get("state") != "succeeded" or len(out) != ELEMENTS:
        return f"state {job.get('state')!r}, {len(out)} outputs"
    bad = [i for i, (o, e) in enumerate(zip(out, expected)) if abs(o - e) > 1e-6 * (1 + abs(e))]
    return f"{len(bad)} outputs differ from a*x+y, first at {bad[0]}" if bad else None


def tree_ticks(root):
    """utime + stime, in clock ticks, of root and every process below it."""
    parent, ticks = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(name)
        parent[pid] = int(fields[1])
        ticks[pid] = int(fields[11]) + int(fields[12])
    total = 0
    for pid, t in ticks.items():
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += t
    return total


def run_wrk(args, path, clients, duration, lua):
    """One wrk run; its JSON line as a dict, or raises RuntimeError."""
    cmd = [args.wrk, "-t", str(min(clients, 16)), "-c", str(clients), "-d", f"{duration}s",
           "--timeout", "10s", "--latency", "-s", lua, args.url.rstrip("/") + path]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    for line in p.stdout.splitlines():
        if line.startswith("WRKJSON "):
            return json.loads(line[8:])
    raise RuntimeError(f"wrk exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}")


def wrk_row(args, path, clients, lua):
    t0, c0 = time.monotonic(), tree_ticks(args.pid)
    r = run_wrk(args, path, clients, args.duration, lua)
    c1, t1 = tree_ticks(args.pid), time.monotonic()
    errors = r["status"] + r["connect"] + r["read"] + r["write"] + r["timeout"]
    ok = r["requests"] - r["status"]
    return {"tool": "wrk", "clients": clients, "requests": r["requests"], "ok": ok,
            "errors": errors, "jobs_s": ok / (r["duration_us"] / 1e6),
            "p50_ms": r["p50_us"] / 1e3, "p99_ms": r["p99_us"] / 1e3,
            "cpu_s": (c1 - c0) * TICK_S, "wall_s": t1 - t0,
            "cpu_us_per_job": (c1 - c0) * TICK_S * 1e6 / ok if ok else None}


def loadgen_row(args, clients):
    out = os.path.join(args.dir, f"paths-{args.server}-binary-c{clients}.md")
    c0 = tree_ticks(args.pid)
    with open(out, "w") as f:
        subprocess.run([args.loadgen, "--duration", str(args.duration), "--modes", "waited",
                        "--concurrency", str(clients), "--encoding", "binary", "--outputs",
                        "binary", args.url], stdout=f, check=True, timeout=args.duration + 60)
    c1 = tree_ticks(args.pid)
    row = read_loadgen(out).get(("waited", clients, 1))
    if not row:
        raise RuntimeError(f"bench_loadgen printed no waited row (see {out})")
    return {"tool": "bench_loadgen", "clients": clients, "requests": row["requests"],
            "ok": row["ok"], "errors": row["errors"], "jobs_s": row["jobs_s"],
            "p50_ms": row["p50"], "p99_ms": row["p99"], "cpu_s": (c1 - c0) * TICK_S,
            "cpu_us_per_job": (c1 - c0) * TICK_S * 1e6 / row["ok"] if row["ok"] else None}


def measure(args, result):
    body, expected = body_and_expected()
    body_path = os.path.join(args.dir, "paths-body.json")
    with open(body_path, "w") as f:
        f.write(body)
    lua = os.path.join(args.dir, "paths.lua")
    with open(lua, "w") as f:
        f.write(WRK_LUA % body_path)
    result["body_bytes"] = len(body)
    why = check(args.url, body, expected)
    if why:
        result["skipped"] = f"the check of one waited job failed: {why}"
        return
    rows = result["rows"]
    wanted = args.rows.split(",")
    clients = [int(c) for c in args.clients.split(",")]
    if "json" in wanted:
        run_wrk(args, WAIT_PATH, 16, 1, lua)  # warm-up
        for c in clients:
            print(f"paths: {args.server}: JSON waited, {c} clients", file=sys.stderr)
            rows[f"json-waited-{c}"] = wrk_row(args, WAIT_PATH, c, lua)
    if "binary" in wanted:
        for c in (1, 64):
            print(f"paths: {args.server}: binary section waited, {c} clients", file=sys.stderr)
            rows[f"binary-waited-{c}"] = loadgen_row(args, c)
    # Last: the jobs it queues faster than they run would slow the rows after it.
    if "submit" in wanted:
        print(f"paths: {args.server}: JSON submit only, 64 clients", file=sys.stderr)
        rows["json-submit-64"] = wrk_row(args, "/v1/jobs", 64, lua)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--server", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--rows", default="json")
    parser.add_argument("--duration", type=int, default=3)
    parser.add_argument("--clients", default="1,16,64,256")
    parser.add_argument("--wrk", default=os.environ.get("WRK", "wrk"))
    parser.add_argument("--loadgen", default="build/bench/bench_loadgen")
    parser.add_argument("--dir", default=".")
    parser.add_argument("--compute", default="", help="what computes the jobs, for the report")
    args = parser.parse_args()
    result = {"server": args.server, "compute": args.compute, "rows": {}, "skipped": None,
              "duration_s": args.duration}
    try:
        measure(args, result)
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
        result["skipped"] = f"{type(e).__name__}: {e}"
        print(f"paths: {args.server}: {result['skipped']}", file=sys.stderr)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
