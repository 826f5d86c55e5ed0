// `doctor --load` in a build without CUDA: says so instead of pretending to load the GPU.
#include "gpuopt/doctor/load.hpp"

namespace gpuopt::doctor {

StatusOr<long long> run_under_load(const std::string&, int, const std::function<void()>&) {
  return unimplemented("--load needs a build with CUDA (GPUOPT_CUDA)");
}

}  // namespace gpuopt::doctor
