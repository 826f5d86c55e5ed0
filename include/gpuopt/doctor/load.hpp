// A brief GPU load for `doctor --load`: GPUs downtrain their PCIe link when idle, so the link is
// judged while a short spin kernel keeps the device in P0 (as DCGM does).
#pragma once

#include <functional>
#include <string>

#include "gpuopt/core/status.hpp"

namespace gpuopt::doctor {

// Keeps the CUDA device at PCI address `bdf` busy with a spin kernel for about `milliseconds`,
// calls `during` on the host while the kernel runs, then waits for it. Returns the nanoseconds the
// kernel itself observed on the GPU's global timer (≥ the request when it ran fully).
// UNIMPLEMENTED without CUDA; UNAVAILABLE when the device cannot be used.
StatusOr<long long> run_under_load(const std::string& bdf, int milliseconds,
                                   const std::function<void()>& during);

}  // namespace gpuopt::doctor
