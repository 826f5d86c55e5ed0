#!/usr/bin/env bash
# W4A16 GEMM vs cuBLAS fp16 (gpuopt bench gemm --quick): JSON to $OUT/gemm.json, then one RESULT
# line per shape with the speedup at M=1, 16, 64 and the minimum over M = 1..256 (and the plain
# read of the weights at full occupancy and at the direct kernel's 16 warps per SM); then the
# deterministic mode (W4A16Options::deterministic) at M = 1, 16 on one shape.
set -uo pipefail
out="${OUT:-.}"
bin="${GPUOPT_BIN:-./build/tools/gpuopt}"
"$bin/gpuopt" bench gemm --quick --json >"$out/gemm.json" 2>"$out/gemm.stderr"
rc=$?
python3 - "$out/gemm.json" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as error:  # the bench failed before writing JSON
    print(f"RESULT: gemm no JSON ({error})")
    sys.exit(0)
for case in data.get("testcases", []):
    d = case.get("data") or {}
    if case.get("outcome") != "passed" or "rows" not in d:
        print(f"RESULT: {case.get('key')} {case.get('outcome')} {case.get('reason', '')}")
        continue
    s = {r["m"]: r["speedup_vs_cublas_fp16"] for r in d["rows"]}
    us = {r["m"]: r["gpuopt_fp16_us"] for r in d["rows"]}
    met = d.get("targets_met")
    of_read = {r["m"]: r.get("fraction_of_stream_read", 0) for r in d["rows"]}
    print(f"RESULT: {case['key']} x cuBLAS M1 {s.get(1, 0):.2f} M16 {s.get(16, 0):.2f} "
          f"M64 {s.get(64, 0):.2f} min {d['min_speedup_vs_cublas_fp16']:.2f} "
          f"(M1 {us.get(1, 0):.1f} us, {100 * of_read.get(1, 0):.0f}% of a plain read "
          f"{d.get('stream_read_us', 0):.1f} us, {d.get('stream_read_16_warps_us', 0):.1f} us "
          f"at 16 warps/SM)"
          + ("" if met is None else f" targets {'met' if met else 'MISSED'}"))
    q = {r["m"]: r.get("speedup_sequence_vs_cublas_fp16", 0) for r in d["rows"]}
    print(f"RESULT: {case['key']} back to back x cuBLAS M1 {q.get(1, 0):.2f} "
          f"M16 {q.get(16, 0):.2f} M64 {q.get(64, 0):.2f}")
PY
"$bin/gpuopt" bench gemm --quick --json --m 1,16 --deterministic \
  --only k8192_n28672 >"$out/gemm_deterministic.json" 2>>"$out/gemm.stderr"
python3 - "$out/gemm_deterministic.json" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as error:
    print(f"RESULT: gemm deterministic no JSON ({error})")
    sys.exit(0)
for case in data.get("testcases", []):
    rows = (case.get("data") or {}).get("rows", [])
    print(f"RESULT: {case.get('key')} deterministic " + " ".join(
        f"M{r['m']} {r['gpuopt_fp16_us']:.1f} us ({r['speedup_vs_cublas_fp16']:.2f}x)" for r in rows))
PY
# The previous default for M <= 16 (the swapped kernel with its own copy-pipeline choice), forced,
# as the "before" of the direct kernel in the same run.
"$bin/gpuopt" bench gemm --quick --json --force-path swapped --m 1,8,16 \
  --only k8192_n28672 >"$out/gemm_swapped.json" 2>>"$out/gemm.stderr"
python3 - "$out/gemm_swapped.json" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as error:
    print(f"RESULT: gemm swapped no JSON ({error})")
    sys.exit(0)
for case in data.get("testcases", []):
    rows = (case.get("data") or {}).get("rows", [])
    print(f"RESULT: {case.get('key')} swapped kernel (before) " + " ".join(
        f"M{r['m']} {r['gpuopt_fp16_us']:.1f} us ({r['speedup_vs_cublas_fp16']:.2f}x)" for r in rows))
PY
exit $rc
