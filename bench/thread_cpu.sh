#!/usr/bin/env bash
# CPU time of each of gpujobd's threads (by name: gj-loop, MHD-worker, gj-cpu, ...) over one
# bench_loadgen run against a fresh daemon on the CPU backend; what per-job figures like
# "HTTP threads µs/job" in bench/README.md come from (divide by the jobs it prints).
#
#   bench/thread_cpu.sh [bench_loadgen options...]    e.g. --modes array --array 100 --encoding binary
#
# GPUJOBD_BIN and LOADGEN_BIN override build/daemon/gpujobd and build/bench/bench_loadgen.
set -euo pipefail
cd "$(dirname "$0")/.."
gpujobd=${GPUJOBD_BIN:-build/daemon/gpujobd}
loadgen=${LOADGEN_BIN:-build/bench/bench_loadgen}
source bench/cpu_daemon.sh
start_cpu_daemon threads

# utime + stime in clock ticks, summed by thread name.
snapshot() {
  for t in /proc/$pid/task/*; do
    echo "$(cat "$t/comm") $(awk '{print $14 + $15}' "$t/stat")"
  done | awk '{a[$1] += $2} END {for (k in a) print k, a[k]}' | sort
}
"$loadgen" --duration 1 "$@" "$url" >/dev/null # warm-up
snapshot >"$dir/before"
"$loadgen" "$@" "$url" | grep '^| [a-z]'
snapshot >"$dir/after"
tick_ms=$((1000 / $(getconf CLK_TCK)))
echo
echo "| thread | CPU ms |"
echo "|---|---:|"
join "$dir/before" "$dir/after" | awk -v t="$tick_ms" '{printf "| %s | %d |\n", $1, ($3 - $2) * t}'
