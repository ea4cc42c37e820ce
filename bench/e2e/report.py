#!/usr/bin/env python3
"""Joins the parts of bench/e2e/run.sh into one Markdown report: the issue's targets first,
each met or missed, then the figures behind them (standard library only).

    report.py DIR [--backend cuda] [--gpu NAME] [--cores N] [--duration S] [--quick 0|1]
              [--gemm-jobs N]

DIR holds what the parts wrote: tiny.md, tiny-binary.md, tiny-shards.md (arrays on a store of
four shards), tiny-memory.md (the same with the state on tmpfs) and peer.md (bench_loadgen
tables), tiny-binary-io.json, tiny-shards-io.json and tiny-memory-io.json (what the daemon
wrote during their arrays rows), server-c*.json and server-binary-c*.json (the tiny part),
server-waited-json.json and server-waited-binary.json (the paths part), gemm-batched.json,
gemm-unbatched.json and their -resident, -waited, -waited-arrays and -memory twins, large.json,
pcie.json, paths-gpujobd.json, paths-aiohttp.json and paths-litserve.json (paths.py), wakeup.json
(bench_wakeup: the wake-up floor of a waited job, the paths part), uploads.json, gpus-one.json,
gpus-all.json and gpus-fault.json (gpu_scaling.py), and
PART.skipped (one line: why the part did not run or failed) for each part that has no figures."""
import argparse
import json
import os
import re
import sys

ROW = re.compile(r"^\| (submit|array|e2e|waited) \|")
E2E_CLIENTS = (1, 16, 64)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_loadgen(path):
    """bench_loadgen's rows keyed by (mode, clients, jobs per POST)."""
    rows = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return rows
    for line in lines:
        if not ROW.match(line):
            continue
        f = [c.strip() for c in line.strip("|").split("|")]
        rows[(f[0], int(f[1]), int(f[2]))] = {
            "requests": int(f[3]), "ok": int(f[4]), "errors": int(f[5]),
            "jobs_s": float(f[6]), "p50": float(f[7]), "p99": float(f[8])}
    return rows


class Report:
    def __init__(self, d, gemm_jobs):
        self.dir = d
        self.gemm_jobs = gemm_jobs  # for the target's text when the part left no figures
        self.targets = []  # (target, measured, verdict)

    def why_missing(self, part):
        """The part's .skipped line, or a generic reason when it left nothing."""
        try:
            return open(os.path.join(self.dir, part + ".skipped")).read().strip()
        except OSError:
            return "no result (see the run's log)"

    def target(self, text, value, limit, measured, higher_is_better=True):
        if value is None:
            verdict = "not measured"
        elif higher_is_better:
            verdict = "met" if value >= limit else "missed"
        else:
            verdict = "met" if value <= limit else "missed"
        self.targets.append((text, measured if value is not None else "-", verdict))


def num(x, digits=0):
    return "-" if x is None else f"{x:,.{digits}f}"


def ratio(a, b):
    return a / b if a is not None and b else None


ARRAYS16 = ("array", 16, 100)  # arrays of 100 from 16 clients, the row the io files cover


def arrays_written(rep, name):
    """NAME.md's arrays-of-100-from-16 row ({} if none) and NAME-io.json's figures: bytes the
    daemon wrote during it and their GB/s (None each when missing)."""
    row = read_loadgen(os.path.join(rep.dir, name + ".md")).get(ARRAYS16, {})
    io = read_json(os.path.join(rep.dir, name + "-io.json")) or {}
    written = io.get("write_bytes")
    rate = written / io["seconds"] / 1e9 if written is not None and io.get("seconds") else None
    return row, written, rate


def arrays_by_shards(rep, out):
    """Arrays of 100 from 16 clients (binary) on one shard and on four, with what the daemon
    wrote per job, beside the disk's write + fdatasync rate (the large part's)."""
    large = read_json(os.path.join(rep.dir, "large.json")) or {}
    disk = large.get("disk_write_gbps")
    out.append("| arrays of 100 from 16 clients (binary) | jobs/s | p50 ms | written per job, KB "
               "| written, GB/s |")
    out.append("|---|---:|---:|---:|---:|")
    for label, name in (("one shard", "tiny-binary"), ("four shards", "tiny-shards")):
        row, written, rate = arrays_written(rep, name)
        jobs = row.get("ok")
        per_job = written / jobs / 1e3 if written is not None and jobs else None
        out.append(f"| {label} | {num(row.get('jobs_s'))} | {num(row.get('p50'), 2)} | "
                   f"{num(per_job, 1)} | {num(rate, 2)} |")
    out.append(f"\nWritten: the daemon's /proc/PID/io write_bytes over the row. Every accepted "
               f"job's inputs, and every finished job's outputs, are on disk before it is "
               f"answered; the disk's own write + fdatasync rate (the large part's) was "
               f"{num(disk, 2)} GB/s.\n")


