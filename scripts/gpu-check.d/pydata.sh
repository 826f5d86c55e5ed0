#!/usr/bin/env bash
# gpuopt.data on the GPU machine: installs the carried wheel (.whl/gpuopt-*.whl, as python.sh does)
# for the machine's python3 (PyTorch's), then runs bench/python/prefetch_bench.py: consumer wait %
# of torch's DataLoader (pin_memory, prefetch_factor 2 and 8) against gpuopt.data.prefetch of the
# same DataLoader and the native record-file source, constant and bursty producers, and H2D GB/s of
# 256 MiB batches against a pinned copy in the same run. RESULT lines; JSON and log under
# $OUT/pydata/. About 2 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}/pydata"
mkdir -p "$out"
source scripts/lib/carried-wheels.sh
install_gpuopt_wheel "$out/install.log"
case $? in
  2) echo "RESULT: pydata: skipped, no wheel in .whl/ (build it with the README's pip wheel command)"
     exit 0 ;;
  1) cat "$out/install.log"; echo "RESULT: pydata: pip install of the carried wheel failed"
     rm -rf "$site"; exit 1 ;;
esac
scratch=$(mktemp -d -p "$PWD" pydata-scratch.XXXXXX)  # the record file: on disk, not under $OUT
trap 'rm -rf "$site" "$scratch"' EXIT
bench="$PWD/bench/python/prefetch_bench.py"
(cd "$site" && timeout 400 python3 "$bench" --scratch "$scratch" --json "$out/prefetch_bench.json") \
  2>"$out/prefetch_bench.log" | tee "$out/prefetch_bench.txt" | grep '^RESULT:'
rc=${PIPESTATUS[0]}
[ $rc -ne 0 ] && { tail -20 "$out/prefetch_bench.log"; echo "RESULT: pydata: bench exit $rc"; }
exit $rc
