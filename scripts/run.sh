#!/usr/bin/env bash
# Installs dependencies, builds, and runs gpujobd on 127.0.0.1:8080 with its state (SQLite
# database and blobs) in ./state. Extra arguments go to gpujobd.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
mkdir -p state
exec build/daemon/gpujobd --config config/gpujobd.conf --listen 127.0.0.1:8080 --state-dir state "$@"
