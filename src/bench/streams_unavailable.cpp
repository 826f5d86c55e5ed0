// The streams benchmark in a build without CUDA: its testcases are listed and waived.
#include <memory>
#include <string>
#include <utility>

#include "gpuopt/bench/streams.hpp"

namespace gpuopt::bench::streams {
namespace {

class WaivedTestcase final : public Testcase {
 public:
  WaivedTestcase(std::string key, std::string description)
      : key_(std::move(key)), description_(std::move(description)) {}
  std::string key() const override { return key_; }
  std::string description() const override { return description_; }
  Status filter(const BenchContext&) const override { return not_built(); }
  StatusOr<TestcaseResult> run(BenchContext&) override { return not_built(); }

 private:
  static Status not_built() { return unimplemented("gpuopt was built without CUDA"); }
  std::string key_, description_;
};

}  // namespace

std::unique_ptr<Testcase> make_contention_testcase() {
  return std::make_unique<WaivedTestcase>(
      "contention", "Critical task latency vs background kernels per isolation mode");
}
std::unique_ptr<Testcase> make_graph_launch_testcase() {
  return std::make_unique<WaivedTestcase>(
      "graph_launch", "Per-kernel cost of eager launches vs one CUDA Graph replay");
}

}  // namespace gpuopt::bench::streams
