// CPU twin of the affine kernel, and the CPU-only stubs of the work-kernel launchers.
#include "gpuopt/runtime/work_kernels.hpp"

namespace gpuopt::runtime {

void affine_reference(const float* x, float* y, int n, float a, float b) {
  for (int i = 0; i < n; ++i) y[i] = a * x[i] + b;
}

#if !GPUOPT_CUDA
Status launch_spin(StreamHandle, int, int, std::int64_t, unsigned long long*) {
  return unimplemented("launch_spin: gpuopt was built without CUDA");
}
Status launch_affine(StreamHandle, const float*, float*, int, float, float) {
  return unimplemented("launch_affine: gpuopt was built without CUDA");
}
const void* affine_kernel_function() { return nullptr; }
StatusOr<double> sm_clock_hz(int) { return unimplemented("sm_clock_hz: built without CUDA"); }
#endif

}  // namespace gpuopt::runtime
