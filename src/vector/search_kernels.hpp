// CPU search building blocks: SIMD dot-product tiles, per-query top-k, a small parallel loop, and
// exact and IVF-Flat scans over row blocks addressed by global position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gpuopt/core/cancel.hpp"
#include "gpuopt/core/status.hpp"
#include "gpuopt/vector/types.hpp"

namespace gpuopt::vector::detail {

// dots[i * row_count + j] = <queries[i], rows[j]>; queries [query_count, dim], rows [row_count,
// dim].
// The widest tile the CPU supports (AVX-512, AVX2+FMA; see GPUOPT_X86_SIMD), else the portable one.
void dot_tile(const float* queries, std::size_t query_count, const float* rows,
              std::size_t row_count, std::size_t dim, float* dots);
// The same with 4-wide generic vectors, for any architecture; what dot_tile runs without x86 SIMD.
void dot_tile_portable(const float* queries, std::size_t query_count, const float* rows,
                       std::size_t row_count, std::size_t dim, float* dots);
// The tile dot_tile runs: "avx512", "avx2" or "portable".
const char* dot_tile_isa();
float dot(const float* a, const float* b, std::size_t dim);
void squared_norms(const float* rows, std::size_t row_count, std::size_t dim, float* norms);

// Distance from a dot product and the two squared norms (see Metric for the conventions).
inline float distance_from_dot(Metric metric, float dot_value, float query_norm, float row_norm) {
  switch (metric) {
    case Metric::kL2: {
      float d = query_norm + row_norm - 2.0f * dot_value;
      return d > 0 ? d : 0.0f;
    }
    case Metric::kInnerProduct:
      return -dot_value;
    case Metric::kCosine: {
      float scale = query_norm * row_norm;
      return scale > 0 ? 1.0f - dot_value / __builtin_sqrtf(scale) : 1.0f;
    }
  }
  return 0;
}
// Reference distance computed directly (the test oracle and the re-ranking step).
float direct_distance(Metric metric, const float* a, const float* b, std::size_t dim);

// The k closest (position, distance) pairs seen so far, kept sorted ascending by distance.
class TopK {
 public:
  explicit TopK(std::size_t k) : k_(k) { items_.reserve(k + 1); }
  float threshold() const { return items_.size() < k_ ? __builtin_inff() : items_.back().distance; }
  void push(float distance, std::uint64_t position) {
    if (k_ == 0 || distance >= threshold()) return;
    Item item{distance, position};
    auto it = items_.end();
    while (it != items_.begin() && (it - 1)->distance > distance) --it;
    items_.insert(it, item);
    if (items_.size() > k_) items_.pop_back();
  }
  struct Item {
    float distance;
    std::uint64_t position;
  };
  const std::vector<Item>& items() const { return items_; }
  void merge(const TopK& other) {
    for (const auto& item : other.items_) push(item.distance, item.position);
  }

