// GPU exact search and zero-copy ingest (host-compilable header; CUDA streams passed as void*).
// Vectors live in device memory with their norms and a norm-scaled fp16 copy. The exact search
// (kFp32) runs one fused kernel: fp16 tensor-core dot products, block tile by block tile, reduced
// at once into per-query candidate lists kept by a provably conservative error bound, then an
// fp64 re-rank of the few candidates, so the answer equals float64 brute force (ties aside) and
// the distance matrix never exists (docs/vector-gpu-exact.md). Shapes outside the fused path
// (dim > 128, k > 128) use cuBLAS fp32 tiles + a per-tile top-k. Built without CUDA, every entry
// point returns UNIMPLEMENTED. Batches of up to 16 queries take the small-batch path: the rows are
// split across every SM, each block keeps its own candidate lists under the same bound, and a
// second kernel merges them and re-ranks in fp64 (same exactness, one query uses the whole GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
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

// The largest k the GPU search answers.
inline constexpr std::size_t kGpuMaxK = 128;
// The largest batch the small-batch path answers.
inline constexpr std::size_t kGpuSmallBatchMaxQueries = 16;

struct GpuSearchOptions {
  std::size_t k = 10;  // 1..128
  GpuPrecision precision = GpuPrecision::kFp32;
  std::size_t tile_rows =
      16384;  // cuBLAS path: rows per GEMM tile ([queries, tile] stays L2-sized)
  // Host bitset over the dataset's rows, ceil(rows / 64) words: bit r of word r / 64 set = row r
  // may be returned (live and passing the filter). Null = every row.
  const std::uint64_t* allow_mask = nullptr;
  // The same bitset already on the dataset's device; used instead of allow_mask, never copied.
  const std::uint64_t* device_allow_mask = nullptr;
  // Non-zero: names allow_mask's contents. A call with the same version as the dataset's previous
  // copy reuses that device copy instead of copying the mask again (a caller bumps the version
  // whenever the bits change; 0 = copy every time).
  std::uint64_t allow_mask_version = 0;
  // Batches of at most this many queries (capped at kGpuSmallBatchMaxQueries) take the
  // small-batch path when the fused path applies; 0 = never.
  std::size_t small_batch_max_queries = kGpuSmallBatchMaxQueries;
};

// Where search_device writes: each array on the dataset's device, [query_count, k], or null.
struct GpuDeviceResults {
  float* distances = nullptr;          // FLT_MAX where no row
  std::uint64_t* ids = nullptr;        // the rows' ids; ~0 where no row
  std::uint64_t* positions = nullptr;  // row positions; ~0 where no row
  // [query_count] int32 or null. Given: the fused and small-batch paths never wait for the device;
  // a query with more near-ties than the candidate lists hold gets 1 here (else 0) and FLT_MAX / ~0
  // in its outputs (answer it with search()). Null: the call waits for those flags and answers
  // such queries (rare: hundreds of rows within the error bound of the k-th distance) with the
  // cuBLAS fp32 path before it returns.
  std::int32_t* unresolved = nullptr;
};

struct GpuSearchResult {
  std::vector<std::uint64_t> positions;  // [query_count, k] row positions; ~0 when fewer rows
  std::vector<std::uint64_t> ids;        // [query_count, k] the rows' ids; ~0 when fewer rows
  std::vector<float> distances;          // [query_count, k]; FLT_MAX where no row
  bool fused = false;                    // the fused tensor-core path answered (else cuBLAS tiles)
  bool small_batch = false;              // ... through its small-batch variant
  std::size_t fallback_queries = 0;  // queries the fused path handed to the cuBLAS path (near-ties)
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

  // Every append takes the rows' ids (host memory, one per row, kept on the host); without them a
  // row's id is its position, the number of rows appended before it.
  // Appends rows from host memory (pinned or pageable); stream-ordered on `stream`.
  Status append_host(const float* vectors, std::size_t rows, void* stream,
                     std::span<const std::uint64_t> ids = {});
  // Zero-copy ingest: appends rows from a device pointer with a device-to-device copy on
  // `stream`; norms are computed on the device. The data never visits the host.
  Status append_device(const float* device_vectors, std::size_t rows, void* stream,
                       std::span<const std::uint64_t> ids = {});
  // DLPack tensor [rows, dim] float32, on CUDA (device_id must match) or CPU memory.
  Status append_dlpack(const DLTensor& tensor, void* stream,
                       std::span<const std::uint64_t> ids = {});

  // queries: host [query_count, dim]. Synchronizes `stream` before returning.
  StatusOr<GpuSearchResult> search(const float* queries, std::size_t query_count,
                                   const GpuSearchOptions& options, void* stream);
  // queries: device [query_count, dim] fp32 on the dataset's device; results stay on the device
  // (see GpuDeviceResults for when the call waits). With options.allow_mask (a host bitset) the
  // mask is copied first; pass device_allow_mask to avoid that. Shapes outside the fused path
  // (dim > 128, k > 128, precision other than kFp32) answer through the cuBLAS path, which waits.
  Status search_device(const float* device_queries, std::size_t query_count,
                       const GpuSearchOptions& options, const GpuDeviceResults& results,
                       void* stream);
  // A DLPack tensor [query_count, dim] float32, compact row-major, on the dataset's CUDA device.
  Status search_dlpack(const DLTensor& queries, const GpuSearchOptions& options,
                       const GpuDeviceResults& results, void* stream);

  // Device memory one row takes: fp32 vector, two norms, fp16 copy (when the fused path applies)
  // and id.
  static std::size_t device_bytes_per_row(std::size_t dim);
  // Caps the device memory the rows may take (0 = no cap, the default): an append or a growth
  // past it fails with RESOURCE_EXHAUSTED naming the bytes needed and the budget; growth by
  // doubling stops at the budget.
  void set_memory_budget(std::size_t bytes);
  // Device memory the rows' buffers take now (their capacity, not only the rows in use).
  std::size_t device_bytes() const;

  std::size_t rows() const;
  std::size_t dim() const;
  // Device pointers (for tests and for callers that want to share the data).
  const float* device_vectors() const;
  const float* device_norms() const;
  const std::uint64_t* device_ids() const;  // [rows] the rows' ids
  int device() const;

 private:
  struct State;
  explicit GpuDataset(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// CPU twin of the GPU search (the test oracle): float64 brute force over the allowed rows, ordered
// by (distance, position); distances rounded to float at the end.
GpuSearchResult exact_search_reference(const float* vectors, std::size_t rows, std::size_t dim,
                                       Metric metric, const float* queries, std::size_t query_count,
                                       std::size_t k, const std::uint64_t* allow_mask = nullptr);
// The same float64 distance the re-rank and the reference use (1 - cos is 1 for a zero vector).
double exact_distance_f64(Metric metric, const float* query, const float* row, std::size_t dim);

}  // namespace gpuopt::vector
