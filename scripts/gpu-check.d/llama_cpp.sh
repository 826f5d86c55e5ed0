#!/usr/bin/env bash
# gpu-check: the llama.cpp anchor for the LLM decoder (docs/llm.md, "Anchor: llama.cpp"):
# llama.cpp's llama-bench, batch-1 decode of the 1B- and 8B-shaped random Q4_0 models.
# Needs the pack from `scripts/anchors/llama_cpp.sh pack BUILD_DIR .gpu-pack` carried as
# .gpu-pack/llama-anchor.tar.xz (or an unpacked llama-anchor/ folder named by LLAMA_ANCHOR_BUNDLE);
# without it, prints a skipped line.
# gpu-check-timeout: 420
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
bundle="${LLAMA_ANCHOR_BUNDLE:-}"
if [ -z "$bundle" ] && [ -f .gpu-pack/llama-anchor.tar.xz ]; then
  unpacked="$(mktemp -d)"
  tar -C "$unpacked" -xJf .gpu-pack/llama-anchor.tar.xz
  bundle="$unpacked/llama-anchor"
fi
if [ -z "$bundle" ] || [ ! -x "$bundle/bin/llama-bench" ]; then
  echo "RESULT: llama_cpp: skipped, no .gpu-pack/llama-anchor.tar.xz (llama_cpp.sh pack)"
  exit 0
fi
bash scripts/anchors/llama_cpp.sh run "$bundle"
