#!/usr/bin/env python3
"""Checks the answers of the real gpujobd against api/openapi.yaml.

Starts gpujobd on the CPU backend with a temporary state directory, sends every operation of the
document at least one request that succeeds and, for each error status the document lists, one
request that provokes it, and checks every answer: its status is one the operation documents,
its Content-Type is a documented media type, a JSON body validates against the documented
schema (OpenAPI 3.0 schemas translated to JSON Schema draft 4), and the documented headers are
present where required and valid where present. Every mismatch is collected, and the test fails
with the whole list at the end.

A few documented statuses cannot be provoked from outside a running daemon (internal errors, an
unreadable store, a sub-millisecond window at shutdown); they are listed in UNPROVOKABLE with
the reason, and any other documented status left unexercised is a failure, so the test keeps up
with the document.

Environment: GPUJOBD_BIN (the daemon), GPUJOB_SOURCE_DIR (the source tree, for the document).
Exits 77 (skipped) only when PyYAML or jsonschema is missing.
"""

import base64
import http.client
import json
import os
import re
import shutil
import socket
import signal
import struct
import subprocess
import sys
import tempfile
import time

from gpujobd_process import GpujobdProcess

try:
    import jsonschema
    import yaml
except ImportError as missing:
    print(f"SKIP: {missing}; scripts/deps.sh installs python3-yaml and python3-jsonschema")
    sys.exit(77)

START_TIMEOUT_S = 30
HTTP_TIMEOUT_S = 30
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")

# Small limits make 413 and 429 cheap to provoke; one CPU worker and one running job per user
# keep a second job queued behind a slow one, which the cancel, 409 and drain checks need. The
# default auth mode names the test's account (root, an admin, over loopback and the socket);
# tokens name bob, who may connect but is no admin and may not submit (max_queued = 0), and
# mallory, whom allow_users keeps out: their answers are the 403s. A budget that the test never
# spends puts one in GET /v1/usage's answer.
DAEMON_CONFIG = """\
[server]
http_threads = 4
drain_timeout_ms = 60000
[limits]
max_jobs_per_request = 12
max_queued_per_user = 10
max_running_per_user = 1
max_wait_ms = 20000
gpu_hours_per_month_per_user = 1000
[scheduler]
cpu_threads = 1
[auth]
allow_users = bob
[user.bob]
max_queued = 0
"""
MAX_JOBS_PER_REQUEST = 12
MAX_QUEUED_PER_USER = 10
# The router's API_MAX_QUERY: one argument more answers 400 on every route.
MAX_QUERY_ARGUMENTS = 32

# A gemm of this size runs about a second or more on the CPU reference: long enough to hold
# the only worker while the queued-job and drain checks (a few tens of milliseconds) run.
SLOW_GEMM_N = 1024

SHUTDOWN_WINDOW = (
    "answered only by a request that reaches the scheduler after its loop has ended at "
    "shutdown, a window of well under a millisecond before the HTTP server stops"
)
STORE_UNREADABLE = "answered only when the store cannot be read"
STORE_PAST_BOUND = (
    "answered only once a store with a [store] max_bytes bound has been filled past it, which "
    "takes megabytes of outputs and a second's wait (test_e2e_store_bound provokes it)"
)
UNPROVOKABLE = {
    ("DELETE", "/v1/jobs/{id}", 503): SHUTDOWN_WINDOW,
    ("GET", "/v1/jobs/{id}/wait", 503): SHUTDOWN_WINDOW,
    ("DELETE", "/v1/buffers/{id}", 503): SHUTDOWN_WINDOW,
    ("GET", "/v1/jobs", 503): STORE_UNREADABLE,
    ("GET", "/v1/jobs/{id}", 503): STORE_UNREADABLE,
    ("GET", "/v1/jobs/{id}/outputs/{name}", 503): STORE_UNREADABLE,
    ("GET", "/v1/buffers/{id}", 503): STORE_UNREADABLE,
    ("GET", "/v1/usage", 503): STORE_UNREADABLE,
    ("GET", "/v1/stats", 503): STORE_UNREADABLE,
    ("GET", "/healthz", 503): (
        "answered only once the integrity check after an unclean stop found a damaged database "
        "page (test_e2e_corruption provokes it)"
    ),
    ("POST", "/v1/buffers", 507): "answered only when the daemon's disk is full",
    ("POST", "/v1/jobs", 507): "answered only when the daemon's disk is full (test_e2e_connections)",
    ("GET", "/v1/jobs/{id}/outputs/{name}", 410): STORE_PAST_BOUND,
    ("POST", "/v1/buffers", 410): STORE_PAST_BOUND,
    ("POST", "/v1/buffers", 429): "answered only on the CUDA backend, to a fifth ephemeral upload "
    "streaming to one device at once",
    ("POST", "/v1/jobs", 422): "every op of this build runs on both backends (test_api_routes "
    "provokes it with a backend that lacks one)",
    ("GET", "/v1/usage", 422): "answered only past 10000 rows of the usage rollup (users x days x "
    "ops in the range), which this daemon's few jobs cannot fill",
}
INTERNAL_ERROR = (
    "internal failures (out of memory, store I/O errors) cannot be provoked from outside"
)


def unprovokable_reason(method, template, status):
    """Why a documented status cannot be provoked here, or None when it must be."""
    if status == 500:
        return INTERNAL_ERROR
    return UNPROVOKABLE.get((method, template, status))


