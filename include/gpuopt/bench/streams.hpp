// `gpuopt bench streams`: latency of a small critical task issued at a fixed rate while background
// kernels fill the GPU, per isolation mode (same stream, default priorities, high priority, SM
// partition), the background's throughput loss, and eager launch vs CUDA Graph replay per kernel.
#pragma once

#include <vector>

#include "gpuopt/bench/testcase.hpp"

namespace gpuopt::bench::streams {

// Testcases "contention" and "graph_launch"; both waived with the reason when no GPU is usable.
Suite make_suite();

// 0 when every testcase passed or was waived, 2 when one failed.
int exit_code_for(const std::vector<TestcaseResult>& results);

}  // namespace gpuopt::bench::streams
