// Device side of the loss scaler: chunk table, fused multi-tensor unscale/overflow kernel, scale
// update kernel and the skip-on-overflow SGD step. Self-contained (kernels are `static`) so a bench
// can launch exactly the same code without linking gpuopt_kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/kernels/loss_scaler.hpp"

namespace gpuopt::kernels::detail {

// Device-resident scaler state; the StepRecord history ring follows it in the same allocation.
struct DeviceScalerState {
  float scale;
  std::int32_t growth_tracker;
  std::int32_t hysteresis_tracker;
  float found_inf;  // 0 or 1, as torch's found_inf tensor
  unsigned long long steps;
  unsigned long long overflows;
};
static_assert(sizeof(DeviceScalerState) == 32, "history ring must start 16-byte aligned");
static_assert(sizeof(StepRecord) == 16, "StepRecord is copied raw between host and device");

__host__ __device__ inline StepRecord* history_ring(DeviceScalerState* state) {
  return reinterpret_cast<StepRecord*>(state + 1);
}
inline std::size_t device_state_bytes(int history_capacity) {
  return sizeof(DeviceScalerState) +
         sizeof(StepRecord) * static_cast<std::size_t>(history_capacity);
}

// A piece of one tensor. Chunks end on 16-byte boundaries (except a tensor's last), so only a
// tensor's first chunk has a scalar head and only its last a scalar tail.
struct ChunkDescriptor {
  char* data;
  unsigned long long element_offset;  // of data within its tensor (for the parameter table)
  std::uint32_t count;                // elements
  std::uint32_t tensor;
  std::uint32_t dtype;  // GradientDtype
  std::uint32_t padding;
};

inline constexpr int kThreadsPerBlock = 256;
inline constexpr int kVectorsPerThread = 4;  // 16-byte loads in flight per thread per iteration
inline constexpr std::size_t kDefaultChunkBytes = 32 * 1024;

// Splits every tensor into chunks of about `chunk_bytes` (a multiple of 16); names the bad tensor.
inline StatusOr<std::vector<ChunkDescriptor>> build_chunk_table(
    std::span<const GradientTensor> gradients, std::size_t chunk_bytes = kDefaultChunkBytes) {
  std::vector<ChunkDescriptor> chunks;
  for (std::size_t t = 0; t < gradients.size(); ++t) {
    const GradientTensor& tensor = gradients[t];
    const std::string where = "gradient tensor " + std::to_string(t);
    if (static_cast<unsigned>(tensor.dtype) > static_cast<unsigned>(GradientDtype::kFloat32)) {
      return invalid_argument(where + ": unknown dtype " +
                              std::to_string(static_cast<unsigned>(tensor.dtype)));
    }
    if (tensor.count == 0) continue;
    if (tensor.data == nullptr) {
      return invalid_argument(where + ": null data with " + std::to_string(tensor.count) +
                              " elements");
    }
    const std::size_t element = dtype_size(tensor.dtype);
    const auto address = reinterpret_cast<std::uintptr_t>(tensor.data);
    if (address % element != 0) {
      return invalid_argument(where + ": data not aligned to its " +
                              std::string(dtype_name(tensor.dtype)) + " element size");
    }
    const std::uintptr_t end = address + tensor.count * element;
    std::uintptr_t begin = address;
    std::uintptr_t boundary = (address & ~std::uintptr_t{15}) + chunk_bytes;
    while (begin < end) {
      const std::uintptr_t stop = boundary < end ? boundary : end;
      ChunkDescriptor chunk{};
      chunk.data = reinterpret_cast<char*>(begin);
      chunk.element_offset = (begin - address) / element;
      chunk.count = static_cast<std::uint32_t>((stop - begin) / element);
      chunk.tensor = static_cast<std::uint32_t>(t);
      chunk.dtype = static_cast<std::uint32_t>(tensor.dtype);
      chunks.push_back(chunk);
      begin = stop;
      boundary += chunk_bytes;
    }
  }
  return chunks;
}

// ---- element helpers: the input is checked for inf/NaN before scaling, as torch does ----

__device__ __forceinline__ bool half2_nonfinite(std::uint32_t word) {
  return (word & 0x7c00u) == 0x7c00u || (word & 0x7c000000u) == 0x7c000000u;
}
__device__ __forceinline__ bool bfloat162_nonfinite(std::uint32_t word) {
  return (word & 0x7f80u) == 0x7f80u || (word & 0x7f800000u) == 0x7f800000u;
}
__device__ __forceinline__ bool float_nonfinite(std::uint32_t word) {
  return (word & 0x7f800000u) == 0x7f800000u;
}

// Scales the two 16-bit values of a word: float(x) * inv rounded to nearest even, as torch's
// static_cast<scalar_t>(float * float).
__device__ __forceinline__ std::uint32_t scale_half2(std::uint32_t word, float inv) {
  __half2 h = *reinterpret_cast<__half2*>(&word);
  float2 f = __half22float2(h);
  __half2 r = __floats2half2_rn(__fmul_rn(f.x, inv), __fmul_rn(f.y, inv));
  return *reinterpret_cast<std::uint32_t*>(&r);
}
__device__ __forceinline__ std::uint32_t scale_bfloat162(std::uint32_t word, float inv) {
  __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&word);
  float2 f = __bfloat1622float2(h);
  __nv_bfloat162 r = __floats2bfloat162_rn(__fmul_rn(f.x, inv), __fmul_rn(f.y, inv));
  return *reinterpret_cast<std::uint32_t*>(&r);
}

