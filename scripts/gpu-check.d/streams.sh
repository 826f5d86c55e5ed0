#!/usr/bin/env bash
# GPU machine: `gpuopt bench streams` (about 15 s), JSON to $OUT/streams.json, headline RESULT lines:
# per mode critical p50/p99 and background throughput, the issue-4 criterion, graph vs eager.
set -euo pipefail
out="${OUT:-.}"
"$GPUOPT_BIN/gpuopt" bench streams --json >"$out/streams.json"
python3 - "$out/streams.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
cases = {c["key"]: c for c in doc["testcases"]}
def num(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)
c = cases.get("contention", {})
if c.get("outcome") != "passed":
    print(f"RESULT: contention {c.get('outcome')}: {c.get('reason')}")
else:
    for m in c["data"]["modes"]:
        print(f"RESULT: {m['mode']}: p50 {num(m.get('critical_p50_us'))} us p99 "
              f"{num(m.get('critical_p99_us'))} us bg {num(m.get('background_throughput_pct'))}% "
              f"SMs {m['critical_sms']}/{m['background_sms']}"
              + ("" if m["mode"] != "sm_partition" else f" isolated={m['isolated_sms']}"))
    crit = c["data"].get("criterion")
    if crit:
        print(f"RESULT: criterion {'MET' if crit['met'] else 'NOT met'}: partition p99 = "
              f"{crit['partition_p99_over_solo_p99']:.2f}x solo p99 "
              f"({crit['partition_p99_over_solo_p50']:.2f}x solo p50), "
              f"bg {crit['background_throughput_pct']:.1f}%")
g = cases.get("graph_launch", {})
if g.get("outcome") != "passed":
    print(f"RESULT: graph_launch {g.get('outcome')}: {g.get('reason')}")
else:
    d = g["data"]
    print(f"RESULT: graph vs eager: {d['graph_us_per_kernel']['median']:.2f} vs "
          f"{d['eager_us_per_kernel']['median']:.2f} us/kernel ({d['kernels']} kernels)")
PY
