#!/usr/bin/env python3
"""One GPU against every GPU of the host, and a fault on one of two, through gpujobd on its CUDA
backend (standard library only).

    gpu_scaling.py URL --measure load [--label NAME] [--min-devices N] [--quick]
                   [--gemm-m 2048] [--gemm-k 262144] [--gemm-jobs 192] [--gemm-clients 8]
                   [--tiny-clients 8] [--tiny-arrays 10] [--state-on WHERE] [--json FILE]
    gpu_scaling.py URL --measure fault [--min-devices 2] [--quick] [--sleep-ms 2000]
                   [--queued 64] [--state-on WHERE] [--json FILE]

run.sh's gpus part runs --measure load against a daemon started with gpu.devices=0 (one GPU)
and against one with every GPU (the default), and --measure fault against a third, started with
debug.test_ops=true, each with its state dir on tmpfs where /dev/shm has room (--state-on says
where, for the report). A daemon with fewer devices in /v1/info than --min-devices is not
measured: the JSON then says so ("needs 2 GPUs (found 1)").

--measure load, two streams one after the other:
- A large GEMM stream. Resident f32 buffers of [m, k] are uploaded (POST /v1/buffers
  ?resident=true) until each device holds one, or 2 x devices uploads were made: the daemon
  places each on the device with the most room and says where in its answer. Each job is
  gemm(a, b, trans_b) with a and b the same buffer, out = a * a^T of [m, m]: 2 m^2 k flops
  (2.2 TFLOP at the defaults, 8192^3's flops twice over) for an output of 16 MiB, so that the
  daemon storing each output on disk does not bound the stream as 8192^3's 256 MiB would. A
  job naming a resident buffer runs on its device, and the jobs take the buffers in turn, so
  every device gets its share. After one warm-up job per buffer, --gemm-jobs jobs go out from
  --gemm-clients threads at once, one array POST each; the span counts from the first POST
  (client clock) to the last finished_at (the daemon's clock; both this host's realtime clock).
- Tiny-job arrays: --tiny-clients threads each POST --tiny-arrays arrays of 1,000 saxpy jobs on
  1,024 f32 in base64 (bench_loadgen's job), one after the other, after one warm-up array; the
  span likewise from the first POST to the last finished_at. The daemon parses at most
  limits.max_large_parses (2) such bodies at once and answers 503 to the others, which are
  sent again 20 ms later (counted).
Of both: jobs/s, TFLOP/s (the GEMMs), and how many jobs ran on each device (run_device), read
from the job rows.

--measure fault, on the first two devices (d0, d1): as many debug_sleep jobs of --sleep-ms as
d0 has streams, pinned to d0 ("device"), and once the first runs, --queued saxpy jobs pinned to
d0 behind them. First without a fault (the baseline), then the same with a debug_fault job
pinned to d1 submitted at once after the queued ones. A thread polls /readyz every 20 ms
meanwhile, each poll on a fresh connection (a restart in place closes connections). Written:
the time from the fault's submission to /readyz answering 200 again after it last did not,
each /readyz status change, what became of d0's sleepers (state, attempts, run_device, error),
how long d0's queued jobs took from their POST to the last one's end (beside the baseline's),
the faulting job's end, and each device's state and resets from /v1/info after."""
import argparse
import http.client
import json
import struct
import sys
import threading
import time
import urllib.parse

from common import Client, mark, percentile, tiny_job, time_us, write_json
from gemm_batching import post_array, wait_all

TINY_ARRAY = 1000
READY_POLL_S = 0.02
RETRY_S = 0.02
RETRY_FOR_S = 120
SETTLE_S = 15  # how long past a fault scenario's budget /readyz may take to stay 200


def log(text):
    print(f"gpus: {text}", file=sys.stderr, flush=True)


def devices_of(client):
    """/v1/info's backend.devices (empty on the CPU backend)."""
    return client.request("GET", "/v1/info")["backend"].get("devices") or []


def matrix_bytes(m, k):
    """m x k f32 of small exact values (eighths in [-0.75, 0.75]), built from a repeated row."""
    row = struct.pack(f"<{k}f", *[((i * 7) % 13 - 6) / 8 for i in range(k)])
    return row * m


