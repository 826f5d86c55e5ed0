#!/usr/bin/env bash
# gpu-check: what one dependent step costs on this GPU: a kernel per step in a CUDA graph (with and
# without programmatic dependent launch) against a grid-wide barrier inside one persistent kernel,
# 3 blocks of 128 threads per SM as the LLM decoder's GEMMs (bench/reference/step_sync.cu).
set -uo pipefail
out="${OUT:-.}"
bin="${GPUOPT_BIN:-./build/bin}"
"$bin/step_sync" --blocks-per-sm 3 --steps 84 --repeats 200 >"$out/step_sync.log" 2>&1
rc=$?
sed -n 's/^step_sync: /RESULT: step_sync /p' "$out/step_sync.log"
exit $rc
