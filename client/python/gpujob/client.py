"""The Client, and the Job and Buffer objects its calls return."""

import json
import os
import re
import sys
import time
import urllib.parse

import numpy as np

from .errors import JobFailed
from .progress import progress_bar
from .tensors import Section, as_input, output_inline, output_raw
from .transport import Transport

BUFFER_ID = re.compile(r"^b[0-9a-f]{24}$")
FINAL_STATES = ("succeeded", "failed", "cancelled")
FRAMED = "application/octet-stream"
# The longest single long-poll: the daemon cuts a wait to its limits.max_wait_ms anyway.
POLL_S = 30.0


class Buffer:
    """A buffer stored by the daemon (uploaded, or a job's output kept): id, dtype, shape,
    nbytes, resident and device, as the daemon described it."""

    def __init__(self, client, desc):
        self.client = client
        self.raw = desc
        self.id = desc["id"]
        self.dtype = desc["dtype"]
        self.shape = tuple(desc["shape"])
        self.nbytes = desc["bytes"]
        self.resident = desc.get("resident", False)
        self.device = desc.get("device")

    def delete(self):
        self.client.delete_buffer(self.id)

    def __repr__(self):
        return f"Buffer({self.id}, {self.dtype}{list(self.shape)}, resident={self.resident})"


class Job:
    """A job as the daemon last described it: id, op, state, error, raw (the JSON object) and
    the outputs that answer carried as arrays. outputs() returns them all, downloading those
    too large to travel inline."""

    def __init__(self, client, desc, section=memoryview(b"")):
        self.client = client
        self._update(desc, section)

    def _update(self, desc, section):
        self.raw = desc
        self.id = desc["id"]
        self.op = desc.get("op")
        self.state = desc["state"]
        self.error = desc.get("error")
        self.cancel_result = desc.get("cancel")
        self._arrays = {}
        for name, out in (desc.get("outputs") or {}).items():
            array = output_inline(out, section)
            if array is not None:
                self._arrays[name] = array

    @property
    def done(self):
        return self.state in FINAL_STATES

    def refresh(self):
        self.client.get(self, into=self)
        return self

    def wait(self, timeout=None):
        """Waits until the job is final or timeout seconds pass (None: no bound); self."""
        return self.client.wait(self, timeout)

    def cancel(self):
        return self.client.cancel(self)

    def output(self, name):
        """One output of the succeeded job as an array (JobFailed unless it succeeded)."""
        if self.state != "succeeded":
            raise JobFailed(self)
        if name not in self._arrays:
            self._arrays[name] = self.client.download(self.id, name)
        return self._arrays[name]

    def outputs(self):
        """Every output of the succeeded job, {name: array}; JobFailed unless it succeeded."""
        if self.state != "succeeded":
            raise JobFailed(self)
        return {name: self.output(name) for name in self.raw.get("outputs", {})}

    def keep(self, name, resident=False):
        """The output kept on the daemon as a buffer, for later jobs' inputs."""
        return self.client.keep_output(self.id, name, resident=resident)

    def __repr__(self):
        return f"Job({self.id}, {self.op}, {self.state})"


def _id(obj):
    return obj.id if isinstance(obj, (Job, Buffer)) else str(obj)


def _query(**args):
    pairs = {k: v for k, v in args.items() if v is not None}
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


