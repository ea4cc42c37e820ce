#!/usr/bin/env bash
# Installs what gpujobd needs to build and test on Debian 12 (bookworm), skipping what is
# already there. Runs apt-get as root, or through sudo.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libmicrohttpd-dev libjansson-dev libuv1-dev
      libsqlite3-dev check libsubunit-dev libinih-dev libcurl4-openssl-dev libjemalloc-dev
      libfast-float-dev libdouble-conversion-dev libsodium-dev libgnutls28-dev curl openssl python3 python3-yaml
      python3-jsonschema
      libdragonbox-dev  # dragonbox, header-only: the answers' shortest floats (api/float_print.cc)
      python3-numpy python3-tqdm python3-pip python3-setuptools python3-wheel  # the Python client
      passwd  # useradd and userdel: the test of two users on the Unix socket (as root)
      chromium chromium-driver python3-selenium  # the status page's test in a real browser
      dpkg-dev systemd  # the .deb test: dpkg-shlibdeps for cpack, systemd-analyze verify
      prometheus  # promtool check rules: the dashboards' test
      clang-14 libclang-rt-14-dev)  # the fuzz build: clang with libFuzzer and the sanitizers
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "deps.sh: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The Python client's test runs under the python3 on PATH, which may be another interpreter
# than Debian's (a pyenv one): it needs NumPy there, and setuptools and wheel to pip-install
# the package without fetching a build environment.
if ! python3 -c 'import numpy, setuptools, wheel' 2>/dev/null; then
  echo "deps.sh: installing numpy, setuptools and wheel for $(command -v python3)"
  python3 -m pip install --quiet --root-user-action=ignore numpy setuptools wheel
fi
# The API fuzz test (tests/e2e/test_fuzz_api.py) runs schemathesis, which Debian does not
# package, under the same python3.
if ! python3 -c 'import schemathesis' 2>/dev/null; then
  echo "deps.sh: installing schemathesis for $(command -v python3)"
  python3 -m pip install --quiet --root-user-action=ignore --break-system-packages \
    'schemathesis==4.*' 2>/dev/null ||
    python3 -m pip install --quiet --root-user-action=ignore 'schemathesis==4.*'
fi
