// Device code of work_kernels.hpp: the spin and affine kernels and their launchers.
#include <cuda_runtime.h>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/runtime/work_kernels.hpp"

namespace gpuopt::runtime {
namespace {

__global__ void k_spin(long long cycles, unsigned long long* completed_blocks) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  // Every thread spins so the block keeps its full thread footprint (occupancy) for the duration.
  __syncthreads();
  if (threadIdx.x == 0 && completed_blocks != nullptr) atomicAdd(completed_blocks, 1ull);
}

__global__ void k_affine_f32(const float* x, float* y, int n, float a, float b) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}

}  // namespace

Status launch_spin(StreamHandle stream, int blocks, int threads, std::int64_t cycles,
                   unsigned long long* completed_blocks) {
  if (stream == nullptr) return invalid_argument("launch_spin: null stream");
  if (blocks < 1 || threads < 1 || threads > 1024 || cycles < 0) {
    return invalid_argument("launch_spin: need blocks >= 1, 1 <= threads <= 1024, cycles >= 0");
  }
  k_spin<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(cycles, completed_blocks);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_affine(StreamHandle stream, const float* x, float* y, int n, float a, float b) {
  if (stream == nullptr) return invalid_argument("launch_affine: null stream");
  if (n < 0) return invalid_argument("launch_affine: n < 0");
  if (n == 0) return ok_status();
  constexpr int kThreads = 256;
  k_affine_f32<<<(n + kThreads - 1) / kThreads, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, y, n, a, b);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

const void* affine_kernel_function() { return reinterpret_cast<const void*>(&k_affine_f32); }

StatusOr<double> sm_clock_hz(int device) {
  int khz = 0;
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  return khz * 1e3;
}

}  // namespace gpuopt::runtime
