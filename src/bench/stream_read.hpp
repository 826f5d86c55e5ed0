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
// cudaStream_t. UNIMPLEMENTED without CUDA.
Status launch_stream_read(const void* data, std::size_t bytes, unsigned* sink, void* stream);

}  // namespace gpuopt::bench
