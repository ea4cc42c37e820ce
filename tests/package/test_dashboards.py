#!/usr/bin/env python3
"""The Grafana dashboard (config/grafana-gpujobd.json) and the Prometheus alert rules
(config/prometheus-alerts.yml) against what gpujobd exports.

- The dashboard parses as a Grafana dashboard model: a title, a uid, a schema version, panels
  with a type and a position, and a PromQL expression in every target of every panel.
- `promtool check rules` (Debian's prometheus package) passes on the alert rules, and on the
  dashboard's expressions written out as recording rules, which checks their PromQL syntax.
- Every metric name that an expression of either file uses is a family that a running
  gpujobd (CPU backend, started here) exports on /metrics; _bucket, _sum and _count count as
  their histogram's or summary's family. `up` is Prometheus's own series. The GPU families
  (gpujobd_gpu_*) are exported only by a daemon that samples GPUs: without a GPU they are
  checked against the names in the /metrics writers' source instead, and with one (nvidia-smi
  lists a device) a second daemon on backend auto must export them.
- The histograms behind the latency and batch size panels agree with the job and batch
  counters after jobs that ran.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import yaml

SRC = os.environ.get("GPUJOB_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
GPUJOBD = os.environ["GPUJOBD_BIN"]
DASHBOARD = os.path.join(SRC, "config", "grafana-gpujobd.json")
ALERTS = os.path.join(SRC, "config", "prometheus-alerts.yml")
# The writers of /metrics: where the GPU families' names are, for a daemon without GPUs.
METRICS_SOURCES = [os.path.join(SRC, "api", "handlers_system.c"),
                   os.path.join(SRC, "daemon", "exec", "gpu_metrics.c")]
# /metrics of a daemon on an NVIDIA H200 (tests/fixtures/h200/README says how it was made).
H200_METRICS = os.path.join(SRC, "tests", "fixtures", "h200", "metrics.txt")
PROMETHEUS_OWN = {"up"}
WAIT_S = 20
LONG_JOB_MS = 60000
# Tokens for three users, admin the administrator; one CPU worker, which a long debug_sleep
# holds while other jobs queue.
USERS_CONFIG = """\
[auth]
mode = token
admins = admin
[scheduler]
cpu_threads = 1
[debug]
test_ops = true
"""
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                   "group_left", "group_right", "inf", "nan"}
# Grafana's variables, replaced by values that Prometheus accepts for promtool's check.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
                "$instance": ".*"}

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def dashboard_exprs(dash):
    """The PromQL of every target, and the metrics of label_values() template queries."""
    for key in ("title", "uid", "schemaVersion", "panels"):
        if key not in dash:
            fail(f"dashboard: no '{key}'")
    exprs, template_metrics = [], []
    for p in dash.get("panels", []):
        if not isinstance(p.get("gridPos"), dict) or "type" not in p or "id" not in p:
            fail(f"dashboard panel {p.get('title')!r}: no id, type or gridPos")
        if p.get("type") == "row":
            continue
        if not p.get("targets"):
            fail(f"dashboard panel {p.get('title')!r}: no targets")
        for t in p.get("targets", []):
            if not t.get("expr"):
                fail(f"dashboard panel {p.get('title')!r}: a target without expr")
            else:
                exprs.append((p["title"], t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("definition") or ""
        m = re.match(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,", q)
        if v.get("type") == "query":
            if not m:
                fail(f"dashboard variable {v.get('name')}: not label_values(metric, label)")
            else:
                template_metrics.append(m.group(1))
    return exprs, template_metrics


def grafana_to_promql(expr):
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    if "$" in expr:
        fail(f"dashboard: unknown variable in {expr!r}")
    return expr


def metric_names(expr):
    """The metric names an expression selects: identifiers that are not functions, keywords,
    label names (inside {} or a by/without/on/ignoring/group_x list) or durations."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        before = e[m.start() - 1] if m.start() else " "
        if before.isdigit() or before == ".":
            continue  # a number's exponent or a duration's unit
        if re.match(r"\s*\(", e[m.end():]) or word.lower() in PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def check_with_promtool(rule_groups, label):
    path = os.path.join(workdir, f"{label}.yml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump({"groups": rule_groups}, f)
    r = subprocess.run(["promtool", "check", "rules", path], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"promtool check rules on the {label}:\n{r.stdout}{r.stderr}")


class Daemon:
    """gpujobd on a free loopback port: with no config auth none (loopback clients are
    administrators); with one, a token per user in tokens (`gpujobd token create`), the
    requests made as admin."""

    def __init__(self, backend, config=None, users=()):
        self.state = tempfile.mkdtemp(dir=workdir)
        self.port = None
        self.ready = threading.Event()
        self.log = []
        common = ["--state-dir", self.state]
        if config:
            path = os.path.join(self.state, "gpujobd.conf")
            with open(path, "w", encoding="utf-8") as f:
                f.write(config)
            common += ["--config", path]
        self.tokens = {}
        for user in users:
            out = subprocess.run([GPUJOBD, "token", "create", *common, "--user", user, "--name",
                                  "dashboards"], check=True, capture_output=True, text=True)
            self.tokens[user] = out.stdout.strip().splitlines()[-1]
        self.proc = subprocess.Popen(
            [GPUJOBD, *common, "--listen", "127.0.0.1:0", "--backend", backend,
             "--log-level", "info"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self.read_log, daemon=True).start()
        if not self.ready.wait(30) or self.port is None:
            self.stop()
            raise RuntimeError("gpujobd did not start:\n" + "\n".join(self.log[-30:]))

    def read_log(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.append(line)
            m = re.search(r"listening on http://\S+:(\d+)", line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self.ready.set()
        self.ready.set()

    def request(self, path, user, **kw):
        headers = {"Content-Type": "application/json"}
        if user in self.tokens:
            headers["Authorization"] = "Bearer " + self.tokens[user]
        return urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers,
                                      **kw)

    def get(self, path, user="admin"):
        with urllib.request.urlopen(self.request(path, user), timeout=30) as r:
            return r.read().decode()

    def post(self, path, body, user="admin"):
        req = self.request(path, user, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def exported(self):
        return exported_names(self.get("/metrics"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def exported_names(text):
    """The sample names a /metrics answer may carry, from its # TYPE lines."""
    names = set()
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
        name, kind = m.groups()
        names.add(name)
        if kind in ("histogram", "summary"):
            names.update({name + "_sum", name + "_count"})
        if kind == "histogram":
            names.add(name + "_bucket")
    return names


def samples(text):
    """{(name, labels text): value} of a /metrics answer."""
    out = {}
    for m in re.finditer(r"^([a-z_:]+)(\{[^}]*\})? (\S+)$", text, re.M):
        out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def check_histograms(d):
    """The histograms the dashboard reads agree with the counters, after JOBS jobs that each
    waited for their end: one latency observation per ended job, one batch observation per
    batch with the batch's jobs as its sum, buckets cumulative up to +Inf = count."""
    jobs = 12
    for i in range(jobs):
        r = d.post("/v1/jobs?wait=30", {"op": "add", "inputs": {
            "x": {"dtype": "f32", "shape": [2], "data": [i, 1]},
            "y": {"dtype": "f32", "shape": [2], "data": [1, i]}}})
        if r.get("state") != "succeeded":
            fail(f"a job did not succeed within its wait: {r}")
    m = samples(d.get("/metrics"))
    ended = m[("gpujobd_jobs_succeeded_total", "")] + m[("gpujobd_jobs_failed_total", "")]
    if ended != jobs:
        fail(f"{jobs} jobs waited for, {ended} counted as ended")
    expect = {"gpujobd_job_latency_seconds": ended,
              "gpujobd_batch_jobs": m[("gpujobd_batches_total", "")]}
    for family, count in expect.items():
        buckets = [(k[1], v) for k, v in m.items() if k[0] == family + "_bucket"]
        values = [v for _, v in buckets]
        if values != sorted(values) or buckets[-1][0] != '{le="+Inf"}':
            fail(f"{family}: buckets not cumulative up to +Inf: {buckets}")
        if m[(family + "_count", "")] != count or values[-1] != count:
            fail(f"{family}: count {m[(family + '_count', '')]}, +Inf {values[-1]}, expected {count}")
    if m[("gpujobd_batch_jobs_sum", "")] != jobs:
        fail(f"gpujobd_batch_jobs_sum is {m[('gpujobd_batch_jobs_sum', '')]}, {jobs} jobs ran")
    if not 0 < m[("gpujobd_job_latency_seconds_sum", "")] < 30 * jobs:
        fail(f"gpujobd_job_latency_seconds_sum is {m[('gpujobd_job_latency_seconds_sum', '')]}")


def sleep_job(ms):
    return {"op": "debug_sleep", "params": {"ms": ms},
            "inputs": {"x": {"dtype": "f32", "shape": [2], "data": [1, 2]}}}


def check_user_gauges(d):
    """Queue depth per user: alice's long job holds the one CPU worker while alice queues 2
    jobs behind it and bob 3; /metrics then shows each user's queued and running jobs (once
    the loop has published them: it does so every second), labelled by user, summing to the
    totals."""
    long_id = d.post("/v1/jobs", sleep_job(LONG_JOB_MS), "alice")["id"]
    wait_until("alice's long job to run", lambda: json.loads(
        d.get("/v1/jobs/" + long_id, "alice"))["state"] == "running")
    ids = [d.post("/v1/jobs", sleep_job(10), user)["id"]
           for user in ("alice", "alice", "bob", "bob", "bob")]
    want = {("gpujobd_user_jobs_queued", '{user="alice"}'): 2,
            ("gpujobd_user_jobs_queued", '{user="bob"}'): 3,
            ("gpujobd_user_jobs_running", '{user="alice"}'): 1,
            ("gpujobd_user_jobs_running", '{user="bob"}'): 0,
            ("gpujobd_users_with_jobs", ""): 2,
            ("gpujobd_jobs_queued", ""): 5,
            ("gpujobd_jobs_running", ""): 1}
    seen = {}

    def gauges_shown():
        m = samples(d.get("/metrics"))
        seen.clear()
        seen.update({k: m.get(k) for k in want})
        seen["series"] = sorted(k for k in m if k[0].startswith("gpujobd_user_jobs_"))
        return all(m.get(k) == v for k, v in want.items())
    try:
        wait_until("the per-user gauges", gauges_shown)
        print(f"per-user gauges for alice and bob: {sorted(want.items())}")
    except RuntimeError:
        fail(f"/metrics per user: {seen}, expected {want}")
    if len(seen.get("series", [])) != 4:
        fail(f"per-user series other than alice's and bob's: {seen.get('series')}")
    # So that the daemon stops at once: the queued jobs first, which the long one keeps from
    # starting, then the long one.
    for job_id in ids + [long_id]:
        req = d.request("/v1/jobs/" + job_id, "admin", method="DELETE")
        urllib.request.urlopen(req, timeout=30).close()


def wait_until(what, predicate, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise RuntimeError("timed out waiting for " + what)


def check_fixture_gpu_families(used):
    """Every GPU family the dashboard or the rules name is in the /metrics of a real GPU
    daemon, captured in the fixture (its README says how)."""
    with open(H200_METRICS, encoding="utf-8") as f:
        captured = exported_names(f.read())
    gpu = sorted(n for n in used if n.startswith("gpujobd_gpu_"))
    if not gpu:
        fail("the dashboard names no GPU family")
    for name in gpu:
        if name not in captured:
            fail(f"{used[name]} uses {name}, which the H200 daemon's /metrics "
                 f"({os.path.relpath(H200_METRICS, SRC)}) does not carry")
    print(f"{len(gpu)} GPU families found in the H200 capture: {', '.join(gpu)}")


def has_gpu():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return r.returncode == 0 and "GPU " in r.stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


def main():
    if not shutil.which("promtool"):
        print("FAIL: promtool not found (Debian package prometheus; scripts/deps.sh installs it)")
        return 1
    with open(DASHBOARD, encoding="utf-8") as f:
        dash = json.load(f)
    with open(ALERTS, encoding="utf-8") as f:
        alerts = yaml.safe_load(f)

    exprs, template_metrics = dashboard_exprs(dash)
    used = {}  # metric name -> where it is used
    for title, expr in exprs:
        for n in metric_names(expr):
            used.setdefault(n, f"dashboard panel {title!r}")
    for n in template_metrics:
        used.setdefault(n, "dashboard variable")
    check_with_promtool([{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": grafana_to_promql(e)}
        for i, (_, e) in enumerate(exprs)]}], "dashboard expressions")

    rules = [r for g in alerts["groups"] for r in g["rules"]]
    for r in rules:
        if not r.get("alert") or not r.get("expr") or "severity" not in r.get("labels", {}) \
                or "summary" not in r.get("annotations", {}):
            fail(f"alert {r.get('alert')!r}: needs alert, expr, labels.severity, annotations.summary")
        for n in metric_names(str(r.get("expr", ""))):
            used.setdefault(n, f"alert {r.get('alert')}")
    r = subprocess.run(["promtool", "check", "rules", ALERTS], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"promtool check rules {ALERTS}:\n{r.stdout}{r.stderr}")
    wanted = {"stalled loop": "GpujobdLoopStalled", "lost device": "GpujobdDeviceLost",
              "full disk": "GpujobdDiskFull", "growing queue": "GpujobdQueueGrowing"}
    names = {r.get("alert") for r in rules}
    for what, alert in wanted.items():
        if alert not in names:
            fail(f"no alert for a {what} ({alert})")

    d = Daemon("cpu", USERS_CONFIG, ("admin", "alice", "bob"))
    try:
        exported = d.exported()
        check_histograms(d)
        check_user_gauges(d)
    except Exception:
        print("daemon log:\n" + "\n".join(d.log[-40:]))
        raise
    finally:
        d.stop()
    check_fixture_gpu_families(used)
    source = "".join(open(p, encoding="utf-8").read() for p in METRICS_SOURCES)
    gpu_only = []
    for name, where in sorted(used.items()):
        if name in exported or name in PROMETHEUS_OWN:
            continue
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        if name.startswith("gpujobd_gpu_") and f'"{family}"' in source:
            gpu_only.append(name)
        else:
            fail(f"{where} uses {name}, which /metrics does not export")
    if gpu_only:
        if has_gpu():
            g = Daemon("auto")
            try:
                exported_gpu = g.exported()
            finally:
                g.stop()
            for name in gpu_only:
                if name not in exported_gpu:
                    fail(f"{used[name]} uses {name}, which a daemon on the GPUs does not export")
            print(f"{len(gpu_only)} GPU families checked against a daemon on the GPUs")
        else:
            print(f"no GPU: {len(gpu_only)} GPU families checked against the /metrics writers' "
                  f"source: {', '.join(gpu_only)}")
    print(f"{len(used)} metric names in {len(exprs)} dashboard expressions and {len(rules)} "
          f"alert rules; {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as workdir:
        sys.exit(main())
