// `gpuopt bench gemm`: the W4A16 GEMM against cuBLAS fp16/bf16 on LLM layer shapes, M = 1..256.
#pragma once

#include <string_view>
#include <vector>

#include "gpuopt/bench/testcase.hpp"
#include "gpuopt/core/status.hpp"
#include "gpuopt/kernels/w4a16.hpp"

namespace gpuopt::bench::gemm {

// How the cuBLAS reference and gpuopt are timed against each other: their samples interleaved
// (the default), or in blocks for A/B runs (both per-launch blocks, then both back-to-back blocks),
// cuBLAS first or gpuopt first.
enum class TimingOrder { kInterleaved, kReferenceFirst, kGpuoptFirst };
// "interleaved", "reference-first", "gpuopt-first".
std::string_view timing_order_name(TimingOrder order);
StatusOr<TimingOrder> parse_timing_order(std::string_view name);

// The M values every shape is timed at when GemmBenchOptions::batch_sizes is empty.
const std::vector<int>& default_batch_sizes();

struct GemmBenchOptions {
  // Quick: the four shapes the targets name, fewer samples.
  bool quick = false;
  // The M values to time, each 1..8192 (prefill sizes too); empty: default_batch_sizes().
  std::vector<int> batch_sizes;
  // The W4A16Gemm options of the timed gpuopt arm (force_path, deterministic, fallback_min_m,
  // tuning). sm_count is set from the partition below, not from here.
  kernels::W4A16Options gemm;
  TimingOrder timing = TimingOrder::kInterleaved;
  // > 0: every timing (gpuopt, cuBLAS, the reads) on a green-context partition of this many SMs,
  // with gpuopt planned for it (W4A16Options::sm_count); no fallback when green contexts are
  // missing: the testcase fails, saying why.
  int partition_sms = 0;
  // With partition_sms: the SMs gpuopt is planned for instead of the partition's (0 = the whole
  // GPU, as without a partition); -1 = the partition's.
  int planned_sms = -1;
};

// OK, or INVALID_ARGUMENT naming the first bad value (an M outside 1..256, planned_sms without
// partition_sms, a negative count, W4A16Options out of range).
Status check_options(const GemmBenchOptions& options);

// One testcase per (K, N) layer shape; each row one M. Quick: the four shapes the targets name.
Suite make_suite(const GemmBenchOptions& options);

// The shared verdict's exit code: 2 when a testcase failed, else 0. The speedup targets (M <= 16:
// 3.3x cuBLAS fp16, M = 64: 1.8x, no M slower) are a development target: info, never an error.
int exit_code_for(const std::vector<TestcaseResult>& results);

}  // namespace gpuopt::bench::gemm
