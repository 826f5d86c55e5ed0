// Fused GPU exact search (internal): fp16 tensor-core distance tiles reduced at once into
// per-query candidate lists under a conservative error bound, then an fp64 re-rank.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "gpuopt/core/cuda_check.hpp"
#include "gpuopt/core/status.hpp"

namespace gpuopt::vector::detail {

// Device buffer that grows (contents are not kept) and frees itself.
template <typename T>
struct DeviceBuffer {
  T* data = nullptr;
  std::size_t size = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  Status reserve(std::size_t n) {
    if (n <= size) return ok_status();
    if (data != nullptr) GPUOPT_CUDA_TRY(cudaFree(data));
    data = nullptr;
    size = 0;
    GPUOPT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(T)));
    size = n;
    return ok_status();
  }
  void swap(DeviceBuffer& other) {
    std::swap(data, other.data);
    std::swap(size, other.size);
  }
  ~DeviceBuffer() {
    if (data != nullptr) GPUOPT_CUDA_TRY_NO_THROW(cudaFree(data));
  }
};

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

class FusedSearch {
 public:
  // queries: device [query_count, dim] fp32. Writes device [query_count, k] results and sets
  // overflow[q] = 1 where query q had more near-ties than the candidate lists hold (the caller
  // answers those another way). Stream-ordered; does not synchronize.
  Status run(const FusedRows& rows, const float* queries, std::size_t query_count, int k,
             float* distance, std::uint64_t* position, std::int32_t* overflow, cudaStream_t stream);

 private:
  DeviceBuffer<__half> query_scaled_;
  DeviceBuffer<float> query_norm_, query_squared_norm_, candidate_value_, group_threshold_;
  DeviceBuffer<std::uint32_t> candidate_row_;
  DeviceBuffer<std::int32_t> candidate_count_;
  int sm_count_ = 0;
};

}  // namespace gpuopt::vector::detail
