// LossScaler in a build without CUDA: every GPU entry point answers UNIMPLEMENTED.
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

}  // namespace gpuopt::kernels
