// The W4A16 kernels beside the original two (w4a16_gemm.cu): each file plans its launch for one
// (weights, M, device) and runs it; W4A16Gemm chooses among them. Internal, host-compilable.
#pragma once

#include <cstddef>
#include <string>

#include "gpuopt/core/status.hpp"
#include "gpuopt/kernels/w4a16.hpp"

namespace gpuopt::kernels::w4a16_detail {

// What a kernel needs to launch, fixed by plan_*() and passed back to run_*().
struct KernelPlan {
  int variant = 0;  // which template instance (file-specific)
  int blocks = 0, threads = 0, blocks_per_sm = 0;
  int splits = 0;                   // k-splits per column tile (file-specific meaning)
  int tiles = 0;                    // output tiles with a fix-up counter
  std::size_t shared_bytes = 0;
  std::size_t workspace_bytes = 0;  // zeroed once by initialize(); the kernel leaves it zero
  std::string describe;             // for W4A16Config::describe()
};

// Direct kernel (w4a16_direct.cu), small M: each warp streams one 64-column strip of weights from
// global memory straight into registers (no shared-memory staging of weights, no barrier in the
// main loop); x for the block's k-range sits in shared memory. FAILED_PRECONDITION when it does
// not apply (M, N, K or shared memory), naming why.
StatusOr<KernelPlan> plan_direct(const W4A16DeviceWeights& w, int m, int device);
Status run_direct(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x,
                  void* y, void* workspace, StreamHandle stream);

// Hopper wgmma kernel (w4a16_wgmma.cu), larger M. FAILED_PRECONDITION when not sm_90 code or the
// shape does not fit, naming why.
StatusOr<KernelPlan> plan_wgmma(const W4A16DeviceWeights& w, int m, int device);
Status run_wgmma(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x,
                 void* y, void* workspace, StreamHandle stream);

}  // namespace gpuopt::kernels::w4a16_detail
