#!/usr/bin/env bash
# gpuopt doctor end to end: exit codes per recorded machine, valid JSON, Prometheus, and a live run.
# Usage: bash doctor_fixtures.sh <gpuopt binary> <tests/data dir>
set -u
gpuopt="$1"
data="$2/doctor"
fail=0
expect_exit() {  # machine expected_exit
  "$gpuopt" doctor --root "$data/$1" >/dev/null 2>&1
  local rc=$?
  if [ "$rc" -ne "$2" ]; then echo "FAIL: doctor --root $1 exited $rc, expected $2"; fail=1; fi
}
expect_exit h200-healthy 0
expect_exit laptop-igpu-dgpu 0
expect_exit laptop-dgpu-suspended 0
expect_exit laptop-dgpu-display 0
expect_exit laptop-dgpu-x4 1
expect_exit aspm-powersave 1
expect_exit iommu-translated 1
expect_exit aer-errors 1
expect_exit zombie-holding-gpu 2
expect_exit idle-memory-holder 1
"$gpuopt" doctor --root "$data/no-such-machine" >/dev/null 2>&1
[ $? -eq 3 ] || { echo "FAIL: a missing --root must exit 3"; fail=1; }
json=$("$gpuopt" doctor --json --root "$data/zombie-holding-gpu")
echo "$json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["schema_version"] == 1, d["schema_version"]
ids = [f["id"] for f in d["findings"]]
assert ids == ["gpu.context_leak"], ids
assert d["devices"][0]["bdf"] == "0000:17:00.0"
' || { echo "FAIL: JSON of zombie-holding-gpu"; fail=1; }
"$gpuopt" doctor --prometheus --root "$data/h200-healthy" | grep -q '^DCGM_FI_DEV_PCIE_LINK_WIDTH{gpu="0",.*pci_bus_id="00000000:17:00.0",.*} 16$' \
  || { echo "FAIL: Prometheus link width"; fail=1; }
# --watch prints one line per device and sample, like `nvidia-smi dmon`, before the report.
watch=$("$gpuopt" doctor --root "$data/laptop-igpu-dgpu" --watch 0.1 --duration 0.3)
lines=$(echo "$watch" | grep -cE '^ +[0-9]+\.[0-9] +- 0000:01:00\.0 +Gen1x8 ')
[ "$lines" -ge 2 ] || { echo "FAIL: --watch printed $lines sample lines for the dGPU"; fail=1; }
[ "$(echo "$watch" | head -1 | cut -c1-2)" = "# " ] || { echo "FAIL: --watch header"; fail=1; }
# NO_COLOR and a pipe: no escape codes.
if "$gpuopt" doctor --root "$data/aer-errors" | grep -q $'\033'; then echo "FAIL: colour on a pipe"; fail=1; fi
# The live machine: must finish and exit 0..2 (never 3), with or without a GPU.
"$gpuopt" doctor --json >/dev/null
rc=$?
[ $rc -le 2 ] || { echo "FAIL: live doctor exited $rc"; fail=1; }
[ $fail -eq 0 ] && echo "doctor CLI: ok"
exit $fail
