#!/usr/bin/env python3
"""Keeps the parts of api/openapi.yaml that follow from the daemon's code equal to it.

- The `OpName` enum is the op table (kernels/op_table.c, test-only ops left out), as the
  daemon lists it: `gpujobd --print-ops` prints one name a line.
- Every answer carries X-Request-Id (api/http_server.c): each response object of the document,
  inline or under components/responses, names the header `#/components/headers/RequestId`.

  scripts/openapi_sync.py --gpujobd BUILD/daemon/gpujobd [--write] [api/openapi.yaml]

Without --write it exits 1 and says what differs (the fuzz test runs it so); with --write it
edits the document in place, line by line, so that the rest of the file and its order stay as
they are.
"""

import argparse
import re
import subprocess
import sys

HEADER_REF = "$ref: '#/components/headers/RequestId'"


def print_ops(gpujobd):
    out = subprocess.run([gpujobd, "--print-ops"], check=True, capture_output=True, text=True)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def indent_of(line):
    return len(line) - len(line.lstrip(" "))


def sync_op_enum(lines, ops, problems):
    """Rewrites the enum line of components/schemas/OpName."""
    for i, line in enumerate(lines):
        if line.rstrip() == "    OpName:":
            for j in range(i + 1, min(i + 8, len(lines))):
                m = re.match(r"^(\s+)enum: \[(.*)\]\s*$", lines[j])
                if m:
                    have = [s.strip() for s in m.group(2).split(",")]
                    if have != ops:
                        problems.append(f"OpName enum is {have}, the op table {ops}")
                        lines[j] = f"{m.group(1)}enum: [{', '.join(ops)}]\n"
                    return
    problems.append("components/schemas/OpName with an enum line is missing")


def response_blocks(lines):
    """(start, end) of every response object: a status code under a `responses:` key, or a
    name under components/responses."""
    blocks = []
    in_components_responses = False
    for i, line in enumerate(lines):
        if line.rstrip() == "  responses:":
            in_components_responses = True
            continue
        if in_components_responses and indent_of(line) <= 2 and line.strip():
            in_components_responses = False
        code = re.match(r"^(\s+)'\d{3}':\s*$", line)
        named = in_components_responses and re.match(r"^    [A-Za-z]+:\s*$", line)
        if not code and not named:
            continue
        ind = indent_of(line)
        end = i + 1
        while end < len(lines) and (not lines[end].strip() or indent_of(lines[end]) > ind):
            end += 1
        if lines[i + 1].strip().startswith("$ref:"):
            continue  # a components/responses entry, which names the header itself
        blocks.append((i, end))
    return blocks


def sync_request_id(lines, problems):
    """Adds the X-Request-Id header to each response object without it; returns the lines."""
    inserts = []
    for start, end in response_blocks(lines):
        ind = indent_of(lines[start]) + 2
        block = lines[start + 1:end]
        if any(l.strip() == "X-Request-Id:" for l in block):
            continue
        problems.append(f"line {start + 1}: a response without X-Request-Id")
        entry = [" " * (ind + 2) + "X-Request-Id:\n", " " * (ind + 4) + HEADER_REF + "\n"]
        headers = [k for k, l in enumerate(block) if indent_of(l) == ind and l.strip() == "headers:"]
        if headers:
            inserts.append((start + 1 + headers[0] + 1, entry))
            continue
        content = [k for k, l in enumerate(block) if indent_of(l) == ind and l.strip() == "content:"]
        at = start + 1 + content[0] if content else end
        inserts.append((at, [" " * ind + "headers:\n"] + entry))
    for at, new in sorted(inserts, reverse=True):
        lines[at:at] = new
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpujobd", required=True, help="the built daemon, for --print-ops")
    ap.add_argument("--write", action="store_true", help="fix the document in place")
    ap.add_argument("document", nargs="?", default="api/openapi.yaml")
    args = ap.parse_args()
    with open(args.document, encoding="utf-8") as f:
        lines = f.readlines()
    problems = []
    sync_op_enum(lines, print_ops(args.gpujobd), problems)
    lines = sync_request_id(lines, problems)
    if not problems:
        return 0
    if args.write:
        with open(args.document, "w", encoding="utf-8") as f:
            f.writelines(lines)
        print(f"{args.document}: {len(problems)} fixes written")
        return 0
    print(f"{args.document} differs from the daemon (run scripts/openapi_sync.py --write):",
          file=sys.stderr)
    for p in problems:
        print(f"  - {p}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
