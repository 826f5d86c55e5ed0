#!/usr/bin/env bash
# Builds the Marlin same-run anchor (scripts/anchors/marlin_bench.cu) against a Marlin checkout.
# Nothing of Marlin is kept in this repository: its kernel file is #included from the checkout.
#   bash scripts/anchors/build-marlin-anchor.sh MARLIN_CHECKOUT_DIR OUTDIR
# MARLIN_CHECKOUT_DIR holds marlin/marlin_cuda_kernel.cu (a work tree of IST-DASLab/marlin, or any
# folder with that file at that path). OUTDIR receives the stripped binary `marlin_bench`.
# NVCC (default /usr/local/cuda/bin/nvcc if present, else nvcc on PATH) and ARCH_FLAGS (default
# -arch=sm_90; e.g. ARCH_FLAGS="-gencode arch=compute_80,code=sm_80") may be overridden.
# --expt-relaxed-constexpr and the __CUDA_NO_HALF*__ defines are the flags torch's CUDAExtension
# passes to nvcc, i.e. how Marlin's own setup.py builds the kernel (it needs the first one);
# -diag-suppress 39,177,179 hides warnings from its group_blocks == -1 instances (not used here).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 MARLIN_CHECKOUT_DIR OUTDIR" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
checkout="$(cd "$1" && pwd)"
kernel="$checkout/marlin/marlin_cuda_kernel.cu"
[ -f "$kernel" ] || kernel="$checkout/marlin_cuda_kernel.cu"
if [ ! -f "$kernel" ]; then
  echo "$0: no marlin/marlin_cuda_kernel.cu under $checkout" >&2
  exit 2
fi
# CUDA 13.0's ptxas encodes Marlin's L2-evict-first weight copies (createpolicy inside the
# cp.async asm of cp_async4_stream) for sm_90 with a descriptor the H200 rejects: "illegal
# instruction" at the first such LDGSTS (compute-sanitizer, 2026-11-30; the SASS shows desc[UR1],
# a uniform register nothing writes). Unless MARLIN_KEEP_L2_HINT=1, a patched copy of the kernel
# file (in a temporary folder, never here) issues those copies without the hint: plain
# cp.async.cg, as Marlin's other copies are.
if [ "${MARLIN_KEEP_L2_HINT:-0}" != 1 ]; then
  patched="$(mktemp -d)/marlin_cuda_kernel.cu"
  python3 - "$kernel" "$patched" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
pattern = re.compile(r'"\s*\.reg \.b64 p;\\n"\s*"\s*createpolicy\.fractional\.L2::evict_first\.b64 p, 1\.0;"'
                     r'\s*"\s*cp\.async\.cg\.shared\.global\.L2::cache_hint \[%0\], \[%1\], %2, p;\\n"')
text, count = pattern.subn(lambda _: r'"   cp.async.cg.shared.global [%0], [%1], %2;\n"', text)
if count != 1:
    sys.exit(f"build-marlin-anchor: expected one hinted copy in {sys.argv[1]}, found {count}")
open(sys.argv[2], "w").write(text)
PY
  kernel="$patched"
  echo "note: Marlin's weight copies built without the L2 evict-first hint (MARLIN_KEEP_L2_HINT=1 keeps it)" >&2
fi
case "$kernel" in *'"'*|*'\'*) echo "$0: unusable characters in path $kernel" >&2; exit 2 ;; esac
mkdir -p "$2"
out="$(cd "$2" && pwd)/marlin_bench"
if [ -z "${NVCC:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; else NVCC=nvcc; fi
fi
read -r -a arch <<<"${ARCH_FLAGS:--arch=sm_90}"
cuda_lib="$(dirname "$(dirname "$(command -v "$NVCC")")")/lib64"
rpath=(-Xlinker -rpath -Xlinker /usr/local/cuda/lib64)
[ "$cuda_lib" = /usr/local/cuda/lib64 ] || rpath+=(-Xlinker -rpath -Xlinker "$cuda_lib")
set -x
"$NVCC" -O3 -std=c++17 "${arch[@]}" -cudart static \
  --expt-relaxed-constexpr -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ \
  -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ -diag-suppress 39,177,179 \
  -DMARLIN_KERNEL_CU="\"$kernel\"" \
  "${rpath[@]}" \
  -o "$out" "$here/marlin_bench.cu" -lcublas
strip "$out"
{ set +x; } 2>/dev/null
ls -l "$out"
