#!/usr/bin/env bash
# The Python package on the GPU machine: installs the carried wheel (.whl/gpuopt-*.whl, built here
# by the README's `pip wheel` command, without the CLI) for the machine's own python3 (its torch),
# then runs tests/python (GPU tests run for real there) and the GPTQ layer example.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}/python"
mkdir -p "$out"
source scripts/lib/carried-wheels.sh
install_gpuopt_wheel "$out/install.log"
case $? in
  2) echo "RESULT: python: skipped, no wheel in .whl/ (build it with the README's pip wheel command)"
     exit 0 ;;
  1) cat "$out/install.log"; echo "RESULT: python: pip install of the carried wheel failed"
     rm -rf "$site"; exit 1 ;;
esac
trap 'rm -rf "$site"' EXIT
cd "$site"  # import the installed package, not python/gpuopt of the checkout
python3 -c 'import gpuopt, torch; print("gpuopt", gpuopt.__version__, "cuda", gpuopt.built_with_cuda, "torch", torch.__version__)'
python3 -m pytest "$OLDPWD/tests/python" -q -rs --junitxml="$out/pytest.xml" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
python3 "$OLDPWD/examples/gptq_layer.py" --synthetic --m 16 2>&1 | tee "$out/gptq_layer.log"
# Per-call overhead of the layer from Python at M=1 on the 70B down-projection shape.
python3 "$OLDPWD/bench/python/w4a16_overhead.py" 2>&1 | tee "$out/w4a16_overhead.log" |
  grep '^RESULT:'
# A small layer, where the kernel is shorter than a Python call and the host cost shows in full.
python3 "$OLDPWD/bench/python/w4a16_overhead.py" --k 4096 --n 4096 2>&1 |
  tee "$out/w4a16_overhead_4096.log" | grep '^RESULT:'
# gpuopt.vector from Python (1M x 128): add from a torch CUDA tensor and from numpy, GPU queries
# at batch 1000 and 1, beside the CLI's `vector query --engine gpu` on the same store and queries.
python3 "$OLDPWD/bench/python/vector_bench.py" ${GPUOPT_BIN:+--gpuopt "$GPUOPT_BIN/gpuopt"} \
  --profile 200 --out "$out/vector_bench" 2>&1 | tee "$out/vector_bench.log" | grep "^RESULT:"
summary=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|skipped)' "$out/pytest.log" | tail -1 | tr -d '=')
echo "RESULT: python pytest: ${summary:-no summary} (exit $rc)"
exit $rc
