#!/usr/bin/env bash
# gpu-check: the LLM decoder's prefill (docs/llm.md, "Prefill"): its correctness tests (prefill vs
# token-by-token decoding, vs the CPU twin, paged vs contiguous KV cache, batched vs one at a time)
# and the 1B-shaped prompt's prefill time against token-by-token at batch 1 and 16 for prompts of
# 8, 64 and 512 tokens, as printed by the GPU tests (no gpuopt CLI needed).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/out/gpu-check}"
mkdir -p "$out"
binary="${GPUOPT_BIN:-$PWD/build-gpu/tests}/gpu_pipeline"

"$binary" --gtest_filter='LlmPrefillGpu.*' >"$out/llm_prefill.log" 2>&1
rc=$?
python3 - "$out/llm_prefill.log" "$out/llm_prefill.json" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read().splitlines()
lines = [l.strip() for l in text if l.startswith("[llm]")]
failed = [l.strip() for l in text if l.startswith("[  FAILED  ]")]
doc = {"schema_version": 1, "lines": lines, "failed": failed, "prefill": []}
timing = re.compile(r"prefill batch (\d+) prompt (\d+) \(([^)]*)\): prefill ([0-9.eE+-]+) ms, "
                    r"token-by-token ([0-9.eE+-]+) ms")
for l in lines:
    m = timing.search(l)
    if m:
        doc["prefill"].append({"batch": int(m.group(1)), "prompt": int(m.group(2)),
                               "shape": m.group(3), "prefill_ms": float(m.group(4)),
                               "token_by_token_ms": float(m.group(5))})
json.dump(doc, open(sys.argv[2], "w"), indent=1)
if not lines:
    print("RESULT: llm prefill: no [llm] lines (see llm_prefill.log)")
for p in doc["prefill"]:
    print("RESULT: llm prefill %s batch %d prompt %d: %.3f ms prefill, %.3f ms token-by-token "
          "(%.1fx)" % (p["shape"], p["batch"], p["prompt"], p["prefill_ms"],
                       p["token_by_token_ms"], p["token_by_token_ms"] / p["prefill_ms"]))
for l in lines:
    if "relative error" in l or "bit-identical" in l:
        print("RESULT: " + l[len("[llm] "):])
for l in failed:
    print("RESULT: llm prefill test FAILED: " + l[len("[  FAILED  ] "):])
PY
echo "gpu_pipeline rc=$rc"
[ $rc -eq 0 ]
