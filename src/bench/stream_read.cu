// A plain streaming read kernel: the memory anchor of `gpuopt bench gemm` (stream_read.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gpuopt/core/cuda_check.hpp"
#include "stream_read.hpp"

namespace gpuopt::bench {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;

__device__ __forceinline__ uint4 load_once(const uint4* pointer) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(pointer));
  return v;
}

__global__ void __launch_bounds__(kThreads)
    k_stream_read(const uint4* data, std::size_t words, unsigned* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * kThreads;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * kThreads + threadIdx.x;
  unsigned folded = 0;
  for (; i + (kUnroll - 1) * stride < words; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_once(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) folded ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < words; i += stride) {
    const uint4 v = load_once(data + i);
    folded ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (folded == kStreamReadMarker) *sink = folded;
}

}  // namespace

Status launch_stream_read(const void* data, std::size_t bytes, unsigned* sink, void* stream,
                          int warps_per_sm) {
  int device = 0, sms = 0, per_sm = 0;
  GPUOPT_CUDA_TRY(cudaGetDevice(&device));
  GPUOPT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  GPUOPT_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_stream_read, kThreads, 0));
  if (warps_per_sm > 0) per_sm = std::clamp(warps_per_sm / (kThreads / 32), 1, std::max(1, per_sm));
  const int blocks = std::max(1, sms * per_sm);
  k_stream_read<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(data), bytes / 16, sink);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::bench
