#!/usr/bin/env bash
# W4A16 at prefill sizes (M = 256, 1024, 4096) on the 70B layer shapes: the int4 kernel alone
# (no dense copy; `int4_kernel_us`, timed with the takeover off) against cuBLAS fp16 on dense
# weights in the same process, and the weight memory per layer of each. One RESULT line per (shape,
# M); JSON to $OUT/gemm_prefill.json.
set -uo pipefail
out="${OUT:-.}"
bin="${GPUOPT_BIN:-./build/tools/gpuopt}"
"$bin/gpuopt" bench gemm --quick --json --m 256,1024,4096 --only k8192_n28672,k28672_n8192 \
  >"$out/gemm_prefill.json" 2>"$out/gemm_prefill.stderr"
rc=$?
python3 - "$out/gemm_prefill.json" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as error:  # the bench failed before writing JSON
    print(f"RESULT: gemm prefill no JSON ({error})")
    sys.exit(0)
for case in data.get("testcases", []):
    d = case.get("data") or {}
    if case.get("outcome") != "passed" or "rows" not in d:
        print(f"RESULT: {case.get('key')} {case.get('outcome')} {case.get('reason', '')}")
        continue
    dense_mb = d["k"] * d["n"] * 2 / 1e6
    int4_mb = d["compressed_weight_bytes"] / 1e6
    for r in d["rows"]:
        kernel = r.get("int4_kernel_us") or (r["gpuopt_fp16_us"] if r["path"] == "int4" else None)
        cublas = r["cublas_fp16_us"]
        if kernel is None:
            print(f"RESULT: {case['key']} M{r['m']} int4 kernel not timed (path {r['path']})")
            continue
        print(f"RESULT: {case['key']} M{r['m']} int4 kernel {kernel:.1f} us vs cuBLAS fp16 "
              f"{cublas:.1f} us = {cublas / kernel:.2f}x (default path {r['path']} "
              f"{r['gpuopt_fp16_us']:.1f} us); weights int4 + scales {int4_mb:.1f} MB, dense fp16 "
              f"{dense_mb:.1f} MB")
PY
exit $rc
