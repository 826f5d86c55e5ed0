// The step every `gpuopt bench NAME` command ends with: run a suite and print its results as
// JSON (--json) or text. Each command keeps its own option parsing and exit-code rule.
#pragma once

#include <vector>

#include "gpuopt/bench/testcase.hpp"

namespace gpuopt::cli {

std::vector<bench::TestcaseResult> run_and_print(const bench::Suite& suite,
                                                 const bench::BenchOptions& options, bool json);

}  // namespace gpuopt::cli
