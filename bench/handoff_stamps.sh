#!/usr/bin/env bash
# Where a waited tiny job's time goes, hand-off by hand-off: a gpujobd built with
# -DGPUJOB_STAMPS=ON (daemon/util/stamp.h) on the CPU backend, one client submitting saxpy on
# 1,024 f32 with POST /v1/jobs?wait=30 (bench_loadgen --modes waited -c 1), once with JSON
# numbers in and out, once with binary sections in and out. It prints the client's p50 and p99
# (bench_loadgen), the server-side time (created_at to finished_at, bench/e2e/server_side.py),
# and, through bench/handoff_table.py, the median microseconds from the body's arrival to each
# stamp.
# The tables of "A waited tiny job's hand-offs" in bench/README.md.
#
#   bench/handoff_stamps.sh [--duration S] [gpujobd options, e.g. --set store.sync_full=false]
#
# GPUJOBD_BIN (a stamps build: cmake -DGPUJOB_STAMPS=ON) defaults to build-stamps/daemon/gpujobd,
# LOADGEN_BIN to build/bench/bench_loadgen.
set -euo pipefail
cd "$(dirname "$0")/.."
gpujobd=${GPUJOBD_BIN:-build-stamps/daemon/gpujobd}
loadgen=${LOADGEN_BIN:-build/bench/bench_loadgen}
duration=3
if [ "${1:-}" = --duration ]; then
  duration=$2
  shift 2
fi
csv=$(mktemp -d /tmp/gpujobd-stamps-XXXXXX)
trap 'rm -rf "$csv"' EXIT
for enc in inline binary; do
  (
    export GPUJOB_STAMPS_FILE=$csv/$enc.csv
    source bench/cpu_daemon.sh
    start_cpu_daemon "stamps-$enc" "$@"
    mark=$(python3 bench/e2e/server_side.py "$url" --mark)
    "$loadgen" --duration "$duration" --modes waited --concurrency 1 --encoding "$enc" \
      --outputs "$([ "$enc" = binary ] && echo binary || echo json)" "$url" |
      grep -E '^\| (mode|waited)' | sed "s/^/client, $enc: /"
    # "server side waited ENC: N of N jobs succeeded, p50 ... us, p99 ... us" (created_at to
    # finished_at, from the jobs' rows).
    python3 bench/e2e/server_side.py "$url" --after "$mark" --sample 2000 \
      --label "waited $enc" 2>&1 >/dev/null
    # A clean stop writes the stamps (at exit).
    kill -TERM "$pid"
    wait "$pid" || true
    trap - EXIT
    rm -rf "$dir"
  )
done
python3 bench/handoff_table.py "JSON:$csv/inline.csv" "binary section:$csv/binary.csv"
