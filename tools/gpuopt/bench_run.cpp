// Shared tail of the `gpuopt bench` commands (bench_run.hpp).
#include "bench_run.hpp"

#include <cstdio>

namespace gpuopt::cli {

std::vector<bench::TestcaseResult> run_and_print(const bench::Suite& suite,
                                                 const bench::BenchOptions& options, bool json) {
  bench::BenchContext context(options);
  std::vector<bench::TestcaseResult> results = suite.run(context);
  if (json) {
    std::printf("%s\n", bench::to_json(suite.name(), results).dump(2).c_str());
  } else {
    std::printf("%s", bench::render_text(suite.name(), results).c_str());
  }
  std::fflush(stdout);
  return results;
}

}  // namespace gpuopt::cli