 private:
  std::size_t k_;
  std::vector<Item> items_;
};

// Runs body(task, worker) for task in [0, tasks) on up to `threads` threads (0 = all cores).
void parallel_for(std::size_t tasks, int threads,
                  const std::function<void(std::size_t, int)>& body);
int resolve_threads(int threads);

// A contiguous run of rows: a segment, or one IVF list.
struct RowBlock {
  const float* vectors = nullptr;  // [rows, dim]
  const float* norms = nullptr;    // [rows] squared L2 norms
  std::size_t rows = 0;
  std::uint64_t first_position = 0;          // global position of row 0
  const std::uint64_t* positions = nullptr;  // per-row positions instead (IVF lists), or null
};

// Bit i set = global position i may be returned (deletes and filters cleared). Null = all.
using AllowMask = std::vector<std::uint64_t>;
inline bool allowed(const AllowMask* mask, std::uint64_t position) {
  return mask == nullptr || ((*mask)[position >> 6] >> (position & 63)) & 1u;
}

// Exact top-k of every query over every block: fused dot tiles + distance + top-k, never holding
// more than a [query tile, row tile] block of distances. results[q] holds positions.
// `cancel` (may be null) is polled before every tile: once it is set the remaining tiles are
// skipped and the results are incomplete (the caller checks the token and returns CANCELLED).
std::vector<TopK> exact_scan(std::span<const RowBlock> blocks, std::size_t dim, Metric metric,
                             const float* queries, std::size_t query_count, std::size_t k,
                             const AllowMask* mask, int threads,
                             const CancelToken* cancel = nullptr);

// The nearest centroid (squared L2, ties to the lower index) of each of `count` rows [count, dim]
// among `nlist` centroids [nlist, dim] with squared norms `centroid_norms`: lists[i] and, where
// `distances` is not null, distances[i] (as distance_from_dot computes it). A cache-blocked GEMM
// with the widest register tile the CPU supports (k-means' assignment step); fewer than 16 rows
// take exact_scan. Once `cancel` (may be null) is set, returns early with the outputs unfilled.
void nearest_centroids(const float* rows, std::size_t count, const float* centroids,
                       const float* centroid_norms, std::size_t nlist, std::size_t dim,
                       std::uint32_t* lists, float* distances, int threads,
                       const CancelToken* cancel = nullptr);
// The same with the portable 4-wide tile; what nearest_centroids runs without x86 SIMD.
void nearest_centroids_portable(const float* rows, std::size_t count, const float* centroids,
                                const float* centroid_norms, std::size_t nlist, std::size_t dim,
                                std::uint32_t* lists, float* distances, int threads,
                                const CancelToken* cancel = nullptr);

// The IVF list count used when IvfParams::nlist is 0: about 4*sqrt(rows), a power of two.
std::size_t default_nlist(std::size_t rows);

// The k-means training sample: up to params.max_train_points_per_list * nlist rows drawn without
// replacement (params.seed), [count, dim] row-major. Its first nlist rows seed the centroids.
std::vector<float> ivf_training_sample(std::span<const RowBlock> blocks, std::size_t dim,
                                       std::size_t nlist, const IvfParams& params);

// Lloyd's k-means (L2) on the CPU over `sample` [count, dim], seeded with its first nlist rows;
// empty lists take a nudged half of the largest. Returns the centroids [nlist, dim]. `cancel` (may
// be null) is polled between iterations and inside each assignment pass; once it is set the
// centroids returned are unfinished and the caller must discard them (it checks the token).
std::vector<float> kmeans_cpu(const float* sample, std::size_t count, std::size_t dim,
                              std::size_t nlist, int iterations, int threads,
                              const CancelToken* cancel = nullptr);

// Gives each empty list (counts[c] == 0) a nudged copy of the largest list's centroid and half its
// count, so the next assignment splits that list. centroids [nlist, dim].
void split_empty_lists(float* centroids, std::size_t* counts, std::size_t nlist, std::size_t dim);

// The centroids' k-means objective: sum of squared L2 distances of `rows` to their nearest
// centroid, in float64 (the GPU k-means test compares this between engines).
double kmeans_inertia(const float* rows, std::size_t count, std::size_t dim, const float* centroids,
                      std::size_t nlist, int threads);

// IVF-Flat: k-means centroids plus, per list, a copy of its rows (vectors, norms, positions).
// Lists only grow: a row added after training is appended to its nearest centroid's list.
class IvfFlat {
 public:
  // Trains on the CPU (a sample of) the blocks and assigns every row.
  static StatusOr<IvfFlat> build(std::span<const RowBlock> blocks, std::size_t dim, Metric metric,
                                 const IvfParams& params, int threads);
  // Empty lists around `centroids` [nlist, dim].
  static IvfFlat with_centroids(std::vector<float> centroids, std::size_t dim, Metric metric);
  // The nearest centroid (squared L2) of each of `count` rows [count, dim] and that distance.
  // Once `cancel` (may be null) is set, returns early with `lists` and `distances` unfilled.
  void nearest(const float* rows, std::size_t count, std::uint32_t* lists, float* distances,
               int threads, const CancelToken* cancel = nullptr) const;
  void append(std::uint32_t list, const float* vector, float norm, std::uint64_t position);
  // Makes room for `rows` more rows in `list` (saves the regrowth copies of a bulk fill).
  void reserve(std::uint32_t list, std::size_t rows);
  // Probes the `nprobe` nearest lists of each query; queries sharing a list are scanned together.
  // Once `cancel` (may be null) is set, the remaining lists are skipped (results incomplete).
  std::vector<TopK> search(const float* queries, std::size_t query_count, std::size_t k,
                           std::size_t nprobe, const AllowMask* mask, int threads,
                           const CancelToken* cancel = nullptr) const;
  // The nprobe nearest lists of each query, nearest first ([query_count][nprobe]).
  std::vector<std::vector<std::uint32_t>> probes(const float* queries, std::size_t query_count,
                                                 std::size_t nprobe, int threads) const;
  std::size_t nlist() const { return lists_.size(); }
  std::size_t rows() const { return rows_; }
  std::size_t dim() const { return dim_; }
  Metric metric() const { return metric_; }
  double train_seconds() const { return train_seconds_; }
  void set_train_seconds(double seconds) { train_seconds_ = seconds; }
  const std::vector<float>& centroids() const { return centroids_; }
  struct List {
    std::vector<float> vectors;            // [rows, dim]
    std::vector<float> norms;              // [rows] squared L2 norms
    std::vector<std::uint64_t> positions;  // [rows] global positions
  };
  const List& list(std::size_t index) const { return lists_[index]; }

 private:
  std::size_t dim_ = 0;
  Metric metric_ = Metric::kL2;
  std::vector<float> centroids_;       // [nlist, dim]
  std::vector<float> centroid_norms_;  // [nlist]
  std::vector<List> lists_;            // [nlist]
  std::size_t rows_ = 0;
  double train_seconds_ = 0;
};

}  // namespace gpuopt::vector::detail
