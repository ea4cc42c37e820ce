"""What the bench/e2e clients share (standard library only): JSON over one keep-alive HTTP
connection to gpujobd, paging through GET /v1/jobs, the daemon's timestamps in microseconds,
nearest-rank percentiles like bench_loadgen's, and bench_http_sink started for a run."""
import base64
import contextlib
import datetime
import http.client
import json
import struct
import subprocess
import urllib.parse

EPOCH = datetime.datetime(1970, 1, 1)
US = datetime.timedelta(microseconds=1)
LIST_PAGE = 1000  # the most GET /v1/jobs gives in one page
TINY_ELEMENTS = 1024


class Client:
    """One keep-alive connection to the daemon at url ("http://HOST:PORT")."""

    def __init__(self, url, timeout=300):
        u = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)

    def request(self, method, path, body=None, content_type="application/json", headers=None):
        """Sends one request and returns the decoded JSON answer; raises RuntimeError on any
        status other than 200 or 201, with the daemon's error text. The body (bytes) goes out
        in its own send, so that a large one is not copied behind the headers. Of an answer
        framed with a binary section (Gpujob-Json-Length, asked for with an Accept header) the
        JSON is returned: the section's bytes are read and dropped."""
        self.conn.putrequest(method, path)
        for name, value in (headers or {}).items():
            self.conn.putheader(name, value)
        if body is not None:
            self.conn.putheader("Content-Type", content_type)
            self.conn.putheader("Content-Length", str(len(body)))
        self.conn.endheaders()
        if body is not None:
            self.conn.send(body)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status not in (200, 201):
            why = data[:300].decode(errors="replace")
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {why}")
        framed = resp.getheader("Gpujob-Json-Length")
        return json.loads(data[:int(framed)] if framed else data)

    def submit(self, job_json):
        """POSTs one job or an array of jobs, given as JSON text; returns the 201's JSON."""
        return self.request("POST", "/v1/jobs", job_json.encode())

    def submit_wait(self, job_json, timeout_s=120):
        """POSTs one job with ?wait=: the answer comes once the job has ended (or timeout_s,
        capped by the daemon's limits.max_wait_ms, has passed); returns its JSON."""
        job = self.request("POST", f"/v1/jobs?wait={timeout_s}", job_json.encode())
        if job["state"] in ("queued", "running"):
            raise RuntimeError(f"job {job['id']} still {job['state']} after the wait")
        return job

    def wait(self, job_id, timeout_s=120):
        """Long-polls until the job is final; raises RuntimeError when it is not by then."""
        job = self.request("GET", f"/v1/jobs/{job_id}/wait?timeout={timeout_s}")
        if job["state"] in ("queued", "running"):
            raise RuntimeError(f"job {job_id} still {job['state']} after {timeout_s} s")
        return job

    def list_jobs(self, after, op=None, most=None):
        """The jobs submitted after the job id `after`, oldest first (outputs without data),
        up to `most` of them."""
        jobs = []
        while most is None or len(jobs) < most:
            query = {"limit": LIST_PAGE, "after": after}
            if op:
                query["op"] = op
            page = self.request("GET", "/v1/jobs?" + urllib.parse.urlencode(query))
            jobs += page["jobs"]
            after = page["next"]
            if not after:
                break
        return jobs if most is None else jobs[:most]


def time_us(stamp):
    """The daemon's RFC 3339 UTC time with microseconds, as whole microseconds since the epoch
    (exact, unlike a float of seconds); None for None."""
    if stamp is None:
        return None
    t = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
    return (t - EPOCH) // US


def percentile(values, q):
    """The q-quantile of values by nearest rank, as bench_loadgen computes it; None when empty."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    i = min(max(int(q * len(v) + 0.5) - 1, 0), len(v) - 1)
    return v[i]


def write_json(path, result):
    """Writes one part's result for report.py; path None writes nothing."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def tiny_job():
    """A saxpy job on TINY_ELEMENTS f32, inputs in base64, as JSON text: bench_loadgen's job."""
    x = base64.b64encode(struct.pack(f"<{TINY_ELEMENTS}f", *range(TINY_ELEMENTS))).decode()
    tensor = {"dtype": "f32", "shape": [TINY_ELEMENTS], "b64": x}
    return json.dumps({"op": "saxpy", "params": {"a": 2.0}, "inputs": {"x": tensor, "y": tensor}})


def mark(client):
    """Submits one tiny job and waits for it; its id is a cursor for list_jobs that leaves out
    every job submitted before it."""
    job = client.submit(tiny_job())
    client.wait(job["id"])
    return job["id"]


@contextlib.contextmanager
def http_sink(sink_bin):
    """Runs bench_http_sink (the path sink_bin) on a free port for the with block; yields its URL
    and process id. Raises RuntimeError when it does not start."""
    p = subprocess.Popen([sink_bin], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"bench_http_sink did not start: {line!r}")
        yield line[len("listening on "):], p.pid
    finally:
        p.kill()
        p.wait()
