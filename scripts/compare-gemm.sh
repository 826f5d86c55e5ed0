#!/usr/bin/env bash
# Run ON THE GPU MACHINE: times the W4A16 GEMM of two gpuopt binaries side by side, to show that a
# change leaves the kernels' speed within noise. Each binary runs `bench gemm --quick --json` with
# its defaults, alternating A B A B (ROUNDS pairs, default 2), so drift on the card hits both.
#   bash scripts/compare-gemm.sh OLD_GPUOPT NEW_GPUOPT [OUT_DIR]
# Prints one line per (shape, M): each binary's median over its repeats, its spread (max - min over
# the repeats, as a percentage of the median), and new/old; cuBLAS from the same processes likewise.
set -uo pipefail
old="$1"
new="$2"
out="${3:-${OUT:-.}}"
repeats="${ROUNDS:-2}"
mkdir -p "$out"
for ((i = 0; i < repeats; i++)); do
  for side in old new; do
    bin=$old
    [ "$side" = new ] && bin=$new
    "$bin" bench gemm --quick --json >"$out/gemm_${side}_$i.json" 2>"$out/gemm_${side}_$i.stderr"
  done
done
python3 - "$out" "$repeats" <<'PY'
import json, os, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def load(side):
    table = {}
    for i in range(repeats):
        path = os.path.join(out, f"gemm_{side}_{i}.json")
        try:
            data = json.load(open(path))
        except Exception as error:
            print(f"{path}: no JSON ({error})")
            continue
        for case in data.get("testcases", []):
            for row in (case.get("data") or {}).get("rows", []):
                key = (case["key"], row["m"])
                table.setdefault(key, {"gpuopt": [], "cublas": []})
                table[key]["gpuopt"].append(row["gpuopt_fp16_us"])
                table[key]["cublas"].append(row["cublas_fp16_us"])
    return table
old, new = load("old"), load("new")
def stat(values):
    if not values:
        return float("nan"), float("nan")
    med = statistics.median(values)
    return med, 100.0 * (max(values) - min(values)) / med if med else 0.0
print(f"{'shape':<18}{'M':>5}{'old us':>10}{'±%':>6}{'new us':>10}{'±%':>6}{'new/old':>9}"
      f"{'cuBLAS old':>12}{'cuBLAS new':>12}")
worst = 0.0
for key in sorted(set(old) | set(new)):
    o, os_ = stat(old.get(key, {}).get("gpuopt", []))
    n, ns = stat(new.get(key, {}).get("gpuopt", []))
    co, _ = stat(old.get(key, {}).get("cublas", []))
    cn, _ = stat(new.get(key, {}).get("cublas", []))
    ratio = n / o if o == o and o else float("nan")
    worst = max(worst, ratio) if ratio == ratio else worst
    print(f"{key[0]:<18}{key[1]:>5}{o:>10.1f}{os_:>6.1f}{n:>10.1f}{ns:>6.1f}{ratio:>9.3f}"
          f"{co:>12.1f}{cn:>12.1f}")
print(f"RESULT: gemm new/old worst {worst:.3f} over {len(set(old) | set(new))} (shape, M) points")
PY
