#!/usr/bin/env bash
# The README's test command: install dependencies, build (CUDA when nvcc exists), run every test,
# then install the Python package into .venv and run its tests (tests/python).
# GPU-labelled tests skip with a reason on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# ccache keys relative to the checkout: the package build (build-python/) reuses build/'s objects.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
jobs=$(nproc)
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs"
bash scripts/python-test.sh
