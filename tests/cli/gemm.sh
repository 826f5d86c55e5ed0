#!/usr/bin/env bash
# `gpuopt gemm --cpu` end to end on numpy-packed GPTQ v1/v2 (with act-order) and AWQ checkpoints:
# the output must match numpy's float64 reference. Skips when python3 lacks numpy.
# usage: gemm.sh GPUOPT_BINARY TEST_DATA_DIR
set -euo pipefail
gpuopt="$1"
data="$2"
python3 -c 'import numpy' 2>/dev/null || { echo "SKIP: python3 has no numpy"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for variant in "gptq" "gptq_v2 --act-order" "awq"; do
  dir="$work/${variant// /_}"
  python3 "$data/gemm/make_fixture.py" "$dir" $variant
  "$gpuopt" gemm --cpu --weights "$dir/model.safetensors" --layer layer --input "$dir/x.npy" \
    --output "$dir/y.npy"
  python3 - "$dir" <<'PY'
import sys
import numpy as np
d = sys.argv[1]
y = np.load(f"{d}/y.npy").astype(np.float64)
ref = np.load(f"{d}/y_ref.npy")
err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
print(f"{d}: relative error {err:.2e}")
sys.exit(0 if err < 1e-3 else 1)
PY
done
# A missing layer is a clear error with exit code 2.
set +e
"$gpuopt" gemm --cpu --weights "$dir/model.safetensors" --layer nope --input "$dir/x.npy" \
  --output "$work/y.npy" 2>"$work/err.txt"
rc=$?
set -e
grep -q "nope.qweight" "$work/err.txt" && [ $rc -eq 2 ] || { cat "$work/err.txt"; exit 1; }
echo ok
