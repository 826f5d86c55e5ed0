#!/usr/bin/env bash
# GPU machine: the pipeline scenario (vision + LLM + retrieval + writer), baseline vs optimized with
# 10 cameras, a short sweep, and a Perfetto trace of a short optimized run (gzipped).
set -uo pipefail
"$GPUOPT_BIN/gpuopt" pipeline --json --streams 10 --seconds 3 --out "$OUT/pipeline-out" \
  >"$OUT/pipeline.json"
rc=$?
# The writer's output stays small: keep the first JSON lines and one overlay per run.
for dir in "$OUT"/pipeline-out/*/; do
  head -n 20 "$dir/frames.jsonl" >"$OUT/frames-$(basename "$dir").jsonl" 2>/dev/null
  first=$(ls "$dir"/overlay-*.jpg 2>/dev/null | head -n 1)
  [ -n "$first" ] && cp "$first" "$OUT/overlay-$(basename "$dir").jpg"
done
rm -rf "$OUT/pipeline-out"
"$GPUOPT_BIN/gpuopt" pipeline --json --sweep 1 5 10 20 --seconds 1 --no-busy \
  >"$OUT/pipeline_sweep.json"
"$GPUOPT_BIN/gpuopt" pipeline --mode optimized --streams 10 --seconds 1 \
  --trace /tmp/pipeline-trace.json >/dev/null && gzip -c /tmp/pipeline-trace.json >"$OUT/pipeline-trace.json.gz"
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
              f"busy={run['gpu_busy_percent_of_active']} util={run['gpu_util_percent']} "
              f"llm={run['llm_requests']}/{run['llm_batches']} mem={run['device_memory_used_mib']}MiB "
              f"graphs={run['graphs_used'] or run['graphs_note']}")
        print(f"RESULT:   stages={[(s['stage'], round(s['mean_ms'], 2), s['calls']) for s in run['stages']]}")
    for c in data.get("comparisons", []):
        print(f"RESULT: pipeline cams={c['cameras']} speedup={c['throughput_speedup']:.2f} "
              f"p99_ratio={c['p99_latency_ratio']:.3f} busy_opt={c['optimized_gpu_busy_percent']} "
              f"same_results={c['same_results']}")
PY
exit $rc
