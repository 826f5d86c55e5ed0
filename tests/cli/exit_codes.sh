#!/usr/bin/env bash
# The exit-code table printed by `gpuopt --help` is the one in README.md, and commands exit as it
# says: 0 healthy, 1 warnings, 2 errors found or a usage error, 3 gpuopt itself failed.
# Usage: bash exit_codes.sh <gpuopt binary> <tests/data dir>
set -u
gpuopt="$1"
data="$2"
readme="$data/../../README.md"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
export CUDA_VISIBLE_DEVICES=""

# The table: four rows in --help, each also a row of README.md's table.
table=$("$gpuopt" --help | grep -E '^  [0-3]  ')
[ "$(wc -l <<<"$table")" -eq 4 ] || { echo "FAIL: --help has no four-row exit-code table: $table"; fail=1; }
while IFS= read -r row; do
  code=$(awk '{print $1}' <<<"$row")
  text=$(sed -E 's/^  [0-3]  //' <<<"$row")
  grep -qF "| $code | $text |" "$readme" || { echo "FAIL: README.md lacks the row '| $code | $text |'"; fail=1; }
done <<<"$table"

expect() {  # expected-exit args...
  local want="$1"; shift
  "$gpuopt" "$@" >/dev/null 2>&1
  local rc=$?
  [ "$rc" -eq "$want" ] || { echo "FAIL: gpuopt $* exited $rc, expected $want"; fail=1; }
}
# 0: healthy (a recorded healthy machine; a testcase waived for want of a GPU is info), and the
# commands that only print.
expect 0 doctor --root "$data/doctor/h200-healthy"
expect 0 bench streams --quick --only graph_launch
expect 0 --help
expect 0 bench pcie --help
expect 0 --version
expect 0 bench gemm --list
# 1: warnings.
expect 1 doctor --root "$data/doctor/aspm-powersave"
# 2: errors found.
expect 2 doctor --root "$data/doctor/zombie-holding-gpu"
# 2: usage errors, whichever layer catches them (the parser, a validator, the command).
expect 2 audti
expect 2 doctor --jsn
expect 2 audit --stage-timeout 0
expect 2 audit --skip bench.nothing
expect 2 audit --from "$work/absent.json" --out-dir "$work/a"
expect 2 bench streams --samples -1
expect 2 bench streams --only nothing
expect 2 bench pcie --sizes 4K,zero
expect 2 bench gemm --timing sideways
expect 2 bench gemm --m 1,8193
expect 2 bench loader --cpu --producer-cost free
expect 2 bench loader --io pread
expect 2 pipeline --mode sideways
expect 2 bench scaler -o "$work/no/such/dir/out.txt"
expect 2 trace -o "$work/no/such/dir/t.json" -- true
# 3: gpuopt itself failed: a build without CUDA has no CUPTI tracer to run a trace with.
if "$gpuopt" --version | grep -q "^CUDA: off"; then
  expect 3 trace -o "$work/t.json" -- true
fi
[ "$fail" -eq 0 ] && echo "exit codes ok"
exit "$fail"
