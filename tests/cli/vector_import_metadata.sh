#!/usr/bin/env bash
# `gpuopt vector import --metadata`: a JSON Lines file gives each row its metadata, and `vector
# query --where` then returns exactly the brute-force answer over the rows that match. The base
# vectors are a float16 .npy, so the fp16 reader is checked end to end. A metadata file with the
# wrong number of lines or a bad line fails before anything is committed, naming the line.
# usage: vector_import_metadata.sh GPUOPT_BINARY TEST_DATA_DIR
set -uo pipefail
gpuopt="$1"
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to write the fixtures"; exit 77; }
work=$(mktemp -d /tmp/gpuopt-vector-import-meta-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 300 rows x 8 float16 values, 6 queries (fvecs), metadata {"color", "n"} per row.
python3 - "$work" <<'PY'
import json, random, struct, sys
work = sys.argv[1]
rng = random.Random(5)
rows, dim = 300, 8
header = "{'descr': '<f2', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, dim)
header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
base = [[rng.uniform(-4, 4) for _ in range(dim)] for _ in range(rows)]
halves = b"".join(struct.pack("<%de" % dim, *row) for row in base)
with open(f"{work}/base.npy", "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + halves)
colors = ["red", "green", "blue"]
with open(f"{work}/meta.jsonl", "w") as f:
    for i in range(rows):
        f.write(json.dumps({"color": colors[i % 3], "n": (i * 7) % 10}) + "\n")
with open(f"{work}/queries.fvecs", "wb") as f:
    for _ in range(6):
        f.write(struct.pack("<i%df" % dim, dim, *[rng.uniform(-4, 4) for _ in range(dim)]))
PY

"$gpuopt" vector create "$work/s" --dim 8 >/dev/null || fail create
out=$("$gpuopt" vector import "$work/s" "$work/base.npy" --metadata "$work/meta.jsonl" --batch 64 \
  2>"$work/import.err") || fail "import: $out $(cat "$work/import.err")"
grep -q '^committed 300 total 300$' <<<"$out" || fail "import output: $out"
grep -q 'npy, float16, with metadata' <<<"$out" || fail "import summary: $out"
# Not a terminal: no progress line on stderr.
[ ! -s "$work/import.err" ] || fail "stderr when not a terminal: $(cat -A "$work/import.err")"

# Brute force in float64 over the float16 values as stored, for each filter; ids must agree.
check() {  # where-json python-predicate
  local where="$1" predicate="$2"
  "$gpuopt" vector query "$work/s" "$work/queries.fvecs" --k 5 --where "$where" --json \
    >"$work/result.json" || fail "query --where '$where'"
  python3 - "$work" "$predicate" <<'PY' || fail "query --where '$where' differs from brute force"
import json, struct, sys
work, predicate = sys.argv[1], sys.argv[2]
raw = open(f"{work}/base.npy", "rb").read()
header_length = struct.unpack("<H", raw[8:10])[0]
data = raw[10 + header_length:]
dim = 8
base = [struct.unpack_from("<%de" % dim, data, 2 * dim * r) for r in range(len(data) // (2 * dim))]
meta = [json.loads(line) for line in open(f"{work}/meta.jsonl")]
q = open(f"{work}/queries.fvecs", "rb").read()
queries = [struct.unpack_from("<%df" % dim, q, r * (4 + 4 * dim) + 4) for r in range(len(q) // (4 + 4 * dim))]
got = json.load(open(f"{work}/result.json"))["results"]
allowed = [i for i, m in enumerate(meta) if eval(predicate, {}, {"m": m})]
assert allowed, "the filter matches nothing: a useless check"
for qi, query in enumerate(queries):
    distances = sorted((sum((a - b) ** 2 for a, b in zip(base[i], query)), i) for i in allowed)
    want = [i for _, i in distances[:5]]
    ids = [hit["id"] for hit in got[qi]]
    if ids != want:
        print(f"query {qi}: got {ids}, brute force {want}")
        sys.exit(1)
PY
}
check '{"color": "red"}' 'm["color"] == "red"'
check '{"$and": [{"color": {"$in": ["green", "blue"]}}, {"n": {"$gte": 5}}]}' \
  'm["color"] in ("green", "blue") and m["n"] >= 5'
check '{"n": {"$lt": 2}}' 'm["n"] < 2'

count() { "$gpuopt" vector info "$work/s" --json | grep -oE '"count": [0-9]+' | grep -oE '[0-9]+$'; }
# One line short: refused before any commit.
head -n 299 "$work/meta.jsonl" >"$work/short.jsonl"
msg=$("$gpuopt" vector import "$work/s" "$work/base.npy" --metadata "$work/short.jsonl" 2>&1)
[ $? -eq 2 ] || fail "short metadata exit code: $msg"
grep -q 'short.jsonl has 299 lines, .*base.npy has 300 rows' <<<"$msg" ||
  fail "short metadata message: $msg"
[ "$(count)" = 300 ] || fail "short metadata committed rows: $(count)"
# A bad line: its number is named and nothing is committed, though earlier lines were fine.
sed '250s/.*/{"color": "red", "n": }/' "$work/meta.jsonl" >"$work/bad.jsonl"
msg=$("$gpuopt" vector import "$work/s" "$work/base.npy" --metadata "$work/bad.jsonl" --batch 10 2>&1)
[ $? -eq 2 ] || fail "bad metadata exit code: $msg"
grep -q 'bad.jsonl: line 250: ' <<<"$msg" || fail "bad metadata message: $msg"
[ "$(count)" = 300 ] || fail "bad metadata committed rows: $(count)"
msg=$("$gpuopt" vector import "$work/s" "$work/base.npy" --metadata "$work/none.jsonl" 2>&1)
[ $? -eq 2 ] || fail "missing metadata exit code: $msg"
grep -q 'none.jsonl' <<<"$msg" || fail "missing metadata message: $msg"

# On a terminal the per-commit lines give way to a progress line on stderr ('\r', rows, rate).
if command -v script >/dev/null; then
  script -qec "'$gpuopt' vector import '$work/s' '$work/base.npy' --batch 50" /dev/null \
    >"$work/tty.txt" 2>&1 || fail "import on a terminal: $(cat -A "$work/tty.txt")"
  grep -q $'\r''importing: .* / 300 rows' "$work/tty.txt" || fail "no progress line: $(cat -A "$work/tty.txt")"
  grep -q 'rows/s' "$work/tty.txt" || fail "no rate in the progress line: $(cat -A "$work/tty.txt")"
  grep -q '^committed ' "$work/tty.txt" && fail "per-commit lines on a terminal"
  grep -q 'imported 300 vectors' "$work/tty.txt" || fail "no summary on a terminal"
  # --json: never a progress line.
  script -qec "'$gpuopt' vector import '$work/s' '$work/base.npy' --batch 50 --json" /dev/null \
    >"$work/tty.txt" 2>&1 || fail "json import on a terminal"
  grep -q 'importing:' "$work/tty.txt" && fail "progress line with --json"
fi
echo "ok"
