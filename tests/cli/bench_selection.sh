#!/usr/bin/env bash
# --list and --only on every bench family: --list prints each testcase with a description and exits
# 0 (as JSON with --json); --only runs exactly the testcases named (each passes or is waived with a
# reason: no GPU is used here); a name that is not a testcase exits 2 with the nearest one; the old
# spelling --testcase still works.
# Usage: bash bench_selection.sh <gpuopt binary> <tests/data dir>
set -u
gpuopt="$1"
fail=0
export CUDA_VISIBLE_DEVICES=""
# Short runs: the family's own options that keep each one quick without a GPU.
declare -A extra=([pcie]="--quick" [streams]="--quick" [scaler]="--quick" [gemm]="--quick"
                  [loader]="--cpu --quick --batches 40 --consumer-us 50"
                  [vector]="--quick --synthetic --rows 2000 --queries 20 --single 10")
for family in pcie streams scaler loader gemm vector; do
  # Listed with the options of the run: --quick may run fewer testcases (gemm's four shapes).
  # shellcheck disable=SC2086
  list=$("$gpuopt" bench "$family" ${extra[$family]} --list)
  rc=$?
  [ "$rc" -eq 0 ] || { echo "FAIL: bench $family --list exited $rc"; fail=1; continue; }
  # Every line: a key, two spaces or more, a description.
  if grep -qvE '^[a-z0-9_-]+ {2,}[^ ].+$' <<<"$list"; then
    echo "FAIL: bench $family --list: a line without key and description:"; echo "$list"; fail=1
  fi
  keys=$(awk '{print $1}' <<<"$list")
  first=$(head -1 <<<"$keys")
  last=$(tail -1 <<<"$keys")
  # shellcheck disable=SC2086
  json_keys=$("$gpuopt" bench "$family" ${extra[$family]} --list --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("\n".join(t["key"] for t in d["testcases"] if t["description"]))')
  [ "$json_keys" = "$keys" ] || { echo "FAIL: bench $family --list --json differs from --list"; fail=1; }

  # --only with two names (a comma list) runs those two, in the family's order.
  # shellcheck disable=SC2086
  json=$("$gpuopt" bench "$family" ${extra[$family]} --json --only "$last,$first" 2>/dev/null)
  rc=$?
  if [ "$rc" -gt 1 ]; then echo "FAIL: bench $family --only exited $rc"; fail=1; fi
  python3 - "$json" "$first" "$last" "$family" <<'PY' || fail=1
import json, sys
doc, first, last, family = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
got = [t["key"] for t in doc["testcases"]]
want = [first] if first == last else [first, last]
if got != want:
    sys.exit(f"FAIL: bench {family} --only ran {got}, expected {want}")
for t in doc["testcases"]:
    if t["outcome"] == "waived" and not t["reason"]:
        sys.exit(f"FAIL: bench {family}: {t['key']} waived without a reason")
    if t["outcome"] == "failed":
        sys.exit(f"FAIL: bench {family}: {t['key']} failed: {t['reason']}")
PY

  # The old spelling selects the same testcase.
  # shellcheck disable=SC2086
  old=$("$gpuopt" bench "$family" ${extra[$family]} --json --testcase "$first" 2>/dev/null |
    python3 -c 'import json,sys; print(" ".join(t["key"] for t in json.load(sys.stdin)["testcases"]))')
  [ "$old" = "$first" ] || { echo "FAIL: bench $family --testcase $first ran '$old'"; fail=1; }

  # A typo: exit 2 before anything runs, with the nearest key.
  typo="${first%?}"  # the key less its last character
  err=$("$gpuopt" bench "$family" --only "$typo" 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: bench $family --only $typo exited $rc, expected 2"; fail=1; }
  grep -qF "did you mean '$first'?" <<<"$err" ||
    { echo "FAIL: bench $family --only $typo: no suggestion of '$first' in: $err"; fail=1; }
  err=$("$gpuopt" bench "$family" --only "$first,zzzz" 2>&1 >/dev/null)
  [ $? -eq 2 ] && grep -qF "unknown testcase 'zzzz'" <<<"$err" ||
    { echo "FAIL: bench $family --only $first,zzzz: $err"; fail=1; }
done
[ "$fail" -eq 0 ] && echo "bench selection ok"
exit "$fail"