def tiny_section(rep, out):
    ours = read_loadgen(os.path.join(rep.dir, "tiny.md"))
    binary = read_loadgen(os.path.join(rep.dir, "tiny-binary.md"))
    peer = read_loadgen(os.path.join(rep.dir, "peer.md"))
    out.append("## Tiny jobs over HTTP: gpujobd against the peer\n")
    if not ours:
        out.append(f"gpujobd: {rep.why_missing('tiny')}\n")
    if not peer:
        out.append(f"Peer (bench/peer/aiohttp_torch_server.py): {rep.why_missing('peer')}\n")
    out.append("| mode | clients | jobs/POST | gpujobd jobs/s | p50 ms | p99 ms | errors "
               "| binary section: jobs/s | p50 ms | peer jobs/s | p50 ms | p99 ms | errors "
               "| gpujobd / peer |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    modes = ("submit", "array", "e2e", "waited")
    for key in sorted(set(ours) | set(peer), key=lambda k: (modes.index(k[0]), k[1], k[2])):
        o, b, p = ours.get(key, {}), binary.get(key, {}), peer.get(key, {})
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {num(o.get('jobs_s'))} | "
                   f"{num(o.get('p50'), 2)} | {num(o.get('p99'), 2)} | {num(o.get('errors'))} | "
                   f"{num(b.get('jobs_s'))} | {num(b.get('p50'), 2)} | "
                   f"{num(p.get('jobs_s'))} | {num(p.get('p50'), 2)} | {num(p.get('p99'), 2)} | "
                   f"{num(p.get('errors'))} | {num(ratio(o.get('jobs_s'), p.get('jobs_s')), 1)} |")
    out.append("\nEach job: saxpy on 1024 f32, inputs in base64 (the binary section columns: the "
               "same jobs with raw bytes after the JSON, Gpujob-Json-Length; the peer takes "
               "base64 only, so the ratio is base64 against base64). submit and array count "
               "201s; a gpujobd 201 means committed and queued, the peer's means done, so the e2e "
               "rows (POST, then /wait until done) compare like with like; waited is gpujobd's "
               "one-request form (POST /v1/jobs?wait=), the peer's way. In the binary section "
               "columns of e2e and waited the output comes back as bytes after the JSON too "
               "(Accept: application/octet-stream).\n")

    def jobs_s(rows, key):
        return rows.get(key, {}).get("jobs_s")

    def best_encoding(key):
        """gpujobd's better figure for key, and the encoding that gave it."""
        b64, raw = jobs_s(ours, key), jobs_s(binary, key)
        if raw is not None and (b64 is None or raw > b64):
            return raw, "binary section"
        return b64, "base64"

    c64 = ("submit", 64, 1)
    v, enc = best_encoding(c64)
    rep.target("single-job submissions at 64 clients >= 20,000 jobs/s", v, 20000,
               f"{num(v)} jobs/s ({enc})")
    arrays = [k for k in set(ours) | set(binary) if k[0] == "array"]
    best = max(arrays, key=lambda k: best_encoding(k)[0] or 0) if arrays else None
    v, enc = best_encoding(best) if best else (None, "")
    where = f"{best[2]} per POST, {best[1]} clients" if best else "best size"
    sharded = read_loadgen(os.path.join(rep.dir, "tiny-shards.md"))
    for key, row in sharded.items():
        if key[0] == "array" and row["jobs_s"] > (v or 0):
            v, enc = row["jobs_s"], "binary section, four shards"
            where = f"{key[2]} per POST, {key[1]} clients"
    rep.target("array submissions >= 100,000 jobs/s", v, 100000,
               f"{num(v)} jobs/s ({where}, {enc})")
    arrays_by_shards(rep, out)
    for label, key in (("single-job submissions, 64 clients", c64), ("arrays, " + where, best)):
        r = ratio(jobs_s(ours, key), jobs_s(peer, key)) if key else None
        rep.target(f">= 10x the peer: {label}", r, 10, f"{num(r, 1)}x")
    # Submit-to-done: gpujobd's better form (two requests, or one with ?wait=) and encoding
    # against the peer's, whose POST answers once the job is done.
    (v, enc), form = max(((best_encoding((m, 64, 1)), m) for m in ("e2e", "waited")),
                         key=lambda found: found[0][0] or 0)
    r = ratio(v, jobs_s(peer, ("e2e", 64, 1)))
    rep.target(">= 10x the peer: submit-to-done, 64 clients", r, 10,
               f"{num(r, 1)}x ({form}, {enc})")


