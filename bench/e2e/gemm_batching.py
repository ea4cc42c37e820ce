#!/usr/bin/env python3
"""Many small GEMMs through one gpujobd (standard library only): run once against a daemon
with default settings and once against one started with --set scheduler.max_batch=1, and the
two results give what batching buys.

    gemm_batching.py URL [--jobs 4096] [--arrays 4] [--size 64] [--warmup 256]
                     [--encoding binary|b64] [--inputs request|resident]
                     [--mode arrays|waited|waited-arrays] [--clients 64]
                     [--answers json|binary] [--label NAME] [--json FILE]

Each job is gemm on f32 a[size,size] x b[size,size] (16 distinct pairs, reused), its inputs in
the body's binary section (Gpujob-Json-Length), each job's own bytes, or with --encoding b64 in
base64, whose parsing then bounds both runs. With --inputs resident the 16 pairs are uploaded
once as resident buffers and each job names two of them: then the arrays carry no tensor bytes,
and what the two runs differ in (one launch per job or per batch) is not hidden behind taking
in and storing 32 KiB of inputs per job. After a warm-up array, the --jobs jobs go out as
--arrays array POSTs at once, one thread each; then the client waits for all of them. The span
that counts is the daemon's: from the first POST (client clock) or the first job's started_at
to the last job's finished_at (the daemon's clock; both are this host's realtime clock), read
from the job rows, so the client's waiting and polling do not count. The client's CPU time
while it submits is reported too: far below the submit time, it shows the client is not the
limit.

With --mode waited the jobs go out one per request instead, each POSTed with ?wait= so that
its answer carries its result, from --clients client processes at once, each with one job in
flight: the span is then the client's, from the
first POST to the last answer, as the issue's batching target counts it. Batches are then at
most --clients jobs; the client processes' CPU time is reported beside it.

With --mode waited-arrays the --jobs jobs go out as --arrays arrays, each POSTed with ?wait= so
that one answer carries the results of all of its jobs, from --clients client processes (at
most one per array), each with one array in flight: one round trip per array. The span is the
client's, first POST to last answer, as in waited mode. --answers binary asks the waited modes'
answers for a binary section (the outputs' bytes after the JSON) instead of JSON numbers."""
import argparse
import base64
import multiprocessing
import struct
import sys
import threading
import time

from common import Client, mark, percentile, time_us, write_json

PAIRS = 16


def gemm_pairs(size):
    """PAIRS distinct pairs of matrices as raw f32 bytes, with small exact values."""
    pairs = []
    for p in range(PAIRS):
        pairs.append([struct.pack(f"<{size * size}f",
                                  *[((i * 7 + p * 3 + m) % 13 - 6) / 8 for i in range(size * size)])
                      for m in range(2)])
    return pairs


TENSOR = '{"dtype":"f32","shape":[%d,%d],%s}'
JOB = '{"op":"gemm","inputs":{"a":%s,"b":%s}}'


def upload_pairs(client, pairs, size):
    """Uploads each matrix of pairs as a resident buffer; returns the pairs of buffer ids."""
    path = f"/v1/buffers?dtype=f32&shape={size},{size}&resident=true"
    return [[client.request("POST", path, m, "application/octet-stream")["id"] for m in pair]
            for pair in pairs]


def array_request(pairs, size, encoding, inputs, first, count):
    """An array POST of count jobs (pairs first, first + 1, ...): (body, content type,
    headers). pairs holds the matrices' bytes, or with inputs "resident" their buffer ids."""
    if inputs == "resident":
        texts = [JOB % tuple('{"buffer":"%s"}' % b for b in pair) for pair in pairs]
        body = "[" + ",".join(texts[(first + i) % PAIRS] for i in range(count)) + "]"
        return body.encode(), "application/json", None
    if encoding == "b64":
        texts = [JOB % tuple(TENSOR % (size, size, '"b64":"%s"' % base64.b64encode(m).decode())
                             for m in pair) for pair in pairs]
        body = "[" + ",".join(texts[(first + i) % PAIRS] for i in range(count)) + "]"
        return body.encode(), "application/json", None
    jobs, section, offset = [], [], 0
    for i in range(count):
        refs = []
        for m in pairs[(first + i) % PAIRS]:
            refs.append(TENSOR % (size, size, '"binary_offset":%d' % offset))
            section.append(m)
            offset += len(m)
        jobs.append(JOB % tuple(refs))
    text = ("[" + ",".join(jobs) + "]").encode()
    return (text + b"".join(section), "application/octet-stream",
            {"Gpujob-Json-Length": str(len(text))})


