#!/usr/bin/env bash
# gpu-check: where the LLM decode step's GPU time goes. Traces the 1B-shaped timing test with
# `gpuopt trace` (CUPTI; kernels inside CUDA graphs are recorded one by one) and prints the
# kernels by total time with their count and mean duration.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/out/gpu-check}/llm_profile"
mkdir -p "$out"
gpuopt="$GPUOPT_BIN/gpuopt"
binary="$GPUOPT_BIN/gpu_pipeline"
"$gpuopt" trace --out "$out/trace.json" --summary-json "$out/summary.json" -- \
  "$binary" --gtest_filter='LlmGpu.OneBillionShapedRunsAndReportsItsTime' >"$out/trace.log" 2>&1
rc=$?
python3 - "$out/summary.json" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as error:
    print(f"RESULT: llm_profile: no trace summary ({error})")
    sys.exit(0)
kernels = doc.get("top_kernels", [])
total = sum(k["total_ns"] for k in kernels) or 1
for k in kernels[:12]:
    name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
    print(f"RESULT: llm_profile {100 * k['total_ns'] / total:5.1f}% {k['count']:7d} x "
          f"{k['total_ns'] / max(1, k['count']) / 1e3:8.2f} us  {name}")
PY
rm -f "$out/trace.json"  # large; the summary is what is read
echo "gpuopt trace rc=$rc"
[ $rc -eq 0 ]
