#!/usr/bin/env bash
# Downloads the LitServe peer's packages (bench/peer/litserve_server.py) as wheels for CPython
# 3.12 on manylinux x86_64 into .gpu-wheels/ (ignored by git), for the GPU machine, which
# reaches no package registry: the wheels travel there with the checkout, and
# bench/e2e/run.sh's paths part installs them into /tmp/site when the peer's Python cannot
# import litserve. The machine's image already has anyio, h11, click, uvloop, PyTorch and
# aiohttp, so only what LitServe adds is fetched, each at a fixed version, without
# dependencies (pydantic-core's version is the one that pydantic release requires).
#
#   bench/peer/fetch_wheels.sh [DIR]        (default .gpu-wheels)
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-.gpu-wheels}
pip=${PIP:-python3 -m pip}
packages=(
  litserve==0.2.19
  fastapi==0.115.12
  starlette==0.46.2
  pydantic==2.11.4
  pydantic-core==2.33.2
  annotated-types==0.7.0
  typing-inspection==0.4.0
  typing-extensions==4.13.2
  pyzmq==26.4.0
  uvicorn==0.34.2
  httptools==0.6.4
)
mkdir -p "$dest"
for p in "${packages[@]}"; do
  # Compiled wheels are tagged manylinux2014 or manylinux_2_17 (the same glibc 2.17), or a
  # later manylinux_2_28; pure ones "any". Each platform tag is tried in turn.
  ok=0
  for platform in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64; do
    if $pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform "$platform" --no-deps -d "$dest" "$p"; then
      ok=1
      break
    fi
  done
  [ $ok = 1 ] || { echo "fetch_wheels: no wheel of $p for CPython 3.12 x86_64" >&2; exit 1; }
done
ls -l "$dest"
du -sh "$dest"
