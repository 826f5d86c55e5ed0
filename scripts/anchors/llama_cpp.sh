#!/usr/bin/env bash
# The llama.cpp same-run anchor for the LLM decoder (docs/llm.md): llama.cpp's CUDA backend timing
# batch-1 decode of a model with gpuopt's Llama layer shapes and seeded random Q4_0 weights
# (bench/python/write_llama_gguf.py). Nothing of llama.cpp is kept in this repository.
#
#   bash scripts/anchors/llama_cpp.sh build SRC_DIR BUILD_DIR
#       Configures and builds llama-bench from a llama.cpp source tree (CUDA, sm_90, Release,
#       static ggml). JOBS (default 2) sets the parallel jobs; the build runs under nice -n 19.
#       Re-running resumes an interrupted build (ninja keeps what is done).
#   bash scripts/anchors/llama_cpp.sh pack BUILD_DIR PACK_DIR
#       Copies llama-bench, the shared libraries it needs that a CUDA machine may lack, the GGUF
#       writer and PyPI's gguf package (with PyYAML, which it imports) into PACK_DIR/llama-anchor/
#       and writes PACK_DIR/llama-anchor.tar.xz. PYTHON (default python3) is the interpreter whose
#       gguf and yaml packages are copied.
#   bash scripts/anchors/llama_cpp.sh run [BUNDLE_DIR]
#       On the GPU machine: writes the GGUF files (SHAPES, default "1b 8b"; into MODEL_DIR, default
#       a temporary folder, removed afterwards unless KEEP_MODELS=1), runs llama-bench on each and
#       prints one `RESULT:` line per shape. BUNDLE_DIR (default: the folder of this script when it
#       sits in a bundle, else $LLAMA_ANCHOR_BUNDLE) holds bin/llama-bench, lib/ and py/. Logs and
#       llama-bench's JSON lines go to $OUT/llama_cpp/ (OUT default ./out/gpu-check).
#
# The run: llama-bench -m FILE -ngl 99 -p 0 -n 32 -b 1 -ub 1 -r REPS (default 10) -o jsonl,
# flash attention at llama.cpp's default (auto), one CUDA device. -p 0 -n 32 times 32 decode steps
# of one token each from an empty KV cache after a warm-up step; llama.cpp runs each step as a
# CUDA graph. ms per token = median over repetitions of (run time / 32); the mean and the
# repetitions' spread are printed too.
#
# Build choices (`build`): -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real (sm_90 machine code
# only: the H200 runs it as is; the compute_90 PTX that plain "90" adds is only for JIT on other
# GPUs and doubles the packed size, from about 20 MB to 40 MB of xz, past what travels with
# gpuopt's own bundle),
# -DBUILD_SHARED_LIBS=OFF (ggml and llama linked into llama-bench), no curl or OpenSSL (no model
# downloads), -DGGML_NATIVE=OFF (the CPU backend uses AVX2/FMA/F16C, not this machine's -march, so
# the binary runs on the GPU machine's CPU), -DGGML_OPENMP=OFF (ggml's own thread pool: no libgomp
# to carry; the CPU does no layer work with -ngl 99), -DGGML_CUDA_NCCL=OFF (one GPU), and no tests,
# examples, server or app. -DGGML_CUDA_FA_ALL_QUANTS=OFF (the default) keeps the flash-attention
# kernels to the f16/q4_0/q8_0/bf16 K-V pairs; the f16 cache used here is among them. None of these
# touch the Q4_0 decode kernels (mul_mat_vec_q, the f16 flash-attention vector kernel, norms, rope).
set -euo pipefail

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

here="$(cd "$(dirname "$0")" && pwd)"

cmd_build() {
  [ $# -eq 2 ] || usage
  local src build
  src="$(cd "$1" && pwd)"
  [ -f "$src/tools/llama-bench/llama-bench.cpp" ] || {
    echo "$0: $src is not a llama.cpp source tree (no tools/llama-bench/llama-bench.cpp)" >&2
    exit 2
  }
  mkdir -p "$2"
  build="$(cd "$2" && pwd)"
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S "$src" -B "$build" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
      -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_CUDA_NCCL=OFF \
      -DGGML_CUDA_FA_ALL_QUANTS=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON \
      -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
  fi
  # Which source was built: the git commit when SRC_DIR is a work tree, else LLAMA_SOURCE_ID
  # (e.g. "ggml-org/llama.cpp@0c1e57098 via llama-cpp-python 0.3.36 sdist").
  local id
  id="$(git -C "$src" rev-parse HEAD 2>/dev/null || true)"
  [ -n "$id" ] || id="${LLAMA_SOURCE_ID:-unknown}"
  printf 'source %s\nsource_dir %s\nbuilt %s\n' "$id" "$src" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    >"$build/llama-anchor-source.txt"
  nice -n 19 cmake --build "$build" -j"${JOBS:-2}" --target llama-bench
  ls -l "$build/bin/llama-bench"
}

cmd_pack() {
  [ $# -eq 2 ] || usage
  local build pack bundle
  build="$(cd "$1" && pwd)"
  if [ ! -x "$build/bin/llama-bench" ]; then
    echo "$0: no $build/bin/llama-bench (run build first)" >&2
    exit 2
  fi
  mkdir -p "$2"
  pack="$(cd "$2" && pwd)"
  bundle="$pack/llama-anchor"
  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/py"
  cp "$build/bin/llama-bench" "$bundle/bin/"
  strip "$bundle/bin/llama-bench"
  [ -f "$build/llama-anchor-source.txt" ] && cp "$build/llama-anchor-source.txt" "$bundle/"
  # As scripts/gpu-build.sh: the C/C++ runtime and the CUDA/driver libraries are on the GPU
  # machine; any other shared library llama-bench links travels in lib/.
  ldd "$build/bin/llama-bench" | awk '/=> \// {print $3}' | sort -u | while read -r library; do
    case "$(basename "$library")" in
      libc.so*|libm.so*|libgcc_s.so*|libstdc++.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      libcuda.so*|libnvidia-*|libcudart.so*|libcublas*|libcupti*|libcufile*|libnvrtc*|libcudnn*) ;;
      *) cp -L "$library" "$bundle/lib/" ;;
    esac
  done
  # The GGUF writer and its pure-Python dependencies (numpy is on the GPU machine).
  cp "$here/../../bench/python/write_llama_gguf.py" "$here/llama_cpp.sh" "$bundle/"
  "${PYTHON:-python3}" - "$bundle/py" <<'PY'
import os, shutil, sys
import gguf, yaml
for module in (gguf, yaml):
    folder = os.path.dirname(module.__file__)
    shutil.copytree(folder, os.path.join(sys.argv[1], os.path.basename(folder)),
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "scripts"))
try:
    from importlib.metadata import version
    found = version("gguf")
