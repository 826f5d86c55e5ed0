#!/usr/bin/env bash
# Crash-consistency trials of the vector store: each trial copies a small store (2000 x 16, many
# segments), runs one of `gpuopt vector import`, `compact` or `reindex` (in turn) and sends it
# SIGKILL after a random delay, then checks that
#   - the store opens and `info --verify` passes its checksums, with no unusable IVF index;
#   - every base row and every row the import acknowledged (its last `{"committed": N}` line) is
#     found by an exact query of its own vector at distance 0 under its own id, and the rows it
#     holds beyond those are a prefix of the import, never more than the file;
#   - a finished compact left one segment, a finished reindex a saved index of the asked size;
#   - an IVF query probing every list finds every base row at distance 0 (reindex trials);
#   - the store still takes a write: 20 more rows import and are found, and it verifies again.
# The kill delay is drawn from 1 ms up to 1.25 times the operation's measured uncut duration, so the
# kills land all over the operation (or before it starts, or after it ends); nothing depends on
# where one lands, so the trials hold on a loaded machine.
# Usage: scripts/crash-trials.sh [TRIALS (200)] [GPUOPT (build-cpu/tools/gpuopt/gpuopt)]
# SEED=<n> repeats a sequence of delays. Prints one summary line; exits 1 on any failure.
set -uo pipefail
trials="${1:-200}"
root=$(cd "$(dirname "$0")/.." && pwd)
gpuopt="${2:-${GPUOPT:-$root/build-cpu/tools/gpuopt/gpuopt}}"
[[ "$trials" =~ ^[1-9][0-9]*$ ]] ||
  { echo "TRIALS must be a positive whole number, not '$trials'" >&2; exit 2; }
[ -x "$gpuopt" ] || { echo "no gpuopt binary at $gpuopt (build it, or pass its path)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 is needed to check the trials" >&2; exit 77; }
seed="${SEED:-$$}"
RANDOM=$seed
work=$(mktemp -d /tmp/gpuopt-crash-trials-XXXXXX)
trap 'rm -rf "$work"' EXIT

rows=2000
dim=16
extra_start=2000  # ids of the killed import's rows
post_start=100000 # ids of the rows written after each trial
nlist=32
kmeans_rounds=20
# Distinct random vectors: base rows, the killed import's rows, the rows written after a trial.
python3 - "$work" "$rows" "$dim" <<'EOF' || { echo "generating data failed"; exit 1; }
import random, struct, sys
work, rows, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(20240528)
for name, n in (("base", rows), ("extra", rows), ("post", 20)):
    with open(f"{work}/{name}.fvecs", "wb") as f:
        for _ in range(n):
            row = [r.uniform(-1, 1) for _ in range(dim)]
            f.write(struct.pack("<i", dim) + struct.pack(f"<{dim}f", *row))
EOF

# The checker: reads the outputs of one trial and prints what is wrong (nothing when all holds).
cat >"$work/check.py" <<'EOF'
import json, sys

def load(path):
    with open(path) as f:
        return json.load(f)

def hits(path):
    return [q[0] if q else None for q in load(path)["results"]]

op, rc, log, info_path, base_q, extra_q, rows, extra_start, nlist = sys.argv[1:10]
rc, rows, extra_start, nlist = int(rc), int(rows), int(extra_start), int(nlist)
errors = []
info = load(info_path)["collections"][0]
count = info["count"]
ivf = info.get("ivf")
if ivf and ivf.get("error"):
    errors.append(f"IVF index unusable: {ivf['error']}")

def exact(path, first_id, n, what):
    found = 0
    for i, hit in enumerate(hits(path)[:n]):
        if hit is None or hit["id"] != first_id + i or abs(hit["distance"]) > 1e-5:
            errors.append(f"{what} row {i} (id {first_id + i}) not found at distance 0: {hit}")
            return found
        found += 1
    return found

exact(base_q, 0, rows, "base")
held = count - rows
if op == "import":
    acknowledged = 0
    with open(log) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                record = json.loads(line)
                if "committed" in record and "imported" not in record:
                    acknowledged = record["committed"]
    if rc == 0 and acknowledged != rows:
        errors.append(f"import exited 0 having acknowledged {acknowledged} of {rows} rows")
    if held < acknowledged or held > rows:
        errors.append(f"store holds {count} rows; expected {rows + acknowledged}..{2 * rows}")
    else:
        exact(extra_q, extra_start, held, "imported")
    print(f"acknowledged={acknowledged} held={held}", file=sys.stderr)
else:
    if count != rows:
        errors.append(f"store holds {count} rows after {op}, expected {rows}")
    if op == "compact" and rc == 0 and info["segment_count"] != 1:
        errors.append(f"compact finished but left {info['segment_count']} segments")
    if op == "reindex" and rc == 0 and (not ivf or ivf.get("nlist") != nlist):
        errors.append(f"reindex finished but the saved index is {ivf}")
for e in errors[:5]:
    print(e)
EOF

"$gpuopt" vector create "$work/base" --dim $dim >/dev/null || { echo "create failed"; exit 1; }
"$gpuopt" vector import "$work/base" "$work/base.fvecs" --batch 20 >/dev/null ||
  { echo "base import failed"; exit 1; }

