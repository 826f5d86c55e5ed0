#!/usr/bin/env bash
# `gpuopt vector serve` + `gpuopt vector send` end to end: vectors cross processes through 0600
# shared memory, a wrong-dimension file is refused with a clear message, and the server killed
# with SIGKILL mid-ingest 20 times always reopens with at least the last acknowledged total.
set -uo pipefail
gpuopt="$1"
work=$(mktemp -d /tmp/gpuopt-vector-ingest-XXXXXX)
server=""
cleanup() {
  [ -n "$server" ] && kill -9 "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
rows=400
dim=16
# IDX (ubyte, rows x dim): any byte is a valid value, so no generator is needed.
make_idx() {  # rows dim file
  {
    printf '\x00\x00\x08\x02'
    printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))"
    printf "\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"
    printf "\\x00\\x00\\x00\\x$(printf %02x "$2")"
    head -c $(($1 * $2)) /dev/urandom
  } >"$3"
}
make_idx $rows $dim "$work/data.idx"
make_idx 10 8 "$work/narrow.idx"
"$gpuopt" vector create "$work/store" --dim $dim >/dev/null || { echo "create failed"; exit 1; }
socket="$work/ingest.sock"

start_server() {
  "$gpuopt" vector serve "$work/store" --socket "$socket" --json >"$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 200); do
    grep -q '"event":"listening"' "$work/server.log" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "server did not start:"; cat "$work/server.log"; exit 1
}
count_of() { "$gpuopt" vector info "$work/store" --verify --json | grep -oE '"count": [0-9]+' | grep -oE '[0-9]+$'; }

start_server
mode=$(stat -c %a "$socket")
[ "$mode" = "600" ] || { echo "socket mode $mode, expected 600"; exit 1; }
"$gpuopt" vector send "$work/data.idx" --socket "$socket" --batch 50 >"$work/send.log" 2>&1 ||
  { echo "send failed:"; cat "$work/send.log"; exit 1; }
grep -q "^committed $rows total $rows$" "$work/send.log" || { echo "no final ack:"; cat "$work/send.log"; exit 1; }
if "$gpuopt" vector send "$work/narrow.idx" --socket "$socket" >"$work/narrow.log" 2>&1; then
  echo "a dimension-8 file was accepted by a dimension-16 collection"; exit 1
fi
grep -q "dim mismatch" "$work/narrow.log" || { echo "no clear error:"; cat "$work/narrow.log"; exit 1; }
grep -q '"event":"rejected"' "$work/server.log" || { echo "server did not log the rejection"; exit 1; }
# Clean stop on SIGTERM, with its summary line.
kill -TERM "$server"
wait "$server"; rc=$?
server=""
[ $rc -eq 0 ] || { echo "server exited $rc on SIGTERM"; cat "$work/server.log"; exit 1; }
grep -q '"event":"stopped"' "$work/server.log" || { echo "no stop summary"; exit 1; }
[ "$(count_of)" = "$rows" ] || { echo "store count $(count_of), expected $rows"; exit 1; }

previous=$rows
for iteration in $(seq 1 20); do
  start_server
  "$gpuopt" vector send "$work/data.idx" --socket "$socket" --batch 20 >"$work/send.log" 2>&1 &
  sender=$!
  sleep "0.$((RANDOM % 4))$((RANDOM % 10))"
  kill -9 "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  server=""
  wait "$sender" 2>/dev/null
  acknowledged=$(grep -oE '^committed [0-9]+ total [0-9]+' "$work/send.log" | tail -1 | awk '{print $4}')
  acknowledged=${acknowledged:-$previous}
  if ! count=$(count_of); then
    echo "iteration $iteration: reopen failed:"; "$gpuopt" vector info "$work/store" --verify; exit 1
  fi
  if [ "$count" -lt "$acknowledged" ] || [ "$count" -lt "$previous" ]; then
    echo "iteration $iteration: store has $count vectors, acknowledged $acknowledged (before: $previous)"
    exit 1
  fi
  previous=$count
done
echo "ok: shm ingest, rejection and 20 SIGKILLed servers, final count $previous"
