// CPU-only builds: ConvNet::create says why it cannot run.
#include "gpuopt/pipeline/convnet.hpp"

namespace gpuopt::pipeline {
StatusOr<std::unique_ptr<ConvNet>> ConvNet::create(std::string name, TensorShape,
                                                   std::vector<ConvLayerSpec>, std::uint64_t) {
  return unimplemented(name + ": gpuopt was built without CUDA (cuDNN networks need a GPU)");
}
}  // namespace gpuopt::pipeline
