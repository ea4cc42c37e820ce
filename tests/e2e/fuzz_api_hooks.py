"""Schemathesis checks of gpujobd's own, loaded by test_fuzz_api.py (SCHEMATHESIS_HOOKS).

schema_valid_accepted: schemathesis's positive_data_acceptance (a request that the document
says is valid is not refused: no 4xx other than 401, 403, 404, 409 and 429), except where a
request can be refused for a relation between its values that JSON Schema cannot state (a
job's shapes against each other and its data, an upload's length against dtype and shape,
until before since): there a refusal must name such a relation in its error's field (RELATIONS
below), and anything else is a looseness of the document. The built-in check is replaced
rather than run beside it, since it would count those relations as findings.

consistent_jobs (before_call): a generated job is valid field by field, but its values rarely
agree with each other (data of the shape's count, y of x's dtype and shape, gemm's inner dims),
so that the daemon would refuse nearly all of them at the door and never run one. Before each
positive POST /v1/jobs with a JSON body, every other body (by a hash of its text, so that the
other half still probes the refusals) has its jobs made consistent: data and b64 of the shape's
count, the relations of its op (RELATED_INPUTS) applied. The Gpujob-Json-Length header, which
the document gives to the application/octet-stream body only, is dropped from a JSON body, and
an Idempotency-Key becomes one of the body's own.

binary_answers_conform: the answers schemathesis cannot deserialize are checked here: a framed
job answer (Gpujob-Json-Length JSON, then its binary section), a raw output (X-Dtype, X-Shape
and its length) and a .npy output (a parseable header whose dtype and shape account for every
byte).
"""

import ast
import base64
import hashlib
import json
import re
import struct

import schemathesis

DTYPE_SIZES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i8": 1, "i32": 4, "u32": 4, "i64": 8}
NPY_SIZES = {"<f4": 4, "<f2": 2, "<f8": 8, "|i1": 1, "<i4": 4, "<u4": 4, "<i8": 8}

# Per operation, the error fields a schema-valid request may be refused on, and why.
RELATIONS = {
    # Input names, dtypes and shapes per op, data against shape, params per op, and a device
    # index that this host may not have; the Gpujob-Json-Length header belongs to the
    # application/octet-stream body only and must equal its JSON's length; ?wait= takes a
    # number of seconds; a framed body's JSON must parse; a time limit past the user's bound
    # is the policy's refusal (422, naming the bound's key), as a queue past its limit is.
    ("POST", "/v1/jobs"): re.compile(
        r"^((\[\d+\]\.?)?(inputs|outputs|params|device)(\..*)?|header\.(Content-Type|"
        r"Gpujob-Json-Length)|query\.wait|body|"
        r"(limits|user\.[^.]+|group\.[^.]+)\.max_time_limit_ms|)$"),
    # dtype and shape against the body's length, dtype and shape against ?job=&output=, a
    # body (or its absence) against the Content-Type, the .npy header inside the body, and
    # durable=false against resident.
    ("POST", "/v1/buffers"): re.compile(
        r"^(query\.(dtype|shape|job|output|durable)|header\.Content-Type|body)$"),
    # until before since.
    ("GET", "/v1/usage"): re.compile(r"^query\.until$"),
}


# Per op, the inputs whose dtype and shape follow another's: (follower, leader).
RELATED_INPUTS = {
    "add": [("y", "x")], "mul": [("y", "x")], "saxpy": [("y", "x")], "dot": [("y", "x")],
    "sort": [("values", "keys")],
}


def count_of(shape):
    count = 1
    for dim in shape:
        count *= dim
    return count


def has_shape(tensor):
    return isinstance(tensor, dict) and isinstance(tensor.get("shape"), list) and \
        tensor.get("dtype") in DTYPE_SIZES


