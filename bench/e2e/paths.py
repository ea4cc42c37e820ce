#!/usr/bin/env python3
"""The paths people use, against one server (gpujobd or a peer): saxpy on 1,024 f32 with its
numbers in JSON ("data"), the same body to every server, sent by wrk with a fixed body; and,
for gpujobd, the same jobs with a binary section, sent by bench_loadgen. Standard library only.

    paths.py URL --server NAME --pid PID --json FILE [--rows json,submit,binary,floor]
             [--duration S] [--clients 1,16,64,256] [--wrk WRK] [--loadgen BIN] [--sink BIN]
             [--dir DIR]

Rows (each --duration seconds, after one check that the server answers the body right and a
1-s warm-up):
  json    POST /v1/jobs?wait=30 (submit and wait in one request) at each of --clients: jobs/s,
          client-side p50 and p99;
  submit  POST /v1/jobs at 64 clients, answered once the job is queued (gpujobd only);
  binary  POST /v1/jobs?wait=30 with the inputs in the body's binary section and the output
          back as bytes (bench_loadgen --modes waited --encoding binary --outputs binary), at 1
          and 64 clients (gpujobd only);
  floor   one client, by wrk: the binary section waited (the bytes bench_loadgen sends, the
          output back as bytes), then the loopback HTTP round trip of each waited row to
          bench_http_sink (--sink): the same body in, an answer as long as gpujobd's out
          (?reply_bytes=), which is what the daemon adds its time to (gpujobd only).
Each row also counts the CPU time of PID and its descendants (/proc/PID/stat utime + stime)
over the row, per job. Writes FILE (JSON) for report.py; a server that cannot be checked is
written as skipped with the reason, and the exit status is 0 either way."""
import argparse
import dataclasses
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
from common import http_sink  # noqa: E402
from report import read_loadgen  # noqa: E402

ELEMENTS = 1024
A = 2.0
WAIT_PATH = "/v1/jobs?wait=30"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

# wrk's script: the method, body and headers of every request, and on exit one JSON line with
# the counts and the latency percentiles in microseconds.
WRK_LUA = """wrk.method = "POST"
%s
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


@dataclasses.dataclass
class Body:
    """One saxpy job as a request body: its bytes, the headers that frame them, and the f32
    result it should produce."""
    data: bytes
    headers: dict
    expected: list


def inputs():
    """The saxpy job's x and y: seeded, uniform in [-1, 1), as their shortest f32 decimals."""
    rng = random.Random(25)
    return ([f32_text(rng.uniform(-1, 1)) for _ in range(ELEMENTS)],
            [f32_text(rng.uniform(-1, 1)) for _ in range(ELEMENTS)])


def json_body():
    """The job with its numbers in JSON ("data"), as a curl user sends it."""
    x, y = inputs()

    def tensor(v):
        return '{"dtype": "f32", "shape": [%d], "data": [%s]}' % (ELEMENTS, ", ".join(v))

    text = '{"op": "saxpy", "params": {"a": %s}, "inputs": {"x": %s, "y": %s}}' % (
        A, tensor(x), tensor(y))
    return Body(text.encode(), {"Content-Type": "application/json"},
                [A * float(a) + float(b) for a, b in zip(x, y)])


def binary_body():
    """The same job framed as bench_loadgen's binary encoding frames it: its JSON names x and y
    by binary_offset, their f32 bytes follow (Gpujob-Json-Length), and the output is asked back
    as bytes too."""
    x, y = inputs()

    def tensor(k):
        return {"dtype": "f32", "shape": [ELEMENTS], "binary_offset": k * 4 * ELEMENTS}

    text = json.dumps({"op": "saxpy", "params": {"a": A},
                       "inputs": {"x": tensor(0), "y": tensor(1)}}, separators=(",", ":"))
    raw = struct.pack(f"<{2 * ELEMENTS}f", *map(float, x + y))
    return Body(text.encode() + raw,
                {"Content-Type": "application/octet-stream", "Gpujob-Json-Length": str(len(text)),
                 "Accept": "application/octet-stream"},
                [A * float(a) + float(b) for a, b in zip(x, y)])


def answer_outputs(resp, text):
    """The f32 values of outputs.out in an answer, whether JSON numbers or in its binary
    section, with the job; raises KeyError, TypeError or ValueError when it has none."""
    json_len = resp.getheader("Gpujob-Json-Length")
    job = json.loads(text[:int(json_len)] if json_len else text)
    out = job["outputs"]["out"]
    if "data" in out:
        return job, out["data"]
    start = int(json_len) + out["binary_offset"]
    return job, struct.unpack_from(f"<{ELEMENTS}f", text, start)


