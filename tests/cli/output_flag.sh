#!/usr/bin/env bash
# -o/--output FILE on every kind of command: the file is written (and nothing on stdout), an existing
# file is replaced by a new one (temporary file + rename, no temporary left behind), '-' is stdout,
# and a path that cannot be written is refused with exit 2 before any work starts.
# Usage: bash output_flag.sh <gpuopt binary> <tests/data dir>
set -u
gpuopt="$1"
data="$2"
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
fail=0
# No GPU is used, so every run below is quick and the same on every machine.
export CUDA_VISIBLE_DEVICES=""

# A bench: JSON to the file, nothing on stdout.
out=$("$gpuopt" bench streams --only graph_launch --json -o "$work/streams.json")
rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: bench streams -o exited $rc"; fail=1; }
[ -z "$out" ] || { echo "FAIL: bench streams -o still printed: $out"; fail=1; }
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["suite"]=="streams", d' \
  "$work/streams.json" || { echo "FAIL: bench streams -o: not the JSON"; fail=1; }

# Text without --json goes to the file too; the long spelling works the same.
"$gpuopt" bench scaler --only sequence --output "$work/scaler.txt" >/dev/null
grep -q "^gpuopt bench scaler" "$work/scaler.txt" || { echo "FAIL: bench scaler --output text"; fail=1; }

# An existing file is replaced by a new file (another inode), not rewritten in place, and no
# temporary file is left in the folder.
echo "old contents" >"$work/replace.json"
inode_before=$(stat -c %i "$work/replace.json")
"$gpuopt" bench streams --only contention --json -o "$work/replace.json" >/dev/null
inode_after=$(stat -c %i "$work/replace.json")
[ "$inode_before" != "$inode_after" ] || { echo "FAIL: -o rewrote the file in place"; fail=1; }
grep -q '"suite": "streams"' "$work/replace.json" || { echo "FAIL: -o did not replace"; fail=1; }
leftovers=$(find "$work" -name '*.tmp' | wc -l)
[ "$leftovers" -eq 0 ] || { echo "FAIL: temporary files left: $(find "$work" -name '*.tmp')"; fail=1; }

# '-' is stdout.
"$gpuopt" bench streams --only contention --json -o - | grep -q '"suite": "streams"' \
  || { echo "FAIL: -o - is not stdout"; fail=1; }

# --list follows -o as well.
"$gpuopt" bench loader --list -o "$work/list.txt" >/dev/null
grep -q "^constant " "$work/list.txt" || { echo "FAIL: --list -o"; fail=1; }

# The pipeline (skipped without a GPU, or run on one): its JSON in the file.
"$gpuopt" pipeline --quick --no-llm --json -o "$work/pipeline.json" >/dev/null 2>&1
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "scenario" in d' \
  "$work/pipeline.json" || { echo "FAIL: pipeline -o"; fail=1; }

# The vector commands: each result in the file, nothing on stdout; import's per-batch lines stay on
# stdout (a caller that kills the import reads them), its summary goes to the file; with --json an
# error is the command's JSON output too, so it lands in the file.
{
  printf '\x00\x00\x08\x03\x00\x00\x00\x0a\x00\x00\x00\x02\x00\x00\x00\x02'
  head -c 40 /dev/urandom
} >"$work/vectors.idx"
out=$("$gpuopt" vector create "$work/store" --dim 4 -o "$work/create.txt")
[ -z "$out" ] && grep -q "^created .*dimension 4" "$work/create.txt" ||
  { echo "FAIL: vector create -o: stdout '$out'"; fail=1; }
out=$("$gpuopt" vector import "$work/store" "$work/vectors.idx" --batch 4 --json -o "$work/import.json")
[ "$(wc -l <<<"$out")" -eq 3 ] || { echo "FAIL: vector import -o: per-batch lines: $out"; fail=1; }
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["imported"]==10 and d["total"]==10, d' \
  "$work/import.json" || { echo "FAIL: vector import -o: not the summary"; fail=1; }
