// LLM stage: the greedy choice (argmax) over fp16 logits rows, a grid of (blocks per row, rows).
// Each block scans kArgmaxChunk logits with independent 16-byte loads and merges its best into the
// row's 64-bit key with atomicMax; the row's last block (an arrival counter) writes the token and
// resets the key and the counter for the next launch. The key orders (value, -index) exactly as a
// serial scan with a strict `>` does, so the choice does not depend on the block count or order.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "gpuopt/core/cuda_check.hpp"
#include "pipeline/llm_argmax.hpp"
#include "pipeline/llm_pdl.cuh"

namespace gpuopt::pipeline::llm_detail {
namespace {

// The key of logit x at `index`: larger for a larger value, and for the lower index among equal
// values; 0 (below every real key) for NaN and -inf, which a scan starting from -inf with a
// strict `>` never takes.
__device__ __forceinline__ unsigned long long argmax_key(float x, int index) {
  if (!(x > -INFINITY)) return 0ull;
  if (x == 0.0f) x = 0.0f;  // -0 equals +0: the lower index must win, not the sign
  const unsigned bits = __float_as_uint(x);
  // Order-preserving: negative floats flipped whole, positive ones above them.
  const unsigned ordered = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
  return (static_cast<unsigned long long>(ordered) << 32) | ~static_cast<unsigned>(index);
}

__device__ __forceinline__ unsigned long long max_key(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}

// kVector: the row starts 16-byte aligned and vocab % 8 == 0, so each group of 8 logits is one
// 16-byte load, wholly inside the row or wholly past it; otherwise 8 scalar loads with bounds.
template <bool kVector>
__global__ void __launch_bounds__(kArgmaxThreads)
    k_llm_argmax(const __half* logits, int vocab, std::int32_t* tokens, int max_context,
                 const int* position, float* debug, std::size_t debug_stride, ArgmaxSlot* slots) {
  pdl_trigger();
  pdl_wait();
  const int b = blockIdx.y;
  const __half* row = logits + static_cast<std::size_t>(b) * vocab;
  // Load j of thread t: logits [first, first + 8) with first = chunk + (j * threads + t) * 8;
  // every load is issued before any is used.
  __half values[kArgmaxLoadsPerThread][8];
  int firsts[kArgmaxLoadsPerThread];
#pragma unroll
  for (int j = 0; j < kArgmaxLoadsPerThread; ++j) {
    const int first =
        blockIdx.x * kArgmaxChunk + (j * kArgmaxThreads + static_cast<int>(threadIdx.x)) * 8;
    firsts[j] = first;
    if constexpr (kVector) {
      uint4 raw = make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);  // fp16 NaN
      if (first < vocab) raw = *reinterpret_cast<const uint4*>(row + first);
      const __half* h = reinterpret_cast<const __half*>(&raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) values[j][e] = h[e];
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        values[j][e] = first + e < vocab ? row[first + e] : __ushort_as_half(0x7e00);
      }
    }
  }
  unsigned long long best = 0ull;
#pragma unroll
  for (int j = 0; j < kArgmaxLoadsPerThread; ++j) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float x = __half2float(values[j][e]);
      const int index = firsts[j] + e;
      best = max_key(best, argmax_key(x, index));
      if (debug != nullptr && index < vocab) debug[b * debug_stride + index] = x;
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    best = max_key(best, __shfl_xor_sync(0xffffffffu, best, offset));
  }
  __shared__ unsigned long long warp_best[kArgmaxThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int w = 1; w < kArgmaxThreads / 32; ++w) best = max_key(best, warp_best[w]);
  ArgmaxSlot& slot = slots[b];
  if (best != 0ull) atomicMax(&slot.key, best);
  __threadfence();  // the key is merged before this block counts as arrived
  if (atomicAdd(&slot.arrived, 1u) != gridDim.x - 1) return;
  // The row's last block: every other block's key is in.
  __threadfence();
  const unsigned long long chosen = atomicExch(&slot.key, 0ull);
  atomicExch(&slot.arrived, 0u);
  const int column = *position;
  if (column < max_context) {
    // No logit above -inf: vocab - 1, as the scan's initial index (vocab) clamped.
    const int index = chosen == 0ull ? vocab - 1 : static_cast<int>(~static_cast<unsigned>(chosen));
    tokens[static_cast<std::size_t>(b) * max_context + column] = min(index, vocab - 1);
  }
}

}  // namespace

Status launch_argmax(const ArgmaxArgs& a, bool programmatic, CUstream_st* stream_handle) {
  auto bad = [](const std::string& what) { return invalid_argument("LLM argmax: " + what); };
  if (a.rows < 1 || a.rows > 65535) {
    return bad("rows=" + std::to_string(a.rows) + " outside [1, 65535]");
  }
  if (a.vocab < 1 || a.vocab > (1 << 30)) {
    return bad("vocab=" + std::to_string(a.vocab) + " outside [1, 2^30]");
  }
  if (a.max_context < 1) return bad("max_context must be positive");
  if (a.logits == nullptr || a.tokens == nullptr || a.position == nullptr || a.slots == nullptr) {
    return bad("logits, tokens, position and slots must not be null");
  }
  if (a.debug != nullptr && a.debug_stride < static_cast<std::size_t>(a.vocab)) {
    return bad("debug_stride=" + std::to_string(a.debug_stride) + " < vocab");
  }
  const bool vector =
      a.vocab % 8 == 0 && reinterpret_cast<std::uintptr_t>(a.logits) % sizeof(uint4) == 0;
  const dim3 grid(static_cast<unsigned>(argmax_blocks_per_row(a.vocab)),
                  static_cast<unsigned>(a.rows));
  return launch_kernel(vector ? k_llm_argmax<true> : k_llm_argmax<false>, grid,
                       dim3(kArgmaxThreads), 0, static_cast<cudaStream_t>(stream_handle),
                       programmatic, static_cast<const __half*>(a.logits), a.vocab, a.tokens,
                       a.max_context, a.position, a.debug, a.debug_stride, a.slots);
}

}  // namespace gpuopt::pipeline::llm_detail
