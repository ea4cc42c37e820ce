#!/usr/bin/env bash
# Runs bench_loadgen against a fresh gpujobd: starts build/daemon/gpujobd on a free port with a
# temporary state dir and the given backend, runs the load generator (extra arguments go to
# it), stops the daemon with SIGTERM and prints the Markdown table. Builds nothing: run
# scripts/build.sh first.
#
#   bench/run_loadgen.sh [cpu|cuda|auto] [bench_loadgen options...]
#
# GPUJOBD_BIN and LOADGEN_BIN override the binaries' paths.
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${1:-cpu}
[ $# -gt 0 ] && shift
gpujobd=${GPUJOBD_BIN:-build/daemon/gpujobd}
loadgen=${LOADGEN_BIN:-build/bench/bench_loadgen}
for bin in "$gpujobd" "$loadgen"; do
  [ -x "$bin" ] || { echo "run_loadgen: $bin is missing: build first (scripts/build.sh)" >&2; exit 1; }
done

dir=$(mktemp -d /tmp/gpujobd-loadgen-XXXXXX)
log="$dir/gpujobd.log"
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

# An empty config: every key at its default, but the log level keeps the log small.
: >"$dir/gpujobd.conf"
"$gpujobd" --config "$dir/gpujobd.conf" --listen 127.0.0.1:0 --state-dir "$dir/state" \
  --backend "$backend" --log-level info 2>"$log" &
pid=$!

# Port 0 picks a free port; the daemon logs it once it serves.
url=
for _ in $(seq 1 300); do
  url=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | sed 's/listening on //') || true
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "run_loadgen: gpujobd exited:" >&2; cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "run_loadgen: gpujobd did not start listening" >&2; cat "$log" >&2; exit 1; }
echo "gpujobd ($backend backend) at $url, $(nproc) cores" >&2

"$loadgen" "$@" "$url"

kill -TERM "$pid"
wait "$pid" || echo "run_loadgen: gpujobd exited with status $?" >&2
pid=
