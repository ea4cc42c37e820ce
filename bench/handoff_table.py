#!/usr/bin/env python3
"""The table of bench/handoff_stamps.sh: for each hand-off stamp of a waited job
(daemon/util/stamp.h), the median microseconds from the body's arrival, per run, in the order of
the first run's medians, with the step from the stamp before.

    bench/handoff_table.py LABEL:FILE.csv [LABEL:FILE.csv ...]

Each FILE is what a stamps build of gpujobd wrote at exit to GPUJOB_STAMPS_FILE: a header of
the points' names, then one line per request, empty where the request did not pass a point.
The first 10% of the requests (the warm-up) are left out."""
import csv
import statistics
import sys


def medians(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    names, rows = rows[0], rows[1:]
    rows = rows[len(rows) // 10:]
    out = {}
    for k, name in enumerate(names):
        vals = [float(r[k]) for r in rows if k < len(r) and r[k]]
        if vals:
            out[name] = (statistics.median(vals), len(vals))
    return out, len(rows)


def main():
    runs = []
    for arg in sys.argv[1:]:
        label, _, path = arg.rpartition(":")
        runs.append((label, *medians(path)))
    order = sorted(runs[0][1], key=lambda n: runs[0][1][n][0])
    for _, m, _ in runs[1:]:
        order += [n for n in sorted(m, key=lambda n: m[n][0]) if n not in order]
    head = "| stamp |" + "".join(f" {label} µs | step |" for label, _, _ in runs)
    print(head)
    print("|---|" + "---:|---:|" * len(runs))
    prev = [0.0] * len(runs)
    for name in order:
        cells = []
        for i, (_, m, n) in enumerate(runs):
            if name not in m:
                cells += ["—", ""]
                continue
            med, count = m[name]
            note = "" if count >= 0.9 * n else f" ({100 * count // n}%)"
            cells += [f"{med:.1f}{note}", f"{med - prev[i]:+.1f}"]
            prev[i] = med
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    print("requests: " + ", ".join(f"{label} {n}" for label, _, n in runs))


if __name__ == "__main__":
    main()