# --------------------------------------------------------------------------- the document


def to_json_schema(node):
    """Translates an OpenAPI 3.0 schema into JSON Schema draft 4: `nullable: true` becomes a
    type list (or an anyOf with null where there is no type), and the OpenAPI-only keywords
    (example, discriminator, x-*, ...) are dropped. $refs stay as they are: they resolve
    against the translated components the validator's root schema carries."""
    if not isinstance(node, dict):
        return node
    dropped = ("example", "nullable", "discriminator", "xml", "externalDocs", "deprecated")
    out = {}
    for key, value in node.items():
        if key in dropped or key.startswith("x-"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(sub) for sub in value]
        else:
            out[key] = value
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"] = list(out["enum"]) + [None]
        else:
            out = {"anyOf": [{"type": "null"}, out]}
    return out


RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def make_format_checker():
    """Formats are checked leniently: date-time must look like RFC 3339, others pass."""
    checker = jsonschema.FormatChecker(formats=())

    @checker.checks("date-time")
    def is_date_time(value):
        return not isinstance(value, str) or bool(RFC3339.match(value))

    return checker


def error_sort_key(error):
    """Errors in the order of their paths; a path mixes indexes and keys, so as text."""
    return [str(p) for p in error.absolute_path]


def closest_leaf_error(error):
    """A failed oneOf/anyOf says only "not valid under any of the given schemas". Of the
    errors of its branches, the deepest one (and, at equal depth, one other than a type
    mismatch, which is the branch that does not apply) names the field that is wrong."""
    leaves, stack = [], [error]
    while stack:
        e = stack.pop()
        if e.context:
            stack.extend(e.context)
        else:
            leaves.append(e)
    return max(leaves, key=lambda e: (len(e.absolute_path), e.validator != "type"))


class Spec:
    """The document: its operations by (METHOD, path template), and validators for its
    schemas."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            self.doc = yaml.safe_load(f)
        self.operations = {}
        for template, item in self.doc["paths"].items():
            for method, op in item.items():
                if method in HTTP_METHODS:
                    self.operations[(method.upper(), template)] = op
        schemas = self.doc.get("components", {}).get("schemas", {})
        self.components = {"schemas": {name: to_json_schema(s) for name, s in schemas.items()}}
        self.format_checker = make_format_checker()

    def deref(self, obj):
        """Follows local $refs ("#/components/responses/X") to the object they name."""
        while isinstance(obj, dict) and "$ref" in obj:
            node = self.doc
            for part in obj["$ref"].lstrip("#/").split("/"):
                node = node[part]
            obj = node
        return obj

    def errors(self, schema, instance):
        """The validation errors of instance against an OpenAPI schema, as strings."""
        root = {"allOf": [to_json_schema(schema)], "components": self.components}
        validator = jsonschema.Draft4Validator(root, format_checker=self.format_checker)
        found = []
        for error in sorted(validator.iter_errors(instance), key=error_sort_key):
            error = closest_leaf_error(error)
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            found.append(f"{where}: {error.message[:200]}")
        return found


# ------------------------------------------------------------------------------ HTTP


class Answer:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-cased names
        self.body = body
        self.json = None
        # A framed answer (Gpujob-Json-Length): its JSON is the start of the body.
        self.json_length = None
        if "gpujob-json-length" in headers:
            try:
                self.json_length = int(headers["gpujob-json-length"])
            except ValueError:
                pass
        if self.media_type() == "application/json" or self.json_length is not None:
            try:
                self.json = json.loads(body[:self.json_length])
            except ValueError:
                pass

    def media_type(self):
        value = self.headers.get("content-type", "")
        return value.split(";")[0].strip().lower()


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the daemon's Unix socket, whose peer uid is the user."""

    def __init__(self, path):
        super().__init__("localhost", timeout=HTTP_TIMEOUT_S)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(HTTP_TIMEOUT_S)
        self.sock.connect(self.unix_path)


def http_request(port, method, path, body=None, headers=None):
    """port: a TCP port on 127.0.0.1, or the path of a Unix socket."""
    if isinstance(port, str):
        conn = UnixHTTPConnection(port)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT_S)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def fill_template(template, params):
    return re.sub(r"\{(\w+)\}", lambda m: params[m.group(1)], template)


def coerce_header(value, schema):
    """A header's text as the JSON value its schema describes (ValueError when it is not)."""
    kind = schema.get("type")
    if kind == "integer":
        return int(value)
    if kind == "number":
        return float(value)
    if kind == "boolean":
        if value not in ("true", "false"):
            raise ValueError(value)
        return value == "true"
    return value


