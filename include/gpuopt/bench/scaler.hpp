// `gpuopt bench scaler`: the loss scaler's fused unscale/overflow kernel over 1 GiB of fp16
// gradients in 200 tensors against a device-to-device copy of the same bytes in the same run, and
// the scripted GradScaler sequence run on the device (checked against PyTorch by
// bench/reference/torch_grad_scaler.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "gpuopt/bench/testcase.hpp"

namespace gpuopt::bench::scaler {

inline constexpr std::size_t kGradientBytes = std::size_t{1} << 30;
inline constexpr std::size_t kTensorCount = 200;
// The done criterion: the fused kernel at >= 80% of device-to-device copy bandwidth.
inline constexpr double kTargetRatio = 0.80;

// Element counts of `tensors` gradients summing exactly to total_bytes / element_bytes, varied
// (weights 1 + (i * 7919) % 251, every odd-indexed one made odd); the torch reference repeats it.
std::vector<std::size_t> gradient_sizes(std::size_t total_bytes, std::size_t tensors,
                                        std::size_t element_bytes);

// One letter per training step: F finite, H huge finite (65504), T tiny (fp16 subnormals),
// I an inf, N a NaN. Run with growth_interval 3 and the other GradScaler defaults.
inline constexpr std::string_view kScript = "FFFIFHNTFFIINFNFFT";
inline constexpr int kScriptGrowthInterval = 3;

// Exit code: 0 at or above the target ratio, 1 below it, 2 when a testcase failed.
int exit_code_for(const std::vector<TestcaseResult>& results);

// The testcases "unscale_fp16" and "sequence" (waived without CUDA or a GPU).
Suite make_suite();

}  // namespace gpuopt::bench::scaler