ops=(import compact reindex)
run_op() {  # run_op OP STORE [timeout-prefix...]: the operation under test
  local op=$1 store=$2
  shift 2
  case $op in
    import) "$@" "$gpuopt" vector import "$store" "$work/extra.fvecs" --batch 20 \
      --start-id $extra_start --json ;;
    compact) "$@" "$gpuopt" vector compact "$store" --json ;;
    reindex) "$@" "$gpuopt" vector reindex "$store" --nlist $nlist --iterations $kmeans_rounds \
      --engine cpu --json ;;
  esac
}
# Uncut duration of each operation, in ms (the longest of three runs), to place the kills.
declare -A span
for op in "${ops[@]}"; do
  longest=1
  for _ in 1 2 3; do
    rm -rf "$work/store" && cp -a "$work/base" "$work/store"
    start=$(date +%s%N)
    run_op $op "$work/store" >/dev/null 2>&1 || { echo "uncut $op failed"; exit 1; }
    ms=$((($(date +%s%N) - start) / 1000000))
    [ $ms -gt $longest ] && longest=$ms
  done
  span[$op]=$((longest * 5 / 4 + 1))
done

declare -A done_ops killed completed failed
for op in "${ops[@]}"; do done_ops[$op]=0 killed[$op]=0 completed[$op]=0 failed[$op]=0; done
failures=0
fail() {  # fail TRIAL OP MESSAGE...
  local trial=$1 op=$2
  shift 2
  echo "trial $trial ($op, kill after ${delay} ms, seed $seed): $*"
  failed[$op]=$((failed[$op] + 1))
  failures=$((failures + 1))
}
for trial in $(seq 1 "$trials"); do
  op=${ops[$(((trial - 1) % 3))]}
  done_ops[$op]=$((done_ops[$op] + 1))
  store="$work/store"
  rm -rf "$store" && cp -a "$work/base" "$store"
  delay=$((1 + RANDOM % span[$op]))
  run_op $op "$store" timeout -s KILL "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))" \
    >"$work/log" 2>&1
  rc=$?
  case $rc in
    0) completed[$op]=$((completed[$op] + 1)) ;;
    137) killed[$op]=$((killed[$op] + 1)) ;;
    *) fail $trial $op "exited $rc: $(tail -3 "$work/log")"; continue ;;
  esac
  if ! "$gpuopt" vector info "$store" --verify --json >"$work/info.json" 2>"$work/info.err"; then
    fail $trial $op "info --verify failed: $(cat "$work/info.err")"
    continue
  fi
  if ! "$gpuopt" vector query "$store" "$work/base.fvecs" --k 1 --json >"$work/base.q" 2>&1 ||
     ! "$gpuopt" vector query "$store" "$work/extra.fvecs" --k 1 --json >"$work/extra.q" 2>&1; then
    fail $trial $op "query failed: $(tail -2 "$work/base.q" "$work/extra.q")"
    continue
  fi
  problems=$(python3 "$work/check.py" $op $rc "$work/log" "$work/info.json" "$work/base.q" \
    "$work/extra.q" $rows $extra_start $nlist 2>/dev/null)
  if [ $? -ne 0 ] || [ -n "$problems" ]; then
    fail $trial $op "${problems:-the checker failed}"
    continue
  fi
  if [ $op = reindex ]; then
    # Probing every list makes the IVF search exact: every row must come back at distance 0.
    if ! "$gpuopt" vector query "$store" "$work/base.fvecs" --k 1 --index ivf --nlist $nlist \
        --nprobe $nlist --json >"$work/ivf.q" 2>&1; then
      fail $trial $op "IVF query failed: $(tail -2 "$work/ivf.q")"
      continue
    fi
    problems=$(python3 - "$work/ivf.q" <<'EOF'
import json, sys
for i, q in enumerate(json.load(open(sys.argv[1]))["results"]):
    if not q or q[0]["id"] != i or abs(q[0]["distance"]) > 1e-5:
        print(f"IVF query of row {i} found {q[:1]}")
        break
EOF
    )
    [ -n "$problems" ] && { fail $trial $op "$problems"; continue; }
  fi
  # The store takes a write after the kill, and what it wrote is found.
  before=$(grep -oE '"count": [0-9]+' "$work/info.json" | grep -oE '[0-9]+$')
  if ! "$gpuopt" vector import "$store" "$work/post.fvecs" --start-id $post_start \
      >"$work/post.log" 2>&1 ||
     ! "$gpuopt" vector info "$store" --verify --json >"$work/info2.json" 2>&1; then
    fail $trial $op "write after the kill failed: $(tail -2 "$work/post.log" "$work/info2.json")"
    continue
  fi
  after=$(grep -oE '"count": [0-9]+' "$work/info2.json" | grep -oE '[0-9]+$')
  [ "$after" = $((before + 20)) ] ||
    { fail $trial $op "held $before rows, $after after importing 20 more"; continue; }
  if ! "$gpuopt" vector query "$store" "$work/post.fvecs" --k 1 --json >"$work/post.q" 2>&1 ||
     [ -n "$(python3 - "$work/post.q" $post_start <<'EOF'
import json, sys
for i, q in enumerate(json.load(open(sys.argv[1]))["results"]):
    if not q or q[0]["id"] != int(sys.argv[2]) + i or abs(q[0]["distance"]) > 1e-5:
        print(i)
        break
EOF
     )" ]; then
    fail $trial $op "rows written after the kill are not found"
    continue
  fi
done

summary="crash trials: $trials"
for op in "${ops[@]}"; do
  summary+=", $op ${done_ops[$op]} (${killed[$op]} killed, ${completed[$op]} finished,"
  summary+=" ${failed[$op]} failed, kill window 1-${span[$op]} ms)"
done
echo "$summary; failures $failures; seed $seed"
[ $failures -eq 0 ]
