// The work-kernel launchers in a build without CUDA: each answers UNIMPLEMENTED.
#include "gpuopt/runtime/work_kernels.hpp"

namespace gpuopt::runtime {

Status launch_spin(StreamHandle, int, int, std::int64_t, unsigned long long*) {
  return unimplemented("launch_spin: gpuopt was built without CUDA");
}
Status launch_affine(StreamHandle, const float*, float*, int, float, float) {
  return unimplemented("launch_affine: gpuopt was built without CUDA");
}
const void* affine_kernel_function() { return nullptr; }
StatusOr<double> sm_clock_hz(int) { return unimplemented("sm_clock_hz: built without CUDA"); }

}  // namespace gpuopt::runtime
