#!/usr/bin/env bash
# `gpuopt vector compact`: 30 small segments become one, the count, the checksums and every
# query's answer stay the same, and the segment files on disk are the catalogue's.
set -uo pipefail
gpuopt="$1"
work=$(mktemp -d /tmp/gpuopt-vector-compact-XXXXXX)
trap 'rm -rf "$work"' EXIT
{
  printf '\x00\x00\x08\x02\x00\x00\x01\x2c\x00\x00\x00\x08'  # IDX ubyte, 300 x 8
  head -c 2400 /dev/urandom
} >"$work/data.idx"
"$gpuopt" vector create "$work/s" --dim 8 >/dev/null || { echo "create failed"; exit 1; }
"$gpuopt" vector import "$work/s" "$work/data.idx" --batch 10 >/dev/null || { echo "import failed"; exit 1; }
segments() { "$gpuopt" vector info "$work/s" --verify --json | grep -c '"sequence"'; }
[ "$(segments)" = 30 ] || { echo "expected 30 segments, info says $(segments)"; exit 1; }
before=$("$gpuopt" vector query "$work/s" "$work/data.idx" --k 4 --json | grep -oE '"distance":[^}]*' | tr '\n' ' ')
out=$("$gpuopt" vector compact "$work/s" --json) || { echo "compact failed: $out"; exit 1; }
grep -q '"segments_before":30' <<<"$out" && grep -q '"segments_after":1' <<<"$out" &&
  grep -q '"count":300' <<<"$out" && grep -q '"ivf_resaved":false' <<<"$out" ||
  { echo "compact output: $out"; exit 1; }
[ "$(segments)" = 1 ] || { echo "expected 1 segment after compact"; exit 1; }
[ "$(ls "$work/s/segments" | wc -l)" = 1 ] || { echo "old files left: $(ls "$work/s/segments")"; exit 1; }
after=$("$gpuopt" vector query "$work/s" "$work/data.idx" --k 4 --json | grep -oE '"distance":[^}]*' | tr '\n' ' ')
[ "$before" = "$after" ] || { echo "distances changed by compaction"; exit 1; }
"$gpuopt" vector compact "$work/s" --collection nope >/dev/null 2>&1 && { echo "unknown collection compacted"; exit 1; }
echo "ok: 30 segments compacted into 1, answers unchanged"
