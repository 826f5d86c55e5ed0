#!/usr/bin/env bash
# Messages for people carry no internal status-code names ("INVALID_ARGUMENT: ...",
# "UNAVAILABLE: ..."): a sample of user errors and of waived testcases, in text; in JSON the code is
# a field of its own (reason_code).
# Usage: bash plain_errors.sh <gpuopt binary> <tests/data dir>
set -u
gpuopt="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
export CUDA_VISIBLE_DEVICES=""
codes='(CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS):'
check() {  # description, then the command; its stdout and stderr together must be free of codes
  local what="$1"; shift
  local text
  text=$("$@" 2>&1)
  if grep -qE "$codes" <<<"$text"; then
    echo "FAIL: $what prints a status-code name:"; grep -E "$codes" <<<"$text"; fail=1
  fi
  [ -n "$text" ] || { echo "FAIL: $what printed nothing"; fail=1; }
}
check "gemm, missing checkpoint" "$gpuopt" gemm --weights "$work/absent.safetensors" --layer l \
  --input "$work/x.npy" -o "$work/y.npy"
check "bench pcie, bad size" "$gpuopt" bench pcie --sizes 4K,zero
check "bench gemm, bad timing" "$gpuopt" bench gemm --timing sideways
check "bench streams, waived" "$gpuopt" bench streams --quick
check "bench pcie, waived" "$gpuopt" bench pcie --quick --sizes 4K
check "bench scaler, waived" "$gpuopt" bench scaler --quick
check "bench gemm, waived" "$gpuopt" bench gemm --quick --only k4096_n4096
check "bench loader, record file absent" "$gpuopt" bench loader --record-file "$work/absent.rec" \
  --io cufile
check "vector, no store" "$gpuopt" vector info "$work/absent-store"
check "doctor, no such root" "$gpuopt" doctor --root "$work/absent-root"
check "audit, bad --from" "$gpuopt" audit --from "$work/absent.json" --out-dir "$work/a"
check "trace, bad output" "$gpuopt" trace -o "$work/no/such/dir/t.json" -- true

# The code is kept in JSON, as its own field beside the plain reason.
"$gpuopt" bench scaler --quick --json | python3 -c '
import json, sys
for t in json.load(sys.stdin)["testcases"]:
    if t["outcome"] != "passed":
        assert t["reason"] and ":" not in t["reason"].split(" ")[0], t
        assert t["reason_code"] in ("UNIMPLEMENTED", "UNAVAILABLE"), t
    else:
        assert t["reason_code"] is None, t
' || { echo "FAIL: bench scaler --json: reason_code"; fail=1; }
[ "$fail" -eq 0 ] && echo "plain errors ok"
exit "$fail"
