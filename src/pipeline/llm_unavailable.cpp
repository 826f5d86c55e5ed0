// CPU-only builds: LlmDecoder::create says why it cannot run.
#include "gpuopt/pipeline/llm.hpp"

namespace gpuopt::pipeline {
StatusOr<std::unique_ptr<LlmDecoder>> LlmDecoder::create(const LlmConfig& config) {
  return unimplemented(config.name +
                       ": gpuopt was built without CUDA (the LLM decoder needs a GPU)");
}
StatusOr<std::unique_ptr<LlmDecoder>> LlmDecoder::create(const LlmConfig& config,
                                                         const LlmDecoderOptions&) {
  return create(config);
}
}  // namespace gpuopt::pipeline
