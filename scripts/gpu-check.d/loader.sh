#!/usr/bin/env bash
# GPU machine: `gpuopt bench loader` in GPU mode (consumer kernel on its own stream, copies on the
# loader's copy stream). Writes $OUT/bench_loader.json; prints wait % per scenario and config and
# the adaptive runs' H2D GB/s as RESULT lines. About 30 s.
set -uo pipefail
out="${OUT:-.}"
"$GPUOPT_BIN/gpuopt" bench loader --json >"$out/bench_loader.json"
rc=$?
"$GPUOPT_BIN/gpuopt" bench loader --testcase bursty --batches 400 >"$out/bench_loader.txt" 2>&1 || true
python3 - "$out/bench_loader.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for case in doc["testcases"]:
    if case["outcome"] != "passed":
        print(f"RESULT: {case['key']}: {case['outcome']} {case.get('reason', '')}")
        continue
    data = case["data"]
    waits = " ".join(f"{r['config']}={100 * r['wait_fraction']:.2f}%" for r in data["runs"])
    adaptive = [r for r in data["runs"] if r["config"] == "adaptive"][0]["loader"]
    h2d = adaptive["h2d_gbps"]
    h2d_text = f"{h2d:.1f} GB/s" if h2d is not None else "n/a"
    met = "met" if data["criteria_met"] else "MISSED"
    print(f"RESULT: {case['key']} ({data['mode']}) wait {waits}; adaptive max depth "
          f"{adaptive['max_depth_reached']}; H2D {h2d_text}; {met}")
PY
exit $rc