class Checker:
    """Sends requests and checks each answer against the document; collects mismatches."""

    def __init__(self, spec, port):
        self.spec = spec
        self.port = port
        self.mismatches = []
        self.answers = 0
        self.covered = set()  # (METHOD, template, status)

    def fail(self, message):
        self.mismatches.append(message)

    def call(self, method, template, expect, *, params=None, query="", body=None, json_body=None,
             content_type=None, headers=None, note="", unix=None):
        """Sends one request, checks the answer against the document and that its status is
        `expect`. Returns the Answer, or None when no answer came."""
        path = fill_template(template, params or {})
        target = path + ("?" + query if query else "")
        label = f"{method} {target[:120]}" + (f" ({note})" if note else "")
        send_headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode()
            content_type = content_type or "application/json"
        if content_type:
            send_headers["Content-Type"] = content_type
        try:
            answer = http_request(unix or self.port, method, target, body, send_headers)
        except OSError as e:
            self.fail(f"{label}: no answer: {e}")
            return None
        self.answers += 1
        self.check_answer(method, template, label, answer)
        if answer.status != expect:
            self.fail(f"{label}: expected {expect}, got {answer.status}: {answer.body[:300]!r}")
        elif 200 <= answer.status < 300 and json_body is not None:
            self.check_request_body(method, template, label, json_body)
        return answer

    def check_request_body(self, method, template, label, body):
        """A request the daemon accepted must be valid by the document too."""
        op = self.spec.operations[(method, template)]
        content = self.spec.deref(op.get("requestBody", {})).get("content", {})
        schema = content.get("application/json", {}).get("schema")
        if schema is None:
            self.fail(f"{label}: accepted a JSON body, but the document takes none")
            return
        for error in self.spec.errors(schema, body):
            self.fail(f"{label}: the daemon accepted a body the document calls invalid: {error}")

    def check_answer(self, method, template, label, answer):
        op = self.spec.operations.get((method, template))
        if op is None:
            self.fail(f"{label}: the document has no operation {method} {template}")
            return
        # YAML reads an unquoted status key as an int: compare them as strings.
        documented = {str(k): v for k, v in op.get("responses", {}).items()}
        response = documented.get(str(answer.status))
        if response is None:
            self.fail(f"{label}: status {answer.status} is not documented "
                      f"(documented: {', '.join(sorted(documented))})")
            return
        self.covered.add((method, template, answer.status))
        response = self.spec.deref(response)
        media = answer.media_type()
        content = response.get("content", {})
        if content:
            self.check_content(label, answer, media, content)
        elif answer.body:
            self.fail(f"{label}: a {len(answer.body)}-byte body where the document has none")
        for name, header in response.get("headers", {}).items():
            header = self.spec.deref(header)
            value = answer.headers.get(name.lower())
            required = header.get("required") or header.get("x-required-for-content-type") == media
            if value is None:
                if required:
                    self.fail(f"{label}: the required header {name} is missing")
                continue
            schema = header.get("schema", {})
            try:
                typed = coerce_header(value, self.spec.deref(schema))
            except ValueError:
                self.fail(f"{label}: header {name}: {value!r} is not a {schema.get('type')}")
                continue
            for error in self.spec.errors(schema, typed):
                self.fail(f"{label}: header {name}: {error}")

    def check_content(self, label, answer, media, content):
        if not media:
            self.fail(f"{label}: no Content-Type (documented: {', '.join(content)})")
            return
        if media not in content:
            self.fail(f"{label}: Content-Type {media!r} is not documented "
                      f"(documented: {', '.join(content)})")
            return
        schema = content[media].get("schema")
        if media == "application/json" or media.endswith("+json"):
            if answer.json is None:
                self.fail(f"{label}: the body is not JSON: {answer.body[:200]!r}")
            elif schema is not None:
                for error in self.spec.errors(schema, answer.json):
                    self.fail(f"{label}: body {error}")
        elif answer.json_length is not None:
            # Framed: the JSON at its start must be what the JSON answer would be.
            schema = content.get("application/json", {}).get("schema")
            if answer.json is None or answer.json_length > len(answer.body):
                self.fail(f"{label}: the first {answer.json_length} bytes are not JSON")
            elif schema is not None:
                for error in self.spec.errors(schema, answer.json):
                    self.fail(f"{label}: framed body {error}")
        elif schema is not None and schema.get("type") == "string" and \
                schema.get("format") != "binary":
            try:
                answer.body.decode("utf-8")
            except UnicodeDecodeError:
                self.fail(f"{label}: a text body that is not UTF-8")

    def expect_value(self, label, what, got, want):
        """A semantic check beyond the schema: what the answer says must be what was asked."""
        if got != want:
            self.fail(f"{label}: {what} is {got!r}, expected {want!r}")

    def check_coverage(self):
        """Every operation answered with a 2xx, and every documented status exercised unless
        it is listed as unprovokable. Returns the (label, reason) pairs left unexercised."""
        skipped = []
        for (method, template), op in sorted(self.spec.operations.items()):
            statuses = [int(s) for s in map(str, op.get("responses", {})) if s.isdigit()]
            if not any((method, template, s) in self.covered for s in statuses if s < 300):
                self.fail(f"{method} {template}: no request succeeded")
            for status in statuses:
                if (method, template, status) in self.covered:
                    continue
                reason = unprovokable_reason(method, template, status)
                if reason:
                    skipped.append((f"{method} {template} {status}", reason))
                else:
                    self.fail(f"{method} {template}: documented status {status} was never "
                              "provoked; add a request for it (or list why it cannot be)")
        return skipped


# ---------------------------------------------------------------------------- daemon


class Daemon(GpujobdProcess):
    """The real gpujobd on the CPU backend, its log kept for the failure report."""

    def __init__(self, binary, workdir):
        self.binary = binary
        self.state_dir = os.path.join(workdir, "state")
        os.mkdir(self.state_dir)
        self.config_path = os.path.join(workdir, "gpujobd.conf")
        self.unix_path = os.path.join(workdir, "gpujobd.sock")
        with open(self.config_path, "w", encoding="utf-8") as f:
            f.write(DAEMON_CONFIG)
        argv = [binary, "--config", self.config_path, "--listen", "127.0.0.1:0", "--state-dir",
                self.state_dir, "--backend", "cpu", "--log-level", "info", "--unix-socket",
                self.unix_path]
        super().__init__(argv, START_TIMEOUT_S)

    def token_create(self, user):
        """A token of user, made by the admin's `gpujobd token create`: its text."""
        out = subprocess.run([self.binary, "token", "create", "--user", user, "--name", "openapi",
                              "--state-dir", self.state_dir], check=True, capture_output=True,
                             text=True)
        return out.stdout.strip()


