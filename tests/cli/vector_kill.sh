#!/usr/bin/env bash
# Kills `gpuopt vector import` with SIGKILL at random points 100 times; after each kill the store
# must open with no error, pass its checksums, and hold at least the last total the import printed
# as committed (and no more than it could have written).
set -uo pipefail
gpuopt="$1"
work=$(mktemp -d /tmp/gpuopt-vector-kill-XXXXXX)
trap 'rm -rf "$work"' EXIT
rows=400
dim=16
batch=20
# IDX (ubyte, rows x dim): any byte is a valid value, so no generator is needed.
{
  printf '\x00\x00\x08\x02'
  printf "\\x$(printf %02x $((rows >> 24 & 255)))\\x$(printf %02x $((rows >> 16 & 255)))"
  printf "\\x$(printf %02x $((rows >> 8 & 255)))\\x$(printf %02x $((rows & 255)))"
  printf '\x00\x00\x00\x10'
  head -c $((rows * dim)) /dev/urandom
} >"$work/data.idx"
"$gpuopt" vector create "$work/store" --dim $dim >/dev/null || { echo "create failed"; exit 1; }

count_of() { "$gpuopt" vector info "$work/store" --verify --json | grep -oE '"count": [0-9]+' | grep -oE '[0-9]+$'; }
previous=0
kills=0
for iteration in $(seq 1 100); do
  "$gpuopt" vector import "$work/store" "$work/data.idx" --batch $batch >"$work/log" 2>&1 &
  pid=$!
  sleep "0.0$((RANDOM % 10))$((RANDOM % 10))"
  kill -9 $pid 2>/dev/null && kills=$((kills + 1))
  wait $pid 2>/dev/null
  acknowledged=$(grep -oE '^committed [0-9]+ total [0-9]+' "$work/log" | tail -1 | awk '{print $4}')
  acknowledged=${acknowledged:-$previous}
  if ! count=$(count_of); then
    echo "iteration $iteration: reopen failed:"
    "$gpuopt" vector info "$work/store" --verify
    exit 1
  fi
  if [ "$count" -lt "$acknowledged" ]; then
    echo "iteration $iteration: store has $count vectors, the import acknowledged $acknowledged"
    exit 1
  fi
  if [ "$count" -gt $((previous + rows)) ] || [ "$count" -lt "$previous" ]; then
    echo "iteration $iteration: store has $count vectors, expected $previous..$((previous + rows))"
    exit 1
  fi
  previous=$count
done
echo "ok: 100 imports killed ($kills mid-run), final count $previous"
