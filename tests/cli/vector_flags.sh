#!/usr/bin/env bash
# Numeric flags of `gpuopt vector` out of range are usage errors: exit 2, a message naming the flag,
# and nothing done (the store is unchanged). They used to be accepted: --k -1 returned every row,
# --batch 0 wrote one segment per vector.
# usage: vector_flags.sh GPUOPT_BINARY TEST_DATA_DIR
set -uo pipefail
gpuopt="$1"
work=$(mktemp -d /tmp/gpuopt-vector-flags-XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0
python3 - "$work/data.fvecs" <<'PY'
import struct, sys
with open(sys.argv[1], "wb") as f:
    for i in range(20):
        f.write(struct.pack("<i4f", 4, i, -i, 2 * i, 1))
PY
"$gpuopt" vector create "$work/s" --dim 4 >/dev/null || { echo "FAIL: create"; exit 1; }
"$gpuopt" vector import "$work/s" "$work/data.fvecs" >/dev/null || { echo "FAIL: import"; exit 1; }
before=$(ls -R "$work/s" | md5sum)
refused() {  # flag value subcommand-and-arguments...
  local flag="$1" value="$2" msg rc
  shift 2
  msg=$(timeout 10 "$gpuopt" vector "$@" "$flag" "$value" 2>&1)
  rc=$?
  [ $rc -eq 2 ] || { echo "FAIL: vector $1 $flag $value: exit $rc, expected 2: $msg"; failed=1; }
  grep -qF -- "$flag" <<<"$msg" ||
    { echo "FAIL: vector $1 $flag $value: message does not name $flag: $msg"; failed=1; }
}
q=(query "$work/s" "$work/data.fvecs")
refused --k -1 "${q[@]}"
refused --k 0 "${q[@]}"
refused --nprobe 0 "${q[@]}" --index ivf
refused --nprobe -3 "${q[@]}" --index ivf
refused --nlist -1 "${q[@]}" --index ivf
refused --threads -2 "${q[@]}"
refused --repeat -1 "${q[@]}"
refused --repeat 0 "${q[@]}"
refused --limit -5 "${q[@]}"
refused --k nan "${q[@]}"
refused --batch 0 import "$work/s" "$work/data.fvecs"
refused --batch -1 import "$work/s" "$work/data.fvecs"
refused --limit -1 import "$work/s" "$work/data.fvecs"
refused --start-id -7 import "$work/s" "$work/data.fvecs"
refused --dim 0 create "$work/t"
refused --dim -4 create "$work/t"
refused --batch 0 send "$work/data.fvecs" --socket "$work/none.sock"
refused --timeout -1 send "$work/data.fvecs" --socket "$work/none.sock"
refused --timeout 0 serve "$work/s" --socket "$work/none.sock"
# A GPU-only precision on the CPU engine is refused, not ignored.
msg=$("$gpuopt" vector query "$work/s" "$work/data.fvecs" --precision tf32 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -q -- "--precision tf32 needs --engine gpu" <<<"$msg" ||
  { echo "FAIL: --precision tf32 on the CPU: exit $rc: $msg"; failed=1; }
[ "$(ls -R "$work/s" | md5sum)" = "$before" ] || { echo "FAIL: a refused command changed the store"; failed=1; }
[ -e "$work/t" ] && { echo "FAIL: a refused create made a store"; failed=1; }
# In range still works.
"$gpuopt" vector query "$work/s" "$work/data.fvecs" --k 1 --threads 0 --repeat 1 --limit 1 \
  >/dev/null || { echo "FAIL: a valid query failed"; failed=1; }
[ $failed -eq 0 ] && echo "vector flags: ok"
exit $failed
