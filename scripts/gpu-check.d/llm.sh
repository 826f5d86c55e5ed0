#!/usr/bin/env bash
# gpu-check: the LLM stage's 1B-shaped decoder (docs/llm.md): one generate at batch 16 and the time
# of one decode step at batch 1 and 16, as printed by its GPU test (no gpuopt CLI needed).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/out/gpu-check}"
mkdir -p "$out"
binary="${GPUOPT_BIN:-$PWD/build-gpu/tests}/gpu_pipeline"

"$binary" --gtest_filter='LlmGpu.OneBillionShapedRunsAndReportsItsTime' >"$out/llm.log" 2>&1
rc=$?
python3 - "$out/llm.log" "$out/llm.json" <<'PY'
import json, re, sys
lines = [l.strip() for l in open(sys.argv[1]) if l.startswith("[llm]")]
doc = {"schema_version": 1, "lines": lines, "decode_step_ms": {}}
for l in lines:
    m = re.search(r"decode step batch (\d+) .*?: ([0-9.eE+-]+) ms", l)
    if m:
        doc["decode_step_ms"][m.group(1)] = float(m.group(2))
    m = re.search(r"generate batch (\d+).*?: ([0-9.eE+-]+) ms", l)
    if m:
        doc["generate_ms"] = float(m.group(2))
json.dump(doc, open(sys.argv[2], "w"), indent=1)
if not lines:
    print("RESULT: llm: no [llm] lines (see llm.log)")
for l in lines:
    print("RESULT: " + l[len("[llm] "):])
PY
echo "gpu_pipeline rc=$rc"
[ $rc -eq 0 ]