def wait_all(client, after, last_ids, expected, op="gemm"):
    """Waits until the `expected` jobs of op submitted after job `after` are final and returns
    their rows: first a long-poll on the last job of each array, then the listing, then a
    long-poll on each job the listing still shows unfinished."""
    for job_id in last_ids:
        client.wait(job_id)
    while True:
        rows = client.list_jobs(after, op=op)
        pending = [j["id"] for j in rows if j["state"] in ("queued", "running")]
        if len(rows) >= expected and not pending:
            return rows
        for job_id in pending:
            client.wait(job_id)
        if not pending:
            raise RuntimeError(f"listed {len(rows)} {op} jobs, expected {expected}")


def post_array(url, request, ids, index):
    body, content_type, headers = request
    ids[index] = [j["id"] for j in Client(url).request("POST", "/v1/jobs", body, content_type,
                                                       headers)]


def waited_client(url, requests, single, accept, start, results):
    """One client process: POSTs its requests (array_request triples; single: each an array of
    one, sent as the single job) one after the other with ?wait=, from the moment start is set,
    and puts (first POST, last answer, CPU seconds, jobs not succeeded) on results; times in µs
    of the realtime clock."""
    client = Client(url)
    start.wait()
    t0_us, cpu0, failed = int(time.time() * 1e6), time.process_time(), 0
    for body, content_type, headers in requests:
        if single:
            body = body[1:-1]
        answer = client.request("POST", "/v1/jobs?wait=300", body, content_type,
                                {**(headers or {}), "Accept": accept})
        failed += sum(j["state"] != "succeeded" for j in (answer if not single else [answer]))
    results.put((t0_us, int(time.time() * 1e6), time.process_time() - cpu0, failed))


def run_waited(url, pairs, size, jobs, clients, inputs, arrays, encoding, accept):
    """The waited modes: jobs single waited POSTs (arrays 0) or arrays waited POSTs of them
    from clients processes; returns the first POST's time, the span from it to the last answer,
    the clients' CPU time and how many jobs did not succeed."""
    if not arrays and inputs != "resident":
        raise SystemExit("--mode waited takes --inputs resident")
    if arrays:
        per_array = [jobs // arrays + (i < jobs % arrays) for i in range(arrays)]
        firsts = [sum(per_array[:i]) for i in range(arrays)]
        requests = [array_request(pairs, size, encoding, inputs, f, n)
                    for f, n in zip(firsts, per_array)]
    else:
        requests = [array_request(pairs, size, "binary", inputs, i, 1) for i in range(jobs)]
    clients = min(clients, len(requests))
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=waited_client,
                         args=(url, requests[c::clients], not arrays, accept, start, results))
             for c in range(clients)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every client connected and waiting
    start.set()
    got = [results.get() for _ in procs]
    for p in procs:
        p.join()
    t0_us = min(g[0] for g in got)
    return t0_us, (max(g[1] for g in got) - t0_us) / 1e6, sum(g[2] for g in got), \
        sum(g[3] for g in got)


