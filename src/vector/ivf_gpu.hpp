// IVF-Flat on the GPU (host-compilable header): k-means whose distance step is a cuBLAS GEMM
// (||x||^2 - 2 x.c + ||c||^2, TF32 tensor cores while training, fp32 for the final assignment),
// and IVF search over lists stored contiguously on the device (coarse quantiser GEMM, top-nprobe
// per query, then a scan in which the queries probing one list share each read of its rows, and a
// merge of the per-list top-k lists of each query). ivf_gpu.cu implements it;
// ivf_gpu_unavailable.cpp answers UNIMPLEMENTED in builds without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "search_kernels.hpp"

namespace gpuopt::vector::detail {

// The largest k and nprobe the GPU IVF search answers, and the largest dimension (the query row
// is kept in shared memory).
inline constexpr std::size_t kGpuIvfMaxK = 128;
inline constexpr std::size_t kGpuIvfMaxProbe = 1024;
inline constexpr std::size_t kGpuIvfMaxDim = 8192;

class GpuKmeans {
 public:
  ~GpuKmeans();
  GpuKmeans(const GpuKmeans&) = delete;
  GpuKmeans& operator=(const GpuKmeans&) = delete;
  // UNAVAILABLE without a device, INVALID_ARGUMENT for a device that does not exist.
  static StatusOr<std::unique_ptr<GpuKmeans>> create(std::size_t dim, int device);
  // Lloyd's k-means (L2) over `sample` [count, dim] (host), seeded with its first nlist rows, the
  // same start as kmeans_cpu. Returns the centroids [nlist, dim] (host). `cancel` (may be null)
  // is polled after each iteration, once the stream is idle: CANCELLED once it is set.
  StatusOr<std::vector<float>> train(const float* sample, std::size_t count, std::size_t nlist,
                                     int iterations, const CancelToken* cancel = nullptr);
  // The nearest of `centroids` [nlist, dim] to each of `count` host rows, and its squared
  // distance, computed with an fp32 GEMM.
  Status assign(const float* centroids, std::size_t nlist, const float* rows, std::size_t count,
                std::uint32_t* lists, float* distances);

 private:
  struct State;
  explicit GpuKmeans(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// A copy of an IvfFlat on one device: centroids and, list after list, the rows' vectors, norms and
// positions. Made from the host index; rebuilt when the index changes.
class GpuIvfLists {
 public:
  ~GpuIvfLists();
  GpuIvfLists(const GpuIvfLists&) = delete;
  GpuIvfLists& operator=(const GpuIvfLists&) = delete;
  static StatusOr<std::unique_ptr<GpuIvfLists>> create(const IvfFlat& index, int device);

  struct Result {
    std::vector<std::uint64_t> positions;  // [query_count, k]; ~0 where fewer rows were allowed
    std::vector<float> distances;          // [query_count, k], ascending; FLT_MAX where none
  };
  // queries: host [query_count, dim]. allow_mask: host bitset over positions (mask_words words),
  // or null for every row. The probes equal IvfFlat::probes up to ties; the distances come from
  // fp32 dot products and norms, as on the CPU. Equal distances are ordered by position.
  StatusOr<Result> search(const float* queries, std::size_t query_count, std::size_t k,
                          std::size_t nprobe, const std::uint64_t* allow_mask,
                          std::size_t mask_words);
  std::size_t rows() const;
  int device() const;

 private:
  struct State;
  explicit GpuIvfLists(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace gpuopt::vector::detail
