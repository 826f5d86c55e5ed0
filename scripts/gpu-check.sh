#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool), from the repository root, with .gpu-pack (or .gpu-bundle)
# carried:
#   bash scripts/gpu-check.sh [--sanitize] [--only REGEX]   (e.g. --only 'streams|gpu_runtime')
# GPU_CHECK_DEADLINE=SECONDS bounds the whole run: each step's timeout is cut to the time left,
# steps past it are listed as skipped, and the logs are archived before the caller's own limit.
# Runs every test binary (gpu-labelled tests run for real there), then every benchmark script in
# scripts/gpu-check.d/*.sh, writes logs and JSON under $OUT, and prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle="$PWD/.gpu-bundle"
# Carried packed (scripts/gpu-build.sh writes .gpu-pack/bundle.tar.xz): unpack once.
if [ ! -d "$bundle" ] && [ -f .gpu-pack/bundle.tar.xz ]; then
  tar -xJf .gpu-pack/bundle.tar.xz
fi
# Logs and JSON go to a work folder; $OUT (at most 8 files come back) gets one archive of it plus
# the summary.
final_out="${OUT:-$PWD/out/gpu-check}"
out=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$final_out"
sanitize=0
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=1 ;;
    --only) only="$2"; shift ;;
  esac
  shift
done
# cuDNN lives in PyTorch's environment on the GPU machine (the pipeline's networks use it).
cudnn_dir=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${cudnn_dir:+$cudnn_dir:}${LD_LIBRARY_PATH:-}"
export GPUOPT_TEST_DATA_DIR="$PWD/tests/data"
export GPUOPT_BIN="$bundle/bin"
export PATH="$bundle/bin:/usr/local/cuda/bin:$PATH"
summary="$out/summary.txt"
: >"$summary"
row() {
  printf '%-34s %-8s %s\n' "$1" "$2" "$3" | tee -a "$summary" >/dev/null
  cp "$summary" "$final_out/summary.txt"  # kept current in case the caller's limit cuts the run
}
started_at=$(date +%s)
deadline=${GPU_CHECK_DEADLINE:-0}
# Prints the timeout for a step that asks for $1 seconds, cut to the time left before the
# deadline; prints nothing when the deadline has passed.
step_limit() {
  if [ "$deadline" -le 0 ]; then echo "$1"; return; fi
  local left=$(( deadline - ($(date +%s) - started_at) ))
  [ "$left" -le 5 ] && return
  echo $(( $1 < left ? $1 : left ))
}

{
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,clocks.sm \
    --format=csv,noheader 2>&1 | head -2
} >"$out/device.txt"

for test_binary in "$bundle"/bin/unit_* "$bundle"/bin/gpu_*; do
  [ -x "$test_binary" ] || continue
  name=$(basename "$test_binary")
  [ -n "$only" ] && [[ ! "$name" =~ $only ]] && continue
  log="$out/test_$name.log"
  limit=$(step_limit "${GPU_CHECK_TEST_TIMEOUT:-240}")
  if [ -z "$limit" ]; then row "$name" skipped "GPU_CHECK_DEADLINE reached"; continue; fi
  start=$(date +%s)
  timeout "$limit" "$test_binary" --gtest_brief=1 >"$log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  # The last summary is the binary's own: tests that run a helper process (gpu_vector's IPC
  # ingest) print the child's gtest summary into the same log before it.
  skipped=$(grep -oE '\[  SKIPPED \] [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$' || echo 0)
  failed=$(grep -E '^\[  FAILED  \] .*\(' "$log" | wc -l)
  passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$' || echo 0)
  row "$name" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" \
      "passed=$passed failed=$failed skipped=$skipped (${seconds} s)"
  if [ $sanitize -eq 1 ] && [[ "$name" == gpu_* ]]; then
    for tool in memcheck racecheck; do
      # cuDNN's sm90 xmma kernels synchronise through the async proxy, which racecheck does not
      # model; it reports hazards inside them. gpuopt's own kernels are all raced-checked.
      filter=()
      [ "$tool" = racecheck ] && filter=(--kernel-name-exclude kns=cudnn)
      # Tests that provoke a CUDA API error on purpose (an allocation the device cannot satisfy,
      # to check it comes back as RESOURCE_EXHAUSTED) would count as sanitizer errors.
      timeout 300 compute-sanitizer --tool $tool "${filter[@]}" --error-exitcode 9 \
        "$test_binary" --gtest_brief=1 --gtest_filter='-*ImpossibleSize*' \
        >"$out/sanitize_${tool}_$name.log" 2>&1
      src=$?
      row "  $tool $name" "$([ $src -eq 0 ] && echo ok || echo FAIL)" \
          "$(grep -E 'ERROR SUMMARY' "$out/sanitize_${tool}_$name.log" | tail -1)"
    done
  fi
done

for script in scripts/gpu-check.d/*.sh; do
  [ -f "$script" ] || continue
  name=$(basename "$script" .sh)
  [ -n "$only" ] && [[ ! "$name" =~ $only ]] && continue
  log="$out/bench_$name.log"
  start=$(date +%s)
  # A script may ask for more time with a "# gpu-check-timeout: SECONDS" line.
  limit=$(grep -m1 -oE '^# gpu-check-timeout: [0-9]+' "$script" | grep -oE '[0-9]+$')
  limit=$(step_limit "${limit:-${GPU_CHECK_BENCH_TIMEOUT:-150}}")
  if [ -z "$limit" ]; then row "bench:$name" skipped "GPU_CHECK_DEADLINE reached"; continue; fi
  OUT="$out" timeout "$limit" bash "$script" >"$log" 2>&1
  rc=$?
  # A bench script prints its own one-line result last, prefixed "RESULT: ".
  result=$(grep '^RESULT: ' "$log" | tail -3 | sed 's/^RESULT: //' | paste -sd ';' -)
  row "bench:$name" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" \
      "${result:-see $log} ($(( $(date +%s) - start )) s)"
done

tar czf "$final_out/gpu-check.tgz" -C "$out" . 2>/dev/null
cp "$summary" "$final_out/summary.txt"
echo
cat "$out/device.txt"
echo "---- gpu-check summary ----"
cat "$summary"
