#!/usr/bin/env bash
# gpu-check-timeout: 300
# The vector store at 10M x 128: writes synthetic clustered fp32 vectors (numpy, in chunks) to a
# 5.1 GB .npy, imports it with `gpuopt vector import` (ingest rate, peak RSS), runs the exact GPU
# search on 1000 queries (QPS, device memory seen by nvidia-smi) and scores its ids against float64
# ground truth computed with torch on the GPU in chunks. When the GPU path cannot hold the
# collection, the RESULT line carries what the CLI said. About 11 GB of disk; the work directory
# is removed at the end. VECTOR_SCALE_ROWS overrides the row count (a smaller trial).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}/vector_scale"
mkdir -p "$out"
gpuopt="${GPUOPT_BIN:-$PWD/build/tools/gpuopt}/gpuopt"
rows="${VECTOR_SCALE_ROWS:-10000000}"
dim=128
queries=1000
k=10
work=$(mktemp -d "${TMPDIR:-/tmp}/gpuopt-vector-scale-XXXXXX")
sampler=""
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
need_gb=$(( rows * dim * 4 * 22 / 10 / 1000000000 + 1 ))
free_gb=$(df -P -B1G "$work" | awk 'NR == 2 {print $4}')
if [ "$free_gb" -lt "$need_gb" ]; then
  echo "RESULT: vector_scale: skipped, ${free_gb} GB free under $work, ${need_gb} GB needed"
  exit 0
fi

# Clustered data: 4096 centres ~ N(0, 1), rows = centre + 0.35 * N(0, 1); queries drawn the same way.
start=$(date +%s.%N)
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
python3 - "$work" "$rows" "$dim" "$queries" <<'PY' || { echo "RESULT: vector_scale: data generation failed"; exit 1; }
import sys, numpy as np
work, rows, dim, nq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(2024)
centres = rng.standard_normal((4096, dim), dtype=np.float32)
def draw(n):
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x *= 0.35
    x += centres[rng.integers(0, len(centres), n)]
    return x
base = np.lib.format.open_memmap(f"{work}/base.npy", mode="w+", dtype=np.float32, shape=(rows, dim))
chunk = 500_000
for begin in range(0, rows, chunk):
    end = min(rows, begin + chunk)
    base[begin:end] = draw(end - begin)
base.flush()
del base
np.save(f"{work}/queries.npy", draw(nq))
PY
gen_s=$(seconds_since "$start")
file_bytes=$(stat -c %s "$work/base.npy")
echo "generated $rows x $dim ($file_bytes bytes) in ${gen_s} s"

# Import: the CLI's own report (rate, getrusage peak) and /usr/bin/time's peak when present.
"$gpuopt" vector create "$work/store" --dim $dim >/dev/null ||
  { echo "RESULT: vector_scale: vector create failed"; exit 1; }
timer=()
[ -x /usr/bin/time ] && timer=(/usr/bin/time -v -o "$out/import_time.txt")
${timer[@]+"${timer[@]}"} "$gpuopt" vector import "$work/store" "$work/base.npy" --batch 100000 --json \
  >"$out/import.jsonl" 2>"$out/import.err"
rc=$?
if [ $rc -ne 0 ]; then
  echo "RESULT: vector_scale import failed (exit $rc): $(tail -1 "$out/import.err")"
  exit 1
fi
tail -1 "$out/import.jsonl" >"$out/import.json"
time_rss_kb=""
[ -f "$out/import_time.txt" ] &&
  time_rss_kb=$(grep -oE 'Maximum resident set size \(kbytes\): [0-9]+' "$out/import_time.txt" | grep -oE '[0-9]+$')
python3 - "$out/import.json" "$file_bytes" "${time_rss_kb:-}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
file_gb = int(sys.argv[2]) / 1e9
time_kb = sys.argv[3]
rss_mib = int(time_kb) / 1024 if time_kb else r["peak_rss_bytes"] / 2**20
source = "time -v" if time_kb else "getrusage"
print(f"RESULT: vector_scale import {r['imported']}x128 fp32 npy ({file_gb:.2f} GB, batch "
      f"{r['batch']}): {r['ingest_vectors_per_s']:.0f} rows/s, {r['ingest_seconds']:.1f} s, "
      f"peak RSS {rss_mib:.0f} MiB ({source})")
