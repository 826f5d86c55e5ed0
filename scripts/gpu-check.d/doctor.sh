#!/usr/bin/env bash
# gpuopt doctor on the GPU machine: JSON and text reports, their run time, and the headline values
# (link generation/width from NVML and sysfs, BAR1, persistence mode, finding ids) as RESULT lines.
set -uo pipefail
out="${OUT:-/tmp}"
bin="${GPUOPT_BIN:-build/tools/gpuopt}"
start=$(date +%s.%N)
"$bin/gpuopt" doctor --json >"$out/doctor.json" 2>"$out/doctor.stderr"
rc_json=$?
end=$(date +%s.%N)
"$bin/gpuopt" doctor >"$out/doctor.txt" 2>&1
rc_text=$?
start_load=$(date +%s.%N)
"$bin/gpuopt" doctor --load --json >"$out/doctor_load.json" 2>>"$out/doctor.stderr"
end_load=$(date +%s.%N)
"$bin/gpuopt" doctor --watch 1 --duration 5 --json >"$out/doctor_watch.json" 2>>"$out/doctor.stderr"
"$bin/gpuopt" doctor --prometheus >"$out/doctor.prom" 2>>"$out/doctor.stderr"
cat "$out/doctor.txt"
echo "RESULT: doctor exit json=$rc_json text=$rc_text, wall $(python3 -c "print(f'{$end-$start:.3f}')") s (--load $(python3 -c "print(f'{$end_load-$start_load:.2f}')") s)"
python3 - "$out/doctor.json" "$out/doctor_load.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
load = json.load(open(sys.argv[2]))
for g in d["nvidia"]["gpus"]:
    p = g["pcie"]
    bar1 = g["bar1_total_bytes"]
    print(f"RESULT: {g['bdf']} {g['name']}: NVML Gen{p['current_generation']} x{p['current_width']} "
          f"(max Gen{p['max_generation']} x{p['max_width']}, GPU max Gen{p['gpu_max_generation']}) "
          f"P{g['performance_state']} BAR1 {bar1 / 2**30 if bar1 else 0:.0f} GiB "
          f"persistence {g['persistence_mode']} replays {p['replay_counter']}")
for l in d["links"]:
    e = l["effective"]
    print(f"RESULT: sysfs {l['device']}: {e['current_speed_gts']} GT/s x{e['current_width']} "
          f"(max {e['max_speed_gts']} GT/s x{e['max_width']})")
for s in load["load"]:
    print(f"RESULT: under --load {s['bdf']}: Gen{s['generation']} x{s['width']} P{s['performance_state']} {s['status'] or ''}")
print("RESULT: findings " + (" ".join(f"{f['id']}/{f['severity']}" for f in d["findings"]) or "none")
      + f"; elapsed_ms {d['elapsed_ms']:.0f}")
PY
