#!/usr/bin/env bash
# GPU machine: `gpuopt bench pcie` (default sweep) next to the plain cudaMemcpyAsync reference and,
# when carried, NVIDIA's nvbandwidth; prints ours/reference ratios for pinned H2D/D2H at 256 MiB and
# 1 GiB and the verdicts. Done when every ratio is within 3% and every figure is >= 54 GB/s.
set -uo pipefail
out="${OUT:-$PWD/out/gpu-check}"
bin="${GPUOPT_BIN:-$PWD/build/bin}"
mkdir -p "$out"

"$bin/memcpy_reference" --sizes 268435456,1073741824 --samples 20 >"$out/pcie_reference.json"
echo "reference rc=$?"
timeout 150 "$bin/gpuopt" bench pcie --json >"$out/pcie.json" 2>"$out/pcie.stderr"
echo "gpuopt bench pcie rc=$? (0 healthy, 1 warn, 2 fail or a failed testcase)"
if [ -x "$PWD/.anchors/nvbandwidth" ]; then
  timeout 180 "$PWD/.anchors/nvbandwidth" -j >"$out/nvbandwidth.json" 2>"$out/nvbandwidth.stderr"
  echo "nvbandwidth rc=$?"
fi

python3 - "$out/pcie.json" "$out/pcie_reference.json" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))
ref = json.load(open(sys.argv[2]))
cases = {t["key"]: t for t in ours["testcases"]}
ok = True
for t in ours["testcases"]:
    if t["outcome"] == "failed":
        ok = False
        print(f"FAILED testcase {t['key']}: {t['reason']}")
for direction, short in (("host_to_device", "h2d"), ("device_to_host", "d2h")):
    case = cases.get(f"{direction}_memcpy_ce_pinned", {})
    rows = {r["bytes"]: r for r in case.get("data", {}).get("sizes", [])}
    parts = []
    for size, label in ((268435456, "256M"), (1073741824, "1G")):
        mine = rows.get(size, {}).get("bandwidth_gbps", {}).get("median")
        theirs = next((r["median_gbps"] for r in ref["results"]
                       if r["direction"] == direction and r["bytes"] == size), None)
        if mine is None or theirs is None:
            parts.append(f"{label} missing"); ok = False; continue
        ratio = mine / theirs
        ok = ok and abs(ratio - 1) <= 0.03 and mine >= 54.0
        parts.append(f"{label} {mine:.2f}/{theirs:.2f} GB/s ({ratio:.3f})")
    print(f"RESULT: {short} ours/ref " + ", ".join(parts))
for key in ("host_to_device_memcpy_ce_pageable", "device_to_host_memcpy_ce_pageable",
            "host_device_bidirectional_memcpy_ce", "device_to_device_memcpy_ce",
            "host_device_latency_ce"):
    t = cases.get(key, {})
    rows = t.get("data", {}).get("sizes", [])
    if rows:
        last = rows[-1] if key != "host_device_latency_ce" else rows[0]
        figure = (last.get("bandwidth_gbps") or last.get("sum_gbps")
                  or last.get("round_trip_latency_us") or {}).get("median")
        print(f"{key} {last['bytes']} B: {figure}")
verdict = cases.get("pcie_link_verdict", {})
summary = ", ".join(
    f"{'h2d' if v['direction'] == 'host_to_device' else 'd2h'} {v['verdict']}"
    + (f" {v['efficiency'] * 100:.1f}%" if v.get('efficiency') is not None else "")
    for v in verdict.get("data", {}).get("verdicts", []))
link = verdict.get("data", {}).get("link", {})
print(f"RESULT: verdict {summary or verdict.get('reason')} on Gen{link.get('generation')} "
      f"x{link.get('width')}; done criterion {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
