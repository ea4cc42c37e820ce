#!/usr/bin/env python3
"""Joins bench_kernels' CSV with the PyTorch peers' CSVs into the Markdown table of
bench/README.md ("Kernels against PyTorch").

usage: report.py OURS.csv PEER.csv [PEER.csv ...]

Each CSV has rows `case,ms,bytes,flops`. A case present in both is compared: the ratio is
peer_ms / our_ms (above 1: we are faster). Bandwidth is (bytes / ms); the copy ceiling is the
row named `ceiling/copy/...` (ours, measured with cudaMemcpyAsync), and every memory-bound case
is also shown as a fraction of it. A peer case named `<case>/loop` or `<case>/torch_*` is shown
as its own row.
"""
import csv
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            try:
                rows[r["case"]] = (float(r["ms"]), float(r["bytes"]), float(r["flops"]))
            except (KeyError, ValueError):
                continue
    return rows


def main():
    ours = load(sys.argv[1])
    peer = {}
    for p in sys.argv[2:]:
        peer.update(load(p))
    ceiling = None
    for name, (ms, b, _) in list(ours.items()) + list(peer.items()):
        if name.startswith("ceiling/copy") and ms > 0:
            ceiling = max(ceiling or 0, b / ms / 1e6)  # GB/s
    print("| case | ours ms | ours GB/s | ours TFLOP/s | of copy ceiling | PyTorch ms | PyTorch / ours |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in sorted(set(ours) | set(peer)):
        if name.startswith("ceiling/"):
            ms, b, _ = ours.get(name) or peer[name]
            print(f"| {name} | {ms:.3f} | {b / ms / 1e6:.0f} | | 1.00 | | |")
            continue
        o = ours.get(name)
        t = peer.get(name)
        cells = [name]
        if o:
            ms, b, fl = o
            gbs = b / ms / 1e6 if ms > 0 else 0
            tfs = fl / ms / 1e9 if ms > 0 else 0
            cells += [f"{ms:.3f}", f"{gbs:.0f}" if b else "", f"{tfs:.1f}" if fl else "",
                      f"{gbs / ceiling:.2f}" if ceiling and b and fl < b * 4 else ""]
        else:
            cells += ["", "", "", ""]
        if t:
            cells.append(f"{t[0]:.3f}")
            cells.append(f"{t[0] / o[0]:.2f}" if o and o[0] > 0 else "")
        else:
            cells += ["", ""]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