def run(url, jobs, arrays, size, warmup, encoding, inputs, mode="arrays", clients=64,
        answers="json"):
    client = Client(url)
    pairs = gemm_pairs(size)
    if inputs == "resident":
        pairs = upload_pairs(client, pairs, size)
    if warmup:
        after = mark(client)
        body, content_type, headers = array_request(pairs, size, encoding, inputs, 0, warmup)
        ids = [j["id"] for j in client.request("POST", "/v1/jobs", body, content_type, headers)]
        wait_all(client, after, [ids[-1]], warmup)

    if mode != "arrays":
        after = mark(client)
        waited_arrays = arrays if mode == "waited-arrays" else 0
        accept = "application/octet-stream" if answers == "binary" else "application/json"
        t0_us, span_s, client_cpu_s, failed = run_waited(url, pairs, size, jobs, clients,
                                                         inputs, waited_arrays, encoding, accept)
        rows = client.list_jobs(after, op="gemm")
        return summary(rows, t0_us, span_s, client_cpu_s, arrays=waited_arrays, size=size,
                       encoding=encoding, inputs=inputs, mode=mode,
                       clients=min(clients, waited_arrays or jobs), answers=answers,
                       failed=failed)

    per_array = [jobs // arrays + (i < jobs % arrays) for i in range(arrays)]
    bodies = [array_request(pairs, size, encoding, inputs, i, n) for i, n in enumerate(per_array)]
    after = mark(client)
    ids = [None] * arrays
    threads = [threading.Thread(target=post_array, args=(url, b, ids, i))
               for i, b in enumerate(bodies)]
    t0_us, cpu0 = int(time.time() * 1e6), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    submit_s = time.time() - t0_us / 1e6
    client_cpu_s = time.process_time() - cpu0
    if any(i is None for i in ids):
        raise RuntimeError("an array POST failed (see above)")
    rows = wait_all(client, after, [i[-1] for i in ids], jobs)
    return summary(rows, t0_us, submit_s, client_cpu_s, arrays=arrays, size=size,
                   encoding=encoding, inputs=inputs, mode=mode)


def summary(rows, t0_us, submit_s, client_cpu_s, **fields):
    """The result of a run whose first POST went out at t0_us, from its jobs' rows. In waited
    mode submit_s is the client's span, first POST to last answer, which the daemon's rows
    (to the last finished_at) can only undercount."""
    done = [j for j in rows if j["state"] == "succeeded"]
    last_us = max(time_us(j["finished_at"]) for j in rows)
    first_start_us = min(time_us(j["started_at"]) for j in rows if j["started_at"])
    wall_s = (last_us - t0_us) / 1e6
    if fields.get("mode") in ("waited", "waited-arrays"):
        wall_s = submit_s
    exec_s = (last_us - first_start_us) / 1e6
    return {
        "jobs": len(rows),
        "succeeded": len(done),
        **fields,
        "submit_s": submit_s,
        "client_cpu_s": client_cpu_s,
        "wall_s": wall_s,
        "jobs_per_s_wall": len(rows) / wall_s,
        "exec_s": exec_s,
        "jobs_per_s_exec": len(rows) / exec_s if exec_s > 0 else None,
        "batch_size_p50": percentile([j["batch_size"] for j in rows], 0.5),
        "batch_size_max": max((j["batch_size"] or 0) for j in rows),
        "gpu_ms_total": sum(j["gpu_ms"] or 0 for j in rows),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--jobs", type=int, default=4096)
    parser.add_argument("--arrays", type=int, default=4)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=256)
    parser.add_argument("--encoding", choices=("binary", "b64"), default="binary")
    parser.add_argument("--inputs", choices=("request", "resident"), default="request")
    parser.add_argument("--mode", choices=("arrays", "waited", "waited-arrays"),
                        default="arrays")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--answers", choices=("json", "binary"), default="json")
    parser.add_argument("--label", default="")
    parser.add_argument("--json")
    args = parser.parse_args()
    r = run(args.url, args.jobs, args.arrays, args.size, args.warmup, args.encoding, args.inputs,
            args.mode, args.clients, args.answers)
    r["label"] = args.label
    write_json(args.json, r)
    print(f"gemm {args.label}: {r['succeeded']} of {r['jobs']} succeeded, "
          f"{r['jobs_per_s_wall']:.0f} jobs/s from the first POST, batch p50 "
          f"{r['batch_size_p50']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
