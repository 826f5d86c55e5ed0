#!/usr/bin/env bash
# doctor's memory view and `doctor --fit` on the GPU machine: NVML memory, UUID and per-process
# samples as RESULT lines, the Prometheus UUID label, --fit of the Llama-3 and Qwen2.5 configs
# against this GPU's free memory, and every JSON written here (trace summary included) validated
# against docs/schemas.
set -uo pipefail
out="${OUT:-/tmp}/doctor_memory"
mkdir -p "$out"
bin="${GPUOPT_BIN:-build/tools/gpuopt}"
# The schema checks need python3-jsonschema; the GPU machine's venv lacks it, so take it from the
# carried wheels when they are there.
if ! python3 -c 'import jsonschema' 2>/dev/null; then
  source "$(dirname "$0")/../lib/carried-wheels.sh"
  carried_wheels "$out/pylib" jsonschema || echo "RESULT: jsonschema: not installed (no carried wheel)"
fi
data="${GPUOPT_TEST_DATA_DIR:-tests/data}"
"$bin/gpuopt" doctor --json --no-vulkan >"$out/doctor.json" 2>"$out/doctor.stderr"
"$bin/gpuopt" doctor --prometheus --no-vulkan >"$out/doctor.prom" 2>>"$out/doctor.stderr"
python3 - "$out/doctor.json" "$out/doctor.prom" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
for g in d["nvidia"]["gpus"]:
    m = g["memory"] or {}
    samples = (g["process_utilization"] or {}).get("samples")
    print(f"RESULT: GPU {g['index']} {g['name']} uuid {g['uuid']}: memory total {m.get('total_bytes')} "
          f"used {m.get('used_bytes')} free {m.get('free_bytes')} reserved {m.get('reserved_bytes')}; "
          f"{len(g['processes'])} processes, process samples "
          f"{'refused' if samples is None else len(samples)}")
    for problem in g["problems"]:
        print(f"RESULT: GPU {g['index']} NVML refused: {problem}")
labels = re.findall(r'^DCGM_FI_DEV_FB_USED\{[^}]*UUID="([^"]*)"', open(sys.argv[2]).read(), re.M)
print(f"RESULT: Prometheus FB_USED samples {len(labels)}, UUID labels {labels}")
PY
for model in llama-3-8b llama-3-70b qwen2.5-7b; do
  "$bin/gpuopt" doctor --fit "$data/fit/$model" --batch 8 --context 8192 --json \
    >"$out/fit-$model.json" 2>>"$out/doctor.stderr"
  python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
print(f\"RESULT: fit {sys.argv[2]} batch 8 x 8192 on {d['device']}: {d['verdict']}, total \"
      f\"{d['bytes']['total'] / 2**30:.1f} GiB of {(d['free_bytes'] or 0) / 2**30:.1f} GiB free, \"
      f\"max batch {d['max_batch']}, max context {d['max_context']}\")" "$out/fit-$model.json" "$model"
done
"$bin/gpuopt" trace --out "$out/trace.json" --summary-json "$out/trace-summary.json" -- \
  "$bin/gpuopt" bench scaler --quick >/dev/null 2>>"$out/doctor.stderr"
for pair in doctor:doctor fit:fit-llama-3-70b trace-summary:trace-summary; do
  file="$out/${pair#*:}.json"
  [ -f "$file" ] || { echo "RESULT: schema ${pair%%:*}: no document"; continue; }
  python3 tests/cli/json_schema_check.py docs/schemas "${pair%%:*}.schema.json" "$file"
  echo "RESULT: schema ${pair%%:*}: exit $?"
done