# --------------------------------------------------------------------------- requests


def tensor(dtype, shape, data):
    return {"dtype": dtype, "shape": shape, "data": data}


def npy_file(descr, shape, payload):
    """A .npy 1.0 file: magic, version, header length, the header padded to 64 bytes."""
    dims = "".join(f"{d}," for d in shape) if len(shape) == 1 else ", ".join(map(str, shape))
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}"
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


def unknown_id(prefix):
    return prefix + "0" * 24


def json_of(answer, key=None):
    """A field of an answer's JSON, or None when there is no answer or no such field."""
    if answer is None or answer.json is None:
        return None
    return answer.json if key is None else (answer.json.get(key)
                                            if isinstance(answer.json, dict) else None)


def check_system(c, spec):
    c.call("GET", "/healthz", 200)
    c.call("GET", "/readyz", 200)
    metrics = c.call("GET", "/metrics", 200)
    if metrics is not None:
        # The operation's description names the metrics; each must be exposed, but for the
        # GPU gauges (gpujobd_gpu_*), which only the CUDA backend has.
        text = metrics.body.decode("utf-8", "replace")
        described = spec.operations[("GET", "/metrics")].get("description", "")
        for name in sorted(set(re.findall(r"gpujobd_[a-z_]+", described))):
            if name.startswith("gpujobd_gpu_"):
                continue
            if not re.search(rf"^# TYPE {name} ", text, re.M):
                c.fail(f"GET /metrics: {name} is documented but not exposed")
    info = c.call("GET", "/v1/info", 200)
    ops = [o.get("name") for o in json_of(info, "ops") or []]
    for op in ("add", "saxpy", "gemm"):
        if op not in ops:
            c.fail(f"GET /v1/info: op {op} is missing from {ops}")
    c.call("GET", "/v1/usage", 400, query="verbose=1", note="unknown query argument")
    c.call("GET", "/v1/stats", 200, query="minutes=5")
    c.call("GET", "/v1/stats", 400, query="minutes=0", note="a window of no minutes")
    c.call("GET", "/", 200)
    c.call("GET", "/ui/session", 200)
    for name in ("app.js", "style.css", "favicon.svg"):
        c.call("GET", "/ui/{file}", 200, params={"file": name})
    c.call("GET", "/ui/{file}", 404, params={"file": "nothing.js"}, note="not a file of the page")
    c.call("GET", "/ui/{file}", 400, params={"file": "app.js"}, query="&".join(
        f"a{i}=1" for i in range(MAX_QUERY_ARGUMENTS + 1)), note="too many query arguments")
    too_many = "&".join(f"a{i}=1" for i in range(MAX_QUERY_ARGUMENTS + 1))
    for path in ("/healthz", "/readyz", "/metrics", "/v1/info", "/", "/ui/session"):
        c.call("GET", path, 400, query=too_many, note="too many query arguments")


def check_usage(c):
    """The usage rollup after the jobs ran: a range, every user's rows (the caller, root, is an
    admin), and a 400 naming each bad argument."""
    mine = c.call("GET", "/v1/usage", 200)
    if not json_of(mine, "days"):
        c.fail("GET /v1/usage: no days rows after jobs ended")
    if len(json_of(mine, "budgets") or []) != 1:
        c.fail("GET /v1/usage: expected the month's budget of limits.gpu_hours_per_month_per_user")
    c.call("GET", "/v1/usage", 200, query="since=2000-01-01&until=9999-12-31")
    c.call("GET", "/v1/usage", 200, query="since=2000-01-01T00:00:00Z", note="an RFC 3339 time")
    early = c.call("GET", "/v1/usage", 200, query="since=0647-09-29", note="a year below 1000")
    if json_of(early, "since") != "0647-09-29":
        c.fail(f"GET /v1/usage?since=0647-09-29: since {json_of(early, 'since')!r}, "
               "expected the date with its four digits of year")
    everyone = c.call("GET", "/v1/usage", 200, query="user=all", note="every user's rows")
    if json_of(everyone, "owner") != "*":
        c.fail(f"GET /v1/usage?user=all: owner {json_of(everyone, 'owner')!r}, expected '*'")
    bad = [("since=yesterday", "query.since", "since not a date"),
           ("until=2026-02-30", "query.until", "until not a date"),
           ("since=2026-03-02&until=2026-03-01", "query.until", "until before since"),
           ("since=0001-01-01T00:00:00%2B01:00", "query.since", "an offset before year 1"),
           ("user=", "query.user", "an empty user")]
    for query, field, note in bad:
        answer = c.call("GET", "/v1/usage", 400, query=query, note=note)
        got = (json_of(answer, "error") or {}).get("field")
        if answer is not None and got != field:
            c.fail(f"GET /v1/usage?{query}: error field {got!r}, expected {field!r}")


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


# Any value of each path parameter: who is asking is decided before the path is read.
ANY_PARAMS = {"id": unknown_id("j"), "name": "out", "file": "app.js"}


