// Fused GPU exact search (internal): fp16 tensor-core distance tiles reduced at once into
// per-query candidate lists under a conservative error bound, then an fp64 re-rank.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::vector::detail {

// Makes `buffer` hold at least `count` elements of T; the contents are not kept.
template <typename T>
Status reserve(runtime::DeviceBuffer& buffer, std::size_t count) {
  if (count * sizeof(T) <= buffer.size_bytes()) return ok_status();
  buffer.reset();
  GPUOPT_ASSIGN_OR_RETURN(buffer, runtime::DeviceBuffer::allocate(count * sizeof(T)));
  return ok_status();
}

inline constexpr std::size_t kFusedMaxDim = 128;  // the query tile lives in registers
inline constexpr std::size_t kFusedMaxK = 128;

// Row width of the fp16 copy: dim rounded up to 32 (zero padding adds nothing to a dot product),
// or 0 when dim is beyond the fused path.
int fused_padded_dim(std::size_t dim);

// Bound on |approximate - exact| cosine of two vectors whose unit-scaled fp16 copies are
// multiplied on tensor cores with fp32 accumulation (derivation in gpu_fused_search.cu).
double fused_cosine_error_bound(int padded_dim);

// For each of `rows` fp32 vectors [rows, dim]: squared_norm and norm (accumulated in fp64, stored
// as fp32) and, when `scaled` is not null, the fp16 copy of v / |v| as [rows, padded_dim].
Status fused_prepare_rows(const float* vectors, std::size_t rows, int dim, int padded_dim,
                          float* squared_norm, float* norm, __half* scaled, cudaStream_t stream);

struct FusedRows {
  const float* vectors = nullptr;             // [rows, dim] fp32, for the fp64 re-rank
  const float* squared_norm = nullptr;        // [rows]
  const float* norm = nullptr;                // [rows]
  const __half* scaled = nullptr;             // [rows, padded_dim]
  const std::uint64_t* allow_mask = nullptr;  // device bitset or null
  std::size_t rows = 0;
  int dim = 0;
  int padded_dim = 0;
  int metric = 0;  // 0 = L2, 1 = inner product, 2 = cosine
};

// ---- device routines shared by the fused and the small-batch kernels ----

inline constexpr float kFloatSlack = 0x1p-18f;  // fp32 evaluation slack of the distance bounds

// D = A * B + D for one 16x8x16 fp16 tile with fp32 accumulation.
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                          std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Monotone map of floats to unsigned keys (for the k-th-smallest search).
__device__ __forceinline__ std::uint32_t orderable(float f) {
  std::uint32_t bits = __float_as_uint(f);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float from_orderable(std::uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Distance bounds of one (query, row) pair from the approximate cosine (derivation at the top of
// gpu_fused_search.cu).
struct Bounds {
  float lower, upper;
};
__device__ __forceinline__ Bounds distance_bounds(int metric, float approx, float eps,
                                                  float query_norm, float query_squared,
                                                  float row_norm, float row_squared) {
  float base, error;
  if (metric == 0) {
    float p = query_norm * row_norm;
    base = query_squared + row_squared - 2.0f * p * approx;
    error = 2.0f * p * eps + kFloatSlack * (query_squared + row_squared + 2.0f * p);
  } else if (metric == 1) {
    float p = query_norm * row_norm;
    base = -p * approx;
    error = p * (eps + kFloatSlack);
  } else {
    base = 1.0f - approx;
    error = eps + kFloatSlack;
  }
  return {base - error, base + error};
}

class FusedSearch {
 public:
  // queries: device [query_count, dim] fp32. Writes device [query_count, k] results and sets
  // overflow[q] = 1 where query q had more near-ties than the candidate lists hold (the caller
  // answers those another way). Stream-ordered; does not synchronize.
  Status run(const FusedRows& rows, const float* queries, std::size_t query_count, int k,
             float* distance, std::uint64_t* position, std::int32_t* overflow, cudaStream_t stream);

 private:
  runtime::DeviceBuffer query_scaled_;  // __half
  // float
  runtime::DeviceBuffer query_norm_, query_squared_norm_, candidate_value_, group_threshold_;
  runtime::DeviceBuffer candidate_row_;    // std::uint32_t
  runtime::DeviceBuffer candidate_count_;  // std::int32_t
  int sm_count_ = 0;
};

}  // namespace gpuopt::vector::detail
