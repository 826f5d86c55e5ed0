#!/usr/bin/env bash
# `gpuopt vector import` streams its input: a 300 MB float32 .npy imports holding far less memory
# than the file's size.
# usage: vector_import_rss.sh GPUOPT_BINARY TEST_DATA_DIR
set -uo pipefail
gpuopt="$1"
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to write the input"; exit 77; }
# A sanitizer build keeps freed memory in quarantine and maps shadow memory: its resident set says
# nothing about the import's.
# A here-string, not a pipe: under pipefail grep -q's early exit can fail the pipeline (SIGPIPE).
if grep -qE 'lib(asan|tsan|ubsan)' <<<"$(ldd "$gpuopt" 2>/dev/null)"; then
  echo "SKIP: $gpuopt is a sanitizer build; its resident set is not the import's"
  exit 77
fi
work=$(mktemp -d /tmp/gpuopt-vector-import-rss-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
rows=600000
dim=128
limit_kb=$((96 * 1024))  # 96 MiB, against a 293 MiB file
python3 - "$work/big.npy" "$rows" "$dim" <<'PY'
import array, random, struct, sys
path, rows, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, dim)
header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
rng = random.Random(7)
block_rows = 4096
block = array.array("f", (rng.gauss(0, 1) for _ in range(block_rows * dim)))
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    done = 0
    while done < rows:
        n = min(block_rows, rows - done)
        f.write(block[: n * dim].tobytes())
        done += n
PY
size_kb=$(( $(stat -c %s "$work/big.npy") / 1024 ))
# The program's own footprint (a CUDA build maps its kernels and runtime): the peak of importing
# one row, subtracted, so the check measures what the input's size adds.
python3 - "$work/one.npy" "$dim" <<'PY'
import struct, sys
path, dim = sys.argv[1], int(sys.argv[2])
header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, %d), }" % dim
header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    f.write(struct.pack("<%df" % dim, *([0.5] * dim)))
PY
# The import's anonymous memory (its heap and buffers: what would hold the file were it read
# whole), as the import reports it: RssAnon sampled after each committed batch. The total peak
# resident set also counts file pages the kernel maps on a fault (on some kernels a whole large
# folio of a freshly written segment), which are page cache, not memory the import holds; it is
# printed next to the figure asserted on.
[ -r /proc/self/status ] || { echo "SKIP: /proc/PID/status is needed to sample the import"; exit 77; }
"$gpuopt" vector create "$work/s" --dim $dim >/dev/null || fail create
"$gpuopt" vector create "$work/base" --dim $dim >/dev/null || fail create
"$gpuopt" vector import "$work/base" "$work/one.npy" --json >"$work/one.json" ||
  fail "import one row: $(tail -3 "$work/one.json")"
"$gpuopt" vector import "$work/s" "$work/big.npy" --json >"$work/import.json" ||
  fail "import: $(tail -3 "$work/import.json")"
field() {  # FILE NAME: the summary's integer NAME, 0 when absent or null
  local value
  value=$(tail -1 "$1" | grep -oE "\"$2\":[0-9]+" | grep -oE '[0-9]+$')
  echo "${value:-0}"
}
base_kb=$(( $(field "$work/one.json" peak_anonymous_bytes) / 1024 ))
peak_kb=$(( $(field "$work/import.json" peak_anonymous_bytes) / 1024 ))
base_total_kb=$(( $(field "$work/one.json" peak_rss_bytes) / 1024 ))
peak_total_kb=$(( $(field "$work/import.json" peak_rss_bytes) / 1024 ))
grep -q "\"imported\":$rows" <<<"$(tail -1 "$work/import.json")" || fail "import summary: $(tail -1 "$work/import.json")"
info=$("$gpuopt" vector info "$work/s" --json) || fail info
grep -q "\"count\": $rows" <<<"$info" || fail "info count: $info"
[ "$peak_kb" -gt 0 ] && [ "$base_kb" -gt 0 ] || fail "no peak_anonymous_bytes in the import summaries"
summary="peak anonymous memory ${peak_kb} kB importing a ${size_kb} kB file, ${base_kb} kB for one row (peak resident set ${peak_total_kb} kB, ${base_total_kb} kB)"
[ $((peak_kb - base_kb)) -lt "$limit_kb" ] || fail "$summary: limit ${limit_kb} kB above one row"
echo "ok: $summary"
