// The GPU consumer of `gpuopt bench loader`: a kernel that reads a batch and holds the compute
// stream for a set time (its CPU twin is the host busy-wait in loader.cpp's CPU mode).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpuopt/core/status.hpp"

namespace gpuopt::bench::loader {

// Reads every 8-byte word of `batch` (folding them into *sink so the reads stay), spins until
// `duration_ns` have passed since the kernel started, and writes its start and end (%globaltimer,
// ns) to stamps[0] and stamps[1]. `stream` is a cudaStream_t. UNIMPLEMENTED without CUDA.
Status launch_consumer(const void* batch, std::size_t bytes, std::uint64_t duration_ns,
                       std::uint64_t* stamps, std::uint64_t* sink, void* stream);

}  // namespace gpuopt::bench::loader
