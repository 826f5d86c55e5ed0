// Device code of the PCIe bench: the spin kernel that holds a stream, the SM copy kernel, and the
// pattern fill/verify kernels (CPU twin: fill_pattern_reference / count_mismatches_reference).
#include <cstdint>

#include "bench/pcie_device.hpp"

namespace gpuopt::bench::pcie::detail {

namespace {

__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// Same mix as pattern_word() in pcie_verdict.cpp.
__device__ __forceinline__ std::uint64_t k_pattern_word(std::uint64_t index, std::uint64_t seed) {
  std::uint64_t z = index + seed * 0x9E3779B97F4A7C15ull + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void k_spin_until_released(const volatile int* release_flag, int* timed_out,
                                      std::uint64_t timeout_ns) {
  const std::uint64_t start = global_timer_ns();
  while (*release_flag == 0) {
    if (global_timer_ns() - start > timeout_ns) {
      *reinterpret_cast<volatile int*>(timed_out) = 1;
      return;
    }
    __nanosleep(256);  // fewer PCIe reads of the flag while waiting
  }
}

__global__ void k_copy_uint4(uint4* __restrict__ dst, const uint4* __restrict__ src,
                             std::size_t vectors, unsigned char* __restrict__ dst_tail,
                             const unsigned char* __restrict__ src_tail, std::size_t tail) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Four independent 16-byte loads per thread in flight hide the latency of host memory reads.
  for (; i + 3 * stride < vectors; i += 4 * stride) {
    uint4 a = src[i];
    uint4 b = src[i + stride];
    uint4 c = src[i + 2 * stride];
    uint4 d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < vectors; i += stride) dst[i] = src[i];
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < tail) dst_tail[t] = src_tail[t];
}

__global__ void k_fill_pattern(unsigned char* data, std::size_t bytes, std::uint64_t seed) {
  const std::size_t words = bytes / 8;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  auto* word_data = reinterpret_cast<std::uint64_t*>(data);
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    word_data[i] = k_pattern_word(i, seed);
  }
  if (blockIdx.x == 0 && threadIdx.x < bytes % 8) {
    std::uint64_t word = k_pattern_word(words, seed);
    data[words * 8 + threadIdx.x] = static_cast<unsigned char>(word >> (8 * threadIdx.x));
  }
}

__global__ void k_count_mismatches(const unsigned char* data, std::size_t bytes, std::uint64_t seed,
                                   unsigned long long* mismatches) {
  const std::size_t words = bytes / 8;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const auto* word_data = reinterpret_cast<const std::uint64_t*>(data);
  unsigned long long local = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    std::uint64_t diff = word_data[i] ^ k_pattern_word(i, seed);
    if (diff != 0) {
      for (int b = 0; b < 8; ++b) local += ((diff >> (8 * b)) & 0xff) != 0;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < bytes % 8) {
    std::uint64_t word = k_pattern_word(words, seed);
    local += data[words * 8 + threadIdx.x] != static_cast<unsigned char>(word >> (8 * threadIdx.x));
  }
  // Mismatches are rare; one atomic per thread that saw any keeps the common path free of them.
  if (local != 0) atomicAdd(mismatches, local);
}

int blocks_for(std::size_t items, int threads) {
  std::size_t blocks = (items + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 4096) blocks = 4096;
  return static_cast<int>(blocks);
}

}  // namespace

Status launch_spin(const volatile int* release_flag, int* timed_out, std::uint64_t timeout_ns,
                   cudaStream_t stream) {
  k_spin_until_released<<<1, 1, 0, stream>>>(release_flag, timed_out, timeout_ns);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_sm_copy(void* dst, const void* src, std::size_t bytes, int blocks,
                      cudaStream_t stream) {
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(src) % 16 != 0) {
    return invalid_argument("SM copy needs 16-byte aligned buffers");
  }
  constexpr int kThreads = 512;
  const std::size_t vectors = bytes / 16;
  const std::size_t tail = bytes % 16;
  int grid = blocks > 0 ? blocks : 1;
  k_copy_uint4<<<grid, kThreads, 0, stream>>>(
      static_cast<uint4*>(dst), static_cast<const uint4*>(src), vectors,
      static_cast<unsigned char*>(dst) + vectors * 16,
      static_cast<const unsigned char*>(src) + vectors * 16, tail);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_fill_pattern(void* data, std::size_t bytes, std::uint64_t seed, cudaStream_t stream) {
  if (reinterpret_cast<std::uintptr_t>(data) % 8 != 0) {
    return invalid_argument("pattern fill needs an 8-byte aligned buffer");
  }
  constexpr int kThreads = 256;
  k_fill_pattern<<<blocks_for(bytes / 8 + 1, kThreads), kThreads, 0, stream>>>(
      static_cast<unsigned char*>(data), bytes, seed);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_count_mismatches(const void* data, std::size_t bytes, std::uint64_t seed,
                               unsigned long long* mismatches, cudaStream_t stream) {
  if (reinterpret_cast<std::uintptr_t>(data) % 8 != 0) {
    return invalid_argument("pattern check needs an 8-byte aligned buffer");
  }
  constexpr int kThreads = 256;
  k_count_mismatches<<<blocks_for(bytes / 8 + 1, kThreads), kThreads, 0, stream>>>(
      static_cast<const unsigned char*>(data), bytes, seed, mismatches);
  GPUOPT_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace gpuopt::bench::pcie::detail
