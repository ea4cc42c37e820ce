#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite. Tests labelled `gpu` skip
# themselves on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
