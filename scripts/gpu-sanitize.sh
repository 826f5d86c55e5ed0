#!/usr/bin/env bash
# Run ON THE GPU MACHINE with .gpu-pack (or .gpu-bundle) carried: compute-sanitizer (memcheck, racecheck) over the
# GPU tests of gpuopt's own kernels, test by test filter, skipping the long timing tests (1B-shaped
# LLM, 1M-row search) that take minutes under the sanitizer. gpu-check.sh --sanitize runs whole
# binaries instead. Logs go to $OUT; one line per pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle="$PWD/.gpu-bundle"
if [ ! -d "$bundle" ] && [ -f .gpu-pack/bundle.tar.xz ]; then tar -xJf .gpu-pack/bundle.tar.xz; fi
out="${OUT:-$PWD/out/gpu-sanitize}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export GPUOPT_TEST_DATA_DIR="$PWD/tests/data"
per_pass="${GPU_SANITIZE_TIMEOUT:-75}"

pass() {  # binary tool gtest-filter
  local binary=$1 tool=$2 filter=$3
  local log="$out/sanitize_${tool}_${binary}.log"
  # cuDNN's sm90 kernels synchronise through the async proxy, which racecheck does not model.
  timeout "$per_pass" compute-sanitizer --tool "$tool" --kernel-name-exclude kns=cudnn \
    --error-exitcode 9 "$bundle/bin/$binary" --gtest_brief=1 --gtest_filter="$filter" >"$log" 2>&1
  local rc=$?
  local passed
  passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  printf "%-10s %-13s rc=%-3s passed=%-3s %s\n" "$tool" "$binary" "$rc" "$passed" \
    "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
}

pass gpu_vector memcheck 'All/FusedExactSearch.*:TiledExactSearch.*:IngestDevice.*:GpuIngest.*'
pass gpu_vector racecheck 'All/FusedExactSearch.*'
pass gpu_data memcheck '*Cufile*'
pass gpu_pipeline memcheck 'LlmGpu.TinyMatchesTheTwin:LlmGpu.BatchedEqualsOneAtATimeAndRunsRepeat:LlmGpu.RefusesBadRequests:PipelineGpu.*'
pass gpu_pipeline racecheck 'LlmGpu.TinyMatchesTheTwin'
pass gpu_kernels memcheck 'W4A16GemmGpuKernels.*:W4A16GemmGpuDeterministic.*:W4A16GemmGpuStreamK.*:W4A16GemmGpuFallback.*'
# The direct kernel's full tests take minutes under racecheck: its smoke test covers each form.
pass gpu_kernels racecheck 'W4A16GemmGpuSanitize.*:W4A16GemmGpuKernels.BothKernelFamiliesAtAnyM'
pass gpu_kernels memcheck '*Wgmma*'
pass gpu_kernels racecheck '*Wgmma*'