def check_auth(c, spec, bob, mallory):
    """Every route that needs a user: 401 without a valid token (one is sent, so the loopback
    account does not stand in), 403 to mallory, whom allow_users keeps out; bob, no admin,
    gets 403 for another user's data and the admin route, and for a submission (max_queued =
    0)."""
    unknown = "gj_" + "0" * 12 + "_" + "0" * 64
    for (method, template), op in sorted(spec.operations.items()):
        statuses = [str(s) for s in op.get("responses", {})]
        if "401" in statuses:
            answer = c.call(method, template, 401, params=ANY_PARAMS, headers=bearer(unknown),
                            note="an unknown token")
            if answer is not None and (json_of(answer, "error") or {}).get("field") != "headers.Authorization":
                c.fail(f"{method} {template} 401: field {json_of(answer, 'error')!r}")
        if "403" in statuses and (method, template) != ("POST", "/v1/tokens"):
            answer = c.call(method, template, 403, params=ANY_PARAMS, headers=bearer(mallory),
                            note="an account allow_users keeps out")
            if answer is not None and (json_of(answer, "error") or {}).get("field") != "auth.allow_users":
                c.fail(f"{method} {template} 403: field {json_of(answer, 'error')!r}")
    for template, query in (("/v1/jobs", "user=root"), ("/v1/usage", "user=all"),
                            ("/v1/tokens", "user=root")):
        answer = c.call("GET", template, 403, query=query, headers=bearer(bob),
                        note="another user's, to a user who is no admin")
        if answer is not None and (json_of(answer, "error") or {}).get("field") != "query.user":
            c.fail(f"GET {template}?{query} 403: field {json_of(answer, 'error')!r}")
    c.call("GET", "/metrics", 403, headers=bearer(bob), note="to a user who is no admin")
    answer = c.call("POST", "/v1/jobs", 403, headers=bearer(bob), note="max_queued = 0",
                    json_body={"op": "sum", "inputs": {"x": tensor("f32", [2], [1, 2])}})
    if answer is not None and (json_of(answer, "error") or {}).get("field") != "user.bob.max_queued":
        c.fail(f"POST /v1/jobs 403: field {json_of(answer, 'error')!r}")


def check_tokens(c, unix, bob):
    """Makes a token over the Unix socket (over TCP: 403), lists and revokes it."""
    c.call("POST", "/v1/tokens", 403, json_body={"name": "laptop"}, note="over TCP")
    c.call("POST", "/v1/tokens", 400, json_body={"name": ""}, unix=unix, note="empty name")
    made = c.call("POST", "/v1/tokens", 201, json_body={"name": "laptop", "expires_in_s": 3600},
                  unix=unix)
    token_id = json_of(made, "id") or "000000000000"
    c.call("GET", "/v1/tokens", 200, unix=unix)
    c.call("GET", "/v1/tokens", 400, query="verbose=1", note="unknown query argument")
    c.call("DELETE", "/v1/tokens/{id}", 404, params={"id": token_id}, headers=bearer(bob),
           note="another owner's")
    c.call("DELETE", "/v1/tokens/{id}", 400, params={"id": token_id}, query="x=1", unix=unix)
    c.call("DELETE", "/v1/tokens/{id}", 200, params={"id": token_id}, unix=unix)


def check_buffers(c):
    """Uploads, reads and deletes buffers. Returns the id of an f32 [2, 3] buffer."""
    raw = struct.pack("<6f", 0, 1, 2, 3, 4, 5)
    upload = c.call("POST", "/v1/buffers", 201, query="dtype=f32&shape=2,3", body=raw,
                    content_type="application/octet-stream", note="raw bytes")
    buffer_id = json_of(upload, "id")
    c.expect_value("POST /v1/buffers (raw)", "shape", json_of(upload, "shape"), [2, 3])
    npy = c.call("POST", "/v1/buffers", 201, body=npy_file("<f4", (2, 3), raw),
                 content_type="application/x-npy", note=".npy")
    c.expect_value("POST /v1/buffers (.npy)", "dtype", json_of(npy, "dtype"), "f32")
    resident = c.call("POST", "/v1/buffers", 201, query="dtype=i32&shape=4&resident=true",
                      body=struct.pack("<4i", 1, 2, 3, 4), content_type="application/octet-stream",
                      note="resident")
    c.expect_value("POST /v1/buffers (resident)", "resident", json_of(resident, "resident"), True)
    c.expect_value("POST /v1/buffers (resident)", "durable", json_of(resident, "durable"), True)
    ephemeral = c.call("POST", "/v1/buffers", 201,
                       query="dtype=f32&shape=2,3&resident=true&durable=false", body=raw,
                       content_type="application/octet-stream", note="ephemeral")
    c.expect_value("POST /v1/buffers (ephemeral)", "durable", json_of(ephemeral, "durable"), False)
    c.call("POST", "/v1/buffers", 400, query="dtype=f32&shape=2,3&durable=false", body=raw,
           content_type="application/octet-stream", note="durable=false without resident=true")
    c.call("POST", "/v1/buffers", 400, query="shape=2,3", body=raw,
           content_type="application/octet-stream", note="no dtype")
    c.call("POST", "/v1/buffers", 413, query="dtype=f32&shape=100000,100000", body=b"",
           content_type="application/octet-stream", note="over max_tensor_bytes")
    c.call("POST", "/v1/buffers", 415, query="dtype=f32&shape=2,3", body=raw,
           content_type="text/plain", note="wrong Content-Type")

    if buffer_id:
        c.call("GET", "/v1/buffers/{id}", 200, params={"id": buffer_id})
    c.call("GET", "/v1/buffers/{id}", 400, params={"id": "not-a-buffer-id"})
    c.call("GET", "/v1/buffers/{id}", 404, params={"id": unknown_id("b")})
    ephemeral_id = json_of(ephemeral, "id")
    if ephemeral_id:
        c.call("GET", "/v1/buffers/{id}", 200, params={"id": ephemeral_id}, note="ephemeral")
        c.call("DELETE", "/v1/buffers/{id}", 200, params={"id": ephemeral_id}, note="ephemeral")
    resident_id = json_of(resident, "id")
    if resident_id:
        c.call("DELETE", "/v1/buffers/{id}", 200, params={"id": resident_id})
        c.call("DELETE", "/v1/buffers/{id}", 404, params={"id": resident_id}, note="deleted")
    c.call("DELETE", "/v1/buffers/{id}", 400, params={"id": "not-a-buffer-id"})
    return buffer_id


