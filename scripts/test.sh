#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite. Tests labelled `gpu` skip
# themselves on a machine without a GPU; those labelled `fuzz` skip in this build.
#
# Then the fuzz smoke: the targets of tests/fuzz/ built with clang in build-fuzz (the `fuzz`
# preset) and a bounded run of each (ctest -L fuzz). GPUJOB_TEST_FUZZ=0 leaves it out.
# Last, the CPU suite again under ASan+UBSan in build-asan (the `asan` preset). It leaves out
# the soak and the memory tests (label `memory`: the parse's peak, the idle daemon's resident
# set after a burst), whose memory and latency criteria mean nothing under ASan, and the
# valgrind, install and .deb tests, which cannot run an ASan build (the example they link
# against the installed library has no ASan runtime). GPUJOB_TEST_ASAN=0 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"

if [ "${GPUJOB_TEST_FUZZ:-1}" = 1 ]; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j"$(nproc)"
  ctest --preset fuzz -j"$(nproc)"
fi
if [ "${GPUJOB_TEST_ASAN:-1}" = 1 ]; then
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j"$(nproc)"
  ctest --preset asan -j"$(nproc)"
fi
