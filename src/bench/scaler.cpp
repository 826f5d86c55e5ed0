// `gpuopt bench scaler`: the parts that need no GPU (tensor sizes, verdict, the suite's list).
#include "gpuopt/bench/scaler.hpp"

#include <memory>
#include <numeric>

namespace gpuopt::bench::scaler {

#if GPUOPT_CUDA
// Defined in scaler.cu.
std::unique_ptr<Testcase> make_unscale_testcase();
std::unique_ptr<Testcase> make_sequence_testcase();
#else
namespace {
class NotBuilt : public Testcase {
 public:
  NotBuilt(std::string key, std::string description)
      : key_(std::move(key)), description_(std::move(description)) {}
  std::string key() const override { return key_; }
  std::string description() const override { return description_; }
  Status filter(const BenchContext&) const override {
    return unimplemented("gpuopt was built without CUDA");
  }
  StatusOr<TestcaseResult> run(BenchContext&) override {
    return unimplemented("gpuopt was built without CUDA");
  }

 private:
  std::string key_, description_;
};
}  // namespace
#endif

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
#if GPUOPT_CUDA
  suite.add(make_unscale_testcase());
  suite.add(make_sequence_testcase());
#else
  suite.add(std::make_unique<NotBuilt>("unscale_fp16", "fused unscale vs device copy"));
  suite.add(std::make_unique<NotBuilt>("sequence", "scripted GradScaler sequence"));
#endif
  return suite;
}

}  // namespace gpuopt::bench::scaler
