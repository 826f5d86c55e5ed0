// IVF on the GPU in a build without CUDA: every entry point answers UNIMPLEMENTED.
#include "ivf_gpu.hpp"

namespace gpuopt::vector::detail {

namespace {
constexpr const char* kNoCuda = "gpuopt was built without CUDA: no GPU IVF";
}  // namespace

struct GpuKmeans::State {};
GpuKmeans::GpuKmeans(std::unique_ptr<State> state) : state_(std::move(state)) {}
GpuKmeans::~GpuKmeans() = default;
StatusOr<std::unique_ptr<GpuKmeans>> GpuKmeans::create(std::size_t, int) {
  return unimplemented(kNoCuda);
}
StatusOr<std::vector<float>> GpuKmeans::train(const float*, std::size_t, std::size_t, int,
                                              const CancelToken*) {
  return unimplemented(kNoCuda);
}
Status GpuKmeans::assign(const float*, std::size_t, const float*, std::size_t, std::uint32_t*,
                         float*) {
  return unimplemented(kNoCuda);
}

struct GpuIvfLists::State {};
GpuIvfLists::GpuIvfLists(std::unique_ptr<State> state) : state_(std::move(state)) {}
GpuIvfLists::~GpuIvfLists() = default;
StatusOr<std::unique_ptr<GpuIvfLists>> GpuIvfLists::create(const IvfFlat&, int) {
  return unimplemented(kNoCuda);
}
StatusOr<GpuIvfLists::Result> GpuIvfLists::search(const float*, std::size_t, std::size_t,
                                                  std::size_t, const std::uint64_t*, std::size_t) {
  return unimplemented(kNoCuda);
}
std::size_t GpuIvfLists::rows() const { return 0; }
int GpuIvfLists::device() const { return -1; }

}  // namespace gpuopt::vector::detail
