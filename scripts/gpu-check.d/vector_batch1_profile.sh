#!/usr/bin/env bash
# Where the time of one batch-1 exact GPU query goes: gpu_vector's SmallBatchProfile runs N batch-1
# calls through GpuDataset::search and N through Collection::query (100k x 128 and 1M x 128, the
# data of vector_batch1.sh), each window bracketed by cudaProfilerStart/Stop, under `gpuopt trace`.
# From the trace records: per query, the runtime API calls (count, time), the kernels and copies
# they issued (count, bytes, device time), host synchronisations and allocations, and a timeline
# (launch latency, H2D, scan, merge, D2H, the wait after the last copy). With nsys on the machine,
# also an nsys report of the same program. Logs under $OUT/vector_batch1_profile/.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}/vector_batch1_profile"
mkdir -p "$out"
calls="${GPUOPT_VECTOR_PROFILE_CALLS:-200}"
work=$(mktemp -d /tmp/gpuopt-vector-profile-XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ ! -x "$GPUOPT_BIN/gpu_vector" ] || [ ! -x "$GPUOPT_BIN/gpuopt" ]; then
  echo "RESULT: vector batch-1 profile: gpu_vector or gpuopt not in the bundle ($GPUOPT_BIN)"
  exit 0
fi
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
  GPUOPT_VECTOR_TIMING_BASE="$work/base_$size.npy" GPUOPT_VECTOR_TIMING_QUERIES="$work/queries.npy" \
    GPUOPT_VECTOR_PROFILE_CALLS="$calls" \
    "$GPUOPT_BIN/gpuopt" trace --out "$out/trace_$size.json" --summary-json "$out/summary_$size.json" \
    --records-json "$out/records_$size.json" -- \
    "$GPUOPT_BIN/gpu_vector" --gtest_filter='SmallBatchProfile.*' >"$out/profile_$size.txt" 2>&1
  echo "gpuopt trace $size exit: $?"
  grep '^PROFILE' "$out/profile_$size.txt" | sed "s/^PROFILE:/RESULT: vector batch-1 traced wall $size:/"
  python3 - "$out/records_$size.json" "$size" "$calls" <<'PY'
import json, re, statistics, sys
path, size, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    records = json.load(open(path))["records"]
except Exception as error:
    print(f"RESULT: vector batch-1 profile {size}: no trace records ({error})")
    sys.exit(0)
# [kind, name, start, end, device, context, stream, correlation, pid, tid, direction, bytes, ...]
def base_name(name):
    return re.sub(r"(_ptsz|_ptds)?_v\d+$", "", name)
api = sorted((r for r in records if r[0] == "runtime_api"), key=lambda r: r[2])
device = [r for r in records if r[0] in ("kernel", "memcpy", "memset")]
marks = [r for r in api if base_name(r[1]) in ("cudaProfilerStart", "cudaProfilerStop")]
windows = []
for first, second in zip(marks, marks[1:]):
    if base_name(first[1]) == "cudaProfilerStart" and base_name(second[1]) == "cudaProfilerStop":
        windows.append((first[3], second[2], first[8], first[9]))
labels = ["GpuDataset::search", "Collection::query"]
if not windows:
    print(f"RESULT: vector batch-1 profile {size}: no cudaProfilerStart/Stop window in the trace "
          f"({len(api)} runtime API records)")
    sys.exit(0)
