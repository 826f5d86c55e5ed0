#!/usr/bin/env bash
# `gpuopt bench loader --cpu --json`: runs both scenarios in CPU mode, emits valid JSON with every
# config and a depth timeline, and exits 0 (criteria met) or 1 (missed on a loaded machine), never
# 2/3. Usage: bench_loader_cpu.sh GPUOPT_BINARY TEST_DATA_DIR
set -euo pipefail
gpuopt="$1"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
set +e
"$gpuopt" bench loader --cpu --json --batches 60 --consumer-us 1000 >"$out"
rc=$?
set -e
if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then
  echo "bench loader exited $rc"; cat "$out"; exit 1
fi
python3 - "$out" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["suite"] == "loader", doc
cases = {t["key"]: t for t in doc["testcases"]}
assert set(cases) == {"constant", "bursty"}, cases.keys()
for key, case in cases.items():
    assert case["outcome"] == "passed", (key, case.get("reason"))
    runs = case["data"]["runs"]
    assert [r["config"] for r in runs] == ["fixed-2", "fixed-8", "adaptive"], runs
    for r in runs:
        assert r["mode"] == "cpu"
        loader = r["loader"]
        assert loader["batches"] == 60, loader["batches"]
        assert 0 <= r["wait_fraction"] <= 1
        assert loader["pinned_bytes_peak"] <= loader["pinned_budget_bytes"]
        assert loader["depth_timeline"][0]["reason"].startswith("initial")
    fixed8 = runs[1]["loader"]
    assert fixed8["depth"] == 8 and fixed8["max_depth_reached"] == 8
print("ok")
PY
# Bad arguments are usage errors (2), with a message.
set +e
"$gpuopt" bench loader --cpu --producer-cost nonsense >/dev/null 2>&1
[ $? -eq 2 ] || { echo "bad --producer-cost not rejected"; exit 1; }
"$gpuopt" bench loader --cpu --testcase nonsense >/dev/null 2>&1
[ $? -eq 2 ] || { echo "bad --testcase not rejected"; exit 1; }
exit 0
