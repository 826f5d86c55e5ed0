#!/usr/bin/env bash
# gpu-check: `gpuopt bench scaler` (fused fp16 unscale over 1 GiB vs D2D copy, scripted GradScaler
# sequence on the device) and the PyTorch reference (sequence, rounding, torch's fused op timing).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/out/gpu-check}"
mkdir -p "$out"
gpuopt="${GPUOPT_BIN:-$PWD/build-gpu/tools/gpuopt}/gpuopt"

"$gpuopt" bench scaler --json >"$out/scaler.json" 2>"$out/scaler.stderr"
bench_rc=$?
python3 - "$out/scaler.json" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as error:
    print(f"RESULT: scaler bench produced no JSON ({error})")
    sys.exit(0)
for t in doc.get("testcases", []):
    if t.get("key") != "unscale_fp16":
        continue
    if t.get("outcome") != "passed":
        print(f"RESULT: scaler bench {t.get('outcome')}: {t.get('reason')}")
        break
    d = t["data"]
    print(f"RESULT: fused unscale {d['unscale_bandwidth_gbps']:.0f} GB/s "
          f"({d['unscale_ms']['median']:.3f} ms), D2D copy {d['copy_bandwidth_gbps']:.0f} GB/s, "
          f"ratio {d['ratio']:.3f} (target {d['target_ratio']:.2f}: "
          f"{'met' if d['meets_target'] else 'NOT met'})")
PY
python3 bench/reference/torch_grad_scaler.py --bench-json "$out/scaler.json" \
  --out "$out/torch_grad_scaler.json"
torch_rc=$?
echo "bench rc=$bench_rc torch reference rc=$torch_rc"
# Exit 1 from the bench is a verdict (below target), not a failure of the script.
[ $bench_rc -le 1 ] && [ $torch_rc -eq 0 ]
