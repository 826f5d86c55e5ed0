// CPU twin of the GPU exact search, and the UNIMPLEMENTED stubs for builds without CUDA.
#include <fmt/format.h>

#include "gpuopt/vector/gpu_search.hpp"
#include "search_kernels.hpp"

namespace gpuopt::vector {

GpuSearchResult exact_search_reference(const float* vectors, std::size_t rows, std::size_t dim,
                                       Metric metric, const float* queries, std::size_t query_count,
                                       std::size_t k) {
  std::vector<float> norms(rows);
  detail::squared_norms(vectors, rows, dim, norms.data());
  detail::RowBlock block{vectors, norms.data(), rows, 0, nullptr};
  auto found = detail::exact_scan({&block, 1}, dim, metric, queries, query_count, k, nullptr, 0);
  GpuSearchResult result;
  result.positions.assign(query_count * k, ~std::uint64_t{0});
  result.distances.assign(query_count * k, __builtin_inff());
  for (std::size_t q = 0; q < query_count; ++q) {
    for (std::size_t i = 0; i < found[q].items().size(); ++i) {
      result.positions[q * k + i] = found[q].items()[i].position;
      result.distances[q * k + i] = found[q].items()[i].distance;
    }
  }
  return result;
}

#if !GPUOPT_CUDA
struct GpuDataset::State {};
GpuDataset::GpuDataset(std::unique_ptr<State> state) : state_(std::move(state)) {}
GpuDataset::~GpuDataset() = default;
StatusOr<std::unique_ptr<GpuDataset>> GpuDataset::create(std::size_t, Metric, std::size_t, int) {
  return unimplemented("GPU vector search: gpuopt was built without CUDA");
}
Status GpuDataset::append_host(const float*, std::size_t, void*) {
  return unimplemented("GPU vector search: built without CUDA");
}
Status GpuDataset::append_device(const float*, std::size_t, void*) {
  return unimplemented("GPU vector search: built without CUDA");
}
Status GpuDataset::append_dlpack(const DLTensor&, void*) {
  return unimplemented("GPU vector search: built without CUDA");
}
StatusOr<GpuSearchResult> GpuDataset::search(const float*, std::size_t, const GpuSearchOptions&,
                                             void*) {
  return unimplemented("GPU vector search: built without CUDA");
}
std::size_t GpuDataset::rows() const { return 0; }
std::size_t GpuDataset::dim() const { return 0; }
const float* GpuDataset::device_vectors() const { return nullptr; }
const float* GpuDataset::device_norms() const { return nullptr; }
#endif

}  // namespace gpuopt::vector
