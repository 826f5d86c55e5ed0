#!/usr/bin/env bash
# `gpuopt vector query --socket` against `gpuopt vector serve`: the server's answers equal the
# store's own (`vector query DIR`), filters included; while the server runs, a second server or
# an import is refused naming the writer's pid, and a --read-only server answers beside a writer.
set -uo pipefail
gpuopt="$1"
work=$(mktemp -d /tmp/gpuopt-vector-serve-query-XXXXXX)
servers=()
cleanup() {
  for pid in "${servers[@]}"; do kill -9 "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
rows=300
dim=12
{
  printf '\x00\x00\x08\x02\x00\x00\x01\x2c\x00\x00\x00\x0c'  # IDX ubyte, 300 x 12
  head -c $((rows * dim)) /dev/urandom
} >"$work/data.idx"
"$gpuopt" vector create "$work/store" --dim $dim >/dev/null || { echo "create failed"; exit 1; }
"$gpuopt" vector import "$work/store" "$work/data.idx" --batch 100 >/dev/null || { echo "import failed"; exit 1; }

start_server() {  # log socket [flags]
  local log=$1 socket=$2
  shift 2
  "$gpuopt" vector serve "$work/store" --socket "$socket" --json "$@" >"$log" 2>&1 &
  servers+=($!)
  for _ in $(seq 1 200); do
    grep -q '"event":"listening"' "$log" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "server did not start:"; cat "$log"; exit 1
}
ids_of() { grep -oE '"id":[0-9]+' | tr '\n' ' '; }

start_server "$work/server.log" "$work/serve.sock"
writer=${servers[0]}
local_ids=$("$gpuopt" vector query "$work/store" "$work/data.idx" --limit 20 --k 5 --json | ids_of)
remote_ids=$("$gpuopt" vector query "$work/data.idx" --socket "$work/serve.sock" --limit 20 --k 5 --json | ids_of)
[ -n "$local_ids" ] && [ "$local_ids" = "$remote_ids" ] ||
  { echo "server answers differ from the store's:"; echo "$local_ids"; echo "$remote_ids"; exit 1; }

# A second writer, server or import, is refused naming the first.
if "$gpuopt" vector serve "$work/store" --socket "$work/second.sock" >"$work/second.log" 2>&1; then
  echo "a second server started on a store with a live writer"; exit 1
fi
grep -q "pid $writer" "$work/second.log" || { echo "no holder pid:"; cat "$work/second.log"; exit 1; }
if "$gpuopt" vector import "$work/store" "$work/data.idx" >"$work/import.log" 2>&1; then
  echo "an import ran beside the server"; exit 1
fi
grep -q "pid $writer" "$work/import.log" || { echo "no holder pid:"; cat "$work/import.log"; exit 1; }
# Nor does a server take over a live socket.
if "$gpuopt" vector serve "$work/store" --socket "$work/serve.sock" --read-only >"$work/take.log" 2>&1; then
  echo "a second server took over a live socket"; exit 1
fi
grep -q "another server is listening" "$work/take.log" || { cat "$work/take.log"; exit 1; }

# A read-only server answers beside the writer and sees what the writer commits.
start_server "$work/reader.log" "$work/reader.sock" --read-only
"$gpuopt" vector send "$work/data.idx" --socket "$work/serve.sock" --limit 50 >/dev/null ||
  { echo "send failed"; exit 1; }
count=$("$gpuopt" vector send "$work/data.idx" --socket "$work/reader.sock" --limit 1 2>&1)
grep -q "open read-only" <<<"$count" || { echo "read-only server took a write: $count"; exit 1; }
reader_ids=$("$gpuopt" vector query "$work/data.idx" --socket "$work/reader.sock" --limit 20 --k 5 --json | ids_of)
writer_ids=$("$gpuopt" vector query "$work/data.idx" --socket "$work/serve.sock" --limit 20 --k 5 --json | ids_of)
[ "$reader_ids" = "$writer_ids" ] || { echo "reader and writer servers disagree"; exit 1; }
grep -qE '"id":(3[0-4][0-9])' <<<"$reader_ids" || grep -qE ':3[0-4][0-9] ' <<<"$reader_ids" ||
  { echo "the read-only server does not see the rows sent to the writer: $reader_ids"; exit 1; }
"$gpuopt" vector query "$work/data.idx" --socket "$work/reader.sock" --k 3 --where '{"x": {"$gt": 1}}' \
  --json >"$work/where.json" || { echo "filtered query failed"; cat "$work/where.json"; exit 1; }
grep -q '"results":\[\[\]' "$work/where.json" || { echo "filter on absent metadata matched rows"; exit 1; }
"$gpuopt" vector query "$work/data.idx" --socket "$work/nothing.sock" >"$work/nothing.log" 2>&1 &&
  { echo "query on a missing socket succeeded"; exit 1; }

kill "$writer"
wait "$writer" 2>/dev/null
grep -q '"count": 350' <<<"$("$gpuopt" vector info "$work/store" --verify --json)" ||
  { echo "store does not hold 350 rows"; "$gpuopt" vector info "$work/store" --verify; exit 1; }
echo "ok: queries through the server match the store; one writer; read-only server follows it"