out=$("$gpuopt" vector query "$work/store" "$work/vectors.idx" --k 2 --json -o "$work/query.json")
[ -z "$out" ] || { echo "FAIL: vector query -o still printed: $out"; fail=1; }
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["results"])==10, d' \
  "$work/query.json" || { echo "FAIL: vector query -o: not the JSON"; fail=1; }
"$gpuopt" vector info "$work/store" --verify --output "$work/info.txt" >/dev/null
grep -q "10 vectors.*checksums verified" "$work/info.txt" || { echo "FAIL: vector info --verify -o"; fail=1; }
"$gpuopt" vector compact "$work/store" --json -o "$work/compact.json" >/dev/null
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["count"]==10, d' \
  "$work/compact.json" || { echo "FAIL: vector compact -o"; fail=1; }
"$gpuopt" vector create "$work/store" --dim 4 --json -o "$work/exists.json" 2>/dev/null
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["error"]["code"]=="ALREADY_EXISTS", d' \
  "$work/exists.json" || { echo "FAIL: vector create --json -o: error not in the file"; fail=1; }

# audit --from: report.json and report.html in --out-dir, the summary in -o, report.json with --json;
# --out is the old spelling of --out-dir.
"$gpuopt" audit --from "$data/report/h200-audit.json" --out "$work/audit" -o "$work/summary.txt" \
  >/dev/null 2>&1
[ -s "$work/audit/report.html" ] || { echo "FAIL: audit --out (alias) wrote no report.html"; fail=1; }
grep -q "^gpuopt audit: wrote" "$work/summary.txt" || { echo "FAIL: audit -o summary"; fail=1; }
"$gpuopt" audit --from "$data/report/h200-audit.json" --out-dir "$work/audit" --json \
  -o "$work/audit.json" >/dev/null 2>&1
cmp -s "$work/audit.json" "$work/audit/report.json" || { echo "FAIL: audit --json -o is not report.json"; fail=1; }

# Refused before any work, with exit 2 and a message naming the path.
refused() {  # description, then the command
  local what="$1"; shift
  local err rc
  err=$("$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: $what: exit $rc, expected 2"; fail=1; }
  grep -q -- "--output" <<<"$err" || { echo "FAIL: $what: message does not name --output: $err"; fail=1; }
}
refused "missing folder" "$gpuopt" bench streams -o "$work/no/such/dir/x.json"
refused "a directory" "$gpuopt" bench pcie --quick -o "$work"
mkfifo "$work/fifo"
refused "a FIFO" "$gpuopt" bench scaler -o "$work/fifo"
echo "keep" >"$work/readonly.txt"
chmod a-w "$work/readonly.txt"
if [ "$(id -u)" -ne 0 ]; then
  refused "a read-only file" "$gpuopt" bench loader --cpu --quick -o "$work/readonly.txt"
  [ "$(cat "$work/readonly.txt")" = "keep" ] || { echo "FAIL: read-only file changed"; fail=1; }
fi
# "Before any work": the audit creates no folder and runs no stage.
refused "audit" "$gpuopt" audit --out-dir "$work/never" -o "$work/no/such/dir/summary.txt"
[ ! -e "$work/never" ] || { echo "FAIL: audit started work before refusing -o"; fail=1; }
# gemm names the output before it reads the (absent) checkpoint.
refused "gemm" "$gpuopt" gemm --weights "$work/absent.safetensors" --layer l --input "$work/x.npy" \
  -o "$work/no/such/dir/y.npy"
refused "pipeline" "$gpuopt" pipeline --quick -o "$work/no/such/dir/p.json"
# The vector commands refuse before they open (or create) the store.
refused "vector create" "$gpuopt" vector create "$work/never-store" --dim 4 -o "$work/no/such/dir/c"
[ ! -e "$work/never-store" ] || { echo "FAIL: vector create made the store before refusing -o"; fail=1; }
refused "vector query" "$gpuopt" vector query "$work/store" "$work/vectors.idx" -o "$work"
refused "bench vector" "$gpuopt" bench vector --quick -o "$work/no/such/dir/v.json"

[ "$fail" -eq 0 ] && echo "output flag ok"
exit "$fail"
