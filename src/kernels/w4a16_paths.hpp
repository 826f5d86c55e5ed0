// The W4A16 kernels beside the original two (w4a16_gemm.cu): each file plans its launch for one
// (weights, M, device) and runs it; W4A16Gemm chooses among them. Internal, host-compilable.
#pragma once

#include <cstddef>
#include <string>

#include "gpuopt/core/status.hpp"
#include "gpuopt/kernels/w4a16.hpp"

namespace gpuopt::kernels::w4a16_detail {

inline std::size_t align256(std::size_t value) { return (value + 255) / 256 * 256; }

// The split-K workspace of the direct and wgmma kernels: fp32 partials [M][N], then one int counter
// per fix-up tile (`tiles`). All zero between runs. (The wgmma kernel's shared fix-up of k-splits
// lays out its own: a slice per split, then two counters per tile; run_wgmma.)
inline std::size_t partials_bytes(int m, int n) {
  return align256(static_cast<std::size_t>(m) * n * sizeof(float));
}
inline std::size_t split_workspace_bytes(int m, int n, int tiles) {
  return partials_bytes(m, n) + static_cast<std::size_t>(tiles) * sizeof(int);
}

// What a kernel needs to launch, fixed by plan_*() and passed back to run_*().
struct KernelPlan {
  int variant = 0;  // which template instance (file-specific)
  int blocks = 0, threads = 0, blocks_per_sm = 0;
  int splits = 0;  // k-splits per column tile (file-specific meaning)
  int tiles = 0;   // output tiles with a fix-up counter
  int flags = 0;   // file-specific options decided at plan time (W4A16Tuning included)
  std::size_t shared_bytes = 0;
  std::size_t workspace_bytes = 0;  // zeroed once by initialize(); the kernel leaves its counters
                                    // (and, but for the shared fix-up's slices, its sums) zero
  std::string describe;             // for W4A16Config::describe()
};

// A plan kept in W4A16Config between initialize() and run() (the public config cannot hold the
// internal KernelPlan): every field run_*() reads goes there and back (a forgotten flag had run()
// take the slower partial-sum layout at M=16 while the description named the faster one).
inline void store_plan(const KernelPlan& plan, W4A16Config& config) {
  config.variant = plan.variant;
  config.blocks = plan.blocks;
  config.threads = plan.threads;
  config.blocks_per_sm = plan.blocks_per_sm;
  config.splits = plan.splits;
  config.tiles = plan.tiles;
  config.kernel_flags = plan.flags;
  config.shared_bytes = plan.shared_bytes;
  config.note = plan.describe;
}
inline KernelPlan stored_plan(const W4A16Config& config) {
  KernelPlan plan;
  plan.variant = config.variant;
  plan.blocks = config.blocks;
  plan.threads = config.threads;
  plan.blocks_per_sm = config.blocks_per_sm;
  plan.splits = config.splits;
  plan.tiles = config.tiles;
  plan.flags = config.kernel_flags;
  plan.shared_bytes = config.shared_bytes;
  plan.describe = config.note;
  return plan;
}

// The M from which cuBLAS takes over on a green-context partition of `sm_count` of the device's
// `device_sms` SMs (W4A16Options::sm_count), given the whole GPU's `whole` (the measured table in
// W4A16Gemm::auto_fallback_min_m, which also holds the partition measurements): the int4 kernels
// are bound by their work per SM there, cuBLAS much less, so the crossover falls with the share.
// sm_count <= 0 or >= device_sms: the whole GPU's.
inline int partition_takeover_m(int whole, int sm_count, int device_sms) {
  if (sm_count <= 0 || sm_count >= device_sms) return whole;
  const double share = static_cast<double>(sm_count) / device_sms;
  if (share >= 0.9) return whole;
  const int cap = share >= 0.5 ? 65 : share >= 0.2 ? 17 : 9;
  return whole < cap ? whole : cap;
}

// Direct kernel (w4a16_direct.cu), M <= 16: each warp streams its share of the weights through a
// private cp.async ring (no block barrier in the main loop); x for the block's k-slice sits in
// shared memory. FAILED_PRECONDITION when it does not apply (M or shared memory), naming why.
// `tuning`: the direct_* overrides.
StatusOr<KernelPlan> plan_direct(const W4A16DeviceWeights& w, int m, int device, int sms,
                                 const W4A16Tuning& tuning);
Status run_direct(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x,
                  void* y, void* workspace, StreamHandle stream);

// Hopper wgmma kernel (w4a16_wgmma.cu), larger M. FAILED_PRECONDITION when not sm_90 code or the
// shape does not fit, naming why. Both plans take `sms`, the SMs to plan the grid for (the
// device's, or a partition's: W4A16Options::sm_count); plan_wgmma reads the wgmma_* overrides.
StatusOr<KernelPlan> plan_wgmma(const W4A16DeviceWeights& w, int m, int device, int sms,
                                const W4A16Tuning& tuning);
Status run_wgmma(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x, void* y,
                 void* workspace, StreamHandle stream);

}  // namespace gpuopt::kernels::w4a16_detail
