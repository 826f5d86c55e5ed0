#!/usr/bin/env bash
# The audit report as a user first sees it: a recorded H200 report.json (tests/data/report) judged
# and rendered by `gpuopt audit --from`, opened in headless Chromium at 1400 x 900. Checks the exit
# code per verdict, no script or console errors, and that the verdict and the top actions sit in the
# first screen (the page writes where they ended up onto <html>, which --dump-dom shows).
# Usage: bash report_browser.sh <gpuopt binary> <tests/data dir>; exits 77 (skip) without Chromium.
set -euo pipefail
gpuopt="$1"
fixture="$2/report/h200-audit.json"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

expect_exit() {  # name expected_exit report.json
  set +e
  "$gpuopt" audit --from "$3" --out-dir "$work/$1" >"$work/$1.log" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -ne "$2" ]; then
    cat "$work/$1.log"; echo "FAIL: audit --from ($1) exited $rc, expected $2"; exit 1
  fi
}

# The healthy H200: its only misses are gpuopt's own development targets (info), so exit 0.
expect_exit healthy 0 "$fixture"
python3 - "$work/healthy/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["schema_version"] == 2, r["schema_version"]
assert r["verdict"]["verdict"] == "healthy", r["verdict"]
assert r["verdict"]["exit_code"] == 0
stages = {s["key"]: s for s in r["stages"]}
gemm = stages["bench.gemm"]
assert gemm["verdict"] == "info", gemm["verdict"]
targets = [c for t in gemm["data"]["testcases"] for c in t["checks"] if c["development_target"]]
assert targets and all(c["verdict"] == "info" for c in targets), targets
# Waived testcases (one NUMA node, one GPU) are info; the link itself is healthy.
assert stages["bench.pcie"]["verdict"] == "info", stages["bench.pcie"]["verdict_summary"]
link = next(t for t in stages["bench.pcie"]["data"]["testcases"] if t["key"] == "pcie_link_verdict")
assert [c["verdict"] for c in link["checks"]] == ["healthy", "healthy"], link["checks"]
ids = [a["id"] for a in r["actions"]]
# Ranked by expected gain, from the recorded figures: p99 341 ms vs 20.7 us, 9.1x fps, 6.3x copies.
assert ids[:3] == ["streams.use_sm_partition", "pipeline.batch_and_overlap", "pcie.pin_host_memory"], ids
pin = r["actions"][2]
assert pin["headline"].startswith("pageable copies at 16% of pinned"), pin["headline"]
print("verdict:", r["verdict"]["headline"]); print("actions:", ids)
PY

# The same machine with a slow link (warning) and with a failed testcase (failing).
python3 - "$fixture" "$work" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
pcie = next(s for s in r["stages"] if s["key"] == "bench.pcie")
verdict = next(t for t in pcie["data"]["testcases"] if t["key"] == "pcie_link_verdict")
verdict["data"]["verdicts"][0]["verdict"] = "warn"
verdict["data"]["verdicts"][0]["efficiency"] = 0.78
json.dump(r, open(sys.argv[2] + "/warning.json", "w"))
scaler = next(s for s in r["stages"] if s["key"] == "bench.scaler")
scaler["data"]["testcases"][0]["outcome"] = "failed"
scaler["data"]["testcases"][0]["reason"] = "INTERNAL: unscaled values differ from the CPU twin"
json.dump(r, open(sys.argv[2] + "/failing.json", "w"))
PY
expect_exit warning 1 "$work/warning.json"
expect_exit failing 2 "$work/failing.json"
grep -q "failing" "$work/failing.log" || { cat "$work/failing.log"; echo "FAIL: no failing verdict printed"; exit 1; }

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then echo "SKIP: chromium is not installed (scripts/setup.sh installs it)"; exit 77; fi
flags=(--headless=new --no-sandbox --disable-gpu --no-first-run --disable-dev-shm-usage
       --hide-scrollbars --user-data-dir="$work/profile" --window-size=1400,900)
for name in healthy failing; do
  url="file://$work/$name/report.html"
  timeout 120 "$browser" "${flags[@]}" --enable-logging=stderr --v=0 --dump-dom "$url" \
    >"$work/$name.dom" 2>"$work/$name.browser.log" || {
    cat "$work/$name.browser.log"; echo "FAIL: chromium could not load the $name report"; exit 1; }
  attribute() { grep -o "$1=\"[^\"]*\"" "$work/$name.dom" | head -1 | cut -d'"' -f2; }
  [ "$(attribute data-rendered)" = "yes" ] || { echo "FAIL: $name: the view did not finish"; exit 1; }
  if [ "$(attribute data-errors)" != "0" ]; then
    echo "FAIL: $name: script errors: $(attribute data-last-error)"; exit 1
  fi
  if grep -E 'CONSOLE.*(Uncaught|Error)|Uncaught ' "$work/$name.browser.log"; then
    echo "FAIL: $name: console errors"; exit 1
  fi
  echo "$name: viewport $(attribute data-viewport), $(attribute data-charts) charts"
  [ "$(attribute data-verdict-visible)" = "yes" ] || { echo "FAIL: $name: verdict below the first screen"; exit 1; }
  [ "$(attribute data-actions-visible)" = "yes" ] || { echo "FAIL: $name: top actions below the first screen"; exit 1; }
  [ "$(attribute data-charts)" -ge 5 ] || { echo "FAIL: $name: expected a chart per measured stage"; exit 1; }
done
grep -q 'Failed: unscale_fp16' "$work/failing.dom" || { echo "FAIL: a failed testcase's data is not shown"; exit 1; }
timeout 120 "$browser" "${flags[@]}" --screenshot="$work/report.png" "file://$work/healthy/report.html" \
  >/dev/null 2>&1 || true
[ -s "$work/report.png" ] || { echo "FAIL: no screenshot"; exit 1; }
if [ -n "${GPUOPT_KEEP_SCREENSHOT:-}" ]; then cp "$work/report.png" "$GPUOPT_KEEP_SCREENSHOT"; fi
echo "report.html: verdict and top actions in the first 1400x900 screen, no script errors"
