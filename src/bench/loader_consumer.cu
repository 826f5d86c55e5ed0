// The consumer kernel of `gpuopt bench loader`: reads the batch, then spins on %globaltimer.
#include <cuda_runtime.h>

#include "gpuopt/core/cuda_check.hpp"
#include "loader_consumer.hpp"

namespace gpuopt::bench::loader {
namespace {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// One block: the consumer must occupy the stream for a set time, not the whole GPU.
__global__ void k_loader_consumer(const unsigned long long* batch, std::size_t words,
                                  unsigned long long duration_ns, unsigned long long* stamps,
                                  unsigned long long* sink) {
  unsigned long long start = global_timer_ns();
  unsigned long long folded = 0;
  for (std::size_t i = threadIdx.x; i < words; i += blockDim.x) folded ^= batch[i];
  atomicXor(sink, folded);
  while (global_timer_ns() - start < duration_ns) {
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    stamps[0] = start;
    stamps[1] = global_timer_ns();
  }
}

}  // namespace

Status launch_consumer(const void* batch, std::size_t bytes, std::uint64_t duration_ns,
                       std::uint64_t* stamps, std::uint64_t* sink, void* stream) {
  if (stream == nullptr) return invalid_argument("launch_consumer: null stream");
  k_loader_consumer<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const unsigned long long*>(batch), bytes / sizeof(unsigned long long),
      duration_ns, reinterpret_cast<unsigned long long*>(stamps),
      reinterpret_cast<unsigned long long*>(sink));
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::bench::loader
