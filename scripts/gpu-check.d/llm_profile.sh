#!/usr/bin/env bash
# gpu-check: where the LLM decode step's GPU time goes. Traces the 1B-shaped timing test with
# `gpuopt trace` (CUPTI; kernels inside CUDA graphs are recorded one by one), at batch 1 and 16,
# without programmatic dependent launch (so each traced duration is the kernel's own), and prints
# the kernels by total time with their count and mean duration.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/out/gpu-check}/llm_profile"
mkdir -p "$out"
gpuopt="$GPUOPT_BIN/gpuopt"
binary="$GPUOPT_BIN/gpu_pipeline"
status=0
for batch in 1 16; do
  "$gpuopt" trace --out "$out/trace_b$batch.json" --summary-json "$out/summary_b$batch.json" -- \
    "$binary" --gtest_filter="LlmGpu.OneBillionShapedProfileBatch$batch" >"$out/trace_b$batch.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=$rc
  grep -h "\[llm\]" "$out/trace_b$batch.log" | sed 's/^/RESULT: llm_profile /'
  python3 - "$out/summary_b$batch.json" "$batch" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as error:
    print(f"RESULT: llm_profile: no trace summary ({error})")
    sys.exit(0)
kernels = doc.get("top_kernels", [])
total = sum(k["total_ns"] for k in kernels) or 1
for k in kernels[:14]:
    name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
    print(f"RESULT: llm_profile b{sys.argv[2]} {100 * k['total_ns'] / total:5.1f}% {k['count']:7d} x "
          f"{k['total_ns'] / max(1, k['count']) / 1e3:8.2f} us  {name}")
PY
  rm -f "$out/trace_b$batch.json"  # large; the summary is what is read
  echo "gpuopt trace batch $batch rc=$rc"
done
[ $status -eq 0 ]