def upload_residents(client, devices, m, k):
    """Uploads [m, k] resident buffers until each device holds one (at most 2 x devices
    uploads, one when there are no devices); returns {device: buffer id} and every upload as
    (id, device, seconds)."""
    data = matrix_bytes(m, k)
    path = f"/v1/buffers?dtype=f32&shape={m},{k}&resident=true"
    want = {d["index"] for d in devices}
    held, uploads = {}, []
    for _ in range(max(2 * len(want), 1)):
        t = time.perf_counter()
        buf = client.request("POST", path, data, "application/octet-stream")
        uploads.append((buf["id"], buf.get("device"), time.perf_counter() - t))
        held.setdefault(buf.get("device"), buf["id"])
        if want <= set(held) or not want:
            break
    return held, uploads


def per_device(rows):
    """Jobs and summed gpu_ms of rows, by run_device (as a string; "none" for null)."""
    out = {}
    for j in rows:
        d = out.setdefault(str(j.get("run_device", "none")).lower(), {"jobs": 0, "gpu_ms": 0.0})
        d["jobs"] += 1
        d["gpu_ms"] += j.get("gpu_ms") or 0
    return out


def spans(rows, t0_us):
    """From the first POST (t0_us) and from the first started_at to the last finished_at, s."""
    last = max(time_us(j["finished_at"]) for j in rows if j["finished_at"])
    first = min((time_us(j["started_at"]) for j in rows if j["started_at"]), default=t0_us)
    return (last - t0_us) / 1e6, (last - first) / 1e6


def run_together(threads):
    """Starts the clients' threads at once and joins them: the realtime clock at the start (µs,
    the first POST's time, as the job rows' times count) and the seconds until the last one
    returned."""
    t0_us = int(time.time() * 1e6)
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return t0_us, time.time() - t0_us / 1e6


