#!/usr/bin/env bash
# `gpuopt bench vector --quick --json` (what `gpuopt audit` runs) exits 0 with valid JSON whose
# exact search has recall 1; a bad --data file fails with a message naming it; an unknown --only
# name and a bad --nprobe are usage errors (exit 2).
set -uo pipefail
gpuopt="$1"
fail() { echo "FAIL: $*"; exit 1; }
out=$("$gpuopt" bench vector --quick --json)
rc=$?
[ "$rc" -eq 0 ] || fail "exit $rc: $out"
python3 - "$out" <<'PY' || fail "JSON: $out"
import json, sys
doc = json.loads(sys.argv[1])
assert doc["suite"] == "vector", doc.get("suite")
cases = {t["key"]: t for t in doc["testcases"]}
assert set(cases) == {"ingest", "cold-open", "exact-cpu", "ivf-cpu", "exact-gpu"}, list(cases)
exact = cases["exact-cpu"]
assert exact["outcome"] == "passed", exact
assert exact["data"]["distance_recall"] == 1.0, exact["data"]
assert all(r["qps"] > 0 for r in exact["data"]["rows"]), exact["data"]["rows"]
sweep = cases["ivf-cpu"]["data"]["sweep"]
assert len(sweep) >= 2 and all("nprobe" in r and 0 <= r["distance_recall"] <= 1 for r in sweep)
assert cases["exact-gpu"]["outcome"] in ("waived", "passed"), cases["exact-gpu"]
PY
msg=$("$gpuopt" bench vector --quick --data /nonexistent/base.fvecs --only exact-cpu 2>&1)
grep -q "/nonexistent/base.fvecs" <<<"$msg" || fail "bad --data message: $msg"
"$gpuopt" bench vector --only nosuch >/dev/null 2>&1
[ $? -eq 2 ] || fail "unknown testcase not refused with exit 2"
"$gpuopt" bench vector --nprobe 0 >/dev/null 2>&1
[ $? -eq 2 ] || fail "--nprobe 0 not refused with exit 2"
echo "bench_vector_quick: ok"
