// LLM stage: the decode GEMM's launch shape (llm_gemv.hpp), chosen without a device.
#include <algorithm>

#include "pipeline/llm_gemv.hpp"

namespace gpuopt::pipeline::llm_detail {

GemvPlan plan_gemv(int k, int n, bool pair, int sms, int target_blocks) {
  GemvPlan plan;
  plan.parts = pair ? 2 : 1;
  plan.items = n / (64 * plan.parts);
  const int groups = k / kGemvGroupK;
  const int warps_per_strip = kGemvWarps / plan.parts;
  // At most one k-range per warp's group: more splits would leave warps without work.
  const int max_splits = std::max(1, (groups + warps_per_strip - 1) / warps_per_strip);
  // One wave: as many splits as keep every block resident at once (a second, partial wave would
  // pay the whole load-latency chain again for a few blocks).
  const int target = target_blocks > 0 ? target_blocks : kGemvBlocksPerSm * std::max(sms, 1);
  const int wanted = target / std::max(plan.items, 1);
  plan.splits = std::clamp(wanted, 1, max_splits);
  return plan;
}

}  // namespace gpuopt::pipeline::llm_detail
