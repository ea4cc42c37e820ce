#!/usr/bin/env bash
# Configures and builds gpujobd into ./build (the CUDA backend too when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
cmake --build build -j"$(nproc)"
