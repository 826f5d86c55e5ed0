#!/usr/bin/env bash
# The README's main command: install what the audit needs (`setup.sh --audit`: no browser, no
# sanitizer runtime, no cross compiler), build the gpuopt target, and run `gpuopt audit` (doctor +
# short benches + pipeline), which writes gpuopt-audit/report.html and report.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --audit
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target gpuopt
exec ./build/tools/gpuopt/gpuopt audit "$@"
