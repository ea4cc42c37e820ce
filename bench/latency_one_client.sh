#!/usr/bin/env bash
# Server-side time of tiny jobs at one client: a fresh gpujobd on the CPU backend, bench_loadgen
# submitting saxpy jobs one at a time and waiting for each (--modes e2e -c 1), then
# bench/e2e/server_side.py on the jobs' rows (finished_at - created_at, queue and run time).
# The 2-core figures of "A tiny job's latency at one client" in bench/README.md.
#
#   bench/latency_one_client.sh [--duration S] [gpujobd options, e.g. --set store.sync_full=false]
#
# GPUJOBD_BIN and LOADGEN_BIN override build/daemon/gpujobd and build/bench/bench_loadgen.
set -euo pipefail
cd "$(dirname "$0")/.."
gpujobd=${GPUJOBD_BIN:-build/daemon/gpujobd}
loadgen=${LOADGEN_BIN:-build/bench/bench_loadgen}
duration=3
if [ "${1:-}" = --duration ]; then
  duration=$2
  shift 2
fi
source bench/cpu_daemon.sh
start_cpu_daemon latency "$@"
mark=$(python3 bench/e2e/server_side.py "$url" --mark)
"$loadgen" --duration "$duration" --modes e2e --concurrency 1 "$url" | grep '^| e2e'
# Prints "server side e2e c=1: N of N jobs succeeded, p50 ... us, p99 ... us".
python3 bench/e2e/server_side.py "$url" --after "$mark" --sample 500 --label "e2e c=1" \
  --json "$dir/server.json" 2>&1 >/dev/null