def small_add(value=1.0):
    return {"op": "add", "inputs": {"x": tensor("f32", [2], [value, 2.0]),
                                    "y": tensor("f32", [2], [10.0, 20.0])}}


def submit_jobs(c, buffer_id):
    """Submissions that succeed and each documented error of POST /v1/jobs. Returns the ids of
    an f32 add job over the buffer and of a bf16 add job."""
    json_ct = "application/json"
    add = c.call("POST", "/v1/jobs", 201, json_body={
        "op": "add", "params": {}, "priority": 5, "device": None, "deadline_ms": 60000,
        "inputs": {"x": tensor("f32", [2, 3], [[1, 2, 3], [4, 5, 6]]), "y": {"buffer": buffer_id}}},
        note="inline data and a buffer")
    c.call("POST", "/v1/jobs", 201, json_body={
        "op": "saxpy", "params": {"a": 2.0},
        "inputs": {"x": {"dtype": "f32", "shape": [3],
                         "b64": base64.b64encode(struct.pack("<3f", 1, 2, 3)).decode()},
                   "y": tensor("f32", [3], [1, 1, 1])}}, note="base64")
    c.call("POST", "/v1/jobs", 201, json_body={
        "op": "add", "inputs": {"x": tensor("f32", [3], ["nan", "inf", 1.5]),
                                "y": tensor("f32", [3], [1, "-inf", 1])}}, note="non-finite")
    bf16 = c.call("POST", "/v1/jobs", 201, json_body={
        "op": "add",
        "inputs": {"x": tensor("bf16", [2], [1, 2]), "y": tensor("bf16", [2], [3, 4])}},
        note="bf16")
    c.call("POST", "/v1/jobs", 201, json_body=[small_add(1.0), small_add(2.0)], note="a list")

    first = c.call("POST", "/v1/jobs", 201, json_body=small_add(3.0),
                   headers={"Idempotency-Key": "openapi-single"}, note="Idempotency-Key")
    again = c.call("POST", "/v1/jobs", 200, json_body=small_add(3.0),
                   headers={"Idempotency-Key": "openapi-single"}, note="idempotent retry")
    c.expect_value("POST /v1/jobs (idempotent retry)", "id", json_of(again, "id"),
                   json_of(first, "id"))
    first = c.call("POST", "/v1/jobs", 201, json_body=[small_add(4.0), small_add(5.0)],
                   headers={"Idempotency-Key": "openapi-list"}, note="a list with a key")
    again = c.call("POST", "/v1/jobs", 200, json_body=[small_add(4.0), small_add(5.0)],
                   headers={"Idempotency-Key": "openapi-list"}, note="idempotent list retry")
    ids = [[j.get("id") for j in json_of(a) or [] if isinstance(j, dict)] for a in (first, again)]
    c.expect_value("POST /v1/jobs (idempotent list retry)", "ids", ids[1], ids[0])

    c.call("POST", "/v1/jobs", 400, body=b'{"op": "add", ', content_type=json_ct,
           note="invalid JSON")
    c.call("POST", "/v1/jobs", 400, body=json.dumps({"op": "nope", "inputs": {}}).encode(),
           content_type=json_ct, note="unknown op")
    c.call("POST", "/v1/jobs", 404, body=json.dumps({
        "op": "add", "inputs": {"x": tensor("f32", [2, 3], [0] * 6),
                                "y": {"buffer": unknown_id("b")}}}).encode(),
           content_type=json_ct, note="unknown buffer")
    c.call("POST", "/v1/jobs", 413,
           body=json.dumps([small_add()] * (MAX_JOBS_PER_REQUEST + 1)).encode(),
           content_type=json_ct, note="over max_jobs_per_request")
    c.call("POST", "/v1/jobs", 415, body=json.dumps(small_add()).encode(),
           content_type="text/plain", note="wrong Content-Type")
    c.call("POST", "/v1/jobs", 429,
           body=json.dumps([small_add()] * (MAX_QUEUED_PER_USER + 1)).encode(),
           content_type=json_ct, note="over max_queued_per_user")
    return json_of(add, "id"), json_of(bf16, "id")


