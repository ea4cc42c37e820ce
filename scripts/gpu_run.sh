#!/usr/bin/env bash
# On the lent GPU machine (see ../shared/gpu/README.md): build with CUDA for sm_90, run the
# GPU-labelled tests, then the kernel benchmarks against PyTorch. Logs go to $OUT (or ./gpu-out);
# a short summary is printed last. Usage: scripts/gpu_run.sh [tests] [bench] [e2e]
set -uo pipefail
cd "$(dirname "$0")/.."
# Logs are gathered in one folder and packed into $OUT/logs.tgz at the end (the device tool
# returns only a few files).
final=${OUT:-gpu-out}
out=$(mktemp -d /tmp/gpulogs.XXXXXX)
mkdir -p "$final"
what=${*:-tests bench}
export PATH=/usr/local/cuda/bin:$PATH
b=/tmp/gpujobd-build
summary=()
cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/cmake.log" 2>&1 \
  && cmake --build $b -j"$(nproc)" >"$out/build.log" 2>&1
rc=$?
summary+=("build: rc=$rc")
if [ $rc -ne 0 ]; then grep -E "error" "$out/build.log" | head -40; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
if [[ " $what " == *" tests "* ]]; then
  ctest --test-dir $b -L gpu --output-on-failure --timeout 600 >"$out/gpu-tests.log" 2>&1
  summary+=("gpu tests: rc=$? $(grep -E 'tests passed|tests failed' "$out/gpu-tests.log" | tail -1)")
  grep -E "^\s*[0-9]+/[0-9]+ Test" "$out/gpu-tests.log" | sed 's/^ *//' | head -40
fi
if [[ " $what " == *" e2e "* ]]; then
  GPUJOB_E2E_BACKEND=cuda ctest --test-dir $b -R e2e --output-on-failure --timeout 600 >"$out/e2e-cuda.log" 2>&1
  summary+=("e2e on cuda: rc=$? $(grep -E 'tests passed|tests failed' "$out/e2e-cuda.log" | tail -1)")
fi
if [[ " $what " == *" bench "* ]]; then
  "$b/bench/bench_kernels" > "$out/bench-ours.csv" 2>"$out/bench-ours.err"
  summary+=("bench_kernels: rc=$?")
  peers=()
  for p in bench/peer/torch_*.py; do
    [ -f "$p" ] || continue
    n=$(basename "$p" .py)
    PYTHONUNBUFFERED=1 python3 "$p" > "$out/$n.csv" 2>"$out/$n.err"
    summary+=("$n: rc=$?")
    peers+=("$out/$n.csv")
  done
  python3 bench/kernels/report.py "$out/bench-ours.csv" "${peers[@]}" > "$out/bench-table.md"
  cat "$out/bench-table.md"
fi
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
[ -f "$out/bench-table.md" ] && cp "$out/bench-table.md" "$final/"
tar czf "$final/logs.tgz" -C "$out" .