PY
du -sb "$work/store" | awk '{printf "store on disk: %.2f GB\n", $1 / 1e9}'

# Exact GPU search: one process, the first (untimed) search copies the collection to the device,
# then 5 timed searches of all 1000 queries. nvidia-smi samples the device's used memory.
baseline_mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
(
  while true; do
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1
    sleep 0.2
  done
) >"$out/gpu_memory_mib.txt" &
sampler=$!
"$gpuopt" vector query "$work/store" "$work/queries.npy" --engine gpu --k $k --repeat 5 --json \
  >"$out/query_gpu.json" 2>"$out/query_gpu.err"
qrc=$?
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
sampler=""
peak_mib=$(sort -n "$out/gpu_memory_mib.txt" | tail -1)
if [ $qrc -ne 0 ]; then
  echo "RESULT: vector_scale gpu exact query on ${rows}x128 failed (exit $qrc): $(tail -1 "$out/query_gpu.err")"
  exit 1
fi

# Float64 ground truth on the GPU (torch), 1M rows at a time; recall@10 of the CLI's ids.
python3 - "$work" "$out" "$k" "${baseline_mib:-}" "${peak_mib:-}" <<'PY'
import json, sys, time
import numpy as np, torch
work, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
baseline, peak = sys.argv[4], sys.argv[5]
base = np.load(f"{work}/base.npy", mmap_mode="r")
q = torch.from_numpy(np.load(f"{work}/queries.npy")).cuda().double()
start = time.time()
best_d = torch.full((q.shape[0], k), float("inf"), dtype=torch.float64, device="cuda")
best_i = torch.full((q.shape[0], k), -1, dtype=torch.int64, device="cuda")
chunk = 1_000_000
for begin in range(0, base.shape[0], chunk):
    x = torch.from_numpy(np.array(base[begin:begin + chunk])).cuda().double()
    d = (x * x).sum(1)[None, :] - 2.0 * (q @ x.T) + (q * q).sum(1)[:, None]
    d, i = torch.topk(d, min(k, d.shape[1]), dim=1, largest=False)
    best_d, order = torch.topk(torch.cat([best_d, d], 1), k, dim=1, largest=False)
    best_i = torch.gather(torch.cat([best_i, i + begin], 1), 1, order)
torch.cuda.synchronize()
truth_s = time.time() - start
truth = best_i.cpu().numpy()
g = json.load(open(f"{out}/query_gpu.json"))
ids = [[h["id"] for h in r] for r in g["results"]]
recall = np.mean([len(set(a) & set(t.tolist())) / k for a, t in zip(ids, truth)])
rows = g["rows"]
print(f"ground truth (torch float64, GPU, 1M-row chunks): {truth_s:.1f} s")
json.dump({"recall_at_10": recall, "truth_seconds": truth_s, "rows": rows,
           "query": {key: g[key] for key in ("query_seconds", "query_seconds_all", "queries_per_s",
                                              "upload_seconds", "open_seconds")},
           "gpu_memory_baseline_mib": baseline, "gpu_memory_peak_mib": peak},
          open(f"{out}/summary.json", "w"), indent=2)
mem = (f"device memory peak {int(peak)} MiB ({int(peak) - int(baseline)} MiB above idle, nvidia-smi)"
       if baseline and peak else "device memory: nvidia-smi gave no figure")
print(f"RESULT: vector_scale gpu exact {rows}x128 nq={len(ids)} k={k}: "
      f"{g['queries_per_s']:.0f} QPS ({g['query_seconds'] * 1e3:.1f} ms median of "
      f"{len(g['query_seconds_all'])}), first copy to the device {g['upload_seconds']:.2f} s, "
      f"open {g['open_seconds'] * 1e3:.0f} ms; {mem}")
print(f"RESULT: vector_scale gpu exact recall@{k} vs float64 truth: {recall:.4f}")
PY
