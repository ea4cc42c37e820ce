#!/usr/bin/env bash
# On a machine with an H200 (or another sm_90 GPU), the CUDA toolkit, the packages of
# scripts/deps.sh (jemalloc and the header-only libfast-float-dev included: stage it with
# `../shared/gpu/stage.sh libfast-float-dev libdragonbox-dev` where the machine has no
# registry) and, for the
# peers, PyTorch and aiohttp on python3:
# build with CUDA for sm_90 into /tmp/gpujobd-build (Release), then any of
#   tests  the GPU-labelled tests
#   bench  bench_kernels and the PyTorch peers, joined into one table
#   load   bench/run_loadgen.sh against the daemon on its CUDA backend
#   e2e    the end-to-end suites with the daemon on its CUDA backend
#   e2ebench  bench/e2e/run.sh (gpujobd against the aiohttp + PyTorch peer, batching, a large
#          job; about 4 minutes after the build) into e2e-bench.md; run it on its own, as
#          together with every other step $OUT would hold 9 files and the time limit is near
# in that order. Usage: scripts/gpu_run.sh [tests] [bench] [load] [e2e] [e2ebench]. Logs are
# written straight into $OUT (the device tool returns at most 8 files, even when a command is
# stopped at its time limit); a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
what=" ${*:-tests bench} "
export PATH=/usr/local/cuda/bin:$PATH
b=/tmp/gpujobd-build
summary=()
note() { summary+=("$1"); echo "== $1" >>"$out/summary.txt"; }
wanted() { [[ $what == *" $1 "* ]]; }

cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/build.log" 2>&1 &&
    cmake --build $b -j"$(nproc)" >>"$out/build.log" 2>&1
rc=$?
note "build: rc=$rc"
if [ $rc -ne 0 ]; then
    grep -E "error" "$out/build.log" | head -40
    printf '%s\n' "${summary[@]}"
    exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$out/summary.txt" 2>&1

if wanted tests; then
    ctest --test-dir $b -L gpu --output-on-failure --timeout 300 >"$out/gpu-tests.log" 2>&1
    note "gpu tests: rc=$? $(grep -E 'tests passed|tests failed' "$out/gpu-tests.log" | tail -1)"
    grep -E "Test +#" "$out/gpu-tests.log" | sed 's/^ *//'
fi
if wanted bench; then
    "$b/bench/bench_kernels" >"$out/bench-ours.csv" 2>>"$out/summary.txt"
    note "bench_kernels: rc=$?"
    : >"$out/bench-peers.csv"
    for p in bench/peer/torch_*.py; do
        PYTHONUNBUFFERED=1 timeout 150 python3 "$p" >>"$out/bench-peers.csv" 2>>"$out/summary.txt"
        note "$(basename "$p"): rc=$?"
    done
    python3 bench/kernels/report.py "$out/bench-ours.csv" "$out/bench-peers.csv" >"$out/bench-table.md"
    cat "$out/bench-table.md"
fi
if wanted load; then
    GPUJOBD_BIN=$b/daemon/gpujobd LOADGEN_BIN=$b/bench/bench_loadgen bench/run_loadgen.sh cuda \
        >"$out/loadgen.md" 2>&1
    note "loadgen on cuda: rc=$?"
    cat "$out/loadgen.md"
fi
if wanted e2e; then
    GPUJOB_E2E_BACKEND=cuda ctest --test-dir $b -R e2e --output-on-failure --timeout 300 \
        >"$out/e2e-cuda.log" 2>&1
    note "e2e on cuda: rc=$? $(grep -E 'tests passed|tests failed' "$out/e2e-cuda.log" | tail -1)"
fi
if wanted e2ebench; then
    GPUJOBD_BIN=$b/daemon/gpujobd LOADGEN_BIN=$b/bench/bench_loadgen bench/e2e/run.sh \
        >"$out/e2e-bench.md" 2>>"$out/summary.txt"
    note "e2e bench: rc=$?"
    cat "$out/e2e-bench.md"
fi
printf '%s\n' "${summary[@]}"
