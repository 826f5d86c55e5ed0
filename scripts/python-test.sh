#!/usr/bin/env bash
# Installs the Python package (pip install . : scikit-build-core + nanobind through the project's
# CMake, incremental in build-python/) into .venv and runs tests/python. Idempotent; needs
# Python >= 3.12 (python3.13, python3.12, pyenv's, or python3), and PyPI the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
python=""
for candidate in "${GPUOPT_PYTHON:-}" python3.13 python3.12 \
                 "$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3 2>/dev/null | tail -1)" \
                 python3; do
  [ -n "$candidate" ] || continue
  if "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "python-test: skipped: no Python >= 3.12 with venv found (set GPUOPT_PYTHON)" >&2
  exit 0
fi
venv=.venv
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# Build requirements live in the venv, so repeated installs need no network and no isolation.
"$venv/bin/python" -c 'import scikit_build_core, nanobind, numpy, pytest' 2>/dev/null ||
  "$venv/bin/pip" install -q 'scikit-build-core>=0.10' 'nanobind>=2.4' 'numpy>=1.24' 'pytest>=7'
# scikit-build-core sets CC/CXX from Python's sysconfig (e.g. "g++") when they are unset, while
# CMake picks /usr/bin/c++ for build/; ccache keys on the compiler's path, so the package build
# would recompile every C++ object. Use build/'s compilers so it reuses build/'s objects.
if [ -f build/CMakeCache.txt ]; then
  for lang in C CXX; do
    [ -z "${!lang:-}" ] || continue
    compiler=$(sed -n "s/^CMAKE_${lang}_COMPILER:[A-Z]*=//p" build/CMakeCache.txt)
    if [ -n "$compiler" ]; then export "$lang=$compiler"; fi
  done
fi
start=$(date +%s)
nice "$venv/bin/pip" install -q --no-build-isolation --no-deps .
echo "python-test: pip install . took $(( $(date +%s) - start )) s" >&2
# python/ (the package sources) is not on sys.path from here: the installed package is tested.
"$venv/bin/python" -m pytest tests/python -q -rs
