// `gpuopt bench scaler`: the parts that need no GPU (tensor sizes, verdict, the suite's list).
#include "gpuopt/bench/scaler.hpp"

#include <memory>
#include <numeric>

namespace gpuopt::bench::scaler {

// scaler.cu with CUDA, scaler_unavailable.cpp without.
std::unique_ptr<Testcase> make_unscale_testcase();
std::unique_ptr<Testcase> make_sequence_testcase();

std::vector<std::size_t> gradient_sizes(std::size_t total_bytes, std::size_t tensors,
                                        std::size_t element_bytes) {
  std::vector<std::size_t> sizes(tensors, 0);
  if (tensors == 0 || element_bytes == 0) return sizes;
  const std::size_t total = total_bytes / element_bytes;
  std::vector<std::size_t> weights(tensors);
  for (std::size_t i = 0; i < tensors; ++i) weights[i] = 1 + (i * 7919) % 251;
  const std::size_t weight_sum = std::accumulate(weights.begin(), weights.end(), std::size_t{0});
  std::size_t assigned = 0;
  for (std::size_t i = 0; i + 1 < tensors; ++i) {
    sizes[i] =
        static_cast<std::size_t>(static_cast<unsigned __int128>(total) * weights[i] / weight_sum);
    if (i % 2 == 1 && sizes[i] % 2 == 0 && sizes[i] > 0) --sizes[i];  // odd sizes: vector tails
    assigned += sizes[i];
  }
  sizes[tensors - 1] = total - assigned;
  return sizes;
}

int exit_code_for(const std::vector<TestcaseResult>& results) {
  int code = 0;
  for (const TestcaseResult& result : results) {
    if (result.outcome == Outcome::kFailed) return 2;
    if (result.outcome == Outcome::kPassed && result.data.contains("ratio") &&
        result.data["ratio"].is_number() && result.data["ratio"].get<double>() < kTargetRatio) {
      code = 1;
    }
  }
  return code;
}

Suite make_suite() {
  Suite suite("scaler");
  suite.add(make_unscale_testcase());
  suite.add(make_sequence_testcase());
  return suite;
}

}  // namespace gpuopt::bench::scaler
