#!/usr/bin/env bash
# gpu-check: gpuopt.amp.GradScaler against torch.amp.GradScaler on the GPU: its pytest files
# (side by side with torch, sync counting) and bench/python/grad_scaler_bench.py (unscale_ and
# unscale_+clip over 1 GiB in 200 tensors, a GPT-shaped training step). Installs the carried wheel
# (.whl/gpuopt-*.whl, as python.sh) for the machine's own python3.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}/amp"
mkdir -p "$out"
# The tensor-list kernels against their CPU twin first (the C++ tests under the Python scaler).
if [ -x "${GPUOPT_BIN:-}/gpu_kernels" ]; then
  "$GPUOPT_BIN/gpu_kernels" --gtest_brief=1 --gtest_filter='TensorList*' >"$out/gpu_kernels.log" 2>&1
  echo "RESULT: amp tensor-list kernel tests: exit $? ($(grep -oE '\[  PASSED  \] [0-9]+' \
    "$out/gpu_kernels.log" | tail -1))"
fi
source scripts/lib/carried-wheels.sh
install_gpuopt_wheel "$out/install.log"
case $? in
  2) echo "RESULT: amp: skipped, no wheel in .whl/ (build it with the README's pip wheel command)"
     exit 0 ;;
  1) cat "$out/install.log"; echo "RESULT: amp: pip install of the carried wheel failed"
     rm -rf "$site"; exit 1 ;;
esac
trap 'rm -rf "$site"' EXIT
repo=$PWD
cd "$site"  # the installed package, not python/gpuopt of the checkout
python3 -m pytest "$repo/tests/python/test_amp.py" "$repo/tests/python/test_amp_gpu.py" -q -rs \
  --junitxml="$out/pytest.xml" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
summary=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|skipped)' "$out/pytest.log" | tail -1 | tr -d '=')
echo "RESULT: amp pytest: ${summary:-no summary} (exit $rc)"
python3 "$repo/bench/python/grad_scaler_bench.py" --profile --out "$out/grad_scaler_bench.json" 2>&1 |
  tee "$out/grad_scaler_bench.log" | grep '^RESULT:'
bench_rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
