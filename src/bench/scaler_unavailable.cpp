// `gpuopt bench scaler` in a build without CUDA: the testcases are listed and waived.
#include <memory>
#include <string>
#include <utility>

#include "gpuopt/bench/scaler.hpp"

namespace gpuopt::bench::scaler {
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

std::unique_ptr<Testcase> make_unscale_testcase() {
  return std::make_unique<NotBuilt>("unscale_fp16", "fused unscale vs device copy");
}
std::unique_ptr<Testcase> make_sequence_testcase() {
  return std::make_unique<NotBuilt>("sequence", "scripted GradScaler sequence");
}

}  // namespace gpuopt::bench::scaler
