#!/usr/bin/env bash
# `gpuopt vector` end to end: create, import (IDX), query exact and IVF, info; malformed input and
# bad arguments fail with exit 2 and a message naming the file.
set -uo pipefail
gpuopt="$1"
work=$(mktemp -d /tmp/gpuopt-vector-cli-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
rows=300
{
  printf '\x00\x00\x08\x03\x00\x00\x01\x2c\x00\x00\x00\x04\x00\x00\x00\x04'
  head -c $((rows * 16)) /dev/urandom
} >"$work/data.idx"
"$gpuopt" vector create "$work/s" --dim 16 --metric l2 >/dev/null || fail create
"$gpuopt" vector create "$work/s" --dim 16 >/dev/null 2>&1 && fail "second create succeeded"
out=$("$gpuopt" vector import "$work/s" "$work/data.idx" --batch 100) || fail import
grep -q '^committed 300 total 300$' <<<"$out" || fail "import output: $out"
out=$("$gpuopt" vector import "$work/s" "$work/data.idx" --json) || fail "json import"
grep -q '"total":600' <<<"$out" || fail "json import: $out"
info=$("$gpuopt" vector info "$work/s" --json --verify) || fail info
grep -q '"count": 600' <<<"$info" || fail "info: $info"
"$gpuopt" vector query "$work/s" "$work/data.idx" --k 3 --limit 5 >"$work/q.txt" || fail query
# A vector's nearest neighbour is itself (distance 0): ids 0 and 300 hold the same vector.
grep -qE '^query 0: (0|300):0 ' "$work/q.txt" || fail "exact query: $(cat "$work/q.txt")"
out=$("$gpuopt" vector query "$work/s" "$work/data.idx" --index ivf --nlist 4 --nprobe 4 --json \
  --limit 2) || fail "ivf query"
grep -q '"results"' <<<"$out" || fail "ivf query: $out"
# Malformed inputs: exit 2, message names the file.
head -c 100 "$work/data.idx" >"$work/short.idx"
msg=$("$gpuopt" vector import "$work/s" "$work/short.idx" 2>&1)
[ $? -eq 2 ] || fail "truncated IDX exit code"
grep -q "short.idx.*truncated" <<<"$msg" || fail "truncated IDX message: $msg"
printf 'garbage!' >"$work/bad.fvecs"
msg=$("$gpuopt" vector query "$work/s" "$work/bad.fvecs" 2>&1)
[ $? -eq 2 ] || fail "bad fvecs exit code"
grep -q "bad.fvecs" <<<"$msg" || fail "bad fvecs message: $msg"
msg=$("$gpuopt" vector query "$work/s" "$work/data.idx" --where '{"a": {"$bogus": 1}}' 2>&1)
[ $? -eq 2 ] || fail "bad filter exit code"
grep -q 'bogus' <<<"$msg" || fail "bad filter message: $msg"
msg=$("$gpuopt" vector info "$work/none" 2>&1)
[ $? -eq 2 ] || fail "missing store exit code"
echo "ok"
