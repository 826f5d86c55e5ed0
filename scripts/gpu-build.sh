#!/usr/bin/env bash
# Run HERE (no GPU needed): builds the Hopper-only preset and stages what the GPU machine needs in
# .gpu-bundle/ (binaries plus the third-party shared libraries it lacks, e.g. libpci, hwloc, fmt).
# Then send it with the device tool:  run command="bash scripts/gpu-check.sh" carry=[".gpu-bundle"]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset gpu >/dev/null
cmake --build --preset gpu -j "$(nproc)"

bundle=.gpu-bundle
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
cp build-gpu/tools/gpuopt/gpuopt "$bundle/bin/"
find build-gpu/tests -maxdepth 1 -type f -executable \( -name 'unit_*' -o -name 'gpu_*' \) \
  -exec cp {} "$bundle/bin/" \;
# Extra executables (benchmark references, injection libraries) that modules put in build-gpu/bin.
if [ -d build-gpu/bin ]; then cp -r build-gpu/bin/. "$bundle/bin/"; fi
find build-gpu -name 'libgpuopt_*.so' -exec cp {} "$bundle/lib/" \;

# Shared libraries the GPU machine (Ubuntu 24.04 + CUDA) may not have. The C/C++ runtime and the
# CUDA/driver libraries are there; everything else travels.
for binary in "$bundle"/bin/* "$bundle"/lib/*; do
  [ -f "$binary" ] || continue
  ldd "$binary" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | while read -r library; do
  case "$(basename "$library")" in
    libc.so*|libm.so*|libgcc_s.so*|libstdc++.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
    libcuda.so*|libnvidia-*|libcudart.so*|libcublas*|libcupti*|libcufile*|libnvrtc*|libcudnn*) ;;
    *) cp -L "$library" "$bundle/lib/" ;;
  esac
done
strip --strip-debug "$bundle"/bin/* 2>/dev/null || true
du -sh "$bundle"
# The device tool carries at most 64 MiB; the bundle is bigger (every binary links the kernels'
# fatbins) but compresses ~10x: carry .gpu-pack instead and gpu-check.sh unpacks it.
mkdir -p .gpu-pack
tar -cf - "$bundle" | xz -6 -T"$(nproc)" >.gpu-pack/bundle.tar.xz
du -sh .gpu-pack/bundle.tar.xz
