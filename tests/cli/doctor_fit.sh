#!/usr/bin/env bash
# gpuopt doctor --fit end to end: verdicts and exit codes against the hand-computed figures of
# tests/unit/doctor/fit_test.cpp, JSON, and the errors a user meets.
# Usage: bash doctor_fit.sh <gpuopt binary> <tests/data dir>
set -u
gpuopt="$1"
data="$2/fit"
fail=0
gib24=$((24 << 30))
expect() {  # description expected_exit command...
  local what="$1" want="$2"
  shift 2
  "$@" >/dev/null 2>&1
  local rc=$?
  if [ "$rc" -ne "$want" ]; then echo "FAIL: $what exited $rc, expected $want"; fail=1; fi
}
expect "8B bf16 at 1 x 8192 on 24 GiB" 0 \
  "$gpuopt" doctor --fit "$data/llama-3-8b" --context 8192 --free-bytes $gib24
expect "8B bf16 at 8 x 8192 on 24 GiB" 2 \
  "$gpuopt" doctor --fit "$data/llama-3-8b/config.json" --batch 8 --context 8192 --free-bytes $gib24
expect "8B int4 at 8 x 8192 on 24 GiB" 0 \
  "$gpuopt" doctor --fit "$data/llama-3-8b" --quant int4 --batch 8 --context 8192 --free-bytes $gib24
expect "a truncated shard" 3 "$gpuopt" doctor --fit "$data/truncated"
expect "a missing checkpoint" 3 "$gpuopt" doctor --fit "$data/no-such-model"
expect "--batch without --fit" 2 "$gpuopt" doctor --batch 2
expect "--quant int3" 2 "$gpuopt" doctor --fit "$data/llama-3-8b" --quant int3
"$gpuopt" doctor --fit "$data/truncated" 2>&1 | grep -q "model-00002-of-00002.safetensors: truncated" \
  || { echo "FAIL: the truncated shard is not named"; fail=1; }
"$gpuopt" doctor --fit "$data/llama-3-8b" --batch 8 --context 8192 --free-bytes $gib24 |
  grep -q "lower the batch to 4 (at context 8192)" || { echo "FAIL: batch advice"; fail=1; }
# Free memory and its idle holder from a recorded machine (tests/data/doctor/idle-memory-holder).
out=$("$gpuopt" doctor --fit "$data/qwen2.5-7b" --root "$2/doctor/idle-memory-holder")
[ $? -eq 2 ] || { echo "FAIL: qwen2.5-7b on the idle-memory-holder machine must not fit"; fail=1; }
grep -q "end python3 (pid 5100)" <<<"$out" || { echo "FAIL: no advice to end pid 5100: $out"; fail=1; }
json=$("$gpuopt" doctor --fit "$data/llama-3-70b" --json --free-bytes $((80 << 30)))
echo "$json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["schema_version"] == 1
assert d["model"]["parameters"] == 70553706496, d["model"]["parameters"]
assert d["verdict"] == "does_not_fit", d["verdict"]
assert d["bytes"]["weights"] == 2 * 70553706496
assert d["max_batch"] == 0
assert [a["change"] for a in d["alternatives"]] == ["int8 weights", "int4 weights", "fp8 KV cache"]
assert d["alternatives"][1]["weight_bytes"] == 39767785472
assert d["exit_code"] == 2
' || { echo "FAIL: JSON of llama-3-70b"; fail=1; }
json=$("$gpuopt" doctor --fit "$data/tiny-llama" --json --free-bytes $((2 << 30)))
echo "$json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["bytes"]["weights"] == 2 * 26784, d["bytes"]
assert d["weight_bytes_by_dtype"] == {"BF16": 2 * 26784}
assert d["weights_source"].startswith("safetensors headers (21 tensors in 2 files)")
' || { echo "FAIL: JSON of tiny-llama"; fail=1; }
[ $fail -eq 0 ] && echo "doctor --fit CLI: ok"
exit $fail
