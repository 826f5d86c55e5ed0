#!/usr/bin/env bash
# `gpuopt trace` without a usable GPU (or without CUDA in the build): it says so and exits cleanly,
# passing the command's exit status through; a command that cannot run is an error (2).
set -uo pipefail
gpuopt="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; cat "$work/err" 2>/dev/null; exit 1; }

"$gpuopt" trace --out "$work/trace.json" -- true >"$work/out" 2>"$work/err"
rc=$?
if grep -q "built without CUDA" "$work/err"; then
  [ "$rc" -eq 3 ] || fail "CPU-only build: expected exit 3, got $rc"
  echo "ok: CPU-only build says it cannot trace (exit 3)"
  exit 0
fi
if nvidia-smi -L >/dev/null 2>&1; then
  echo "ok: a GPU is present; the GPU path is checked by scripts/gpu-check.d/trace.sh"
  exit 0
fi
[ "$rc" -eq 0 ] || fail "'trace -- true' exited $rc, expected the command's 0"
grep -q "nothing was traced" "$work/err" || fail "no 'nothing was traced' message"

"$gpuopt" trace --out "$work/trace.json" -- sh -c 'exit 5' >"$work/out" 2>"$work/err"
rc=$?
[ "$rc" -eq 5 ] || fail "'trace -- sh -c \"exit 5\"' exited $rc, expected 5"

"$gpuopt" trace --out "$work/trace.json" -- /nonexistent/command >"$work/out" 2>"$work/err"
rc=$?
[ "$rc" -eq 2 ] || fail "a missing command exited $rc, expected 2"
grep -q "cannot run '/nonexistent/command'" "$work/err" || fail "no 'cannot run' message"

GPUOPT_TRACE_INJECT=/nonexistent.so "$gpuopt" trace -- true >"$work/out" 2>"$work/err"
rc=$?
[ "$rc" -eq 3 ] || fail "a missing injection library exited $rc, expected 3"
grep -q "GPUOPT_TRACE_INJECT" "$work/err" || fail "the message does not name GPUOPT_TRACE_INJECT"
echo "ok: no GPU: says so, passes exit status through, reports missing command and library"
