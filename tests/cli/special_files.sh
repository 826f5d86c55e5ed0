#!/usr/bin/env bash
# A FIFO where a regular file is expected: every command must fail promptly (within `timeout`) with
# a message naming the path, never wait for a writer. Covers gemm's inputs, the vector store's
# segments and catalogue, the vector file readers and doctor --root.
# usage: special_files.sh GPUOPT_BINARY TEST_DATA_DIR
set -uo pipefail
gpuopt="$1"
data="$2"
work=$(mktemp -d /tmp/gpuopt-special-files-XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# expect_refused NAME PATH_IN_MESSAGE COMMAND...: exits promptly, not 0, names the FIFO.
expect_refused() {
  local name="$1" path="$2"
  shift 2
  local msg rc
  msg=$(timeout 10 "$@" 2>&1 </dev/null)
  rc=$?
  if [ $rc -eq 124 ]; then fail "$name: blocked on a FIFO"; return; fi
  [ $rc -ne 0 ] || fail "$name: exit 0"
  grep -qF "$path is a FIFO" <<<"$msg" || fail "$name: message does not name the FIFO: $msg"
}

# gemm: the checkpoint, then the quantize config beside a valid (empty) checkpoint.
mkfifo "$work/fifo.safetensors"
expect_refused "gemm --weights" "$work/fifo.safetensors" "$gpuopt" gemm --cpu \
  --weights "$work/fifo.safetensors" --layer l --input "$work/x.npy" --output "$work/y.npy"
python3 - "$work/empty.safetensors" <<'PY'
import json, struct, sys
header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header)
PY
mkfifo "$work/config.json"
expect_refused "gemm --config" "$work/config.json" "$gpuopt" gemm --cpu \
  --weights "$work/empty.safetensors" --config "$work/config.json" --layer l \
  --input "$work/x.npy" --output "$work/y.npy"

# vector: an input file, a segment and the catalogue.
mkfifo "$work/in.fvecs"
"$gpuopt" vector create "$work/s" --dim 4 >/dev/null || fail "vector create"
expect_refused "vector import" "$work/in.fvecs" "$gpuopt" vector import "$work/s" "$work/in.fvecs"
python3 - "$work/data.fvecs" <<'PY'
import struct, sys
with open(sys.argv[1], "wb") as f:
    for i in range(8):
        f.write(struct.pack("<i4f", 4, i, i + 1, i + 2, i + 3))
PY
"$gpuopt" vector import "$work/s" "$work/data.fvecs" >/dev/null || fail "vector import"
segment=$(find "$work/s" -type f -name '*.seg' | head -1)
[ -z "$segment" ] && segment=$(find "$work/s/segments" -type f | head -1)
if [ -n "$segment" ]; then
  rm -f "$segment" && mkfifo "$segment"
  expect_refused "vector info (segment)" "$segment" "$gpuopt" vector info "$work/s"
  expect_refused "vector query (segment)" "$segment" "$gpuopt" vector query "$work/s" \
    "$work/data.fvecs"
else
  fail "no segment file found under $work/s"
fi
"$gpuopt" vector create "$work/t" --dim 4 >/dev/null || fail "vector create"
rm -f "$work/t/store.sqlite" && mkfifo "$work/t/store.sqlite"
expect_refused "vector info (catalogue)" "$work/t/store.sqlite" "$gpuopt" vector info "$work/t"

# doctor --root: a recorded machine whose /proc and sysfs files are all FIFOs finishes.
cp -a "$data/doctor/zombie-holding-gpu" "$work/machine"
find "$work/machine" -type f | while read -r file; do rm -f "$file" && mkfifo "$file"; done
timeout 10 "$gpuopt" doctor --root "$work/machine" >/dev/null 2>&1
rc=$?
[ $rc -eq 124 ] && fail "doctor --root blocked on FIFOs"
[ $rc -le 2 ] || fail "doctor --root on FIFOs exited $rc"

[ $failed -eq 0 ] && echo "special files: ok"
exit $failed
