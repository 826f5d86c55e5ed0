// `gpuopt bench streams`: the suite (its testcases: streams_cuda.cpp, or streams_unavailable.cpp
// without CUDA) and the exit code.
#include "gpuopt/bench/streams.hpp"

#include <memory>

namespace gpuopt::bench::streams {

std::unique_ptr<Testcase> make_contention_testcase();
std::unique_ptr<Testcase> make_graph_launch_testcase();

Suite make_suite() {
  Suite suite("streams");
  suite.add(make_contention_testcase());
  suite.add(make_graph_launch_testcase());
  return suite;
}

int exit_code_for(const std::vector<TestcaseResult>& results) {
  for (const auto& result : results) {
    if (result.outcome == Outcome::kFailed) return 2;
  }
  return 0;
}

}  // namespace gpuopt::bench::streams
