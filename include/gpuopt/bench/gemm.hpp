// `gpuopt bench gemm`: the W4A16 GEMM against cuBLAS fp16/bf16 on LLM layer shapes, M = 1..256.
#pragma once

#include <vector>

#include "gpuopt/bench/testcase.hpp"

namespace gpuopt::bench::gemm {

// One testcase per (K, N) layer shape; each row one M. Quick: the four shapes the targets name.
Suite make_suite(bool quick);

// 0 when every shape meets the targets (M <= 16: 3.3x cuBLAS fp16, M = 64: 1.8x, no M slower),
// 1 when a target is missed, 2 when a testcase failed.
int exit_code_for(const std::vector<TestcaseResult>& results);

}  // namespace gpuopt::bench::gemm
