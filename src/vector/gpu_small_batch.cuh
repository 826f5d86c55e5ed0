// Small-batch GPU exact search (internal): for a few queries the collection's rows are split across
// every SM; each block scans its row range with fp16 tensor-core dot products, keeps per-query
// candidate lists under the fused path's conservative error bound, and a second kernel merges the
// blocks' lists and re-ranks the survivors in fp64 (docs/vector-gpu-exact.md, "Small batches").
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu_fused_search.cuh"
#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/device_buffer.hpp"

namespace gpuopt::vector::detail {

// The most queries one small-batch call answers (two 8-column tensor-core tiles).
inline constexpr std::size_t kSmallBatchMaxQueries = 16;

class SmallBatchSearch {
 public:
  // queries: device [query_count, rows.dim] fp32, 1 <= query_count <= kSmallBatchMaxQueries;
  // k in 1..kFusedMaxK. Writes device [query_count, k] distance and position, and id (from
  // row_ids, device [rows]) when both are non-null; sets overflow[q] to 1 where query q had more
  // near-ties than the candidate lists hold (its outputs are then FLT_MAX / ~0: the caller answers
  // it another way), else 0. Two kernel launches, stream-ordered, no host synchronization; the
  // scratch is allocated on the first call and reused.
  Status run(const FusedRows& rows, const std::uint64_t* row_ids, const float* queries,
             std::size_t query_count, int k, float* distance, std::uint64_t* position,
             std::uint64_t* id, std::int32_t* overflow, cudaStream_t stream);

 private:
  // Each candidate's lower bound (float), upper bound as an orderable key (std::uint32_t) and row
  // (std::uint32_t), each [kSmallBatchMaxQueries, max groups, keep].
  runtime::DeviceBuffer candidate_lower_;
  runtime::DeviceBuffer candidate_key_;
  runtime::DeviceBuffer candidate_row_;
  runtime::DeviceBuffer candidate_count_;  // std::int32_t [kSmallBatchMaxQueries, max groups]
  runtime::DeviceBuffer group_threshold_;  // float, same shape
  int sm_count_ = 0;
  int max_groups_ = 0;
};

// Device kernel launch: id[i] = row_ids[position[i]] (~0 where position is ~0), for `count`
// entries. Used to give the fused path's device results their ids.
Status positions_to_ids(const std::uint64_t* position, const std::uint64_t* row_ids,
                        std::size_t count, std::uint64_t* id, cudaStream_t stream);

// Device kernel launch: writes FLT_MAX / ~0 to the outputs (each may be null) of the queries whose
// flag is set, or of every query when `flags` is null.
Status clear_unanswered(const std::int32_t* flags, std::size_t query_count, int k, float* distance,
                        std::uint64_t* position, std::uint64_t* id, cudaStream_t stream);

}  // namespace gpuopt::vector::detail
