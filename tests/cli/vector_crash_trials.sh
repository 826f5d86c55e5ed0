#!/usr/bin/env bash
# Crash consistency, short: 20 trials of scripts/crash-trials.sh (import, compact and reindex killed
# with SIGKILL at random points; the store must open, verify and hold every acknowledged row).
# The trials check invariants only, never where a kill landed, so a loaded machine cannot fail them.
set -uo pipefail
gpuopt="$1"
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/../../scripts/crash-trials.sh" 20 "$gpuopt"