def read_jobs(c, add_id, bf16_id):
    """Waits for, reads, lists, downloads and tries to cancel finished jobs."""
    for job_id in (add_id, bf16_id):
        if not job_id:
            continue
        done = c.call("GET", "/v1/jobs/{id}/wait", 200, params={"id": job_id}, query="timeout=15")
        c.expect_value(f"wait {job_id}", "state", json_of(done, "state"), "succeeded")
    c.call("GET", "/v1/jobs/{id}/wait", 400, params={"id": add_id or unknown_id("j")},
           query="timeout=-1", note="negative timeout")
    c.call("GET", "/v1/jobs/{id}/wait", 404, params={"id": unknown_id("j")})

    if add_id:
        job = c.call("GET", "/v1/jobs/{id}", 200, params={"id": add_id})
        out = (json_of(job, "outputs") or {}).get("out", {})
        c.expect_value("GET /v1/jobs/{id}", "outputs.out.data", out.get("data"),
                       [1, 3, 5, 7, 9, 11])
        binary = {"Accept": "application/octet-stream"}
        for template in ("/v1/jobs/{id}", "/v1/jobs/{id}/wait"):
            framed = c.call("GET", template, 200, params={"id": add_id}, headers=binary,
                            note="framed")
            out = (json_of(framed, "outputs") or {}).get("out", {})
            at = out.get("binary_offset")
            section = framed.body[framed.json_length:] if framed and framed.json_length else b""
            got = list(struct.unpack_from("<6f", section, at)) if isinstance(at, int) and \
                0 <= at <= len(section) - 24 else None
            c.expect_value(f"GET {template} (framed)", "outputs.out bytes", got,
                           [1, 3, 5, 7, 9, 11])
    c.call("GET", "/v1/jobs/{id}", 400, params={"id": "not-a-job-id"})
    c.call("GET", "/v1/jobs/{id}", 404, params={"id": unknown_id("j")})

    # Page through the whole list two at a time: every page but the last has a cursor.
    after, pages = None, 0
    while pages < 50:
        query = "limit=2" + (f"&after={after}" if after else "")
        page = c.call("GET", "/v1/jobs", 200, query=query)
        pages += 1
        after = json_of(page, "next")
        if not after:
            break
    if pages < 2:
        c.fail(f"GET /v1/jobs?limit=2: one page only, expected several (next {after!r})")
    c.call("GET", "/v1/jobs", 200, query="state=succeeded&op=add&limit=1000")
    c.call("GET", "/v1/jobs", 400, query="limit=0")

    if add_id:
        output = "/v1/jobs/{id}/outputs/{name}"
        params = {"id": add_id, "name": "out"}
        c.call("GET", output, 200, params=params, note="JSON")
        raw = c.call("GET", output, 200, params=params, query="format=raw", note="raw")
        if raw is not None:
            c.expect_value("GET output (raw)", "X-Dtype", raw.headers.get("x-dtype"), "f32")
            c.expect_value("GET output (raw)", "X-Shape", raw.headers.get("x-shape"), "2,3")
            c.expect_value("GET output (raw)", "body length", len(raw.body), 24)
        npy = c.call("GET", output, 200, params=params,
                     headers={"Accept": "application/x-npy"}, note=".npy")
        if npy is not None and not npy.body.startswith(b"\x93NUMPY"):
            c.fail(f"GET output (.npy): not a .npy file: {npy.body[:16]!r}")
        c.call("GET", output, 400, params=params, query="format=xml")
        c.call("GET", output, 404, params={"id": add_id, "name": "nope"}, note="no such output")
        c.call("GET", output, 406, params=params, headers={"Accept": "text/html"})
        c.call("DELETE", "/v1/jobs/{id}", 409, params={"id": add_id}, note="already succeeded")
        kept = c.call("POST", "/v1/buffers", 201, query=f"job={add_id}&output=out",
                      note="a job's output kept")
        c.expect_value("POST /v1/buffers (a job's output)", "shape", json_of(kept, "shape"),
                       [2, 3])
        c.call("POST", "/v1/buffers", 404, query=f"job={add_id}&output=nope",
               note="no such output")
    if bf16_id:
        c.call("GET", "/v1/jobs/{id}/outputs/{name}", 406, params={"id": bf16_id, "name": "out"},
               query="format=npy", note="bf16 has no .npy")
    c.call("DELETE", "/v1/jobs/{id}", 400, params={"id": "not-a-job-id"})
    c.call("DELETE", "/v1/jobs/{id}", 404, params={"id": unknown_id("j")})


