#!/usr/bin/env bash
# `gpuopt doctor --prometheus` read by a real exposition-format parser (prometheus_client): one
# family per metric with its HELP and TYPE, no sample typed "unknown", dcgm-exporter's labels.
# Usage: bash doctor_prometheus.sh <gpuopt binary> <tests/data dir>; exits 77 (skip) without the
# parser (scripts/setup.sh installs python3-prometheus-client).
set -euo pipefail
gpuopt="$1"
data="$2/doctor"
python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import prometheus_client.parser' 2>/dev/null; then python="$candidate"; break; fi
done
if [ -z "$python" ]; then
  echo "SKIP: no Python with prometheus_client (apt install python3-prometheus-client)"; exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for machine in h200-healthy aer-errors laptop-igpu-dgpu zombie-holding-gpu; do
  set +e
  "$gpuopt" doctor --prometheus --root "$data/$machine" >"$work/$machine.prom"
  rc=$?
  set -e
  [ "$rc" -le 2 ] || { echo "FAIL: doctor --prometheus --root $machine exited $rc"; exit 1; }
done
"$python" - "$work" <<'PY'
import os, re, sys
from prometheus_client.parser import text_string_to_metric_families

work = sys.argv[1]
for name in sorted(os.listdir(work)):
    text = open(os.path.join(work, name)).read()
    families = list(text_string_to_metric_families(text))
    seen = set()
    samples = 0
    for family in families:
        assert family.type != "unknown", f"{name}: {family.name} typed unknown"
        assert family.name not in seen, f"{name}: {family.name} split into two families"
        seen.add(family.name)
        assert family.documentation, f"{name}: {family.name} has no HELP"
        for sample in family.samples:
            samples += 1
            labels = sample.labels
            assert "Hostname" in labels, (name, sample)
            if sample.name.startswith("DCGM_") or sample.name.startswith("GPUOPT_PCIE"):
                for label in ("gpu", "UUID", "pci_bus_id", "modelName"):
                    assert label in labels, (name, sample.name, label)
                assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", labels["pci_bus_id"]), \
                    (name, labels["pci_bus_id"])
    # Every sample line of the text was read into a typed family.
    lines = [l for l in text.splitlines() if l and not l.startswith("#")]
    assert samples == len(lines), f"{name}: parsed {samples} samples of {len(lines)} lines"
    print(f"{name}: {len(families)} families, {samples} samples, all typed")
PY
grep -q '^DCGM_FI_DEV_PCIE_LINK_GEN{gpu="0",.*pci_bus_id="00000000:17:00.0"' "$work/h200-healthy.prom" \
  || { echo "FAIL: h200-healthy link generation sample"; cat "$work/h200-healthy.prom"; exit 1; }
# node_exporter's textfile collector: -o writes the file atomically (no temporary left beside it),
# and it holds the same exposition as stdout; a folder that does not exist is refused up front.
textfile="$work/textfile"
mkdir -p "$textfile"
set +e
"$gpuopt" doctor --root "$data/h200-healthy" --prometheus -o "$textfile/gpuopt.prom"
set -e
[ -s "$textfile/gpuopt.prom" ] || { echo "FAIL: -o wrote no textfile"; exit 1; }
[ "$(ls "$textfile")" = "gpuopt.prom" ] || { echo "FAIL: files beside the textfile: $(ls "$textfile")"; exit 1; }
cmp -s "$textfile/gpuopt.prom" "$work/h200-healthy.prom" ||
  { echo "FAIL: -o differs from stdout"; diff "$textfile/gpuopt.prom" "$work/h200-healthy.prom" | head; exit 1; }
set +e
"$gpuopt" doctor --root "$data/h200-healthy" --prometheus -o "$work/missing/gpuopt.prom" 2>/dev/null
rc=$?
set -e
[ $rc -eq 2 ] || { echo "FAIL: -o into a missing folder was not a usage error"; exit 1; }
echo "doctor --prometheus: conformant"
