#!/usr/bin/env bash
# `gpuopt bench pcie` with no GPU visible: exit 0, valid JSON, every testcase waived with a reason.
# CUDA_VISIBLE_DEVICES="" hides any GPU, so this checks the waiver path on every machine.
set -euo pipefail
gpuopt="$1"
json=$(CUDA_VISIBLE_DEVICES="" "$gpuopt" bench pcie --json --sizes 4K,1M)
printf '%s' "$json" | python3 -c '
import json, sys
doc = json.load(sys.stdin)
assert doc["suite"] == "pcie", doc["suite"]
cases = doc["testcases"]
assert len(cases) >= 10, len(cases)
for case in cases:
    assert case["outcome"] == "waived", (case["key"], case["outcome"])
    assert case["reason"], case["key"]
print(f"{len(cases)} testcases waived with a reason")
'
CUDA_VISIBLE_DEVICES="" "$gpuopt" bench pcie --quick >/dev/null
# Bad input is a usage error (exit 2) with a message, never a crash.
set +e
"$gpuopt" bench pcie --sizes 4K,zero --json >/dev/null 2>&1
rc=$?
set -e
if [ "$rc" -ne 2 ]; then
  echo "bad --sizes: exit $rc, expected 2" >&2
  exit 1
fi
grep -q "^host_to_device_memcpy_ce_pinned " <<<"$("$gpuopt" bench pcie --list)"
