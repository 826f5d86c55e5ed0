#!/usr/bin/env bash
# Installs gpuopt's dependencies (Debian/Ubuntu, idempotent).
#   setup.sh           everything: building, all tests (browser for the report test, clang runtime
#                      for the sanitizers and fuzzers, the aarch64 cross compiler for the portable
#                      build, jsonschema and prometheus_client for the output checks, python3-venv
#                      for the Python package's venv, scripts/python-test.sh)
#   setup.sh --audit   only what `scripts/audit.sh` needs: configure the default preset, build the
#                      gpuopt target and run `gpuopt audit` (tests/cli/setup_sets.sh checks that
#                      this set covers every package the configure step finds)
#   setup.sh --bench   everything, then the Python packages of the benchmark drivers (pip)
#   --print            list the chosen set's packages, one a line, and install nothing
set -euo pipefail

# Configure (the default preset also configures the unit tests, hence GoogleTest), build, and the
# audit's run: pci.ids names the devices doctor reports, Chart.js is inlined into report.html, and
# bench vector measures on Fashion-MNIST when it is installed.
audit_packages=(cmake ninja-build g++ pkg-config libcli11-dev nlohmann-json3-dev libfmt-dev
                libgtest-dev libpci-dev pci.ids libhwloc-dev libsqlite3-dev zlib1g-dev
                libturbojpeg0-dev libjs-chart.js dataset-fashion-mnist)
# Everything else the tests and developer tools use.
test_packages=(ccache libgmock-dev libbenchmark-dev clang libclang-rt-14-dev pciutils chromium
               g++-aarch64-linux-gnu python3-prometheus-client python3-venv python3-jsonschema)

audit_only=0 bench=0 print=0
for argument in "$@"; do
  case "$argument" in
    --audit) audit_only=1 ;;
    --bench) bench=1 ;;
    --print) print=1 ;;
    *) echo "setup: unknown option '$argument' (--audit, --bench, --print)" >&2; exit 2 ;;
  esac
done
packages=("${audit_packages[@]}")
((audit_only)) || packages+=("${test_packages[@]}")
if ((print)); then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

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
if ((bench && !audit_only)) && [ -f bench/vector/requirements.txt ]; then
  python3 -m pip install -q -r bench/vector/requirements.txt
fi
