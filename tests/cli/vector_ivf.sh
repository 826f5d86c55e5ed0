#!/usr/bin/env bash
# `gpuopt vector` and the saved IVF index: the first `query --index ivf` builds and saves it, the
# second reuses it (no build), imports are assigned to it, `info` reports its drift, `reindex`
# replaces it, and a corrupted index file is refused with DATA_LOSS naming the file.
set -uo pipefail
gpuopt="$1"
work=$(mktemp -d /tmp/gpuopt-vector-ivf-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
rows=600
{
  printf '\x00\x00\x08\x03\x00\x00\x02\x58\x00\x00\x00\x04\x00\x00\x00\x04'
  head -c $((rows * 16)) /dev/urandom
} >"$work/data.idx"
"$gpuopt" vector create "$work/s" --dim 16 >/dev/null || fail create
"$gpuopt" vector import "$work/s" "$work/data.idx" --batch 200 >/dev/null || fail import
info=$("$gpuopt" vector info "$work/s") || fail info
grep -q 'IVF index: none saved' <<<"$info" || fail "info before any index: $info"
# First IVF query: builds and saves (said on stderr, index_built in JSON).
out=$("$gpuopt" vector query "$work/s" "$work/data.idx" --index ivf --nlist 8 --nprobe 8 --k 3 \
  --limit 5 --json 2>"$work/err1") || fail "first ivf query: $(cat "$work/err1")"
grep -q '"index_built":true' <<<"$out" || fail "first query did not build: $out"
ls "$work/s/segments/"*.ivf >/dev/null 2>&1 || fail "no index file saved"
first_file=$(ls "$work/s/segments/"*.ivf)
# Second query: the saved index answers, nothing is built.
out=$("$gpuopt" vector query "$work/s" "$work/data.idx" --index ivf --nprobe 8 --k 3 --limit 5 \
  --json 2>"$work/err2") || fail "second ivf query: $(cat "$work/err2")"
grep -q '"index_built":false' <<<"$out" || fail "second query rebuilt: $out"
[ "$(ls "$work/s/segments/"*.ivf)" = "$first_file" ] || fail "second query replaced the file"
# With every list probed, IVF equals exact search.
exact=$("$gpuopt" vector query "$work/s" "$work/data.idx" --k 3 --limit 5 --all) || fail exact
ivf=$("$gpuopt" vector query "$work/s" "$work/data.idx" --index ivf --nprobe 8 --k 3 --limit 5 \
  --all 2>/dev/null) || fail "ivf text"
[ "$(echo "$exact" | grep '^query')" = "$(echo "$ivf" | grep '^query')" ] ||
  fail "ivf at full nprobe differs from exact: $exact / $ivf"
# Imports after training are assigned to the saved lists and reported as drift.
"$gpuopt" vector import "$work/s" "$work/data.idx" --batch 300 >/dev/null || fail "second import"
info=$("$gpuopt" vector info "$work/s" --json) || fail "info json"
grep -q '"rows_since_training": 600' <<<"$info" || fail "drift rows: $info"
grep -q '"trained_rows": 600' <<<"$info" || fail "trained rows: $info"
grep -q '"retrain_recommended": false' <<<"$info" || fail "recommendation at growth 1: $info"
# reindex retrains over every row and replaces the file.
out=$("$gpuopt" vector reindex "$work/s" --nlist 16 --engine cpu --json) || fail reindex
grep -q '"nlist":16' <<<"$out" || fail "reindex: $out"
grep -q '"rows":1200' <<<"$out" || fail "reindex rows: $out"
[ "$(ls "$work/s/segments/"*.ivf | wc -l)" -eq 1 ] || fail "old index file left behind"
info=$("$gpuopt" vector info "$work/s") || fail "info after reindex"
grep -q 'IVF index: 16 lists, trained on 1200 rows' <<<"$info" || fail "info: $info"
# A flipped byte in the index: IVF queries fail with DATA_LOSS naming the file; exact still works.
file=$(ls "$work/s/segments/"*.ivf)
printf '\xff' | dd of="$file" bs=1 seek=300 conv=notrunc 2>/dev/null
msg=$("$gpuopt" vector query "$work/s" "$work/data.idx" --index ivf --limit 2 2>&1)
[ $? -ne 0 ] || fail "corrupt index accepted"
grep -q "IVF index .*$(basename "$file").*mismatch" <<<"$msg" || fail "corrupt index message: $msg"
"$gpuopt" vector query "$work/s" "$work/data.idx" --limit 2 >/dev/null || fail "exact after corruption"
"$gpuopt" vector reindex "$work/s" --engine cpu >/dev/null || fail "reindex over a corrupt index"
"$gpuopt" vector query "$work/s" "$work/data.idx" --index ivf --limit 2 >/dev/null 2>&1 ||
  fail "ivf after reindex"
echo "vector_ivf: ok"
