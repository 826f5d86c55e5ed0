#!/usr/bin/env bash
# The Hopper wgmma W4A16 kernel (--force-path wgmma) against cuBLAS fp16 and the default path at
# M = 32..256 on the two Llama-3-70B shapes: JSON to $OUT/gemm_wgmma_*.json, one RESULT line per
# (shape, M): gpuopt fp16 us, cuBLAS fp16 us, speedup, config. GEMM_WGMMA_FLAGS, when set, is added
# to every forced run (e.g. "--wgmma-variant 8 --wgmma-splits 4").
# GEMM_WGMMA_SWEEP=1 adds a sweep of the default variants (7: 32 tokens at M=32, 8: 64 tokens at
# M=64, 9: 128 tokens at M=128,256) over forced k-splits, stopping after GEMM_WGMMA_BUDGET_S seconds
# (default 100).
set -uo pipefail
out="${OUT:-.}"
bin="${GPUOPT_BIN:-./build/tools/gpuopt}"
start=$SECONDS
budget="${GEMM_WGMMA_BUDGET_S:-100}"

# bench LABEL SHAPE MS [FLAG...]: one `gpuopt bench gemm` run, its rows as RESULT lines.
bench() {
  local label=$1 shape=$2 ms=$3
  shift 3
  local json="$out/gemm_wgmma_${shape}_${label}.json"
  timeout "${GEMM_WGMMA_TIMEOUT_S:-60}" "$bin/gpuopt" bench gemm --quick --json --only "$shape" \
    --m "$ms" "$@" >"$json" 2>>"$out/gemm_wgmma.stderr"
  python3 - "$json" "$label" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as error:
    print(f"RESULT: gemm_wgmma {sys.argv[2]} no JSON ({error})")
    sys.exit(0)
for case in data.get("testcases", []):
    d = case.get("data") or {}
    if case.get("outcome") != "passed" or "rows" not in d:
        print(f"RESULT: {case.get('key')} {sys.argv[2]} {case.get('outcome')} {case.get('reason', '')}")
        continue
    for r in d["rows"]:
        print(f"RESULT: {case['key']} {sys.argv[2]} M{r['m']} {r['gpuopt_fp16_us']:.1f} us "
              f"cuBLAS {r['cublas_fp16_us']:.1f} us x{r['speedup_vs_cublas_fp16']:.2f} "
              f"bf16 {r['gpuopt_bf16_us']:.1f} [{r.get('config', '')}]")
PY
}

for shape in k8192_n28672 k28672_n8192; do
  # shellcheck disable=SC2086 # GEMM_WGMMA_FLAGS is a list of flags
  bench path5 "$shape" 32,64,128,256 --force-path wgmma ${GEMM_WGMMA_FLAGS:-}
  if [ "${GEMM_WGMMA_SWEEP:-0}" != 1 ]; then
    bench default "$shape" 32,64,128,256
  fi
done
if [ "${GEMM_WGMMA_SWEEP:-0}" = 1 ]; then
  for splits in 1 2 4 3 6; do
    for shape in k8192_n28672 k28672_n8192; do
      for variant in 7 8 9; do
        if ((SECONDS - start > budget)); then
          echo "RESULT: gemm_wgmma sweep stopped at ${budget} s"
          exit 0
        fi
        ms=128,256
        [ "$variant" = 7 ] && ms=32
        [ "$variant" = 8 ] && ms=64
        bench "v${variant}_s${splits}" "$shape" "$ms" --force-path wgmma \
          --wgmma-variant "$variant" --wgmma-splits "$splits"
      done
    done
  done
fi
