#!/usr/bin/env bash
# gpu-check: the main job on the GPU machine. Runs `gpuopt audit` with its defaults, checks
# report.json against its schema (jsonschema from the carried wheels when the venv lacks it), and
# prints the exit status, the overall verdict, each stage's verdict and the top actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/out/gpu-check}/audit"
mkdir -p "$out"
start=$(date +%s)
"$GPUOPT_BIN/gpuopt" audit --out-dir "$out/report" --quiet >"$out/summary.txt" 2>"$out/stderr.txt"
rc=$?
echo "RESULT: audit exit $rc after $(($(date +%s) - start)) s"
if ! python3 -c 'import jsonschema' 2>/dev/null; then
  source scripts/lib/carried-wheels.sh
  carried_wheels "$out/pylib" jsonschema || echo "RESULT: audit schema: jsonschema not available"
fi
if python3 -c 'import jsonschema' 2>/dev/null; then
  python3 tests/cli/json_schema_check.py docs/schemas audit.schema.json "$out/report/report.json"
  echo "RESULT: audit schema: exit $?"
fi
python3 - "$out/report/report.json" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except Exception as error:
    print(f"RESULT: audit: no report.json ({error})")
    sys.exit(0)
verdict = report.get("verdict") or {}
print(f"RESULT: audit verdict {verdict.get('verdict')} (exit code {verdict.get('exit_code')}): "
      f"{verdict.get('headline')}")
for stage in report.get("stages", []):
    if isinstance(stage, dict):
        print(f"RESULT: audit stage {stage.get('key')}: {stage.get('verdict')} "
              f"({stage.get('status', '')}, {stage.get('seconds', '?')} s)")
for action in report.get("actions", [])[:5]:
    print(f"RESULT: audit action [{action.get('verdict')}, {action.get('gain_text')}]: "
          f"{action.get('headline')}")
PY
[ $rc -le 1 ]
