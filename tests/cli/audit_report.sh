#!/usr/bin/env bash
# `gpuopt audit` end to end on this machine: it finishes, writes valid report.json, and report.html
# renders in headless Chromium with no script errors (checked on the live DOM) and a screenshot.
set -euo pipefail
gpuopt="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
set +e
"$gpuopt" audit --out-dir "$work/audit" --stage-timeout 300 2>"$work/audit.log"
rc=$?
set -e
cat "$work/audit.log"
# Without a GPU nothing can be judged wrong: skipped stages are info, so 0 (1 if doctor warns).
if [ "$rc" -ge 2 ]; then echo "FAIL: audit exit code $rc"; exit 1; fi
python3 - "$work/audit/report.json" "$rc" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
assert report["schema_version"] == 2, report["schema_version"]
verdict = report["verdict"]
assert verdict["verdict"] in ("healthy", "info", "warning"), verdict
assert verdict["exit_code"] == int(sys.argv[2]), (verdict, sys.argv[2])
for stage in report["stages"]:
    assert stage["verdict"] in ("healthy", "info", "warning", "failing"), stage["key"]
if not report["gpu"]["present"]:
    assert verdict["skipped"], "no GPU, yet nothing reported as skipped"
keys = [s["key"] for s in report["stages"]]
assert keys[0] == "doctor", keys
for stage in report["stages"]:
    assert stage["status"] in ("ran", "skipped", "failed"), stage
    if stage["status"] != "ran":
        assert stage["reason"], f"{stage['key']} has no reason"
print("report.json ok:", ", ".join(f"{s['key']}={s['status']}" for s in report["stages"]))
PY
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "FAIL: chromium is not installed (scripts/setup.sh installs it)"; exit 1
fi
flags=(--headless=new --no-sandbox --disable-gpu --no-first-run --disable-dev-shm-usage
       --user-data-dir="$work/profile")
url="file://$work/audit/report.html"
timeout 120 "$browser" "${flags[@]}" --dump-dom "$url" >"$work/dom.html" 2>"$work/browser.log" || {
  cat "$work/browser.log"; echo "FAIL: chromium could not load the report"; exit 1; }
grep -q 'data-rendered="yes"' "$work/dom.html" || { echo "FAIL: the report view did not finish"; exit 1; }
errors=$(grep -o 'data-errors="[0-9]*"' "$work/dom.html" | head -1 | grep -o '[0-9]*')
if [ "${errors:-x}" != "0" ]; then
  grep -o 'data-last-error="[^"]*"' "$work/dom.html" || true
  echo "FAIL: $errors script error(s) in report.html"; exit 1
fi
timeout 120 "$browser" "${flags[@]}" --window-size=1280,2000 --screenshot="$work/report.png" "$url" \
  >/dev/null 2>&1 || true
[ -s "$work/report.png" ] || { echo "FAIL: no screenshot"; exit 1; }
if [ -n "${GPUOPT_KEEP_SCREENSHOT:-}" ]; then cp "$work/report.png" "$GPUOPT_KEEP_SCREENSHOT"; fi
echo "report.html rendered with 0 script errors; screenshot $(stat -c %s "$work/report.png") bytes"
