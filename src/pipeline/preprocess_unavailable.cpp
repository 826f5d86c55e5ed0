// CPU-only builds: the GPU preprocessing entry point says why it cannot run.
#include "gpuopt/pipeline/preprocess.hpp"

namespace gpuopt::pipeline {
Status preprocess(const std::uint8_t*, std::uint16_t*, const PreprocessParams&,
                  runtime::StreamHandle) {
  return unimplemented("preprocess: gpuopt was built without CUDA");
}
}  // namespace gpuopt::pipeline
