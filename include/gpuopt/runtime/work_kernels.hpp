// Calibrated busy-work kernels for benchmarks and tests of the runtime layer: a spin kernel whose
// blocks each hold an SM slot for a set number of GPU clock cycles (nvbandwidth's trick to hold a
// stream, and a stand-in for long training kernels), and an affine map whose parameters a CUDA
// Graph update changes. Host-compilable launchers; UNIMPLEMENTED without CUDA.
#pragma once

#include <cstdint>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::runtime {

// Each of `blocks` blocks of `threads` threads spins `cycles` SM clock cycles; thread 0 of each
// block then adds 1 to *completed_blocks when it is non-null (a device counter).
Status launch_spin(StreamHandle stream, int blocks, int threads, std::int64_t cycles,
                   unsigned long long* completed_blocks = nullptr);

// y[i] = a * x[i] + b for i < n (device pointers).
Status launch_affine(StreamHandle stream, const float* x, float* y, int n, float a, float b);
// The affine kernel's function pointer, to find its nodes in a captured graph.
const void* affine_kernel_function();
// CPU twin of launch_affine.
void affine_reference(const float* x, float* y, int n, float a, float b);

// Peak SM clock of `device` in Hz (cudaDevAttrClockRate), to turn durations into spin cycles.
StatusOr<double> sm_clock_hz(int device);

}  // namespace gpuopt::runtime
