#!/usr/bin/env bash
# The Hopper wgmma W4A16 kernel (force_path 5) against cuBLAS fp16 and the default path at
# M = 32..256 on the two Llama-3-70B shapes: JSON to $OUT/gemm_wgmma_*.json, one RESULT line per
# (shape, M): gpuopt fp16 us, cuBLAS fp16 us, speedup, config. GPUOPT_W4A16_WGMMA_VARIANT /
# GPUOPT_W4A16_WGMMA_SPLITS, when set, pass through to the planner.
set -uo pipefail
out="${OUT:-.}"
bin="${GPUOPT_BIN:-./build/tools/gpuopt}"
for shape in k8192_n28672 k28672_n8192; do
  for path in 5 default; do
    json="$out/gemm_wgmma_${shape}_${path}.json"
    if [ "$path" = default ]; then
      GPUOPT_GEMM_M=32,64,128,256 timeout 60 "$bin/gpuopt" bench gemm --quick --json --only "$shape" \
        >"$json" 2>>"$out/gemm_wgmma.stderr"
    else
      GPUOPT_GEMM_FORCE_PATH=$path GPUOPT_GEMM_M=32,64,128,256 timeout 60 "$bin/gpuopt" bench gemm \
        --quick --json --only "$shape" >"$json" 2>>"$out/gemm_wgmma.stderr"
    fi
    python3 - "$json" "$path" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as error:
    print(f"RESULT: gemm_wgmma path {sys.argv[2]} no JSON ({error})")
    sys.exit(0)
for case in data.get("testcases", []):
    d = case.get("data") or {}
    if case.get("outcome") != "passed" or "rows" not in d:
        print(f"RESULT: {case.get('key')} path {sys.argv[2]} {case.get('outcome')} {case.get('reason', '')}")
        continue
    for r in d["rows"]:
        print(f"RESULT: {case['key']} path {sys.argv[2]} M{r['m']} {r['gpuopt_fp16_us']:.1f} us "
              f"cuBLAS {r['cublas_fp16_us']:.1f} us x{r['speedup_vs_cublas_fp16']:.2f} "
              f"bf16 {r['gpuopt_bf16_us']:.1f} [{r.get('config', '')}]")
PY
  done
done
