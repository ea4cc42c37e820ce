#!/usr/bin/env bash
# The end-to-end benchmark of the CUDA backend, side by side in one run: prints one Markdown
# report (bench/e2e/report.py) on stdout, progress on stderr. Each part gets a fresh gpujobd
# on a free port with a temporary state dir:
#   tiny     bench_loadgen (submit at 1,16,64 clients; arrays of 100 and 1000 from 4 clients,
#            of 100 from 16; e2e and waited at 1,16,64),
#            submit and arrays again with a binary section instead of base64, e2e and waited
#            with binary sections both ways (inputs and outputs), and, per e2e
#            row of either encoding, the daemon's own time per job (server_side.py);
#   peer     the same load against bench/peer/aiohttp_torch_server.py (aiohttp + PyTorch);
#   gemm     4,096 gemm 64^3 jobs on a default daemon and on one with batching off
#            (scheduler.max_batch=1), their inputs in the requests, then named as resident
#            buffers, then waited for one by one and as waited arrays (gemm_batching.py);
#   large    two resident uploads of --large-bytes and dot jobs on them (large_job.py);
#   pcie     the pinned host-to-device ceiling, with PyTorch (pcie_ceiling.py);
#   memory   the arrays on four shards and the GEMMs again, with the state on tmpfs: the
#            daemon's own ceiling when the disk does not bound it;
#   paths    the paths people use (paths.py): saxpy with its numbers in JSON, the same body
#            sent by wrk to gpujobd, to the aiohttp + PyTorch peer and to the LitServe peer
#            (bench/peer/litserve_server.py): one client waited (p50, p99), 16 / 64 / 256
#            clients waited, 64 clients submit only (gpujobd), the binary section waited at 1
#            and 64 clients (gpujobd, bench_loadgen), and each server's CPU per job; beside
#            gpujobd's one-client rows, their floors: the same bodies by wrk at one client to
#            bench_http_sink, answered with as many bytes as gpujobd's answers (the loopback
#            HTTP round trip), and the wake-ups of idle threads that a waited job crosses
#            (bench_wakeup, beside the server-side time);
#   uploads  --large-bytes uploads (durable, resident, ephemeral resident) beside the disk's
#            synced write rate and the loopback HTTP ceiling, with the daemon's peak RSS after
#            each kind (uploads.py, bench_http_sink);
#   gpus     one GPU against all of the host's (gpu_scaling.py), each on a fresh daemon: a
#            stream of large GEMMs on resident buffers and arrays of 1,000 tiny jobs, with
#            gpu.devices=0 and with every GPU (rows marked "needs 2 GPUs" on a host with one);
#            then, on two GPUs or more, a debug_fault job on the second beside long jobs and
#            queued ones on the first, without and with the fault. The CUDA backend only.
# A part that cannot run (no PyTorch or aiohttp, no GPU) is reported as skipped, one that fails
# as failed, each with the reason, and the rest goes on; the exit status is 1 when a part
# failed. Builds nothing: run scripts/build.sh first.
#
#   bench/e2e/run.sh [--backend cuda|cpu] [--quick] [--duration S] [--gemm-jobs N]
#                    [--large-bytes N] [--large-jobs N] [--peer-device DEV] [--parts LIST]
#
# --quick is a smoke test (1 s rows, 256 GEMMs, 64 MiB "large" buffers); with --backend cpu
# it runs on a machine without a GPU. GPUJOBD_BIN and LOADGEN_BIN override the binaries'
# paths, SINK_BIN bench_http_sink's, WAKEUP_BIN bench_wakeup's, PYTHON the clients'
# interpreter (python3) and PEER_PYTHON the peers'. WRK names wrk (default: wrk on PATH, else
# /tmp/gpudeps/usr/bin/wrk, where .gpu/env.sh unpacks it). The LitServe peer's packages come
# from .gpu-wheels/ (bench/peer/fetch_wheels.sh) when PEER_PYTHON cannot import litserve:
# installed into /tmp/site at run time, on PYTHONPATH for that peer only. --parts runs only
# the parts named (comma-separated, from the list above; without it, all but paths, uploads
# and gpus); the report marks the others as not run. Comparing two builds: run it twice with
# GPUJOBD_BIN naming each.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/e2e

