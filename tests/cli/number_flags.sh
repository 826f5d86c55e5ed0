#!/usr/bin/env bash
# Real-valued and named flags outside the CLI's vector commands are usage errors: exit 2 and a
# message naming the flag. NaN, infinity and 1e-300 used to pass (CLI11's range checks let NaN
# through; `doctor --watch 1e-300` was a busy loop), and a misspelled `audit --skip` stage was
# ignored.
# usage: number_flags.sh GPUOPT_BINARY TEST_DATA_DIR
set -uo pipefail
gpuopt="$1"
failed=0
refused() {  # expected-text flag arguments...
  local expected="$1" flag="$2" msg rc
  shift 2
  msg=$(timeout 10 "$gpuopt" "$@" 2>&1)
  rc=$?
  [ $rc -eq 2 ] || { echo "FAIL: gpuopt $*: exit $rc, expected 2: $msg"; failed=1; }
  grep -qF -- "$flag" <<<"$msg" || { echo "FAIL: gpuopt $*: does not name $flag: $msg"; failed=1; }
  grep -qF -- "$expected" <<<"$msg" ||
    { echo "FAIL: gpuopt $*: does not say '$expected': $msg"; failed=1; }
}
refused "not a finite number" --watch doctor --watch nan
refused "not a finite number" --watch doctor --watch inf
refused "outside" --watch doctor --watch 1e-300
refused "outside" --duration doctor --watch 1 --duration -1
refused "not a finite number" --nvml-period trace --nvml-period nan -- true
refused "outside" --nvml-period trace --nvml-period 0 -- true
refused "not a finite number" --consumer-us bench loader --consumer-us inf
refused "outside" --stall-us bench loader --stall-us -5
refused "did you mean 'bench.pcie'" --skip audit --skip pcei --out-dir /nonexistent/never-made
refused "the stages are" --skip audit --skip nothing-like-it --out-dir /nonexistent/never-made
[ $failed -eq 0 ] && echo "number_flags: ok"
exit $failed
