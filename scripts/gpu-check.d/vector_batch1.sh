#!/usr/bin/env bash
# GPU exact search at batch 1 (and 4, 16), wall time per call as a caller sees it (query upload,
# search, result download): the library call (gpu_vector's SmallBatchTiming) on 100k x 128 and
# 1M x 128, the same through the store (`gpuopt bench vector`, exact-gpu), batch 1000 on 1M x 128
# (FusedSearchTiming, the batched path), and torch's eager matmul + topk on the same data in the
# same run (bench/vector/torch_exact.py --batch1). numpy default_rng(1234) normal data, k = 10, L2.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}/vector_batch1"
mkdir -p "$out"
work=$(mktemp -d /tmp/gpuopt-vector-batch1-XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(1234)
base = rng.standard_normal((1_000_000, 128), dtype=np.float32)
queries = rng.standard_normal((1000, 128), dtype=np.float32)
np.save(f"{sys.argv[1]}/base_1m.npy", base)
np.save(f"{sys.argv[1]}/base_100k.npy", base[:100_000])
np.save(f"{sys.argv[1]}/queries.npy", queries)
PY
for size in 100k 1m; do
  if [ -x "$GPUOPT_BIN/gpu_vector" ]; then
    GPUOPT_VECTOR_TIMING_BASE="$work/base_$size.npy" GPUOPT_VECTOR_TIMING_QUERIES="$work/queries.npy" \
      "$GPUOPT_BIN/gpu_vector" --gtest_filter='SmallBatchTiming.*' >"$out/library_$size.txt" 2>&1
    grep '^RESULT' "$out/library_$size.txt" || echo "RESULT: small-batch timing $size: no figures (see $out/library_$size.txt)"
  else
    echo "RESULT: small-batch timing $size: gpu_vector not in the bundle"
  fi
  python3 bench/vector/torch_exact.py --base "$work/base_$size.npy" --queries "$work/queries.npy" \
    --k 10 --batch1 1000 --skip-batch >"$out/torch_$size.json" 2>"$out/torch_$size.err"
  python3 - "$out/torch_$size.json" "$size" <<'PY'
import json, sys
try:
    t = json.load(open(sys.argv[1]))["batch1"]
    print(f"RESULT: torch eager matmul+topk {sys.argv[2]} x 128 batch=1 k=10: per query p50 "
          f"{t['p50_us']:.1f} us, p99 {t['p99_us']:.1f} us ({t['calls']} calls, upload + search + "
          f"download)")
except Exception as error:
    print(f"RESULT: torch batch-1 {sys.argv[2]}: failed ({error})")
PY
done
# Batch 1000 on 1M x 128 through the batched fused path (compare with 4.27 ms before the
# small-batch path existed; docs/PERFORMANCE.md).
if [ -x "$GPUOPT_BIN/gpu_vector" ]; then
  GPUOPT_VECTOR_TIMING_BASE="$work/base_1m.npy" GPUOPT_VECTOR_TIMING_QUERIES="$work/queries.npy" \
    "$GPUOPT_BIN/gpu_vector" --gtest_filter='FusedSearchTiming.*' 2>&1 | grep '^RESULT' | tee "$out/batch1000_1m.txt"
fi
# Through the store: Collection::query with the engine on the GPU, batch 1 p50/p99 and batch 1000.
gpuopt="$GPUOPT_BIN/gpuopt"
"$gpuopt" bench vector --data "$work/base_100k.npy" --queries-file "$work/queries.npy" --single 1000 \
  --testcase exact-gpu --json >"$out/bench_100k.json" 2>"$out/bench_100k.err"
python3 - "$out/bench_100k.json" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
    for t in doc["testcases"]:
        if t["key"] != "exact-gpu":
            continue
        if t["outcome"] != "passed":
            print(f"RESULT: store exact-gpu 100k: {t['outcome']} {t.get('reason', '')}")
            continue
        for r in t["data"]["precisions"]:
            extra = ", ".join(f"b={b['batch']} p50 {b['p50_ms'] * 1e3:.1f} us"
                              for b in r.get("small_batches", []))
            print(f"RESULT: store exact-gpu 100k x 128 {r['precision']}: b=1 p50 "
                  f"{r['p50_ms'] * 1e3:.1f} us, p99 {r['p99_ms'] * 1e3:.1f} us; QPS b=1000 "
                  f"{r['batch_qps']:.0f}; {extra}; recall dist {r['distance_recall']:.4f}")
except Exception as error:
    print(f"RESULT: store exact-gpu 100k: no JSON ({error})")
PY
