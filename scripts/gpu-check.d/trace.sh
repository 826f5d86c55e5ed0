#!/usr/bin/env bash
# GPU machine: `gpuopt trace` on (1) a program with known counts (exact counts, kernel durations vs
# CUDA events), (2) busy time vs NVML GPU-Util for a 1-block, a full-occupancy and a half-idle
# workload, (3) a tiny PyTorch script, to show injection leaves it working. JSON lands in $OUT.
set -uo pipefail
bin="${GPUOPT_BIN:?}"
out="${OUT:?}/trace"
mkdir -p "$out"
workload="$bin/gpuopt_trace_workload"

# (1) Known counts.
"$bin/gpuopt" trace --out "$out/known_trace.json" --summary-json "$out/known_summary.json" \
  --records-json "$out/known_records.json" -- "$workload" known --timings "$out/known_timings.json"
echo "gpuopt trace (known) exit: $?"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
try:
    records = json.load(open(f"{out}/known_records.json"))["records"]
    timings = json.load(open(f"{out}/known_timings.json"))
except Exception as error:  # the trace or the program failed; say so in the result
    print(f"RESULT: trace known counts match=no ({error})")
    sys.exit(0)
expected = timings["expected"]
kernels = [r for r in records if r[0] == "kernel"]
copies = [r for r in records if r[0] == "memcpy"]
got = {
    "kernels": len(kernels),
    "k_spin_for": sum("k_spin_for" in r[1] for r in kernels),
    "k_scale_after_spin": sum("k_scale_after_spin" in r[1] for r in kernels),
    "k_sum_after_spin": sum("k_sum_after_spin" in r[1] for r in kernels),
    "H2D": sum(r[10] == "H2D" for r in copies),
    "D2H": sum(r[10] == "D2H" for r in copies),
    "memsets": sum(r[0] == "memset" for r in records),
    "nvtx_ranges": sum(r[0] == "nvtx_range" for r in records),
    "streams": len({r[6] for r in kernels}),
}
mismatch = {k: (got[k], expected[k]) for k in expected if got.get(k) != expected[k]}
print("expected:", expected)
print("traced:  ", got)
# Durations: per stream, traced kernels in start order are that stream's launches in order.
by_stream = {}
for r in sorted(kernels, key=lambda r: r[2]):
    by_stream.setdefault(r[6], []).append(r)
streams = sorted(by_stream.values(), key=len, reverse=True)  # workload stream 0 has 4 kernels
worst = None
if len(streams) == 2:
    cursor = [0, 0]
    worst = 0.0
    for launch in timings["kernels"]:
        s = launch["stream"]
        if cursor[s] >= len(streams[s]):
            worst = None
            break
        r = streams[s][cursor[s]]
        cursor[s] += 1
        traced_ms = (r[3] - r[2]) / 1e6
        error = abs(traced_ms - launch["event_ms"]) / launch["event_ms"] * 100
        print(f"  {launch['name']:20s} stream {s}: traced {traced_ms:.4f} ms, events "
              f"{launch['event_ms']:.4f} ms, error {error:.2f}%")
        worst = max(worst, error)
match = "yes" if not mismatch else f"no {mismatch}"
error_text = f"{worst:.2f}%" if worst is not None else "n/a"
json.dump({"counts_match": not mismatch, "traced": got, "expected": expected,
           "max_duration_error_percent": worst}, open(f"{out}/known_check.json", "w"), indent=2)
print(f"RESULT: trace known counts match={match}, max kernel duration error vs events {error_text}")
PY

# (2) Busy time vs NVML GPU-Util.
run_workload() {
  local name="$1"; shift
  "$bin/gpuopt" trace --out "$out/${name}_trace.json" --summary-json "$out/${name}_summary.json" \
    --nvml-period 0.05 -- "$workload" spin "$@" >"$out/${name}.log" 2>&1
  echo "gpuopt trace ($name) exit: $?"
  cat "$out/${name}.log"
}
run_workload low_occupancy --blocks 1 --threads 32 --seconds 2 --kernel-ms 10
run_workload full_occupancy --blocks 0 --threads 256 --seconds 2 --kernel-ms 10
run_workload half_idle --blocks 0 --threads 256 --seconds 2 --kernel-ms 5 --idle-ms 5
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
parts = []
for name in ("low_occupancy", "full_occupancy", "half_idle"):
    try:
        d = json.load(open(f"{out}/{name}_summary.json"))["devices"][0]
    except Exception as error:
        parts.append(f"{name} n/a")
        print(f"RESULT: trace {name}: no summary ({error})")
        continue
    fmt = lambda v: "n/a" if v is None else f"{v:.1f}%"
    print(f"RESULT: trace {name}: busy {fmt(d['kernel_busy_percent_of_active'])} of active span, "
          f"SM-coverage {fmt(d['sm_coverage_busy_percent_of_active'])}, "
          f"NVML GPU-Util {fmt(d['nvml_gpu_util_percent_of_active'])} ({d['nvml_samples']} samples)")
    parts.append(f"{name} busy {fmt(d['kernel_busy_percent_of_active'])}/"
                 f"SMcov {fmt(d['sm_coverage_busy_percent_of_active'])}/"
                 f"NVML {fmt(d['nvml_gpu_util_percent_of_active'])}")
print("RESULT: trace busy/SM-coverage/NVML: " + "; ".join(parts))
PY

# (3) PyTorch under injection.
"$bin/gpuopt" trace --out "$out/pytorch_trace.json" --summary-json "$out/pytorch_summary.json" -- \
  python3 -c "import torch; x = torch.randn(1024, 1024, device='cuda'); y = x @ x; \
torch.cuda.synchronize(); print('torch ok', float(y.abs().sum()))" >"$out/pytorch.log" 2>&1
rc=$?
cat "$out/pytorch.log"
python3 - "$out" "$rc" <<'PY'
import json, sys
out, rc = sys.argv[1], int(sys.argv[2])
ok = "torch ok" in open(f"{out}/pytorch.log").read()
try:
    s = json.load(open(f"{out}/pytorch_summary.json"))
    traced = f"{s['kernels']} kernels, {s['memcpys']} copies, {s['runtime_api_calls']} API calls"
except Exception:
    traced = "no summary"
print(f"RESULT: trace PyTorch script exit={rc} ran={'yes' if ok else 'no'}, traced {traced}")
PY