// One 16-byte vector: returns true when any element is inf/NaN; scales in place when `write`.
template <GradientDtype kDtype>
__device__ __forceinline__ bool process_vector(uint4& v, float inv, bool write) {
  std::uint32_t* words = reinterpret_cast<std::uint32_t*>(&v);
  bool bad = false;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    if constexpr (kDtype == GradientDtype::kFloat16) {
      bad |= half2_nonfinite(words[w]);
      if (write) words[w] = scale_half2(words[w], inv);
    } else if constexpr (kDtype == GradientDtype::kBFloat16) {
      bad |= bfloat162_nonfinite(words[w]);
      if (write) words[w] = scale_bfloat162(words[w], inv);
    } else {
      bad |= float_nonfinite(words[w]);
      if (write) words[w] = __float_as_uint(__fmul_rn(__uint_as_float(words[w]), inv));
    }
  }
  return bad;
}

template <GradientDtype kDtype>
__device__ __forceinline__ bool process_scalar(char* address, float inv, bool write) {
  if constexpr (kDtype == GradientDtype::kFloat32) {
    float* p = reinterpret_cast<float*>(address);
    const float x = *p;
    if (write) *p = __fmul_rn(x, inv);
    return float_nonfinite(__float_as_uint(x));
  } else if constexpr (kDtype == GradientDtype::kFloat16) {
    __half* p = reinterpret_cast<__half*>(address);
    const float x = __half2float(*p);
    if (write) *p = __float2half_rn(__fmul_rn(x, inv));
    return float_nonfinite(__float_as_uint(x));
  } else {
    __nv_bfloat16* p = reinterpret_cast<__nv_bfloat16*>(address);
    const float x = __bfloat162float(*p);
    if (write) *p = __float2bfloat16_rn(__fmul_rn(x, inv));
    return float_nonfinite(__float_as_uint(x));
  }
}

template <GradientDtype kDtype>
__device__ __forceinline__ bool process_chunk(const ChunkDescriptor& chunk, float inv, bool write) {
  constexpr unsigned kElement = kDtype == GradientDtype::kFloat32 ? 4 : 2;
  constexpr unsigned kPerVector = 16 / kElement;
  bool bad = false;
  char* data = chunk.data;
  const unsigned count = chunk.count;
  const unsigned misalignment = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(data) & 15u);
  unsigned head = misalignment == 0 ? 0 : (16 - misalignment) / kElement;
  if (head > count) head = count;
  if (threadIdx.x < head) bad |= process_scalar<kDtype>(data + threadIdx.x * kElement, inv, write);

  uint4* vectors = reinterpret_cast<uint4*>(data + head * kElement);
  const unsigned vector_count = (count - head) / kPerVector;
  for (unsigned base = threadIdx.x; base < vector_count; base += blockDim.x * kVectorsPerThread) {
    uint4 v[kVectorsPerThread];
    // All loads first, so each thread keeps kVectorsPerThread requests in flight.
#pragma unroll
    for (int u = 0; u < kVectorsPerThread; ++u) {
      const unsigned index = base + u * blockDim.x;
      if (index < vector_count) v[u] = __ldcs(vectors + index);
    }
#pragma unroll
    for (int u = 0; u < kVectorsPerThread; ++u) {
      const unsigned index = base + u * blockDim.x;
      if (index < vector_count) {
        bad |= process_vector<kDtype>(v[u], inv, write);
        if (write) __stcs(vectors + index, v[u]);
      }
    }
  }

  const unsigned tail_start = head + vector_count * kPerVector;
  if (threadIdx.x < count - tail_start) {
    bad |= process_scalar<kDtype>(data + (tail_start + threadIdx.x) * kElement, inv, write);
  }
  return bad;
}

