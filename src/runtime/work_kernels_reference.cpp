// CPU twin of the affine kernel.
#include "gpuopt/runtime/work_kernels.hpp"

namespace gpuopt::runtime {

void affine_reference(const float* x, float* y, int n, float a, float b) {
  for (int i = 0; i < n; ++i) y[i] = a * x[i] + b;
}

}  // namespace gpuopt::runtime
