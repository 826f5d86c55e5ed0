#!/usr/bin/env bash
# `gpuopt bench streams` without a GPU: exit 0, valid JSON, both testcases waived with a reason.
# On a GPU machine the testcases run instead, so only the JSON shape is checked there.
set -euo pipefail
gpuopt="$1"
json=$("$gpuopt" bench streams --json --quick --only graph_launch)
python3 - "$json" <<'PY'
import json, sys
doc = json.loads(sys.argv[1])
assert doc["suite"] == "streams", doc
cases = {c["key"]: c for c in doc["testcases"]}
assert set(cases) == {"graph_launch"}, cases.keys()
for case in cases.values():
    if case["outcome"] == "waived":
        assert case["reason"], case
    else:
        assert case["outcome"] == "passed", case
PY
text=$("$gpuopt" bench streams --quick --only contention)
grep -q "contention" <<<"$text"
echo "ok"
