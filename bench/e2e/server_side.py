#!/usr/bin/env python3
"""Server-side time of tiny jobs, from gpujobd's own job rows (standard library only).

    server_side.py URL --mark
        submits one tiny saxpy job, waits for it and prints its id: the cursor that makes the
        jobs submitted after it the sample;
    server_side.py URL --after ID [--sample 5000] [--label NAME] [--json FILE]
        reads the first --sample saxpy jobs submitted after job ID (GET /v1/jobs pages,
        oldest first) and prints the p50/p99 of finished_at - created_at over those that
        succeeded, with the medians of the daemon's queue_ms, run_ms, gpu_ms and batch_size.

created_at is stamped when the scheduler takes in the parsed job, finished_at when it records
the job's result, so the span is the daemon's time for the job less the HTTP transfer and
parsing of the request and the answer."""
import argparse
import sys

from common import Client, mark, percentile, time_us, write_json


def median(jobs, key):
    return percentile([j.get(key) for j in jobs], 0.5)


def stats(client, after, sample, label):
    rows = client.list_jobs(after, op="saxpy", most=sample)
    done = [j for j in rows if j["state"] == "succeeded"]
    server_us = [time_us(j["finished_at"]) - time_us(j["created_at"]) for j in done]
    return {
        "label": label,
        "listed": len(rows),
        "succeeded": len(done),
        "server_us_p50": percentile(server_us, 0.5),
        "server_us_p99": percentile(server_us, 0.99),
        "queue_ms_p50": median(done, "queue_ms"),
        "run_ms_p50": median(done, "run_ms"),
        "gpu_ms_p50": median(done, "gpu_ms"),
        "batch_size_p50": median(done, "batch_size"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--mark", action="store_true")
    parser.add_argument("--after")
    parser.add_argument("--sample", type=int, default=5000)
    parser.add_argument("--label", default="")
    parser.add_argument("--json")
    args = parser.parse_args()
    client = Client(args.url)
    if args.mark:
        print(mark(client))
        return 0
    if not args.after:
        parser.error("give --mark or --after ID")
    r = stats(client, args.after, args.sample, args.label)
    write_json(args.json, r)
    print(f"server side {args.label}: {r['succeeded']} of {r['listed']} jobs succeeded, "
          f"p50 {r['server_us_p50']} us, p99 {r['server_us_p99']} us "
          f"(medians: queue {r['queue_ms_p50']} ms, run {r['run_ms_p50']} ms)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
