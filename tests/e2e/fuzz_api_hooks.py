"""Schemathesis checks of gpujobd's own, loaded by test_fuzz_api.py (SCHEMATHESIS_HOOKS).

schema_valid_accepted: schemathesis's positive_data_acceptance (a request that the document
says is valid is not refused: no 4xx other than 401, 403, 404, 409 and 429), except where a
request can be refused for a relation between its values that JSON Schema cannot state (a
job's shapes against each other and its data, an upload's length against dtype and shape,
until before since): there a refusal must name such a relation in its error's field (RELATIONS
below), and anything else is a looseness of the document. The built-in check is replaced
rather than run beside it, since it would count those relations as findings.

binary_answers_conform: the answers schemathesis cannot deserialize are checked here: a framed
job answer (Gpujob-Json-Length JSON, then its binary section), a raw output (X-Dtype, X-Shape
and its length) and a .npy output (a parseable header whose dtype and shape account for every
byte).
"""

import ast
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
    # application/octet-stream body only and must equal its JSON's length; ?wait= takes one
    # job, not a list; a framed body's JSON must parse.
    ("POST", "/v1/jobs"): re.compile(
        r"^((\[\d+\]\.?)?(inputs|outputs|params|device)(\..*)?|header\.(Content-Type|"
        r"Gpujob-Json-Length)|query\.wait|body|)$"),
    # dtype and shape against the body's length, dtype and shape against ?job=&output=, a
    # body (or its absence) against the Content-Type, the .npy header inside the body, and
    # durable=false against resident.
    ("POST", "/v1/buffers"): re.compile(
        r"^(query\.(dtype|shape|job|output|durable)|header\.Content-Type|body)$"),
    # until before since.
    ("GET", "/v1/usage"): re.compile(r"^query\.until$"),
}


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