class Client:
    """A connection to gpujobd.

    address: "http://HOST:PORT", "https://HOST:PORT", "unix:/PATH" or an absolute socket path;
    None means $GPUJOB_URL, else /run/gpujobd/gpujobd.sock (the packaged daemon's socket).
    token: a Bearer token (gj_...); None means $GPUJOB_TOKEN (over the Unix socket the daemon
    knows the user by uid and needs none). ca_file: the CA certificate(s) that an https
    daemon's certificate must chain to; None means $GPUJOB_CA_FILE, else the system's.
    timeout: seconds for one request (a wait adds its own long-poll time)."""

    def __init__(self, address=None, token=None, ca_file=None, timeout=60.0):
        token = token if token is not None else os.environ.get("GPUJOB_TOKEN") or None
        ca_file = ca_file if ca_file is not None else os.environ.get("GPUJOB_CA_FILE") or None
        self.transport = Transport(address, token, ca_file, timeout)
        self.timeout = timeout

    def close(self):
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _json(self, method, path, body=None, headers=None):
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers = dict(headers or {}, **{"Content-Type": "application/json"})
        return self.transport.request(method, path, data, headers).json()

    # ----------------------------------------------------------------- daemon

    def health(self):
        """/readyz's answer: {"status": "ready", ...}; Unavailable while not ready."""
        return self._json("GET", "/readyz")

    def info(self):
        """Version, backend, ops with their inputs and params, dtypes, limits and the caller."""
        return self._json("GET", "/v1/info")

    def usage(self, since=None, until=None, user=None):
        """The caller's usage (an admin's: user's, or "*" for everyone's) by day and op, and
        its GPU-time budgets (budgets: used, left and reset_at of each); since and until are
        dates ("2026-03-01") or datetime.date objects."""
        since = since.isoformat() if hasattr(since, "isoformat") else since
        until = until.isoformat() if hasattr(until, "isoformat") else until
        return self._json("GET", "/v1/usage" + _query(since=since, until=until, user=user))

    # ------------------------------------------------------------------- jobs

    @staticmethod
    def _job_object(section, op, inputs, params=None, priority=None, device=None,
                    deadline_ms=None, time_limit_ms=None):
        """The JSON of one job, its array inputs appended to section."""
        ins = {}
        for name, value in inputs.items():
            if isinstance(value, Buffer) or (isinstance(value, str) and BUFFER_ID.match(value)):
                ins[name] = {"buffer": _id(value)}
                continue
            dtype, array = as_input(value)
            ins[name] = {"dtype": dtype, "shape": list(array.shape),
                         "binary_offset": section.add(array)}
        job = {"op": op, "inputs": ins}
        if params:
            job["params"] = params
        if priority is not None:
            job["priority"] = priority
        if device is not None:
            job["device"] = device
        if deadline_ms is not None:
            job["deadline_ms"] = deadline_ms
        if time_limit_ms is not None:
            job["time_limit_ms"] = time_limit_ms
        return job

    def _post_jobs(self, doc, section, idempotency_key, wait):
        text = json.dumps(doc).encode()
        headers = {"Content-Type": "application/octet-stream",
                   "Gpujob-Json-Length": str(len(text)), "Accept": FRAMED}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        path = "/v1/jobs" + _query(wait=wait)
        timeout = self.timeout + (wait or 0)
        return self.transport.request("POST", path, text + section.tobytes(), headers, timeout)

    def submit(self, op, inputs, params=None, *, priority=None, device=None, deadline_ms=None,
               time_limit_ms=None, idempotency_key=None, wait=None):
        """Submits one job and returns its Job. inputs: {name: array, (array, dtype name),
        Buffer or buffer id}; arrays travel raw in the request's binary section. wait: seconds
        to wait for the job to end within the same request (its outputs then come back).
        time_limit_ms: the longest the job may run once started (past it, it fails with
        time_limit); None takes the daemon's default."""
        section = Section()
        doc = self._job_object(section, op, inputs, params, priority, device, deadline_ms,
                               time_limit_ms)
        answer = self._post_jobs(doc, section, idempotency_key, wait)
        return Job(self, answer.json(), answer.section())

    def submit_many(self, jobs, *, idempotency_key=None, wait=None):
        """Submits a list of jobs at once, all or none; a list of Job in order. Each job is a
        dict of submit()'s arguments: {"op", "inputs", "params", "priority", ...}. wait:
        seconds to wait within the same request for all of them to end (the outputs of those
        that did then come back)."""
        section = Section()
        doc = [self._job_object(section, **job) for job in jobs]
        answer = self._post_jobs(doc, section, idempotency_key, wait)
        return [Job(self, desc, answer.section()) for desc in answer.json()]

    def run(self, op, inputs, params=None, **kwargs):
        """Submits a job, waits for it and returns its outputs {name: array}; JobFailed when it
        failed or was cancelled."""
        job = self.submit(op, inputs, params, wait=POLL_S, **kwargs)
        return self.wait(job).outputs()

    def get(self, job, into=None):
        """The job as it stands now, small outputs inline."""
        answer = self.transport.request("GET", f"/v1/jobs/{_id(job)}", headers={"Accept": FRAMED})
        if into is not None:
            into._update(answer.json(), answer.section())
            return into
        return Job(self, answer.json(), answer.section())

    def wait(self, job, timeout=None):
        """Waits until the job is final, or timeout seconds pass (None: no bound), with
        long-polls of at most 30 s; the Job as it stands then (job itself when it is a Job)."""
        target = job if isinstance(job, Job) else None
        deadline = None if timeout is None else time.monotonic() + timeout
        while target is None or not target.done:
            left = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            answer = self.transport.request("GET", f"/v1/jobs/{_id(job)}/wait?timeout={left:.3f}",
                                            headers={"Accept": FRAMED},
                                            timeout=self.timeout + left)
            if target is None:
                target = Job(self, answer.json(), answer.section())
            else:
                target._update(answer.json(), answer.section())
            if deadline is not None and time.monotonic() >= deadline:
                break
        return target

    def wait_all(self, jobs, timeout=None, progress=None):
        """Waits for every job (Job objects are updated in place); the list of Job. progress:
        True draws a bar (tqdm's if installed) as they end, False none, None one when stderr
        is a terminal and there are more than one."""
        jobs = [j if isinstance(j, Job) else Job(self, {"id": _id(j), "state": "queued"})
                for j in jobs]
        if progress is None:
            progress = len(jobs) > 1 and sys.stderr.isatty()
        bar = progress_bar(len(jobs)) if progress else None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for job in jobs:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self.wait(job, left)
                if bar:
                    bar.update(1)
        finally:
            if bar:
                bar.close()
        return jobs

    def list(self, state=None, op=None, limit=None):
        """Iterates over the caller's jobs (an admin's: everyone's), oldest first, fetching
        pages of limit (default 100) as it goes; outputs are described without data."""
        after = None
        while True:
            page = self._json("GET", "/v1/jobs" + _query(state=state, op=op, limit=limit,
                                                         after=after))
            for desc in page["jobs"]:
                yield Job(self, desc)
            after = page.get("next")
            if not after:
                return

    def cancel(self, job):
        """Cancels a job; the Job after it, cancel_result saying what became of it
        ("dequeued", "stopped" or "dropped"). Conflict when it is already final."""
        desc = self._json("DELETE", f"/v1/jobs/{_id(job)}")
        if isinstance(job, Job):
            job._update(desc, memoryview(b""))
            return job
        return Job(self, desc)

    def download(self, job, name):
        """One output of a succeeded job, downloaded raw whatever its size, as an array."""
        path = f"/v1/jobs/{_id(job)}/outputs/{urllib.parse.quote(name, safe='')}?format=raw"
        answer = self.transport.request("GET", path)
        return output_raw(answer.body, answer.headers["x-dtype"], answer.headers.get("x-shape", ""))

    # ---------------------------------------------------------------- buffers

    def upload(self, data, resident=False):
        """Stores a buffer: data is an array (or an (array, dtype name) pair), or the path of
        a .npy file, whose bytes are sent as they are. resident: keep it in device memory
        across jobs (CUDA backend)."""
        res = "true" if resident else "false"
        if isinstance(data, (str, os.PathLike)):
            with open(data, "rb") as f:
                answer = self.transport.request("POST", f"/v1/buffers?resident={res}", f,
                                                {"Content-Type": "application/x-npy",
                                                 "Content-Length": str(os.fstat(f.fileno()).st_size)})
            return Buffer(self, answer.json())
        dtype, array = as_input(data)
        shape = ",".join(str(d) for d in array.shape)
        path = "/v1/buffers" + _query(dtype=dtype, shape=shape, resident=res)
        answer = self.transport.request("POST", path, array.tobytes(),
                                        {"Content-Type": "application/octet-stream"})
        return Buffer(self, answer.json())

    def keep_output(self, job, name, resident=False):
        """A buffer made within the daemon from a succeeded job's output."""
        path = "/v1/buffers" + _query(job=_id(job), output=name,
                                      resident="true" if resident else "false")
        return Buffer(self, self.transport.request("POST", path, b"").json())

    def buffer(self, buffer_id):
        """A buffer's description."""
        return Buffer(self, self._json("GET", f"/v1/buffers/{_id(buffer_id)}"))

    def delete_buffer(self, buffer):
        self._json("DELETE", f"/v1/buffers/{_id(buffer)}")

    # ----------------------------------------------------------------- tokens

    def create_token(self, name, expires_in_s=None):
        """A token for the caller (over the Unix socket only): its JSON, "token" its text."""
        body = {"name": name}
        if expires_in_s is not None:
            body["expires_in_s"] = expires_in_s
        return self._json("POST", "/v1/tokens", body)

    def tokens(self, user=None):
        return self._json("GET", "/v1/tokens" + _query(user=user))["tokens"]

    def revoke_token(self, token_id):
        self._json("DELETE", f"/v1/tokens/{urllib.parse.quote(token_id, safe='')}")
