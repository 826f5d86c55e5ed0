#!/usr/bin/env bash
# Installs what gpuopt needs to build and test (Debian/Ubuntu, idempotent; python3-venv for the
# Python package's venv, scripts/python-test.sh). Python packages for
# benchmark drivers go in with `--bench`.
set -euo pipefail

packages=(cmake ninja-build g++ ccache pkg-config libcli11-dev nlohmann-json3-dev libfmt-dev
          libgtest-dev libgmock-dev libbenchmark-dev libpci-dev pci.ids libhwloc-dev
          libsqlite3-dev zlib1g-dev libturbojpeg0-dev libjs-chart.js clang libclang-rt-14-dev pciutils chromium dataset-fashion-mnist
          g++-aarch64-linux-gnu python3-prometheus-client python3-venv python3-jsonschema)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# bench/vector/requirements.txt includes bench/requirements.txt and adds the embedded stores.
if [ "${1:-}" = "--bench" ] && [ -f bench/vector/requirements.txt ]; then
  python3 -m pip install -q -r bench/vector/requirements.txt
fi