def fit_tensor(tensor):
    """Data or b64 of the shape's count (small integers, valid in every dtype); a binary
    offset, which a JSON body has no section for, becomes data."""
    if not has_shape(tensor):
        return
    count = count_of(tensor["shape"])
    if "b64" in tensor:
        raw = bytes(count * DTYPE_SIZES[tensor["dtype"]])
        tensor["b64"] = base64.b64encode(raw).decode()
        return
    tensor.pop("binary_offset", None)
    tensor["data"] = [i % 4 for i in range(count)]


def fit_gemm(job, inputs):
    """b's inner dim to a's, b of a's dtype and batch dims; c and beta left out."""
    a, b = inputs.get("a"), inputs.get("b")
    params = job.get("params") or {}
    if not (has_shape(a) and has_shape(b) and len(a["shape"]) >= 2 and len(b["shape"]) >= 2):
        return
    k = a["shape"][-2] if params.get("trans_a") else a["shape"][-1]
    n = b["shape"][-2] if params.get("trans_b") else b["shape"][-1]
    b["shape"] = a["shape"][:-2] + ([n, k] if params.get("trans_b") else [k, n])
    b["dtype"] = a["dtype"]
    inputs.pop("c", None)
    if isinstance(job.get("params"), dict):
        job["params"].pop("beta", None)
        if a["dtype"] != "f32":
            job["params"].pop("tf32", None)
        if a["dtype"] == "i8":
            job["params"].pop("alpha", None)


def fit_conv2d(job, inputs):
    """Default params, no epilogue, w [K, C, R, S] of x's dtype fitting x [N, C, H, W]."""
    x, w = inputs.get("x"), inputs.get("w")
    if not (has_shape(x) and has_shape(w) and len(x["shape"]) == 4 and len(w["shape"]) == 4):
        return
    job["params"] = None
    for name in [n for n in inputs if n not in ("x", "w")]:
        del inputs[name]
    n, c, h, wd = x["shape"]
    x["shape"] = [n, c, max(h, 1), max(wd, 1)]
    k, _, r, t = w["shape"]
    w["shape"] = [k, c, min(max(r, 1), x["shape"][2]), min(max(t, 1), x["shape"][3])]
    w["dtype"] = x["dtype"]


def fit_job(job):
    """Makes a generated job one the daemon runs: dims of at most 4 (a small job), then its
    op's relations, then each tensor's bytes."""
    if not isinstance(job, dict) or not isinstance(job.get("inputs"), dict):
        return
    inputs, op = job["inputs"], job.get("op")
    for tensor in inputs.values():
        if has_shape(tensor):
            tensor["shape"] = [min(dim, 4) if isinstance(dim, int) else dim
                               for dim in tensor["shape"]]
    for follower, leader in RELATED_INPUTS.get(op, []):
        f, lead = inputs.get(follower), inputs.get(leader)
        if isinstance(f, dict) and isinstance(lead, dict) and "shape" in lead and "shape" in f:
            f["shape"] = list(lead["shape"])
            if op != "sort":
                f["dtype"] = lead["dtype"]
            elif isinstance(job.get("params"), dict):
                job["params"].pop("argsort", None)
    if op == "gemm":
        fit_gemm(job, inputs)
    if op == "conv2d":
        fit_conv2d(job, inputs)
    if op in ("quantize", "dequantize"):
        job["params"] = None
        if isinstance(inputs.get("scale"), dict) and "shape" in inputs["scale"]:
            inputs["scale"]["shape"] = []
    for tensor in inputs.values():
        fit_tensor(tensor)


@schemathesis.hook
def before_call(context, case, kwargs):
    """consistent_jobs (see the module's comment)."""
    if route(case) != ("POST", "/v1/jobs") or case.media_type != "application/json":
        return
    for name in [h for h in (case.headers or {}) if h.lower() == "gpujob-json-length"]:
        del case.headers[name]
    # A retry with a used key answers the first job whatever the body: a key of the body's
    # own keeps the generated jobs from all folding into one while a same-body retry stays one.
    for name in [h for h in (case.headers or {}) if h.lower() == "idempotency-key"]:
        digest = hashlib.sha256(json.dumps(case.body, sort_keys=True, default=str).encode())
        case.headers[name] = digest.hexdigest()[:32]
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return
    # A list is all or nothing: its jobs are made consistent together or not at all.
    text = json.dumps(case.body, sort_keys=True, default=str).encode()
    if hashlib.sha256(text).digest()[0] % 2 == 0:
        for job in case.body if isinstance(case.body, list) else [case.body]:
            fit_job(job)


