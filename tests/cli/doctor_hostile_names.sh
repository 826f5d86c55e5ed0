#!/usr/bin/env bash
# doctor on a recorded machine whose process names, cgroup path and fd target hold terminal escapes,
# newlines and bytes that are not UTF-8: --json must print a document that parses (U+FFFD in place
# of the bad bytes), the text must carry no control bytes but its own newlines.
# usage: doctor_hostile_names.sh GPUOPT_BINARY TEST_DATA_DIR
set -u
gpuopt="$1"
machine="$2/doctor/hostile-process-names"
fail=0
json=$("$gpuopt" doctor --json --root "$machine")
rc=$?
[ $rc -eq 2 ] || { echo "FAIL: doctor --json exited $rc, expected 2 (a leaked context)"; fail=1; }
printf '%s' "$json" | python3 -c '
import json, sys
d = json.loads(sys.stdin.buffer.read().decode("utf-8"))
p = d["gpu_processes"][0]
assert "\ufffd" in p["name"] and "\x1b" in p["name"], ascii(p["name"])
assert "\ufffd" in p["cgroup"], ascii(p["cgroup"])
assert [f["id"] for f in d["findings"]] == ["gpu.context_leak"], d["findings"]
' || { echo "FAIL: doctor --json output"; fail=1; }
"$gpuopt" doctor --root "$machine" >"${TMPDIR:-/tmp}/doctor-text.$$"
LC_ALL=C grep -q $'[\x01-\x09\x0b-\x1f\x7f\xff]' "${TMPDIR:-/tmp}/doctor-text.$$" &&
  { echo "FAIL: control or invalid bytes in the text output"; fail=1; }
grep -qF '\x1b[2Jev\xffil\nx' "${TMPDIR:-/tmp}/doctor-text.$$" ||
  { echo "FAIL: the escaped process name is missing"; fail=1; }
rm -f "${TMPDIR:-/tmp}/doctor-text.$$"
[ $fail -eq 0 ] && echo "doctor hostile names: ok"
exit $fail
