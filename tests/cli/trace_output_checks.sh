#!/usr/bin/env bash
# `gpuopt trace` checks where it will write before it starts the command: a missing directory, a
# FIFO, a directory or a device as --out (or --summary-json / --records-json) is a usage error
# (exit 2) naming the path, and the command never runs.
# usage: trace_output_checks.sh GPUOPT_BINARY TEST_DATA_DIR
set -uo pipefail
gpuopt="$1"
work=$(mktemp -d /tmp/gpuopt-trace-out-XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0
mkfifo "$work/fifo.json"
mkdir "$work/dir.json"
check() {  # description words flag path
  local description="$1" words="$2" flag="$3" path="$4" msg rc
  msg=$(timeout 10 "$gpuopt" trace "$flag" "$path" -- touch "$work/ran" 2>&1)
  rc=$?
  [ $rc -eq 2 ] || { echo "FAIL: $description: exit $rc, expected 2: $msg"; failed=1; }
  grep -qF "$words" <<<"$msg" || { echo "FAIL: $description: message: $msg"; failed=1; }
  [ -e "$work/ran" ] && { echo "FAIL: $description: the command ran"; failed=1; rm -f "$work/ran"; }
}
check "missing directory" "does not exist" --out "$work/none/t.json"
check "FIFO" "$work/fifo.json is a FIFO" --out "$work/fifo.json"
check "directory" "$work/dir.json is a directory" --out "$work/dir.json"
check "device" "/dev/null is a character device" --summary-json /dev/null
check "records FIFO" "$work/fifo.json is a FIFO" --records-json "$work/fifo.json"
[ $failed -eq 0 ] && echo "trace output checks: ok"
exit $failed
