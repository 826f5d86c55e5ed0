// CPU-only builds: LlmDecoder::create says why it cannot run.
#include "gpuopt/pipeline/llm.hpp"

// First commit of the API: the CUDA decoder (llm_decoder.cu) follows; until then both builds
// answer UNIMPLEMENTED.
namespace gpuopt::pipeline {
StatusOr<std::unique_ptr<LlmDecoder>> LlmDecoder::create(const LlmConfig& config) {
#if GPUOPT_CUDA
  return unimplemented(config.name + ": the CUDA LLM decoder is not written yet");
#else
  return unimplemented(config.name +
                       ": gpuopt was built without CUDA (the LLM decoder needs a GPU)");
#endif
}
}  // namespace gpuopt::pipeline