def check(url, body):
    """One waited POST of body: (None, the answer's bytes) when it answers 2xx with outputs.out
    equal to body.expected (to f32 rounding), else (why not, None)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.request("POST", WAIT_PATH, body.data, body.headers)
        resp = conn.getresponse()
        text = resp.read()
    except OSError as e:
        return f"POST {WAIT_PATH}: {e}", None
    finally:
        conn.close()
    if resp.status // 100 != 2:
        return f"POST {WAIT_PATH}: HTTP {resp.status}: {text[:200].decode(errors='replace')}", None
    try:
        job, out = answer_outputs(resp, text)
    except (ValueError, KeyError, TypeError, struct.error):
        return f"the answer has no outputs.out: {text[:200].decode(errors='replace')}", None
    if job.get("state") != "succeeded" or len(out) != ELEMENTS:
        return f"state {job.get('state')!r}, {len(out)} outputs", None
    bad = [i for i, (o, e) in enumerate(zip(out, body.expected))
           if abs(o - e) > 1e-6 * (1 + abs(e))]
    if bad:
        return f"{len(bad)} outputs differ from a*x+y, first at {bad[0]}", None
    return None, len(text)


def wrk_script(directory, name, body):
    """Writes body and the wrk script that sends it with its headers into directory; the
    script's path."""
    body_path = os.path.join(directory, f"paths-{name}.body")
    with open(body_path, "wb") as f:
        f.write(body.data)
    headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in body.headers.items())
    lua = os.path.join(directory, f"paths-{name}.lua")
    with open(lua, "w") as f:
        f.write(WRK_LUA % (headers, body_path))
    return lua


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


def run_wrk(args, url, clients, duration, lua):
    """One wrk run to url; its JSON line as a dict, or raises RuntimeError."""
    cmd = [args.wrk, "-t", str(min(clients, 16)), "-c", str(clients), "-d", f"{duration}s",
           "--timeout", "10s", "--latency", "-s", lua, url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    for line in p.stdout.splitlines():
        if line.startswith("WRKJSON "):
            return json.loads(line[8:])
    raise RuntimeError(f"wrk exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}")


def wrk_row(args, path, clients, lua, url=None, pid=None):
    """A row of wrk's figures for path on the server (url and pid, by default the one
    measured), with that server's CPU time over it."""
    url, pid = url or args.url, pid or args.pid
    t0, c0 = time.monotonic(), tree_ticks(pid)
    r = run_wrk(args, url.rstrip("/") + path, clients, args.duration, lua)
    c1, t1 = tree_ticks(pid), time.monotonic()
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


def floor_rows(args, rows, lua, bodies, answer_bytes):
    """One client by wrk: the binary section waited on the server, then each body (name: Body)
    to bench_http_sink with an answer of answer_bytes[name] (the server's), at one client."""
    print(f"paths: {args.server}: binary section waited by wrk, 1 client", file=sys.stderr)
    rows["binary-wrk-waited-1"] = wrk_row(args, WAIT_PATH, 1, lua["binary"])
    with http_sink(args.sink) as (url, pid):
        for name, body in bodies.items():
            print(f"paths: loopback floor of the {name} row: wrk to bench_http_sink, 1 client",
                  file=sys.stderr)
            row = wrk_row(args, f"{WAIT_PATH}&reply_bytes={answer_bytes[name]}", 1, lua[name],
                          url, pid)
            rows[f"floor-{name}-1"] = dict(row, body_bytes=len(body.data),
                                           reply_bytes=answer_bytes[name])


def measure(args, result):
    wanted = args.rows.split(",")
    bodies = {"json": json_body()}
    if "floor" in wanted:
        bodies["binary"] = binary_body()
    lua = {name: wrk_script(args.dir, name, body) for name, body in bodies.items()}
    result["body_bytes"] = len(bodies["json"].data)
    answer_bytes = {}
    for name, body in bodies.items():
        why, answer_bytes[name] = check(args.url, body)
        if why:
            result["skipped"] = f"the check of one waited job ({name}) failed: {why}"
            return
    result["answer_bytes"] = answer_bytes
    rows = result["rows"]
    clients = [int(c) for c in args.clients.split(",")]
    if "json" in wanted:
        run_wrk(args, args.url.rstrip("/") + WAIT_PATH, 16, 1, lua["json"])  # warm-up
        for c in clients:
            print(f"paths: {args.server}: JSON waited, {c} clients", file=sys.stderr)
            rows[f"json-waited-{c}"] = wrk_row(args, WAIT_PATH, c, lua["json"])
    if "binary" in wanted:
        for c in (1, 64):
            print(f"paths: {args.server}: binary section waited, {c} clients", file=sys.stderr)
            rows[f"binary-waited-{c}"] = loadgen_row(args, c)
    if "floor" in wanted:
        floor_rows(args, rows, lua, bodies, answer_bytes)
    # Last: the jobs it queues faster than they run would slow the rows after it.
    if "submit" in wanted:
        print(f"paths: {args.server}: JSON submit only, 64 clients", file=sys.stderr)
        rows["json-submit-64"] = wrk_row(args, "/v1/jobs", 64, lua["json"])


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
    parser.add_argument("--sink", default="build/bench/bench_http_sink")
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
