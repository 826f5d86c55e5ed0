#!/usr/bin/env bash
# The README's test command: install dependencies, build (CUDA when nvcc exists), run every test.
# GPU-labelled tests skip with a reason on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs"