def gemm_stream(url, devices, m, k, jobs, clients):
    client = Client(url)
    t = time.perf_counter()
    held, uploads = upload_residents(client, devices, m, k)
    log(f"gemm: {len(uploads)} uploads of {m * k * 4 / 2**30:.2f} GiB in "
        f"{time.perf_counter() - t:.1f} s; on devices {sorted(map(str, held))}")
    bufs = [held[d] for d in sorted(held, key=str)]
    texts = ['{"op":"gemm","params":{"trans_b":true},"inputs":{"a":{"buffer":"%s"},'
             '"b":{"buffer":"%s"}}}' % (b, b) for b in bufs]
    warm = client.submit("[" + ",".join(texts) + "]")
    for j in warm:
        client.wait(j["id"], 300)
    shares = [jobs // clients + (c < jobs % clients) for c in range(clients)]
    requests = [(("[" + ",".join(texts[i % len(texts)] for i in range(n)) + "]").encode(),
                 "application/json", None) for n in shares if n]
    after = mark(client)
    ids = [None] * len(requests)
    t0_us, submit_s = run_together([threading.Thread(target=post_array, args=(url, r, ids, i))
                                     for i, r in enumerate(requests)])
    if any(i is None for i in ids):
        raise RuntimeError("a gemm array POST failed (see above)")
    rows = wait_all(client, after, [i[-1] for i in ids], jobs)
    wall_s, exec_s = spans(rows, t0_us)
    done = [j for j in rows if j["state"] == "succeeded"]
    flops = 2.0 * m * m * k
    r = {
        "m": m, "k": k, "flops_per_job": flops, "out_bytes_per_job": 4 * m * m,
        "buffer_bytes": 4 * m * k,
        "uploads": [{"id": i, "device": d, "seconds": s} for i, d, s in uploads],
        "jobs": len(rows), "succeeded": len(done), "clients": len(requests),
        "submit_s": submit_s, "wall_s": wall_s, "exec_s": exec_s,
        "jobs_per_s": len(done) / wall_s if wall_s > 0 else None,
        "tflops_wall": len(done) * flops / wall_s / 1e12 if wall_s > 0 else None,
        "tflops_exec": len(done) * flops / exec_s / 1e12 if exec_s > 0 else None,
        "out_gbps": len(done) * 4 * m * m / wall_s / 1e9 if wall_s > 0 else None,
        "batch_size_p50": percentile([j["batch_size"] for j in rows], 0.5),
        "batch_size_max": max((j["batch_size"] or 0) for j in rows),
        "per_device": per_device(done),
        "errors": sorted({(j.get("error") or {}).get("code", "?") for j in rows
                          if j["state"] != "succeeded"}),
    }
    for b, _, _ in uploads:  # every upload, also one to a device that held one already
        client.request("DELETE", f"/v1/buffers/{b}")
    log(f"gemm: {r['succeeded']} of {r['jobs']} succeeded, {r['jobs_per_s'] or 0:.1f} jobs/s, "
        f"{r['tflops_wall'] or 0:.1f} TFLOP/s from the first POST; by device "
        f"{ {d: v['jobs'] for d, v in r['per_device'].items()} }")
    return r


def post_arrays(url, body, count, last_ids, retries, index):
    """One client: count array POSTs of body, one after the other; the last id of each into
    last_ids[index]. A POST answered 503 (every slot for parsing a large body taken: the daemon
    asks for it again shortly) or cut off is sent again on a new connection after RETRY_S, up
    to RETRY_FOR_S; retries[index] counts them."""
    client, ids, retries[index] = Client(url), [], 0
    until = time.time() + RETRY_FOR_S
    while len(ids) < count:
        try:
            ids.append(client.submit(body)[-1]["id"])
        except (OSError, http.client.HTTPException, RuntimeError) as e:
            if "HTTP 503" not in str(e) and isinstance(e, RuntimeError) or time.time() > until:
                raise
            retries[index] += 1
            time.sleep(RETRY_S)
            client = Client(url)
    last_ids[index] = ids


def tiny_arrays(url, clients, arrays):
    client = Client(url)
    body = "[" + ",".join([tiny_job()] * TINY_ARRAY) + "]"
    warm = [None]
    post_arrays(url, body, 1, warm, [0], 0)
    client.wait(warm[0][-1])
    after = mark(client)
    last, retries = [None] * clients, [0] * clients
    t0_us, submit_s = run_together([
        threading.Thread(target=post_arrays, args=(url, body, arrays, last, retries, c))
        for c in range(clients)])
    if any(x is None for x in last):
        raise RuntimeError("a tiny array POST failed (see above)")
    expected = clients * arrays * TINY_ARRAY
    rows = wait_all(client, after, [i for ids in last for i in ids], expected, op="saxpy")
    wall_s, exec_s = spans(rows, t0_us)
    done = [j for j in rows if j["state"] == "succeeded"]
    r = {
        "array": TINY_ARRAY, "clients": clients, "arrays_per_client": arrays,
        "jobs": len(rows), "succeeded": len(done), "submit_s": submit_s,
        "wall_s": wall_s, "exec_s": exec_s,
        "jobs_per_s": len(done) / wall_s if wall_s > 0 else None,
        "submit_jobs_per_s": len(rows) / submit_s if submit_s > 0 else None,
        "retried_posts": sum(retries),
        "batch_size_p50": percentile([j["batch_size"] for j in rows], 0.5),
        "per_device": per_device(done),
    }
    log(f"tiny: {r['succeeded']} of {r['jobs']} succeeded, {r['jobs_per_s'] or 0:,.0f} jobs/s; "
        f"by device { {d: v['jobs'] for d, v in r['per_device'].items()} }")
    return r


def failed(what, e):
    """A measure that raised, as its result: the run goes on and writes what it has."""
    log(f"{what} failed: {type(e).__name__}: {e}")
    return {"error": f"{type(e).__name__}: {e}"[:300]}


def measure_load(url, args, devices):
    r = {}
    try:
        r["gemm"] = gemm_stream(url, devices, args.gemm_m, args.gemm_k, args.gemm_jobs,
                                args.gemm_clients)
    except Exception as e:  # noqa: BLE001 (any failure is written down, the rest goes on)
        r["gemm"] = failed("gemm", e)
    try:
        r["tiny"] = tiny_arrays(url, args.tiny_clients, args.tiny_arrays)
    except Exception as e:  # noqa: BLE001
        r["tiny"] = failed("tiny", e)
    return r


class ReadyWatch:
    """Polls GET /readyz every READY_POLL_S on a fresh connection each time, in a thread, and
    keeps each change of its answer: (seconds since start, HTTP status or "no answer")."""

    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.t0 = time.time()
        self.changes = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def poll(self):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
        try:
            conn.request("GET", "/readyz")
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except (OSError, http.client.HTTPException):
            return "no answer"
        finally:
            conn.close()

    def run(self):
        while not self.stop.is_set():
            status = self.poll()
            if not self.changes or self.changes[-1][1] != status:
                self.changes.append((time.time() - self.t0, status))
            self.stop.wait(READY_POLL_S)

    def finish(self, since):
        """Stops polling; returns the changes with times from `since` (realtime, s) and the
        time from `since` to the last change to 200 after a status other than 200 (None when
        /readyz never answered otherwise)."""
        self.stop.set()
        self.thread.join()
        changes = [(round(t + self.t0 - since, 3), s) for t, s in self.changes]
        back = None
        for (_, before), (t, now) in zip(changes, changes[1:]):
            if now == 200 and before != 200:
                back = t
        return changes, back


def submit_retrying(url, text, deadline):
    """POSTs text (one job or an array) on a fresh connection, again until deadline while the
    daemon does not answer or answers 503 (it may be restarting); returns the 201's JSON."""
    while True:
        try:
            return Client(url, timeout=30).submit(text)
        except (OSError, http.client.HTTPException, RuntimeError) as e:
            if isinstance(e, RuntimeError) and "HTTP 503" not in str(e) or time.time() > deadline:
                raise RuntimeError(f"POST /v1/jobs, not sent again: {e}")
            time.sleep(0.1)


def final_job(url, job_id, deadline):
    """The job once final, long-polling on fresh connections until deadline: a restart in
    place ends connections and a draining daemon may answer 503, so both are tried again.
    Past the deadline, what the daemon last said of it (state "not final by the deadline"
    when it said nothing), so that the run still writes what it saw."""
    last = {"id": job_id, "state": "not final by the deadline", "finished_at": None}
    while True:
        left = int(deadline - time.time())
        try:
            client = Client(url, timeout=max(left, 0) + 10)
            last = client.request("GET", f"/v1/jobs/{job_id}")
            if last["state"] not in ("queued", "running") or left <= 0:
                return last
            return client.wait(job_id, min(left, 10))
        except (OSError, http.client.HTTPException, RuntimeError):
            if left <= 0:
                return last
            time.sleep(0.1)


def job_end(job):
    return {"id": job["id"], "state": job["state"], "attempts": job.get("attempts"),
            "run_device": job.get("run_device"),
            "error": (job.get("error") or {}).get("code"),
            "message": (job.get("error") or {}).get("message")}


def settle(watch, t_final, deadline):
    """After a fault, waits until /readyz has answered 200 for a second, and at least 3 s after
    the last job ended (the daemon may restart once more), or until deadline."""
    while time.time() < deadline:
        changes = list(watch.changes)
        steady = changes and changes[-1][1] == 200 and \
            time.time() - (watch.t0 + changes[-1][0]) >= 1
        if steady and time.time() >= t_final + 3:
            return
        time.sleep(0.1)


def fault_scenario(url, d0, d1, sleepers, sleep_ms, queued, fault, budget_s):
    """d0 busy with sleepers and queued jobs behind them; with fault, a debug_fault job on d1.
    Returns what became of each job, and /readyz meanwhile."""
    watch = ReadyWatch(url)
    try:
        return fault_run(url, watch, d0, d1, sleepers, sleep_ms, queued, fault, budget_s)
    finally:
        watch.stop.set()


def fault_run(url, watch, d0, d1, sleepers, sleep_ms, queued, fault, budget_s):
    deadline = time.time() + budget_s
    sleep = json.dumps({"op": "debug_sleep", "device": d0, "params": {"ms": sleep_ms},
                        "inputs": {"x": {"dtype": "f32", "shape": [4], "data": [1, 2, 3, 4]}}})
    saxpy = json.loads(tiny_job())
    saxpy["device"] = d0
    sleeper_ids = [j["id"] for j in submit_retrying(url, "[" + ",".join([sleep] * sleepers)
                                                    + "]", deadline)]
    client = Client(url)
    while client.request("GET", f"/v1/jobs/{sleeper_ids[0]}")["state"] == "queued":
        if time.time() > deadline:
            raise RuntimeError("the first sleeper did not start")
        time.sleep(0.01)
    running = sum(client.request("GET", f"/v1/jobs/{i}")["state"] == "running"
                  for i in sleeper_ids)
    t_queued = time.time()
    queued_ids = [j["id"] for j in submit_retrying(url, json.dumps([saxpy] * queued), deadline)]
    fault_id, t_fault = None, None
    if fault:
        t_fault = time.time()
        fault_id = submit_retrying(url, json.dumps(
            {"op": "debug_fault", "device": d1,
             "inputs": {"x": {"dtype": "f32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]}}}),
            deadline)["id"]
    ends = {i: final_job(url, i, deadline) for i in sleeper_ids + queued_ids
            + ([fault_id] if fault_id else [])}
    t_final = time.time()
    if fault:
        settle(watch, t_final, deadline + SETTLE_S)
    changes, back_s = watch.finish(t_fault or t_queued)
    qrows = [ends[i] for i in queued_ids]
    q_end = [time_us(j["finished_at"]) for j in qrows if j["finished_at"]]
    r = {
        "fault": fault, "sleepers_running_at_start": running,
        "sleepers": [job_end(ends[i]) for i in sleeper_ids],
        "queued": len(queued_ids),
        "queued_states": {s: sum(j["state"] == s for j in qrows)
                          for s in sorted({j["state"] for j in qrows})},
        "queued_attempts_max": max(((j.get("attempts") or 0) for j in qrows), default=0),
        "queued_end_s": (max(q_end) / 1e6 - t_queued) if q_end else None,
        "queued_end_p50_s": (percentile(q_end, 0.5) / 1e6 - t_queued) if q_end else None,
        "all_final_s": t_final - (t_fault or t_queued),
        "readyz_changes": changes,
        "readyz_back_s": back_s,
        "fault_job": job_end(ends[fault_id]) if fault_id else None,
        "devices_after": [],
    }
    for _ in range(100):
        try:
            r["devices_after"] = [{"index": d["index"], "state": d.get("state"),
                                   "resets": d.get("resets")}
                                  for d in devices_of(Client(url, timeout=10))]
            break
        except (OSError, http.client.HTTPException, RuntimeError):
            time.sleep(0.1)
    return r


def measure_fault(url, args, devices):
    d0 = devices[0]["index"] if devices else 0
    d1 = devices[1]["index"] if len(devices) > 1 else 1
    sleepers = devices[0].get("streams", 4) if devices else 2
    r = {"d0": d0, "d1": d1, "sleep_ms": args.sleep_ms, "sleepers": sleepers,
         "queued": args.queued}
    budget = 30 if args.quick else 60
    for name, fault in (("baseline", False), ("fault", True)):
        log(f"fault: {name}: {sleepers} debug_sleep of {args.sleep_ms} ms and {args.queued} "
            f"saxpy pinned to device {d0}" + (f", debug_fault on device {d1}" if fault else ""))
        try:
            r[name] = s = fault_scenario(url, d0, d1, sleepers, args.sleep_ms, args.queued,
                                         fault, budget)
        except Exception as e:  # noqa: BLE001 (written down; the run goes on)
            r[name] = failed(f"fault: {name}", e)
            continue
        log(f"fault: {name}: queued jobs ended in {s['queued_end_s'] or 0:.2f} s; sleepers "
            f"{[(j['state'], j['attempts'], j['run_device']) for j in s['sleepers']]}; "
            f"/readyz {s['readyz_changes']}; devices after {s['devices_after']}")
    return r


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--measure", choices=("load", "fault"), required=True)
    parser.add_argument("--label", default="")
    parser.add_argument("--min-devices", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gemm-m", type=int)
    parser.add_argument("--gemm-k", type=int)
    parser.add_argument("--gemm-jobs", type=int)
    parser.add_argument("--gemm-clients", type=int, default=8)
    parser.add_argument("--tiny-clients", type=int)
    parser.add_argument("--tiny-arrays", type=int)
    parser.add_argument("--sleep-ms", type=int)
    parser.add_argument("--queued", type=int, default=64)
    parser.add_argument("--state-on", default="", help="where the daemon's state dir is, "
                        "as the report should say (tmpfs, disk)")
    parser.add_argument("--json")
    args = parser.parse_args()
    # The defaults, full and --quick (a smoke test: figures that bear on nothing).
    for key, full, quick in (("gemm_m", 2048, 1024), ("gemm_k", 262144, 16384),
                             ("gemm_jobs", 192, 32), ("tiny_clients", 8, 4),
                             ("tiny_arrays", 10, 2), ("sleep_ms", 2000, 1000)):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    devices = devices_of(Client(args.url))
    r = {"label": args.label, "measure": args.measure, "state_on": args.state_on,
         "devices": [d["index"] for d in devices],
         "device_names": [d.get("name") for d in devices]}
    if len(devices) < args.min_devices:
        plural = "s" if args.min_devices > 1 else ""
        r["skipped"] = f"needs {args.min_devices} GPU{plural} (found {len(devices)})"
        log(f"{' '.join(filter(None, (args.measure, args.label)))}: {r['skipped']}")
    elif args.measure == "load":
        r.update(measure_load(args.url, args, devices))
    else:
        r.update(measure_fault(args.url, args, devices))
    write_json(args.json, r)
    errors = [k for k, v in r.items() if isinstance(v, dict) and "error" in v]
    if errors:
        log(f"failed: {', '.join(errors)} (the JSON says why)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
