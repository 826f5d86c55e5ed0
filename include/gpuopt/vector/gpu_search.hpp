// GPU exact search and zero-copy ingest (host-compilable header; CUDA streams passed as void*).
// Vectors live in device memory with their squared norms; search tiles the rows, computes each
// [queries, tile] block of dot products with cuBLAS (fp32, or TF32 with an exact fp32 re-rank of
// 4k candidates), and a fused kernel keeps each query's top-k per tile, so the full distance
// matrix never exists. Built without CUDA, every entry point returns UNIMPLEMENTED.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/vector/types.hpp"

namespace gpuopt::vector {

// The DLPack tensor ABI (dlpack.h v0.8+), declared here so callers need no extra header.
struct DLDevice {
  std::int32_t device_type;  // 1 = CPU, 2 = CUDA, 3 = CUDA host (pinned), 13 = CUDA managed
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;  // 2 = float
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // null = compact row-major
  std::uint64_t byte_offset;
};

enum class GpuPrecision {
  kFp32,        // exact: fp32 GEMM, same ordering rule as the CPU search (ties aside)
  kTf32Rerank,  // TF32 tensor-core GEMM picks 4k candidates, re-ranked with exact fp32 distances
};

struct GpuSearchOptions {
  std::size_t k = 10;  // 1..64
  GpuPrecision precision = GpuPrecision::kFp32;
  std::size_t tile_rows = 16384;  // rows per GEMM tile: [queries, tile] fp32 stays L2-sized
};

struct GpuSearchResult {
  std::vector<std::uint64_t> positions;  // [query_count, k] row positions; ~0 when fewer rows
  std::vector<float> distances;          // [query_count, k]
};

// Every `stream` argument may be null: the dataset then uses its own non-blocking stream.
class GpuDataset {
 public:
  ~GpuDataset();
  GpuDataset(const GpuDataset&) = delete;
  GpuDataset& operator=(const GpuDataset&) = delete;

  // Reserves room for `capacity` rows on `device` (grows by doubling when exceeded).
  static StatusOr<std::unique_ptr<GpuDataset>> create(std::size_t dim, Metric metric,
                                                      std::size_t capacity, int device = 0);

  // Appends rows from host memory (pinned or pageable); stream-ordered on `stream`.
  Status append_host(const float* vectors, std::size_t rows, void* stream);
  // Zero-copy ingest: appends rows from a device pointer with a device-to-device copy on
  // `stream`; norms are computed on the device. The data never visits the host.
  Status append_device(const float* device_vectors, std::size_t rows, void* stream);
  // DLPack tensor [rows, dim] float32, on CUDA (device_id must match) or CPU memory.
  Status append_dlpack(const DLTensor& tensor, void* stream);

  // queries: host [query_count, dim]. Synchronizes `stream` before returning.
  StatusOr<GpuSearchResult> search(const float* queries, std::size_t query_count,
                                   const GpuSearchOptions& options, void* stream);

  std::size_t rows() const;
  std::size_t dim() const;
  // Device pointers (for tests and for callers that want to share the data).
  const float* device_vectors() const;
  const float* device_norms() const;

 private:
  struct State;
  explicit GpuDataset(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// CPU twin of the GPU search (the test oracle): same distances, same top-k rule.
GpuSearchResult exact_search_reference(const float* vectors, std::size_t rows, std::size_t dim,
                                       Metric metric, const float* queries, std::size_t query_count,
                                       std::size_t k);

}  // namespace gpuopt::vector
