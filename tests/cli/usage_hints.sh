#!/usr/bin/env bash
# Unknown subcommands and options are named, with the nearest known one, and exit 2 (usage error).
# Usage: bash usage_hints.sh <gpuopt binary> <tests/data dir>
set -u
gpuopt="$1"
fail=0
expect() {  # expected-stderr-line args...
  local want="$1"; shift
  local out rc
  out=$("$gpuopt" "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -ne 2 ]; then echo "FAIL: gpuopt $* exited $rc, expected 2"; fail=1; fi
  if ! grep -qF -- "$want" <<<"$out"; then echo "FAIL: gpuopt $*: no line '$want' in: $out"; fail=1; fi
}
expect "gpuopt: unknown command 'audti'; did you mean 'audit'?" audti
expect "gpuopt bench: unknown command 'stream'; did you mean 'streams'?" bench stream
expect "gpuopt doctor: unknown option '--jsn'; did you mean '--json'?" doctor --jsn
expect "gpuopt: unknown command 'compile'." compile
expect "gpuopt audit: unknown option '--out-dri'; did you mean '--out-dir'?" audit --out-dri /tmp/x
"$gpuopt" --help | grep -q "^  0  healthy" || { echo "FAIL: no exit-code table in --help"; fail=1; }
# Old spellings are hidden aliases: accepted, never suggested.
expect "gpuopt trace: unknown option '--outpt'; did you mean '--output'?" trace --outpt x -- true
[ "$fail" -eq 0 ] && echo "usage hints ok"
exit "$fail"