short = {"k_small_scan": "scan", "k_small_merge": "merge"}
for index, (begin, end, pid, tid) in enumerate(windows):
    label = labels[index] if index < len(labels) else f"window {index + 1}"
    calls_in = [r for r in api if begin <= r[2] < end and r[8] == pid and r[9] == tid and
                base_name(r[1]) not in ("cudaProfilerStart", "cudaProfilerStop")]
    correlation = {r[7]: r for r in calls_in}
    work = sorted((r for r in device if r[7] in correlation), key=lambda r: r[2])
    per = lambda n: n / calls
    api_counts = {}
    api_time = {}
    for r in calls_in:
        name = base_name(r[1])
        api_counts[name] = api_counts.get(name, 0) + 1
        api_time[name] = api_time.get(name, 0) + (r[3] - r[2])
    kernels = {}
    for r in work:
        if r[0] == "kernel":
            name = next((v for k, v in short.items() if k in r[1]), r[1].split("(")[0][-40:])
            kernels.setdefault(name, []).append((r[3] - r[2]) / 1e3)
    copies = {}
    for r in work:
        if r[0] == "memcpy":
            copies.setdefault(r[10], []).append(((r[3] - r[2]) / 1e3, r[11]))
    memsets = sum(r[0] == "memset" for r in work)
    syncs = sum(v for k, v in api_counts.items() if "Synchronize" in k)
    allocs = sum(v for k, v in api_counts.items()
                 if k.startswith(("cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaMallocHost")))
    api_list = ", ".join(f"{k} {per(v):.2f} ({api_time[k] / v / 1e3:.1f} us)"
                         for k, v in sorted(api_counts.items(), key=lambda kv: -api_time[kv[0]]))
    kernel_list = ", ".join(f"{k} {per(len(v)):.2f} x p50 {statistics.median(v):.1f} us"
                            for k, v in kernels.items())
    copy_list = ", ".join(
        f"{d} {per(len(v)):.2f} x p50 {statistics.median(x for x, _ in v):.1f} us "
        f"({statistics.median(b for _, b in v):.0f} B)" for d, v in copies.items())
    print(f"RESULT: vector batch-1 profile {size} x 128 {label}: per query {kernel_list}; "
          f"copies {copy_list or 'none'}; memsets {per(memsets):.2f}; host syncs {per(syncs):.2f}; "
          f"allocs/frees {per(allocs):.2f}")
    print(f"RESULT: vector batch-1 profile {size} x 128 {label} API per query: {api_list}")
    # One query = the API calls up to and including its last synchronisation.
    queries, current = [], []
    for r in calls_in:
        current.append(r)
        if "Synchronize" in base_name(r[1]):
            queries.append(current)
            current = []
    stages = {"period (sync return to sync return)": [], "call (first API to sync return)": [],
              "host before first launch/copy": [],
              "launch latency (first API to first device work)": [], "device span": [],
              "device busy": [], "sync return after last device work": []}
    gaps = []
    for previous, q in zip([None] + queries, queries):
        if previous is not None:
            stages["period (sync return to sync return)"].append((q[-1][3] - previous[-1][3]) / 1e3)
        ids = {r[7] for r in q}
        dev = [r for r in work if r[7] in ids]
        if not dev:
            continue
        first_api = q[0][2]
        issuing = [r for r in q if r[7] in {d[7] for d in dev}]
        stages["call (first API to sync return)"].append((q[-1][3] - first_api) / 1e3)
        stages["host before first launch/copy"].append((issuing[0][2] - first_api) / 1e3)
        stages["launch latency (first API to first device work)"].append(
            (dev[0][2] - issuing[0][2]) / 1e3)
        stages["device span"].append((dev[-1][3] - dev[0][2]) / 1e3)
        stages["device busy"].append(sum(r[3] - r[2] for r in dev) / 1e3)
        stages["sync return after last device work"].append((q[-1][3] - dev[-1][3]) / 1e3)
        gaps.append(sum(max(0, b[2] - a[3]) for a, b in zip(dev, dev[1:])) / 1e3)
    if queries:
        text = "; ".join(f"{k} {statistics.median(v):.1f}" for k, v in stages.items() if v)
        print(f"RESULT: vector batch-1 profile {size} x 128 {label} timeline p50 us ({len(queries)} "
              f"queries): {text}; idle gaps between device work {statistics.median(gaps):.1f}")
PY
done
if command -v nsys >/dev/null 2>&1; then
  GPUOPT_VECTOR_TIMING_BASE="$work/base_100k.npy" GPUOPT_VECTOR_TIMING_QUERIES="$work/queries.npy" \
    GPUOPT_VECTOR_PROFILE_CALLS="$calls" timeout 300 nsys profile --trace=cuda --force-overwrite=true \
    -o "$out/nsys_100k" "$GPUOPT_BIN/gpu_vector" --gtest_filter='SmallBatchProfile.*' \
    >"$out/nsys_100k.log" 2>&1 &&
    nsys stats --report cuda_gpu_kern_sum --report cuda_api_sum --report cuda_gpu_mem_time_sum \
      "$out/nsys_100k.nsys-rep" >"$out/nsys_100k_stats.txt" 2>&1
  echo "RESULT: vector batch-1 nsys 100k: exit $? (report $out/nsys_100k_stats.txt)"
else
  echo "nsys not on this machine: the gpuopt trace figures above stand alone"
fi
