// The W4A16 paths behind W4A16Gemm (w4a16_gemm.cu): each unit plans its launch for one (weights, M,
// device) and runs it; W4A16Gemm chooses among them. Internal, host-compilable.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

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

// ---- host planning without a device (w4a16_plan.cpp; tests/unit/kernels/w4a16_plan_test.cpp) ----

// The kernels beside the original two to try for M rows of a K x N layer, in order (kDirect,
// kWgmma); empty: the original kernels (deterministic mode, or a forced path).
std::vector<W4A16ForcePath> kernel_candidates(int k, int n, int m, const W4A16Options& options);

// The M from which cuBLAS takes over on the whole GPU (the measured table; has_wgmma: the wgmma
// kernel can run here).
int whole_gpu_takeover_m(int k, int n, bool has_wgmma);

// The M from which cuBLAS takes over on a green-context partition of `sm_count` of the device's
// `device_sms` SMs (W4A16Options::sm_count), given the whole GPU's `whole`: the int4 kernels are
// bound by their work per SM there, cuBLAS much less, so the crossover falls with the share.
// sm_count <= 0 or >= device_sms: the whole GPU's.
int partition_takeover_m(int whole, int sm_count, int device_sms);

// Whether M rows take the dequantise + cuBLAS path, given the resolved takeover M (0 = never).
bool takes_fallback(int m, int fallback_min_m, const W4A16Options& options);

// The original kernels: whether the weights are the mma A operand (swapped), and the m-tiles a
// block starts from before shared-memory limits halve them.
bool swapped_for(int m, const W4A16Options& options);
int initial_m_tiles(int m, bool swapped);

// The original kernels' stream-K grid: one full wave, each block an equal share of all k-stages of
// all tiles, at least 4 stages each so the pipeline fills; force_blocks > 0 overrides it (at most
// one block per stage).
int stream_k_blocks(int per_sm, int sms, int iterations, int force_blocks);

// Deterministic mode: a fixed k-split per tile from N, K and the SM count only (never M), about two
// blocks per SM for one m-block, each split at least 4 stages long.
int deterministic_splits(int sms, int n_tiles, int stages_per_tile);

// The wgmma kernel's k-splits: the best wave fill (blocks / (waves x slots)), ties (within 1 %)
// going to more splits (finer blocks balance the tail better), stopping at the first near-full
// wave (>= 95 %); each split at least 4 stages long, and at least 32 when that still gives every
// SM a block (short splits pay the pipeline fill and the partial-tile atomics too often).
// Measured on the H200 (2026-11-30, fast-copy variants): 8192x28672 M=64 4 splits 101.8 us vs 7
// 108.6, M=128 172.0 vs 188.8; 28672x8192 M=32 8 splits 66.2 vs 4 81.6, M=128 4 138.6 vs 2 230.4.
//
// Preferred to it, for 32- and 64-token tiles, one wave: the most splits (at most 16, each at least
// 8 stages) whose blocks all fit the wave, where they fill at least 80 % of it and stream-K would
// give each block fewer than 32 stages. Such splits run with the shared fix-up and beat both
// stream-K and k-splits over two waves there (H200, 2026-12-04, M = 17..64, docs/PERFORMANCE.md):
// 3584x18944 M=64 3 splits 31.5 us vs 7 splits over two waves 45.0; 4096x14336 M=64 4 splits 28.6
// vs stream-K 33.5; 14336x4096 M=64 16 splits 27.0 vs stream-K 33.5. With 32 or more stream-K
// stages a block (8192x28672: 54) stream-K stays ahead (M=64 74.0 vs 2 splits 77.2); so does it at
// M <= 24 where it applies and the one wave would leave a tenth idle. `m` is the GEMM's M.
struct WgmmaSplits {
  int splits = 1;
  double fill = 0;        // blocks / (waves x slots) with those splits
  bool one_wave = false;  // the one-wave choice above: no stream-K
};
WgmmaSplits choose_wgmma_splits(int tiles, int k_stages, int slots, int sms, int tokens, int m);
// Whether stream-K suits the wgmma kernel, at least 12 stages a block: for 32- and 64-token tiles
// where the k-splits leave more than a tenth of the wave idle and are not the one-wave choice; for
// 128-token tiles up to M = 256 (measured there) where the k-splits spill over one wave and leave
// more than a tenth of it idle (H200 3584x18944 M=65..128: 40.8-48.0 us against 52.3-63.0 with 3
// splits over two waves; M=129..256 71.2-82.2 against 105.3-112.6 with 1 split, 56 % fill).
bool wgmma_stream_k_fits(int tokens, const WgmmaSplits& chosen, int tiles, int k_stages, int slots,
                         int m);

// Original mma.sync kernels (w4a16_sm80_mma_tiled.cu): x rows as the mma A operand, or the
// weights (swapped), shared-memory stages, stream-K. tiled_shared_bytes: a block's shared memory
// (the planner's fit check, m_tiles halved until it fits). plan_tiled fills config's kernel,
// swap, m-tiles, copy pipeline, block shape, grid and deterministic k-splits, and returns the fp32
// partial slices [M][N] its workspace needs (then one int counter per tile); run_tiled launches it.
std::size_t tiled_shared_bytes(ActivationType type, bool swapped, int m_tiles, bool wide);
StatusOr<int> plan_tiled(const W4A16DeviceWeights& w, int m, bool swapped, int m_tiles, bool wide,
                         int device, int sms, const W4A16Options& options, W4A16Config& config);
Status run_tiled(const W4A16Config& config, const W4A16DeviceWeights& w, int m, const void* x,
                 void* y, void* partial, void* counters, StreamHandle stream);

// Dequantise + cuBLAS (w4a16_dequant_cublas.cu): the dense [N][K] copy of the weights written
// once, then cublasGemmEx on it; the cuBLAS handle W4A16Gemm keeps as a void*.
StatusOr<void*> create_cublas_handle();
void destroy_cublas_handle(void* handle);  // null: nothing; a failure is reported, not returned
Status dequantize_weights(const W4A16DeviceWeights& w, void* dense, StreamHandle stream);
Status run_dequantized(void* cublas, const W4A16DeviceWeights& w, int m, const void* x,
                       const void* dense, void* y, StreamHandle stream);

// Direct kernel (w4a16_sm80_direct.cu), M <= 16: each warp streams its share of the weights through
// a private cp.async ring (no block barrier in the main loop); x for the block's k-slice sits in
// shared memory. FAILED_PRECONDITION when it does not apply (M or shared memory), naming why.
// `tuning`: the direct_* overrides.
StatusOr<KernelPlan> plan_direct(const W4A16DeviceWeights& w, int m, int device, int sms,
                                 const W4A16Tuning& tuning);
Status run_direct(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x,
                  void* y, void* workspace, StreamHandle stream);

// Hopper wgmma kernel (w4a16_sm90_wgmma.cu), larger M. FAILED_PRECONDITION when not sm_90 code or
// the shape does not fit, naming why. Both plans take `sms`, the SMs to plan the grid for (the
// device's, or a partition's: W4A16Options::sm_count); plan_wgmma reads the wgmma_* overrides.
StatusOr<KernelPlan> plan_wgmma(const W4A16DeviceWeights& w, int m, int device, int sms,
                                const W4A16Tuning& tuning);
Status run_wgmma(const KernelPlan& plan, const W4A16DeviceWeights& w, int m, const void* x, void* y,
                 void* workspace, StreamHandle stream);

}  // namespace gpuopt::kernels::w4a16_detail