def server_section(rep, out):
    out.append("## Server-side time per tiny job (gpujobd's job rows)\n")
    rows = [(enc, c, read_json(os.path.join(rep.dir, f"server{infix}c{c}.json")))
            for enc, infix in (("base64", "-"), ("binary section", "-binary-"))
            for c in E2E_CLIENTS]
    waited = [(enc, read_json(os.path.join(rep.dir, f"server-waited-{name}.json")))
              for enc, name in (("JSON numbers", "json"), ("binary section", "binary"))]
    wake = read_json(os.path.join(rep.dir, "wakeup.json"))
    if not any(r for _, _, r in rows) and not any(r for _, r in waited):
        out.append(f"{rep.why_missing('tiny')}\n")
    else:
        out.append("| encoding | e2e clients | jobs | p50 µs | p99 µs | queue_ms p50 | run_ms p50 "
                   "| gpu_ms p50 | batch size p50 |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for enc, c, r in rows:
            if r:
                out.append(f"| {enc} | {c} | {r['succeeded']} of {r['listed']} "
                           f"| {num(r['server_us_p50'])} | {num(r['server_us_p99'])} "
                           f"| {num(r['queue_ms_p50'], 3)} | {num(r['run_ms_p50'], 3)} "
                           f"| {num(r['gpu_ms_p50'], 3)} | {num(r['batch_size_p50'])} |")
        for enc, r in waited:
            if r:
                out.append(f"| {enc} | waited, 1 | {r['succeeded']} of {r['listed']} "
                           f"| {num(r['server_us_p50'])} | {num(r['server_us_p99'])} "
                           f"| {num(r['queue_ms_p50'], 3)} | {num(r['run_ms_p50'], 3)} "
                           f"| {num(r['gpu_ms_p50'], 3)} | {num(r['batch_size_p50'])} |")
        if wake:
            out.append(f"| floor: {wake['wakeups']} wake-ups of idle threads "
                       f"(bench_wakeup --chain {wake['chain']}) | | {wake['rounds']:,} rounds "
                       f"| {num(wake['round_p50_us'])} | {num(wake['round_p99_us'])} "
                       f"| | | | |")
        elif any(r for _, r in waited):
            out.append(f"| floor: wake-ups (bench_wakeup) | {rep.why_missing('wakeup')} "
                       f"| | | | | | | |")
        out.append("\nfinished_at - created_at of the jobs each e2e row ran (created_at: the "
                   "scheduler takes the parsed job in; finished_at: its result is recorded), so "
                   "without the HTTP transfer and parsing. The encoding changes how fast the "
                   "client sends the next job, and so how long the daemon's threads sleep "
                   "between jobs and take to wake.\n")
        if wake:
            out.append(f"The floor: a token passed round the threads a waited job crosses on "
                       f"this backend, each asleep until it comes, through the daemon's own "
                       f"hand-offs ({'; '.join(h['name'] for h in wake['hops'])}), "
                       f"{wake['gap_us']} µs of sleep before each round (bench_wakeup); p50 µs "
                       f"of each: "
                       f"{', '.join(num(h['p50_us'], 1) for h in wake['hops'])}.\n")
    ones = [(r["server_us_p50"], enc) for enc, c, r in rows
            if c == 1 and r and r["server_us_p50"] is not None]
    p50, enc = min(ones) if ones else (None, "")
    rep.target("p50 server-side time of a tiny job <= 100 µs (e2e, 1 client)", p50, 100,
               f"{num(p50)} µs ({enc})" if ones else "-", higher_is_better=False)
    ones = [(r["server_us_p50"], enc) for enc, r in waited
            if r and r["server_us_p50"] is not None]
    p50, enc = min(ones) if ones else (None, "")
    floor = ""
    if wake:
        # created_at to finished_at spans every hand-off but the first (HTTP thread to loop)
        # and the last (loop to HTTP thread).
        inside = wake["hops"][1:-1]
        floor = (f"; floor: the {len(inside)} wake-ups inside that span, "
                 f"{num(sum(h['p50_us'] for h in inside))} µs (their p50s summed; "
                 f"all {wake['wakeups']}: {num(wake['round_p50_us'])} µs)")
    rep.target("p50 server-side time of a waited tiny job <= 100 µs (paths, 1 client)", p50,
               100, f"{num(p50)} µs ({enc}){floor}" if ones else "-", higher_is_better=False)


def gemm_section(rep, out):
    out.append("## Batched against unbatched: small GEMMs\n")
    kinds = (("", "in the request"), ("-resident", "in resident buffers"),
             ("-waited", "in resident buffers, each job waited"),
             ("-waited-arrays", "in resident buffers, waited as arrays"))
    runs = {(suffix, label): read_json(os.path.join(rep.dir, f"gemm-{label}{suffix}.json"))
            for suffix, _ in kinds for label in ("batched", "unbatched")}
    if not any(runs.values()):
        out.append(f"{rep.why_missing('gemm')}\n")
    else:
        out.append("| inputs | daemon | jobs ok | submit s | client CPU s | from first POST: s "
                   "| jobs/s | from first start: s | jobs/s | batch size p50 / max "
                   "| gpu_ms total |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for suffix, inputs in kinds:
            for label, name in (("batched", "default (batching on)"),
                                ("unbatched", "scheduler.max_batch=1")):
                r = runs[(suffix, label)]
                if not r:
                    out.append(f"| {inputs} | {name} | {rep.why_missing('gemm')} |")
                    continue
                out.append(f"| {inputs} | {name} | {r['succeeded']} of {r['jobs']} "
                           f"| {num(r['submit_s'], 2)} | {num(r['client_cpu_s'], 2)} "
                           f"| {num(r['wall_s'], 3)} | {num(r['jobs_per_s_wall'])} "
                           f"| {num(r['exec_s'], 3)} | {num(r['jobs_per_s_exec'])} "
                           f"| {num(r['batch_size_p50'])} / {num(r['batch_size_max'])} "
                           f"| {num(r['gpu_ms_total'], 2)} |")
        some = next(r for r in runs.values() if r)
        waited_clients = next((r["clients"] for (suffix, _), r in runs.items()
                               if suffix == "-waited" and r), "-")
        wa = next((r for (suffix, _), r in runs.items() if suffix == "-waited-arrays" and r), {})
        sent = "in base64" if some.get("encoding") == "b64" else "in the body's binary section"
        out.append(f"\nEach job: gemm f32 {some['size']}x{some['size']} @ "
                   f"{some['size']}x{some['size']}, sent as {some['arrays']} arrays at once after "
                   f"a warm-up; its inputs {sent} (\"in the request\": 32 KiB per job that the "
                   "daemon takes in and stores before it answers), or two of 32 resident buffers "
                   "uploaded beforehand. \"From first POST\" ends at the last "
                   "job's finished_at and includes the upload and parsing that batching cannot "
                   "change; \"from first start\" spans the daemon's execution (first started_at "
                   "to last finished_at), which cannot end before the last array is taken in. "
                   "Client CPU far below the submit time means the client was not the limit. "
                   "Each job waited: POSTed alone with ?wait= by one of "
                   f"{waited_clients} client processes, one in flight each, its result in the "
                   "answer; \"from first POST\" then ends at the last answer, and submit s is "
                   "that same span. Waited as arrays: the same jobs in "
                   f"{wa.get('arrays', '-')} arrays, each POSTed with ?wait= by one of "
                   f"{wa.get('clients', '-')} client processes, one array in flight each, the "
                   "results of all of its jobs in the answer (one round trip per array); the "
                   "span likewise ends at the last answer.\n")
    # The issue's measure is the waited run's, first POST to last answer; the arrays runs'
    # execution spans are written beside it.
    ratios = []
    for suffix, inputs in kinds:
        b, u = runs[(suffix, "batched")], runs[(suffix, "unbatched")]
        execr = ratio(b and b["jobs_per_s_exec"], u and u["jobs_per_s_exec"])
        wall = ratio(b and b["jobs_per_s_wall"], u and u["jobs_per_s_wall"])
        if suffix == "-waited-arrays":
            continue  # a target row of its own, below
        if suffix == "-waited" and wall is not None:
            ratios.append((wall, f"{num(wall, 1)}x with inputs {inputs}, first POST to last "
                                 "answer", True))
        elif execr is not None:
            ratios.append((execr, f"{num(execr, 1)}x with inputs {inputs} (from first POST: "
                                  f"{num(wall, 1)}x)", False))
    waited = [r for r in ratios if r[2]]
    value = waited[0][0] if waited else max(ratios)[0] if ratios else None
    n = next((r["jobs"] for r in runs.values() if r), rep.gemm_jobs)
    rep.target(f"batched >= 10x unbatched, {n:,} GEMMs (waited, first POST to last answer)",
               value, 10, "; ".join(text for _, text, _ in sorted(ratios, reverse=True)))
    b, u = runs[("-waited-arrays", "batched")], runs[("-waited-arrays", "unbatched")]
    wall = ratio(b and b["jobs_per_s_wall"], u and u["jobs_per_s_wall"])
    rep.target(f"batched >= 10x unbatched, {n:,} GEMMs (waited arrays, first POST to last "
               "answer)", wall, 10,
               f"{num(wall, 1)}x in {wa.get('arrays', '-')} waited arrays" if wall is not None
               else rep.why_missing("gemm"))


def large_section(rep, out):
    out.append("## A large job\n")
    r = read_json(os.path.join(rep.dir, "large.json"))
    pcie = read_json(os.path.join(rep.dir, "pcie.json")) or {"skipped": rep.why_missing("pcie")}
    ceiling = pcie.get("pinned_h2d_gbps")
    if not r:
        out.append(f"{rep.why_missing('large')}\n")
    else:
        mib = r["bytes"] / (1 << 20)
        up = ", ".join(f"{g:.2f}" for g in r["upload_gbps"])
        out.append("| measure | value |\n|---|---:|")
        out.append(f"| resident upload of {mib:,.0f} MiB, GB/s (x, y) | {up} |")
        if r.get("disk_write_gbps"):
            out.append(f"| the same bytes written to a file on the daemon's disk and fdatasync'd, "
                       f"GB/s | {r['disk_write_gbps']:.2f} |")
        if r.get("device_load_gbps"):
            out.append(f"| load of both into device memory (the daemon's own count), GB/s "
                       f"| {r['device_load_gbps']:.2f} |")
        out.append(f"| first job on them, end-to-end ms | {r['first_job_us'] / 1e3:,.1f} |")
        if ceiling:
            out.append(f"| pinned host-to-device copy (PyTorch), GB/s | {ceiling:.2f} |")
            out.append(f"| pageable host-to-device copy (PyTorch), GB/s "
                       f"| {pcie['pageable_h2d_gbps']:.2f} |")
        else:
            out.append(f"| pinned host-to-device copy | {pcie['skipped']} |")
        out.append(f"| dot on two resident {mib:,.0f} MiB buffers, {r['jobs']} jobs each way: "
                   f"end-to-end p50 µs, POST then GET .../wait / one POST ?wait= "
                   f"| {num(r['e2e_us_p50'])} / {num(r['waited_e2e_us_p50'])} |")
        out.append(f"| kernel (gpu_ms) p50 µs | {num(r['gpu_us_p50'])} |")
        out.append(f"| daemon overhead (end-to-end - kernel) p50 µs, POST then wait / POST ?wait= "
                   f"| {num(r['overhead_us_p50'])} / {num(r['waited_overhead_us_p50'])} |")
        out.append(f"| of it between the daemon's timestamps (finished_at - created_at - kernel), "
                   f"p50 µs "
                   f"| {num(r['server_overhead_us_p50'])} |")
        out.append(f"| client floor: GET /healthz round trips, two / one, p50 µs "
                   f"| {num(r['http_floor_us_p50'])} / {num(r['waited_http_floor_us_p50'])} |")
        out.append(f"| dot's value (expected {r['bytes'] // 4:,}) | {r['dot_value']} |")
        out.append("\nEnd-to-end is the client's POST to the answer that says done (Python "
                   "http.client on one keep-alive connection); the floor is what that client's "
                   "HTTP round trips cost with no work behind them.\n")
    overhead = min(r["overhead_us_p50"], r["waited_overhead_us_p50"]) if r else None
    rep.target("large job: daemon overhead p50 <= 50 µs (the better way)", overhead, 50,
               f"{num(overhead)} µs", higher_is_better=False)
    best = max(r["upload_gbps"]) if r else None
    frac = best / ceiling if best and ceiling else None
    rep.target("upload of a large buffer >= 0.8 of pinned PCIe bandwidth", frac, 0.8,
               f"{num(frac, 2)} ({num(best, 2)} of {num(ceiling, 2)} GB/s)")


def memory_section(rep, out):
    """The arrays on four shards and the GEMMs with the state on disk and on tmpfs."""
    out.append("## Without the disk: the state on tmpfs\n")
    mem = read_loadgen(os.path.join(rep.dir, "tiny-memory.md"))
    if not mem:
        out.append(f"{rep.why_missing('memory')}\n")
        return
    out.append("| measure | state on disk | state on tmpfs |\n|---|---:|---:|")
    rows = []
    for name in ("tiny-shards", "tiny-memory"):
        row, _, rate = arrays_written(rep, name)
        rows.append((row.get("jobs_s"), rate))
    out.append(f"| arrays of 100 from 16 clients (binary), four shards, jobs/s "
               f"| {num(rows[0][0])} | {num(rows[1][0])} |")
    out.append(f"| written to the block device meanwhile, GB/s | {num(rows[0][1], 2)} "
               f"| {num(rows[1][1], 2)} |")
    spans = []
    for suffix in ("", "-memory"):
        b = read_json(os.path.join(rep.dir, f"gemm-batched{suffix}.json"))
        u = read_json(os.path.join(rep.dir, f"gemm-unbatched{suffix}.json"))
        spans.append((b and b["jobs_per_s_exec"], u and u["jobs_per_s_exec"]))
    out.append(f"| GEMMs batched, jobs/s (execution span) | {num(spans[0][0])} "
               f"| {num(spans[1][0])} |")
    out.append(f"| GEMMs unbatched, jobs/s (execution span) | {num(spans[0][1])} "
               f"| {num(spans[1][1])} |")
    ratios = [ratio(*span) for span in spans]
    out.append("| batched / unbatched | "
               + " | ".join("-" if r is None else f"{r:.1f}x" for r in ratios) + " |")
    if os.path.exists(os.path.join(rep.dir, "memory.skipped")):
        out.append(f"\nMissing figures: {rep.why_missing('memory')}")
    out.append("\nThe same loads with the daemons' state dirs on tmpfs (/dev/shm): what the daemon "
               "does when the disk does not bound it. Not a setup to run, as nothing there "
               "survives the machine; the targets above are measured on disk.\n")


PATH_SERVERS = (("gpujobd", "gpujobd"), ("aiohttp", "aiohttp peer"), ("litserve", "LitServe peer"))


def paths_section(rep, out):
    """The issue's table: each path on gpujobd and on the peers, with gpujobd's ratios."""
    out.append("## The paths people use: JSON numbers and one waited job, against the peers\n")
    runs = {name: read_json(os.path.join(rep.dir, f"paths-{name}.json")) or {}
            for name, _ in PATH_SERVERS}
    if not any(r.get("rows") for r in runs.values()):
        out.append(f"{rep.why_missing('paths')}\n")
    for name, label in PATH_SERVERS:
        r = runs[name]
        if not r:
            out.append(f"- {label}: no result ({rep.why_missing('paths')})")
        elif r.get("skipped"):
            out.append(f"- {label}: {'stopped' if r.get('rows') else 'skipped'}: {r['skipped']}")
        elif r.get("compute"):
            out.append(f"- {label}: {r['compute']}")
    out.append("")

    def cell(name, key, field):
        return runs[name].get("rows", {}).get(key, {}).get(field)

    # (label, row key, field, digits, higher is better)
    lines = [("JSON, one client, submit and wait in one request, p50 ms", "json-waited-1",
              "p50_ms", 2, False),
             ("JSON, one client, waited, p99 ms", "json-waited-1", "p99_ms", 2, False)]
    clients = sorted({int(k.rsplit("-", 1)[1]) for r in runs.values()
                      for k in r.get("rows", {}) if k.startswith("json-waited-")} - {1})
    lines += [(f"JSON, {c} clients, waited, jobs/s", f"json-waited-{c}", "jobs_s", 0, True)
              for c in clients]
    lines += [("JSON, 64 clients, submit only, jobs/s", "json-submit-64", "jobs_s", 0, True),
              ("binary section, one client, waited, p50 ms", "binary-waited-1", "p50_ms", 2,
               False),
              ("binary section, 64 clients, waited, jobs/s", "binary-waited-64", "jobs_s", 0,
               True),
              ("CPU per job, µs: JSON, 64 clients, waited", "json-waited-64", "cpu_us_per_job",
               0, False),
              ("CPU per job, µs: JSON, 64 clients, submit only", "json-submit-64",
               "cpu_us_per_job", 0, False),
              ("CPU per job, µs: binary section, 64 clients, waited", "binary-waited-64",
               "cpu_us_per_job", 0, False)]
    out.append("| path | gpujobd | aiohttp peer | LitServe peer | gpujobd / aiohttp "
               "| gpujobd / LitServe |")
    out.append("|---|---:|---:|---:|---:|---:|")
    for label, key, field, digits, higher in lines:
        v = [cell(name, key, field) for name, _ in PATH_SERVERS]
        ratios = [ratio(v[0], p) if higher else ratio(p, v[0]) for p in v[1:]]
        out.append(f"| {label} | " + " | ".join(num(x, digits) for x in v) + " | "
                   + " | ".join("-" if x is None else f"{x:.2f}x" for x in ratios) + " |")
    errors = [f"{label} {key}: {row['errors']} of {row['requests']}"
              for (name, label) in PATH_SERVERS
              for key, row in runs[name].get("rows", {}).items() if row.get("errors")]
    body = next((r.get("body_bytes") for r in runs.values() if r.get("body_bytes")), None)
    out.append(f"\nEach job: saxpy (a = 2) on 1,024 f32 given as JSON numbers (\"data\", each the "
               f"shortest decimal of a seeded f32 in [-1, 1)), the same {num(body)}-byte body "
               "to every server, sent by wrk (a fixed body; each connection one client, on "
               "min(clients, 16) threads) to POST /v1/jobs?wait=30, which every "
               "server answers once the job is done (the peers ignore ?wait=; LitServe answers "
               "200, the others 201). Each server was first checked to answer that body with "
               "the right a*x+y. Submit only: POST /v1/jobs, answered once the job is "
               "committed and queued. The binary section rows are bench_loadgen's waited mode "
               "with the inputs as bytes after the JSON and the output back as bytes "
               "(Gpujob-Json-Length). Latencies are the client's; CPU per job is utime + stime "
               "of the server's processes (all of them: LitServe runs 4 API processes and an "
               "inference worker) over the row, divided by the jobs it answered. Ratios: "
               "above 1 means gpujobd is better (for times and CPU, the peer's over "
               "gpujobd's). gpujobd ran with server.max_connections_per_ip=0 for the 256 "
               "clients of one address; every other key at its default.\n")
    if errors:
        out.append("Rows with errors (non-2xx answers, socket errors, timeouts): "
                   + "; ".join(errors) + "\n")
    paths_floors(runs["gpujobd"], out)

    def value(name, key, field):
        return cell(name, key, field)

    r = ratio(value("gpujobd", "json-waited-64", "jobs_s"),
              value("aiohttp", "json-waited-64", "jobs_s"))
    rep.target("JSON, 64 clients waited >= 10x the aiohttp peer", r, 10, f"{num(r, 2)}x")
    r = ratio(value("gpujobd", "json-waited-64", "jobs_s"),
              value("litserve", "json-waited-64", "jobs_s"))
    rep.target("JSON, 64 clients waited >= 5x the LitServe peer", r, 5, f"{num(r, 2)}x")
    v = value("gpujobd", "json-submit-64", "jobs_s")
    rep.target("JSON, 64 clients submit only >= 15,000 jobs/s", v, 15000, f"{num(v)} jobs/s")
    cj = value("gpujobd", "json-waited-64", "cpu_us_per_job")
    cb = value("gpujobd", "binary-waited-64", "cpu_us_per_job")
    r = ratio(cj, cb)
    rep.target("daemon CPU per JSON job <= 2x per binary-section job (64 clients waited)", r, 2,
               f"{num(r, 2)}x ({num(cj)} / {num(cb)} µs)", higher_is_better=False)
    for label, key, floor_key, limit in (("JSON", "json-waited-1", "floor-json-1", 0.5),
                                         ("binary section", "binary-waited-1",
                                          "floor-binary-1", 0.3)):
        v = value("gpujobd", key, "p50_ms")
        floor = value("gpujobd", floor_key, "p50_ms")
        beside = f" (loopback HTTP floor {num(floor, 3)} ms)" if floor is not None else ""
        rep.target(f"{label}, one client waited, client p50 <= {limit} ms", v, limit,
                   f"{num(v, 3)} ms{beside}", higher_is_better=False)


def paths_floors(run, out):
    """gpujobd's one-client rows beside the loopback HTTP round trip of the same bodies to
    bench_http_sink (paths.py's floor rows), and what the daemon adds over it."""
    rows = run.get("rows", {})
    if not rows.get("floor-json-1"):
        return
    out.append("| one client, waited | gpujobd p50 / p99 ms | loopback floor p50 / p99 ms "
               "| gpujobd over the floor, p50 ms | in / out bytes |")
    out.append("|---|---:|---:|---:|---:|")
    for label, key, floor_key in (
            ("JSON numbers (wrk)", "json-waited-1", "floor-json-1"),
            ("binary section (wrk)", "binary-wrk-waited-1", "floor-binary-1"),
            ("binary section (bench_loadgen)", "binary-waited-1", "floor-binary-1")):
        r, f = rows.get(key, {}), rows.get(floor_key, {})
        over = (r["p50_ms"] - f["p50_ms"]
                if r.get("p50_ms") is not None and f.get("p50_ms") is not None else None)
        out.append(f"| {label} | {num(r.get('p50_ms'), 3)} / {num(r.get('p99_ms'), 3)} "
                   f"| {num(f.get('p50_ms'), 3)} / {num(f.get('p99_ms'), 3)} | {num(over, 3)} "
                   f"| {num(f.get('body_bytes'))} / {num(f.get('reply_bytes'))} |")
    out.append("\nThe floor: wrk at one client sends the same body to bench_http_sink "
               "(bench/http_sink.c: reads it, answers at once), which answers with as many bytes "
               "as gpujobd's answer to it (?reply_bytes=): the loopback HTTP round trip with "
               "nothing behind it. The binary section is measured by wrk too (its bytes framed "
               "as bench_loadgen frames them, the output asked back as bytes), so that its "
               "difference compares one client with itself; bench_loadgen's row is the target's.\n")


def uploads_section(rep, out):
    """Large uploads beside the disk's synced write rate and the loopback HTTP ceiling."""
    out.append("## Large uploads beside their ceilings\n")
    r = read_json(os.path.join(rep.dir, "uploads.json"))
    disk = loop = None
    rows = {}
    if not r:
        out.append(f"{rep.why_missing('uploads')}\n")
    else:
        disk = max(r.get("disk_gbps") or [0]) or None
        loop = max(r.get("loopback_gbps") or [0]) or None
        rows = r.get("rows", {})
        mib = r["bytes"] / (1 << 20)
        for key, what in (("disk_gbps", "disk"), ("loopback_gbps", "loopback"),
                          ("rows", "uploads")):
            if r.get(key + "_skipped"):
                out.append(f"Skipped, {what}: {r[key + '_skipped']}\n")

        def runs(rates):
            return ", ".join(f"{x:.2f}" for x in rates)

        def query(row):
            return f" (`{row['query']}`)" if row.get("query") else ""

        out.append("| upload | GB/s, best | each run | bound | of the bound "
                   "| daemon peak RSS after, MiB |")
        out.append("|---|---:|---:|---|---:|---:|")
        out.append(f"| ceiling: disk, dd bs=1M conv=fsync of {mib:,.0f} MiB | {num(disk, 2)} "
                   f"| {runs(r.get('disk_gbps', []))} | | | |")
        client = r.get("client", "curl -T")
        out.append(f"| ceiling: loopback HTTP, {client} to bench_http_sink | {num(loop, 2)} "
                   f"| {runs(r.get('loopback_gbps', []))} | | | |")
        for name, label, bound, ceiling in (
                ("durable", "durable buffer", "disk", disk),
                ("resident", "durable resident buffer", "disk", disk),
                ("ephemeral", "ephemeral resident buffer", "loopback", loop)):
            row = rows.get(name, {})
            if row.get("skipped") or not row.get("gbps"):
                out.append(f"| {label}{query(row)} | skipped: "
                           f"{row.get('skipped', 'no result')} | | | | |")
                continue
            best = max(row["gbps"])
            note = f" ({row['note']})" if row.get("note") else ""
            out.append(f"| {label}{query(row)}{note} | {best:.2f} | {runs(row['gbps'])} "
                       f"| {bound} | {num(ratio(best, ceiling), 2)} "
                       f"| {num(row.get('peak_rss_mib'), 0)} |")
        out.append(f"\nEvery upload is the same {client} of {mib:,.0f} MiB of zeros (Expect off, "
                   f"read from a file in {r.get('source_dir')}) to POST /v1/buffers?dtype=f32; "
                   f"the rate is its bytes over curl's time_total, the answer included. "
                   f"{r['runs']} runs each, the best counting. The loopback ceiling is a C "
                   f"server that reads each body into one buffer and drops it (bench/http_sink.c): "
                   f"what the kernel's loopback and this client give with no work behind them. "
                   f"The disk's rate is dd writing as much into the state directory's "
                   f"filesystem and fsyncing it. The daemon's peak RSS (VmHWM) is read after "
                   f"each row's runs, the rows in the order shown; its RSS before the first: "
                   f"{num(r.get('rss_start_mib'), 0)} MiB.\n")

    def frac(name, ceiling):
        rates = rows.get(name, {}).get("gbps")
        return ratio(max(rates), ceiling) if rates else None

    v = frac("ephemeral", loop)
    rep.target("ephemeral resident upload >= 0.5 of the loopback HTTP ceiling", v, 0.5,
               f"{num(v, 2)}" if v is not None else
               rows.get("ephemeral", {}).get("skipped", "-"))
    v = frac("durable", disk)
    rep.target("durable upload >= 0.8 of the disk's synced write rate", v, 0.8, f"{num(v, 2)}")


def by_device(r):
    """A run's jobs by run_device, as "0: 96, 1: 96"."""
    return ", ".join(f"{d}: {v['jobs']:,}" for d, v in sorted(r.get("per_device", {}).items()))


def scaling_table(out, title, one, every, key, lines, missing):
    """One table of a gpu_scaling.py load measure (key: gemm or tiny): the one-GPU run, the
    all-GPU run and their ratio. lines: (label, function of the measure's result giving the
    cell, number digits or None for text). A run that was not measured fills its column with
    the reason (missing when it left no result), one whose measure failed with the error."""
    names = [", ".join(map(str, r.get("devices", []))) or "-" if r and not r.get("skipped")
             else "-" for r in (one, every)]
    out.append(f"| {title} | one GPU (device {names[0]}) | all GPUs ({names[1]}) | all / one |")
    out.append("|---|---:|---:|---:|")
    for label, cell, digits in lines:
        vals, texts = [], []
        for r in (one, every):
            m = (r or {}).get(key) or {"error": missing}
            if not r or r.get("skipped") or m.get("error"):
                vals.append(None)
                texts.append(r["skipped"] if r and r.get("skipped") else
                             f"failed: {m['error']}" if r else missing)
                continue
            v = cell(m)
            vals.append(v if digits is not None else None)
            texts.append(num(v, digits) if digits is not None else str(v))
        rate = ratio(vals[1], vals[0]) if digits is not None else None
        out.append(f"| {label} | {texts[0]} | {texts[1]} | "
                   f"{'-' if rate is None else f'{rate:.2f}x'} |")
    out.append("")


def fault_summary(jobs):
    """Sleepers' ends grouped: "4 succeeded (attempts 2, device 0)"."""
    groups = {}
    for j in jobs:
        key = (j["state"], j.get("attempts"), j.get("run_device"), j.get("error"))
        groups[key] = groups.get(key, 0) + 1
    return "; ".join(f"{n} {state} (attempts {att}, device {dev}{', ' + err if err else ''})"
                     for (state, att, dev, err), n in sorted(groups.items(), key=str))


def fault_table(rep, out, f):
    """Without and with a debug_fault on the second device, beside long jobs on the first."""
    out.append(f"### A fault on device {f.get('d1', 1)} beside work on device {f.get('d0', 0)}\n")
    if not f or f.get("skipped") or not f.get("fault"):
        why = f.get("skipped") if f else None
        out.append(f"{why or rep.why_missing('gpus')}\n")
        return
    base, hit = f["baseline"], f["fault"]

    def readyz(r):
        return ", ".join(f"{t:+.2f} s: {s}" for t, s in r["readyz_changes"])

    def devices(r):
        return ", ".join(f"{d['index']}: {d['state']}, resets {d['resets']}"
                         for d in r["devices_after"])

    def ends(r):
        return fault_summary(r["sleepers"])

    def queued(r):
        return ", ".join(f"{n} {s}" for s, n in r["queued_states"].items())

    lines = [(f"sleepers on device {f['d0']} running when the queued jobs were sent",
              lambda r: f"{r['sleepers_running_at_start']} of {len(r['sleepers'])}", None),
             ("sleepers' ends (state, attempts, run_device)", ends, None),
             (f"queued jobs on device {f['d0']}: states", queued, None),
             ("queued jobs: their POST to the last one's end, s", lambda r: r["queued_end_s"],
              2),
             ("queued jobs: their POST to the median end, s",
              lambda r: r["queued_end_p50_s"], 2),
             ("the faulting job's end", lambda r: fault_summary([r["fault_job"]])
              if r["fault_job"] else "-", None),
             ("/readyz 200 again after the fault, s", lambda r: "never left 200"
              if all(st == 200 for _, st in r["readyz_changes"]) else r["readyz_back_s"], 2),
             ("/readyz changes (s from the fault, or from the queued POST)", readyz, None),
             ("every job final, s after the fault (or the queued POST)",
              lambda r: r["all_final_s"], 2),
             ("devices after (/v1/info: state, resets)", devices, None)]
    out.append("| measure | without a fault | with the fault | with / without |")
    out.append("|---|---|---|---:|")
    for label, cell, digits in lines:
        a, b = (f"failed: {r['error']}" if "error" in r else cell(r) for r in (base, hit))
        numbers = digits is not None and not isinstance(a, str) and not isinstance(b, str)
        rate = ratio(b, a) if numbers else None
        fmt = (lambda v: v if isinstance(v, str) else num(v, digits)) if digits is not None \
            else str
        out.append(f"| {label} | {fmt(a)} | {fmt(b)} | "
                   f"{'-' if rate is None else f'{rate:.2f}x'} |")
    out.append(f"\n{f['sleepers']} debug_sleep jobs of {f['sleep_ms']:,} ms (as many as device "
               f"{f['d0']} has streams) pinned to device {f['d0']}, then, once the first runs, "
               f"{f['queued']} saxpy jobs pinned there behind them; with the fault, a debug_fault "
               f"job (an illegal address in a kernel: a sticky error, the context lost) pinned "
               f"to device {f['d1']} right after. /readyz polled every 20 ms on fresh "
               f"connections; \"200 again\" is its last change back to 200.\n")


def gpus_section(rep, out):
    """gpu_scaling.py: one GPU against all of them, and a fault on one of two."""
    out.append("## One GPU against every GPU of the host (gpu_scaling.py)\n")
    one = read_json(os.path.join(rep.dir, "gpus-one.json"))
    every = read_json(os.path.join(rep.dir, "gpus-all.json"))
    fault = read_json(os.path.join(rep.dir, "gpus-fault.json"))
    if not one and not every:
        out.append(f"{rep.why_missing('gpus')}\n")
        return
    state_on = next((r.get("state_on") for r in (one, every) if r and r.get("state_on")), None)
    if state_on:
        out.append(f"Each daemon's state directory on {state_on}"
                   + (" (/dev/shm): the disk does not bound these rows.\n" if state_on == "tmpfs"
                      else ": each GEMM's output, and each tiny job, is written to it.\n"))
    gemm = next((r["gemm"] for r in (one, every) if r and "m" in r.get("gemm", {})), None)
    scaling_table(out, "large GEMM stream", one, every, "gemm", [
        ("jobs succeeded", lambda r: f"{r['succeeded']} of {r['jobs']}", None),
        ("jobs/s (first POST to last end)", lambda r: r["jobs_per_s"], 2),
        ("TFLOP/s (first POST to last end)", lambda r: r["tflops_wall"], 1),
        ("TFLOP/s (first start to last end)", lambda r: r["tflops_exec"], 1),
        ("jobs by device (run_device)", lambda r: by_device(r), None),
        ("device time by device, s (gpu_ms summed)", lambda r: ", ".join(
            f"{d}: {v['gpu_ms'] / 1e3:.2f}" for d, v in sorted(r["per_device"].items())), None),
        ("jobs not succeeded: error codes", lambda r: ", ".join(r["errors"]) or "none", None),
        ("resident buffers by device", lambda r: ", ".join(
            str(u["device"]) for u in r["uploads"]), None),
        ("outputs stored, GB/s", lambda r: r["out_gbps"], 2),
        ("batch size p50 / max", lambda r: f"{r['batch_size_p50']} / {r['batch_size_max']}",
         None)], rep.why_missing("gpus"))
    if gemm:
        out.append(f"Each job: gemm f32 a * a^T, a a resident [{gemm['m']:,}, {gemm['k']:,}] "
                   f"buffer ({gemm['buffer_bytes'] / 2**30:.2f} GiB, one per device, placed by "
                   f"the daemon), {gemm['flops_per_job'] / 1e12:.2f} TFLOP for a "
                   f"{gemm['out_bytes_per_job'] / 2**20:.0f} MiB output; {gemm['jobs']} jobs "
                   f"as {gemm['clients']} arrays POSTed at once after a warm-up job per buffer. "
                   "A job naming a resident buffer runs on its device.\n")
    tiny = next((r["tiny"] for r in (one, every) if r and "array" in r.get("tiny", {})), None)
    scaling_table(out, "tiny-job arrays", one, every, "tiny", [
        ("jobs succeeded", lambda r: f"{r['succeeded']:,} of {r['jobs']:,}", None),
        ("jobs/s (first POST to last end)", lambda r: r["jobs_per_s"], 0),
        ("jobs/s taken in (first POST to last 201)", lambda r: r["submit_jobs_per_s"], 0),
        ("jobs by device (run_device)", lambda r: by_device(r), None),
        ("POSTs sent again after a 503", lambda r: num(r["retried_posts"]), None),
        ("batch size p50", lambda r: num(r["batch_size_p50"]), None)], rep.why_missing("gpus"))
    if tiny:
        out.append(f"Arrays of {tiny['array']:,} saxpy jobs on 1,024 f32 in base64 "
                   f"(bench_loadgen's job), {tiny['arrays_per_client']} one after the other "
                   f"from each of {tiny['clients']} clients at once, after a warm-up array. The "
                   "daemon parses two large bodies at once (limits.max_large_parses) and asks "
                   "for the others again (503), sent again 20 ms later.\n")
    fault_table(rep, out, fault or {})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--gpu", default="none")
    parser.add_argument("--cores", default="?")
    parser.add_argument("--duration", default="?")
    parser.add_argument("--quick", type=int, default=0)
    parser.add_argument("--gemm-jobs", type=int, default=4096)
    args = parser.parse_args()
    rep = Report(args.dir, args.gemm_jobs)
    body = []
    tiny_section(rep, body)
    server_section(rep, body)
    gemm_section(rep, body)
    large_section(rep, body)
    memory_section(rep, body)
    paths_section(rep, body)
    uploads_section(rep, body)
    gpus_section(rep, body)

    out = ["# gpujobd end to end (bench/e2e/run.sh)\n",
           f"gpujobd on its {args.backend} backend; GPU: {args.gpu}; {args.cores} cores; "
           f"bench_loadgen rows of {args.duration} s.\n"]
    if args.quick:
        out.append("**--quick: a smoke test with short rows and small sizes; its figures do not "
                   "bear on the targets.**\n")
    out.append("## Targets\n")
    out.append("| target | measured | |\n|---|---|---|")
    out += [f"| {t} | {m} | {v} |" for t, m, v in rep.targets]
    out.append("")
    print("\n".join(out + body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
