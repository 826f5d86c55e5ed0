#!/usr/bin/env bash
# gpu-check: the LLM stage's decoder (docs/llm.md): the decode GEMM, argmax and decoder correctness
# tests, then the 1B- and 8B-shaped models end to end with one decode step timed at batch 1 and 16
# and its fraction of the HBM roofline, as printed by the GPU tests (no gpuopt CLI needed).
# Optionally a torch fp16 decode step of the same shape in a CUDA graph
# (bench/python/llm_torch_anchor.py) as the same-run anchor.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/out/gpu-check}"
mkdir -p "$out"
binary="${GPUOPT_BIN:-$PWD/build-gpu/tests}/gpu_pipeline"

"$binary" --gtest_filter='LlmGpu.*:LlmArgmaxGpu.*' >"$out/llm.log" 2>&1
rc=$?
anchor_rc=0
if [ -f bench/python/llm_torch_anchor.py ]; then
  python3 bench/python/llm_torch_anchor.py >"$out/llm_torch.log" 2>&1
  anchor_rc=$?
fi
python3 - "$out/llm.log" "$out/llm.json" "$out/llm_torch.log" <<'PY'
import json, os, re, sys
lines = [l.strip() for l in open(sys.argv[1]) if l.startswith("[llm]")]
failed = [l.strip() for l in open(sys.argv[1]) if l.startswith("[  FAILED  ]")]
torch_lines = []
if os.path.exists(sys.argv[3]):
    torch_lines = [l.strip() for l in open(sys.argv[3]) if l.startswith("[llm-torch]")]
doc = {"schema_version": 2, "lines": lines, "torch_lines": torch_lines, "failed": failed,
       "decode_step": []}
step = re.compile(r"decode step batch (\d+) \(([^)]*)\): ([0-9.eE+-]+) ms, roofline ([0-9.eE+-]+)%")
for l in lines:
    m = step.search(l)
    if m:
        doc["decode_step"].append({"batch": int(m.group(1)), "shape": m.group(2),
                                   "ms": float(m.group(3)), "roofline_percent": float(m.group(4))})
json.dump(doc, open(sys.argv[2], "w"), indent=1)
if not lines:
    print("RESULT: llm: no [llm] lines (see llm.log)")
# The headline figures: the default decoder (no KV-block or no-graph label) at each shape/batch.
for s in doc["decode_step"]:
    if "," in s["shape"]:
        continue
    print("RESULT: llm decode step %s batch %d: %.4f ms, %.1f%% of HBM roofline"
          % (s["shape"], s["batch"], s["ms"], s["roofline_percent"]))
for l in lines:
    if "decode step" in l and "," in (step.search(l).group(2) if step.search(l) else ""):
        print("RESULT: " + l[len("[llm] "):])
    elif "generate batch" in l or l.startswith("[llm] memory"):
        print("RESULT: " + l[len("[llm] "):])
for l in torch_lines:
    print("RESULT: " + l[len("[llm-torch] "):])
for l in failed:
    print("RESULT: llm test FAILED: " + l[len("[  FAILED  ] "):])
PY
echo "gpu_pipeline rc=$rc"
[ $rc -eq 0 ]