except Exception:
    found = "(version unknown)"
print(f"gguf {found} from {os.path.dirname(gguf.__file__)}")
PY
  tar -C "$pack" -cf - llama-anchor | xz -6 -T"$(nproc)" >"$pack/llama-anchor.tar.xz"
  ls -l "$bundle/bin" "$bundle/lib"
  du -sh "$pack/llama-anchor.tar.xz"
}

cmd_run() {
  [ $# -le 1 ] || usage
  local bundle
  if [ $# -eq 1 ]; then
    bundle="$1"
  elif [ -x "$here/bin/llama-bench" ]; then
    bundle="$here"
  else
    bundle="${LLAMA_ANCHOR_BUNDLE:-}"
  fi
  if [ -z "$bundle" ] || [ ! -x "$bundle/bin/llama-bench" ]; then
    echo "RESULT: llama_cpp: skipped (no bundle with bin/llama-bench: see llama_cpp.sh pack)"
    return 0
  fi
  bundle="$(cd "$bundle" && pwd)"
  local writer="$bundle/write_llama_gguf.py"
  [ -f "$writer" ] || writer="$here/../../bench/python/write_llama_gguf.py"
  local out="${OUT:-$PWD/out/gpu-check}/llama_cpp"
  mkdir -p "$out"
  local models="${MODEL_DIR:-}"
  local cleanup=0
  if [ -z "$models" ]; then
    models="$(mktemp -d)"
    cleanup=1
  fi
  mkdir -p "$models"
  local n_gen=32 reps="${REPS:-10}" rc=0
  export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$bundle/py${PYTHONPATH:+:$PYTHONPATH}"
  [ -f "$bundle/llama-anchor-source.txt" ] && sed 's/^/# /' "$bundle/llama-anchor-source.txt"
  for shape in ${SHAPES:-1b 8b}; do
    local model="$models/llama-$shape-q4_0.gguf"
    if [ ! -f "$model" ]; then
      if ! "${PYTHON:-python3}" "$writer" --shape "$shape" --out "$model" \
        >"$out/write_$shape.log" 2>&1; then
        echo "RESULT: llama_cpp $shape: failed to write the GGUF file (see $out/write_$shape.log)"
        rc=1
        continue
      fi
    fi
    if ! "$bundle/bin/llama-bench" -m "$model" -ngl 99 -p 0 -n "$n_gen" -b 1 -ub 1 -r "$reps" \
      -o jsonl >"$out/bench_$shape.jsonl" 2>"$out/bench_$shape.log"; then
      echo "RESULT: llama_cpp $shape: llama-bench failed (see $out/bench_$shape.log)"
      rc=1
      continue
    fi
    "${PYTHON:-python3}" - "$out/bench_$shape.jsonl" "$shape" "$n_gen" <<'PY' || rc=1
import json, statistics, sys
path, shape, n_gen = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
rows = [r for r in rows if r.get("n_gen") == n_gen and r.get("n_prompt") == 0]
if not rows:
    print(f"RESULT: llama_cpp {shape}: no decode row in {path}")
    sys.exit(1)
r = rows[0]
if not r.get("gpu_info"):
    print(f"RESULT: llama_cpp {shape}: llama-bench found no CUDA device (it ran on the CPU); "
          "no anchor figure")
    sys.exit(1)
fa = {-1: "auto", 0: "off", 1: "on"}.get(r.get("flash_attn"), r.get("flash_attn"))
per_token_ms = sorted(s / n_gen / 1e6 for s in r["samples_ns"])
median = statistics.median(per_token_ms)
print(f"RESULT: llama_cpp {shape} Q4_0 batch 1 decode: {median:.4f} ms/token median "
      f"({1e3 / median:.1f} tokens/s; mean {r['avg_ts']:.1f} +- {r['stddev_ts']:.1f} tokens/s, "
      f"min {per_token_ms[0]:.4f} max {per_token_ms[-1]:.4f} ms over {len(per_token_ms)} runs "
      f"of {n_gen} tokens; flash attention {fa}, {r['gpu_info']}, "
      f"model {r.get('model_size', 0) / 1e6:.1f} MB)")
PY
  done
  if [ "$cleanup" = 1 ] && [ "${KEEP_MODELS:-0}" != 1 ]; then rm -rf "$models"; fi
  return "$rc"
}

[ $# -ge 1 ] || usage
sub="$1"
shift
case "$sub" in
  build) cmd_build "$@" ;;
  pack) cmd_pack "$@" ;;
  run) cmd_run "$@" ;;
  *) usage ;;
esac
