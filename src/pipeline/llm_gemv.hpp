// LLM stage: the decode GEMM (M = 1..16 rows) on W4A16's tile layout with a fixed k-split and an
// ordered reduction, so that each output row's bits depend on neither M nor the other rows nor the
// run. Its input may be an RMS-normalised fp32 residual (the norm fused into the load) and its
// output a plain fp16 store, a residual add with the new row's sums of squares, or SiLU(gate)·up.
// Host-compilable: the plan is tested without a device. docs/llm.md, "Decode GEMM".
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpuopt/core/status.hpp"

struct CUstream_st;

namespace gpuopt::pipeline::llm_detail {

inline constexpr int kGemvWarps = 4;  // warps per block
inline constexpr int kGemvBlocksPerSm =
    3;  // resident blocks per SM the kernel is built and planned for
inline constexpr int kGemvMaxRows = 16;  // M at most (two n8 mma tiles)
inline constexpr int kGemvGroupK = 128;  // k per quantization group = k per warp step
inline constexpr int kSsqColumns = 64;   // columns behind one sum-of-squares partial
// The most k-splits one thread block cluster holds (sm_90's portable cluster size).
inline constexpr int kGemvMaxClusterSplits = 8;

enum class GemvInput {
  kHalf,    // x fp16 [M][K]
  kNormed,  // x = fp16(residual[M][K] · rsqrt(Σ ssq[K/64][·] / K + eps)), fp32 residual
};
enum class GemvOutput {
  kHalf,      // y fp16 [M][N]
  kResidual,  // residual[M][N] += fp32(fp16(y)); ssq_out[N/64][·] = Σ residual² per 64 columns
  kSiluPair,  // act fp16 [M][N/2] = fp16(silu(fp16 gate) · fp16 up), gate = y[:, :N/2]
};

// The launch shape of one matrix: `items` blocks' worth of columns (a 64-column strip, or a
// gate/up pair of strips), each cut into `splits` k-ranges of whole groups. Chosen from K, N and
// the SM count only, never from M.
struct GemvPlan {
  int items = 0;
  int splits = 1;
  int parts = 1;  // strips per item: 2 for kSiluPair
  // sm_90: an item's splits are one thread block cluster and add their sums through distributed
  // shared memory (no partials in global memory, no counters); false: each split writes its fp32
  // partials and the last block to count adds them. The same additions in the same order either
  // way, so the same bits for the same splits.
  bool cluster = false;
  std::size_t partial_floats(int max_rows, int n) const {
    return splits > 1 && !cluster ? static_cast<std::size_t>(splits) * max_rows * n : 0;
  }
};
// K a multiple of 128, N of 64 (of 128 when `pair`); sms > 0. `target_blocks`: 0 = kGemvBlocksPerSm
// per SM, one wave.
GemvPlan plan_gemv(int k, int n, bool pair, int sms, int target_blocks = 0);

// The plan with clusters: plan_gemv's splits, at most kGemvMaxClusterSplits, reduced in clusters
// when every item's cluster is resident at once (`active_clusters(splits)`: how many clusters of
// that many blocks the device holds, cudaOccupancyMaxActiveClusters); otherwise plan_gemv's plan
// and the global fix-up. Fewer splits to make the clusters fit was measured slower at batch 1 on
// the H200 (docs/llm.md). One split: no cluster.
template <typename ActiveClusters>
GemvPlan plan_gemv_cluster(int k, int n, bool pair, int sms, ActiveClusters&& active_clusters) {
  const GemvPlan global = plan_gemv(k, n, pair, sms);
  GemvPlan plan = global;
  plan.splits = plan.splits < kGemvMaxClusterSplits ? plan.splits : kGemvMaxClusterSplits;
  if (plan.splits < 2 || active_clusters(plan.splits) < plan.items) return global;
  plan.cluster = true;
  return plan;
}

struct GemvArgs {
  const void* tiles = nullptr;   // W4A16 tile layout, K x N
  const void* scales = nullptr;  // fp16 [K/128][N/64][8][8]
  int k = 0, n = 0, m = 0;
  GemvPlan plan;
  // input
  const void* x = nullptr;          // kHalf: fp16 [M][K] (row stride K)
  const float* residual = nullptr;  // kNormed: fp32 [M][K]
  const float* ssq = nullptr;       // kNormed: [K/64][ssq_stride]
  int ssq_stride = 0;
  float eps = 0.0f;
  // output
  void* y = nullptr;              // kHalf: fp16 [M][N]; kSiluPair: fp16 [M][N/2]
  float* residual_out = nullptr;  // kResidual: fp32 [M][N]
  float* ssq_out = nullptr;       // kResidual: [N/64][ssq_stride]
  float* partials = nullptr;      // plan.partial_floats(16, N) floats (splits > 1)
  int* counters = nullptr;        // plan.items ints, zero before the first run (left zero)
};

// Enqueues the GEMM. `programmatic`: launched as a programmatic dependent of the previous kernel
// (sm_90): its weight loads start before that kernel ends. A cluster plan needs sm_90.
Status launch_gemv(GemvInput input, GemvOutput output, const GemvArgs& args, bool programmatic,
                   CUstream_st* stream);

// How many clusters of `splits` blocks of the (input, output) kernel the current device holds at
// once (the smaller over the kernel's row-count instances); 0 where clusters are not supported.
StatusOr<int> gemv_active_clusters(GemvInput input, GemvOutput output, int splits);

}  // namespace gpuopt::pipeline::llm_detail
