// Hopper (sm_90a) W4A16 kernel on wgmma for larger M. Placeholder until it is written: refuses.
#include "w4a16_paths.hpp"

namespace gpuopt::kernels::w4a16_detail {

StatusOr<KernelPlan> plan_wgmma(const W4A16DeviceWeights&, int, int) {
  return Status(StatusCode::kFailedPrecondition, "W4A16 wgmma kernel: not built yet");
}

Status run_wgmma(const KernelPlan&, const W4A16DeviceWeights&, int, const void*, void*, void*,
                 StreamHandle) {
  return Status(StatusCode::kFailedPrecondition, "W4A16 wgmma kernel: not built yet");
}

}  // namespace gpuopt::kernels::w4a16_detail