// One launch over every chunk of every tensor (grid-stride over the chunk table). found_inf must
// be zero before the launch; any block that sees inf/NaN stores 1.
static __global__ void __launch_bounds__(kThreadsPerBlock)
    k_unscale_multi_tensor(const ChunkDescriptor* __restrict__ chunks, unsigned chunk_count,
                           DeviceScalerState* state) {
  // As GradScaler.unscale_: the reciprocal in fp64, rounded to fp32, applied in fp32.
  const float inv = static_cast<float>(1.0 / static_cast<double>(state->scale));
  // torch returns x unchanged when inv == 1: nothing to write, only the check.
  const bool write = inv != 1.0f;
  bool bad = false;
  for (unsigned c = blockIdx.x; c < chunk_count; c += gridDim.x) {
    const ChunkDescriptor chunk = chunks[c];
    switch (static_cast<GradientDtype>(chunk.dtype)) {
      case GradientDtype::kFloat16:
        bad |= process_chunk<GradientDtype::kFloat16>(chunk, inv, write);
        break;
      case GradientDtype::kBFloat16:
        bad |= process_chunk<GradientDtype::kBFloat16>(chunk, inv, write);
        break;
      case GradientDtype::kFloat32:
        bad |= process_chunk<GradientDtype::kFloat32>(chunk, inv, write);
        break;
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) state->found_inf = 1.0f;
}

// The state machine on the device, one thread; same rule as update_reference().
static __global__ void k_update_scale(DeviceScalerState* state, int history_capacity,
                                      double growth_factor, double backoff_factor,
                                      int growth_interval, int hysteresis) {
  const bool found_inf = state->found_inf != 0.0f;
  if (found_inf) {
    state->growth_tracker = 0;
    if (state->hysteresis_tracker > 1) {
      --state->hysteresis_tracker;
    } else {
      state->scale = static_cast<float>(static_cast<double>(state->scale) * backoff_factor);
    }
    ++state->overflows;
  } else {
    state->hysteresis_tracker = hysteresis;
    const int successful = state->growth_tracker + 1;
    if (successful == growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(state->scale) * growth_factor);
      if (isfinite(grown)) state->scale = grown;
      state->growth_tracker = 0;
    } else {
      state->growth_tracker = successful;
    }
  }
  StepRecord record;
  record.scale = state->scale;
  record.growth_tracker = state->growth_tracker;
  record.hysteresis_tracker = state->hysteresis_tracker;
  record.found_inf = found_inf ? 1 : 0;
  history_ring(state)[state->steps % static_cast<unsigned long long>(history_capacity)] = record;
  ++state->steps;
}

__device__ __forceinline__ float load_gradient(const ChunkDescriptor& chunk, unsigned i) {
  switch (static_cast<GradientDtype>(chunk.dtype)) {
    case GradientDtype::kFloat16:
      return __half2float(reinterpret_cast<const __half*>(chunk.data)[i]);
    case GradientDtype::kBFloat16:
      return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(chunk.data)[i]);
    case GradientDtype::kFloat32:
      return reinterpret_cast<const float*>(chunk.data)[i];
  }
  return 0.0f;
}

// The optimizer hook: reads found_inf on the device and returns at once when the step overflowed.
static __global__ void __launch_bounds__(kThreadsPerBlock)
    k_sgd_step_if_finite(const ChunkDescriptor* __restrict__ chunks, unsigned chunk_count,
                         float* const* __restrict__ params, const DeviceScalerState* state,
                         float learning_rate) {
  if (state->found_inf != 0.0f) return;
  for (unsigned c = blockIdx.x; c < chunk_count; c += gridDim.x) {
    const ChunkDescriptor chunk = chunks[c];
    float* p = params[chunk.tensor] + chunk.element_offset;
    for (unsigned i = threadIdx.x; i < chunk.count; i += blockDim.x) {
      p[i] = fmaf(-learning_rate, load_gradient(chunk, i), p[i]);
    }
  }
}

// Blocks to fill every SM at full occupancy, never more than there are chunks.
inline cudaError_t unscale_grid_blocks(std::size_t chunk_count, int* blocks) {
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess)
    error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error == cudaSuccess) {
    error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_unscale_multi_tensor,
                                                          kThreadsPerBlock, 0);
  }
  if (error != cudaSuccess) return error;
  std::size_t wanted = static_cast<std::size_t>(sms) * static_cast<std::size_t>(per_sm);
  if (wanted > chunk_count) wanted = chunk_count;
  *blocks = wanted == 0 ? 1 : static_cast<int>(wanted);
  return cudaSuccess;
}

// Zero found_inf, then the fused kernel; both queued on `stream`, nothing waits.
inline cudaError_t launch_unscale(const ChunkDescriptor* chunks, std::size_t chunk_count,
                                  DeviceScalerState* state, int blocks, cudaStream_t stream) {
  cudaError_t error = cudaMemsetAsync(&state->found_inf, 0, sizeof(float), stream);
  if (error != cudaSuccess) return error;
  k_unscale_multi_tensor<<<blocks, kThreadsPerBlock, 0, stream>>>(
      chunks, static_cast<unsigned>(chunk_count), state);
  return cudaGetLastError();
}

inline cudaError_t launch_update(DeviceScalerState* state, const LossScalerOptions& options,
                                 cudaStream_t stream) {
  k_update_scale<<<1, 1, 0, stream>>>(state, options.history_capacity, options.growth_factor,
                                      options.backoff_factor, options.growth_interval,
                                      options.hysteresis);
  return cudaGetLastError();
}

}  // namespace gpuopt::kernels::detail
