// CPU twin of the GPU exact search, and the UNIMPLEMENTED stubs for builds without CUDA.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "gpuopt/vector/gpu_search.hpp"

namespace gpuopt::vector {

double exact_distance_f64(Metric metric, const float* query, const float* row, std::size_t dim) {
  double sum = 0, qq = 0, xx = 0;
  for (std::size_t i = 0; i < dim; ++i) {
    double q = query[i], x = row[i];
    if (metric == Metric::kL2) {
      sum += (q - x) * (q - x);
    } else {
      sum += q * x;
      qq += q * q;
      xx += x * x;
    }
  }
  if (metric == Metric::kL2) return sum;
  if (metric == Metric::kInnerProduct) return -sum;
  return qq * xx > 0 ? 1.0 - sum / std::sqrt(qq * xx) : 1.0;
}

GpuSearchResult exact_search_reference(const float* vectors, std::size_t rows, std::size_t dim,
                                       Metric metric, const float* queries, std::size_t query_count,
                                       std::size_t k, const std::uint64_t* allow_mask) {
  GpuSearchResult result;
  result.positions.assign(query_count * k, ~std::uint64_t{0});
  result.distances.assign(query_count * k, std::numeric_limits<float>::max());
  std::vector<std::pair<double, std::uint64_t>> all;
  for (std::size_t q = 0; q < query_count; ++q) {
    all.clear();
    for (std::uint64_t r = 0; r < rows; ++r) {
      if (allow_mask != nullptr && !((allow_mask[r / 64] >> (r % 64)) & 1)) continue;
      all.emplace_back(exact_distance_f64(metric, queries + q * dim, vectors + r * dim, dim), r);
    }
    std::size_t take = std::min(k, all.size());
    std::partial_sort(all.begin(), all.begin() + take, all.end());
    for (std::size_t i = 0; i < take; ++i) {
      result.positions[q * k + i] = all[i].second;
      result.distances[q * k + i] = static_cast<float>(all[i].first);
    }
  }
  return result;
}

std::size_t GpuDataset::device_bytes_per_row(std::size_t dim) {
  // fp32 vector, squared norm and norm, the fp16 copy (dim rounded up to 32, only where the fused
  // path applies: dim <= 128, as fused_padded_dim in gpu_fused_search.cu) and the id.
  const std::size_t padded = dim >= 1 && dim <= 128 ? (dim + 31) / 32 * 32 : 0;
  return dim * sizeof(float) + 2 * sizeof(float) + padded * 2 + sizeof(std::uint64_t);
}

#if !GPUOPT_CUDA
struct GpuDataset::State {};
GpuDataset::GpuDataset(std::unique_ptr<State> state) : state_(std::move(state)) {}
GpuDataset::~GpuDataset() = default;
StatusOr<std::unique_ptr<GpuDataset>> GpuDataset::create(std::size_t, Metric, std::size_t, int) {
  return unimplemented("GPU vector search: gpuopt was built without CUDA");
}
Status GpuDataset::append_host(const float*, std::size_t, void*, std::span<const std::uint64_t>) {
  return unimplemented("GPU vector search: built without CUDA");
}
Status GpuDataset::append_device(const float*, std::size_t, void*, std::span<const std::uint64_t>) {
  return unimplemented("GPU vector search: built without CUDA");
}
Status GpuDataset::append_dlpack(const DLTensor&, void*, std::span<const std::uint64_t>) {
  return unimplemented("GPU vector search: built without CUDA");
}
StatusOr<GpuSearchResult> GpuDataset::search(const float*, std::size_t, const GpuSearchOptions&,
                                             void*) {
  return unimplemented("GPU vector search: built without CUDA");
}
Status GpuDataset::search_device(const float*, std::size_t, const GpuSearchOptions&,
                                 const GpuDeviceResults&, void*) {
  return unimplemented("GPU vector search: built without CUDA");
}
Status GpuDataset::search_dlpack(const DLTensor&, const GpuSearchOptions&, const GpuDeviceResults&,
                                 void*) {
  return unimplemented("GPU vector search: built without CUDA");
}
void GpuDataset::set_memory_budget(std::size_t) {}
std::size_t GpuDataset::device_bytes() const { return 0; }
std::size_t GpuDataset::rows() const { return 0; }
std::size_t GpuDataset::dim() const { return 0; }
const float* GpuDataset::device_vectors() const { return nullptr; }
const float* GpuDataset::device_norms() const { return nullptr; }
const std::uint64_t* GpuDataset::device_ids() const { return nullptr; }
int GpuDataset::device() const { return 0; }
#endif

}  // namespace gpuopt::vector
