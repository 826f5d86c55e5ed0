#!/usr/bin/env bash
# Every --json output against its schema in docs/schemas, each command in its CPU-only form:
# doctor (live and recorded), doctor --fit, every bench family, vector create/import/query/info,
# pipeline, audit's report.json; trace's summary where this build can trace. Then a few changed
# documents that must fail, so the schemas are known to catch a change.
# Usage: bash json_schemas.sh <gpuopt binary> <tests/data dir>. Exit 77 without python3-jsonschema.
set -u
gpuopt="$1"
data="$2"
here="$(cd "$(dirname "$0")" && pwd)"
schemas="$here/../../docs/schemas"
check="$here/json_schema_check.py"
python3 "$check" "$schemas" --check-schemas || exit $?
work=$(mktemp -d /tmp/gpuopt-json-schemas-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0
validate() {  # schema document [--lines]
  python3 "$check" "$schemas" "$@" || { echo "FAIL: $2 against $1"; fail=1; }
}
run() {  # output_file command... (exit codes 0..2 are verdicts, 3 or more a failure)
  local out="$1"
  shift
  "$@" >"$out" 2>"$out.err"
  local rc=$?
  if [ $rc -gt 2 ]; then echo "FAIL: $* exited $rc: $(tail -3 "$out.err")"; fail=1; fi
}

run "$work/doctor-live.json" "$gpuopt" doctor --json --no-vulkan
validate doctor.schema.json "$work/doctor-live.json"
for machine in h200-healthy laptop-igpu-dgpu laptop-dgpu-suspended zombie-holding-gpu \
  idle-memory-holder iommu-translated; do
  run "$work/doctor-$machine.json" "$gpuopt" doctor --json --root "$data/doctor/$machine"
  validate doctor.schema.json "$work/doctor-$machine.json"
done

gib=$((1 << 30))
run "$work/fit-8b.json" "$gpuopt" doctor --fit "$data/fit/llama-3-8b" --json --free-bytes $((24 * gib))
run "$work/fit-70b.json" "$gpuopt" doctor --fit "$data/fit/llama-3-70b" --json --batch 4 --context 8192
run "$work/fit-tiny.json" "$gpuopt" doctor --fit "$data/fit/tiny-llama-int4" --json --free-bytes $gib
run "$work/fit-idle.json" "$gpuopt" doctor --fit "$data/fit/qwen2.5-7b" --json \
  --root "$data/doctor/idle-memory-holder"
for name in fit-8b fit-70b fit-tiny fit-idle; do validate fit.schema.json "$work/$name.json"; done

run "$work/bench-pcie.json" "$gpuopt" bench pcie --json --sizes 4K
run "$work/bench-streams.json" "$gpuopt" bench streams --json --quick
run "$work/bench-loader.json" "$gpuopt" bench loader --cpu --json --batches 20 --consumer-us 500
run "$work/bench-scaler.json" "$gpuopt" bench scaler --json --quick
run "$work/bench-gemm.json" "$gpuopt" bench gemm --json --quick
run "$work/bench-vector.json" "$gpuopt" bench vector --json --quick --rows 2000 --queries 20 \
  --only ingest,exact-cpu
for family in pcie streams loader scaler gemm vector; do
  validate bench.schema.json "$work/bench-$family.json"
done

{
  printf '\x00\x00\x08\x03\x00\x00\x00\x64\x00\x00\x00\x04\x00\x00\x00\x04'
  head -c 1600 /dev/urandom
} >"$work/vectors.idx"
run "$work/vector-create.json" "$gpuopt" vector create "$work/store" --dim 16 --json
run "$work/vector-import.json" "$gpuopt" vector import "$work/store" "$work/vectors.idx" --batch 40 --json
run "$work/vector-query.json" "$gpuopt" vector query "$work/store" "$work/vectors.idx" --k 3 --limit 4 --json
run "$work/vector-info.json" "$gpuopt" vector info "$work/store" --json --verify
validate vector-create.schema.json "$work/vector-create.json"
validate vector-import.schema.json "$work/vector-import.json" --lines
validate vector-query.schema.json "$work/vector-query.json"
validate vector-info.schema.json "$work/vector-info.json"

run "$work/pipeline.json" "$gpuopt" pipeline --json --quick --no-llm --cameras 1
validate pipeline.schema.json "$work/pipeline.json"

# The audit's own stages are the commands above; the slowest bench is left out.
"$gpuopt" audit --out-dir "$work/audit" --skip bench.vector --stage-timeout 120 >/dev/null 2>&1
[ -f "$work/audit/report.json" ] || { echo "FAIL: audit wrote no report.json"; fail=1; }
[ -f "$work/audit/report.json" ] && validate audit.schema.json "$work/audit/report.json"

# trace needs CUPTI: a CPU-only build refuses (exit 3) and writes no summary.
if "$gpuopt" trace --out "$work/trace.json" --summary-json "$work/trace-summary.json" -- true \
  >/dev/null 2>&1 && [ -f "$work/trace-summary.json" ]; then
  validate trace-summary.schema.json "$work/trace-summary.json"
else
  echo "note: trace summary not produced by this build; its schema is checked on the GPU machine"
fi

# Changes a consumer would notice must fail: a missing key, a wrong type, an unknown verdict.
python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
def mutate(src, dst, change):
    with open(os.path.join(work, src)) as f:
        doc = json.load(f)
    change(doc)
    with open(os.path.join(work, dst), "w") as f:
        json.dump(doc, f)
mutate("bench-loader.json", "bad-bench.json", lambda d: d["testcases"][0].pop("outcome"))
mutate("fit-8b.json", "bad-fit.json", lambda d: d["bytes"].update(weights="16 GB"))
mutate("doctor-idle-memory-holder.json", "bad-doctor.json",
       lambda d: d["nvidia"]["gpus"][0]["memory"].pop("free_bytes"))
mutate("vector-query.json", "bad-query.json", lambda d: d["results"][0][0].update(id=-1))
PY
for pair in bench:bad-bench fit:bad-fit doctor:bad-doctor vector-query:bad-query; do
  python3 "$check" "$schemas" "${pair%%:*}.schema.json" "$work/${pair#*:}.json" --expect-invalid ||
    fail=1
done
[ -f "$work/audit/report.json" ] && python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
doc = json.load(open(f"{work}/audit/report.json"))
doc["verdict"]["verdict"] = "great"
json.dump(doc, open(f"{work}/bad-audit.json", "w"))
PY
python3 "$check" "$schemas" audit.schema.json "$work/bad-audit.json" --expect-invalid || fail=1

[ $fail -eq 0 ] && echo "JSON schemas: ok"
exit $fail