def queued_jobs_and_drain(c, daemon):
    """With a slow gemm holding the only worker: a queued job's output (409), a long-poll that
    times out, a cancellation, a deadline that passes in the queue; then SIGTERM, and while
    the daemon drains the gemm: readyz (503) and the POSTs (503)."""
    n = SLOW_GEMM_N
    upload = c.call("POST", "/v1/buffers", 201, query=f"dtype=f32&shape={n},{n}",
                    body=bytes(4 * n * n), content_type="application/octet-stream",
                    note="the slow gemm's matrix")
    matrix = json_of(upload, "id")
    slow = c.call("POST", "/v1/jobs", 201, json_body={
        "op": "gemm", "inputs": {"a": {"buffer": matrix}, "b": {"buffer": matrix}}},
        note="slow gemm")
    slow_id = json_of(slow, "id")
    if not slow_id:
        return
    deadline = time.monotonic() + 20
    slow_started = time.monotonic()
    state = None
    while time.monotonic() < deadline:
        state = json_of(c.call("GET", "/v1/jobs/{id}", 200, params={"id": slow_id}), "state")
        if state != "queued":
            break
        time.sleep(0.01)
    if state != "running":
        c.fail(f"the slow gemm is {state}, not running; the queued-job and drain checks need it "
               "running (raise SLOW_GEMM_N if it finished)")
        return

    queued = json_of(c.call("POST", "/v1/jobs", 201, json_body=small_add(), note="queued"), "id")
    if queued:
        c.call("GET", "/v1/jobs/{id}/outputs/{name}", 409, params={"id": queued, "name": "out"},
               note="not yet succeeded")
        c.call("POST", "/v1/buffers", 409, query=f"job={queued}&output=out",
               note="its job not yet succeeded")
        waited = c.call("GET", "/v1/jobs/{id}/wait", 200, params={"id": queued},
                        query="timeout=0.05", note="times out")
        c.expect_value("wait (times out)", "state", json_of(waited, "state"), "queued")
        cancelled = c.call("DELETE", "/v1/jobs/{id}", 200, params={"id": queued}, note="queued")
        c.expect_value("DELETE a queued job", "state", json_of(cancelled, "state"), "cancelled")
    doomed = c.call("POST", "/v1/jobs", 201, json_body=dict(small_add(), deadline_ms=1),
                    note="deadline 1 ms")
    if json_of(doomed, "id"):
        failed = c.call("GET", "/v1/jobs/{id}/wait", 200, params={"id": json_of(doomed, "id")},
                        query="timeout=15", note="deadline passes")
        c.expect_value("wait (deadline)", "state", json_of(failed, "state"), "failed")
        c.expect_value("wait (deadline)", "error.code",
                       (json_of(failed, "error") or {}).get("code"), "deadline_exceeded")

    daemon.signal(signal.SIGTERM)
    signalled = time.monotonic()
    deadline = time.monotonic() + 10
    ready = 200
    while ready == 200 and time.monotonic() < deadline:
        answer = http_request_checked(c, "GET", "/readyz")
        ready = answer.status if answer is not None else None
        time.sleep(0.005)
    if ready != 503:
        c.fail(f"GET /readyz after SIGTERM: never answered 503 while draining (last: {ready})")
    c.call("POST", "/v1/jobs", 503, json_body=small_add(), note="draining")
    c.call("POST", "/v1/buffers", 503, query="dtype=f32&shape=1", body=bytes(4),
           content_type="application/octet-stream", note="draining")
    still = c.call("GET", "/v1/jobs/{id}", 200, params={"id": slow_id}, note="draining")
    c.expect_value("GET the slow gemm while draining", "state", json_of(still, "state"), "running")
    rc = daemon.wait(120)
    if rc != 0:
        c.fail(f"gpujobd after SIGTERM: exit status {rc}, expected 0 once the drain ended")
    print(f"the slow gemm ran {time.monotonic() - slow_started:.2f} s; the drain after SIGTERM "
          f"took {time.monotonic() - signalled:.2f} s")


def http_request_checked(c, method, template):
    """A request whose status may legitimately be any documented one (readyz while the signal
    lands): the answer is checked against the document, the status not pinned."""
    try:
        answer = http_request(c.port, method, template)
    except OSError as e:
        c.fail(f"{method} {template}: no answer: {e}")
        return None
    c.answers += 1
    c.check_answer(method, template, f"{method} {template} (after SIGTERM)", answer)
    return answer


# ------------------------------------------------------------------------------ main


def main():
    binary = os.environ.get("GPUJOBD_BIN")
    source = os.environ.get("GPUJOB_SOURCE_DIR",
                            os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not binary or not os.access(binary, os.X_OK):
        print(f"GPUJOBD_BIN is not an executable: {binary!r}", file=sys.stderr)
        return 1
    spec = Spec(os.path.join(source, "api", "openapi.yaml"))
    workdir = tempfile.mkdtemp(prefix="gpujobd-openapi-")
    daemon = None
    started = time.monotonic()
    try:
        daemon = Daemon(binary, workdir)
        c = Checker(spec, daemon.port)
        check_system(c, spec)
        bob, mallory = daemon.token_create("bob"), daemon.token_create("mallory")
        check_auth(c, spec, bob, mallory)
        check_tokens(c, daemon.unix_path, bob)
        buffer_id = check_buffers(c)
        if buffer_id:
            add_id, bf16_id = submit_jobs(c, buffer_id)
            read_jobs(c, add_id, bf16_id)
            check_usage(c)
        else:
            c.fail("POST /v1/buffers: no buffer was stored; the job checks need one")
        queued_jobs_and_drain(c, daemon)
        skipped = c.check_coverage()
    finally:
        if daemon is not None:
            daemon.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"checked {len(spec.operations)} operations and {c.answers} answers against "
          f"api/openapi.yaml in {time.monotonic() - started:.1f} s; "
          f"{len(c.covered)} (operation, status) pairs exercised")
    by_reason = {}
    for label, reason in skipped:
        by_reason.setdefault(reason, []).append(label)
    for reason, labels in by_reason.items():
        print(f"  not provoked ({reason}):\n    " + "\n    ".join(labels))
    if c.mismatches:
        print(f"\n{len(c.mismatches)} mismatches between gpujobd and api/openapi.yaml:",
              file=sys.stderr)
        for m in c.mismatches:
            print(f"  - {m}", file=sys.stderr)
        print("\n---- gpujobd log (last lines) ----\n" + daemon.log_text(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
