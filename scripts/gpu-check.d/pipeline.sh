#!/usr/bin/env bash
# GPU machine: the pipeline scenario, baseline vs optimized with 10 cameras, plus a short sweep.
set -uo pipefail
"$GPUOPT_BIN/gpuopt" pipeline --json --streams 10 --seconds 4 >"$OUT/pipeline.json"
rc=$?
"$GPUOPT_BIN/gpuopt" pipeline --json --sweep 1 5 10 20 --seconds 2 >"$OUT/pipeline_sweep.json"
python3 - "$OUT/pipeline.json" "$OUT/pipeline_sweep.json" <<'PY'
import json, sys
for path in sys.argv[1:]:
    try:
        data = json.load(open(path))
    except Exception as error:
        print(f"RESULT: pipeline {path}: no JSON ({error})")
        continue
    for run in data.get("runs", []):
        print(f"RESULT: pipeline {run['mode']} cams={run['cameras']} fps={run['throughput_fps']:.1f}/"
              f"{run['offered_fps']:.0f} p50={run['latency_p50_ms']:.1f}ms p99={run['latency_p99_ms']:.1f}ms "
              f"util={run['gpu_util_percent']} stages={[(s['stage'], round(s['mean_ms'], 2)) for s in run['stages']]}")
    for c in data.get("comparisons", []):
        print(f"RESULT: pipeline cams={c['cameras']} speedup={c['throughput_speedup']:.2f} "
              f"p99_ratio={c['p99_latency_ratio']:.2f} same_results={c['same_results']}")
PY
exit $rc
