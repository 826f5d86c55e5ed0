// The memory anchor of `gpuopt bench gemm`: a plain streaming read of a buffer (what the GPU's
// memory gives a kernel that only reads), so a GEMM's time can be put against the bytes it must
// move on the same GPU in the same run.
#pragma once

#include <cstddef>

#include "gpuopt/core/status.hpp"

namespace gpuopt::bench {

// Reads every 16-byte word of data[0, bytes) once (bytes a multiple of 16, data 16-byte aligned),
// eight independent loads in flight per thread, one wave of blocks; folds them into *sink only if
// a value that never occurs turns up, so the reads cannot be optimised away. `stream` is a
// cudaStream_t. warps_per_sm 0: as many 8-warp blocks per SM as fit (the anchor); n > 0: n / 8
// blocks per SM (at least one), the read a kernel with n warps per SM could do (the direct W4A16
// kernel has 12-16). UNIMPLEMENTED without CUDA.
Status launch_stream_read(const void* data, std::size_t bytes, unsigned* sink, void* stream,
                          int warps_per_sm = 0);

// The fold the read stores into *sink: a thread's XOR of every 32-bit value it loaded, stored only
// when it equals this (tests plant it to check that a word was read).
inline constexpr unsigned kStreamReadMarker = 0x9e3779b9u;

}  // namespace gpuopt::bench
