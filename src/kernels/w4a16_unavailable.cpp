// W4A16 GPU entry points in a build without CUDA: every one says so (the CPU twin still works).
#if !GPUOPT_CUDA
#include "gpuopt/kernels/w4a16.hpp"

namespace gpuopt::kernels {
namespace {
Status no_cuda() { return unimplemented("gpuopt was built without CUDA: the W4A16 GEMM needs it"); }
}  // namespace

StatusOr<W4A16DeviceWeights> W4A16DeviceWeights::upload(const W4A16Weights&, StreamHandle) {
  return no_cuda();
}
W4A16DeviceWeights::W4A16DeviceWeights(W4A16DeviceWeights&& other) noexcept {
  *this = std::move(other);
}
W4A16DeviceWeights& W4A16DeviceWeights::operator=(W4A16DeviceWeights&&) noexcept { return *this; }
W4A16DeviceWeights::~W4A16DeviceWeights() = default;
std::size_t W4A16DeviceWeights::compressed_bytes() const { return 0; }

W4A16Gemm::W4A16Gemm(W4A16Options options) : options_(options) {}
W4A16Gemm::~W4A16Gemm() = default;
Status W4A16Gemm::can_implement(const Arguments&) { return no_cuda(); }
StatusOr<std::size_t> W4A16Gemm::workspace_size(const Arguments&) { return no_cuda(); }
Status W4A16Gemm::initialize(const Arguments&, void*, StreamHandle) { return no_cuda(); }
void W4A16Gemm::update(const void*, void*) {}
Status W4A16Gemm::run(StreamHandle) { return no_cuda(); }

CublasGemm::~CublasGemm() = default;
Status CublasGemm::run(ActivationType, int, int, int, const void*, const void*, void*,
                       StreamHandle) {
  return no_cuda();
}

}  // namespace gpuopt::kernels
#endif  // !GPUOPT_CUDA
