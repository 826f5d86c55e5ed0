#!/usr/bin/env bash
# `gpuopt --version` prints the version of the project() call in CMakeLists.txt (read here from the
# file, not repeated), a git revision, CUDA on/off and the GPU architectures; and exits 0.
set -euo pipefail
gpuopt="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
expected=$(sed -n 's/^project(gpuopt VERSION \([0-9][0-9.]*\) .*/\1/p' "$root/CMakeLists.txt")
if [ -z "$expected" ]; then echo "FAIL: no 'project(gpuopt VERSION x.y.z' line in CMakeLists.txt"; exit 1; fi
out=$("$gpuopt" --version)
echo "$out"
first=$(head -1 <<<"$out")
if [ "$first" != "gpuopt $expected" ]; then
  echo "FAIL: first line is '$first', expected 'gpuopt $expected'"; exit 1
fi
revision=$(sed -n 's/^git revision: //p' <<<"$out")
if [ -z "$revision" ]; then echo "FAIL: no 'git revision:' line"; exit 1; fi
# Built from a git checkout the revision is the commit (with -dirty for local changes).
if git -C "$root" rev-parse --show-toplevel >/dev/null 2>&1 &&
   [ "$(cd "$(git -C "$root" rev-parse --show-toplevel)" && pwd -P)" = "$(cd "$root" && pwd -P)" ]; then
  head_commit=$(git -C "$root" rev-parse HEAD)
  case "$head_commit" in
    "${revision%-dirty}"*) ;;
    *) echo "WARN: revision $revision is not HEAD $head_commit (committed since the last build?)" ;;
  esac
  if [[ ! "$revision" =~ ^[0-9a-f]{12}(-dirty)?$ ]]; then
    echo "FAIL: revision '$revision' is not a 12-digit commit"; exit 1
  fi
fi
cuda=$(sed -n 's/^CUDA: //p' <<<"$out")
arches=$(sed -n 's/^GPU architectures: //p' <<<"$out")
case "$cuda" in
  off) [ "$arches" = "none" ] || { echo "FAIL: CUDA off but architectures '$arches'"; exit 1; } ;;
  "on (CUDA "[0-9]*")")
    if [ -z "$arches" ] || [ "$arches" = "none" ]; then
      echo "FAIL: CUDA on but architectures '$arches'"; exit 1
    fi ;;
  *) echo "FAIL: CUDA line is '$cuda'"; exit 1 ;;
esac
echo "ok: gpuopt $expected, revision $revision, CUDA $cuda"
