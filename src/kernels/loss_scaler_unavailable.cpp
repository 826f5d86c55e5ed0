// LossScaler and TensorListScaler in a build without CUDA: every GPU entry point answers
// UNIMPLEMENTED.
#include <utility>

#include "gpuopt/kernels/loss_scaler.hpp"

namespace gpuopt::kernels {

namespace {
Status not_built() { return unimplemented("LossScaler: gpuopt was built without CUDA"); }
}  // namespace

StatusOr<std::unique_ptr<LossScaler>> LossScaler::create(std::span<const GradientTensor>,
                                                         const LossScalerOptions& options) {
  GPUOPT_RETURN_IF_ERROR(validate(options));
  return not_built();
}
LossScaler::~LossScaler() = default;
Status LossScaler::unscale(CUstream_st*) { return not_built(); }
Status LossScaler::update(CUstream_st*) { return not_built(); }
Status LossScaler::bind_parameters(std::span<float* const>) { return not_built(); }
Status LossScaler::sgd_step_if_finite(float, CUstream_st*) { return not_built(); }
const float* LossScaler::device_found_inf() const { return nullptr; }
const float* LossScaler::device_scale() const { return nullptr; }
StatusOr<LossScalerStatistics> LossScaler::fetch_statistics(CUstream_st*) const {
  return not_built();
}

struct TensorListScaler::Impl {};
TensorListScaler::TensorListScaler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TensorListScaler::~TensorListScaler() = default;
StatusOr<std::unique_ptr<TensorListScaler>> TensorListScaler::create(
    int, const TensorListOptions& options) {
  GPUOPT_RETURN_IF_ERROR(validate(options));
  return unimplemented("TensorListScaler: gpuopt was built without CUDA");
}
Status TensorListScaler::unscale(std::span<const GradientTensor>, const float*, float*,
                                 CUstream_st*) {
  return not_built();
}
Status TensorListScaler::unscale_norm(std::span<const GradientTensor>, const float*, float*, float,
                                      const NormOutputs&, CUstream_st*) {
  return not_built();
}
Status TensorListScaler::scale_twice(std::span<const GradientTensor>, const float*, const float*,
                                     CUstream_st*) {
  return not_built();
}
std::size_t TensorListScaler::table_slots() const { return 0; }
std::uint64_t TensorListScaler::table_uploads() const { return 0; }
int TensorListScaler::grid_blocks() const { return 0; }

}  // namespace gpuopt::kernels