backend=cuda
duration=3
gemm_jobs=4096
gemm_arrays=4
gemm_waited_arrays=64
gemm_warmup=256
large_bytes=$((1 << 30))
large_jobs=20
sample=5000
peer_device=cuda:0
peer_device_set=0
quick=0
all_parts="tiny peer gemm large pcie memory paths uploads gpus"
paths_clients=1,16,64,256
wakeup_rounds=20000
# paths and uploads (about 3 minutes more) and gpus (1 to 2 minutes) run when named, which keeps
# the default run within the GPU machine's 10 minutes per command.
parts="tiny peer gemm large pcie memory"
while [ $# -gt 0 ]; do
  case $1 in
    --backend) backend=$2; shift 2 ;;
    --quick) quick=1 duration=1 gemm_jobs=256 gemm_arrays=2 gemm_warmup=32 gemm_waited_arrays=8
      large_bytes=$((64 << 20)) large_jobs=5 sample=2000 paths_clients=1,64,256
      wakeup_rounds=2000; shift ;;
    --duration) duration=$2; shift 2 ;;
    --gemm-jobs) gemm_jobs=$2; shift 2 ;;
    --large-bytes) large_bytes=$2; shift 2 ;;
    --large-jobs) large_jobs=$2; shift 2 ;;
    --peer-device) peer_device=$2 peer_device_set=1; shift 2 ;;
    --parts) parts=${2//,/ }; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "e2e: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for name in $parts; do
  [[ " $all_parts " == *" $name "* ]] || { echo "e2e: unknown part '$name' (of: $all_parts)" >&2; exit 2; }
done
gpujobd=${GPUJOBD_BIN:-build/daemon/gpujobd}
loadgen=${LOADGEN_BIN:-build/bench/bench_loadgen}
sink=${SINK_BIN:-$(dirname "$loadgen")/bench_http_sink}
wakeup=${WAKEUP_BIN:-$(dirname "$loadgen")/bench_wakeup}
py=${PYTHON:-python3}
peer_py=${PEER_PYTHON:-$py}
for bin in "$gpujobd" "$loadgen"; do
  [ -x "$bin" ] || { echo "e2e: $bin is missing: build first (scripts/build.sh)" >&2; exit 1; }
done

dir=$(mktemp -d /tmp/gpujobd-e2ebench-XXXXXX)
# Where start_daemon puts state dirs: $dir, or $shm_dir (tmpfs) in the memory part.
state_root=$dir
shm_dir=/dev/shm/${dir##*/}
# Every process a part starts is listed here, so that whoever ends first can stop it.
: >"$dir/pids"
stop_started() {
  local pid
  while read -r pid; do
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  done <"$dir/pids"
}
trap 'stop_started; rm -rf "$dir" "$shm_dir"' EXIT

# Waits for "listening on http://..." in log, written by process pid, for up to S seconds
# (default 60); prints the URL.
wait_for_url() {
  local log=$1 pid=$2 url
  for _ in $(seq 1 $((${3:-60} * 10))); do
    url=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | sed 's/listening on //') || true
    if [ -n "$url" ]; then echo "$url"; return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "exited before serving: $(tail -n 3 "$log")" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "did not start serving within ${3:-60} s" >&2
  return 1
}

# Starts gpujobd NAME with every key at its default but the --set flags given; sets url and
# pid.
start_daemon() {
  local name=$1
  shift
  : >"$dir/$name.conf"
  "$gpujobd" --config "$dir/$name.conf" --listen 127.0.0.1:0 \
    --state-dir "$state_root/$name-state" --backend "$backend" --log-level info "$@" \
    2>"$dir/$name.log" &
  pid=$!
  echo "$pid" >>"$dir/pids"
  url=$(wait_for_url "$dir/$name.log" "$pid")
}

# Arrays of 100 from 16 clients too, beside bench_loadgen's 4: more POSTs then share each group
# commit, which takes the daemon further.
arrays16=(--modes array --array 100 --array-concurrency 16)

# Runs bench_loadgen with the arguments given and writes, beside the table (to $1.md, appended),
# what the daemon wrote to disk meanwhile ($1-io.json: /proc/PID/io's write_bytes and the
# seconds): arrays of tiny jobs are bound by the disk once the loop is not.
loadgen_io() {
  local name=$1 w0 w1 t0 t1
  shift
  w0=$(awk '/^write_bytes/ {print $2}' /proc/$pid/io)
  t0=$(date +%s.%N)
  "$loadgen" "$@" >>"$dir/$name.md"
  w1=$(awk '/^write_bytes/ {print $2}' /proc/$pid/io)
  t1=$(date +%s.%N)
  echo "{\"write_bytes\": $((w1 - w0)), \"seconds\": $(awk -v a=$t0 -v b=$t1 'BEGIN {print b - a}')}" \
    >"$dir/$name-io.json"
}

# SIGTERM, then waits for the process of start_daemon (or the peer) to exit.
stop() {
  kill -TERM "$pid"
  wait "$pid" || true
}

part_tiny() {
  start_daemon tiny
  "$loadgen" --duration "$duration" --modes submit,array "$url" >"$dir/tiny.md"
  "$loadgen" --duration "$duration" "${arrays16[@]}" "$url" >>"$dir/tiny.md"
  # The same jobs with their tensors in a binary section (no base64), which the peer lacks.
  "$loadgen" --duration "$duration" --modes submit,array --encoding binary "$url" \
    >"$dir/tiny-binary.md"
  loadgen_io tiny-binary --duration "$duration" "${arrays16[@]}" --encoding binary "$url"
  local c mark
  for c in 1 16 64; do
    mark=$("$py" $here/server_side.py "$url" --mark)
    "$loadgen" --duration "$duration" --modes e2e --concurrency "$c" "$url" >>"$dir/tiny.md"
    "$py" $here/server_side.py "$url" --after "$mark" --sample "$sample" --label "e2e c=$c" \
      --json "$dir/server-c$c.json"
  done
  # Submit and wait in one request (POST /v1/jobs?wait=), as the peer answers.
  "$loadgen" --duration "$duration" --modes waited --concurrency 1,16,64 "$url" >>"$dir/tiny.md"
  # Both ways with binary sections: outputs too come back as bytes after the JSON. The e2e
  # rows' server-side times too: a faster client leaves the daemon's threads less time to
  # fall asleep between jobs.
  for c in 1 16 64; do
    mark=$("$py" $here/server_side.py "$url" --mark)
    "$loadgen" --duration "$duration" --modes e2e --concurrency "$c" --encoding binary \
      --outputs binary "$url" >>"$dir/tiny-binary.md"
    "$py" $here/server_side.py "$url" --after "$mark" --sample "$sample" \
      --label "e2e binary c=$c" --json "$dir/server-binary-c$c.json"
  done
  "$loadgen" --duration "$duration" --modes waited --concurrency 1,16,64 --encoding binary \
    --outputs binary "$url" >>"$dir/tiny-binary.md"
  stop
  # The same arrays on a store of four shards, whose row writes run side by side.
  start_daemon tiny-shards --set store.shards=4
  "$loadgen" --duration 1 "${arrays16[@]}" --encoding binary "$url" >/dev/null
  loadgen_io tiny-shards --duration "$duration" "${arrays16[@]}" --encoding binary "$url"
  stop
}

part_peer() {
  local why
  why=$("$peer_py" -c 'import sys, aiohttp, torch
if sys.argv[1].startswith("cuda") and not torch.cuda.is_available():
    sys.exit("PyTorch sees no CUDA device")' "$peer_device" 2>&1) || {
    echo "skipped: $(tail -n 1 <<<"$why")" >"$dir/peer.skipped"
    return 0
  }
  "$peer_py" bench/peer/aiohttp_torch_server.py --port 0 --device "$peer_device" \
    >"$dir/peer.log" 2>&1 &
  pid=$!
  echo "$pid" >>"$dir/pids"
  url=$(wait_for_url "$dir/peer.log" "$pid")
  "$loadgen" --duration "$duration" "$url" >"$dir/peer.md"
  "$loadgen" --duration "$duration" "${arrays16[@]}" "$url" >>"$dir/peer.md"
  stop
}

# The GEMMs on a default daemon and on one with batching off; SUFFIX (may be empty) ends the
# names of the daemons and of their gemm-batched / gemm-unbatched .json files, and the
# arguments after it go to gemm_batching.py.
gemm_pair() {
  local suffix=$1 label args
  shift
  for label in batched unbatched; do
    args=()
    if [ $label = unbatched ]; then args=(--set scheduler.max_batch=1); fi
    start_daemon "gemm-$label$suffix" ${args[@]+"${args[@]}"}
    "$py" $here/gemm_batching.py "$url" --jobs "$gemm_jobs" --arrays "$gemm_arrays" \
      --warmup "$gemm_warmup" --label "$label$suffix" --json "$dir/gemm-$label$suffix.json" "$@"
    stop
  done
}

# With each job's inputs in its request, with the jobs naming resident buffers, the latter
# waited for one by one by 32 clients (POST ?wait=, the result in the answer), and waited for
# as 64 arrays of 64 by 8 clients (one POST ?wait= per array, the results in its answer, as
# bytes after the JSON).
part_gemm() {
  gemm_pair ""
  gemm_pair -resident --inputs resident
  gemm_pair -waited --inputs resident --mode waited --clients 32
  gemm_pair -waited-arrays --inputs resident --mode waited-arrays --arrays "$gemm_waited_arrays" \
    --clients 8 --answers binary
}

part_large() {
  start_daemon large --set limits.max_body_bytes=$((2 * large_bytes))
  "$py" $here/large_job.py "$url" --bytes "$large_bytes" --jobs "$large_jobs" \
    --disk-dir "$dir" --json "$dir/large.json"
  stop
}

# The arrays on four shards and the GEMMs again with the state dirs on tmpfs: what the daemon
# does when the disk does not bound it (bench/README.md). Not a setup to run: nothing there
# survives the machine. The arrays write about 15 KB a job, which stays until the run ends,
# hence the free space asked of /dev/shm.
part_memory() {
  local free need=$((quick ? 8 : 16))
  free=$(df --output=avail -k /dev/shm 2>/dev/null | tail -n 1) || free=0
  if [ "${free:-0}" -lt $((need << 20)) ]; then
    echo "skipped: /dev/shm has less than $need GiB free" >"$dir/memory.skipped"
    return 0
  fi
  mkdir "$shm_dir"
  state_root=$shm_dir
  start_daemon tiny-memory --set store.shards=4
  "$loadgen" --duration 1 "${arrays16[@]}" --encoding binary "$url" >/dev/null
  loadgen_io tiny-memory --duration "$duration" "${arrays16[@]}" --encoding binary "$url"
  stop
  gemm_pair -memory
}

part_pcie() {
  "$py" $here/pcie_ceiling.py --bytes "$large_bytes" --json "$dir/pcie.json"
}

# wrk as WRK names it, else on PATH, else where .gpu/env.sh unpacks it; nothing when none runs.
find_wrk() {
  local w
  for w in ${WRK:-wrk /tmp/gpudeps/usr/bin/wrk}; do
    if [[ $("$w" -v 2>&1) == wrk* ]]; then
      echo "$w"
      return 0
    fi
  done
}

# Why PYTHONPATH ($1, may be empty) and PEER_PYTHON cannot serve the peer NAME ($2) on the
# paths part's device, or nothing when they can. Without PyTorch the peers compute with NumPy,
# which is accepted on the CPU backend only, where the figures check the flow.
peer_missing() {
  local mods=aiohttp
  [ "$2" = litserve ] && mods=litserve
  PYTHONPATH=$1 LD_LIBRARY_PATH=$peer_libs "$peer_py" -c "import sys
import $mods
try:
    import torch
except ImportError:
    if sys.argv[1] == 'cuda':
        sys.exit('PyTorch is not installed')
    import numpy
    sys.exit(0)
if sys.argv[2].startswith('cuda') and not torch.cuda.is_available():
    sys.exit('PyTorch sees no CUDA device')" "$backend" "$paths_device" 2>&1 | tail -n 1
}

# The LitServe peer's PYTHONPATH: empty when PEER_PYTHON imports litserve, else /tmp/site with
# the wheels of .gpu-wheels/ installed there (pip, or unzipped where pip is missing).
litserve_site() {
  local site=/tmp/site
  if "$peer_py" -c 'import litserve' 2>/dev/null; then
    return 0
  fi
  if ! ls .gpu-wheels/*.whl >/dev/null 2>&1; then
    echo "paths: litserve is not importable and .gpu-wheels/ holds no wheels" >&2
    return 0
  fi
  if [ ! -f "$site/.installed" ]; then
    rm -rf "$site"
    mkdir -p "$site"
    # Only the wheels of packages that the interpreter lacks, or has at an older version:
    # an older copy of one it has (typing-extensions) would shadow what its own packages need.
    local wheels w
    mapfile -t wheels < <("$peer_py" - .gpu-wheels/*.whl <<'PY'
import os, re, sys
from importlib import metadata
def key(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])
for wheel in sys.argv[1:]:
    name, version = os.path.basename(wheel).split("-")[:2]
    try:
        if key(metadata.version(name.replace("_", "-"))) >= key(version):
            continue
    except metadata.PackageNotFoundError:
        pass
    print(wheel)
PY
    )
    echo "paths: installing into $site: ${wheels[*]##*/}" >&2
    if [ ${#wheels[@]} -gt 0 ] && ! "$peer_py" -m pip install -q --no-index --no-deps \
      --target "$site" "${wheels[@]}" >&2; then
      echo "paths: pip could not install them: unzipping them into $site" >&2
      for w in "${wheels[@]}"; do "$peer_py" -m zipfile -e "$w" "$site" >&2 || true; done
    fi
    touch "$site/.installed"
  fi
  echo "$site"
}

# Starts peer NAME (its script and arguments after PYTHONPATH) in a session of its own, so that
# stop_peer ends every process it forked; sets url and pid, or fails.
start_peer() {
  local name=$1 site=$2
  shift 2
  local session=setsid
  command -v setsid >/dev/null || session=env # then only the peer's first process is ended
  PYTHONPATH=$site LD_LIBRARY_PATH=$peer_libs $session "$peer_py" "$@" >"$dir/paths-$name.log" 2>&1 &
  pid=$!
  echo "$pid" >>"$dir/pids"
  [ $session = env ] || echo "-$pid" >>"$dir/pids"
  url=$(wait_for_url "$dir/paths-$name.log" "$pid" 180)
}

# SIGTERM to the peer's session, up to 5 s for its first process to end (LitServe's forked
# processes outlive it), then SIGKILL to whatever of the session is left.
stop_peer() {
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    grep -qs '^State:[[:space:]]*[RSD]' "/proc/$pid/status" || break
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# One peer's rows (JSON waited only); a peer that cannot run leaves paths-NAME.json saying why.
paths_peer() {
  local name=$1 site=$2 why
  shift 2
  why=$(peer_missing "$site" "$name") || true
  if [ -z "$why" ] && start_peer "$name" "$site" "$@"; then
    "$py" $here/paths.py "$url" --server "$name" --pid "$pid" --json "$dir/paths-$name.json" \
      --rows json --duration "$duration" --clients "$paths_clients" --wrk "$wrk" --dir "$dir" \
      --compute "$(grep -m1 '^compute: ' "$dir/paths-$name.log" | sed 's/^compute: //')"
    stop_peer
    return 0
  fi
  if [ -z "$why" ]; then
    why="did not start: $(grep -v '^\s*$' "$dir/paths-$name.log" | tail -n 1)"
    stop_peer
  fi
  echo "paths: $name skipped: $why" >&2
  "$py" -c 'import json, sys
json.dump({"server": sys.argv[1], "skipped": sys.argv[2], "rows": {}}, open(sys.argv[3], "w"))' \
    "$name" "$why" "$dir/paths-$name.json"
}

# The wake-ups of idle threads that a waited job crosses on this backend (bench_wakeup), with
# no server running: the floor of its server-side time. Missing or failing, wakeup.skipped
# says why.
paths_wakeups() {
  if [ ! -x "$wakeup" ]; then
    echo "skipped: $wakeup is missing: build first (scripts/build.sh)" >"$dir/wakeup.skipped"
    return 0
  fi
  echo "paths: wake-up floor: bench_wakeup --chain $backend, $wakeup_rounds rounds" >&2
  "$wakeup" --chain "$backend" --rounds "$wakeup_rounds" --json "$dir/wakeup.json" \
    >"$dir/wakeup.md" 2>&1 || echo "failed: $(tail -n 1 "$dir/wakeup.md")" >"$dir/wakeup.skipped"
  cat "$dir/wakeup.md" >&2
}

# The issue's table: gpujobd, then each peer, one at a time on the same machine. 256 clients
# come from one address, past server.max_connections_per_ip (64), hence 0 (no limit) here.
part_paths() {
  wrk=$(find_wrk)
  if [ -z "$wrk" ]; then
    echo "skipped: wrk not found (WRK=${WRK:-wrk}; on the GPU machine: source .gpu/env.sh)" \
      >"$dir/paths.skipped"
    return 0
  fi
  paths_device=$peer_device
  # The libraries that .gpu/env.sh unpacks for the daemon ($GPUDEPS) are left off the peers'
  # LD_LIBRARY_PATH, so that PyTorch and its packages load the image's own.
  peer_libs=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | grep -v "^${GPUDEPS:-/nonexistent}" |
    paste -sd: -) || true
  if [ "$backend" = cpu ] && [ $peer_device_set = 0 ]; then paths_device=cpu; fi
  local rows=json,binary,submit
  if [ -x "$sink" ]; then
    rows=json,binary,floor,submit
  else
    echo "paths: $sink is missing: no loopback floor" >&2
  fi
  if start_daemon paths --set server.max_connections_per_ip=0; then
    "$py" $here/paths.py "$url" --server gpujobd --pid "$pid" --json "$dir/paths-gpujobd.json" \
      --rows "$rows" --duration "$duration" --clients "$paths_clients" --wrk "$wrk" \
      --loadgen "$loadgen" --sink "$sink" --dir "$dir" --compute "gpujobd, $backend backend"
    # One client waited, as JSON numbers and as binary sections: the daemon's own time per job
    # (created_at to finished_at of its rows), beside the client's p50 of the rows above.
    local mark
    mark=$("$py" $here/server_side.py "$url" --mark)
    "$loadgen" --duration "$duration" --modes waited --concurrency 1 --encoding inline \
      "$url" >/dev/null
    "$py" $here/server_side.py "$url" --after "$mark" --sample "$sample" \
      --label "waited JSON c=1" --json "$dir/server-waited-json.json"
    mark=$("$py" $here/server_side.py "$url" --mark)
    "$loadgen" --duration "$duration" --modes waited --concurrency 1 --encoding binary \
      --outputs binary "$url" >/dev/null
    "$py" $here/server_side.py "$url" --after "$mark" --sample "$sample" \
      --label "waited binary c=1" --json "$dir/server-waited-binary.json"
    stop
  else
    echo "paths: gpujobd did not start: $(tail -n 1 "$dir/paths.log")" >&2
  fi
  paths_wakeups
  paths_peer aiohttp "" bench/peer/aiohttp_torch_server.py --port 0 --device "$paths_device"
  paths_peer litserve "$(litserve_site)" bench/peer/litserve_server.py --port 0 \
    --device "$paths_device"
}

# --large-bytes uploads beside the disk's and the loopback's ceilings (uploads.py).
part_uploads() {
  if [ ! -x "$sink" ]; then
    echo "skipped: $sink is missing: build first (scripts/build.sh)" >"$dir/uploads.skipped"
    return 0
  fi
  start_daemon uploads --set limits.max_body_bytes=$((2 * large_bytes))
  "$py" $here/uploads.py "$url" --sink "$sink" --state-dir "$state_root/uploads-state" \
    --bytes "$large_bytes" --json "$dir/uploads.json" --pid "$pid"
  stop
}

# One GPU (gpu.devices=0) against every GPU of the host, then a fault on one of two GPUs, each
# on a fresh daemon (gpu_scaling.py); the "all" and fault runs write why they did not measure
# on a host with fewer GPUs. A measure that fails is written down in its JSON and the others
# still run; the part then fails. The GEMM stream uploads a 2 GiB buffer per device (64 MiB with
# --quick) and stores 16 MiB per job: the state dirs go on tmpfs where /dev/shm has room, so
# that the disk does not bound what the GPUs are measured on, and each is removed after its
# daemon.
part_gpus() {
  if [ "$backend" != cuda ]; then
    echo "skipped: needs the CUDA backend (this run: --backend $backend)" >"$dir/gpus.skipped"
    return 0
  fi
  local q=() label args free state_on=disk need=$((quick ? 8 : 16)) rc=0
  [ $quick = 0 ] || q=(--quick)
  free=$(df --output=avail -k /dev/shm 2>/dev/null | tail -n 1) || free=0
  if [ "${free:-0}" -ge $((need << 20)) ]; then
    mkdir -p "$shm_dir"
    state_root=$shm_dir state_on=tmpfs
  fi
  echo "gpus: state dirs on $state_on" >&2
  for label in one all; do
    args=(--set limits.max_body_bytes=$((3 << 30)))
    [ $label = all ] || args+=(--set gpu.devices=0)
    start_daemon "gpus-$label" "${args[@]}"
    "$py" $here/gpu_scaling.py "$url" --measure load --label $label \
      --min-devices $([ $label = one ] && echo 1 || echo 2) --state-on $state_on \
      ${q[@]+"${q[@]}"} --json "$dir/gpus-$label.json" || rc=1
    stop || true
    rm -rf "$state_root/gpus-$label-state"
  done
  start_daemon gpus-fault --set debug.test_ops=true
  "$py" $here/gpu_scaling.py "$url" --measure fault --min-devices 2 --state-on $state_on \
    ${q[@]+"${q[@]}"} --json "$dir/gpus-fault.json" || rc=1
  stop || true
  rm -rf "$state_root/gpus-fault-state"
  return $rc
}

# Runs part NAME in a subshell that stops at its first error (set -e holds there, unlike in a
# function called from an if); a failure is written to NAME.skipped for the report, with the
# last line the part printed on stderr, and the run goes on.
run_part() {
  local name=$1 t0=$SECONDS rc
  echo "e2e: $name..." >&2
  set +e
  (
    set -e
    trap stop_started EXIT
    "part_$name"
  ) 2>"$dir/$name.err"
  rc=$?
  set -e
  sed "s/^/  /" "$dir/$name.err" >&2
  if [ $rc -ne 0 ]; then
    echo "failed (exit $rc): $(tail -n 1 "$dir/$name.err")" >"$dir/$name.skipped"
    failed+=" $name"
  fi
  echo "e2e: $name: $((SECONDS - t0)) s$([ $rc -eq 0 ] || echo ", failed with exit $rc")" >&2
}

echo "e2e: $backend backend, $(nproc) cores, results in $dir" >&2
failed=
for name in $all_parts; do
  if [[ " $parts " == *" $name "* ]]; then
    run_part "$name"
  else
    echo "not run (--parts)" >"$dir/$name.skipped"
  fi
done

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) || true
"$py" $here/report.py "$dir" --backend "$backend" --gpu "${gpu:-none}" --cores "$(nproc)" \
  --duration "$duration" --quick "$quick" --gemm-jobs "$gemm_jobs"
if [ -n "$failed" ]; then
  echo "e2e: failed:$failed (the report says why)" >&2
  exit 1
fi