def route(case):
    return case.operation.method.upper(), case.operation.path


# What positive_data_acceptance takes for an acceptance: anything but these refusals.
REFUSALS = set(range(400, 500)) - {401, 403, 404, 409, 429}


@schemathesis.check
def schema_valid_accepted(ctx, response, case):
    """positive_data_acceptance, but for the relations above."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if response.status_code not in REFUSALS:
        return None
    relation = RELATIONS.get(route(case))
    field = None
    try:
        field = response.json()["error"].get("field", "")
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    if relation is not None and field is not None:
        # 413: a size limit on a product of dims, which no schema states.
        if response.status_code == 413 or relation.match(field):
            return True
    raise AssertionError(
        f"schema-valid request refused ({response.status_code}, field {field!r}), which the "
        f"document does not say: {response.text[:300]}")


def media_type(response):
    values = response.headers.get("content-type") or response.headers.get("Content-Type") or [""]
    value = values[0] if isinstance(values, list) else values
    return value.split(";")[0].strip().lower()


def header(response, name):
    for key, values in response.headers.items():
        if key.lower() == name.lower():
            return values[0] if isinstance(values, list) else values
    return None


def check_framed(response):
    length = header(response, "Gpujob-Json-Length")
    assert length is not None and length.isdigit(), "a framed answer without Gpujob-Json-Length"
    body = response.content
    n = int(length)
    assert n <= len(body), f"Gpujob-Json-Length {n} past the body's {len(body)} bytes"
    job = json.loads(body[:n])
    section = len(body) - n
    jobs = job if isinstance(job, list) else [job]
    for j in jobs:
        assert isinstance(j, dict) and "id" in j, "a framed answer's JSON is not a job"
        for name, out in (j.get("outputs") or {}).items():
            if "binary_offset" not in out:
                continue
            end = out["binary_offset"] + out["bytes"]
            assert end <= section, f"output {name} ends at {end}, past the section ({section})"


def check_raw(response):
    dtype = header(response, "X-Dtype")
    shape = header(response, "X-Shape")
    assert dtype in DTYPE_SIZES, f"X-Dtype {dtype!r}"
    assert shape is not None and re.match(r"^([0-9]+(,[0-9]+)*)?$", shape), f"X-Shape {shape!r}"
    count = 1
    for dim in filter(None, shape.split(",")):
        count *= int(dim)
    want = count * DTYPE_SIZES[dtype]
    assert len(response.content) == want, f"{len(response.content)} bytes, {dtype} {shape} is {want}"


def check_npy(response):
    body = response.content
    assert body[:6] == b"\x93NUMPY", "no .npy magic"
    major = body[6]
    if major == 1:
        (hlen,), start = struct.unpack("<H", body[8:10]), 10
    else:
        (hlen,), start = struct.unpack("<I", body[8:12]), 12
    head = ast.literal_eval(body[start:start + hlen].decode("latin-1"))
    assert head["descr"] in NPY_SIZES and head["fortran_order"] is False, f"header {head}"
    count = 1
    for dim in head["shape"]:
        count *= dim
    data = len(body) - start - hlen
    assert (start + hlen) % 64 == 0, "the data does not start on a 64-byte boundary"
    assert data == count * NPY_SIZES[head["descr"]], f"{data} data bytes for {head}"


@schemathesis.check
def binary_answers_conform(ctx, response, case):
    if response.status_code >= 300:
        return None
    media = media_type(response)
    if media == "application/octet-stream" and case.operation.path.startswith("/v1/jobs"):
        if case.operation.path.endswith("/outputs/{name}"):
            check_raw(response)
        else:
            check_framed(response)
        return True
    if media == "application/x-npy":
        check_npy(response)
        return True
    return None
